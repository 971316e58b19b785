/* worker.c: a worker thread: loops, h2o glue, the Lua transport ("agg.core") and upstream calls.
 *
 * Request path: h2o calls agw_worker_on_req -> route match (C) -> runtime.start(rid, …) in Lua.
 * The handler's coroutine calls core.call() for each upstream call; completions call
 * runtime.on_call(); the handler's return value arrives in core.respond(), which encodes the page
 * and hands it to h2o. A request whose client goes away first is noticed by the dispose callback
 * of its memory pool (DESIGN §8), which calls runtime.abort() to cancel its calls.
 *
 * Generations (hot reload, generation.h): the worker runs each generation of the scripts folder
 * in a VM of its own (wgen_t). New requests go to the current one; a request, an upstream call
 * and a runtime timer keep a reference to the generation they started on and finish there. A
 * generation that is no longer current is freed (its VM closed, the pools only it used closed)
 * when its last reference goes.
 */
#include "worker.h"

#include <ctype.h>
#include <errno.h>
#include <ev.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "generation.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "otlp.h"
#include "script.h"
#include "slots.h"
#include "trace.h"
#include "upstream.h"
#include "waterfall.h"

typedef struct listener {
    uv_tcp_t handle;
    h2o_accept_ctx_t accept_ctx;
    agw_worker_t *worker;
} listener_t;

/* An upstream pool of this worker, shared by the generations whose upstream did not change. */
typedef struct wpool {
    agw_pool_t *pool;
    agw_upstream_conf_t conf;   /* the pool's own copy: it may outlive the generation that made it */
    int refs;                   /* generations of this worker that use it */
} wpool_t;

/* A generation as this worker runs it. Worker thread only, once installed. */
typedef struct agw_worker_gen {
    agw_worker_t *w;
    agw_generation_t *gen;      /* the shared part: config, routes, metric slots (one reference) */
    const agw_config_t *conf;   /* &gen->conf */
    lua_State *L;
    int ref_start, ref_on_call, ref_abort, ref_on_timer; /* runtime functions in the registry */
    int ref_report_stats;       /* runtime.report_stats, or LUA_NOREF */
    wpool_t **pools;            /* one per upstream, same index as conf->upstreams; NULL until installed */
    uint64_t *reported;         /* per upstream: the runtime's 5 totals as last published (metrics) */
    int refs;                   /* requests, calls, timers, deferred aborts, +1 while current */
    struct agw_worker_gen *next, *prev; /* the worker's live generations (or its list of dead ones) */
} wgen_t;

/* The part of a request that lives in its h2o pool; rid is 0 once a response was sent. */
typedef struct reqref {
    agw_worker_t *w;
    wgen_t *g;          /* the generation it runs on (holds a reference) */
    uint64_t rid;
    h2o_req_t *req;
    ev_io client_watch; /* HTTP/1: notices the client closing while the page is being built */
    int watching;       /* client_watch is started */
    int watch_fd;       /* HTTP/1: the client's socket, -1 when there is nothing to watch */
    struct reqref *watch_next, *watch_prev; /* queued for a watch (worker's watch_queue), oldest first */
    int endpoint;       /* 1-based endpoint index (metrics, access log) */
    double started;     /* ev_now() when the request arrived */
    char *logline;      /* access log on: "METHOD\0path" copied at arrival (the request may be gone
                           by the time a client that left is logged) */
    agw_trace_t *trace; /* the request's spans (trace.h), until the request is recorded */
    const char *tracestate; /* the incoming tracestate to pass on (valid, in the request's memory), or NULL */
    size_t tracestate_len;
} reqref_t;

/* A runtime timer (retry backoff, hedge, a collapsed caller's own timeout). */
typedef struct wtimer {
    ev_timer ev;
    wgen_t *g;          /* holds a reference */
    uint64_t id;
} wtimer_t;

/* One upstream call in flight. */
typedef struct wcall {
    wgen_t *g;          /* the generation that made the call (holds a reference) */
    uint64_t id;
    agw_call_t *call;
    int decode;
    unsigned up;        /* upstream index, 0-based */
    uint64_t rid;       /* the request that made the call (its span is there while it lasts) */
    int span;           /* the call's span in that request's trace, -1 when none */
    struct sf_joiner *joiners; /* requests waiting on this call through single-flight (core.join) */
    struct wcall *next_free;
} wcall_t;

/* A request that shares another request's call (single-flight) and has a span waiting on it. */
typedef struct sf_joiner {
    uint64_t rid;
    int span;
    struct sf_joiner *next;
} sf_joiner_t;

struct agw_worker {
    int id;
    pthread_t thread;
    struct ev_loop *loop;
    uv_loop_t uvloop;
    ev_io uv_io;
    ev_timer uv_timer;
    ev_prepare uv_prepare;
    ev_async stop_async;
    ev_async drain_async;                  /* agw_worker_drain(): close the listeners */
    int draining;                          /* set by on_drain, read on this thread only */
    int inflight;                          /* requests handed to the runtime and not yet disposed
                                              (atomic: the main thread reads it while draining) */
    h2o_context_t ctx;
    listener_t *listeners;
    size_t num_listeners;
    wgen_t *cur;                           /* the generation new requests go to */
    wgen_t *gens;                          /* every live generation of this worker (cur included) */
    wgen_t *dead;                          /* generations to free once no Lua code runs */
    ev_async reload_async;                 /* agw_worker_install(): take `next` */
    pthread_mutex_t next_lock;
    wgen_t *next;                          /* prepared on the main thread, not yet taken (next_lock) */
    uint64_t serving;                      /* number of cur's generation (atomic: the main thread reads it) */
    agw_slots_t timers;                    /* timer id -> wtimer_t */
    uint64_t rng;                          /* xorshift state for core.random() */
    agw_slots_t reqs;                      /* rid -> reqref_t */
    agw_slots_t calls;                     /* call id -> wcall_t */
    wcall_t *free_calls;
    int lua_depth;                         /* > 0 while C code runs inside Lua */
    struct pending_abort {
        uint64_t rid;
        wgen_t *g;                         /* holds a reference until the abort ran */
    } *pending_aborts;                     /* requests whose client left while Lua was running */
    size_t num_pending_aborts, cap_pending_aborts;
    agw_buf_t out;                         /* scratch for encoding responses */
    agw_buf_t hdrs;                        /* scratch for upstream response headers */
    agw_metrics_t *m;                      /* this worker's counters (metrics.h); the admin thread reads them */
    ev_timer stats_timer;                  /* once a second: runtime counters and pool gauges into m */
    int access_fd;                         /* access log, -1 when off */
    agw_buf_t alog;                        /* access log lines not yet written */
    ev_timer alog_timer;                   /* writes alog out shortly after its first line */
    long alog_sec;                         /* the second alog_stamp was formatted for */
    char alog_stamp[96];                   /* {"time":"2026-01-31T12:34:56. */
    uint64_t trace_rng;                    /* xorshift state for trace and span ids (trace.h) */
    agw_trace_t *free_traces;              /* trace records to reuse */
    int waterfall_on;                      /* an admin listener shows the waterfall (restart-only):
                                              without one, no request is recorded for it */
    struct reqref *watch_head, *watch_tail; /* HTTP/1 requests not yet watched for the client leaving,
                                              in arrival order (see watch_client) */
    ev_timer watch_timer;                  /* due when the oldest of them is CLIENT_WATCH_DELAY old */
};

/* ---- loops: libuv (h2o) embedded in libev -------------------------------------------------- */

static void run_uv(agw_worker_t *w)
{
    uv_run(&w->uvloop, UV_RUN_NOWAIT);
}

static void on_uv_io(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop, (void)revents;
    run_uv(io->data);
}

static void on_uv_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    run_uv(t->data);
}

/* Before libev sleeps: run what libuv has due now, then arm a timer for libuv's next deadline. */
static void on_prepare(struct ev_loop *loop, ev_prepare *p, int revents)
{
    (void)revents;
    agw_worker_t *w = p->data;
    int timeout, rounds = 0;
    while ((timeout = uv_backend_timeout(&w->uvloop)) == 0 && rounds++ < 4)
        run_uv(w);
    ev_timer_stop(loop, &w->uv_timer);
    if (timeout >= 0) {
        ev_timer_set(&w->uv_timer, timeout / 1000.0, 0.);
        ev_timer_start(loop, &w->uv_timer);
    }
}

static void on_stop(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)a, (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

static void on_listener_closed(uv_handle_t *h)
{
    (void)h; /* the handle lives in w->listeners, freed with the worker */
}

/* Graceful shutdown: stop accepting (the listening sockets close, so new connections are refused
 * once every worker closed its own) and ask h2o to wind the open connections down (HTTP/2 GOAWAY,
 * no keep-alive for HTTP/1); requests in flight go on. */
static void on_drain(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = a->data;
    if (w->draining)
        return;
    w->draining = 1;
    for (size_t i = 0; i < w->num_listeners; i++)
        if (!uv_is_closing((uv_handle_t *)&w->listeners[i].handle))
            uv_close((uv_handle_t *)&w->listeners[i].handle, on_listener_closed);
    h2o_context_request_shutdown(&w->ctx);
}

/* ---- Lua entry ------------------------------------------------------------------------------ */

static void process_pending_aborts(agw_worker_t *w);
static void stop_client_watch(reqref_t *rr);
static void free_dead_gens(agw_worker_t *w);

/* ---- generations ---------------------------------------------------------------------------- */

static void gen_hold(wgen_t *g)
{
    g->refs++;
}

static void pool_release(wpool_t *p)
{
    if (p == NULL || --p->refs > 0)
        return;
    agw_pool_destroy(p->pool);
    agw_upstream_conf_clear(&p->conf);
    free(p);
}

/* Frees a generation that was never installed (a reload that failed in another worker, or one
 * replaced before this worker took it): nothing but its VM and its reference exist. */
static void gen_discard(wgen_t *g)
{
    if (g->L)
        lua_close(g->L);
    agw_generation_unref(g->gen);
    free(g->reported);
    free(g);
}

/* Frees an installed generation nobody uses any more (already off the live list): its last
 * runtime counters are published, its VM closed, the pools it alone used closed. */
static void gen_free(wgen_t *g)
{
    if (g->ref_report_stats != LUA_NOREF) {
        lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_report_stats);
        if (lua_pcall(g->L, 0, 0, 0) != 0)
            lua_pop(g->L, 1);
    }
    for (size_t i = 0; i < g->conf->num_upstreams; i++)
        pool_release(g->pools[i]);
    free(g->pools);
    gen_discard(g);
}

