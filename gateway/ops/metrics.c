/* metrics.c: per-worker counters and their Prometheus rendering (see metrics.h). */
#include "ops/metrics.h"

#include "base/mem.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "base/heap.h"

#include "script/config.h"
#include "limits/limit.h"
#include "ops/otlp.h"
#include "ops/prom.h"
#include "ops/waterfall.h"

static const double CALL_BOUNDS_MS[AGW_M_CALL_BOUNDS] = {1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000};
static const double REQ_BOUNDS_MS[AGW_M_REQ_BOUNDS] = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000};
static const double SIZE_BOUNDS[AGW_M_SIZE_BOUNDS] = {256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                                                      16777216};

static const char *const outcome_names[AGW_OUT_N] = {
    [AGW_OUT_OK] = "ok",
    [AGW_OUT_4XX] = "4xx",
    [AGW_OUT_5XX] = "5xx",
    [AGW_OUT_TIMEOUT] = "timeout",
    [AGW_OUT_REFUSED] = "refused",
    [AGW_OUT_RESET] = "reset",
    [AGW_OUT_BAD_RESPONSE] = "bad_response",
    [AGW_OUT_OVERLOAD] = "overload",
    [AGW_OUT_CANCELLED] = "cancelled",
    [AGW_OUT_INVALID_REQUEST] = "invalid_request",
    [AGW_OUT_TLS] = "tls",
    [AGW_OUT_LOCAL] = "local",
};

const char *agw_metric_outcome_name(agw_metric_outcome_t o)
{
    return o < AGW_OUT_N ? outcome_names[o] : "?";
}

agw_metric_labels_t *agw_metric_labels_new(uint32_t route_cap, uint32_t upstream_cap)
{
    agw_metric_labels_t *l = agw_calloc(1, sizeof(*l));
    l->route_cap = route_cap + 1;
    l->upstream_cap = upstream_cap ? upstream_cap : 1;
    l->routes = agw_calloc(l->route_cap, sizeof(*l->routes));
    l->upstreams = agw_calloc(l->upstream_cap, sizeof(*l->upstreams));
    l->routes[0] = agw_strdup("unmatched");
    l->num_routes = 1;
    return l;
}

void agw_metric_labels_free(agw_metric_labels_t *l)
{
    if (l == NULL)
        return;
    for (uint32_t i = 0; i < l->num_routes; i++)
        free(l->routes[i]);
    for (uint32_t i = 0; i < l->num_upstreams; i++)
        free(l->upstreams[i]);
    free(l->routes);
    free(l->upstreams);
    free(l);
}

/* Slot of name among names[from..n), or n when it has none yet. */
static uint32_t find_slot(char *const *names, uint32_t from, uint32_t n, const char *name)
{
    for (uint32_t i = from; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return n;
}

/* Maps every name to its slot in names (n in use, cap at most), appending new names. Returns
 * the new count, or cap + 1 (nothing appended) when they do not fit. */
static uint32_t map_names(char **names, uint32_t from, uint32_t n, uint32_t cap, const char *const *want,
                          size_t num_want, uint32_t *slot)
{
    uint32_t fresh = 0;
    for (size_t i = 0; i < num_want; i++) {
        uint32_t s = find_slot(names, from, n, want[i]);
        if (s == n) { /* new here: a name may still repeat inside want (two generations' worth) */
            int dup = 0;
            for (size_t j = 0; j < i && !dup; j++)
                dup = strcmp(want[j], want[i]) == 0;
            fresh += !dup;
        }
    }
    if (n + fresh > cap)
        return cap + 1;
    for (size_t i = 0; i < num_want; i++) {
        uint32_t s = find_slot(names, from, n, want[i]);
        if (s == n) {
            names[n] = agw_strdup(want[i]);
            n++;
        }
        slot[i] = s;
    }
    return n;
}

int agw_metric_labels_map(agw_metric_labels_t *l, const agw_config_t *conf, uint32_t *route_slot,
                          uint32_t *upstream_slot, agw_buf_t *errors)
{
    size_t ne = conf->num_endpoints, nu = conf->num_upstreams;
    const char **want = agw_calloc((ne > nu ? ne : nu) + 2, sizeof(*want));
    for (size_t e = 0; e < ne; e++)
        want[e] = conf->endpoints[e].route ? conf->endpoints[e].route : "";
    size_t nw = ne;
    if (conf->batch_route) /* the batch endpoint's envelope: a route of its own */
        want[nw++] = conf->batch_route;
    route_slot[ne + 1] = 0;
    uint32_t nr = map_names(l->routes, 1, l->num_routes, l->route_cap, want, nw, route_slot + 1);
    for (size_t u = 0; u < nu; u++)
        want[u] = conf->upstreams[u].name ? conf->upstreams[u].name : "";
    uint32_t nup = nr > l->route_cap ? 0 : map_names(l->upstreams, 0, l->num_upstreams, l->upstream_cap, want, nu,
                                                    upstream_slot);
    free(want);
    if (nr > l->route_cap) {
        agw_buf_printf(errors, "%s/gateway.lua:1: metrics: more than %u distinct routes since the gateway started; "
                       "restart it to load this many routes\n", conf->dir, l->route_cap - 1);
        return -1;
    }
    if (nup > l->upstream_cap) {
        /* the routes of this generation are in the registry already: harmless, they read 0 */
        agw_buf_printf(errors, "%s/gateway.lua:1: metrics: more than %u distinct upstream names since the gateway "
                       "started; restart it to load this many upstreams\n", conf->dir, l->upstream_cap);
        __atomic_store_n(&l->num_routes, nr, __ATOMIC_RELEASE);
        return -1;
    }
    route_slot[0] = 0;
    __atomic_store_n(&l->num_routes, nr, __ATOMIC_RELEASE);
    __atomic_store_n(&l->num_upstreams, nup, __ATOMIC_RELEASE);
    return 0;
}

agw_metrics_t *agw_metrics_new(const agw_metric_labels_t *labels)
{
    agw_metrics_t *m = agw_calloc(1, sizeof(*m));
    m->num_routes = labels->route_cap;
    m->num_upstreams = labels->upstream_cap;
    m->routes = agw_calloc(m->num_routes, sizeof(*m->routes));
    m->upstreams = agw_calloc(m->num_upstreams, sizeof(*m->upstreams));
    m->waterfall = agw_waterfall_new();
    agw_cache_inbox_init(&m->purge);
    return m;
}

void agw_metrics_free(agw_metrics_t *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; i < m->num_partials; i++)
        free(m->partials[i].section);
    free(m->routes);
    free(m->upstreams);
    agw_waterfall_free(m->waterfall);
    agw_cache_inbox_free(&m->purge);
    free(m);
}

