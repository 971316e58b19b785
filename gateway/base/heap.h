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
 * the Lua VMs keep LuaJIT's allocator behind agw_heap_lua_alloc (the heap limit is the same),
 * agw_heap_give_back is glibc's malloc_trim, and agw_heap_stats says it has no
 * figures. AGW_HEAP_JEMALLOC is 1 when jemalloc is in.
 */
#ifndef AGW_BASE_HEAP_H
#define AGW_BASE_HEAP_H

#include <lua.h>
#include <stddef.h>
#include <stdint.h>

#ifndef AGW_HEAP_JEMALLOC
#define AGW_HEAP_JEMALLOC 0
#endif

/* jemalloc's options for the process (its `malloc_conf`, heap.c): each thread's cache holds up to
 * eight slabs' worth of freed blocks of a small size class (at most 2,048), where jemalloc's
 * default holds two (at most 200). LuaJIT's collector frees a page's objects in batches as it
 * sweeps, and with the default cache the batches overflowed it: about 2,000 flushes to the
 * arena (4,000 instructions each) per 2,500 bench pages, 8,200-8,300 instructions a page in
 * jemalloc; with these 6,100-6,600 (tools/bench/callgrind, docs/performance.md "A seventh pass").
 * The cache's blocks go back to their slabs when an idle worker gives its memory back
 * (agw_heap_give_back).
 * The pages freed blocks leave are given back to the kernel (madvise) by jemalloc's background
 * threads (background_thread: at most one per core, asleep between purges), not by whichever
 * thread's free or allocation found them due: without them the worker did it in the middle of a
 * request, inside the Lua collector's sweep among other places. Measured under tools/bench/memory
 * (5,000 pages in flight, `perf record` of madvise): the worker spent 195 ms in 2,565 madvise
 * calls, 8 of them over 1 ms (the longest 4.3 ms; a sweep step with 316 of them took 30 ms under
 * tools/bench/gc-phases' probes); with them 34 ms in 578 calls, the longest 0.35 ms
 * (docs/performance.md "A fourteenth pass").
 * The small size classes of a power of two from 32 to 4,096 bytes are carved from slabs of four
 * pages, and the 16-byte class from two (the most a slab of it can have: 512 blocks), where
 * jemalloc's default is one page (the other classes' slabs are of three, five or seven pages
 * already; the 8-byte class stays at one, its limit). jemalloc keeps a record of every slab it
 * ever made (its metadata, never given back), and a burst's Lua heap (40 MB at 5,000 pages in flight, mostly objects of those
 * classes) made about 12,000 one-page slabs: their records stayed, 1.5 MB a minute after the
 * burst. With four-page slabs the RSS a minute after a burst is 0.06 x idle lower (1.30 against
 * 1.37), the idle RSS 0.2-0.3 MB higher, and a bench page spends about 400 instructions less in
 * jemalloc (fewer slabs to fill; docs/performance.md "A twenty-seventh pass").
 * A MALLOC_CONF in the environment is read after this and wins for each option it names, but for
 * slab_sizes, whose ranges it sets on top of these (a range it does not name keeps this one). */
#define AGW_HEAP_SLAB_SIZES                                                                        \
    "slab_sizes:16-16:2|32-32:4|64-64:4|128-128:4|256-256:4|512-512:4|1024-1024:4|2048-2048:4|" \
    "4096-4096:4"
#define AGW_HEAP_MALLOC_CONF                                                                       \
    "lg_tcache_nslots_mul:3,tcache_nslots_small_max:2048,background_thread:true," AGW_HEAP_SLAB_SIZES

/* The Lua heap of one VM: what it holds and its limit (script_memory_limit_mb, gateway.lua). A
 * script can take gigabytes well within its time limit (`s = s .. s` thirty times, string.rep,
 * tables kept in its module across requests) and with them the machine's memory. The limit acts
 * only while it is armed (inside agw_heap_lua_pcall: the worker's entries into Lua), and never
 * refuses an allocation: an error raised in the runtime's own code would leave a request half
 * way, and one raised outside a protected call (C handing Lua a request's body or an upstream's
 * answer, the idle collection) would end the process. Instead:
 *   - when the heap passes `trip` (the limit, at first), on_over is called (the worker sets its
 *     stop hook, worker/watchdog.h): at the script's next instruction (never the runtime's), after
 *     a full collection, a heap still over the limit stops that script as the time limit does (at
 *     each of its instructions: a pcall cannot go on), and trip moves AGW_LUA_TRIP_SLACK further,
 *     up to a quarter over the limit: another script is stopped when it takes more again, and
 *     past that ceiling any script that allocates (data kept in a module across requests fills
 *     the heap for good: only a reload frees it). trip goes back to the limit once the heap is
 *     under it (agw_heap_lua_settle, once a second, or the hook's collection).
 *   - what a script asks for in one call that makes a large string from a small one (string.rep)
 *     is checked first (agw_heap_lua_take, agg.sandbox): past the limit, the script gets "not
 *     enough memory" in that call.
 * Owned by the VM (agw_heap_new_lua_state); the thread that runs the VM reads and writes it. */