/* Drops a reference; the last one frees g, or queues it to be freed once the Lua code running
 * now (of any generation) has returned. */
static void gen_release(wgen_t *g)
{
    if (--g->refs > 0)
        return;
    agw_worker_t *w = g->w;
    if (g->prev)
        g->prev->next = g->next;
    else
        w->gens = g->next;
    if (g->next)
        g->next->prev = g->prev;
    g->prev = NULL;
    if (w->lua_depth == 0) {
        g->next = NULL;
        gen_free(g);
        return;
    }
    g->next = w->dead;
    w->dead = g;
}

static void free_dead_gens(agw_worker_t *w)
{
    while (w->dead) {
        wgen_t *g = w->dead;
        w->dead = g->next;
        gen_free(g);
    }
}

/* Makes g (prepared by agw_worker_prepare) the generation new requests go to: its pools are the
 * current generation's for upstreams that did not change (keep-alive connections survive), new
 * ones for the others. The previous generation is freed once its requests are done. */
static void gen_activate(agw_worker_t *w, wgen_t *g)
{
    const agw_config_t *conf = g->conf;
    wgen_t *old = w->cur;
    g->pools = calloc(conf->num_upstreams ? conf->num_upstreams : 1, sizeof(*g->pools));
    if (g->pools == NULL)
        abort();
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        for (size_t j = 0; old && j < old->conf->num_upstreams; j++) {
            wpool_t *p = old->pools[j];
            if (agw_upstream_conf_same(&p->conf, &conf->upstreams[i])) {
                p->refs++;
                g->pools[i] = p;
                break;
            }
        }
        if (g->pools[i] == NULL) {
            wpool_t *p = calloc(1, sizeof(*p));
            if (p == NULL)
                abort();
            agw_upstream_conf_copy(&p->conf, &conf->upstreams[i]);
            if ((p->pool = agw_pool_create(w->loop, &p->conf)) == NULL)
                abort();
            p->refs = 1;
            g->pools[i] = p;
        }
    }
    g->refs = 1; /* current */
    g->prev = NULL;
    g->next = w->gens;
    if (w->gens)
        w->gens->prev = g;
    w->gens = g;
    w->cur = g;
    __atomic_store_n(&w->serving, g->gen->number, __ATOMIC_RELEASE);
    if (old)
        gen_release(old);
}

/* agw_worker_install(): the main thread left a prepared generation in w->next. */
static void on_reload(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = a->data;
    pthread_mutex_lock(&w->next_lock);
    wgen_t *g = w->next;
    w->next = NULL;
    pthread_mutex_unlock(&w->next_lock);
    if (g)
        gen_activate(w, g);
}

/* ---- Lua entry ------------------------------------------------------------------------------ */

/* Calls the runtime function of generation g already pushed with nargs arguments after it.
 * Returns 0, or -1 when the runtime raised (a gateway bug, logged; script errors never get here). */
static int call_runtime(wgen_t *g, int nargs)
{
    agw_worker_t *w = g->w;
    lua_State *L = g->L;
    int rc = 0;
    w->lua_depth++;
    if (lua_pcall(L, nargs, 0, 0) != 0) {
        agw_log(AGW_LOG_ERROR, "worker %d: runtime error: %s", w->id, lua_tostring(L, -1));
        lua_pop(L, 1);
        rc = -1;
    }
    w->lua_depth--;
    if (w->lua_depth == 0 && w->num_pending_aborts)
        process_pending_aborts(w);
    if (w->lua_depth == 0 && w->dead)
        free_dead_gens(w);
    return rc;
}

static void abort_request(wgen_t *g, uint64_t rid)
{
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_abort);
    lua_pushnumber(g->L, (lua_Number)rid);
    call_runtime(g, 1);
}

static void process_pending_aborts(agw_worker_t *w)
{
    while (w->num_pending_aborts) {
        struct pending_abort pa = w->pending_aborts[--w->num_pending_aborts];
        abort_request(pa.g, pa.rid);
        gen_release(pa.g);
    }
}

/* ---- responses ------------------------------------------------------------------------------ */

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
    }
}

static int valid_header_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || strchr("!#$%&'*+-.^_`|~", c)) || isupper(c))
            return 0;
    }
    return 1;
}

static int valid_header_value(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
            return 0;
    return 1;
}

static void add_header(h2o_req_t *req, const char *name, size_t nlen, const char *value, size_t vlen)
{
    char *n = h2o_mem_alloc_pool(&req->pool, nlen + 1);
    memcpy(n, name, nlen);
    n[nlen] = '\0';
    char *v = h2o_mem_alloc_pool(&req->pool, vlen + 1);
    memcpy(v, value, vlen);
    v[vlen] = '\0';
    h2o_add_header_by_str(&req->pool, &req->res.headers, n, nlen, 1, NULL, v, vlen);
}

/* Sends an RFC 9457 problem built in C (routing errors, runtime failures). */
typedef struct section_ref section_ref_t;
static void record_c_response(agw_worker_t *w, h2o_req_t *req, int endpoint, int status, size_t bytes);
static void record_request(agw_worker_t *w, reqref_t *rr, int status, size_t bytes, const section_ref_t *secs,
                           size_t nsecs, const char *timing, size_t tlen);

/* Counts and logs the problem as the response of rr, or (rr NULL) of a request that never reached
 * the runtime, for endpoint (0: no route matched). */
static void send_problem(agw_worker_t *w, h2o_req_t *req, reqref_t *rr, int endpoint, int status, const char *kind,
                         const char *title, const char *detail)
{
    agw_buf_t *b = &w->out;
    agw_buf_reset(b);
    agw_buf_printf(b, "{\"type\":\"urn:aggway:problem:%s\",\"title\":", kind);
    agw_json_encode_string(b, title, strlen(title));
    agw_buf_printf(b, ",\"status\":%d", status);
    if (detail) {
        agw_buf_puts(b, ",\"detail\":");
        agw_json_encode_string(b, detail, strlen(detail));
    }
    agw_buf_putc(b, '}');
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("application/problem+json"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-store"));
    req->res.content_length = b->len;
    if (rr)
        record_request(w, rr, status, b->len, NULL, 0, NULL, 0);
    else
        record_c_response(w, req, endpoint, status, b->len);
    h2o_send_inline(req, b->base, b->len);
}

/* ---- tracing (trace.h): the request's span, one per upstream attempt ------------------------ */

static uint64_t now_us(agw_worker_t *w)
{
    return (uint64_t)(ev_now(w->loop) * 1e6); /* libev's loop time is the wall clock */
}

/* Starts rr's trace from the request's traceparent and tracestate headers (W3C Trace Context
 * §3.2, §3.3): a valid traceparent (exactly one) continues its trace and its tracestate (every
 * tracestate header, joined with ',') goes on if valid; anything else starts a new trace. */
static void trace_begin(agw_worker_t *w, reqref_t *rr, h2o_req_t *req, size_t path_len)
{
    const h2o_iovec_t *tp = NULL, *ts = NULL;
    int num_tp = 0, num_ts = 0;
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        if (h->name->len == 11 && h2o_lcstris(h->name->base, 11, H2O_STRLIT("traceparent")))
            tp = &h->value, num_tp++;
        else if (h->name->len == 10 && h2o_lcstris(h->name->base, 10, H2O_STRLIT("tracestate")))
            ts = ts ? ts : &h->value, num_ts++;
    }
    rr->tracestate = NULL;
    rr->tracestate_len = 0;
    agw_trace_t *tr = w->free_traces;
    if (tr)
        w->free_traces = tr->next;
    else if ((tr = malloc(sizeof(*tr))) == NULL)
        return; /* no trace for this request: its calls still get a traceparent of their own */
    agw_traceparent_t parent;
    int continued = num_tp == 1 && agw_traceparent_parse(tp->base, tp->len, &parent) == 0;
    agw_trace_begin(tr, &w->trace_rng, continued ? &parent : NULL, now_us(w), req->method.base, req->method.len,
                    req->path.base, path_len);
    tr->endpoint = (int)rr->g->gen->route_slot[rr->endpoint]; /* names that outlive the generation */
    tr->worker = w->id;
    rr->trace = tr;
    if (!continued || num_ts == 0) /* §3.3: tracestate goes with the traceparent it came with */
        return;
    const char *v = ts->base;
    size_t vlen = ts->len;
    if (num_ts > 1) { /* RFC 9110 §5.3: several field lines are one comma-separated list */
        size_t total = 0;
        for (size_t i = 0; i < req->headers.size; i++)
            if (req->headers.entries[i].name->len == 10 &&
                h2o_lcstris(req->headers.entries[i].name->base, 10, H2O_STRLIT("tracestate")))
                total += req->headers.entries[i].value.len + 1;
        if (total > AGW_TRACESTATE_MAX_LEN + 1)
            return;
        char *joined = h2o_mem_alloc_pool(&req->pool, total);
        vlen = 0;
        for (size_t i = 0; i < req->headers.size; i++) {
            const h2o_header_t *h = &req->headers.entries[i];
            if (h->name->len == 10 && h2o_lcstris(h->name->base, 10, H2O_STRLIT("tracestate"))) {
                if (vlen)
                    joined[vlen++] = ',';
                memcpy(joined + vlen, h->value.base, h->value.len);
                vlen += h->value.len;
            }
        }
        v = joined;
    }
    while (vlen && (v[0] == ' ' || v[0] == '\t')) /* OWS around a field value is not part of it */
        v++, vlen--;
    while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;
    if (agw_tracestate_valid(v, vlen)) {
        rr->tracestate = v;
        rr->tracestate_len = vlen;
    }
}

