/* wlimits.h: what a worker keeps for limits (part of agw_worker, owned by limits.c): the decision
 * of the request being answered or started right now, for the access log and the waterfall (a Redis
 * outage is the process's: limits/limit_seen.h), and the Redis commands its charges have in
 * flight. Zeroed memory is no decision and no command.
 */
#ifndef AGW_WORKER_WLIMITS_H
#define AGW_WORKER_WLIMITS_H

#include <stdint.h>

#include "ops/trace.h"

typedef struct agw_worker_limits {
    agw_trace_limit_t note;  /* the decision of the request being answered or started right now:
                                limits.c writes it; the access log of a C answer
                                (agw_worker_record_c_response) or start_script takes it */
    int has_note;
    unsigned charges;        /* commands counting the edge's refusals in Redis that have not been
                                answered (limits.c agw_worker_gate_charge; at most
                                AGW_LIMIT_CHARGES_MAX) */
} agw_worker_limits_t;

/* Commands counting refusals in Redis a worker has in flight at most: a flood of forged
 * credentials sends no more (the process's shadow count still counts them). */
#define AGW_LIMIT_CHARGES_MAX 256

#endif
