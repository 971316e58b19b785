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
 *
 * Label slots (hot reload): counters are not indexed by a generation's endpoint or upstream index
 * but by a slot, allocated once per distinct route pattern or upstream name in an append-only
 * registry (agw_metric_labels_t) of fixed capacity. A generation maps its indexes to slots when it
 * is loaded, so counters of a route that survives a reload keep counting in the same slot, and
 * the admin thread reads the registry without locks (slots are published with release order and
 * never change afterwards). A reload that would need more slots than the capacity fails.
 */
#ifndef AGW_METRICS_H
#define AGW_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/counter.h"
#include "cache/lru.h"
#include "cache/purge.h"
#include "redis/redis.h"

struct agw_config;
struct agw_waterfall;
struct agw_otlp;
struct agw_otlp_queue;

/* AGW_M_GET, AGW_M_SET, AGW_M_ADD: base/counter.h */

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
    AGW_OUT_LOCAL,           /* the gateway could not open a socket (descriptors, local ports): not the upstream's fault */
    AGW_OUT_N
} agw_metric_outcome_t;

/* Name of an outcome label value ("ok", "5xx", …); circuit_open is counted by the breakers. */
const char *agw_metric_outcome_name(agw_metric_outcome_t o);

#define AGW_M_CALL_BOUNDS 13     /* upstream call latency buckets, ms: 1 2 5 10 25 50 100 250 500 1000 2500 5000 10000 */
#define AGW_M_REQ_BOUNDS 12      /* request duration buckets, ms: 5 10 25 50 100 250 500 1000 2500 5000 10000 30000 */
#define AGW_M_SIZE_BOUNDS 9      /* response size buckets, bytes: 256 1K 4K 16K 64K 256K 1M 4M 16M */
#define AGW_M_CODES 600          /* status codes 0..599 counted exactly */
#define AGW_M_PARTIAL_MAX 256    /* distinct (route, section) pairs per worker; the rest count as section "_other" */
#define AGW_M_ROUTE_SLOTS 4096   /* distinct route patterns a serving process can count (over all its reloads) */
#define AGW_M_UPSTREAM_SLOTS 512 /* distinct upstream names a serving process can count (over all its reloads) */

typedef struct agw_route_metrics {
    uint64_t codes[AGW_M_CODES];
    uint64_t duration[AGW_M_REQ_BOUNDS + 1];
    uint64_t duration_sum_us;
    uint64_t size[AGW_M_SIZE_BOUNDS + 1];
    uint64_t size_sum;
    uint64_t limited;                 /* answered 429 by a rate limit or quota (limits/limit.h) */
    uint64_t shed;                    /* answered 503: shed by priority (limits/gate.h) */
    uint64_t partial_other;           /* partial pages' sections past the worker's AGW_M_PARTIAL_MAX
                                         pairs: rendered as section "_other" of this route */
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
    size_t len;                       /* section's bytes (a name may hold a NUL) */
    uint64_t count;
} agw_partial_metric_t;

/* Registry of label slots, shared by every worker and the admin thread. Written by one thread
 * (the one that loads generations), read by any. */
typedef struct agw_metric_labels {
    uint32_t route_cap;               /* route slots at most, slot 0 ("unmatched") included */
    uint32_t upstream_cap;            /* upstream slots at most */
    char **routes;                    /* slot -> route pattern ("GET /p/{id}"); [0] = "unmatched" */
    char **upstreams;                 /* slot -> upstream name */
    uint32_t num_routes;              /* slots in use; published with release order */
    uint32_t num_upstreams;
} agw_metric_labels_t;

/* A registry with room for route_cap routes (plus "unmatched") and upstream_cap upstreams.
 * Aborts on allocation failure. Free with agw_metric_labels_free once no reader is left. */
agw_metric_labels_t *agw_metric_labels_new(uint32_t route_cap, uint32_t upstream_cap);

/* Frees the registry and its names (NULL is ignored). */
void agw_metric_labels_free(agw_metric_labels_t *l);

/* Gives each endpoint and upstream of conf its slot, adding slots for names not seen before:
 * route_slot[e] for endpoint e (1-based; route_slot[0] = 0, "unmatched"), route_slot[num_endpoints
 * + 1] for the batch endpoint's envelope ("POST <batch path>"; 0 when conf has no batch endpoint),
 * upstream_slot[u] for upstream u (0-based); the caller sizes them num_endpoints + 2 and
 * num_upstreams. Returns 0, or
 * -1 with a message in errors (and nothing added) when the registry would overflow. Only one
 * thread may call it at a time. */
int agw_metric_labels_map(agw_metric_labels_t *l, const struct agw_config *conf, uint32_t *route_slot,
                          uint32_t *upstream_slot, agw_buf_t *errors);

#define AGW_M_ENTRY_BOUNDS 8    /* Lua entry duration buckets, µs: 100 250 500 1000 2000 5000 10000 50000 */

/* The Lua garbage collector of a worker's VMs: the idle collections (worker/gc.h), the heap, and
 * how long the worker's entries into Lua last (the script and the collector's steps it ran: the
 * worker's pauses in Lua). */
typedef struct agw_lua_gc_stats {
    uint64_t idle_collections;        /* full collections when the worker went idle */
    uint64_t idle_us_max;             /* the longest of those, µs */
    uint64_t heap_bytes;              /* the worker's VMs' heaps, bytes (once a second) */
    uint64_t memory_refused;          /* huge blocks refused by script_memory_limit_mb (base/heap.h),
                                         counted once a second */
    uint64_t memory_stopped;          /* scripts it stopped, counted once a second */
    uint64_t entries[AGW_M_ENTRY_BOUNDS + 1]; /* outermost entries into Lua by duration bucket */
    uint64_t entry_us_sum;            /* their total duration, µs */
    uint64_t entry_us_max;            /* the longest, µs (of those over 100 µs: 0 when none was) */
} agw_lua_gc_stats_t;

