/* loop_gap.h: how long a test program's libev loop went without running, for the unit tests whose
 * scripted server runs in the same process (tests/upstream/upstream_srv.h, tests/redis). A stalled
 * process (a loaded machine, a sanitizer) runs no callback, so a timer is late by at most the gap:
 * a test bounding an elapsed time adds it, and holds on a loaded machine while a late timer still
 * fails it.
 *
 * One 10 ms repeating timer (loop_gap_start) notes each run; loop_gap_reset starts a measurement,
 * loop_gap_s reads the longest gap since, the time since the timer last ran included. The timer
 * also wakes the loop every 10 ms, so every bounded wait notices its deadline. */
#ifndef AGW_TESTS_LOOP_GAP_H
#define AGW_TESTS_LOOP_GAP_H

#include <ev.h>

static ev_timer loop_gap_timer;
static double loop_gap_last, loop_gap_max; /* the timer's last run; the longest gap since the reset */

static void loop_gap_on_timer(struct ev_loop *l, ev_timer *w, int revents)
{
    (void)l, (void)w, (void)revents;
    double now = ev_time();
    if (now - loop_gap_last > loop_gap_max)
        loop_gap_max = now - loop_gap_last;
    loop_gap_last = now;
}

static void loop_gap_reset(void)
{
    loop_gap_last = ev_time();
    loop_gap_max = 0;
}

/* The longest time, s, the loop went without running since loop_gap_reset. */
static double loop_gap_s(void)
{
    double since = ev_time() - loop_gap_last;
    return since > loop_gap_max ? since : loop_gap_max;
}

static void loop_gap_start(struct ev_loop *l)
{
    loop_gap_reset();
    ev_timer_init(&loop_gap_timer, loop_gap_on_timer, 0.01, 0.01);
    ev_timer_start(l, &loop_gap_timer);
}

static void loop_gap_stop(struct ev_loop *l)
{
    ev_timer_stop(l, &loop_gap_timer);
}

#endif
