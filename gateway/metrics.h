/* metrics.h: counters for /metrics, kept per worker without locks (issue 4, DESIGN §3 "metrics:
 * per-worker counters summed on scrape").
 *
 * Each worker owns one agw_metrics_t and is its only writer: a counter is bumped with a relaxed
 * atomic load and store (plain mov/add/mov on x86-64, no lock prefix, no fence). The admin thread
 * reads every worker's counters with relaxed atomic loads and sums them while rendering
 * (agw_metrics_render); a scrape may see one worker's counters a few increments apart from another
 * worker's, never a torn value.
 *
 * Recorded by the worker:
 *   requests by route (endpoint index, 0 = no route matched) and status code, their duration and
 *   response size histograms; partial pages by route and section (a 200 page marked
 *   X-Aggregation-Completed: false, one count per section that is not ok);
 *   upstream calls (transport attempts) by outcome, their latency histogram, calls in flight, the
 *   pool gauges (open, idle, waiting calls), and the runtime's retry/hedge/single-flight counters
 *   (published by the worker once a second).
 * Read at scrape from the shared breakers: state, transitions and calls refused while open.
 */
#ifndef AGW_METRICS_H
#define AGW_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

struct agw_config;
struct agw_waterfall;
struct agw_otlp;
struct agw_otlp_queue;

#define AGW_M_GET(f) __atomic_load_n(&(f), __ATOMIC_RELAXED)
#define AGW_M_SET(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELAXED)
/* single writer: no read-modify-write instruction needed */
#define AGW_M_ADD(f, v) AGW_M_SET(f, AGW_M_GET(f) + (v))

/* Outcomes of an upstream call, as the metric's `outcome` label says them. */
typedef enum agw_metric_outcome {
    AGW_OUT_OK,              /* a 1xx-3xx answer (a 2xx JSON body that is not JSON is bad_response) */
    AGW_OUT_4XX,             /* the upstream answered 4xx */
    AGW_OUT_5XX,             /* the upstream answered 5xx */
    AGW_OUT_TIMEOUT,         /* the call's timeout or the connect timeout passed */
    AGW_OUT_REFUSED,         /* connection refused or unreachable */
    AGW_OUT_RESET,           /* connection reset or closed before the answer was complete */
    AGW_OUT_BAD_RESPONSE,    /* not HTTP, truncated, over max_body_bytes, or invalid JSON */
    AGW_OUT_OVERLOAD,        /* no connection free in the pool (max_pending / bulkhead) */
    AGW_OUT_CANCELLED,       /* the gateway stopped waiting (deadline, client gone, hedge won) */
    AGW_OUT_INVALID_REQUEST, /* CR/LF/NUL in the call's path or headers: nothing was sent */
    AGW_OUT_TLS,             /* https:// upstream: TLS handshake or certificate verification failed */
    AGW_OUT_N
} agw_metric_outcome_t;

/* Name of an outcome label value ("ok", "5xx", …); circuit_open is counted by the breakers. */
const char *agw_metric_outcome_name(agw_metric_outcome_t o);

#define AGW_M_CALL_BOUNDS 13     /* upstream call latency buckets, ms: 1 2 5 10 25 50 100 250 500 1000 2500 5000 10000 */
#define AGW_M_REQ_BOUNDS 12      /* request duration buckets, ms: 5 10 25 50 100 250 500 1000 2500 5000 10000 30000 */
#define AGW_M_SIZE_BOUNDS 9      /* response size buckets, bytes: 256 1K 4K 16K 64K 256K 1M 4M 16M */
#define AGW_M_CODES 600          /* status codes 0..599 counted exactly */
#define AGW_M_PARTIAL_MAX 256    /* distinct (route, section) pairs per worker; the rest count as section "_other" */

typedef struct agw_route_metrics {
    uint64_t codes[AGW_M_CODES];
    uint64_t duration[AGW_M_REQ_BOUNDS + 1];
    uint64_t duration_sum_us;
    uint64_t size[AGW_M_SIZE_BOUNDS + 1];
    uint64_t size_sum;
} agw_route_metrics_t;

typedef struct agw_upstream_metrics {
    uint64_t outcomes[AGW_OUT_N];
    uint64_t latency[AGW_M_CALL_BOUNDS + 1];
    uint64_t latency_sum_us;
    uint64_t started;                 /* transport calls started; in flight = started - ended */
    uint64_t ended;                   /* completed or cancelled */
    uint64_t pool_open, pool_idle, pool_pending;                   /* gauges */
    uint64_t retries, retries_denied, hedges, hedges_won, collapsed; /* from the Lua runtime */
} agw_upstream_metrics_t;

typedef struct agw_partial_metric {
    int route;
    char *section;                    /* written before the entry is published, then read-only */
    uint64_t count;
} agw_partial_metric_t;

typedef struct agw_metrics {
    size_t num_routes;                /* endpoints; routes[0] is "no route matched" */
    size_t num_upstreams;
    agw_route_metrics_t *routes;      /* num_routes + 1 */
    agw_upstream_metrics_t *upstreams;
    uint64_t requests_started, requests_ended; /* requests handed to the runtime (in flight = difference) */
    uint32_t num_partials;            /* published with release order after the entry is written */
    agw_partial_metric_t partials[AGW_M_PARTIAL_MAX];
    /* The worker's other outputs read by other threads (trace.h): its waterfall ring (waterfall.h;
     * made and freed with the metrics), its ring to the span exporter and the exporter itself
     * (otlp.h; set by the server before the worker starts, both NULL when tracing.otlp_http is not
     * configured). */
    struct agw_waterfall *waterfall;
    struct agw_otlp_queue *trace_queue;
    const struct agw_otlp *exporter;
} agw_metrics_t;

/* A zeroed set of counters for conf's routes and upstreams, with an empty waterfall ring (aborts
 * on allocation failure). */
agw_metrics_t *agw_metrics_new(const struct agw_config *conf);
void agw_metrics_free(agw_metrics_t *m);

/* A request answered: endpoint (1-based, 0 when no route matched), HTTP status, duration and
 * response body size. */
void agw_metrics_request(agw_metrics_t *m, int endpoint, int status, double ms, size_t bytes);

/* A transport call of upstream index up (0-based) ended with outcome o after ms. */
void agw_metrics_call(agw_metrics_t *m, size_t up, agw_metric_outcome_t o, double ms);

/* A partial page of endpoint served section (len bytes) in a state other than ok. */
void agw_metrics_partial(agw_metrics_t *m, int endpoint, const char *section, size_t len);

/* Everything the admin listener exports, rendered as Prometheus text into b: the sum over the
 * workers' counters, the shared breakers' state, and ready (1 when serving). */
void agw_metrics_render(agw_buf_t *b, const struct agw_config *conf, agw_metrics_t *const *workers,
                        size_t num_workers, int ready, double start_time);

#endif
