/* gc.h: a worker VM's Lua garbage collector, stepped between requests and timed.
 *
 * LuaJIT's collector is incremental: left to itself it runs a step inside whatever Lua code
 * allocates (every GCSTEPSIZE = 1 KB allocated during a cycle), so its work is spread over the
 * requests' own entries and cannot be told from the scripts' time; its one indivisible step, the
 * atomic phase, re-marks every coroutine's stack (5,000 pages in flight: 5,000 coroutines) and
 * clears the weak tables, and it lands in the middle of some page's entry.
 *
 * Here the worker takes the pacing over: automatic collection is stopped (LUA_GCSTOP only moves
 * the heap's threshold out of reach; a cycle's state is kept), and when an outermost entry into
 * Lua returns (worker.c agw_worker_call_runtime: a request's start, an upstream answer, a timer)
 * agw_gc_pace runs the steps the heap's growth calls for, as LuaJIT would have (one step,
 * LUA_GCSTEP with 0, per KB allocated since the last pacing, each step's work set by the
 * runtime's setstepmul): the same work, done between two entries instead of inside them. Each
 * step and each entry's batch of steps is timed (CLOCK_MONOTONIC) and counted into the worker's
 * metrics (agw_lua_gc_stats_t, ops/metrics.h; aggway_lua_gc_*, printed by tools/bench/memory).
 * A step is the collector's indivisible unit: its longest is the longest pause the collector
 * can impose (the atomic phase, which re-marks every coroutine's stack, is one step). A batch is
 * proportional to what the entry allocated, as LuaJIT's own steps inside it would have been.
 * (Pacing once per loop iteration instead was measured worse: an iteration that accepts
 * thousands of requests grows the heap by tens of MB before any step runs.)
 *
 * A cycle starts when the heap reaches twice what the last finished cycle left live (the
 * runtime's setpause 200), and at least AGW_GC_MIN_HEAP.
 *
 * Garbage made inside one entry into Lua is collected after the entry returns (a single entry is
 * bounded by the script time limit, watchdog.h). A script's collectgarbage("collect"/"step")
 * still works (the sandbox allows them; LuaJIT then re-arms its own threshold until the next
 * pacing stops it again).
 *
 * When a worker goes idle (no request started for AGW_GC_IDLE_S seconds and none in flight),
 * agw_gc_idle runs two full collections of each VM (what a finalizer reaches is freed by the
 * cycle after the one that runs it) and gives the C heap's free memory back to the
 * kernel (malloc_trim), so the RSS a burst of load raised comes back down (again every
 * AGW_GC_TRIM_S s while idle: idle keep-alive upstream connections close later, after their
 * idle_timeout_ms); timed and counted
 * separately (aggway_lua_gc_idle_collections_total), since no request waits on it.
 */
#ifndef AGW_WORKER_GC_H
#define AGW_WORKER_GC_H

#include <lua.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/metrics.h"

#define AGW_GC_MIN_HEAP (2u << 20)  /* bytes: no cycle starts below this heap */
#define AGW_GC_IDLE_S 2             /* seconds without a new request before the idle collection */
#define AGW_GC_TRIM_S 10            /* then the C heap is trimmed again every this many seconds */

/* The pacing state of one VM. Zeroed, then agw_gc_take. */
typedef struct agw_gc {
    size_t live;       /* bytes in use when the last cycle finished (the estimate of live data) */
    size_t last;       /* bytes in use at the end of the last pacing */
    int in_cycle;      /* a cycle has started and not finished */
} agw_gc_t;

/* Stops L's automatic collection and starts pacing it (the VM's heap as it is now counts as
 * live). Call once, after the VM is loaded, on the thread that will run it. */
void agw_gc_take(lua_State *L, agw_gc_t *gc);

/* Runs the steps L's heap growth since the last call calls for (none when no cycle is due);
 * counts them into st. Never call inside an entry into L. */
void agw_gc_pace(lua_State *L, agw_gc_t *gc, agw_lua_gc_stats_t *st);

/* A full collection of L (the worker went idle); counts it into st. The caller gives freed C
 * memory back with agw_gc_trim once every VM was collected. */
void agw_gc_idle(lua_State *L, agw_gc_t *gc, agw_lua_gc_stats_t *st);

/* Gives the C heap's free memory back to the kernel (glibc malloc_trim; nothing elsewhere). */
void agw_gc_trim(void);

#endif
