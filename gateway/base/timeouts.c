/* timeouts.c: one-shot timeouts sharing one libev timer (timeouts.h). */
#include "base/timeouts.h"

#include "base/mem.h"

#include <stdlib.h>

/* The clock timer's period, s: it is never due in practice (about 31 years); when it is, its
 * repeat starts it again and the set's epoch moves on by as much, so the clock goes on. */
#define CLOCK_S 1e9
/* A timeout this close to due when the set's timer runs is due: the set's clock and libev's time
 * of the timer are the same instant computed in two ways, which can differ in the last bits. */
#define SLACK_S 1e-6

double agw_timeouts_now(const agw_timeouts_t *s)
{
    /* libev: an active timer's remaining time is its due time less the loop's monotonic time */
    return s->epoch - ev_timer_remaining(s->loop, (ev_timer *)&s->clock);
}

static inline int earlier(const agw_timeout_t *a, const agw_timeout_t *b)
{
    return a->at < b->at || (a->at == b->at && (int32_t)(a->seq - b->seq) < 0);
}

static inline void place(agw_timeouts_t *s, uint32_t i, agw_timeout_t *t)
{
    s->heap[i] = t;
    t->slot = i + 1;
}

static void sift_up(agw_timeouts_t *s, uint32_t i, agw_timeout_t *t)
{
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!earlier(t, s->heap[parent]))
            break;
        place(s, i, s->heap[parent]);
        i = parent;
    }
    place(s, i, t);
}

static void sift_down(agw_timeouts_t *s, uint32_t i, agw_timeout_t *t)
{
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= s->n)
            break;
        if (child + 1 < s->n && earlier(s->heap[child + 1], s->heap[child]))
            child++;
        if (!earlier(s->heap[child], t))
            break;
        place(s, i, s->heap[child]);
        i = child;
    }
    place(s, i, t);
}

/* Arms the set's timer for its first timeout, or stops it when the set is empty. */
static void arm(agw_timeouts_t *s)
{
    ev_timer_stop(s->loop, &s->ev);
    if (s->n == 0)
        return;
    double after = s->heap[0]->at - agw_timeouts_now(s); /* (now: a callback may have moved the time) */
    ev_timer_set(&s->ev, after > 0. ? after : 0., 0.);
    ev_timer_start(s->loop, &s->ev);
}

static void on_due(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop, (void)revents;
    agw_timeouts_t *s = w->data;
    double now = agw_timeouts_now(s);
    /* the turn rule: what was started since this turn's poll waits for a later turn, as an
     * ev_timer would (libev counts the turn just before its poll; a timeout started exactly 2^32
     * turns ago only waits one turn more) */
    unsigned turn = ev_iteration(s->loop);
    int alive = 1, *outer = s->alive;
    s->alive = &alive;
    while (s->n) {
        agw_timeout_t *t = s->heap[0];
        if (t->at > now + SLACK_S || t->iteration == turn)
            break;
        agw_timeout_stop(s, t);
        t->cb(t);
        if (!alive)
            return; /* a callback freed the set */
    }
    s->alive = outer;
    arm(s);
}

static void on_clock(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop, (void)revents;
    agw_timeouts_t *s = w->data;
    s->epoch += CLOCK_S; /* (its repeat moved its due time on by as much) */
}

void agw_timeouts_init(agw_timeouts_t *s, struct ev_loop *loop)
{
    *s = (agw_timeouts_t){.loop = loop, .epoch = CLOCK_S};
    ev_init(&s->ev, on_due);
    s->ev.data = s;
    ev_timer_init(&s->clock, on_clock, CLOCK_S, CLOCK_S);
    s->clock.data = s;
    ev_timer_start(loop, &s->clock);
    ev_unref(loop); /* the clock does not keep the loop running; the set's timer does, while armed */
}

void agw_timeouts_set_priority(agw_timeouts_t *s, int priority)
{
    if (!ev_is_active(&s->ev) && !ev_is_pending(&s->ev))
        ev_set_priority(&s->ev, priority);
}

void agw_timeouts_free(agw_timeouts_t *s)
{
    if (s->loop == NULL)
        return;
    ev_timer_stop(s->loop, &s->ev);
    ev_ref(s->loop); /* (libev: taken back before the unreferenced watcher stops) */
    ev_timer_stop(s->loop, &s->clock);
    for (uint32_t i = 0; i < s->n; i++)
        s->heap[i]->slot = 0;
    free(s->heap);
    if (s->alive)
        *s->alive = 0;
    *s = (agw_timeouts_t){0};
}

void agw_timeout_start(agw_timeouts_t *s, agw_timeout_t *t, double after_s)
{
    if (t->slot)
        agw_timeout_stop(s, t);
    double now = agw_timeouts_now(s);
    t->at = now + (after_s > 0. ? after_s : 0.);
    t->seq = s->seq++;
    t->iteration = ev_iteration(s->loop);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : AGW_TIMEOUTS_MIN_CAP;
        s->heap = agw_realloc(s->heap, s->cap * sizeof(*s->heap));
    }
    sift_up(s, s->n++, t);
    /* the timer stays armed for an earlier due time than the first's (a stopped first): it runs,
     * finds nothing due and arms again. Only a new first, or an idle timer, arms it now. */
    if (t->slot == 1 && (!ev_is_active(&s->ev) || ev_timer_remaining(s->loop, &s->ev) > t->at - now))
        arm(s);
}

void agw_timeout_stop(agw_timeouts_t *s, agw_timeout_t *t)
{
    if (t->slot == 0)
        return;
    uint32_t i = t->slot - 1;
    t->slot = 0;
    agw_timeout_t *last = s->heap[--s->n];
    if (i < s->n) {
        if (i > 0 && earlier(last, s->heap[(i - 1) / 2]))
            sift_up(s, i, last);
        else
            sift_down(s, i, last);
    }
    if (s->n == 0 && ev_is_active(&s->ev))
        ev_timer_stop(s->loop, &s->ev); /* nothing left to wait for: the loop may end */
    if (s->cap > AGW_TIMEOUTS_MIN_CAP && s->n <= s->cap / 4) {
        s->cap /= 2;
        s->heap = agw_realloc(s->heap, s->cap * sizeof(*s->heap));
    }
}
