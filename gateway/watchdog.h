/* watchdog.h: the script time limit.
 *
 * A worker runs one script at a time on its loop: a handler or continuation that computes for
 * seconds (an endless loop, a runaway transform) holds up every request of that worker. Each
 * outermost entry of a worker into Lua (agw_worker_call_runtime) is timed; the watchdog thread
 * looks at every worker a few times per limit, and when an entry has run for longer than its
 * generation's script_time_limit_ms (gateway.lua, default 1000 ms) it asks that worker's VM to stop
 * the script with lua_sethook, the one Lua API call made to be called from another thread (or a
 * signal handler) while the VM runs (Lua 5.1 manual §3.8, lua_sethook; LuaJIT's interpreter runs
 * the hook at its next instruction).
 *
 * The hook, on the worker's own thread, raises "stopped: … script_time_limit_ms …" at the line the
 * script was running. Inside a coroutine (a handler or a continuation: where scripts run) it
 * raises again at every instruction until the error has left the coroutine, so a pcall in the
 * script cannot catch it and carry on; the runtime then answers the request with a 500 problem,
 * or fails the continuation's section, as for any script error, and logs file:line. Raised once
 * only on the runtime's own thread (a fallback function, for instance): the pcall around it turns
 * it into that call's error.
 *
 * Compiled code does not run hooks (LuaJIT), so the scripts' own functions run in LuaJIT's
 * interpreter (agg.loader turns the JIT off for them; the agg library stays compiled). Not
 * stopped: a script that turns the JIT back on for a function (jit.on(f, true)) and loops in it, a
 * long C call (a pathological string pattern), a loop in a __gc finalizer. The watchdog asks again
 * every limit while the entry lasts.
 */
#ifndef AGW_WATCHDOG_H
#define AGW_WATCHDOG_H

#include <stdint.h>
#include <time.h>

struct agw_worker;

/* Milliseconds on CLOCK_MONOTONIC_COARSE (one clock tick of resolution, a few ms: enough for a
 * limit of 10 ms or more, and cheap enough to read at every entry into Lua). */
static inline uint64_t agw_coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The resolution of agw_coarse_ms, ms (clock_getres; read once, 1 when it cannot be read). */
uint64_t agw_coarse_tick_ms(void);

typedef struct agw_watchdog agw_watchdog_t;

/* Starts the watchdog thread over workers[0 .. n-1] (the array and the workers must outlive it).
 * Returns NULL when the thread cannot start (the gateway serves on without a time limit; the
 * caller logs it). */
agw_watchdog_t *agw_watchdog_start(struct agw_worker **workers, unsigned n);

/* Stops the thread and frees the watchdog; NULL is a no-op. Call before stopping the workers. */
void agw_watchdog_stop(agw_watchdog_t *wd);

#endif
