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
#include "group/directory.h"
#include "ops/metrics.h"
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
    uint64_t health;           /* its active health checks' verdict (agg.health): AGW_HEALTH_* */
    uint64_t down;             /* 1 while its health checks keep it out of service */
    uint64_t probes;           /* health probes that ended */
    uint64_t probe_failures;   /* of those, the ones that failed */
} agw_endpoint_row_t;

/* agw_endpoint_row_t.health */
enum { AGW_HEALTH_UNCHECKED = 0, AGW_HEALTH_PASSING = 1, AGW_HEALTH_FAILING = 2 };

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

/* Where a one-endpoint upstream's counts come from (it has no balancer): the workers' metrics
 * (ops/metrics.h) and the generation's upstream index -> metric slot map; and the endpoint slots'
 * addresses now. */
typedef struct agw_endpoint_board_src {
    agw_metrics_t *const *metrics; /* [num_workers] */
    size_t num_workers;
    const uint32_t *upstream_slot; /* [conf->num_upstreams] */
    agw_endpoint_dir_t *dir;       /* the slots' live addresses (group/directory.h); NULL: conf's */
} agw_endpoint_board_src_t;

/* The admin page /upstreams: every upstream with every endpoint, summed over the workers:
 * {"upstreams":[{"name":…,"group":bool,"endpoints":[{"endpoint":1,"url":…,"address":"10.0.0.1:9001",
 * "state":"healthy"|"ejected"|"unhealthy","ejected_workers":N,"unhealthy_workers":N,
 * "ejected_until":s|null,"last_ejection":s|null,"health":"passing"|"failing"|null,"probes":N,
 * "probe_failures":N,"in_flight":N,"calls":N,"failures":N,"ejections":N,"sessions":N,
 * "mean_ms":ms|null},…]},…]} (times in seconds since the Unix epoch). state: "unhealthy" while
 * any worker's health checks keep it out of service, else "ejected" while any worker has it
 * ejected; health: "failing" when any worker's checks fail it, null when it is not checked.
 * endpoint: the slot's number (as spans name it); a slot of a host name that holds no address
 * and has no call in flight is left out (group/directory.h).
 * now_ms: wall clock ms. An upstream with one endpoint has group false; its calls, failures and
 * in_flight are the upstream's own call counters from src (since the process started; src NULL:
 * zeros), the rest as for a group (zeros without health checks). */
void agw_endpoint_board_json(const agw_endpoint_board_t *b, const agw_config_t *conf, const agw_endpoint_board_src_t *src,
                             uint64_t now_ms, agw_buf_t *out);

/* The Prometheus families aggway_endpoint_calls_total, _failures_total, _ejections_total,
 * _sessions_total, _answered_total, _latency_seconds_total (counters), aggway_endpoint_in_flight and
 * aggway_endpoint_ejected (gauges: calls in flight; workers that have it ejected), labels upstream
 * and endpoint (its URL), for the upstreams with more than one endpoint; and for every
 * health-checked upstream aggway_endpoint_health_probes_total, _health_probe_failures_total
 * (counters), aggway_endpoint_unhealthy (gauge: workers whose checks keep it out) and
 * aggway_endpoint_health_failing (gauge: 1 when some worker's checks fail it). The endpoint label
 * of an address of a host name is "URL@address". With dir, for every endpoint host name:
 * aggway_resolve_failures_total (counter) and aggway_resolve_failing (gauge), labels upstream and
 * host. */
void agw_endpoint_board_metrics(const agw_endpoint_board_t *b, const agw_config_t *conf, agw_endpoint_dir_t *dir,
                                uint64_t now_ms, agw_buf_t *out);

#endif
