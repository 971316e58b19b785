/* test_timeouts: one-shot timeouts sharing one libev timer (base/timeouts.h): they run once, in
 * order of due time then of start, never before they are due; a stopped one never runs; one
 * started from a callback waits for a later turn of the loop; a callback may free the set; the
 * loop ends when the set is empty; and the array a burst grew is given back as the set empties. */
#include "base/timeouts.h"
#include "tests/check.h"

#include <ev.h>
#include <h2o/memory.h>
#include <stdlib.h>

typedef struct probe {
    agw_timeout_t t;
    agw_timeouts_t *set;
    int id;
    int runs;
    double ran_at;        /* the set's clock when it ran */
    double due;           /* the set's clock when started, plus its delay */
    unsigned iteration;   /* ev_iteration when it ran */
    int restart;          /* restart itself with a zero delay this many times */
    int free_set;         /* free the set from the callback */
} probe_t;

static struct ev_loop *loop; /* every case's (each leaves nothing on it) */
static int order[64], norder;

static void on_probe(agw_timeout_t *t)
{
    probe_t *p = H2O_STRUCT_FROM_MEMBER(probe_t, t, t);
    p->runs++;
    p->ran_at = agw_timeouts_now(p->set);
    p->iteration = ev_iteration(p->set->loop);
    if (norder < 64)
        order[norder++] = p->id;
    if (p->restart > 0) {
        p->restart--;
        agw_timeout_start(p->set, &p->t, 0.);
    }
    if (p->free_set)
        agw_timeouts_free(p->set);
}

static void start(agw_timeouts_t *s, probe_t *p, int id, double after)
{
    p->set = s;
    p->id = id;
    agw_timeout_init(&p->t, on_probe);
    p->due = agw_timeouts_now(s) + after;
    agw_timeout_start(s, &p->t, after);
}

/* Five timeouts started out of order run in order of due time, two with one delay in the order
 * started, each once and not before it is due; the one stopped never runs; ev_run returns once
 * the set is empty. */
static void due_ones_run_once_in_order_and_stopped_ones_never(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    probe_t p[6];
    memset(p, 0, sizeof(p));
    norder = 0;
    start(&s, &p[0], 0, 0.030);
    start(&s, &p[1], 1, 0.010);
    start(&s, &p[2], 2, 0.020);
    start(&s, &p[3], 3, 0.010); /* the same delay as 1, started after it */
    start(&s, &p[4], 4, 0.015);
    start(&s, &p[5], 5, 0.005);
    CHECK(s.n == 6 && agw_timeout_active(&p[4].t));
    agw_timeout_stop(&s, &p[4].t);
    agw_timeout_stop(&s, &p[4].t); /* (stopping a stopped one does nothing) */
    CHECK(s.n == 5 && !agw_timeout_active(&p[4].t));
    ev_run(loop, 0); /* returns: nothing else keeps the loop */
    CHECK(norder == 5);
    int want[] = {5, 1, 3, 2, 0};
    for (int i = 0; i < 5 && i < norder; i++)
        CHECK(order[i] == want[i]);
    for (int i = 0; i < 6; i++) {
        CHECK(p[i].runs == (i == 4 ? 0 : 1));
        if (i != 4)
            CHECK(p[i].ran_at >= p[i].due - 1e-6);
        CHECK(!agw_timeout_active(&p[i].t));
    }
    CHECK(s.n == 0);
    agw_timeouts_free(&s);
}

/* Stopping the first timeout leaves the set's timer armed for it: the timer runs early, finds
 * nothing due and waits again; the next runs at its own time. Starting an earlier one arms the
 * timer for it. */