typedef struct agw_lua_heap {
    lua_State *L;            /* the VM (its main thread) */
    size_t limit;            /* bytes; SIZE_MAX: none */
    int countdown;           /* allocations until the next look at the heap's size */
    size_t trip;             /* on_over is called when the heap passes this (>= limit) */
    size_t collected_at;     /* the heap after the hook's last full collection, 0 for none yet */
    int recheck;             /* a script was stopped since: what it held may be garbage now, so
                                the next look collects again (agw_heap_lua_still_over, once a
                                second at most, and settle) */
    int rechecked;           /* the hook collected again for a stop since the last settle (a heap
                                a module keeps full frees nothing: not a collection a page) */
    size_t rechecked_at;     /* the heap after the hook's last collection again for a stop */
    int armed;               /* > 0 inside agw_heap_lua_pcall */
    int over;                /* the heap passed its trip since the hook last decided */
    uint64_t stop_entry;     /* the worker's entry (watchdog.h) whose script the limit stopped */
    lua_State *stop_thread;  /* and that script's coroutine (another one is checked anew) */
    void (*on_over)(lua_State *L); /* sets the stop hook unless it is set, at each allocation
                                      past the trip; NULL: no stops */
    uint64_t refused;        /* script calls refused so far (agw_heap_lua_take) */
    size_t refused_largest;  /* the largest refused, bytes */
    uint64_t stopped;        /* scripts the hook stopped so far */
    lua_Alloc inner;         /* a sanitized build: LuaJIT's own allocator, which does the work */
    void *inner_ud;
} agw_lua_heap_t;

#define AGW_LUA_HUGE_BLOCK ((size_t)4 << 20)
/* The allocator looks at the heap's size (LuaJIT's own count) at every block of
 * AGW_LUA_LARGE_BLOCK bytes or more and at one smaller block in AGW_LUA_CHECK_EVERY: the heap
 * passes its trip by at most 64 small blocks (4 MB) before the hook is asked for. */
#define AGW_LUA_LARGE_BLOCK ((size_t)64 * 1024)
#define AGW_LUA_CHECK_EVERY 64
#define AGW_LUA_TRIP_SLACK ((size_t)1 << 20)

/* Sets h's limit, bytes (0: none). */
void agw_heap_lua_set_limit(agw_lua_heap_t *h, size_t bytes);

/* Whether a script's call on L (the running thread) may make a string of `bytes` (the scripts'
 * string.rep): yes under AGW_LUA_HUGE_BLOCK, without a limit, outside an armed call, or when it
 * fits under the limit, after a full collection if need be; otherwise no, counted in h->refused.
 * h may be NULL (yes). */
int agw_heap_lua_take(lua_State *L, agw_lua_heap_t *h, double bytes);

/* The bytes a script's call may still take under the limit as the heap stands (no collection;
 * 0 when over it): SIZE_MAX without a limit, outside an armed call, or for h NULL. */
size_t agw_heap_lua_room(agw_lua_heap_t *h);

/* The bytes h's VM holds: LuaJIT's own count (lua_gc LUA_GCCOUNT, a plain read). */
size_t agw_heap_lua_used(const agw_lua_heap_t *h);

/* The trip back at the limit when the heap is under it (once a second: the allocator's common
 * path does not look). Outside any entry into Lua (h->armed <= 0), after a script was stopped for
 * memory, collects first: what the stopped script held is garbage once it is gone, and LuaJIT's
 * string buffer a large concatenation grew halves at each collection only (collected again while
 * it shrinks, up to 8 times). */
void agw_heap_lua_settle(agw_lua_heap_t *h);

