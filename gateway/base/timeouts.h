/* timeouts.h: one-shot timeouts that share one libev timer, in an array that shrinks.
 *
 * A set keeps its timeouts in a binary min-heap ordered by when each is due, and one ev_timer
 * armed for the first. The caller embeds each agw_timeout_t in its own struct, as it would a
 * libev watcher; the set allocates nothing per timeout. Why not an ev_timer each: libev's timer
 * heap grows to the most timers ever active at once and never shrinks, so a burst's tens of
 * thousands of calls and connects kept about 770 KB a worker after it (docs/performance.md, "A
 * twenty-seventh pass"). This array halves whenever it is a quarter full, down to
 * AGW_TIMEOUTS_MIN_CAP entries.
 *
 * Time is the loop's monotonic clock (libev's, which timers use): a step of the system clock
 * moves no timeout. As with ev_now(), it stands still during a turn of the loop and moves when
 * the loop polls again or ev_now_update() is called; a timeout started with a delay d is due d
 * seconds after that time.
 *
 * Due timeouts run from the set's ev_timer callback, the earliest due first (ties in the order
 * they were started). Each is off the set before its callback runs, and the callback may start or
 * stop any timeout of the set, start its own again, free the struct that embeds it, or free the
 * set (agw_timeouts_free: the run stops there). As with an ev_timer, a timeout started after the
 * loop's poll (from any watcher's callback, this set's run included), even with a zero delay,
 * runs in a later turn of the loop, never in the same one: a zero delay means "after the loop
 * looked at its descriptors again". A set's due timeouts run together, where its ev_timer runs
 * among the loop's other due timers (the first of them decides), so against another set's or an
 * ev_timer's they are ordered by set, not by their own due times.
 *
 * Not thread-safe: a set and its timeouts belong to its loop's thread. Not re-entrant through a
 * nested ev_run of the same loop from a callback (the run's end on a free is the innermost's). A
 * set is freed before its loop is destroyed. */
#ifndef AGW_TIMEOUTS_H
#define AGW_TIMEOUTS_H

#include <ev.h>
#include <stdint.h>

#define AGW_TIMEOUTS_MIN_CAP 64 /* entries the heap array keeps however empty the set is */

typedef struct agw_timeout agw_timeout_t;

/* Called when t is due, after it is off its set; t may be started again or freed. */
typedef void (*agw_timeout_cb)(agw_timeout_t *t);

struct agw_timeout {
    agw_timeout_cb cb;   /* rw: run when due (agw_timeout_init) */
    double at;           /* private: when it is due, on the set's clock (agw_timeouts_now), s */
    uint32_t slot;       /* private: its index in the heap + 1; 0 while it is not started */
    uint32_t seq;        /* private: the set's start count when it was started (ties) */
    unsigned iteration;  /* private: ev_iteration() when it was started (the turn rule) */
};

typedef struct agw_timeouts {
    struct ev_loop *loop; /* ro */
    ev_timer ev;          /* private: armed for heap[0] while the set is not empty */
    ev_timer clock;       /* private: never due in practice (1e9 s, timeouts.c); its remaining time
                             is the clock */
    double epoch;         /* private: the clock's origin, moved on when the clock timer repeats */
    agw_timeout_t **heap; /* private: the min-heap, by (at, seq) */
    uint32_t n, cap;      /* ro: timeouts started; the array's entries */
    uint32_t seq;         /* private: starts so far (wraps; ties compared by difference) */
    int *alive;           /* private: during a run, the runner's flag, cleared by agw_timeouts_free */
} agw_timeouts_t;

/* Makes s an empty set on loop; allocates nothing yet (the array at the first start). The clock
 * timer is started at once and holds s's place in libev's timer heap for the set's life. */
void agw_timeouts_init(agw_timeouts_t *s, struct ev_loop *loop);

/* Gives s's timer a libev priority (EV_MINPRI … EV_MAXPRI; 0 at init): its due timeouts then run
 * after the turn's events of higher priority (a Redis reply before its command's timeout). Only
 * while no timeout is started (libev sets a priority only on a stopped watcher); else nothing. */
void agw_timeouts_set_priority(agw_timeouts_t *s, int priority);

/* Stops s's two libev timers and frees its array. Timeouts still started are forgotten (their
 * callbacks never run; the caller owns their structs). May be called from a timeout's callback:
 * the run ends when that callback returns. */
void agw_timeouts_free(agw_timeouts_t *s);

/* Sets t's callback; t is not started. */
static inline void agw_timeout_init(agw_timeout_t *t, agw_timeout_cb cb)
{
    t->cb = cb;
    t->slot = 0;
}

/* Starts t, due after_s seconds (>= 0; a negative delay is 0) from the set's clock
 * (agw_timeouts_now); when it is started already, it is started again with the new delay. Grows
 * the array when full (aborts when out of memory, as agw_realloc does). */
void agw_timeout_start(agw_timeouts_t *s, agw_timeout_t *t, double after_s);

/* Stops t, when started (else nothing). Its callback will not run. Shrinks the array when a
 * quarter of it is in use. */
void agw_timeout_stop(agw_timeouts_t *s, agw_timeout_t *t);

/* 1 while t is started (not yet due, or due and not yet run), else 0. */
static inline int agw_timeout_active(const agw_timeout_t *t)
{
    return t->slot != 0;
}

/* The set's clock, s: libev's monotonic time of this turn of the loop, from an origin of its own. */
double agw_timeouts_now(const agw_timeouts_t *s);

#endif
