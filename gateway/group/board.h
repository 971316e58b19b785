/* board.h: the endpoints of every upstream as the workers' balancers see them (lua/agg/group.lua:
 * load balancing, outlier ejection, sessions), for the admin page /upstreams and the per-endpoint
 * metrics (docs/operations.md "Upstream groups").
 *
 * Each worker's VM keeps its own endpoint state (ejection is per worker, as the breaker's is per
 * instance in DESIGN §9) and publishes it here about once a second (runtime.report_stats ->
 * core.endpoint_state). The board belongs to one generation (generation.h) and has one row per
 * worker per endpoint, indexed like config.h's eps; counters restart at 0 with each generation.
 * Workers write their own rows and the admin thread reads every row, field by field with atomics:
 * a reader may see one endpoint's fields from two publications, never a torn value.
 */
#ifndef AGW_GROUP_BOARD_H
#define AGW_GROUP_BOARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "script/config.h"

/* One endpoint in one worker (all totals since this generation's VM started). */
typedef struct agw_endpoint_row {
    uint64_t calls;            /* attempts sent to it */
    uint64_t failures;         /* attempts the breaker counts as failures (refused, reset, 5xx, …) */
    uint64_t ejections;        /* times it was ejected */
    uint64_t sessions;         /* sessions pinned to it (new or moved here) */
    uint64_t in_flight;        /* attempts in flight now */
    uint64_t ejected_until_ms; /* wall clock ms since the Unix epoch until which it is ejected; 0: not */
    uint64_t last_ejected_ms;  /* wall clock ms of its last ejection; 0: never */
    uint64_t answered;         /* attempts that ended with an answer or a failure (not cancelled) */
    uint64_t latency_ms;       /* their durations added up, ms (mean latency: latency_ms / answered) */
} agw_endpoint_row_t;

typedef struct agw_endpoint_board {
    size_t num_workers;
    size_t num_endpoints;      /* conf->ep_first[conf->num_upstreams] */
    agw_endpoint_row_t *rows;  /* [worker * num_endpoints + endpoint] */
} agw_endpoint_board_t;

/* A board of zeros for workers x endpoints. Aborts when out of memory (the allocation rule of
 * buf.h). Free with agw_endpoint_board_free (NULL is ignored). */
agw_endpoint_board_t *agw_endpoint_board_new(size_t workers, size_t endpoints);
void agw_endpoint_board_free(agw_endpoint_board_t *b);

/* Worker `worker` publishes its row of endpoint ep (0-based, as conf->eps). Out-of-range indexes
 * are ignored. Worker thread. */
void agw_endpoint_board_publish(agw_endpoint_board_t *b, size_t worker, size_t ep, const agw_endpoint_row_t *row);

/* The admin page /upstreams: {"upstreams":[{"name":…,"group":bool,"endpoints":[{"endpoint":1,
 * "url":…,"state":"healthy"|"ejected","ejected_workers":N,"ejected_until":s|null,"last_ejection":s|null,
 * "in_flight":N,"calls":N,"failures":N,"ejections":N,"sessions":N,"mean_ms":ms|null},…]},…]} (times in seconds since the
 * Unix epoch; an endpoint is "ejected" while any worker has it ejected). now_ms: wall clock ms. An
 * upstream with one endpoint has group false and zero counts (no balancer runs for it). */
void agw_endpoint_board_json(const agw_endpoint_board_t *b, const agw_config_t *conf, uint64_t now_ms, agw_buf_t *out);

/* The Prometheus families aggway_endpoint_calls_total, _failures_total, _ejections_total,
 * _sessions_total, _answered_total, _latency_seconds_total (counters), aggway_endpoint_in_flight and
 * aggway_endpoint_ejected (gauges: calls in flight; workers that have it ejected), labels upstream
 * and endpoint (its URL), for the upstreams with more than one endpoint. */
void agw_endpoint_board_metrics(const agw_endpoint_board_t *b, const agw_config_t *conf, uint64_t now_ms,
                                agw_buf_t *out);

#endif
