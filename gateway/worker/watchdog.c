/* watchdog.c: the script time limit (watchdog.h): the thread that watches every worker's entry
 * into Lua, the signal handler and the hook that stop a script on the worker's own thread. It
 * knows a worker only by its agw_watchdog_target_t. */
#include "worker/watchdog.h"

#include "base/heap.h"
#include "base/log.h"
#include "base/mem.h"
#include "script/script.h"

#include <errno.h>
#include <lauxlib.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct agw_watchdog {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC */
    int stop;
    agw_watchdog_target_t *const *targets;
    unsigned n;
};

static __thread agw_watchdog_target_t *this_target; /* the target of the worker whose thread this is */

void agw_watchdog_attach(agw_watchdog_target_t *t)
{
    this_target = t;
}

uint64_t agw_coarse_tick_ms(void)
{
    static uint64_t tick; /* 0: not read yet (a benign race: every thread reads the same value) */
    uint64_t t = __atomic_load_n(&tick, __ATOMIC_RELAXED);
    if (t == 0) {
        struct timespec res;
        t = 1;
        if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0)
            t = (uint64_t)res.tv_sec * 1000u + ((uint64_t)res.tv_nsec + 999999u) / 1000000u;
        if (t == 0)
            t = 1;
        __atomic_store_n(&tick, t, __ATOMIC_RELAXED);
    }
    return t;
}

/* The hook the watchdog and the memory limit set; runs on the worker's thread at the VM's next
 * instruction. */
static void on_script_limit(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    agw_watchdog_target_t *w = this_target;
    uint64_t entry = w ? __atomic_load_n(&w->entry, __ATOMIC_RELAXED) : 0;
    int in_entry = w != NULL && w->depth > 0;
    int too_long = in_entry && __atomic_load_n(&w->stop_entry, __ATOMIC_ACQUIRE) == entry &&
                   agw_coarse_ms() >= w->since_ms + w->limit_ms;
    agw_lua_heap_t *h = agw_heap_lua_of(L);
    int heap_over = h != NULL && h->over;
    int heap_stop = h != NULL && in_entry && h->stop_entry == entry && h->stop_thread == L;
    if (!too_long && !heap_over && !heap_stop) {
        lua_sethook(L, NULL, 0, 0); /* meant for an entry that has ended meanwhile */
        return;
    }
    /* level 0: the function running, not the hook. LuaJIT's library functions written in Lua
     * (table.remove, table.move, string.len, math.deg … : "[builtin:remove]", linedefined -1) run
     * for their caller, which decides: a stop raised in the runtime's call to table.remove would
     * leave the runtime half way as surely as one raised in the runtime's own line */
    lua_Debug d;
    int found = 0;
    for (int level = 0; (found = lua_getstack(L, level, &d) && lua_getinfo(L, "Sl", &d)); level++)
        if (d.linedefined != -1)
            break;
    if (!found || agw_lua_source_is_runtime(d.source)) {
        /* the runtime's own code (lua/agg): an error here could leave it half way through its
         * bookkeeping (a request never answered). In a coroutine the hook waits for the script's
         * next instruction. On the runtime's own thread the script's coroutine is gone, or the
         * pcall around a fallback has its error: the hook removes itself, and the watchdog asks
         * again a limit later if a script runs on (the heap's next allocation past its trip) */
        int main_thread = lua_pushthread(L);
        lua_pop(L, 1);
        if (main_thread) {
            lua_sethook(L, NULL, 0, 0);
            if (h != NULL)
                h->over = 0;
        }
        return;
    }
    if (heap_over && !heap_stop) {
        /* the heap passed its trip: collected, is it still over the limit? */
        if (!agw_heap_lua_still_over(L, h)) {
            if (!too_long) { /* garbage only: nothing to stop */
                lua_sethook(L, NULL, 0, 0);
                return;
            }
        } else {
            h->stop_entry = entry ? entry : 1; /* this script (its coroutine) in this entry */
            h->stop_thread = L;
            heap_stop = 1;
        }
    } else if (heap_over) {
        h->over = 0;
    }
    /* the script's own code, in a coroutine or (a fallback) on the runtime's thread: raised again
     * at each of its instructions, so a pcall in it cannot carry on */
    if (d.currentline > 0)
        lua_pushfstring(L, "%s:%d: ", d.short_src, d.currentline);
    else
        lua_pushliteral(L, "");
    if (too_long)
        lua_pushfstring(L, "stopped: the script ran for more than %d ms without waiting for a call "
                           "(script_time_limit_ms in gateway.lua)",
                        (int)__atomic_load_n(&w->limit_ms, __ATOMIC_RELAXED));
    else
        lua_pushfstring(L, "stopped: the scripts of this worker hold %d MB, more than "
                           "script_memory_limit_mb (%d MB in gateway.lua)",
                        (int)(agw_heap_lua_used(h) >> 20), (int)(h->limit >> 20));
    lua_concat(L, 2);
    lua_error(L);
}

void agw_watchdog_on_heap_over(lua_State *L)
{
    if (lua_gethook(L) != on_script_limit) /* (called at each allocation while the heap is over) */
        lua_sethook(L, on_script_limit, LUA_MASKCOUNT, 1);
}