/* Ends the span of call c and of every request that shared it (on_call_done, core.cancel). */
static void trace_call_ended(agw_worker_t *w, wcall_t *c, unsigned outcome, int http_status)
{
    uint64_t t = now_us(w);
    reqref_t *rr = c->span >= 0 ? agw_slots_get(&w->reqs, c->rid) : NULL;
    if (rr && rr->trace)
        agw_trace_end_span(rr->trace, c->span, outcome, http_status, t);
    while (c->joiners) {
        sf_joiner_t *j = c->joiners;
        c->joiners = j->next;
        reqref_t *jr = agw_slots_get(&w->reqs, j->rid);
        if (jr && jr->trace)
            agw_trace_end_span(jr->trace, j->span, outcome, http_status, t);
        free(j);
    }
}

/* Request rr ended with status: its trace goes into the waterfall ring (when an admin listener
 * can show it) and, when a collector is configured and the trace is sampled, to the exporter;
 * otherwise it is kept for reuse. Unsampled traces (an incoming traceparent with the sampled flag
 * off) are not exported. */
static void trace_request_ended(agw_worker_t *w, reqref_t *rr, int status)
{
    agw_trace_t *tr = rr->trace;
    rr->trace = NULL;
    agw_trace_finish(tr, status, now_us(w));
    if (w->waterfall_on)
        agw_waterfall_record(w->m->waterfall, tr);
    if (w->m->trace_queue && (tr->flags & AGW_TRACE_FLAG_SAMPLED) && agw_otlp_submit(w->m->trace_queue, tr) == 0)
        return;
    tr->next = w->free_traces;
    w->free_traces = tr;
}

/* ---- metrics and the access log ------------------------------------------------------------ */

#define ALOG_FLUSH_BYTES (64 * 1024)
#define ALOG_MAX_SECTIONS 64

/* The pool gauges of generation g's upstream up (0-based). */
static void publish_pool(wgen_t *g, size_t up)
{
    agw_pool_stats_t st;
    agw_pool_stats(g->pools[up]->pool, &st);
    agw_upstream_metrics_t *u = &g->w->m->upstreams[g->gen->upstream_slot[up]];
    AGW_M_SET(u->pool_open, st.open);
    AGW_M_SET(u->pool_idle, st.idle);
    AGW_M_SET(u->pool_pending, st.pending);
}

static agw_metric_outcome_t metric_outcome(const agw_call_result_t *res, int bad_json)
{
    switch (res->outcome) {
    case AGW_CALL_OK:
        if (res->http_status >= 500)
            return AGW_OUT_5XX;
        if (res->http_status >= 400)
            return AGW_OUT_4XX;
        return bad_json ? AGW_OUT_BAD_RESPONSE : AGW_OUT_OK;
    case AGW_CALL_REFUSED: return AGW_OUT_REFUSED;
    case AGW_CALL_CONNECT_TIMEOUT:
    case AGW_CALL_TIMEOUT: return AGW_OUT_TIMEOUT;
    case AGW_CALL_RESET: return AGW_OUT_RESET;
    case AGW_CALL_OVERLOAD: return AGW_OUT_OVERLOAD;
    case AGW_CALL_BAD_REQUEST: return AGW_OUT_INVALID_REQUEST;
    case AGW_CALL_TLS: return AGW_OUT_TLS;
    default: return AGW_OUT_BAD_RESPONSE; /* truncated, bad_response, too_large */
    }
}

static void alog_flush(agw_worker_t *w)
{
    size_t off = 0;
    while (off < w->alog.len) {
        ssize_t n = write(w->access_fd, w->alog.base + off, w->alog.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the disk is full or the pipe closed: drop these lines rather than wait */
        off += (size_t)n;
    }
    agw_buf_reset(&w->alog);
    ev_timer_stop(w->loop, &w->alog_timer);
}

static void on_alog_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    alog_flush(t->data);
}

/* Appends s as a JSON string: plain printable ASCII is copied as is; anything else goes through the
 * JSON encoder, and bytes that are not UTF-8 are written as \u00XX. */
static void alog_str(agw_buf_t *b, const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
            break;
        i++;
    }
    if (i == len) {
        agw_buf_reserve(b, len + 2);
        b->base[b->len++] = '"';
        memcpy(b->base + b->len, s, len);
        b->len += len;
        b->base[b->len++] = '"';
        b->base[b->len] = '\0';
        return;
    }
    size_t mark = b->len;
    if (agw_json_encode_string(b, s, len) == 0)
        return;
    b->len = mark;
    agw_buf_putc(b, '"');
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            agw_buf_putc(b, '\\');
            agw_buf_putc(b, (char)c);
        } else if (c < 0x20 || c >= 0x7f) {
            agw_buf_printf(b, "\\u%04x", c);
        } else {
            agw_buf_putc(b, (char)c);
        }
    }
    agw_buf_putc(b, '"');
}

static void alog_lit(agw_buf_t *b, const char *s, size_t len)
{
    agw_buf_append(b, s, len);
}
#define ALOG_LIT(b, s) alog_lit((b), (s), sizeof(s) - 1)

