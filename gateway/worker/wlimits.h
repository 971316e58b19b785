/* wlimits.h: what a worker keeps for limits (part of agw_worker, owned by limits.c): the state of
 * a Redis outage as its limits checks see it (logged when it starts and when it ends, never per
 * request), and the decision of the request being answered or started right now, for the access
 * log and the waterfall. Zeroed memory is no outage and no decision.
 */
#ifndef AGW_WORKER_WLIMITS_H
#define AGW_WORKER_WLIMITS_H

#include <stdint.h>

#include "ops/trace.h"

typedef struct agw_worker_limits {
    int redis_down;          /* Redis failed the last limits check */
    double redis_since;      /* ev_now() when the outage began */
    uint64_t fallbacks;      /* checks decided by on_redis_error during it */
    agw_trace_limit_t note;  /* the decision of the request being answered or started right now:
                                limits.c writes it; the access log of a C answer
                                (agw_worker_record_c_response) or start_script takes it */
    int has_note;
} agw_worker_limits_t;

#endif
