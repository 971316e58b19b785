/* Unit tests: worker/client_slots.h, the gateway's one count of client connections. */
#include "worker/client_slots.h"

#include <pthread.h>

#include "tests/check.h"

static void test_take_stops_at_the_cap_and_give_makes_room(void)
{
    agw_client_slots_t *s = agw_client_slots_new(2);
    CHECK(agw_client_slots_take(s, 2) == 1);
    CHECK(agw_client_slots_take(s, 2) == 1);
    CHECK(agw_client_slots_take(s, 2) == 0);
    CHECK(agw_client_slots_open(s) == 2);
    CHECK(agw_client_slots_take(s, 3) == 1); /* a reload raised the cap */
    agw_client_slots_give(s);
    agw_client_slots_give(s);
    CHECK(agw_client_slots_open(s) == 1);
    CHECK(agw_client_slots_take(s, 2) == 1);
    CHECK(agw_client_slots_take(s, 1) == 0); /* a reload lowered it below what is open */
    agw_client_slots_free(s);
}

static int woken;
static void on_wake(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)a, (void)revents;
    woken++;
    ev_break(loop, EVBREAK_ONE);
}

static void test_a_waiting_worker_is_woken_by_a_give(void)
{
    agw_client_slots_t *s = agw_client_slots_new(2);
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    ev_async wake;
    ev_async_init(&wake, on_wake);
    ev_async_start(loop, &wake);
    agw_client_slots_register(s, 1, loop, &wake);
    CHECK(agw_client_slots_take(s, 1) == 1);
    CHECK(agw_client_slots_wait(s, 1, 1) == 0); /* at the cap: wait */
    CHECK(agw_client_slots_wait(s, 1, 1) == 0); /* asking again changes nothing */
    agw_client_slots_give(s);
    CHECK(ev_async_pending(&wake));
    woken = 0;
    ev_run(loop, 0);
    CHECK(woken == 1);
    CHECK(agw_client_slots_wait(s, 1, 1) == 1); /* room now: no longer waiting */
    CHECK(agw_client_slots_take(s, 1) == 1);
    agw_client_slots_give(s);
    CHECK(!ev_async_pending(&wake)); /* a give wakes only the workers that wait */
    /* a slot that came free before the wait: the wait says so at once */
    CHECK(agw_client_slots_wait(s, 1, 1) == 1);
    agw_client_slots_unwait(s, 1);
    ev_async_stop(loop, &wake);
    ev_loop_destroy(loop);
    agw_client_slots_free(s);
}

/* Three threads take and give against a cap of 3, 200,000 times each: the count never passes the
 * cap and ends at 0. */
#define ROUNDS 200000
typedef struct racer {
    agw_client_slots_t *s;
    int taken, over;
} racer_t;
static void *race(void *arg)
{
    racer_t *r = arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (agw_client_slots_take(r->s, 3)) {
            r->taken++;
            if (agw_client_slots_open(r->s) > 3)
                r->over++;
            agw_client_slots_give(r->s);
        }
    }
    return NULL;
}

static void test_threads_never_pass_the_cap(void)
{
    agw_client_slots_t *s = agw_client_slots_new(2);
    racer_t r[3] = {{s, 0, 0}, {s, 0, 0}, {s, 0, 0}};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, race, &r[i]);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].over == 0);
        CHECK(r[i].taken > 0);
    }
    CHECK(agw_client_slots_open(s) == 0);
    agw_client_slots_free(s);
}

int main(void)
{
    RUN(test_take_stops_at_the_cap_and_give_makes_room);
    RUN(test_a_waiting_worker_is_woken_by_a_give);
    RUN(test_threads_never_pass_the_cap);
    return CHECK_DONE();
}