/* Appends an unsigned integer in decimal (no printf on the per-request path). */
static void alog_uint(agw_buf_t *b, uint64_t v)
{
    char tmp[24];
    size_t n = sizeof(tmp);
    do {
        tmp[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    alog_lit(b, tmp + n, sizeof(tmp) - n);
}

/* Appends ms >= 0 with one decimal ("81.8"). */
static void alog_ms(agw_buf_t *b, double ms)
{
    uint64_t tenths = ms > 0 ? (uint64_t)(ms * 10.0 + 0.5) : 0;
    alog_uint(b, tenths / 10);
    char frac[2] = {'.', (char)('0' + tenths % 10)};
    alog_lit(b, frac, 2);
}

/* Finds section name's duration in a Server-Timing value ("a;dur=1.5, b;dur=2.0"), whose names are
 * the section names with characters other than [A-Za-z0-9_-] replaced by '_', and whose durations
 * are JSON numbers already. Returns the digits of the last entry for name (*len set), or NULL. */
static const char *timing_ms(const char *t, size_t tlen, const char *name, size_t nlen, size_t *len)
{
    const char *found = NULL;
    const char *p = t, *end = t + tlen;
    while (p < end) {
        const char *semi = memchr(p, ';', (size_t)(end - p));
        if (semi == NULL)
            break;
        const char *next = memchr(semi, ',', (size_t)(end - semi));
        const char *vend = next ? next : end;
        int same = (size_t)(semi - p) == nlen;
        for (size_t i = 0; same && i < nlen; i++) {
            unsigned char c = (unsigned char)name[i];
            char want = (isalnum(c) || c == '_' || c == '-') && c < 0x80 ? (char)c : '_';
            same = p[i] == want;
        }
        if (same && vend - semi > 5 && memcmp(semi, ";dur=", 5) == 0) {
            found = semi + 5;
            *len = (size_t)(vend - found);
        }
        if (next == NULL)
            break;
        p = next + 1;
        while (p < end && *p == ' ')
            p++;
    }
    return found;
}

struct section_ref {
    const char *name;
    size_t len;
    const char *status;
};

static int section_less(const section_ref_t *x, const section_ref_t *y)
{
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    return c ? c < 0 : x->len < y->len;
}

/* The sections of a page table at idx (section name -> { status = … }), sorted by name. */
static size_t page_sections(lua_State *L, int idx, section_ref_t *out, size_t max)
{
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        if (n < max && lua_type(L, -2) == LUA_TSTRING && lua_istable(L, -1)) {
            lua_pushliteral(L, "status");
            lua_rawget(L, -2);
            if (lua_type(L, -1) == LUA_TSTRING) {
                section_ref_t s;
                s.name = lua_tolstring(L, -3, &s.len);
                s.status = lua_tostring(L, -1); /* interned, and held by the section table */
                size_t j = n++;                 /* insertion sort: a page has a handful of sections */
                while (j > 0 && section_less(&s, &out[j - 1])) {
                    out[j] = out[j - 1];
                    j--;
                }
                out[j] = s;
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    return n;
}

/* One JSON line per request: time, method, path, route, status, duration_ms, bytes, sections
 * (name, status, ms), trace_id. secs: the page's sections (NULL when the response is not a page:
 * the sections are then the Server-Timing entries, without a status). */
static void alog_write(agw_worker_t *w, const char *method, size_t mlen, const char *path, size_t plen,
                       const char *route, int status, double ms, size_t bytes, const section_ref_t *secs, size_t nsecs,
                       const char *timing, size_t tlen, const agw_trace_t *trace)
{
    agw_buf_t *b = &w->alog;
    double now = ev_now(w->loop); /* libev's loop time is the wall clock */
    time_t sec = (time_t)now;
    if (sec != w->alog_sec) {
        struct tm tm;
        gmtime_r(&sec, &tm);
        snprintf(w->alog_stamp, sizeof(w->alog_stamp), "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        w->alog_sec = sec;
    }
    int was_empty = b->len == 0;
    agw_buf_puts(b, w->alog_stamp);
    int msec = (int)((now - (double)sec) * 1000.0);
    if (msec < 0 || msec > 999)
        msec = msec < 0 ? 0 : 999;
    char frac[3] = {(char)('0' + msec / 100), (char)('0' + msec / 10 % 10), (char)('0' + msec % 10)};
    alog_lit(b, frac, 3);
    ALOG_LIT(b, "Z\",\"method\":");
    alog_str(b, method, mlen);
    ALOG_LIT(b, ",\"path\":");
    alog_str(b, path, plen);
    ALOG_LIT(b, ",\"route\":");
    if (route) {
        alog_str(b, route, strlen(route));
    } else {
        ALOG_LIT(b, "null");
    }
    ALOG_LIT(b, ",\"status\":");
    alog_uint(b, status > 0 ? (uint64_t)status : 0);
    ALOG_LIT(b, ",\"duration_ms\":");
    alog_ms(b, ms);
    ALOG_LIT(b, ",\"bytes\":");
    alog_uint(b, bytes);
    ALOG_LIT(b, ",\"sections\":[");
    if (secs) {
        for (size_t i = 0; i < nsecs; i++) {
            if (i)
                agw_buf_putc(b, ',');
            ALOG_LIT(b, "{\"name\":");
            alog_str(b, secs[i].name, secs[i].len);
            ALOG_LIT(b, ",\"status\":");
            alog_str(b, secs[i].status, strlen(secs[i].status));
            size_t dl = 0;
            const char *d = timing ? timing_ms(timing, tlen, secs[i].name, secs[i].len, &dl) : NULL;
            ALOG_LIT(b, ",\"ms\":");
            if (d)
                alog_lit(b, d, dl);
            else
                ALOG_LIT(b, "null");
            agw_buf_putc(b, '}');
        }
    } else if (timing) {
        /* "name;dur=1.5, …": the names are already safe ([A-Za-z0-9_-]) */
        const char *p = timing, *end = timing + tlen;
        int first = 1;
        while (p < end) {
            const char *semi = memchr(p, ';', (size_t)(end - p));
            if (semi == NULL)
                break;
            const char *next = memchr(semi, ',', (size_t)(end - semi));
            const char *vend = next ? next : end;
            ALOG_LIT(b, first ? "{\"name\":" : ",{\"name\":");
            alog_str(b, p, (size_t)(semi - p));
            ALOG_LIT(b, ",\"status\":null,\"ms\":");
            if (vend - semi > 5 && memcmp(semi, ";dur=", 5) == 0)
                alog_lit(b, semi + 5, (size_t)(vend - semi - 5));
            else
                ALOG_LIT(b, "null");
            agw_buf_putc(b, '}');
            first = 0;
            if (next == NULL)
                break;
            p = next + 1;
            while (p < end && *p == ' ')
                p++;
        }
    }
    if (trace) {
        char tid[32];
        agw_trace_hex(tid, trace->trace_id, 16);
        ALOG_LIT(b, "],\"trace_id\":\"");
        alog_lit(b, tid, 32);
        ALOG_LIT(b, "\"}\n");
    } else {
        ALOG_LIT(b, "],\"trace_id\":null}\n");
    }
    if (b->len >= ALOG_FLUSH_BYTES)
        alog_flush(w);
    else if (was_empty)
        ev_timer_start(w->loop, &w->alog_timer);
}

/* Route pattern of endpoint (1-based) in generation g, NULL for 0 (no route matched). */
static const char *route_of(const wgen_t *g, int endpoint)
{
    if (endpoint > 0 && (size_t)endpoint <= g->conf->num_endpoints)
        return g->conf->endpoints[endpoint - 1].route;
    return NULL;
}

/* A response produced in C before the request reached the runtime (no route, bad framing) is
 * counted and logged; it was routed by the current generation. */
static void record_c_response(agw_worker_t *w, h2o_req_t *req, int endpoint, int status, size_t bytes)
{
    const wgen_t *g = w->cur;
    agw_metrics_request(w->m, (int)g->gen->route_slot[endpoint], status, 0, bytes);
    if (w->access_fd >= 0)
        alog_write(w, req->method.base, req->method.len, req->path.base, req->path.len, route_of(g, endpoint), status,
                   0, bytes, NULL, 0, NULL, 0, NULL);
}

/* Request rr ends with status (a response, or 499 when the client left first). */
static void record_request(agw_worker_t *w, reqref_t *rr, int status, size_t bytes, const section_ref_t *secs,
                           size_t nsecs, const char *timing, size_t tlen)
{
    double ms = (ev_now(w->loop) - rr->started) * 1000.0;
    AGW_M_ADD(w->m->requests_ended, 1);
    agw_metrics_request(w->m, (int)rr->g->gen->route_slot[rr->endpoint], status, ms, bytes);
    if (rr->logline) {
        size_t mlen = strlen(rr->logline);
        const char *path = rr->logline + mlen + 1;
        alog_write(w, rr->logline, mlen, path, strlen(path), route_of(rr->g, rr->endpoint), status, ms, bytes, secs,
                   nsecs, timing, tlen, rr->trace);
        free(rr->logline);
        rr->logline = NULL;
    }
    if (rr->trace)
        trace_request_ended(w, rr, status);
}

/* ---- the "agg.core" transport for the runtime ----------------------------------------------- */

/* The generation whose VM runs this core.* function (its upvalue). */
static wgen_t *upg(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

static agw_worker_t *upw(lua_State *L)
{
    return upg(L)->w;
}

static int l_now(lua_State *L)
{
    agw_worker_t *w = upw(L);
    lua_pushnumber(L, ev_now(w->loop) * 1000.0);
    return 1;
}

/* Headers go to Lua as one string "name\0value\0…" with lowercased names; the runtime makes a
 * table of it only when a script reads req.headers or result.headers. */
static void append_header(agw_buf_t *b, const char *name, size_t name_len, const char *value, size_t value_len)
{
    agw_buf_reserve(b, name_len + value_len + 2);
    for (size_t j = 0; j < name_len; j++)
        b->base[b->len++] = (char)tolower((unsigned char)name[j]);
    b->base[b->len++] = '\0';
    memcpy(b->base + b->len, value, value_len);
    b->len += value_len;
    b->base[b->len++] = '\0';
}

/* The header block of a response ("name\0value\0…") in w->hdrs. */
static agw_buf_t *header_block(agw_worker_t *w, const agw_header_t *h, size_t n)
{
    agw_buf_t *b = &w->hdrs;
    agw_buf_reset(b);
    for (size_t i = 0; i < n; i++)
        append_header(b, h[i].name, h[i].name_len, h[i].value, h[i].value_len);
    return b;
}

static void push_headers(agw_worker_t *w, lua_State *L, const agw_header_t *h, size_t n)
{
    agw_buf_t *b = header_block(w, h, n);
    lua_pushlstring(L, b->base ? b->base : "", b->len);
}

static void on_call_done(agw_call_t *call, const agw_call_result_t *res, void *data)
{
    (void)call;
    wcall_t *c = data;
    wgen_t *g = c->g; /* the call's reference is dropped once the runtime has seen the answer */
    agw_worker_t *w = g->w;
    lua_State *L = g->L;
    uint64_t id = c->id;
    int decode = c->decode;
    unsigned up = c->up;
    trace_call_ended(w, c, res->outcome, res->http_status);
    agw_slots_del(&w->calls, id);
    c->next_free = w->free_calls;
    w->free_calls = c;

    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_on_call);
    lua_pushnumber(L, (lua_Number)id);
    lua_pushstring(L, agw_call_outcome_name(res->outcome));
    lua_pushinteger(L, res->http_status);
    /* a 2xx JSON body is only validated here (DESIGN §2.3 limits); it becomes Lua tables when a
     * script reads it, and goes into the page as text when none does. Its raw ref also serves
     * result.body, so the body is not copied twice. */
    int json_body = res->outcome == AGW_CALL_OK && decode && res->http_status >= 200 && res->http_status < 300 &&
                    res->body_len > 0;
    char err[256];
    int compact = 0;
    if (json_body && agw_json_validate(res->body, res->body_len, AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) != 0)
        json_body = -1; /* not JSON: the failed call carries the body and the reason */
    agw_metrics_call(w->m, g->gen->upstream_slot[up], metric_outcome(res, json_body == -1), res->elapsed_ms);
    publish_pool(g, up);
    if (json_body == 1) {
        lua_pushboolean(L, 1); /* the headers ride in the body's raw ref (json.raw_extra) */
        lua_pushnil(L);
    } else if (res->outcome == AGW_CALL_OK) {
        push_headers(w, L, res->headers, res->num_headers);
        lua_pushlstring(L, res->body ? res->body : "", res->body_len);
    } else {
        lua_pushnil(L);
        lua_pushnil(L);
    }
    if (json_body == 1) {
        agw_buf_t *hb = header_block(w, res->headers, res->num_headers);
        agw_json_push_raw_ref(L, res->body, res->body_len, compact, hb->base, hb->len);
    } else if (json_body == -1)
        lua_pushstring(L, err);
    else
        lua_pushnil(L);
    lua_pushnumber(L, res->elapsed_ms);
    if (res->detail)
        lua_pushstring(L, res->detail);
    else
        lua_pushnil(L);
    call_runtime(g, 8);
    gen_release(g);
}

/* The traceparent of an upstream attempt (trace.h): a new span of the request's trace, child of
 * the gateway's span, sent in its own traceparent with the request's tracestate. The headers go
 * after the script's (hdrs has room for two more than n); a script's own traceparent or
 * tracestate is replaced: the gateway owns them. Returns the new header count. The header is
 * added here, at send time, so single-flight keys (made in Lua from the call spec) never see it. */
static size_t trace_call_headers(agw_worker_t *w, lua_State *L, wcall_t *c, agw_header_t *hdrs, size_t n,
                                 char *tp)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* drop the script's traceparent and tracestate */
        if ((hdrs[i].name_len == 11 && strncasecmp(hdrs[i].name, "traceparent", 11) == 0) ||
            (hdrs[i].name_len == 10 && strncasecmp(hdrs[i].name, "tracestate", 10) == 0))
            continue;
        hdrs[k++] = hdrs[i];
    }
    reqref_t *rr = agw_slots_get(&w->reqs, c->rid);
    agw_trace_t *tr = rr ? rr->trace : NULL;
    if (tr) {
        size_t slen = 0;
        const char *section = lua_tolstring(L, 9, &slen);
        unsigned attempt = (unsigned)lua_tointeger(L, 10);
        unsigned flags = lua_toboolean(L, 11) ? AGW_SPAN_HEDGE : attempt > 1 ? AGW_SPAN_RETRY : 0;
        unsigned slot = c->g->gen->upstream_slot[c->up];
        c->span = agw_trace_add_span(tr, &w->trace_rng, slot, section, section ? slen : 0, flags, attempt ? attempt : 1,
                                     now_us(w));
    }
    uint8_t span_id[8], trace_id[16];
    if (c->span >= 0) {
        agw_trace_traceparent(tr, c->span, tp);
    } else { /* no record (too many spans, or none): still a traceparent, in the trace if known */
        agw_trace_random_id(&w->trace_rng, span_id, 8);
        if (tr)
            memcpy(trace_id, tr->trace_id, 16);
        else
            agw_trace_random_id(&w->trace_rng, trace_id, 16);
        agw_traceparent_format(tp, trace_id, span_id, tr ? tr->flags : AGW_TRACE_FLAG_SAMPLED);
    }
    hdrs[k].name = "traceparent", hdrs[k].name_len = 11;
    hdrs[k].value = tp, hdrs[k].value_len = AGW_TRACEPARENT_LEN;
    k++;
    if (rr && rr->tracestate) {
        hdrs[k].name = "tracestate", hdrs[k].name_len = 10;
        hdrs[k].value = rr->tracestate, hdrs[k].value_len = rr->tracestate_len;
        k++;
    }
    return k;
}

/* core.call(rid, index, method, path, headers|nil, body|nil, timeout_ms, decode, section, attempt,
 *           hedge) -> id
 *   section, attempt (1 for the first) and hedge (boolean) describe the attempt's span. */
static int l_call(lua_State *L)
{
    wgen_t *g = upg(L);
    agw_worker_t *w = g->w;
    int index = (int)luaL_checkinteger(L, 2);
    if (index < 1 || (size_t)index > g->conf->num_upstreams)
        return luaL_error(L, "core.call: no upstream #%d", index);
    agw_call_req_t req = {0};
    req.method = luaL_checkstring(L, 3);
    req.path = luaL_checklstring(L, 4, &req.path_len);
    agw_header_t hdrs[64 + 2];
    char traceparent[AGW_TRACEPARENT_LEN];
    if (lua_istable(L, 5)) {
        size_t n = lua_objlen(L, 5) / 2;
        if (n > 64)
            return luaL_error(L, "core.call: more than 64 request headers");
        for (size_t i = 0; i < n; i++) {
            lua_rawgeti(L, 5, (int)(2 * i + 1));
            hdrs[i].name = lua_tolstring(L, -1, &hdrs[i].name_len);
            lua_rawgeti(L, 5, (int)(2 * i + 2));
            hdrs[i].value = lua_tolstring(L, -1, &hdrs[i].value_len);
            lua_pop(L, 2); /* the strings stay referenced by the table */
            if (hdrs[i].name == NULL || hdrs[i].value == NULL)
                return luaL_error(L, "core.call: header names and values must be strings");
        }
        req.num_headers = n;
    }
    req.headers = hdrs;
    if (lua_isstring(L, 6))
        req.body = lua_tolstring(L, 6, &req.body_len);
    lua_Number t = luaL_checknumber(L, 7);
    req.timeout_ms = t > 0 ? (uint64_t)t : 0;
    wcall_t *c = w->free_calls;
    if (c)
        w->free_calls = c->next_free;
    else if ((c = malloc(sizeof(*c))) == NULL)
        return luaL_error(L, "out of memory");
    c->g = g;
    c->decode = lua_toboolean(L, 8);
    c->up = (unsigned)(index - 1);
    c->rid = (uint64_t)lua_tonumber(L, 1);
    c->span = -1;
    c->joiners = NULL;
    req.num_headers = trace_call_headers(w, L, c, hdrs, req.num_headers, traceparent);
    c->id = agw_slots_put(&w->calls, c);
    c->call = agw_call_start(g->pools[index - 1]->pool, &req, on_call_done, c);
    if (c->call == NULL) {
        agw_slots_del(&w->calls, c->id);
        c->next_free = w->free_calls;
        w->free_calls = c;
        return luaL_error(L, "out of memory starting a call");
    }
    gen_hold(g);
    AGW_M_ADD(w->m->upstreams[g->gen->upstream_slot[index - 1]].started, 1);
    publish_pool(g, (size_t)(index - 1));
    lua_pushnumber(L, (lua_Number)c->id);
    return 1;
}

static void on_timer_due(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    wtimer_t *tm = (wtimer_t *)t;
    wgen_t *g = tm->g;
    uint64_t id = tm->id;
    agw_slots_del(&g->w->timers, id);
    free(tm);
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_on_timer);
    lua_pushnumber(g->L, (lua_Number)id);
    call_runtime(g, 1);
    gen_release(g);
}

/* core.timer(ms) -> id: runtime.on_timer(id) runs ms from now (a one-shot libev timer). */
static int l_timer(lua_State *L)
{
    wgen_t *g = upg(L);
    agw_worker_t *w = g->w;
    lua_Number ms = luaL_checknumber(L, 1);
    wtimer_t *tm = malloc(sizeof(*tm));
    if (tm == NULL)
        return luaL_error(L, "out of memory");
    tm->g = g;
    gen_hold(g);
    tm->id = agw_slots_put(&w->timers, tm);
    ev_timer_init(&tm->ev, on_timer_due, ms > 0 ? ms / 1000.0 : 0., 0.);
    ev_timer_start(w->loop, &tm->ev);
    lua_pushnumber(L, (lua_Number)tm->id);
    return 1;
}

/* core.cancel_timer(id) */
static int l_cancel_timer(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t id = (uint64_t)luaL_checknumber(L, 1);
    wtimer_t *tm = agw_slots_get(&w->timers, id);
    if (tm) {
        ev_timer_stop(w->loop, &tm->ev);
        agw_slots_del(&w->timers, id);
        wgen_t *g = tm->g;
        free(tm);
        gen_release(g); /* inside Lua: never the last reference of the generation running */
    }
    return 0;
}

/* core.random() -> a number in [0, 1) (retry jitter; not for secrets). */
static int l_random(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    w->rng = x;
    lua_pushnumber(L, (lua_Number)(x >> 11) / 9007199254740992.0);
    return 1;
}

/* core.cancel(id) */
static int l_cancel(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t id = (uint64_t)luaL_checknumber(L, 1);
    wcall_t *c = agw_slots_get(&w->calls, id);
    if (c) {
        wgen_t *g = c->g;
        trace_call_ended(w, c, AGW_SPAN_CANCELLED, 0);
        agw_call_cancel(c->call);
        agw_metrics_call(w->m, g->gen->upstream_slot[c->up], AGW_OUT_CANCELLED, 0);
        publish_pool(g, c->up);
        agw_slots_del(&w->calls, id);
        c->next_free = w->free_calls;
        w->free_calls = c;
        gen_release(g);
    }
    return 0;
}

/* Adds one response header given by a script: the name lowercased (HTTP/2 needs it), invalid
 * names and values (CR, LF, NUL) dropped with a warning. Returns 1 when it was content-type. */
static int add_script_header(agw_worker_t *w, h2o_req_t *req, const char *name, size_t nl, const char *value, size_t vl)
{
    char lower[128];
    if (nl == 0 || nl > sizeof(lower) || !valid_header_value(value, vl)) {
        agw_log(AGW_LOG_WARN, "worker %d: dropped invalid response header '%.*s'", w->id, (int)(nl > 64 ? 64 : nl), name);
        return 0;
    }
    for (size_t i = 0; i < nl; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    if (!valid_header_name(lower, nl)) {
        agw_log(AGW_LOG_WARN, "worker %d: dropped invalid response header '%.*s'", w->id, (int)nl, name);
        return 0;
    }
    /* framing and hop-by-hop headers belong to the gateway (RFC 9110 §7.6.1; forbidden in HTTP/2) */
    static const char *const owned[] = {"content-length", "transfer-encoding", "connection", "keep-alive",
                                        "upgrade", "proxy-connection", "te", "trailer", NULL};
    for (const char *const *o = owned; *o; o++) {
        if (strlen(*o) == nl && memcmp(*o, lower, nl) == 0) {
            agw_log(AGW_LOG_WARN, "worker %d: dropped response header '%s' set by a script: the gateway frames responses",
                    w->id, *o);
            return 0;
        }
    }
    add_header(req, lower, nl, value, vl);
    return nl == 12 && memcmp(lower, "content-type", 12) == 0;
}

/* core.respond(rid, status, headers, body, is_json, default_type, server_timing)
 *   headers: table name -> value (names in any case) or nil; body: a Lua value to encode as JSON
 *   when is_json, else a string; default_type: content-type unless headers has one.
 * -> true | false (client gone) | nil, err (body cannot be encoded; nothing was sent) */
static int l_respond(lua_State *L)
{
    agw_worker_t *w = upw(L);
    uint64_t rid = (uint64_t)luaL_checknumber(L, 1);
    int status = (int)luaL_checkinteger(L, 2);
    int is_json = lua_toboolean(L, 5);
    reqref_t *rr = agw_slots_get(&w->reqs, rid);
    if (rr == NULL) {
        lua_pushboolean(L, 0);
        return 1;
    }
    h2o_req_t *req = rr->req;
    agw_buf_t *b = &w->out;
    const char *body;
    size_t body_len;
    if (is_json) {
        char err[512];
        agw_buf_reset(b);
        if (agw_json_encode(L, 4, b, err, sizeof(err)) != 0) {
            lua_pushnil(L);
            lua_pushstring(L, err);
            return 2;
        }
        body = b->base;
        body_len = b->len;
    } else {
        body = lua_tolstring(L, 4, &body_len);
        if (body == NULL)
            body = "", body_len = 0;
    }
    req->res.status = status;
    req->res.reason = reason_phrase(status);
    int has_type = 0;
    int completed = -1; /* X-Aggregation-Completed (agg.page's marker): 1 true, 0 false, -1 absent */
    if (lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3) != 0) {
            size_t nl = 0, vl = 0;
            const char *value = lua_type(L, -1) == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER ? lua_tolstring(L, -1, &vl) : NULL;
            const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &nl) : NULL;
            if (name && value) {
                has_type |= add_script_header(w, req, name, nl, value, vl);
                if (nl == 23 && strncasecmp(name, "x-aggregation-completed", 23) == 0)
                    completed = vl == 4 && memcmp(value, "true", 4) == 0;
            }
            lua_pop(L, 1);
        }
    }
    size_t tl;
    const char *type = lua_tolstring(L, 6, &tl);
    if (!has_type && type)
        add_header(req, "content-type", 12, type, tl);
    size_t sl;
    const char *timing = lua_tolstring(L, 7, &sl);
    if (timing)
        add_header(req, "server-timing", 13, timing, sl);
    agw_slots_del(&w->reqs, rid);
    rr->rid = 0;
    stop_client_watch(rr);
    if (status == 204 || status == 304) /* no body, and no Content-Length to promise one (RFC 9110 §8.6) */
        body_len = 0;
    else
        req->res.content_length = body_len;
    /* a page's sections: for partial pages (metrics) and the access log; a failed page lists them
     * under "sections" */
    section_ref_t secs[ALOG_MAX_SECTIONS];
    size_t nsecs = 0;
    int is_page = completed >= 0 && is_json && lua_istable(L, 4);
    if (is_page && (completed == 0 || rr->logline)) {
        int top = lua_gettop(L), sidx = 4;
        if (status != 200) {
            lua_pushliteral(L, "sections");
            lua_rawget(L, 4);
            sidx = lua_istable(L, -1) ? lua_gettop(L) : 0;
        }
        if (sidx)
            nsecs = page_sections(L, sidx, secs, ALOG_MAX_SECTIONS);
        if (status == 200 && completed == 0) {
            for (size_t i = 0; i < nsecs; i++)
                if (strcmp(secs[i].status, "ok") != 0)
                    agw_metrics_partial(w->m, (int)rr->g->gen->route_slot[rr->endpoint], secs[i].name,
                                        secs[i].len);
        }
        record_request(w, rr, status, body_len, secs, nsecs, timing, timing ? sl : 0);
        lua_settop(L, top); /* the names and statuses stay referenced by the body until l_respond returns */
    } else {
        record_request(w, rr, status, body_len, NULL, 0, timing, timing ? sl : 0);
    }
    h2o_send_inline(req, body, body_len);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.join(rid, id, section): request rid waits on call id of another exchange (single-flight)
 * for its section: a span of its own, marked shared and linked to the call's span, ends when the
 * call does. Nothing else changes for the call. */
static int l_join(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->reqs, (uint64_t)luaL_checknumber(L, 1));
    wcall_t *c = agw_slots_get(&w->calls, (uint64_t)luaL_checknumber(L, 2));
    if (rr == NULL || rr->trace == NULL || c == NULL)
        return 0;
    size_t slen = 0;
    const char *section = lua_tolstring(L, 3, &slen);
    int i = agw_trace_add_span(rr->trace, &w->trace_rng, c->g->gen->upstream_slot[c->up], section,
                               section ? slen : 0, AGW_SPAN_SF_JOINED, 1, now_us(w));
    if (i < 0)
        return 0;
    reqref_t *leader = c->span >= 0 ? agw_slots_get(&w->reqs, c->rid) : NULL;
    if (leader && leader->trace) {
        agw_span_t *ls = &leader->trace->spans[c->span];
        ls->flags |= AGW_SPAN_SF_LEADER;
        memcpy(rr->trace->spans[i].link_trace_id, leader->trace->trace_id, 16);
        memcpy(rr->trace->spans[i].link_span_id, ls->span_id, 8);
    }
    sf_joiner_t *j = malloc(sizeof(*j));
    if (j == NULL)
        return 0;
    j->rid = rr->rid;
    j->span = i;
    j->next = c->joiners;
    c->joiners = j;
    return 0;
}

