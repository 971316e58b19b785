/* tables.h: what a worker has in flight, by id (part of agw_worker): requests, upstream calls
 * and runtime timers, and the aborts deferred while Lua runs. The ids are what the runtime holds
 * (rid, call id, timer id: lua/agg/contract.lua); a slot table (base/slots.h) maps each back to its
 * C record. request.c owns reqs, lua_entry.c the aborts, core.c calls and timers.
 */
#ifndef AGW_WORKER_TABLES_H
#define AGW_WORKER_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "base/slots.h"

struct agw_worker_gen;
struct wcall;

/* A request whose client left while Lua was running: its runtime.abort runs once no Lua runs. */
typedef struct agw_pending_abort {
    uint64_t rid;
    struct agw_worker_gen *g; /* holds a reference until the abort ran */
} agw_pending_abort_t;

/* Zeroed memory is empty tables. The worker is never freed (agw_worker_stop), so neither are they. */
typedef struct agw_worker_tables {
    agw_slots_t reqs;                     /* rid -> reqref_t */
    agw_slots_t calls;                    /* call id -> wcall_t */
    agw_slots_t timers;                   /* timer id -> wtimer_t */
    struct wcall *free_calls;             /* call records to reuse (core.c) */
    agw_pending_abort_t *pending_aborts;  /* requests whose client left while Lua was running */
    size_t num_pending_aborts, cap_pending_aborts;
} agw_worker_tables_t;

#endif