/* Index of the first bound >= v (the +Inf bucket when v is above every bound). */
static inline size_t bucket(const double *bounds, size_t n, double v)
{
    size_t i = 0;
    while (i < n && v > bounds[i])
        i++;
    return i;
}

void agw_metrics_request(agw_metrics_t *m, int route, int status, double ms, size_t bytes)
{
    if (route < 0 || (size_t)route >= m->num_routes)
        route = 0;
    agw_route_metrics_t *r = &m->routes[route];
    AGW_M_ADD(r->codes[status >= 0 && status < AGW_M_CODES ? status : 0], 1);
    if (ms < 0)
        ms = 0;
    AGW_M_ADD(r->duration[bucket(REQ_BOUNDS_MS, AGW_M_REQ_BOUNDS, ms)], 1);
    AGW_M_ADD(r->duration_sum_us, (uint64_t)(ms * 1000.0));
    AGW_M_ADD(r->size[bucket(SIZE_BOUNDS, AGW_M_SIZE_BOUNDS, (double)bytes)], 1);
    AGW_M_ADD(r->size_sum, (uint64_t)bytes);
}

void agw_metrics_call(agw_metrics_t *m, size_t up, agw_metric_outcome_t o, double ms)
{
    if (up >= m->num_upstreams || o >= AGW_OUT_N)
        return;
    agw_upstream_metrics_t *u = &m->upstreams[up];
    AGW_M_ADD(u->outcomes[o], 1);
    AGW_M_ADD(u->ended, 1);
    if (o == AGW_OUT_CANCELLED)
        return; /* a call the gateway gave up on says nothing about the upstream's latency */
    if (ms < 0)
        ms = 0;
    AGW_M_ADD(u->latency[bucket(CALL_BOUNDS_MS, AGW_M_CALL_BOUNDS, ms)], 1);
    AGW_M_ADD(u->latency_sum_us, (uint64_t)(ms * 1000.0));
}

void agw_metrics_partial(agw_metrics_t *m, int endpoint, const char *section, size_t len)
{
    if (endpoint < 0 || (size_t)endpoint >= m->num_routes)
        endpoint = 0;
    uint32_t n = m->num_partials; /* this thread is the only writer */
    for (uint32_t i = 0; i < n; i++) {
        agw_partial_metric_t *p = &m->partials[i];
        if (p->route == endpoint && p->len == len && memcmp(p->section, section, len) == 0) {
            AGW_M_ADD(p->count, 1);
            return;
        }
    }
    /* the table is full: the route's own "_other" (section names come from scripts, which may make
     * them of a client's input: a client that filled the table with failing sections of its own
     * left every other route and section uncounted, not even as "_other", an attack review) */
    if (n >= AGW_M_PARTIAL_MAX) {
        AGW_M_ADD(m->routes[endpoint].partial_other, 1);
        return;
    }
    agw_partial_metric_t *p = &m->partials[n];
    p->route = endpoint;
    p->section = agw_malloc(len + 1);
    memcpy(p->section, section, len);
    p->section[len] = '\0';
    p->len = len;
    AGW_M_SET(p->count, 1);
    __atomic_store_n(&m->num_partials, n + 1, __ATOMIC_RELEASE);
}

/* ---- rendering ------------------------------------------------------------------------------- */

/* Label of route slot e (slots are published before any worker counts in them). */
static const char *route_name(const agw_metric_labels_t *l, size_t nr, size_t e)
{
    return e < nr ? l->routes[e] : "unmatched";
}