/* Counts an outermost entry into Lua that lasted us µs into st (the worker's thread only). Inline:
 * on the path of every request and upstream answer. */
static inline void agw_metrics_lua_entry(agw_lua_gc_stats_t *st, uint64_t us)
{
    static const uint32_t bounds[AGW_M_ENTRY_BOUNDS] = {100, 250, 500, 1000, 2000, 5000, 10000, 50000};
    size_t i = 0;
    if (us > bounds[0]) { /* nearly every entry is in the first bucket */
        while (i < AGW_M_ENTRY_BOUNDS && us > bounds[i])
            i++;
        if (us > AGW_M_GET(st->entry_us_max))
            AGW_M_SET(st->entry_us_max, us);
    }
    AGW_M_ADD(st->entries[i], 1);
    AGW_M_ADD(st->entry_us_sum, us);
}

typedef struct agw_metrics {
    size_t num_routes;                /* route slots (the registry's capacity); routes[0] is "no route matched" */
    size_t num_upstreams;             /* upstream slots (the registry's capacity) */
    agw_route_metrics_t *routes;      /* num_routes slots, indexed by route slot */
    agw_upstream_metrics_t *upstreams; /* indexed by upstream slot */
    uint64_t requests_started, requests_ended; /* requests handed to the runtime (in flight = difference) */
    uint64_t early_sent;              /* upstream requests written before their loop iteration ended
                                       * (upstream/batch.h agw_batch_send_early) */
    uint32_t num_partials;            /* published with release order after the entry is written */
    agw_partial_metric_t partials[AGW_M_PARTIAL_MAX];
    /* The worker's other outputs read by other threads (trace.h): its waterfall ring (waterfall.h;
     * made and freed with the metrics), its ring to the span exporter and the exporter itself
     * (otlp.h; set by the server before the worker starts, both NULL when tracing.otlp_http is not
     * configured). */
    struct agw_limit_store *limits;   /* the process's limits (the same for every worker; set by the
                                         server): rendered once, from the first worker's */
    /* The cache (lua/agg/cache.lua, cache/lru.h) and the worker's Redis client (redis/redis.h). */
#define AGW_M_CACHE_OUTCOMES 6          /* hit, miss, stale, stale_if_error, refresh, negative (see agw_metrics_cache_outcome) */
    uint64_t cache[AGW_M_CACHE_OUTCOMES];
    agw_lru_stats_t lru;
    agw_redis_stats_t redis;
    agw_cache_inbox_t purge;          /* POST /cache/purge: prefixes for this worker's tier 1 (purge.h) */
    agw_lua_gc_stats_t lua_gc;
    struct agw_waterfall *waterfall;
    struct agw_otlp_queue *trace_queue;
    const struct agw_otlp *exporter;
} agw_metrics_t;

/* A zeroed set of counters with a slot for every slot labels can hold, with an empty waterfall
 * ring (aborts on allocation failure; the pages of slots never used are never touched). */
agw_metrics_t *agw_metrics_new(const agw_metric_labels_t *labels);

/* The name of cache outcome i (0 .. AGW_M_CACHE_OUTCOMES-1) as the metric's label says it. */
const char *agw_metrics_cache_outcome(size_t i);

/* Frees a worker's counters and its waterfall ring (NULL is ignored). */
void agw_metrics_free(agw_metrics_t *m);

/* A request answered: route slot (0 when no route matched), HTTP status, duration and response
 * body size. */
void agw_metrics_request(agw_metrics_t *m, int route, int status, double ms, size_t bytes);

/* A transport call of upstream slot up ended with outcome o after ms. */
void agw_metrics_call(agw_metrics_t *m, size_t up, agw_metric_outcome_t o, double ms);

/* A partial page of route slot route served section (len bytes) in a state other than ok. */
void agw_metrics_partial(agw_metrics_t *m, int route, const char *section, size_t len);

/* The process-wide gauges and the reload counters, as the admin thread saw them at a scrape. */
typedef struct agw_metrics_process {
    int ready;                        /* 1 while serving (as /readyz) */
    double start_time;                /* seconds since the Unix epoch */
    uint64_t generation;              /* generation serving new requests, 0 before the first */
    uint64_t reloads;                 /* reloads that put a new generation in service */
    uint64_t reload_failures;         /* reloads that failed (the old generation kept serving) */
    int last_reload_ok;               /* 1 unless the last reload failed */
    double last_reload_time;          /* seconds since the Unix epoch of the last reload, 0: none */
    uint64_t generations_live;        /* generations loaded and not yet freed (old ones still
                                         finishing requests, the current one) */
    uint64_t admin_evicted;           /* admin connections closed unanswered to make room (admin.h) */
} agw_metrics_process_t;

/* Everything the admin listener exports, rendered as Prometheus text into b: the process gauges,
 * the sum over the workers' counters for every slot of labels, and the state of the shared
 * breakers of conf (the generation serving; NULL: no breaker samples). */
void agw_metrics_render(agw_buf_t *b, const agw_metric_labels_t *labels, const struct agw_config *conf,
                        agw_metrics_t *const *workers, size_t num_workers, const agw_metrics_process_t *proc);

#endif
