/* watchdog.c: the thread that enforces the script time limit (watchdog.h). */
#include "worker/watchdog.h"

#include "base/mem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker.h"

struct agw_watchdog {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC */
    int stop;
    struct agw_worker **workers;
    unsigned n;
};

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

/* A quarter of the smallest limit in use, from 5 to 250 ms: a script is stopped within about
 * 1.25 limits of CPU, and an idle gateway wakes this thread a few times a second. */
static uint64_t tick_ms(const agw_watchdog_t *wd)
{
    uint64_t t = 250;
    for (unsigned i = 0; i < wd->n; i++) {
        uint64_t l = agw_worker_script_limit_ms(wd->workers[i]) / 4;
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
            agw_worker_watch_script(wd->workers[i], now);
    }
    pthread_mutex_unlock(&wd->lock);
    return NULL;
}

agw_watchdog_t *agw_watchdog_start(struct agw_worker **workers, unsigned n)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = agw_worker_on_watchdog_signal;
    sa.sa_flags = SA_RESTART; /* a worker interrupted in a system call goes on with it */
    sigemptyset(&sa.sa_mask);
    if (sigaction(AGW_WATCHDOG_SIGNAL, &sa, NULL) != 0)
        return NULL;
    agw_watchdog_t *wd = agw_calloc(1, sizeof(*wd));
    wd->workers = workers;
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