/* The Lua collector of the workers' VMs (worker/gc.h): idle collections summed over the workers,
 * the longest of any worker, the heaps' sizes. */
static void render_lua_gc(agw_buf_t *b, agw_metrics_t *const *w, size_t nw)
{
    uint64_t idle = 0, imax = 0, heap = 0, refused = 0, stopped = 0, entries[AGW_M_ENTRY_BOUNDS + 1] = {0}, esum = 0, emax = 0;
    for (size_t i = 0; i < nw; i++) {
        const agw_lua_gc_stats_t *st = &w[i]->lua_gc;
        idle += AGW_M_GET(st->idle_collections);
        heap += AGW_M_GET(st->heap_bytes);
        refused += AGW_M_GET(st->memory_refused);
        stopped += AGW_M_GET(st->memory_stopped);
        uint64_t v;
        if ((v = AGW_M_GET(st->idle_us_max)) > imax)
            imax = v;
        for (size_t k = 0; k <= AGW_M_ENTRY_BOUNDS; k++)
            entries[k] += AGW_M_GET(st->entries[k]);
        esum += AGW_M_GET(st->entry_us_sum);
        if ((v = AGW_M_GET(st->entry_us_max)) > emax)
            emax = v;
    }
    agw_prom_family(b, "aggway_lua_gc_idle_collections_total", "counter",
                    "Full collections run when a worker went idle (no request for 2 s), each followed by "
                    "free memory given back to the kernel.");
    agw_prom_sample_u64(b, "aggway_lua_gc_idle_collections_total", NULL, 0, idle);
    agw_prom_family(b, "aggway_lua_gc_idle_collection_max_seconds", "gauge", "The longest of those full collections.");
    agw_prom_sample(b, "aggway_lua_gc_idle_collection_max_seconds", NULL, 0, (double)imax / 1e6);
    agw_prom_family(b, "aggway_lua_heap_bytes", "gauge", "Bytes in use by the workers' Lua VMs (updated once a second).");
    agw_prom_sample_u64(b, "aggway_lua_heap_bytes", NULL, 0, heap);
    agw_prom_family(b, "aggway_lua_memory_refused_total", "counter",
                    "string.rep calls of 4 MB or more a script made and was refused because its worker's Lua "
                    "heap would have passed script_memory_limit_mb (the script got \"not enough memory\").");
    agw_prom_sample_u64(b, "aggway_lua_memory_refused_total", NULL, 0, refused);
    agw_prom_family(b, "aggway_lua_memory_stopped_total", "counter",
                    "Scripts stopped because their worker's Lua heap, collected, was still over "
                    "script_memory_limit_mb.");
    agw_prom_sample_u64(b, "aggway_lua_memory_stopped_total", NULL, 0, stopped);
    /* the bounds of agw_metrics_lua_entry, µs */
    static const double entry_bounds[AGW_M_ENTRY_BOUNDS] = {100, 250, 500, 1000, 2000, 5000, 10000, 50000};
    agw_prom_family(b, "aggway_lua_entry_duration_seconds", "histogram",
                    "How long each entry of a worker into Lua lasted (a request's handler, an upstream answer's "
                    "continuation, ...): the script and the garbage collector's steps it ran. The worker serves "
                    "nothing else meanwhile.");
    agw_prom_histogram(b, "aggway_lua_entry_duration_seconds", NULL, 0, entry_bounds, AGW_M_ENTRY_BOUNDS, 1e6, entries,
                       (double)esum / 1e6);
    agw_prom_family(b, "aggway_lua_entry_max_seconds", "gauge",
                    "The longest entry into Lua of any worker since the start (0 while none took over 100 us).");
    agw_prom_sample(b, "aggway_lua_entry_max_seconds", NULL, 0, (double)emax / 1e6);
    /* the heap (jemalloc's, every thread's: C and the Lua VMs): with the RSS, where a process's
     * memory is (docs/performance.md); read at each scrape, never by a worker. Not in a sanitized
     * build, whose malloc is the sanitizer's (base/heap.h) */
    agw_heap_stats_t hs;
    if (agw_heap_stats(&hs) == 0) {
        agw_prom_family(b, "aggway_heap_bytes", "gauge",
                        "The process's heap (jemalloc: C and the Lua VMs): bytes allocated, the pages holding "
                        "them (active), the allocator's resident pages (resident: with free pages not given back "
                        "yet; an idle worker gives them back), address space kept unmapped (retained), and "
                        "the allocator's own records (metadata, within resident; never given back).");
        static const char *const names[] = {"allocated", "active", "resident", "retained", "metadata"};
        const size_t vals[] = {hs.allocated, hs.active, hs.resident, hs.retained, hs.metadata};
        for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
            agw_prom_label_t l = AGW_PROM_LABEL("state", names[i]);
            agw_prom_sample_u64(b, "aggway_heap_bytes", &l, 1, (uint64_t)vals[i]);
        }
    }
}

/* A counter family by route: the sum over the nw workers of each of the nr routes' uint64_t field at
 * offset (in agw_route_metrics_t); routes that counted nothing are left out. */
