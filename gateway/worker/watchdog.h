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
 * The same hook stops a script whose worker's Lua heap passed script_memory_limit_mb
 * (agw_watchdog_on_heap_over, base/heap.h).
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
 * interpreter (agg.loader turns the JIT off for them; the agg library stays compiled). A string
 * pattern that backtracks for long runs the hook while it matches (script/pattern.h). Not
 * stopped: a script that turns the JIT back on for a function (jit.on(f, true)) and loops in it,
 * another long C call (string.rep of gigabytes), a loop in a __gc finalizer. The watchdog asks again
 * every limit while the entry lasts; a shutdown waits 5 s for such a worker, then exits 1
 * (server.c).
 */
#ifndef AGW_WATCHDOG_H
#define AGW_WATCHDOG_H

#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "base/clock.h"

/* The resolution of agw_coarse_ms, ms (clock_getres; read once, 1 when it cannot be read). */
uint64_t agw_coarse_tick_ms(void);

/* The signal the watchdog sends a worker thread whose script ran past its limit (a real-time
 * signal: nothing else in the process uses it; its handler is installed by agw_watchdog_start). */
#define AGW_WATCHDOG_SIGNAL (SIGRTMIN + 3)

/* What the watchdog sees of one worker: its entries into Lua. This is the whole interface between
 * the two (the watchdog knows nothing else of a worker). An entry is one outermost
 * agw_worker_call_runtime, begun with agw_watchdog_enter and ended with agw_watchdog_leave. The
 * worker's thread writes depth, L, since_ms, entry and limit_ms; the watchdog thread reads the
 * last three and writes stop_entry and stop_armed_ms; the signal handler and the hook (on the
 * worker's thread) read them. Zeroed memory is a worker outside Lua. */
typedef struct agw_watchdog_target {
    int id;                 /* the worker's number (the log line) */
    pthread_t thread;       /* the worker's thread: AGW_WATCHDOG_SIGNAL goes there (set before the
                               watchdog starts) */
    int depth;              /* > 0 while C code runs inside Lua (entries and nested calls) */
    lua_State *L;           /* the VM of the entry (set before depth: the signal handler reads it
                               while depth > 0) */
    uint64_t since_ms;      /* atomic: coarse monotonic ms when the entry began, 0 outside Lua */
    uint64_t entry;         /* atomic: entries so far (the current one while in Lua) */
    uint64_t limit_ms;      /* atomic: the entry's generation's script_time_limit_ms */
    uint64_t stop_entry;    /* atomic: the entry the watchdog asked to stop, 0 for none */
    uint64_t stop_armed_ms; /* watchdog thread only: when it last asked */
} agw_watchdog_target_t;

/* Makes t the target of the calling thread (a worker's, once, before its loop runs): the signal
 * handler and the hook find it there. */
void agw_watchdog_attach(agw_watchdog_target_t *t);

/* A worker goes into Lua (VM L): an outermost call (depth 0) begins an entry the watchdog times
 * against limit_ms. Every call, nested or not, is matched by agw_watchdog_leave. Inline: this is
 * on the path of every request and upstream answer. */
static inline void agw_watchdog_enter(agw_watchdog_target_t *t, lua_State *L, uint64_t limit_ms)
{
    if (t->depth == 0) {
        t->L = L;
        __atomic_store_n(&t->limit_ms, limit_ms, __ATOMIC_RELAXED);
        __atomic_store_n(&t->entry, t->entry + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&t->since_ms, agw_coarse_ms(), __ATOMIC_RELEASE);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* L before depth, for the signal handler */
    t->depth++;
}

/* The call agw_watchdog_enter began has returned. Returns how long the entry lasted (ms, coarse)
 * when this ends an entry, 0 for a nested call. */
static inline uint64_t agw_watchdog_leave(agw_watchdog_target_t *t)
{
    uint64_t took = 0;
    if (t->depth == 1) {
        uint64_t since = __atomic_load_n(&t->since_ms, __ATOMIC_RELAXED);
        __atomic_store_n(&t->since_ms, 0, __ATOMIC_RELEASE);
        took = agw_coarse_ms() - since;
    }
    t->depth--;
    return took;
}

/* The memory limit's second rule (base/heap.h agw_lua_heap_t.on_over): L's VM heap passed its
 * trip, so this sets the same hook on L as a stop the watchdog asks for. At the script's next
 * instruction (never in the runtime's code) the hook collects, and when the heap is still over
 * script_memory_limit_mb it stops the script as the time limit does: "file:line: stopped: the
 * scripts of this worker hold N MB, more than script_memory_limit_mb (M MB in gateway.lua)". Called
 * from inside an allocation on the worker's thread (lua_sethook may be called at any time). */
void agw_watchdog_on_heap_over(lua_State *L);

/* The script time limit of t's last entry, ms (thread-safe; the watchdog paces itself by it).
 * 1000 before the first entry. */
uint64_t agw_watchdog_limit_ms(const agw_watchdog_target_t *t);

/* The watchdog thread's check of t, with now = agw_coarse_ms() (read once for every worker, so it
 * may be a little older than an entry's start): when t has been inside one entry for longer than
 * its limit plus a clock tick, sends its thread AGW_WATCHDOG_SIGNAL (once per limit while the
 * entry lasts) and logs, the first time, which worker and for how long. Thread-safe. */
void agw_watchdog_check(agw_watchdog_target_t *t, uint64_t now);

typedef struct agw_watchdog agw_watchdog_t;

/* Installs the handler of AGW_WATCHDOG_SIGNAL and starts the watchdog thread over targets[0 .. n-1]
 * (the array and the targets must outlive it). Returns NULL when either fails (the gateway serves
 * on without a time limit; the caller logs it). */
agw_watchdog_t *agw_watchdog_start(agw_watchdog_target_t *const *targets, unsigned n);

/* Stops the thread and frees the watchdog; NULL is a no-op. Call after the workers have stopped:
 * it goes on stopping runaway scripts while they stop (server.c). */
void agw_watchdog_stop(agw_watchdog_t *wd);

#endif
