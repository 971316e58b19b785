/* heap.h: the process's heap: jemalloc for C and for the Lua VMs, given back to the kernel when a
 * worker goes idle, and its figures for the metrics.
 *
 * Why jemalloc (Debian's libjemalloc2, linked as the process's malloc): after a burst of 5,000
 * pages in flight, LuaJIT's own allocator (lj_alloc.c, dlmalloc's) and glibc's kept 73 MB of the
 * 140 MB the burst took a minute after it (RSS 88 MB against 15 MB idle): dlmalloc gives a 128 KB+
 * segment back only when every chunk in it is free, glibc trims only an arena's top, and the few
 * objects that outlive a burst (interned strings, pooled coroutines, kept tables) are spread over
 * most of them. jemalloc keeps objects of one size class in page-sized slabs and gives back every
 * wholly free page (madvise), so what outlives a burst pins pages, not segments
 * (tools/bench/memory, docs/performance.md).
 *
 * The Lua VMs allocate through agw_heap_lua_alloc (lua_newstate's lua_Alloc) with jemalloc's sized
 * calls: LuaJIT tells the size of every block it frees or resizes (its collector's accounting
 * counts on it), so sdallocx skips the look-up of the block's size class.
 *
 * A sanitized build (AGW_SANITIZE, the fuzzers) links no jemalloc: its malloc is the sanitizer's,
 * the Lua VMs keep LuaJIT's allocator (luaL_newstate), agw_heap_give_back is glibc's malloc_trim,
 * and agw_heap_stats says it has no figures. AGW_HEAP_JEMALLOC is 1 when jemalloc is in.
 */
#ifndef AGW_BASE_HEAP_H
#define AGW_BASE_HEAP_H

#include <lua.h>
#include <stddef.h>

#ifndef AGW_HEAP_JEMALLOC
#define AGW_HEAP_JEMALLOC 0
#endif

/* A new Lua VM on the process's heap (agw_heap_lua_alloc in a jemalloc build, LuaJIT's own
 * allocator otherwise), with LuaJIT's panic handler as luaL_newstate sets it; NULL when out of
 * memory (or when LuaJIT refuses an allocator of ours: not on any 64-bit build it makes with GC64,
 * Debian's included). Closed with lua_close as usual. */
lua_State *agw_heap_new_lua_state(void);

/* The lua_Alloc of the Lua VMs (Lua 5.1 manual, lua_Alloc): nsize 0 frees ptr (osize bytes, as
 * allocated or last resized), ptr NULL allocates nsize bytes, else resizes ptr from osize to nsize
 * bytes. NULL when the memory cannot be had (LuaJIT then raises its "not enough memory" error;
 * a shrink never fails). ud is unused. (A sanitized build's is realloc and free, for the unit
 * tests: its VMs use LuaJIT's allocator.) */
void *agw_heap_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

/* The same, checking LuaJIT's side of the contract first: every osize falls in the size class of
 * the block it names (jemalloc's sallocx against nallocx), else it writes the mismatch to stderr
 * and aborts. For the unit tests (gateway/tests/base/test_heap.c); about 40 instructions more per
 * call. */
void *agw_heap_lua_alloc_checked(void *ud, void *ptr, size_t osize, size_t nsize);

/* Makes every Lua VM agw_heap_new_lua_state makes from now on use agw_heap_lua_alloc_checked (for
 * the unit tests: a VM made by agw_vm_new, the gateway's own, checked). Before any thread makes
 * one. */
void agw_heap_check_lua_blocks(void);

/* Gives the heap's wholly free pages back to the kernel (jemalloc's arena.<all>.purge, else
 * malloc_trim(0)). Takes the arenas' locks: for a worker that has gone idle (worker/gc.h), never
 * on a request's path. */
void agw_heap_give_back(void);

/* The heap's figures, bytes (jemalloc's stats.*, refreshed by an "epoch" write): allocated (in
 * use by the program, the Lua VMs included), active (the pages holding them, a page-size
 * multiple), resident (the allocator's pages the kernel has resident: data, its own metadata, and
 * free pages not given back yet), retained (address space kept unmapped for later, not memory). */
typedef struct agw_heap_stats {
    size_t allocated, active, resident, retained;
} agw_heap_stats_t;

/* Fills st and returns 0; -1 when the heap keeps no figures (a sanitized build). Any thread; takes
 * jemalloc's stats lock (a scrape of /metrics, not a request). */
int agw_heap_stats(agw_heap_stats_t *st);

#endif