static void render_route_counter(agw_buf_t *b, const agw_metric_labels_t *lb, size_t nr, agw_metrics_t *const *w,
                                 size_t nw, const char *name, const char *help, size_t offset)
{
    agw_prom_family(b, name, "counter", help);
    for (size_t e = 0; e < nr; e++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < nw; i++)
            sum += AGW_M_GET(*(uint64_t *)((char *)&w[i]->routes[e] + offset));
        agw_prom_label_t l = AGW_PROM_LABEL("route", route_name(lb, nr, e));
        if (sum)
            agw_prom_sample_u64(b, name, &l, 1, sum);
    }
}

/* A counter family of the limits rules with one more label of two values: for each of the nl rules
 * of lc, {rule=NAME, label=v0} from the rule's uint64_t field at offset off0 and {rule=NAME,
 * label=v1} from the one at off1 (read with atomics: the workers count while this runs). */
static void render_rule_pair(agw_buf_t *b, const char *family, const char *help, const agw_limit_counts_t *lc,
                             size_t nl, const char *label, const char *v0, size_t off0, const char *v1, size_t off1)
{
    agw_prom_family(b, family, "counter", help);
    for (size_t i = 0; i < nl; i++) {
        const char *c = (const char *)&lc[i];
        agw_prom_label_t l[2] = {AGW_PROM_LABEL("rule", lc[i].name), AGW_PROM_LABEL(label, v0)};
        agw_prom_sample_u64(b, family, l, 2, __atomic_load_n((const uint64_t *)(c + off0), __ATOMIC_RELAXED));
        l[1] = AGW_PROM_LABEL(label, v1);
        agw_prom_sample_u64(b, family, l, 2, __atomic_load_n((const uint64_t *)(c + off1), __ATOMIC_RELAXED));
    }
}

static void render_requests(agw_buf_t *b, const agw_metric_labels_t *lb, agw_metrics_t *const *w, size_t nw)
{
    size_t nr = __atomic_load_n(&lb->num_routes, __ATOMIC_ACQUIRE);
    agw_prom_family(b, "aggway_requests_total", "counter",
                    "Requests answered, by route pattern (\"unmatched\" when no route matched) and HTTP status code "
                    "(499: the client went away first).");
    for (size_t e = 0; e < nr; e++) {
        for (int code = 0; code < AGW_M_CODES; code++) {
            uint64_t sum = 0;
            for (size_t i = 0; i < nw; i++)
                sum += AGW_M_GET(w[i]->routes[e].codes[code]);
            if (sum == 0)
                continue;
            char cs[8];
            snprintf(cs, sizeof(cs), "%d", code);
            agw_prom_label_t l[2] = {AGW_PROM_LABEL("route", route_name(lb, nr, e)), AGW_PROM_LABEL("code", cs)};
            agw_prom_sample_u64(b, "aggway_requests_total", l, 2, sum);
        }
    }
    uint64_t started = 0, ended = 0;
    for (size_t i = 0; i < nw; i++) {
        started += AGW_M_GET(w[i]->requests_started);
        ended += AGW_M_GET(w[i]->requests_ended);
    }
    agw_prom_family(b, "aggway_requests_in_flight", "gauge", "Requests being handled by a script right now.");
    agw_prom_sample_u64(b, "aggway_requests_in_flight", NULL, 0, started > ended ? started - ended : 0);
    uint64_t early = 0;
    for (size_t i = 0; i < nw; i++)
        early += AGW_M_GET(w[i]->early_sent);
    agw_prom_family(b, "aggway_upstream_early_requests_total", "counter",
                    "Upstream requests written before the end of the loop iteration whose pages made them (a "
                    "burst of pages: their calls go out while the rest of the burst runs), of all upstreams.");
    agw_prom_sample_u64(b, "aggway_upstream_early_requests_total", NULL, 0, early);

    render_lua_gc(b, w, nw);

    render_route_counter(b, lb, nr, w, nw, "aggway_rate_limited_total",
                         "Requests refused with 429 by a rate limit or quota (limits in gateway.lua), by route.",
                         offsetof(agw_route_metrics_t, limited));
    if (nw > 0 && w[0]->limits) {
        const agw_limit_counts_t *lc;
        size_t nl = agw_limit_counters(w[0]->limits, &lc);
        render_rule_pair(b, "aggway_limit_decisions_total",
                         "Requests checked against a rate limit or quota rule, by rule name and outcome (allowed: "
                         "the rule accepted a request that went through; limited: the rule refused it).",
                         lc, nl, "outcome", "allowed", offsetof(agw_limit_counts_t, allowed), "limited",
                         offsetof(agw_limit_counts_t, limited));
        render_rule_pair(b, "aggway_limit_errors_total",
                         "Checks of a rule that could not be made as configured, by rule name and cause (redis: a "
                         "store = \"redis\" rule whose Redis did not answer in redis.timeout_ms, was down or answered "
                         "garbage, decided by its on_redis_error instead; key: a key function that failed).",
                         lc, nl, "cause", "redis", offsetof(agw_limit_counts_t, redis_errors), "key",
                         offsetof(agw_limit_counts_t, key_errors));
        agw_prom_family(b, "aggway_limit_table_full_total", "counter",
                        "Checks let through uncounted because the table of counts was full where the key would go "
                        "(raise limits.local_keys).");
        agw_prom_sample_u64(b, "aggway_limit_table_full_total", NULL, 0, agw_limit_store_full(w[0]->limits));
    }
    render_route_counter(b, lb, nr, w, nw, "aggway_shed_total",
                         "Requests shed with 503 because a worker had more than max_in_flight pages in flight, by route.",
                         offsetof(agw_route_metrics_t, shed));

    agw_prom_family(b, "aggway_request_duration_seconds", "histogram",
                    "Time from the request's arrival to its response, by route.");
    for (size_t e = 0; e < nr; e++) {
        uint64_t counts[AGW_M_REQ_BOUNDS + 1] = {0}, sum_us = 0;
        for (size_t i = 0; i < nw; i++) {
            for (size_t k = 0; k <= AGW_M_REQ_BOUNDS; k++)
                counts[k] += AGW_M_GET(w[i]->routes[e].duration[k]);
            sum_us += AGW_M_GET(w[i]->routes[e].duration_sum_us);
        }
        agw_prom_label_t l = AGW_PROM_LABEL("route", route_name(lb, nr, e));
        agw_prom_histogram(b, "aggway_request_duration_seconds", &l, 1, REQ_BOUNDS_MS, AGW_M_REQ_BOUNDS, 1000.0, counts,
                           (double)sum_us / 1e6);
    }
    agw_prom_family(b, "aggway_response_size_bytes", "histogram", "Response body sizes, by route.");
    for (size_t e = 0; e < nr; e++) {
        uint64_t counts[AGW_M_SIZE_BOUNDS + 1] = {0}, sum = 0;
        for (size_t i = 0; i < nw; i++) {
            for (size_t k = 0; k <= AGW_M_SIZE_BOUNDS; k++)
                counts[k] += AGW_M_GET(w[i]->routes[e].size[k]);
            sum += AGW_M_GET(w[i]->routes[e].size_sum);
        }
        agw_prom_label_t l = AGW_PROM_LABEL("route", route_name(lb, nr, e));
        agw_prom_histogram(b, "aggway_response_size_bytes", &l, 1, SIZE_BOUNDS, AGW_M_SIZE_BOUNDS, 1.0, counts,
                           (double)sum);
    }
}