/* core.trace_id(rid) -> the request's trace id as 32 lowercase hex digits, or nil (req.trace_id) */
static int l_trace_id(lua_State *L)
{
    agw_worker_t *w = upw(L);
    reqref_t *rr = agw_slots_get(&w->reqs, (uint64_t)luaL_checknumber(L, 1));
    if (rr == NULL || rr->trace == NULL)
        return 0;
    char hex[32];
    agw_trace_hex(hex, rr->trace->trace_id, 16);
    lua_pushlstring(L, hex, 32);
    return 1;
}

/* core.log(level, message) */
static int l_log(lua_State *L)
{
    agw_worker_t *w = upw(L);
    const char *level = luaL_checkstring(L, 1);
    const char *msg = luaL_checkstring(L, 2);
    agw_log(strcmp(level, "error") == 0 ? AGW_LOG_ERROR : strcmp(level, "warn") == 0 ? AGW_LOG_WARN : AGW_LOG_INFO,
            "worker %d: %s", w->id, msg);
    return 0;
}

/* core.upstream_counters(index, retries, retries_denied, hedges, hedges_won, collapsed): the
 * runtime's totals for upstream index, published as metrics (runtime.report_stats). Each VM's
 * totals start at 0, so what is added is the growth since this VM last reported: the counters go
 * on rising across reloads. */
