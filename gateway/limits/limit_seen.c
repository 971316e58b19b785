/* limit_seen.c: the last answers of Redis per key and the process's outage (see limit_seen.h). */
#include "limits/limit_seen.h"

#include <stdlib.h>

typedef struct seen_slot {
    uint32_t seq;               /* odd while a writer fills the slot */
    uint32_t allowed;
    uint64_t hash;
    uint64_t remaining;
    uint64_t reset_at_ms;
    uint64_t at_ms;
} seen_slot_t;

struct agw_limit_seen {
    seen_slot_t slots[AGW_LIMIT_SEEN_SLOTS];
    uint8_t failing[AGW_LIMIT_SEEN_WORKERS]; /* each written by its worker only (atomic for readers) */
    uint32_t num_failing;
    uint64_t since_ms;
    uint64_t fallbacks_total;
    uint64_t fallbacks_at_start;               /* fallbacks_total when the outage began */
    uint64_t outages;
};

agw_limit_seen_t *agw_limit_seen_new(void)
{
    agw_limit_seen_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        abort();
    return s;
}

void agw_limit_seen_free(agw_limit_seen_t *s)
{
    free(s);
}

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

void agw_limit_seen_note(agw_limit_seen_t *s, uint64_t h, const agw_limit_seen_answer_t *a)
{
    seen_slot_t *sl = &s->slots[h & (AGW_LIMIT_SEEN_SLOTS - 1)];
    uint32_t seq = __atomic_load_n(&sl->seq, __ATOMIC_RELAXED);
    if ((seq & 1) || !__atomic_compare_exchange_n(&sl->seq, &seq, seq + 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return; /* another worker is writing it: its answer is as recent */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    STORE(&sl->hash, h);
    STORE(&sl->allowed, (uint32_t)(a->allowed != 0));
    STORE(&sl->remaining, a->remaining);
    STORE(&sl->reset_at_ms, a->reset_at_ms);
    STORE(&sl->at_ms, a->at_ms);
    __atomic_store_n(&sl->seq, seq + 2, __ATOMIC_RELEASE);
}

int agw_limit_seen_get(const agw_limit_seen_t *s, uint64_t h, agw_limit_seen_answer_t *out)
{
    const seen_slot_t *sl = &s->slots[h & (AGW_LIMIT_SEEN_SLOTS - 1)];
    for (int tries = 0; tries < 64; tries++) {
        uint32_t seq = __atomic_load_n(&sl->seq, __ATOMIC_ACQUIRE);
        if (seq & 1)
            continue;
        uint64_t hash = LOAD(&sl->hash);
        agw_limit_seen_answer_t a = {(int)LOAD(&sl->allowed), LOAD(&sl->remaining), LOAD(&sl->reset_at_ms),
                                     LOAD(&sl->at_ms)};
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&sl->seq, __ATOMIC_RELAXED) != seq)
            continue;
        if (seq == 0 || hash != h)
            return 0;
        *out = a;
        return 1;
    }
    return 0; /* written without pause meanwhile: as if not kept */
}

int agw_limit_seen_failed(agw_limit_seen_t *s, unsigned worker, uint64_t now_ms, int fallback)
{
    uint8_t *f = &s->failing[worker % AGW_LIMIT_SEEN_WORKERS];
    if (fallback)
        __atomic_add_fetch(&s->fallbacks_total, 1, __ATOMIC_RELAXED);
    if (LOAD(f))
        return 0;
    STORE(f, 1);
    if (__atomic_fetch_add(&s->num_failing, 1, __ATOMIC_ACQ_REL) != 0)
        return 0;
    /* the first failing worker: the outage begins (no other worker can end it before this returns:
     * this worker's flag holds it) */
    STORE(&s->since_ms, now_ms);
    STORE(&s->fallbacks_at_start, LOAD(&s->fallbacks_total) - (fallback ? 1 : 0));
    __atomic_add_fetch(&s->outages, 1, __ATOMIC_RELEASE);
    return 1;
}

int agw_limit_seen_answered(agw_limit_seen_t *s, unsigned worker, agw_limit_outage_t *ended)
{
    uint8_t *f = &s->failing[worker % AGW_LIMIT_SEEN_WORKERS];
    if (!LOAD(f))
        return 0;
    STORE(f, 0);
    if (__atomic_sub_fetch(&s->num_failing, 1, __ATOMIC_ACQ_REL) != 0)
        return 0;
    ended->down = 0;
    ended->failing = 0;
    ended->since_ms = LOAD(&s->since_ms);
    ended->fallbacks_total = LOAD(&s->fallbacks_total);
    ended->fallbacks = ended->fallbacks_total - LOAD(&s->fallbacks_at_start);
    ended->outages = __atomic_load_n(&s->outages, __ATOMIC_ACQUIRE);
    return 1;
}

void agw_limit_seen_outage(const agw_limit_seen_t *s, agw_limit_outage_t *out)
{
    out->failing = __atomic_load_n(&s->num_failing, __ATOMIC_ACQUIRE);
    out->down = out->failing > 0;
    out->since_ms = out->down ? LOAD(&s->since_ms) : 0;
    out->fallbacks_total = LOAD(&s->fallbacks_total);
    out->fallbacks = out->down ? out->fallbacks_total - LOAD(&s->fallbacks_at_start) : 0;
    out->outages = __atomic_load_n(&s->outages, __ATOMIC_ACQUIRE);
}