static void render_partials(agw_buf_t *b, const agw_metric_labels_t *lb, agw_metrics_t *const *w, size_t nw)
{
    size_t nr = __atomic_load_n(&lb->num_routes, __ATOMIC_ACQUIRE);
    agw_prom_family(b, "aggway_partial_pages_total", "counter",
                    "Pages served with 200 but incomplete (X-Aggregation-Completed: false), by route and by each "
                    "section that was not ok (fallback, stale or unavailable).");
    /* merge the workers' (route, section) entries, and each route's "_other" (the sections past a
     * worker's table); few and small: quadratic is fine */
    size_t cap = 0;
    for (size_t i = 0; i < nw; i++)
        cap += __atomic_load_n(&w[i]->num_partials, __ATOMIC_ACQUIRE) + nr;
    if (cap == 0)
        return;
    struct merged {
        int route;
        const char *section;
        size_t len;
        uint64_t count;
    } *mg = agw_calloc(cap, sizeof(*mg));
    size_t n = 0;
    for (size_t i = 0; i < nw; i++) {
        uint32_t np = __atomic_load_n(&w[i]->num_partials, __ATOMIC_ACQUIRE);
        for (size_t j = 0; j < np + nr; j++) {
            int route;
            const char *section;
            size_t len;
            uint64_t count;
            if (j < np) {
                const agw_partial_metric_t *p = &w[i]->partials[j];
                route = p->route, section = p->section, len = p->len;
                count = AGW_M_GET(((agw_partial_metric_t *)p)->count);
            } else if (j - np < nr && j - np < w[i]->num_routes) {
                route = (int)(j - np), section = "_other", len = 6;
                count = AGW_M_GET(w[i]->routes[j - np].partial_other);
                if (count == 0)
                    continue;
            } else {
                continue;
            }
            size_t k = 0;
            while (k < n && !(mg[k].route == route && mg[k].len == len && memcmp(mg[k].section, section, len) == 0))
                k++;
            if (k == n) {
                mg[n].route = route;
                mg[n].section = section;
                mg[n].len = len;
                n++;
            }
            mg[k].count += count;
        }
    }
    for (size_t k = 0; k < n; k++) {
        agw_prom_label_t l[2] = {AGW_PROM_LABEL("route", route_name(lb, nr, (size_t)mg[k].route)),
                                 AGW_PROM_LABEL("section", mg[k].section)};
        agw_prom_sample_u64(b, "aggway_partial_pages_total", l, 2, mg[k].count);
    }
    free(mg);
}

