/* slots.c: generation-checked id table (see slots.h). */
#include "base/slots.h"

#include "base/mem.h"

#include <stdlib.h>

#define IDX_BITS 24

uint64_t agw_slots_put(agw_slots_t *s, void *ptr)
{
    if (s->free_head == 0) {
        uint32_t cap = s->cap ? s->cap * 2 : 64;
        if (cap > (1u << IDX_BITS))
            abort();
        agw_slot_t *v = agw_realloc(s->v, cap * sizeof(*v));
        for (uint32_t i = s->cap; i < cap; i++) {
            v[i].ptr = NULL;
            v[i].gen = s->gen_floor + 1;
            v[i].next_free = i + 1 < cap ? i + 2 : 0;
        }
        s->free_head = s->cap + 1;
        s->v = v;
        s->cap = cap;
    }
    uint32_t idx = s->free_head - 1;
    agw_slot_t *sl = &s->v[idx];
    s->free_head = sl->next_free;
    sl->ptr = ptr;
    s->used++;
    return ((uint64_t)sl->gen << IDX_BITS) | idx;
}

void *agw_slots_get(const agw_slots_t *s, uint64_t id)
{
    uint32_t idx = (uint32_t)(id & ((1u << IDX_BITS) - 1));
    if (idx >= s->cap)
        return NULL;
    const agw_slot_t *sl = &s->v[idx];
    if (sl->ptr == NULL || sl->gen != (uint32_t)(id >> IDX_BITS))
        return NULL;
    return sl->ptr;
}

void agw_slots_del(agw_slots_t *s, uint64_t id)
{
    if (agw_slots_get(s, id) == NULL)
        return;
    uint32_t idx = (uint32_t)(id & ((1u << IDX_BITS) - 1));
    agw_slot_t *sl = &s->v[idx];
    sl->ptr = NULL;
    /* generations stay below 2^29 so ids stay below 2^53 (exact in a Lua number) */
    sl->gen = (sl->gen + 1) & ((1u << 29) - 1);
    if (sl->gen == 0)
        sl->gen = 1;
    sl->next_free = s->free_head;
    s->free_head = idx + 1;
    s->used--;
}

void agw_slots_compact(agw_slots_t *s)
{
    if (s->used != 0 || s->v == NULL)
        return;
    uint32_t top = s->gen_floor;
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->v[i].gen > top)
            top = s->v[i].gen;
    /* generations stay below 2^29 (agw_slots_del); past it they start again from 1, as a slot's
     * own generation does */
    s->gen_floor = top + 1 < (1u << 29) - 1 ? top : 0;
    free(s->v);
    s->v = NULL;
    s->cap = s->free_head = 0;
}

void agw_slots_free(agw_slots_t *s)
{
    free(s->v);
    s->v = NULL;
    s->cap = s->free_head = s->used = 0;
}
