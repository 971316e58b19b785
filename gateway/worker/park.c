/* park.c: a request parked on an asynchronous decision (see worker_internal.h, "park.c"). */
#include "worker/worker_internal.h"

static void finish(agw_park_t *pk, int timed_out)
{
    agw_worker_t *w = pk->w;
    wgen_t *g = pk->g;
    pk->state = 0;
    ev_timer_stop(w->loop, &pk->timer);
    pk->ops->resume(pk, timed_out); /* pk may be gone once it returns: only locals from here */
    __atomic_sub_fetch(&w->inflight, 1, __ATOMIC_RELAXED);
    agw_worker_gen_release(g);
}

static void on_park_dispose(void *p)
{
    agw_park_t *pk = p;
    if (pk->state == 0)
        return; /* resumed earlier: the request's answer or script owns it now */
    agw_worker_t *w = pk->w;
    wgen_t *g = pk->g;
    pk->state = 0;
    ev_timer_stop(w->loop, &pk->timer);
    if (pk->ops->cancel)
        pk->ops->cancel(pk);
    __atomic_sub_fetch(&w->inflight, 1, __ATOMIC_RELAXED);
    agw_worker_gen_release(g);
}

/* The next time the timer must fire: the next poll or the deadline, whichever comes first. */
static void arm(agw_park_t *pk, double now)
{
    double left = pk->until - now;
    double after = pk->poll_s > 0 && pk->poll_s < left ? pk->poll_s : left;
    ev_timer_set(&pk->timer, after > 0 ? after : 0, 0);
    ev_timer_start(pk->w->loop, &pk->timer);
}

static void on_park_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)revents;
    agw_park_t *pk = t->data;
    if (pk->state == 2 || (pk->ops->poll && pk->ops->poll(pk))) {
        finish(pk, 0);
        return;
    }
    double now = ev_now(loop);
    if (now >= pk->until) {
        finish(pk, 1);
        return;
    }
    arm(pk, now);
}

void *agw_park_new(agw_worker_t *w, wgen_t *g, h2o_req_t *req, size_t size, double timeout_s, double poll_s,
                   const agw_park_ops_t *ops)
{
    agw_park_t *pk = h2o_mem_alloc_shared(&req->pool, size, on_park_dispose);
    memset(pk, 0, size);
    pk->w = w;
    pk->g = g;
    agw_worker_gen_hold(g);
    pk->req = req;
    pk->ops = ops;
    pk->until = ev_now(w->loop) + timeout_s;
    pk->poll_s = ops->poll ? poll_s : 0;
    pk->state = 1;
    __atomic_add_fetch(&w->inflight, 1, __ATOMIC_RELAXED); /* a drain waits for it too */
    ev_init(&pk->timer, on_park_timer);
    pk->timer.data = pk;
    arm(pk, ev_now(w->loop));
    return pk;
}

void agw_park_wake(agw_park_t *pk)
{
    if (pk->state != 1)
        return;
    pk->state = 2;
    ev_timer_stop(pk->w->loop, &pk->timer);
    ev_timer_set(&pk->timer, 0, 0);
    ev_timer_start(pk->w->loop, &pk->timer);
}