/* The handler of AGW_WATCHDOG_SIGNAL (async-signal-safe): on a worker thread inside the entry the
 * watchdog asked to stop, sets the hook that stops the script (lua_sethook, the call Lua allows
 * from a signal handler); anywhere else, nothing. */
static void on_watchdog_signal(int sig)
{
    (void)sig;
    int saved = errno;
    agw_watchdog_target_t *w = this_target;
    /* inside an entry (L is its VM: agw_watchdog_enter sets it before depth), and the one the
     * watchdog asked to stop */
    if (w != NULL && w->depth > 0 &&
        __atomic_load_n(&w->stop_entry, __ATOMIC_ACQUIRE) == __atomic_load_n(&w->entry, __ATOMIC_RELAXED))
        lua_sethook(w->L, on_script_limit, LUA_MASKCOUNT, 1);
    errno = saved;
}

uint64_t agw_watchdog_limit_ms(const agw_watchdog_target_t *w)
{
    uint64_t l = __atomic_load_n(&w->limit_ms, __ATOMIC_RELAXED);
    return l ? l : 1000;
}

void agw_watchdog_check(agw_watchdog_target_t *w, uint64_t now)
{
    /* the entry number read before and after its start time: when the two differ, the worker
     * moved on to another entry meanwhile and since may not be that entry's (the worker writes
     * the number before the time, agw_watchdog_enter) */
    uint64_t entry = __atomic_load_n(&w->entry, __ATOMIC_ACQUIRE);
    uint64_t since = __atomic_load_n(&w->since_ms, __ATOMIC_ACQUIRE);
    uint64_t limit = __atomic_load_n(&w->limit_ms, __ATOMIC_RELAXED);
    if (__atomic_load_n(&w->entry, __ATOMIC_ACQUIRE) != entry || since == 0)
        return; /* (since == 0: outside Lua; a worker thread that has ended is always there) */
    /* both times are coarse (agw_coarse_ms): one clock tick more, so as never to stop early. now
     * may be older than since: the watchdog reads the clock once for every worker */
    if (now < since + limit + agw_coarse_tick_ms())
        return;
    int first = __atomic_load_n(&w->stop_entry, __ATOMIC_RELAXED) != entry;
    if (!first && now - w->stop_armed_ms < limit)
        return; /* asked already: again once per limit while the entry lasts */
    __atomic_store_n(&w->stop_entry, entry, __ATOMIC_RELEASE);
    w->stop_armed_ms = now;
    if (first)
        agw_log(AGW_LOG_WARN, "worker %d: a script has run for %llu ms without waiting for a call "
                "(script_time_limit_ms %llu); stopping it", w->id, (unsigned long long)(now - since),
                (unsigned long long)limit);
    pthread_kill(w->thread, AGW_WATCHDOG_SIGNAL); /* on_watchdog_signal sets the hook */
}

/* A quarter of the smallest limit in use, from 5 to 250 ms: a script is stopped within about
 * 1.25 limits of CPU, and an idle gateway wakes this thread a few times a second. */
static uint64_t tick_ms(const agw_watchdog_t *wd)
{
    uint64_t t = 250;
    for (unsigned i = 0; i < wd->n; i++) {
        uint64_t l = agw_watchdog_limit_ms(wd->targets[i]) / 4;
        if (l < t)
            t = l;
    }
    return t < 5 ? 5 : t;
}

static void *watchdog_main(void *arg)
{
    agw_watchdog_t *wd = arg;
    pthread_mutex_lock(&wd->lock);
    while (!wd->stop) {
        struct timespec ts = agw_clock_after_ms(CLOCK_MONOTONIC, tick_ms(wd));
        pthread_cond_timedwait(&wd->cond, &wd->lock, &ts);
        if (wd->stop)
            break;
        uint64_t now = agw_coarse_ms();
        for (unsigned i = 0; i < wd->n; i++)
            agw_watchdog_check(wd->targets[i], now);
    }
    pthread_mutex_unlock(&wd->lock);
    return NULL;
}

agw_watchdog_t *agw_watchdog_start(agw_watchdog_target_t *const *targets, unsigned n)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_watchdog_signal;
    sa.sa_flags = SA_RESTART; /* a worker interrupted in a system call goes on with it */
    sigemptyset(&sa.sa_mask);
    if (sigaction(AGW_WATCHDOG_SIGNAL, &sa, NULL) != 0)
        return NULL;
    agw_watchdog_t *wd = agw_calloc(1, sizeof(*wd));
    wd->targets = targets;
    wd->n = n;
    pthread_mutex_init(&wd->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
        pthread_cond_destroy(&wd->cond);
        pthread_mutex_destroy(&wd->lock);
        free(wd);
        return NULL;
    }
    return wd;
}

void agw_watchdog_stop(agw_watchdog_t *wd)
{
    if (wd == NULL)
        return;
    pthread_mutex_lock(&wd->lock);
    wd->stop = 1;
    pthread_cond_signal(&wd->cond);
    pthread_mutex_unlock(&wd->lock);
    pthread_join(wd->thread, NULL);
    pthread_cond_destroy(&wd->cond);
    pthread_mutex_destroy(&wd->lock);
    free(wd);
}