/* One per-upstream counter family, summed over the workers (field: offset in agw_upstream_metrics_t). */
static void render_upstream_counter(agw_buf_t *b, const agw_metric_labels_t *lb, size_t nu, agw_metrics_t *const *w,
                                    size_t nw, const char *name, const char *type, const char *help, size_t offset)
{
    agw_prom_family(b, name, type, help);
    for (size_t u = 0; u < nu; u++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < nw; i++)
            sum += AGW_M_GET(*(uint64_t *)((char *)&w[i]->upstreams[u] + offset));
        agw_prom_label_t l = AGW_PROM_LABEL("upstream", lb->upstreams[u]);
        agw_prom_sample_u64(b, name, &l, 1, sum);
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the clock of libev's ev_now(), which the breakers are fed */
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* The breaker of upstream slot name in conf (the generation serving), or NULL. */
static agw_breaker_t *breaker_of(const agw_config_t *conf, const char *name)
{
    for (size_t i = 0; conf && i < conf->num_upstreams; i++)
        if (strcmp(conf->upstreams[i].name, name) == 0)
            return conf->breakers[i];
    return NULL;
}

static void render_upstreams(agw_buf_t *b, const agw_metric_labels_t *lb, const agw_config_t *conf,
                             agw_metrics_t *const *w, size_t nw)
{
    size_t nu = __atomic_load_n(&lb->num_upstreams, __ATOMIC_ACQUIRE);
    struct bstate {
        int present; /* the upstream is in the generation serving */
        int state;
        uint64_t opened, closed, denied;
    } *bs = agw_calloc(nu ? nu : 1, sizeof(*bs));
    double now = now_ms();
    for (size_t u = 0; u < nu; u++) {
        agw_breaker_t *br = breaker_of(conf, lb->upstreams[u]);
        if (br == NULL)
            continue;
        bs[u].present = 1;
        pthread_mutex_lock(&br->lock);
        int st = br->failures == 0 ? AGW_BREAKER_CLOSED : (int)br->state;
        /* an open breaker turns half-open when the next call asks after open_ms */
        if (st == AGW_BREAKER_OPEN && now >= (double)(br->opened_at_ms + br->open_ms))
            st = AGW_BREAKER_HALF_OPEN;
        bs[u].state = st;
        bs[u].opened = br->opened;
        bs[u].closed = br->closed;
        bs[u].denied = br->denied;
        pthread_mutex_unlock(&br->lock);
    }

    agw_prom_family(b, "aggway_upstream_calls_total", "counter",
                    "Calls to an upstream (each attempt: retries and hedges count) by outcome: ok, 4xx, 5xx, timeout, "
                    "refused, reset, bad_response, overload, cancelled, invalid_request, tls, local (the gateway had no "
                    "socket: not the upstream's fault), and circuit_open (not sent: "
                    "the breaker was open).");
    for (size_t u = 0; u < nu; u++) {
        for (int o = 0; o <= AGW_OUT_N; o++) {
            uint64_t sum = 0;
            if (o == AGW_OUT_N) {
                sum = bs[u].denied;
            } else {
                for (size_t i = 0; i < nw; i++)
                    sum += AGW_M_GET(w[i]->upstreams[u].outcomes[o]);
            }
            agw_prom_label_t l[2] = {AGW_PROM_LABEL("upstream", lb->upstreams[u]),
                                     AGW_PROM_LABEL("outcome", o == AGW_OUT_N ? "circuit_open" : outcome_names[o])};
            agw_prom_sample_u64(b, "aggway_upstream_calls_total", l, 2, sum);
        }
    }
    agw_prom_family(b, "aggway_upstream_call_duration_seconds", "histogram",
                    "Latency of upstream calls that ended (cancelled calls are not observed).");
    for (size_t u = 0; u < nu; u++) {
        uint64_t counts[AGW_M_CALL_BOUNDS + 1] = {0}, sum_us = 0;
        for (size_t i = 0; i < nw; i++) {
            for (size_t k = 0; k <= AGW_M_CALL_BOUNDS; k++)
                counts[k] += AGW_M_GET(w[i]->upstreams[u].latency[k]);
            sum_us += AGW_M_GET(w[i]->upstreams[u].latency_sum_us);
        }
        agw_prom_label_t l = AGW_PROM_LABEL("upstream", lb->upstreams[u]);
        agw_prom_histogram(b, "aggway_upstream_call_duration_seconds", &l, 1, CALL_BOUNDS_MS, AGW_M_CALL_BOUNDS, 1000.0,
                           counts, (double)sum_us / 1e6);
    }
    agw_prom_family(b, "aggway_upstream_calls_in_flight", "gauge", "Upstream calls started and not yet ended.");
    for (size_t u = 0; u < nu; u++) {
        uint64_t started = 0, ended = 0;
        for (size_t i = 0; i < nw; i++) {
            started += AGW_M_GET(w[i]->upstreams[u].started);
            ended += AGW_M_GET(w[i]->upstreams[u].ended);
        }
        agw_prom_label_t l = AGW_PROM_LABEL("upstream", lb->upstreams[u]);
        agw_prom_sample_u64(b, "aggway_upstream_calls_in_flight", &l, 1, started > ended ? started - ended : 0);
    }
#define UCOUNTER(name, type, help, field) \
    render_upstream_counter(b, lb, nu, w, nw, name, type, help, offsetof(agw_upstream_metrics_t, field))
    UCOUNTER("aggway_upstream_pool_connections", "gauge",
             "Connections open to the upstream (idle, busy and connecting), over every worker's pool.", pool_open);
    UCOUNTER("aggway_upstream_pool_idle_connections", "gauge", "Idle keep-alive connections in the pools.", pool_idle);
    UCOUNTER("aggway_upstream_pool_waiting_calls", "gauge", "Calls waiting for a free connection (max_pending bounds them).",
             pool_pending);
    UCOUNTER("aggway_upstream_retries_total", "counter", "Retries started (published by each worker once a second).",
             retries);
    UCOUNTER("aggway_upstream_retries_denied_total", "counter",
             "Retries not made because the retry budget was spent (published once a second).", retries_denied);
    UCOUNTER("aggway_upstream_hedges_total", "counter", "Hedged second attempts started (published once a second).",
             hedges);
    UCOUNTER("aggway_upstream_hedges_won_total", "counter",
             "Hedged attempts whose answer was used (published once a second).", hedges_won);
    UCOUNTER("aggway_upstream_collapsed_total", "counter",
             "Calls that shared an identical call in flight instead of making their own (published once a second).",
             collapsed);
#undef UCOUNTER
    agw_prom_family(b, "aggway_upstream_breaker_state", "gauge",
                    "Circuit breaker of the upstream, shared by every worker: 0 closed, 1 open, 2 half-open.");
    for (size_t u = 0; u < nu; u++) {
        if (!bs[u].present)
            continue;
        agw_prom_label_t l = AGW_PROM_LABEL("upstream", lb->upstreams[u]);
        agw_prom_sample_u64(b, "aggway_upstream_breaker_state", &l, 1, (uint64_t)bs[u].state);
    }
    agw_prom_family(b, "aggway_upstream_breaker_transitions_total", "counter",
                    "Times the breaker opened (to=\"open\") and closed again after a successful probe (to=\"closed\").");
    for (size_t u = 0; u < nu; u++) {
        if (!bs[u].present)
            continue;
        agw_prom_label_t l[2] = {AGW_PROM_LABEL("upstream", lb->upstreams[u]), AGW_PROM_LABEL("to", "open")};
        agw_prom_sample_u64(b, "aggway_upstream_breaker_transitions_total", l, 2, bs[u].opened);
        l[1] = AGW_PROM_LABEL("to", "closed");
        agw_prom_sample_u64(b, "aggway_upstream_breaker_transitions_total", l, 2, bs[u].closed);
    }
    free(bs);
}

const char *agw_metrics_cache_outcome(size_t i)
{
    static const char *names[AGW_M_CACHE_OUTCOMES] = {"hit", "miss", "stale", "stale_if_error", "refresh", "negative"};
    return i < AGW_M_CACHE_OUTCOMES ? names[i] : "?";
}

/* The cache's lookups by outcome, tier 1's size, and the Redis clients (summed over the workers). */
static void render_cache(agw_buf_t *b, agw_metrics_t *const *w, size_t nw)
{
    agw_prom_family(b, "aggway_cache_lookups_total", "counter",
                    "Cached calls by outcome: hit (fresh), miss (went upstream), stale (served within swr_s), "
                    "stale_if_error (served stale because the call failed), refresh (background refreshes started), "
                    "negative (404 answers kept).");
    for (size_t k = 0; k < AGW_M_CACHE_OUTCOMES; k++) {
        uint64_t n = 0;
        for (size_t i = 0; i < nw; i++)
            n += AGW_M_GET(w[i]->cache[k]);
        agw_prom_label_t l = AGW_PROM_LABEL("outcome", agw_metrics_cache_outcome(k));
        agw_prom_sample_u64(b, "aggway_cache_lookups_total", &l, 1, n);
    }
    uint64_t bytes = 0, entries = 0, evictions = 0;
    agw_redis_stats_t r = {0};
    uint64_t lat[8] = {0};
    for (size_t i = 0; i < nw; i++) {
        bytes += AGW_M_GET(w[i]->lru.bytes);
        entries += AGW_M_GET(w[i]->lru.entries);
        evictions += AGW_M_GET(w[i]->lru.evictions);
        r.commands += AGW_M_GET(w[i]->redis.commands);
        r.errors += AGW_M_GET(w[i]->redis.errors);
        r.timeouts += AGW_M_GET(w[i]->redis.timeouts);
        r.replies += AGW_M_GET(w[i]->redis.replies);
        r.latency_us_sum += AGW_M_GET(w[i]->redis.latency_us_sum);
        r.up += AGW_M_GET(w[i]->redis.up);
        for (size_t k = 0; k < 8; k++)
            lat[k] += AGW_M_GET(w[i]->redis.latency[k]);
    }
    agw_prom_family(b, "aggway_cache_memory_bytes", "gauge", "Bytes held by the in-process cache tier (all workers).");
    agw_prom_sample_u64(b, "aggway_cache_memory_bytes", NULL, 0, bytes);
    agw_prom_family(b, "aggway_cache_entries", "gauge", "Entries in the in-process cache tier (all workers).");
    agw_prom_sample_u64(b, "aggway_cache_entries", NULL, 0, entries);
    agw_prom_family(b, "aggway_cache_evictions_total", "counter",
                    "Entries dropped from the in-process tier to make room (least recently used first).");
    agw_prom_sample_u64(b, "aggway_cache_evictions_total", NULL, 0, evictions);
    agw_prom_family(b, "aggway_redis_commands_total", "counter", "Redis commands asked for (sent or refused).");
    agw_prom_sample_u64(b, "aggway_redis_commands_total", NULL, 0, r.commands);
    agw_prom_family(b, "aggway_redis_errors_total", "counter",
                    "Redis commands that failed: error reply, timeout, connection lost or not connected.");
    agw_prom_sample_u64(b, "aggway_redis_errors_total", NULL, 0, r.errors);
    agw_prom_family(b, "aggway_redis_timeouts_total", "counter", "Redis commands that got no answer within redis.timeout_ms.");
    agw_prom_sample_u64(b, "aggway_redis_timeouts_total", NULL, 0, r.timeouts);
    agw_prom_family(b, "aggway_redis_connected", "gauge", "Workers whose Redis connection is ready.");
    agw_prom_sample_u64(b, "aggway_redis_connected", NULL, 0, r.up);
    static const double bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01};
    agw_prom_family(b, "aggway_redis_latency_seconds", "histogram", "Time from sending a Redis command to its answer.");
    agw_prom_histogram(b, "aggway_redis_latency_seconds", NULL, 0, bounds, 7, 1.0, lat, (double)r.latency_us_sum / 1e6);
}

