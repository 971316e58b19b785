/* mem_pool.c: h2o's memory pools with 2 KB first chunks (mem_pool.h). */
#include "front/mem_pool.h"
#include "front/interpose.h"

#include <h2o/version.h>
#include <stdlib.h>

#if H2O_VERSION_MAJOR != 2 || H2O_VERSION_MINOR != 2
#error "front/mem_pool.c defines h2o 2.2's pool functions, mirrors memory.c's records: check them against this libh2o"
#endif

/* h2o's chunk: 4,096 bytes, of which 4,080 to allocate from (memory.c's st_h2o_mem_pool_chunk_t) */
#define H2O_CHUNK_BLOCK 4096
#define CHUNK_HEADER 16
/* allocations of this size or more are blocks of their own: a quarter of h2o's chunk's bytes */
#define DIRECT_MIN ((H2O_CHUNK_BLOCK - CHUNK_HEADER) / 4)

/* A chunk of ours: the pool's chunks field points at the newest, next at the one before. The
 * header is 16 bytes, so the bytes after it keep malloc's 16-byte alignment. */
typedef struct chunk {
    struct chunk *next;
    size_t cap; /* the bytes after the header */
    _Alignas(16) char bytes[];
} chunk_t;

_Static_assert(sizeof(chunk_t) == CHUNK_HEADER, "a chunk's header is 16 bytes");

/* memory.c's records of a pool's large blocks and shared references (h2o 2.2.5), which libh2o's
 * h2o_mem_link_shared and h2o's own allocation make and clearing walks */
struct st_h2o_mem_pool_direct_t {
    struct st_h2o_mem_pool_direct_t *next;
    size_t _dummy;
    char bytes[1];
};
struct st_h2o_mem_pool_shared_ref_t {
    struct st_h2o_mem_pool_shared_ref_t *next;
    struct st_h2o_mem_pool_shared_entry_t *entry;
};

static chunk_t *newest(const h2o_mem_pool_t *pool)
{
    return (chunk_t *)(void *)pool->chunks;
}

/* h2o_mem_alloc_pool (h2o/memory.h): sz bytes that live until the pool is cleared, 16-byte aligned
 * (mem_pool.h). Aborts when memory runs out (h2o_mem_alloc's rule). Exported whatever the default
 * visibility: the interposition needs it in the executable's dynamic symbols. */
__attribute__((visibility("default"))) void *h2o_mem_alloc_pool(h2o_mem_pool_t *pool, size_t sz)
{
    if (sz >= DIRECT_MIN) {
        struct st_h2o_mem_pool_direct_t *d = h2o_mem_alloc(offsetof(struct st_h2o_mem_pool_direct_t, bytes) + sz);
        d->next = pool->directs;
        pool->directs = d;
        return d->bytes;
    }
    sz = sz == 0 ? 16 : (sz + 15) & ~(size_t)15;
    chunk_t *c = newest(pool);
    if (c == NULL || c->cap - pool->chunk_offset < sz) {
        /* the first two chunks small (a pool of up to 4 KB never takes more than h2o's one), the
         * next ones h2o's */
        size_t block = c == NULL || c->next == NULL ? AGW_MEM_POOL_FIRST_BLOCK : H2O_CHUNK_BLOCK;
        chunk_t *n = h2o_mem_alloc(block);
        n->next = c;
        n->cap = block - CHUNK_HEADER;
        pool->chunks = (void *)n;
        pool->chunk_offset = 0;
        c = n;
    }
    void *p = c->bytes + pool->chunk_offset;
    pool->chunk_offset += sz;
    return p;
}

/* h2o_mem_clear_pool (h2o/memory.h): releases the pool's shared references, frees its large
 * blocks and chunks, and leaves it as h2o_mem_init_pool makes it. Exported as the one above. */
__attribute__((visibility("default"))) void h2o_mem_clear_pool(h2o_mem_pool_t *pool)
{
    for (struct st_h2o_mem_pool_shared_ref_t *r = pool->shared_refs; r != NULL; r = r->next)
        h2o_mem_release_shared(r->entry->bytes);
    pool->shared_refs = NULL;
    for (struct st_h2o_mem_pool_direct_t *d = pool->directs, *next; d != NULL; d = next) {
        next = d->next;
        free(d);
    }
    pool->directs = NULL;
    for (chunk_t *c = newest(pool), *next; c != NULL; c = next) {
        next = c->next;
        free(c);
    }
    pool->chunks = NULL;
    pool->chunk_offset = H2O_CHUNK_BLOCK - CHUNK_HEADER; /* (h2o_mem_init_pool's: sizeof its chunk's bytes) */
}

int agw_mem_pool_active(void)
{
    int alloc = agw_interposed("h2o_mem_alloc_pool", (void *)h2o_mem_alloc_pool);
    int clear = agw_interposed("h2o_mem_clear_pool", (void *)h2o_mem_clear_pool);
    if (!alloc && !clear)
        return 0;
    if (!alloc || !clear)
        return -1;
    /* libh2o's own allocations come here too: its h2o_mem_alloc_shared links the block to the
     * pool with a record from the pool (link_shared, memory.c). A libh2o that called its own copy
     * there (a build without semantic interposition) would have put one of its chunks in */
    h2o_mem_pool_t pool;
    h2o_mem_init_pool(&pool);
    h2o_mem_alloc_shared(&pool, 1, NULL);
    chunk_t *c = newest(&pool);
    int ours = c != NULL && c->next == NULL && c->cap == AGW_MEM_POOL_FIRST_BLOCK - CHUNK_HEADER &&
               pool.chunk_offset == 16;
    h2o_mem_clear_pool(&pool);
    return ours ? 1 : -1;
}

size_t agw_mem_pool_chunk_bytes(const h2o_mem_pool_t *pool)
{
    const chunk_t *c = newest(pool);
    return c == NULL ? 0 : c->cap;
}