static int l_upstream_counters(lua_State *L)
{
    wgen_t *g = upg(L);
    lua_Integer index = luaL_checkinteger(L, 1);
    if (index < 1 || (size_t)index > g->conf->num_upstreams)
        return 0;
    agw_upstream_metrics_t *u = &g->w->m->upstreams[g->gen->upstream_slot[index - 1]];
    uint64_t *fields[5] = {&u->retries, &u->retries_denied, &u->hedges, &u->hedges_won, &u->collapsed};
    uint64_t *last = &g->reported[(size_t)(index - 1) * 5];
    for (int k = 0; k < 5; k++) {
        lua_Number n = luaL_optnumber(L, 2 + k, 0);
        uint64_t v = n > 0 ? (uint64_t)n : 0;
        if (v > last[k]) {
            AGW_M_ADD(*fields[k], v - last[k]);
            last[k] = v;
        }
    }
    return 0;
}

static const luaL_Reg core_fns[] = {
    {"now", l_now},       {"call", l_call},   {"cancel", l_cancel},           {"respond", l_respond},
    {"log", l_log},       {"timer", l_timer}, {"cancel_timer", l_cancel_timer}, {"random", l_random},
    {"upstream_counters", l_upstream_counters}, {"join", l_join}, {"trace_id", l_trace_id},
    {NULL, NULL},
};

/* 1 when the generation table a VM loaded (at idx) lists exactly conf's endpoints and upstreams,
 * in the same order: the router's endpoint indexes and the pools' upstream indexes then name the
 * same handlers and upstreams in the VM (the folder could change between two loads). */
static int same_generation(lua_State *L, int idx, const agw_config_t *conf)
{
    int top = lua_gettop(L);
    lua_getfield(L, idx, "endpoints");
    int same = lua_istable(L, -1) && lua_objlen(L, -1) == conf->num_endpoints;
    for (size_t i = 0; same && i < conf->num_endpoints; i++) {
        lua_rawgeti(L, top + 1, (int)i + 1);
        lua_getfield(L, -1, "route");
        lua_getfield(L, -2, "file");
        const char *route = lua_tostring(L, -2), *file = lua_tostring(L, -1);
        same = route && file && strcmp(route, conf->endpoints[i].route) == 0 &&
               strcmp(file, conf->endpoints[i].file) == 0;
        lua_pop(L, 3);
    }
    lua_getfield(L, idx, "upstreams"); /* name -> { index = i } */
    size_t n = 0;
    if (same && lua_istable(L, -1)) {
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            n++;
            lua_pop(L, 1);
        }
    }
    same = same && n == conf->num_upstreams;
    for (size_t i = 0; same && i < conf->num_upstreams; i++) {
        lua_getfield(L, -1, conf->upstreams[i].name);
        lua_getfield(L, -1, "index");
        same = lua_tointeger(L, -1) == (lua_Integer)i + 1;
        lua_pop(L, 2);
    }
    lua_settop(L, top);
    return same;
}

/* Loads the runtime and the scripts folder into a new VM for g (any thread: the VM is not used
 * by the worker until it is installed). */
