/* gc.h: what a worker does about its Lua VMs' memory when it goes idle.
 *
 * LuaJIT's collector is incremental and runs by itself inside the Lua code that allocates (a step
 * per GCSTEPSIZE, 1 KB, allocated during a cycle; a cycle starts when the heap reaches three times
 * what the last one left live, setpause 300 in agg.runtime). It stays that way: a script that makes a lot of garbage
 * within one entry is collected as it goes. (Stopping the automatic collector and running its
 * steps between entries instead was measured: no gain in memory per page in flight, about 3,900
 * more instructions per page, and a script making 3 million small tables in one entry peaked at
 * 137 MB of RSS and hit the script time limit, against 9.5 MB and 0.7 s with the collector left
 * alone; docs/performance.md.)
 *
 * After a burst the heap stays at its high-water mark until later cycles: when a worker goes
 * idle (no request started for AGW_GC_IDLE_S seconds and none in flight), agw_gc_idle runs two
 * full collections of each VM (what a finalizer reaches is freed by the cycle after the one that
 * runs it) with agg.runtime.compact between them (the runtime's tables of requests and calls in
 * flight, which Lua never shrinks, made again at their present size), the worker's id tables
 * are freed when empty (base/slots.h agw_slots_compact), and agw_gc_trim gives the heap's wholly
 * free pages back to the kernel (base/heap.h), again every AGW_GC_TRIM_S s while idle (idle
 * keep-alive upstream connections close later, after their idle_timeout_ms). Counted and timed (aggway_lua_gc_idle_collections_total and
 * aggway_lua_gc_idle_collection_max_seconds); no request waits on it.
 */
#ifndef AGW_WORKER_GC_H
#define AGW_WORKER_GC_H

#include <lua.h>
#include <stdint.h>
#include <time.h>

#include "ops/metrics.h"

/* The worker's pauses in Lua. LuaJIT offers no hook around its collector's steps, but they run
 * inside the entries into Lua that allocate: each outermost entry (agw_worker_call_runtime) is
 * timed, the script's work and the collector's together, into aggway_lua_entry_duration_seconds
 * (agw_metrics_lua_entry). Timed in processor cycles, two reads of x86-64's time-stamp counter per
 * entry (a few instructions; two CLOCK_MONOTONIC reads cost about 600 instructions per page,
 * tools/bench/callgrind), converted to µs with the counter's rate measured against CLOCK_MONOTONIC;
 * elsewhere than x86-64 the "cycles" are CLOCK_MONOTONIC's nanoseconds. Wall time: a thread
 * waiting for a core is paused too. */
typedef struct agw_gc_timer {
    uint64_t start;              /* agw_gc_cycles() when the current entry began */
    double cycles_per_us;        /* the counter's rate */
    uint64_t cyc0, us0;          /* the measurement's origin: the counter and CLOCK_MONOTONIC µs */
} agw_gc_timer_t;

/* The counter: the time-stamp counter on x86-64 (constant rate, whatever the core's frequency, on
 * every x86-64 processor Linux runs on with constant_tsc), CLOCK_MONOTONIC ns elsewhere. */
static inline uint64_t agw_gc_cycles(void)
{
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* Measures the counter's rate over 1 ms (a busy wait: once, as the worker is made, before any
 * entry into Lua). */
void agw_gc_timer_init(agw_gc_timer_t *t);

/* Measures the rate again over the whole time since agw_gc_timer_init (more precise as it grows:
 * the worker's once-a-second tick calls it). */
void agw_gc_timer_calibrate(agw_gc_timer_t *t);

/* An outermost entry into Lua begins. */
static inline void agw_gc_entry_begin(agw_gc_timer_t *t)
{
    t->start = agw_gc_cycles();
}

/* How long the entry agw_gc_entry_begin began has lasted, µs (0 when the counter went back: a
 * thread moved to a core whose counter is behind). */
static inline uint64_t agw_gc_entry_us(const agw_gc_timer_t *t)
{
    int64_t d = (int64_t)(agw_gc_cycles() - t->start);
    return d > 0 ? (uint64_t)((double)d / t->cycles_per_us) : 0;
}

