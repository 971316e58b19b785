/* gens.h: the generations a worker runs (part of agw_worker, owned by vm.c).
 *
 * New requests go to cur; every generation of this worker still referenced (cur included) is on
 * live; one released while Lua code ran waits on dead until no Lua runs (worker_internal.h,
 * agw_worker_gen_release). A reload is prepared on the main thread and left in next, which the
 * worker takes on its own loop (reload_async): next and next_lock are the only fields another
 * thread touches, serving the only one another thread reads.
 */
#ifndef AGW_WORKER_GENS_H
#define AGW_WORKER_GENS_H

#include <ev.h>
#include <h2o/linklist.h>
#include <pthread.h>
#include <stdint.h>

struct agw_worker_gen;

typedef struct agw_worker_gens {
    struct agw_worker_gen *cur;  /* the generation new requests go to */
    h2o_linklist_t live;         /* every live generation of this worker (cur included), newest
                                    first (agw_worker_gen.link) */
    h2o_linklist_t dead;         /* generations to free once no Lua code runs (the same link) */
    ev_async reload_async;       /* agw_worker_install(): take `next` */
    pthread_mutex_t next_lock;
    struct agw_worker_gen *next; /* prepared on the main thread, not yet taken (next_lock) */
    uint64_t serving;            /* number of cur's generation (atomic: the main thread reads it) */
    struct wpool *old_pools;     /* pools whose endpoint address went away (group/directory.h):
                                    closed once their calls in flight have ended (vm.c) */
} agw_worker_gens_t;

/* Initializes the lists and the lock of gs (the rest is zeroed memory). Before the worker's thread starts. */
void agw_worker_gens_init(agw_worker_gens_t *gs);

/* Leaves g as the next generation for the worker to take (thread-safe). Returns the one left
 * before and not taken yet (the caller frees it), or NULL. */
struct agw_worker_gen *agw_worker_gens_offer(agw_worker_gens_t *gs, struct agw_worker_gen *g);

/* Takes the generation left by agw_worker_gens_offer (thread-safe), or NULL when there is none. */
struct agw_worker_gen *agw_worker_gens_take(agw_worker_gens_t *gs);

#endif