static int init_vm(wgen_t *g, agw_buf_t *errors)
{
    const agw_config_t *conf = g->conf;
    lua_State *L = g->L = agw_vm_new(conf->dir);
    if (L == NULL) {
        agw_buf_puts(errors, "out of memory creating a Lua state\n");
        return -1;
    }
    if (agw_vm_load_generation(L, conf->dir, errors) != 0)
        return -1;
    int gen = lua_gettop(L);
    if (!same_generation(L, gen, conf)) {
        agw_buf_printf(errors, "%s/gateway.lua:1: the scripts folder changed while it was being loaded; load it "
                       "again (SIGHUP, or start the gateway again)\n", conf->dir);
        return -1;
    }
    lua_getglobal(L, "require");
    lua_pushliteral(L, "agg.runtime");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        agw_buf_printf(errors, "cannot load agg.runtime: %s\n", lua_tostring(L, -1));
        return -1;
    }
    int rt = lua_gettop(L);
    lua_getfield(L, rt, "init");
    lua_createtable(L, 0, 8);
    for (const luaL_Reg *f = core_fns; f->name; f++) {
        lua_pushlightuserdata(L, g);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
    lua_createtable(L, (int)conf->num_upstreams, 0); /* core.breakers: shared by every worker */
    for (size_t i = 0; i < conf->num_upstreams; i++) {
        agw_breaker_push(L, conf->breakers[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "breakers");
    lua_getfield(L, gen, "upstreams");
    lua_getfield(L, gen, "endpoints");
    if (lua_pcall(L, 3, 0, 0) != 0) {
        agw_buf_printf(errors, "runtime init failed: %s\n", lua_tostring(L, -1));
        return -1;
    }
    lua_getfield(L, rt, "start");
    g->ref_start = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "on_call");
    g->ref_on_call = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "abort");
    g->ref_abort = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "on_timer");
    g->ref_on_timer = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, rt, "report_stats");
    g->ref_report_stats = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX) : (lua_pop(L, 1), LUA_NOREF);
    lua_settop(L, 0);
    return 0;
}

/* ---- requests ------------------------------------------------------------------------------- */

static void watch_unqueue(reqref_t *rr)
{
    agw_worker_t *w = rr->w;
    if (rr->watch_prev)
        rr->watch_prev->watch_next = rr->watch_next;
    else
        w->watch_head = rr->watch_next;
    if (rr->watch_next)
        rr->watch_next->watch_prev = rr->watch_prev;
    else
        w->watch_tail = rr->watch_prev;
    rr->watch_next = rr->watch_prev = NULL;
    rr->watch_fd = -1;
}

static void stop_client_watch(reqref_t *rr)
{
    if (rr->watching) {
        ev_io_stop(rr->w->loop, &rr->client_watch);
        rr->watching = 0;
    } else if (rr->watch_fd >= 0) {
        watch_unqueue(rr);
    }
}

/* Forgets request rid of generation g on the runtime side: its calls are cancelled (now, or once
 * the runtime returns when this runs inside it). */
static void abandon_request(wgen_t *g, uint64_t rid)
{
    agw_worker_t *w = g->w;
    if (w->lua_depth) {
        if (w->num_pending_aborts == w->cap_pending_aborts) {
            w->cap_pending_aborts = w->cap_pending_aborts ? w->cap_pending_aborts * 2 : 16;
            w->pending_aborts = realloc(w->pending_aborts, w->cap_pending_aborts * sizeof(*w->pending_aborts));
            if (w->pending_aborts == NULL)
                abort();
        }
        w->pending_aborts[w->num_pending_aborts].rid = rid;
        w->pending_aborts[w->num_pending_aborts++].g = g;
        gen_hold(g);
        return;
    }
    abort_request(g, rid);
}

/* h2o does not read an HTTP/1 connection while its request is being handled, so a client that
 * closes it is noticed here: EOF or an error means the client is gone; bytes (a pipelined request)
 * mean it is still there, and the watch ends. */
static void on_client_readable(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop, (void)revents;
    reqref_t *rr = io->data;
    char c;
    ssize_t n = recv(io->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    stop_client_watch(rr);
    if (n > 0 || rr->rid == 0)
        return;
    agw_worker_t *w = rr->w;
    uint64_t rid = rr->rid;
    agw_slots_del(&w->reqs, rid);
    rr->rid = 0;
    record_request(w, rr, 499, 0, NULL, 0, NULL, 0);
    abandon_request(rr->g, rid);
    /* finish the h2o request so that it tears the connection down (the write fails) */
    h2o_req_t *req = rr->req;
    req->res.status = 499;
    req->res.reason = "Client Closed Request";
    req->res.content_length = 0;
    h2o_send_inline(req, "", 0);
}

/* How long a request runs before its client's socket is watched (s). Most pages are answered
 * sooner: watching each of them at once would cost two epoll_ctl calls per request (register the
 * socket with libev's epoll, then drop it when the next request arrives on it), a tenth of a page's
 * system calls. A client that leaves earlier is noticed when the watch starts (its socket is then
 * readable at once), so its calls are cancelled at most this much later. */
#define CLIENT_WATCH_DELAY 0.025

/* Starts the watches of the queued requests that have run CLIENT_WATCH_DELAY, then waits for
 * the next one. */
static void on_watch_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)revents;
    agw_worker_t *w = t->data;
    ev_tstamp now = ev_now(loop);
    reqref_t *rr;
    while ((rr = w->watch_head) != NULL && rr->started + CLIENT_WATCH_DELAY <= now + 0.0005) {
        int fd = rr->watch_fd;
        watch_unqueue(rr);
        ev_io_init(&rr->client_watch, on_client_readable, fd, EV_READ);
        rr->client_watch.data = rr;
        ev_io_start(loop, &rr->client_watch);
        rr->watching = 1;
    }
    if (rr) {
        t->repeat = rr->started + CLIENT_WATCH_DELAY - now;
        if (t->repeat < 0.001)
            t->repeat = 0.001;
        ev_timer_again(loop, t);
    } else {
        ev_timer_stop(loop, t);
    }
}

/* HTTP/1: queues the request so that its client's socket is watched once the request has run
 * CLIENT_WATCH_DELAY (see on_client_readable). */
static void watch_client(reqref_t *rr, h2o_req_t *req)
{
    rr->watching = 0;
    rr->watch_fd = -1;
    rr->watch_next = rr->watch_prev = NULL;
    if (req->version >= 0x200 || req->conn->callbacks->get_socket == NULL)
        return; /* HTTP/2 reads all the time: a reset stream or a closed connection disposes the request */
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd < 0)
        return;
    agw_worker_t *w = rr->w;
    rr->watch_fd = fd;
    rr->watch_prev = w->watch_tail;
    if (w->watch_tail)
        w->watch_tail->watch_next = rr;
    else
        w->watch_head = rr;
    w->watch_tail = rr;
    if (!ev_is_active(&w->watch_timer)) {
        w->watch_timer.repeat = CLIENT_WATCH_DELAY;
        ev_timer_again(w->loop, &w->watch_timer);
    }
}

static void on_req_dispose(void *p)
{
    reqref_t *rr = p;
    __atomic_sub_fetch(&rr->w->inflight, 1, __ATOMIC_RELAXED);
    stop_client_watch(rr);
    if (rr->rid == 0) {
        free(rr->logline); /* NULL unless the request ended without being recorded */
        gen_release(rr->g);
        return;
    }
    /* the client went away before the response: cancel everything the request started */
    agw_worker_t *w = rr->w;
    uint64_t rid = rr->rid;
    agw_slots_del(&w->reqs, rid);
    rr->rid = 0;
    record_request(w, rr, 499, 0, NULL, 0, NULL, 0);
    abandon_request(rr->g, rid);
    gen_release(rr->g);
}

/* Checks request framing that h2o lets through (RFC 9112): a header with an empty name (an
 * obsolete line folding) and Content-Length headers that disagree. Returns a reason or NULL. */
static const char *bad_framing(const h2o_req_t *req)
{
    const h2o_iovec_t *length = NULL;
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        if (h->name->len == 0)
            return "a header line starts with whitespace (obsolete line folding)";
        if (h2o_lcstris(h->name->base, h->name->len, H2O_STRLIT("content-length"))) {
            if (length && !h2o_memis(length->base, length->len, h->value.base, h->value.len))
                return "Content-Length headers disagree";
            length = &h->value;
        }
    }
    return NULL;
}

