/* test_slots: the id table (base/slots.h): ids reach their object until freed, never a newer one
 * that reused the slot, and an idle table gives the array a burst grew back without breaking
 * that rule. */
#include "base/slots.h"
#include "tests/check.h"

#include <stdint.h>
#include <stdlib.h>

static int objs[5000];

static void ids_reach_their_object_until_freed(void)
{
    agw_slots_t s = {0};
    uint64_t a = agw_slots_put(&s, &objs[0]), b = agw_slots_put(&s, &objs[1]);
    CHECK(a != 0 && b != 0 && a != b);
    CHECK(agw_slots_get(&s, a) == &objs[0]);
    CHECK(agw_slots_get(&s, b) == &objs[1]);
    agw_slots_del(&s, a);
    CHECK(agw_slots_get(&s, a) == NULL);
    uint64_t c = agw_slots_put(&s, &objs[2]); /* reuses a's slot with a new generation */
    CHECK(c != a);
    CHECK(agw_slots_get(&s, a) == NULL);
    CHECK(agw_slots_get(&s, c) == &objs[2]);
    agw_slots_del(&s, a); /* stale: ignored */
    CHECK(agw_slots_get(&s, c) == &objs[2] && s.used == 2);
    agw_slots_free(&s);
}

/* A burst of 5,000 ids grows the array to 8,192 slots; once all are freed, compacting frees it,
 * and no id of the burst reaches an object stored afterwards (in any slot it could land in). */
static void compact_frees_the_array_and_keeps_ids_unique(void)
{
    enum { N = 5000 };
    static uint64_t ids[N];
    agw_slots_t s = {0};
    for (int i = 0; i < N; i++)
        ids[i] = agw_slots_put(&s, &objs[i]);
    CHECK(s.cap >= N);
    agw_slots_compact(&s); /* in use: nothing happens */
    CHECK(s.v != NULL && s.cap >= N);
    CHECK(agw_slots_get(&s, ids[N - 1]) == &objs[N - 1]);
    for (int i = 0; i < N; i++)
        agw_slots_del(&s, ids[i]);
    agw_slots_compact(&s);
    CHECK(s.v == NULL && s.cap == 0 && s.used == 0);
    for (int i = 0; i < N; i++)
        CHECK(agw_slots_get(&s, ids[i]) == NULL);
    for (int i = 0; i < N; i++) { /* the same slots again, in the same order */
        uint64_t id = agw_slots_put(&s, &objs[i]);
        CHECK(id != ids[i]);
        CHECK(agw_slots_get(&s, id) == &objs[i]);
    }
    int stale = 0;
    for (int i = 0; i < N; i++)
        stale += agw_slots_get(&s, ids[i]) != NULL;
    CHECK(stale == 0);
    agw_slots_free(&s);
}

/* A slot freed many times before the compaction: the floor is above its generation too. */
static void compact_floor_is_above_every_generation(void)
{
    agw_slots_t s = {0};
    uint64_t old[100];
    for (int i = 0; i < 100; i++) { /* one slot, 100 generations */
        old[i] = agw_slots_put(&s, &objs[0]);
        agw_slots_del(&s, old[i]);
    }
    agw_slots_compact(&s);
    for (int i = 0; i < 100; i++) {
        uint64_t id = agw_slots_put(&s, &objs[1]);
        for (int j = 0; j < 100; j++)
            CHECK(id != old[j]);
        agw_slots_del(&s, id);
    }
    agw_slots_free(&s);
}

/* Generations stay below 2^29 (ids exact in a Lua number): a floor that would reach it starts
 * again from 1, as one slot's own generation does; ids made afterwards are valid and distinct. */
static void compact_floor_wraps_below_2_29(void)
{
    agw_slots_t s = {0};
    uint64_t id = agw_slots_put(&s, &objs[0]);
    agw_slots_del(&s, id);
    s.v[0].gen = (1u << 29) - 1; /* as after 2^29 - 2 reuses */
    agw_slots_compact(&s);
    CHECK(s.gen_floor == 0);
    uint64_t a = agw_slots_put(&s, &objs[1]), b = agw_slots_put(&s, &objs[2]);
    CHECK(a != b && a < ((uint64_t)1 << 53) && b < ((uint64_t)1 << 53));
    CHECK(agw_slots_get(&s, a) == &objs[1] && agw_slots_get(&s, b) == &objs[2]);
    agw_slots_free(&s);
    /* just below: the floor is kept, the next generation is the last one below 2^29 */
    id = agw_slots_put(&s, &objs[0]);
    agw_slots_del(&s, id);
    s.v[0].gen = (1u << 29) - 3;
    agw_slots_compact(&s);
    CHECK(s.gen_floor == (1u << 29) - 3);
    a = agw_slots_put(&s, &objs[1]);
    CHECK(a >> 24 == (1u << 29) - 2);
    CHECK(agw_slots_get(&s, a) == &objs[1]);
    agw_slots_free(&s);
}

int main(void)
{
    RUN(ids_reach_their_object_until_freed);
    RUN(compact_frees_the_array_and_keeps_ids_unique);
    RUN(compact_floor_is_above_every_generation);
    RUN(compact_floor_wraps_below_2_29);
    return CHECK_DONE();
}
