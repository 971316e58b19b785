/* wlimits.h: what a worker keeps for limits (part of agw_worker, owned by limits.c): the decision
 * of the request being answered or started right now, for the access log and the waterfall (a Redis
 * outage is the process's: limits/limit_seen.h). Zeroed memory is no decision.
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
} agw_worker_limits_t;

#endif