/* The collector's pause follows the pages in flight. A cycle starts when the heap reaches pause %
 * of what the last one left live: agg.runtime's 300 normally, and AGW_GC_PAUSE_BIG (120) while the
 * worker has more than AGW_GC_BURST requests in flight (a burst), until it is back under
 * AGW_GC_CALM. At 5,000 pages in flight the Lua heap's peak is then 5.7–7.7 KB per page instead of
 * 15.0, and RSS per page 24 KB instead of 31 (tools/bench/memory). 120 costs the collector five
 * times the marking per byte allocated, whatever the heap's size: at all times it would cost about
 * 21,500 more instructions per page (129,675 and 131,418 against 108,125 and 107,944 at the
 * bench's 8 connections, tools/bench/callgrind), so it is kept for bursts, where memory is what
 * runs out. The pages in flight, not the heap's size, decide: a VM whose scripts keep a lot of
 * data of their own keeps the pause it was given.
 *
 * The step multiplier goes from agg.runtime's 1000 to AGW_GC_STEPMUL_BIG (400) for the burst too:
 * each step of the collector does less, so an entry into Lua that allocates runs shorter steps.
 * At 5,000 pages in flight (tools/bench/memory, three runs each): entries into Lua over 1 ms 88, 97
 * and 93 at 1000, 66, 49 and 73 at 400; RSS per page in flight 26.4-26.8 KB and 26.6-27.0 KB (no
 * change). At all times 400 would cost about 4,800 instructions a bench page (101,532 and 101,903
 * against 96,571 and 97,081, tools/bench/callgrind): a burst's setting only. */
#define AGW_GC_PAUSE_BIG 120
#define AGW_GC_STEPMUL_BIG 400
#define AGW_GC_BURST 2000
#define AGW_GC_CALM 1000

/* A VM's pause and step multiplier as agw_gc_pace set them (zero-initialized: the VM's own). */
typedef struct agw_gc_pace {
    unsigned char burst; /* AGW_GC_PAUSE_BIG and AGW_GC_STEPMUL_BIG are set */
    int pause;           /* the pause it replaced, given back when the burst ends */
    int stepmul;         /* the step multiplier it replaced, the same */
} agw_gc_pace_t;

/* Sets L's pause and step multiplier by the worker's requests in flight as above (p: L's state,
 * in_flight: the worker's, every generation's). Cheap (a comparison; two lua_gc calls when it
 * switches): the worker calls it once per loop iteration for each VM. The pause takes effect from
 * the collector's next cycle, the step multiplier from its next step. */
static inline void agw_gc_pace(lua_State *L, agw_gc_pace_t *p, size_t in_flight)
{
    if (!p->burst && in_flight > AGW_GC_BURST) {
        p->pause = lua_gc(L, LUA_GCSETPAUSE, AGW_GC_PAUSE_BIG);
        p->stepmul = lua_gc(L, LUA_GCSETSTEPMUL, AGW_GC_STEPMUL_BIG);
        p->burst = 1;
    } else if (p->burst && in_flight < AGW_GC_CALM) {
        lua_gc(L, LUA_GCSETPAUSE, p->pause);
        lua_gc(L, LUA_GCSETSTEPMUL, p->stepmul);
        p->burst = 0;
    }
}

#define AGW_GC_IDLE_S 2  /* seconds without a new request before the idle collection */
#define AGW_GC_TRIM_S 10 /* then the C heap is trimmed again every this many seconds */

/* Two full collections of L (the worker went idle), timed and counted into st, with between(arg)
 * run between them when not NULL (the worker's: agg.runtime.compact, which makes the runtime's
 * per-request tables again at their present size once the first collection cleared what weak
 * tables held; the second frees the old ones). Call between entries into L, on its worker's thread. The caller
 * gives freed C memory back with agw_gc_trim once every VM was collected. */
void agw_gc_idle(lua_State *L, agw_lua_gc_stats_t *st, void (*between)(void *arg), void *arg);

/* Gives the heap's wholly free pages back to the kernel (agw_heap_give_back: jemalloc's purge, or
 * glibc's malloc_trim in a sanitized build). */
void agw_gc_trim(void);

#endif
