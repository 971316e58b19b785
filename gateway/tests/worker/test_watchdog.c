/* Unit tests for the script time limit's check (watchdog.c, agw_watchdog_check): when the
 * watchdog asks a worker to stop its script (stop_entry and AGW_WATCHDOG_SIGNAL to the worker's
 * thread) and when it leaves the worker alone. The worker is its watchdog target alone (the
 * watchdog's whole view of a worker), its thread this test's own; no loop or VM runs. Also: the
 * entry bookkeeping of agw_watchdog_enter and agw_watchdog_leave. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "tests/check.h"
#include "worker/watchdog.h"

static volatile sig_atomic_t signals; /* AGW_WATCHDOG_SIGNALs this thread received */

static void on_signal(int sig)
{
    (void)sig;
    signals++;
}

/* A worker inside entry 7 since since_ms, with a limit of 100 ms, on this thread. */
static agw_watchdog_target_t *worker_in_lua(uint64_t since_ms)
{
    agw_watchdog_target_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        abort();
    w->thread = pthread_self();
    w->limit_ms = 100;
    w->entry = 7;
    w->since_ms = since_ms;
    signals = 0;
    return w;
}

static int asked(const agw_watchdog_target_t *w)
{
    return w->stop_entry == 7 && signals > 0;
}

static void entry_past_its_limit_and_a_clock_tick_is_stopped(void)
{
    agw_watchdog_target_t *w = worker_in_lua(10000);
    agw_watchdog_check(w, 10100); /* at the limit: a coarse clock may be a tick ahead */
    CHECK(!asked(w));
    agw_watchdog_check(w, 10100 + agw_coarse_tick_ms());
    CHECK(asked(w));
    free(w);
}

static void stop_is_asked_again_once_per_limit(void)
{
    agw_watchdog_target_t *w = worker_in_lua(10000);
    uint64_t t = 10100 + agw_coarse_tick_ms();
    agw_watchdog_check(w, t);
    CHECK(signals == 1);
    agw_watchdog_check(w, t + 50);
    CHECK(signals == 1);
    agw_watchdog_check(w, t + 100);
    CHECK(signals == 2);
    free(w);
}

/* The watchdog reads the clock once for all workers: an entry may begin after that reading. */
static void entry_that_began_after_now_is_left_alone(void)
{
    agw_watchdog_target_t *w = worker_in_lua(10004);
    agw_watchdog_check(w, 10000);
    CHECK(w->stop_entry == 0);
    CHECK(signals == 0);
    free(w);
}

/* Only the outermost call is an entry: nested calls neither start a new one nor end it. */
static void nested_calls_belong_to_their_entry(void)
{
    agw_watchdog_target_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        abort();
    lua_State *L = (lua_State *)w; /* never dereferenced */
    agw_watchdog_enter(w, L, 250);
    CHECK(w->depth == 1 && w->entry == 1 && w->since_ms != 0 && w->L == L);
    CHECK(agw_watchdog_limit_ms(w) == 250);
    uint64_t since = w->since_ms;
    agw_watchdog_enter(w, NULL, 999);
    CHECK(w->depth == 2 && w->entry == 1 && w->since_ms == since && w->L == L);
    CHECK(agw_watchdog_limit_ms(w) == 250);
    CHECK(agw_watchdog_leave(w) == 0);
    CHECK(w->depth == 1 && w->since_ms == since);
    agw_watchdog_leave(w);
    CHECK(w->depth == 0 && w->since_ms == 0);
    agw_watchdog_enter(w, L, 250);
    CHECK(w->entry == 2);
    agw_watchdog_leave(w);
    free(w);
}

static void worker_outside_lua_is_left_alone(void)
{
    agw_watchdog_target_t *w = worker_in_lua(0);
    agw_watchdog_check(w, 10000);
    CHECK(w->stop_entry == 0);
    CHECK(signals == 0);
    free(w);
}

int main(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(AGW_WATCHDOG_SIGNAL, &sa, NULL);
    RUN(entry_past_its_limit_and_a_clock_tick_is_stopped);
    RUN(stop_is_asked_again_once_per_limit);
    RUN(entry_that_began_after_now_is_left_alone);
    RUN(worker_outside_lua_is_left_alone);
    RUN(nested_calls_belong_to_their_entry);
    return CHECK_DONE();
}
