/* resolver.c: the resolver thread (see resolver.h). */
#include "front/resolver.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "base/log.h"
#include "base/mem.h"
#include "group/directory.h"

struct agw_resolver {
    agw_reload_state_t *gens;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* signalled by agw_resolver_stop */
    int stop;            /* under lock */
};

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *resolver_main(void *arg)
{
    agw_resolver_t *r = arg;
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        pthread_mutex_unlock(&r->lock);
        agw_generation_t *gen = agw_reload_state_current(r->gens);
        if (gen) {
            agw_endpoint_dir_refresh(gen->dir, monotonic_ms());
            agw_generation_unref(gen);
        }
        pthread_mutex_lock(&r->lock);
        if (r->stop)
            break;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&r->cond, &r->lock, &until);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

agw_resolver_t *agw_resolver_start(agw_reload_state_t *gens)
{
    agw_resolver_t *r = agw_calloc(1, sizeof(*r));
    r->gens = gens;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&r->thread, NULL, resolver_main, r) != 0) {
        agw_log(AGW_LOG_WARN, "cannot start the resolver thread: endpoint host names are resolved at load only");
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return NULL;
    }
    return r;
}

void agw_resolver_stop(agw_resolver_t *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
