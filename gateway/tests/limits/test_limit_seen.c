/* test_limit_seen.c: Redis's last answers per key and the process's outage (limits/limit_seen.h). */
#include "limits/limit_seen.h"

#include <pthread.h>
#include <stdlib.h>

#include "../check.h"

/* an answer is kept per key; a key never answered, or pushed out of its slot, is not found */
static void answers_are_kept_per_key_and_bounded(void)
{
    agw_limit_seen_t *s = agw_limit_seen_new();
    agw_limit_seen_answer_t a = {1, 7, 2000, 1000}, got;
    CHECK(agw_limit_seen_get(s, 42, &got) == 0);
    agw_limit_seen_note(s, 42, &a);
    CHECK(agw_limit_seen_get(s, 42, &got) == 1);
    CHECK(got.allowed == 1 && got.remaining == 7 && got.reset_at_ms == 2000 && got.at_ms == 1000);
    agw_limit_seen_answer_t b = {0, 0, 3000, 1500};
    agw_limit_seen_note(s, 42, &b); /* the newest answer replaces the older */
    CHECK(agw_limit_seen_get(s, 42, &got) == 1 && got.allowed == 0 && got.at_ms == 1500);
    CHECK(agw_limit_seen_get(s, 43, &got) == 0);
    agw_limit_seen_note(s, 42 + AGW_LIMIT_SEEN_SLOTS, &a); /* the same slot: the older key is gone */
    CHECK(agw_limit_seen_get(s, 42, &got) == 0);
    CHECK(agw_limit_seen_get(s, 42 + AGW_LIMIT_SEEN_SLOTS, &got) == 1 && got.remaining == 7);
    agw_limit_seen_free(s);
}

/* two workers fail and recover: one start, one end, with the outage's fallbacks */
static void outage_starts_with_the_first_worker_and_ends_with_the_last(void)
{
    agw_limit_seen_t *s = agw_limit_seen_new();
    agw_limit_outage_t o;
    agw_limit_seen_outage(s, &o);
    CHECK(!o.down && o.outages == 0 && o.fallbacks_total == 0);
    CHECK(agw_limit_seen_answered(s, 0, &o) == 0); /* answered, no outage: nothing to end */
    CHECK(agw_limit_seen_failed(s, 0, 5000, 1) == 1);
    CHECK(agw_limit_seen_failed(s, 0, 5001, 1) == 0);
    CHECK(agw_limit_seen_failed(s, 1, 5002, 1) == 0);
    CHECK(agw_limit_seen_failed(s, 1, 5003, 0) == 0); /* a request that had stopped waiting */
    agw_limit_seen_outage(s, &o);
    CHECK(o.down && o.failing == 2 && o.since_ms == 5000 && o.fallbacks == 3 && o.outages == 1);
    CHECK(agw_limit_seen_answered(s, 0, &o) == 0); /* worker 1 still fails */
    CHECK(agw_limit_seen_failed(s, 0, 5004, 1) == 0); /* worker 0 again, within the same outage */
    CHECK(agw_limit_seen_answered(s, 1, &o) == 0);
    CHECK(agw_limit_seen_answered(s, 0, &o) == 1);
    CHECK(o.since_ms == 5000 && o.fallbacks == 4 && o.fallbacks_total == 4);
    agw_limit_seen_outage(s, &o);
    CHECK(!o.down && o.failing == 0 && o.fallbacks == 0 && o.fallbacks_total == 4);
    /* the next outage counts its own fallbacks */
    CHECK(agw_limit_seen_failed(s, 1, 9000, 1) == 1);
    CHECK(agw_limit_seen_answered(s, 1, &o) == 1 && o.fallbacks == 1 && o.since_ms == 9000 && o.outages == 2);
    agw_limit_seen_free(s);
}

/* workers noting and reading at once: a read is one writer's whole answer, never a mix */
typedef struct {
    agw_limit_seen_t *s;
    unsigned id;
    int bad;
} worker_t;

static void *noter(void *p)
{
    worker_t *w = p;
    agw_limit_seen_answer_t got;
    for (uint64_t i = 0; i < 200000; i++) {
        uint64_t v = i * 4 + w->id;
        agw_limit_seen_answer_t a = {(int)(v & 1), v, v + 1, v + 2};
        agw_limit_seen_note(w->s, 7, &a);
        if (agw_limit_seen_get(w->s, 7, &got) &&
            (got.reset_at_ms != got.remaining + 1 || got.at_ms != got.remaining + 2 ||
             got.allowed != (int)(got.remaining & 1)))
            w->bad++;
        if (i % 1000 == 0) { /* the outage: whole starts and ends only */
            agw_limit_outage_t o;
            agw_limit_seen_failed(w->s, w->id, i, 1);
            agw_limit_seen_answered(w->s, w->id, &o);
        }
    }
    return NULL;
}

static void concurrent_notes_are_never_torn(void)
{
    agw_limit_seen_t *s = agw_limit_seen_new();
    pthread_t t[4];
    worker_t w[4];
    for (unsigned i = 0; i < 4; i++) {
        w[i] = (worker_t){s, i, 0};
        pthread_create(&t[i], NULL, noter, &w[i]);
    }
    for (unsigned i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].bad == 0);
    }
    agw_limit_outage_t o;
    agw_limit_seen_outage(s, &o);
    CHECK(!o.down && o.fallbacks_total == 4 * 200 && o.outages >= 1 && o.outages <= 4 * 200);
    agw_limit_seen_free(s);
}

int main(void)
{
    RUN(answers_are_kept_per_key_and_bounded);
    RUN(outage_starts_with_the_first_worker_and_ends_with_the_last);
    RUN(concurrent_notes_are_never_torn);
    return CHECK_DONE();
}
