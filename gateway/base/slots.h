/* slots.h: a table of pointers addressed by 64-bit ids that stay unique over time (index plus a
 * generation), so an id handed to Lua can never reach a newer object that reused its slot. */
#ifndef AGW_SLOTS_H
#define AGW_SLOTS_H

#include <stdint.h>

typedef struct agw_slot {
    void *ptr;           /* the object, NULL when free */
    uint32_t gen;        /* bumped every time the slot is freed */
    uint32_t next_free;  /* index of the next free slot + 1, 0 = end */
} agw_slot_t;

typedef struct agw_slots {
    agw_slot_t *v;
    uint32_t cap;
    uint32_t free_head;  /* index + 1 of the first free slot, 0 = none */
    uint32_t used;
    uint32_t gen_floor;  /* slots made after agw_slots_compact start above this generation */
} agw_slots_t;

/* Stores ptr (not NULL) and returns its id (never 0). Aborts on allocation failure. */
uint64_t agw_slots_put(agw_slots_t *s, void *ptr);
/* Returns the object of id, or NULL when id is unknown or already freed. */
void *agw_slots_get(const agw_slots_t *s, uint64_t id);
/* Frees id's slot; unknown ids are ignored. */
void agw_slots_del(agw_slots_t *s, uint64_t id);
/* When no slot is in use, frees the slot array a burst grew (the table only grows otherwise), and
 * remembers the highest generation it had handed out: slots made afterwards start above it, so an
 * id given out before still never reaches a newer object. Otherwise does nothing. */
void agw_slots_compact(agw_slots_t *s);
/* Frees the table itself. */
void agw_slots_free(agw_slots_t *s);

#endif