static void a_stopped_first_and_a_new_first_keep_the_times(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    probe_t a = {0}, b = {0}, c = {0};
    norder = 0;
    start(&s, &a, 0, 0.010);
    start(&s, &b, 1, 0.060);
    agw_timeout_stop(&s, &a.t);
    start(&s, &c, 2, 0.030); /* later than the stopped first, earlier than b */
    ev_run(loop, 0);
    CHECK(a.runs == 0 && b.runs == 1 && c.runs == 1);
    CHECK(norder == 2 && order[0] == 2 && order[1] == 1);
    CHECK(c.ran_at >= c.due - 1e-6 && b.ran_at >= b.due - 1e-6);
    /* restarting a started timeout moves it: one due in 10 s restarted at 5 ms */
    probe_t d = {0};
    start(&s, &d, 3, 10.0);
    d.due = agw_timeouts_now(&s) + 0.005;
    agw_timeout_start(&s, &d.t, 0.005);
    CHECK(s.n == 1);
    ev_run(loop, 0);
    CHECK(d.runs == 1 && d.ran_at >= d.due - 1e-6 && d.ran_at < d.due + 5.0);
    agw_timeouts_free(&s);
}

/* A callback that starts its own timeout again with a zero delay runs again in a later turn of
 * the loop, not in the same run (a zero delay is the "after the loop looked again" of a call
 * failure's delivery). */
static void a_zero_delay_from_a_callback_waits_for_the_next_turn(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    probe_t p = {0}, q = {0};
    norder = 0;
    start(&s, &p, 0, 0.);
    p.restart = 3;
    start(&s, &q, 1, 0.);
    ev_run(loop, EVRUN_ONCE);
    CHECK(p.runs == 1 && q.runs == 1); /* both due in the first turn */
    unsigned first = p.iteration;
    ev_run(loop, 0);
    CHECK(p.runs == 4 && q.runs == 1);
    CHECK(p.iteration >= first + 3); /* one turn each */
    agw_timeouts_free(&s);
}

/* As with an ev_timer, a zero delay started by another watcher after the poll of a turn in which
 * the set's timer is due (here a check watcher, which libev runs before the turn's timers) waits
 * for the next turn. */
static probe_t *check_starts;

static void on_check(struct ev_loop *l, ev_check *w, int revents)
{
    (void)revents;
    if (check_starts) {
        start(check_starts->set, check_starts, 1, 0.);
        check_starts = NULL;
    }
    ev_check_stop(l, w);
}

static void a_zero_delay_from_another_watcher_waits_for_the_next_turn(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    probe_t x = {0}, y = {0};
    y.set = &s;
    ev_check chk;
    ev_check_init(&chk, on_check);
    ev_check_start(loop, &chk);
    check_starts = &y;
    start(&s, &x, 0, 0.); /* due in the first turn */
    ev_run(loop, EVRUN_ONCE);
    CHECK(x.runs == 1 && check_starts == NULL);
    CHECK(y.runs == 0 && agw_timeout_active(&y.t)); /* started in that turn, after its poll */
    ev_run(loop, 0);
    CHECK(y.runs == 1 && y.iteration > x.iteration);
    agw_timeouts_free(&s);
}

/* The start count wraps (2^32 starts on a long-lived pool): ties still run in start order across
 * the wrap, and a timeout started 2^31 starts ago is not taken for one started this turn. */
static void the_start_count_wraps(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    probe_t old = {0}, p[4];
    memset(p, 0, sizeof(p));
    norder = 0;
    s.seq = 0x7ffffff0u;
    start(&s, &old, 9, 0.010);
    s.seq = UINT32_MAX - 1; /* as if 2^31 starts had come and gone meanwhile */
    for (int i = 0; i < 4; i++)
        start(&s, &p[i], i, 0.002); /* one due time: ties, two started before the wrap, two after */
    CHECK(p[0].t.at == p[3].t.at);
    ev_run(loop, 0);
    CHECK(old.runs == 1);
    CHECK(norder == 5);
    for (int i = 0; i < 4 && i < norder; i++)
        CHECK(order[i] == i);
    agw_timeouts_free(&s);
}

/* A callback that frees the set ends the run there: the others due in the same run do not run
 * (and nothing of the freed set is touched: the sanitized build would say so), and the loop ends. */
