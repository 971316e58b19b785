/* watchdog.h: the script time limit.
 *
 * A worker runs one script at a time on its loop: a handler or continuation that computes for
 * seconds (an endless loop, a runaway transform) holds up every request of that worker. Each
 * outermost entry of a worker into Lua (agw_worker_call_runtime) is timed; the watchdog thread
 * looks at every worker a few times per limit, and when an entry has run for longer than its
 * generation's script_time_limit_ms (gateway.lua, default 1000 ms) it sends that worker's thread
 * AGW_WATCHDOG_SIGNAL (pthread_kill). The signal handler, on the worker's own thread, sets a count
 * hook on the VM with lua_sethook: the call Lua allows asynchronously, from a signal handler on the
 * thread that runs the VM (Lua 5.1 manual §3.8; luajit.c stops a script on SIGINT the same way).
 * Calling it from the watchdog thread instead would race with the worker on the VM's hook and JIT
 * state. LuaJIT's interpreter runs the hook at its next instruction.
 *
 * The hook raises "file:line: stopped: … script_time_limit_ms …" at every instruction of the
 * scripts' own code (anything but the runtime's files, lua/agg), in a coroutine (a handler or a
 * continuation) or on the runtime's own thread (a fallback function), so a pcall in the script
 * cannot catch it and carry on; the runtime answers the request with a 500 problem, or fails the
 * section, as for any script error, and logs file:line. It never raises in the runtime's own code,
 * whose state an error could leave half changed (a request never answered): in a coroutine it
 * waits for the script's next instruction; on the runtime's thread it removes itself, and the
 * watchdog asks again a limit later if a script runs on.
 *
 * Compiled code does not run hooks (LuaJIT), so the scripts' own functions run in LuaJIT's
 * interpreter (agg.loader turns the JIT off for them; the agg library stays compiled). Not
 * stopped: a script that turns the JIT back on for a function (jit.on(f, true)) and loops in it, a
 * long C call (a pathological string pattern), a loop in a __gc finalizer. The watchdog asks again
 * every limit while the entry lasts; a shutdown waits 5 s for such a worker, then exits 1
 * (server.c).
 */
#ifndef AGW_WATCHDOG_H
#define AGW_WATCHDOG_H

#include <signal.h>
#include <stdint.h>

#include "base/clock.h"

struct agw_worker;

/* The resolution of agw_coarse_ms, ms (clock_getres; read once, 1 when it cannot be read). */
uint64_t agw_coarse_tick_ms(void);

/* The signal the watchdog sends a worker thread whose script ran past its limit (a real-time
 * signal: nothing else in the process uses it; its handler is installed by agw_watchdog_start). */
#define AGW_WATCHDOG_SIGNAL (SIGRTMIN + 3)

typedef struct agw_watchdog agw_watchdog_t;

/* Installs the handler of AGW_WATCHDOG_SIGNAL (agw_worker_on_watchdog_signal) and starts the
 * watchdog thread over workers[0 .. n-1] (the array and the workers must outlive it). Returns NULL
 * when either fails (the gateway serves on without a time limit; the caller logs it). */
agw_watchdog_t *agw_watchdog_start(struct agw_worker **workers, unsigned n);

/* Stops the thread and frees the watchdog; NULL is a no-op. Call after the workers have stopped:
 * it goes on stopping runaway scripts while they stop (server.c). */
void agw_watchdog_stop(agw_watchdog_t *wd);

#endif
