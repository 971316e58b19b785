/* gc.h: what a worker does about its Lua VMs' memory when it goes idle.
 *
 * LuaJIT's collector is incremental and runs by itself inside the Lua code that allocates (a step
 * per GCSTEPSIZE, 1 KB, allocated during a cycle; a cycle starts when the heap reaches twice what
 * the last one left live, setpause 200). It stays that way: a script that makes a lot of garbage
 * within one entry is collected as it goes. (Stopping the automatic collector and running its
 * steps between entries instead was measured: no gain in memory per page in flight, about 3,900
 * more instructions per page, and a script making 3 million small tables in one entry peaked at
 * 137 MB of RSS and hit the script time limit, against 9.5 MB and 0.7 s with the collector left
 * alone; docs/performance.md.)
 *
 * After a burst the heap stays at its high-water mark until later cycles: when a worker goes
 * idle (no request started for AGW_GC_IDLE_S seconds and none in flight), agw_gc_idle runs two
 * full collections of each VM (what a finalizer reaches is freed by the cycle after the one that
 * runs it), and agw_gc_trim gives the C heap's free memory back to the kernel (malloc_trim), again
 * every AGW_GC_TRIM_S s while idle (idle keep-alive upstream connections close later, after their
 * idle_timeout_ms). Counted and timed (aggway_lua_gc_idle_collections_total and
 * aggway_lua_gc_idle_collection_max_seconds); no request waits on it.
 */
#ifndef AGW_WORKER_GC_H
#define AGW_WORKER_GC_H

#include <lua.h>

#include "ops/metrics.h"

#define AGW_GC_IDLE_S 2  /* seconds without a new request before the idle collection */
#define AGW_GC_TRIM_S 10 /* then the C heap is trimmed again every this many seconds */

/* Two full collections of L (the worker went idle), timed and counted into st. Call between
 * entries into L, on its worker's thread. The caller gives freed C memory back with agw_gc_trim
 * once every VM was collected. */
void agw_gc_idle(lua_State *L, agw_lua_gc_stats_t *st);

/* Gives the C heap's free memory back to the kernel (glibc malloc_trim; nothing elsewhere). */
void agw_gc_trim(void);

#endif
