/* client_slots.c: one count of open client connections for the gateway (client_slots.h). */
#include "worker/client_slots.h"

#include "base/mem.h"

#include <stdlib.h>

typedef struct waiter {
    struct ev_loop *loop; /* NULL until the worker registers */
    ev_async *wake;
    int waiting;          /* atomic: the worker's listeners are paused at the cap */
} waiter_t;

struct agw_client_slots {
    unsigned open;        /* atomic: connections open, plus slots taken for an accept in progress */
    int waiters;          /* atomic: workers waiting (a give looks at the list only when some are) */
    unsigned num_workers;
    waiter_t *w;
};

agw_client_slots_t *agw_client_slots_new(unsigned num_workers)
{
    agw_client_slots_t *s = agw_calloc(1, sizeof(*s));
    s->num_workers = num_workers ? num_workers : 1;
    s->w = agw_calloc(s->num_workers, sizeof(*s->w));
    return s;
}

void agw_client_slots_free(agw_client_slots_t *s)
{
    if (s == NULL)
        return;
    free(s->w);
    free(s);
}

void agw_client_slots_register(agw_client_slots_t *s, unsigned id, struct ev_loop *loop, ev_async *wake)
{
    if (id >= s->num_workers)
        return;
    s->w[id].loop = loop;
    s->w[id].wake = wake;
}

int agw_client_slots_take(agw_client_slots_t *s, unsigned max)
{
    unsigned open = __atomic_load_n(&s->open, __ATOMIC_RELAXED);
    do {
        if (open >= max)
            return 0;
    } while (!__atomic_compare_exchange_n(&s->open, &open, open + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return 1;
}

void agw_client_slots_give(agw_client_slots_t *s)
{
    __atomic_sub_fetch(&s->open, 1, __ATOMIC_SEQ_CST);
    /* A waiter sets its flag and then reads the count (agw_client_slots_wait); this decrements the
     * count and then reads the flags. Both sequentially consistent: at least one of the two sees
     * the other's write, so a worker never waits for a slot that came free unseen. */
    if (__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST) == 0)
        return;
    for (unsigned i = 0; i < s->num_workers; i++) {
        waiter_t *wt = &s->w[i];
        if (wt->loop != NULL && __atomic_load_n(&wt->waiting, __ATOMIC_SEQ_CST))
            ev_async_send(wt->loop, wt->wake);
    }
}

int agw_client_slots_wait(agw_client_slots_t *s, unsigned id, unsigned max)
{
    if (id >= s->num_workers)
        return 1;
    waiter_t *wt = &s->w[id];
    if (!__atomic_load_n(&wt->waiting, __ATOMIC_RELAXED)) {
        __atomic_store_n(&wt->waiting, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    }
    if (__atomic_load_n(&s->open, __ATOMIC_SEQ_CST) < max) {
        agw_client_slots_unwait(s, id);
        return 1;
    }
    return 0;
}

void agw_client_slots_unwait(agw_client_slots_t *s, unsigned id)
{
    if (id >= s->num_workers)
        return;
    waiter_t *wt = &s->w[id];
    if (__atomic_load_n(&wt->waiting, __ATOMIC_RELAXED)) {
        __atomic_store_n(&wt->waiting, 0, __ATOMIC_SEQ_CST);
        __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    }
}

unsigned agw_client_slots_open(const agw_client_slots_t *s)
{
    return __atomic_load_n(&s->open, __ATOMIC_RELAXED);
}
