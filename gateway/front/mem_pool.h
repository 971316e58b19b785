/* mem_pool.h: h2o's memory pools with 2 KB first chunks instead of 4 KB.
 *
 * h2o 2.2.5 gives every request (and connection, and HTTP/2 stream) a memory pool (h2o_mem_pool_t,
 * lib/common/memory.c): small allocations come from chunks of 4,096 bytes (a 16-byte header and
 * 4,080 bytes), large ones (a quarter of that or more) are blocks of their own, and everything goes
 * at once when the pool is cleared. A page's request used 1,472 bytes of its first chunk over h2c
 * and 1,712 over HTTP/1.1 (the parsed head's fields, the response's headers), and a page in flight
 * holds it for as long as it is served: the 4 KB chunk was a fifth of what a page in flight held
 * (docs/performance.md, "A twenty-fourth pass").
 *
 * mem_pool.c defines h2o_mem_alloc_pool and h2o_mem_clear_pool in the executable. They are
 * libh2o's exported functions, and libh2o calls them through its PLT everywhere (Debian's build:
 * objdump of libh2o 2.2.5 shows every call, memory.c's own included, going there), so the dynamic
 * linker binds every call of the process here, from its start, the gateway's own too. The two are
 * one file: a process has both or neither, never one pool allocating with one layout and cleared
 * with the other. They do what h2o's do, with the chunks' sizes as the one difference:
 *   - a pool's first two chunks are AGW_MEM_POOL_FIRST_BLOCK bytes each, a 16-byte header and the
 *     rest to allocate from; every later chunk is h2o's 4,096 bytes. A pool of up to 2,032 bytes
 *     (a page's request with a few header fields, as above) holds half of what it held; one of up
 *     to 4,064 (ten to thirty fields more) as much as before;
 *     a bigger one as much, give or take a chunk's unused end;
 *   - an allocation is rounded up to 16 bytes (0 is 16) and 16-byte aligned, as h2o's;
 *   - one of 1,020 bytes or more (a quarter of h2o's chunk) is a block of its own, as h2o's;
 *   - a chunk is malloc's and goes back with free when the pool is cleared (h2o kept 16 freed chunks
 *     a thread in a list of its own; jemalloc's thread cache does the same);
 *   - clearing releases the pool's shared references (h2o_mem_release_shared, h2o's header's) and
 *     frees its large blocks, then its chunks, and leaves the pool empty, as h2o_mem_init_pool
 *     makes it.
 * The pool's fields (h2o_mem_pool_t, h2o/memory.h) keep their meaning: chunks is the newest chunk
 * (its layout is this file's: nothing outside lib/common/memory.c reads it), chunk_offset the bytes
 * used in it, shared_refs and directs h2o's lists, whose records memory.c declares (mirrored here:
 * the file refuses to compile against another h2o than 2.2). */
#ifndef AGW_FRONT_MEM_POOL_H
#define AGW_FRONT_MEM_POOL_H

#include <h2o.h>

/* The block of each of a pool's first two chunks, in bytes: its 16-byte header and the bytes it
 * allocates. */
#define AGW_MEM_POOL_FIRST_BLOCK 2048

/* 1 when the process's calls of h2o_mem_alloc_pool and h2o_mem_clear_pool both come here, libh2o's
 * own included (a probe: a block h2o_mem_alloc_shared links to a pool must take its record from
 * this file's chunk); 0 when neither comes here (every pool is libh2o's, as without this file); -1
 * when one does and the other does not, or libh2o allocated from a pool itself (a pool would be
 * allocated by one and cleared by the other: the server refuses to start). main calls it once at
 * start, which also makes the linker take this file from the core library. */
int agw_mem_pool_active(void);

/* The bytes of the chunk pool allocates from now (its newest), 0 when it has none: for tests. */
size_t agw_mem_pool_chunk_bytes(const h2o_mem_pool_t *pool);

#endif