void agw_metrics_render(agw_buf_t *b, const agw_metric_labels_t *labels, const agw_config_t *conf,
                        agw_metrics_t *const *workers, size_t num_workers, const agw_metrics_process_t *proc)
{
    agw_prom_family(b, "aggway_ready", "gauge", "1 while the gateway serves (as /readyz), 0 while it starts or stops.");
    agw_prom_sample_u64(b, "aggway_ready", NULL, 0, proc->ready ? 1 : 0);
    agw_prom_family(b, "aggway_workers", "gauge", "Worker threads.");
    agw_prom_sample_u64(b, "aggway_workers", NULL, 0, num_workers);
    agw_prom_family(b, "aggway_generation", "gauge",
                    "Generation of the scripts folder serving new requests (1 as started, +1 per successful reload; "
                    "0 before the first is loaded).");
    agw_prom_sample_u64(b, "aggway_generation", NULL, 0, proc->generation);
    agw_prom_family(b, "aggway_generations_live", "gauge",
                    "Generations loaded and not yet freed: the one serving plus old ones still finishing requests.");
    agw_prom_sample_u64(b, "aggway_generations_live", NULL, 0, proc->generations_live);
    agw_prom_family(b, "aggway_reloads_total", "counter",
                    "Reloads (SIGHUP) that put a new generation of the scripts folder in service.");
    agw_prom_sample_u64(b, "aggway_reloads_total", NULL, 0, proc->reloads);
    agw_prom_family(b, "aggway_reload_failures_total", "counter",
                    "Reloads that failed (a script or gateway.lua did not load or check); the old generation kept "
                    "serving. The reasons are in the log and on the admin /reload page.");
    agw_prom_sample_u64(b, "aggway_reload_failures_total", NULL, 0, proc->reload_failures);
    agw_prom_family(b, "aggway_reload_last_success", "gauge", "0 when the last reload failed, else 1.");
    agw_prom_sample_u64(b, "aggway_reload_last_success", NULL, 0, proc->last_reload_ok ? 1 : 0);
    agw_prom_family(b, "aggway_reload_last_time_seconds", "gauge",
                    "When the last reload was tried, seconds since the Unix epoch (0: never).");
    agw_prom_sample(b, "aggway_reload_last_time_seconds", NULL, 0, proc->last_reload_time);
    agw_prom_family(b, "aggway_start_time_seconds", "gauge", "When the gateway started, seconds since the Unix epoch.");
    agw_prom_sample(b, "aggway_start_time_seconds", NULL, 0, proc->start_time);
    agw_prom_family(b, "aggway_admin_connections_evicted_total", "counter",
                    "Admin listener connections closed before their request came, to make room for a new one (64 "
                    "open): clients holding connections, which would otherwise keep the probes out.");
    agw_prom_sample_u64(b, "aggway_admin_connections_evicted_total", NULL, 0, proc->admin_evicted);
    render_requests(b, labels, workers, num_workers);
    render_partials(b, labels, workers, num_workers);
    render_upstreams(b, labels, conf, workers, num_workers);
    render_cache(b, workers, num_workers);
    agw_otlp_render_metrics(b, num_workers ? workers[0]->exporter : NULL);
    uint64_t skipped = 0;
    for (size_t i = 0; i < num_workers; i++)
        if (workers[i]->waterfall)
            skipped += __atomic_load_n(&workers[i]->waterfall->skipped, __ATOMIC_RELAXED);
    agw_prom_family(b, "aggway_waterfall_skipped_total", "counter",
                    "Requests left out of /waterfall because the admin listener was reading the ring at that moment.");
    agw_prom_sample_u64(b, "aggway_waterfall_skipped_total", NULL, 0, skipped);
}