int agw_worker_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    (void)self;
    agw_worker_t *w = H2O_STRUCT_FROM_MEMBER(agw_worker_t, ctx, req->conn->ctx);
    wgen_t *g = w->cur; /* the request runs on this generation to its end, whatever reloads meanwhile */
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    int endpoint = 0;
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t num_params = 0;
    char allow[128];
    agw_route_result_t m = agw_router_match(&g->conf->router, req->method.base, req->method.len, req->path.base,
                                            path_len, &endpoint, params, &num_params, allow, sizeof(allow));
    if (m == AGW_ROUTE_NOT_FOUND) {
        send_problem(w, req, NULL, 0, 404, "route-not-found", "no route matches this path", NULL);
        return 0;
    }
    if (m == AGW_ROUTE_METHOD_NOT_ALLOWED) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, allow, strlen(allow));
        send_problem(w, req, NULL, 0, 405, "method-not-allowed", "this route does not accept this method", NULL);
        return 0;
    }
    const char *framing = bad_framing(req);
    if (framing) {
        req->http1_is_persistent = 0;
        send_problem(w, req, NULL, endpoint, 400, "bad-request", "the request is malformed", framing);
        return 0;
    }
    reqref_t *rr = h2o_mem_alloc_shared(&req->pool, sizeof(*rr), on_req_dispose);
    __atomic_add_fetch(&w->inflight, 1, __ATOMIC_RELAXED);
    if (w->draining)
        req->http1_is_persistent = 0; /* a keep-alive connection closes after this response */
    rr->w = w;
    rr->g = g;
    gen_hold(g);
    rr->req = req;
    rr->rid = agw_slots_put(&w->reqs, rr);
    rr->endpoint = endpoint;
    rr->started = ev_now(w->loop);
    rr->logline = NULL;
    if (w->access_fd >= 0 && (rr->logline = malloc(req->method.len + req->path.len + 2)) != NULL) {
        memcpy(rr->logline, req->method.base, req->method.len);
        rr->logline[req->method.len] = '\0';
        memcpy(rr->logline + req->method.len + 1, req->path.base, req->path.len);
        rr->logline[req->method.len + 1 + req->path.len] = '\0';
    }
    AGW_M_ADD(w->m->requests_started, 1);
    watch_client(rr, req);
    rr->trace = NULL;
    trace_begin(w, rr, req, path_len);

    lua_State *L = g->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_start);
    lua_pushnumber(L, (lua_Number)rr->rid);
    lua_pushinteger(L, endpoint);
    lua_pushlstring(L, req->method.base, req->method.len);
    lua_pushlstring(L, req->path.base, path_len);
    if (req->query_at != SIZE_MAX)
        lua_pushlstring(L, req->path.base + req->query_at + 1, req->path.len - req->query_at - 1);
    else
        lua_pushnil(L);
    lua_createtable(L, 0, (int)num_params);
    for (size_t i = 0; i < num_params; i++) {
        lua_pushlstring(L, params[i].name, params[i].name_len);
        lua_pushlstring(L, params[i].value, params[i].value_len);
        lua_rawset(L, -3);
    }
    agw_buf_t *hb = &w->hdrs;
    agw_buf_reset(hb);
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        append_header(hb, h->name->base, h->name->len, h->value.base, h->value.len);
    }
    lua_pushlstring(L, hb->base ? hb->base : "", hb->len);
    if (req->entity.base != NULL)
        lua_pushlstring(L, req->entity.base, req->entity.len);
    else
        lua_pushnil(L);
    uint64_t rid = rr->rid;
    /* the runtime failed (a bug, never a script error): do not leave the client hanging */
    if (call_runtime(g, 8) != 0 && agw_slots_get(&w->reqs, rid) == rr) {
        agw_slots_del(&w->reqs, rid);
        rr->rid = 0;
        stop_client_watch(rr);
        send_problem(w, req, rr, endpoint, 500, "gateway-error", "the gateway failed to handle the request",
                     "the error was logged by the gateway");
    }
    return 0;
}

/* ---- accept --------------------------------------------------------------------------------- */

static void on_conn_close(uv_handle_t *h)
{
    free(h);
}

static void on_accept(uv_stream_t *server, int status)
{
    listener_t *l = server->data;
    if (status != 0)
        return;
    uv_tcp_t *conn = malloc(sizeof(*conn));
    if (conn == NULL)
        return;
    uv_tcp_init(server->loop, conn);
    if (uv_accept(server, (uv_stream_t *)conn) != 0) {
        uv_close((uv_handle_t *)conn, on_conn_close);
        return;
    }
    uv_tcp_nodelay(conn, 1);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)conn, on_conn_close);
    h2o_accept(&l->accept_ctx, sock);
}

/* ---- thread --------------------------------------------------------------------------------- */

/* Once a second: the runtime's retry/hedge/single-flight totals of every live generation and the
 * current generation's pool gauges. */
static void on_stats_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = t->data;
    for (size_t i = 0; i < w->cur->conf->num_upstreams; i++)
        publish_pool(w->cur, i);
    for (wgen_t *g = w->gens; g;) {
        wgen_t *next = g->next;
        if (g->ref_report_stats != LUA_NOREF) {
            gen_hold(g);
            lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_report_stats);
            call_runtime(g, 0);
            next = g->next; /* the list may have changed meanwhile; g is still on it (held) */
            gen_release(g);
        }
        g = next;
    }
}

static void *worker_main(void *arg)
{
    agw_worker_t *w = arg;
    ev_run(w->loop, 0);
    if (w->access_fd >= 0)
        alog_flush(w);
    while (w->free_traces) {
        agw_trace_t *tr = w->free_traces;
        w->free_traces = tr->next;
        free(tr);
    }
    return NULL;
}

agw_worker_gen_t *agw_worker_prepare(agw_worker_t *w, agw_generation_t *gen, agw_buf_t *errors)
{
    wgen_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        abort();
    g->w = w;
    g->gen = agw_generation_ref(gen);
    g->conf = &gen->conf;
    g->ref_report_stats = LUA_NOREF;
    g->reported = calloc(gen->conf.num_upstreams ? gen->conf.num_upstreams * 5 : 1, sizeof(*g->reported));
    if (g->reported == NULL)
        abort();
    if (init_vm(g, errors) != 0) {
        gen_discard(g);
        return NULL;
    }
    return g;
}

void agw_worker_discard(agw_worker_gen_t *g)
{
    if (g)
        gen_discard(g);
}

void agw_worker_install(agw_worker_t *w, agw_worker_gen_t *g)
{
    pthread_mutex_lock(&w->next_lock);
    wgen_t *replaced = w->next; /* a reload the worker has not taken yet: this one supersedes it */
    w->next = g;
    pthread_mutex_unlock(&w->next_lock);
    if (replaced)
        gen_discard(replaced);
    ev_async_send(w->loop, &w->reload_async);
}

agw_worker_t *agw_worker_start(int id, agw_generation_t *gen, h2o_globalconf_t *globalconf,
                               const agw_listener_fd_t *fds, size_t num_fds, agw_metrics_t *metrics, int access_fd,
                               agw_buf_t *errors)
{
    agw_worker_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        abort();
    w->id = id;
    w->m = metrics;
    w->waterfall_on = gen->conf.admin_port != 0;
    w->access_fd = access_fd;
    w->alog_sec = -1;
    w->rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)time(NULL) << 8) ^ (uint64_t)(id + 1);
    /* trace ids must not repeat across gateways started in the same second */
    if (getrandom(&w->trace_rng, sizeof(w->trace_rng), GRND_NONBLOCK) != (ssize_t)sizeof(w->trace_rng))
        w->trace_rng = w->rng ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)w;
    if (w->trace_rng == 0)
        w->trace_rng = w->rng;
    wgen_t *first = agw_worker_prepare(w, gen, errors);
    if (first == NULL) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->next_lock, NULL);
    w->loop = ev_loop_new(EVFLAG_AUTO);
    uv_loop_init(&w->uvloop);
    ev_io_init(&w->uv_io, on_uv_io, uv_backend_fd(&w->uvloop), EV_READ);
    w->uv_io.data = w;
    ev_io_start(w->loop, &w->uv_io);
    ev_init(&w->uv_timer, on_uv_timer);
    w->uv_timer.data = w;
    ev_prepare_init(&w->uv_prepare, on_prepare);
    w->uv_prepare.data = w;
    ev_prepare_start(w->loop, &w->uv_prepare);
    ev_async_init(&w->stop_async, on_stop);
    ev_async_start(w->loop, &w->stop_async);
    ev_async_init(&w->drain_async, on_drain);
    w->drain_async.data = w;
    ev_async_start(w->loop, &w->drain_async);
    ev_async_init(&w->reload_async, on_reload);
    w->reload_async.data = w;
    ev_async_start(w->loop, &w->reload_async);
    ev_timer_init(&w->stats_timer, on_stats_timer, 1., 1.);
    w->stats_timer.data = w;
    ev_timer_start(w->loop, &w->stats_timer);
    ev_timer_init(&w->alog_timer, on_alog_timer, 0.1, 0.);
    w->alog_timer.data = w;
    ev_init(&w->watch_timer, on_watch_timer);
    w->watch_timer.data = w;

    h2o_context_init(&w->ctx, &w->uvloop, globalconf);
    gen_activate(w, first);

    w->listeners = calloc(num_fds ? num_fds : 1, sizeof(*w->listeners));
    w->num_listeners = num_fds;
    for (size_t i = 0; i < num_fds; i++) {
        listener_t *l = &w->listeners[i];
        l->worker = w;
        l->accept_ctx.ctx = &w->ctx;
        l->accept_ctx.hosts = globalconf->hosts;
        l->accept_ctx.ssl_ctx = fds[i].ssl_ctx;
        uv_tcp_init(&w->uvloop, &l->handle);
        l->handle.data = l;
        int rc = uv_tcp_open(&l->handle, fds[i].fd);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&l->handle, 1024, on_accept);
        if (rc != 0) {
            agw_buf_printf(errors, "worker %d: cannot listen: %s\n", id, uv_strerror(rc));
            return NULL;
        }
    }
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        agw_buf_puts(errors, "cannot start a worker thread\n");
        return NULL;
    }
    return w;
}

uint64_t agw_worker_generation(const agw_worker_t *w)
{
    return __atomic_load_n(&w->serving, __ATOMIC_ACQUIRE);
}

void agw_worker_drain(agw_worker_t *w)
{
    ev_async_send(w->loop, &w->drain_async);
}

int agw_worker_inflight(const agw_worker_t *w)
{
    return __atomic_load_n(&w->inflight, __ATOMIC_RELAXED);
}

void agw_worker_stop(agw_worker_t *w)
{
    ev_async_send(w->loop, &w->stop_async);
    pthread_join(w->thread, NULL);
    pthread_mutex_lock(&w->next_lock);
    wgen_t *pending = w->next;
    w->next = NULL;
    pthread_mutex_unlock(&w->next_lock);
    if (pending)
        gen_discard(pending);
}