/* For the stop hook (L's VM heap h over its trip): runs a full collection unless the last one
 * left the heap within AGW_LUA_TRIP_SLACK of where it is now and no script was stopped since (the
 * stopped one's data, held at that collection, may be garbage now: a script stopped after a
 * 400 MB concatenation left every later page stopped until the worker idled); returns 1 when the heap is still
 * over the limit (the script is to be stopped: trip moves on, up to the limit and a quarter;
 * h->stopped counts it), 0 when it is not (trip back at the limit). Clears h->over either way. */
int agw_heap_lua_still_over(lua_State *L, agw_lua_heap_t *h);

/* A new Lua VM on the process's heap through agw_heap_lua_alloc (jemalloc's calls in a jemalloc
 * build, LuaJIT's own allocator in a sanitized one), with its agw_lua_heap_t (no limit yet:
 * agw_heap_lua_set_limit) and LuaJIT's panic handler as luaL_newstate sets it; NULL when out of
 * memory (or when LuaJIT refuses an allocator of ours: not on any 64-bit build it makes with GC64,
 * Debian's included). Closed with agw_heap_close_lua_state. */
lua_State *agw_heap_new_lua_state(void);

/* The heap record of a VM agw_heap_new_lua_state made (NULL for any other VM). */
agw_lua_heap_t *agw_heap_lua_of(lua_State *L);

/* lua_pcall(L, nargs, nresults, errfunc) with the limit of h (L's heap record, or NULL: a plain
 * lua_pcall) armed (agw_lua_heap_t.armed; nested calls count). Inline: every entry of a worker
 * into Lua goes through it, with the record it keeps. */
static inline int agw_heap_lua_pcall_in(agw_lua_heap_t *h, lua_State *L, int nargs, int nresults, int errfunc)
{
    if (h != NULL)
        h->armed++;
    int rc = lua_pcall(L, nargs, nresults, errfunc);
    if (h != NULL)
        h->armed--;
    return rc;
}

/* The same for L's own heap record (agw_heap_lua_of). */
int agw_heap_lua_pcall(lua_State *L, int nargs, int nresults, int errfunc);

/* lua_close(L), then frees its heap record; NULL is a no-op. */
void agw_heap_close_lua_state(lua_State *L);

/* The lua_Alloc of the Lua VMs (Lua 5.1 manual, lua_Alloc): nsize 0 frees ptr (osize bytes, as
 * allocated or last resized), ptr NULL allocates nsize bytes, else resizes ptr from osize to nsize
 * bytes. ud: the VM's agw_lua_heap_t (its limit watched), or NULL. NULL when the memory cannot
 * be had (LuaJIT then raises its "not enough memory" error;
 * a shrink never fails). */
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

/* Gives the heap's wholly free pages back to the kernel (jemalloc's arena.<all>.purge, after the
 * calling thread's cache of freed blocks went back to their slabs: thread.tcache.flush; else
 * malloc_trim(0)). Takes the arenas' locks: for a worker that has gone idle (worker/gc.h), never
 * on a request's path. */
void agw_heap_give_back(void);

/* Sends the blocks the calling thread's cache of freed blocks holds back to their slabs (jemalloc's
 * thread.tcache.flush; nothing in a sanitized build), so that the background threads' purge can
 * give their pages back. For a thread that works in spells and then sleeps (the admin thread
 * between requests): what its cache keeps would otherwise stay until its next allocations.
 * Takes the locks of the bins it returns to, never the arenas' purge locks. */
void agw_heap_thread_flush(void);

/* The heap's figures, bytes (jemalloc's stats.*, refreshed by an "epoch" write): allocated (in
 * use by the program, the Lua VMs included), active (the pages holding them, a page-size
 * multiple), resident (the allocator's pages the kernel has resident: data, its own metadata, and
 * free pages not given back yet), retained (address space kept unmapped for later, not memory),
 * metadata (the allocator's own records, within resident: jemalloc never gives them back, and a
 * burst leaves one record per slab it took, docs/performance.md "A twenty-fifth pass"). */
typedef struct agw_heap_stats {
    size_t allocated, active, resident, retained, metadata;
} agw_heap_stats_t;

/* Fills st and returns 0; -1 when the heap keeps no figures (a sanitized build). Any thread; takes
 * jemalloc's stats lock (a scrape of /metrics, not a request). */
int agw_heap_stats(agw_heap_stats_t *st);

#endif