static void a_callback_may_free_the_set(void)
{
    agw_timeouts_t *s = malloc(sizeof(*s));
    agw_timeouts_init(s, loop);
    probe_t p[3];
    memset(p, 0, sizeof(p));
    norder = 0;
    for (int i = 0; i < 3; i++)
        start(s, &p[i], i, 0.);
    p[1].free_set = 1;
    ev_run(loop, 0);
    CHECK(p[0].runs == 1 && p[1].runs == 1 && p[2].runs == 0);
    CHECK(!agw_timeout_active(&p[2].t)); /* forgotten by the free */
    free(s);
}

/* 50,000 timeouts grow the array; stopping all but a few gives it back, down to the minimum, and
 * the ones left still run in order. */
static void a_burst_grows_the_array_and_gives_it_back(void)
{
    enum { N = 50000 };
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    static probe_t p[N];
    for (int i = 0; i < N; i++) {
        p[i] = (probe_t){0};
        start(&s, &p[i], i % 64, 0.001 * (double)((i * 7919) % 997) / 997.0 + 0.002);
    }
    CHECK(s.n == N && s.cap >= N);
    /* stop every one but the last three, from the middle out (every heap position taken out) */
    for (int i = N / 2; i < N - 3; i++)
        agw_timeout_stop(&s, &p[i].t);
    for (int i = N / 2 - 1; i >= 0; i--)
        agw_timeout_stop(&s, &p[i].t);
    CHECK(s.n == 3);
    CHECK(s.cap == AGW_TIMEOUTS_MIN_CAP);
    ev_run(loop, 0);
    for (int i = N - 3; i < N; i++)
        CHECK(p[i].runs == 1 && p[i].ran_at >= p[i].due - 1e-6);
    for (int i = 0; i < N - 3; i++)
        if (p[i].runs)
            CHECK(0);
    agw_timeouts_free(&s);
}

/* The set's clock follows libev's monotonic time: it stands still within a turn and moves with
 * ev_now_update; the set's clock timer does not keep the loop running, the set's own timer does
 * only while a timeout is started. */
static void the_clock_moves_with_the_loop_and_does_not_hold_it(void)
{
    agw_timeouts_t s;
    agw_timeouts_init(&s, loop);
    double t0 = agw_timeouts_now(&s);
    CHECK(agw_timeouts_now(&s) == t0);
    ev_sleep(0.005);
    CHECK(agw_timeouts_now(&s) == t0); /* the loop's time did not move */
    ev_now_update(loop);
    double t1 = agw_timeouts_now(&s);
    CHECK(t1 >= t0 + 0.004 && t1 < t0 + 5.0);
    unsigned before = ev_iteration(loop);
    ev_run(loop, 0); /* nothing started: returns at once */
    CHECK(ev_iteration(loop) - before <= 1);
    probe_t p = {0};
    start(&s, &p, 0, 5.0);
    agw_timeout_stop(&s, &p.t); /* the set is empty again: the loop ends without waiting 5 s */
    ev_run(loop, 0);
    CHECK(p.runs == 0);
    CHECK(agw_timeouts_now(&s) < t1 + 4.0);
    agw_timeouts_free(&s);
    agw_timeouts_free(&s); /* (a second free does nothing) */
}

int main(void)
{
    loop = ev_loop_new(EVFLAG_AUTO);
    RUN(due_ones_run_once_in_order_and_stopped_ones_never);
    RUN(a_stopped_first_and_a_new_first_keep_the_times);
    RUN(a_zero_delay_from_a_callback_waits_for_the_next_turn);
    RUN(a_zero_delay_from_another_watcher_waits_for_the_next_turn);
    RUN(the_start_count_wraps);
    RUN(a_callback_may_free_the_set);
    RUN(a_burst_grows_the_array_and_gives_it_back);
    RUN(the_clock_moves_with_the_loop_and_does_not_hold_it);
    ev_loop_destroy(loop);
    return CHECK_DONE();
}
