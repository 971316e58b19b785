/* request.c: a request from h2o until its script starts: the batch endpoint, the header limits,
 * the route match, request framing, the edge (authentication, parked while a JWKS refetch runs),
 * the limits gate (limits.c), then runtime.start(rid, endpoint, method, path, params, query,
 * body, user, waited_ms) in the current generation's VM (lua/agg/contract.lua). The request's
 * memory pool's dispose callback ends it: a client that left before the response has its calls
 * cancelled.
 */
#include "worker/worker_internal.h"

#include "base/mem.h"
#include "edge/edge.h"
#include "multi/multi.h"
#include "worker/contract.h"
#include "limits/gate.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void on_req_dispose(void *p)
{
    reqref_t *rr = p;
    agw_worker_unsent_done(rr->w, rr->req, &rr->unsent);
    agw_edge_user_drop(&rr->user);
    if (h2o_linklist_is_linked(&rr->out_link))
        h2o_linklist_unlink(&rr->out_link);
    __atomic_sub_fetch(&rr->w->inflight, 1, __ATOMIC_RELAXED);
    agw_worker_stop_client_watch(rr);
    if (rr->rid == 0) {
        free(rr->logline); /* NULL unless the request ended without being recorded */
        agw_worker_gen_release(rr->g);
        return;
    }
    /* the client went away before the response: cancel everything the request started */
    agw_worker_t *w = rr->w;
    uint64_t rid = rr->rid;
    if (rr->req->version >= 0x200) { /* a stream reset (or its connection gone): rapid reset? */
        const agw_clients_conf_t *cc = &rr->g->conf->clients;
        agw_guard_h2_cancelled(&w->guard, rr->req, (uint64_t)(ev_now(w->loop) * 1000.0), cc->max_cancelled_streams,
                               cc->cancel_window_ms);
    }
    agw_slots_del(&w->tables.reqs, rid);
    rr->rid = 0;
    agw_worker_record_request(w, rr, 499, 0, NULL, 0, NULL, 0);
    agw_worker_abandon_request(rr->g, rid);
    agw_worker_gen_release(rr->g);
}

/* Checks request framing that h2o lets through (RFC 9112): a header with an empty name (an
 * obsolete line folding); for HTTP/2, a connection-specific field; for HTTP/1, in the raw request head (h2o keeps neither field in
 * req->headers), Content-Length with Transfer-Encoding or Content-Length fields that disagree,
 * and Host missing (HTTP/1.1), given twice or invalid (guard.h). Returns a reason or NULL. */
static const char *bad_framing(h2o_req_t *req)
{
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_iovec_t *name = req->headers.entries[i].name;
        if (name->len == 0)
            return "a header line starts with whitespace (obsolete line folding)";
        /* HTTP/2: a connection-specific field makes the request malformed (RFC 9113 §8.2.2). Also
         * what a request upgraded from HTTP/1.1 (Upgrade: h2c) carries, should h2o upgrade one
         * (front/h2c_upgrade.h): its HTTP/1.1 head was never read by the checks below */
        if (req->version >= 0x200 &&
            (name == &H2O_TOKEN_CONNECTION->buf || name == &H2O_TOKEN_HTTP2_SETTINGS->buf ||
             name == &H2O_TOKEN_KEEP_ALIVE->buf || name == &H2O_TOKEN_UPGRADE->buf ||
             name == &H2O_TOKEN_TRANSFER_ENCODING->buf || h2o_memis(name->base, name->len, H2O_STRLIT("proxy-connection"))))
            return "an HTTP/2 request with a connection-specific header field (RFC 9113 §8.2.2)";
    }
    const char *head;
    size_t len;
    if (agw_guard_http1_head(req, &head, &len) == 0)
        return agw_guard_http1_framing(head, len);
    return NULL;
}

/* A batch's request as the worker follows it (the batch itself is multi/multi.h's): recorded
 * with its duration once answered; over HTTP/1 its client's socket is watched while the entries
 * run (h2o reads none of it meanwhile); over HTTP/2 a stream reset before the answer counts as
 * cancelled streams for the rapid-reset guard. In req's memory, made before the batch (its
 * disposal runs after the batch's: h2o disposes a pool's shared entries last made first). */
typedef struct batch_ref {
    agw_worker_t *w;
    h2o_req_t *req;
    agw_multi_t *m;     /* the batch while it runs; NULL once answered or abandoned */
    double started;     /* ev_now() when it arrived */
    size_t unsent;      /* HTTP/2: its answer's bytes counted in its connection's (agw_worker_unsent_take) */
    ev_io watch;        /* HTTP/1: the client's socket */
    int watching;
} batch_ref_t;

static void batch_unwatch(batch_ref_t *b)
{
    if (b->watching) {
        ev_io_stop(b->w->loop, &b->watch);
        b->watching = 0;
    }
}

static void record_batch(void *data, h2o_req_t *req, int status, size_t bytes)
{
    batch_ref_t *b = data;
    batch_unwatch(b);
    b->m = NULL;
    agw_worker_record_c_response(b->w, req, AGW_ENDPOINT_ENVELOPE, status, (ev_now(b->w->loop) - b->started) * 1000.0, bytes);
    agw_worker_closing(b->w, req); /* (the envelope's response starts right after) */
}

/* The batch's request was disposed before its answer: 499 in the log and the metrics, and over
 * HTTP/2 the stream reset counts as one cancelled stream per entry still running (at least one):
 * what a reset costs the gateway is the pages it started, and a batch starts up to max_requests. */
static void batch_abandoned(void *data, h2o_req_t *req, size_t running)
{
    batch_ref_t *b = data;
    agw_worker_t *w = b->w;
    batch_unwatch(b);
    b->m = NULL;
    agw_worker_record_c_response(w, req, AGW_ENDPOINT_ENVELOPE, 499, (ev_now(w->loop) - b->started) * 1000.0, 0);
    if (req->version < 0x200)
        return;
    const agw_clients_conf_t *cc = &w->gens.cur->conf->clients;
    uint64_t now_ms = (uint64_t)(ev_now(w->loop) * 1000.0);
    for (size_t i = 0; i < (running ? running : 1); i++)
        if (agw_guard_h2_cancelled(&w->guard, req, now_ms, cc->max_cancelled_streams, cc->cancel_window_ms))
            break; /* the GOAWAY is due */
}

static void on_batch_client(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)loop, (void)revents;
    batch_ref_t *b = io->data;
    int gone = agw_worker_client_gone(io->fd);
    if (gone < 0)
        return;
    batch_unwatch(b);
    if (!gone || b->m == NULL)
        return;
    agw_multi_t *m = b->m;
    b->m = NULL;
    agw_worker_record_c_response(b->w, b->req, AGW_ENDPOINT_ENVELOPE, 499, (ev_now(b->w->loop) - b->started) * 1000.0, 0);
    agw_multi_abandon(m); /* its entries are cancelled (each logged 499) */
    agw_worker_finish_gone(b->req, io->fd);
}

/* The envelope's answer is counted in its connection's unsent answers, and refused past them
 * with the problem a page gets (respond.c). */
static const char *batch_admit(void *data, h2o_req_t *req, size_t bytes)
{
    batch_ref_t *b = data;
    return agw_worker_unsent_take(b->w, b->w->gens.cur, req, bytes, &b->unsent) ? NULL : AGW_UNSENT_PROBLEM;
}

static void on_batch_dispose(void *p)
{
    batch_ref_t *b = p;
    batch_unwatch(b);
    agw_worker_unsent_done(b->w, b->req, &b->unsent);
}

/* The batch endpoint (multi/multi.h): its entries come back here, each as a request of its own. */
static int on_batch(agw_worker_t *w, h2o_req_t *req)
{
    const agw_config_t *conf = w->gens.cur->conf;
    if (agw_multi_is_entry(req)) {
        agw_worker_send_problem(w, req, NULL, AGW_ENDPOINT_ENVELOPE, 400, "nested-batch", "a batch may not contain a batch",
                                NULL);
        return 0;
    }
    batch_ref_t *b = h2o_mem_alloc_shared(&req->pool, sizeof(*b), on_batch_dispose);
    *b = (batch_ref_t){.w = w, .req = req, .started = ev_now(w->loop)};
    /* the envelope is a request body: its entries' bodies at most max_request_json_values in all,
     * beside the envelope's own members (jansson makes a tree of it: about 76 bytes a node) */
    agw_multi_conf_t mc = {.max_requests = conf->batch_max_requests,
                           .max_values = conf->max_request_json_values + 16 * conf->batch_max_requests,
                           .deadline_ms = conf->batch_deadline_ms,
                           .loop = w->loop, .record = record_batch, .abandoned = batch_abandoned,
                           .admit = batch_admit, .record_data = b};
    b->m = agw_multi_start(req, &mc);
    h2o_socket_t *sock = b->m && req->version < 0x200 && req->conn->callbacks->get_socket
                             ? req->conn->callbacks->get_socket(req->conn)
                             : NULL;
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd >= 0) { /* watched at once: a batch is rarer than a page, and runs several */
        ev_io_init(&b->watch, on_batch_client, fd, EV_READ);
        b->watch.data = b;
        ev_io_start(w->loop, &b->watch);
        b->watching = 1;
    }
    return 0;
}

/* Answers 431 when the request's decoded headers pass the clients limits (guard.h): before
 * anything of them is copied for the script. Returns 1 when it answered. */
static int headers_too_large(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint)
{
    const agw_clients_conf_t *cc = &g->conf->clients;
    size_t count, bytes;
    const char *why = agw_guard_headers_fit(&req->headers, cc->max_headers, cc->max_header_bytes, &count, &bytes);
    if (why == NULL)
        return 0;
    char detail[160];
    if (count > cc->max_headers)
        snprintf(detail, sizeof(detail), "%s: %zu, the gateway takes %u (clients.max_headers)", why, count,
                 cc->max_headers);
    else
        snprintf(detail, sizeof(detail), "%s: over %zu bytes of names and values (clients.max_header_bytes)", why,
                 cc->max_header_bytes);
    req->http1_is_persistent = 0;
    agw_worker_send_problem(w, req, NULL, endpoint, 431, "request-header-fields-too-large",
                            "the request header fields are too large", detail);
    return 1;
}

void agw_worker_request_headers(agw_buf_t *b, const h2o_req_t *req)
{
    size_t n = req->headers.size; /* at most clients.max_headers fields (headers_too_large) */
    if (n == 0) {
        agw_buf_reset(b);
        return;
    }
    agw_header_t small[128], *f = n <= 128 ? small : agw_malloc(n * sizeof(*f));
    for (size_t i = 0; i < n; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        f[i] = (agw_header_t){.name = h->name->base, .name_len = h->name->len, .value = h->value.base,
                              .value_len = h->value.len}; /* trimmed (trim_header_values) */
    }
    agw_header_block(b, f, n);
    if (f != small)
        free(f);
}

static int handle_req(agw_worker_t *w, h2o_req_t *req, int may_wait);
static void start_script(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint, const agw_route_param_t *params,
                         size_t num_params, agw_auth_result_t *user);

/* A request whose token names a kid no key has, waiting for the JWKS refetch that this asked for
 * (edge.h: AGW_EDGE_WAIT; park.c). The fetch runs on another thread: the park polls its count of
 * finished fetches. */
typedef struct auth_wait {
    agw_park_t park;    /* first */
    uint64_t fetches_done;
} auth_wait_t;

#define AUTH_POLL_S 0.005

static int on_auth_poll(agw_park_t *pk)
{
    return agw_auth_fetches_done(&pk->g->conf->auth) != ((auth_wait_t *)pk)->fetches_done;
}

static void on_auth_resume(agw_park_t *pk, int timed_out)
{
    (void)timed_out;
    handle_req(pk->w, pk->req, 0); /* checked again with the keys the fetch brought (or answered now) */
}

static const agw_park_ops_t auth_wait_ops = {on_auth_poll, on_auth_resume, NULL};

/* Leaves out the whitespace before and after each header field's value, in place: a field value
 * does not include it (RFC 9110 §5.5), and h2o 2.2.5's HTTP/1.1 parser keeps it at a value's end.
 * Done once, where a request (a batch entry too) arrives, so whatever compares a value as a whole
 * reads the value: the edge's API key and bearer token, a rate limit's header key, req.headers,
 * forward_headers, a cache key's headers, the access log. Only the view moves; no byte is written. */
static void trim_header_values(h2o_req_t *req)
{
    for (size_t i = 0; i < req->headers.size; i++) {
        h2o_iovec_t *v = &req->headers.entries[i].value;
        const char *s = v->base;
        size_t n = v->len;
        agw_header_trim_ows(&s, &n);
        v->base = (char *)s;
        v->len = n;
    }
}

int agw_worker_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    (void)self;
    trim_header_values(req);
    return handle_req(H2O_STRUCT_FROM_MEMBER(agw_worker_t, ctx, req->conn->ctx), req, 1);
}

/* A request target in absolute-form ("GET http://host/p?q HTTP/1.1", what a client that talks to a
 * proxy sends) made the origin-form the router and scripts read: a server MUST accept it and take
 * the host from it, not from Host (RFC 9112 §3.2.2). h2o 2.2.5 hands it over as it came. Another
 * scheme, or none, is left as it is (the router answers 404); HTTP/2 has no absolute-form. Returns
 * why the target must be refused (400), or NULL: an empty host (RFC 9110 §4.2.1: MUST reject), user
 * information (§4.2.4: treat as an error), or a '#' or '\' in the authority, which a proxy in
 * front would read otherwise (a fragment, a path). */
static const char *origin_form(h2o_req_t *req)
{
    h2o_iovec_t p = req->path;
    size_t at;
    if (req->version >= 0x200 || p.len == 0 || p.base[0] == '/')
        return NULL;
    if (p.len >= 7 && strncasecmp(p.base, "http://", 7) == 0)
        at = 7;
    else if (p.len >= 8 && strncasecmp(p.base, "https://", 8) == 0)
        at = 8;
    else
        return NULL;
    size_t end = at;
    while (end < p.len && p.base[end] != '/' && p.base[end] != '?') {
        if (p.base[end] == '@')
            return "the request target's authority holds user information";
        if (p.base[end] == '#' || p.base[end] == '\\')
            return "the request target's authority holds a '#' or a '\\'";
        end++;
    }
    if (end == at)
        return "the request target has an empty host";
    req->authority = h2o_iovec_init(p.base + at, end - at);
    if (end < p.len && p.base[end] == '/')
        req->path = h2o_iovec_init(p.base + end, p.len - end);
    else /* no path: "/" (§3.2.2, an empty path is "/"), then the query if any */
        req->path = h2o_concat(&req->pool, h2o_iovec_init(H2O_STRLIT("/")), h2o_iovec_init(p.base + end, p.len - end));
    const char *q = memchr(req->path.base, '?', req->path.len);
    req->query_at = q ? (size_t)(q - req->path.base) : SIZE_MAX;
    return NULL;
}

/* A request from h2o, its header values trimmed (may_wait: it may wait for a JWKS refetch; 0 when
 * it has waited already). */
static int handle_req(agw_worker_t *w, h2o_req_t *req, int may_wait)
{
    wgen_t *g = w->gens.cur; /* the request runs on this generation to its end, whatever reloads meanwhile */
    if (may_wait) /* (a request back from a JWKS wait has been noted already) */
        agw_worker_conn_request(w, req); /* what a drain needs to know of its connection */
    if (req->version >= 0x200) /* header bombs: the guard counts header blocks before h2o decodes them */
        agw_guard_h2_watch(&w->guard, req);
    if (headers_too_large(w, g, req, 0)) /* (431, and the connection closed) */
        return 0;
    /* before every answer that keeps the connection (414, a target refused, 404, 405): what
     * follows a head framed two ways must never be read as the next request */
    const char *framing = bad_framing(req);
    if (framing) {
        req->http1_is_persistent = 0;
        agw_worker_send_problem(w, req, NULL, 0, 400, "bad-request", "the request is malformed", framing);
        return 0;
    }
    if (req->path.len > g->conf->clients.max_uri_bytes) { /* before a script could build a path too long to send */
        char detail[120];
        snprintf(detail, sizeof(detail), "%zu bytes, the gateway takes %zu (clients.max_uri_bytes)", req->path.len,
                 g->conf->clients.max_uri_bytes);
        agw_worker_send_problem(w, req, NULL, 0, 414, "uri-too-long", "the request target is too long", detail);
        return 0;
    }
    const char *target = origin_form(req); /* (after the length check: the target as it was sent) */
    if (target) {
        agw_worker_send_problem(w, req, NULL, 0, 400, "bad-request", "the request is malformed", target);
        return 0;
    }
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    const char *bpath = g->conf->batch_path;
    if (bpath && h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST")) &&
        h2o_memis(req->path.base, path_len, bpath, strlen(bpath)))
        return on_batch(w, req);
    int endpoint = 0;
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t num_params = 0;
    char allow[128];
    agw_route_result_t m = agw_router_match(&g->conf->router, req->method.base, req->method.len, req->path.base,
                                            path_len, &endpoint, params, &num_params, allow, sizeof(allow));
    if (m == AGW_ROUTE_NOT_FOUND) {
        agw_worker_send_problem(w, req, NULL, 0, 404, "route-not-found", "no route matches this path", NULL);
        return 0;
    }
    if (m == AGW_ROUTE_BAD_PARAM) { /* route_param.h: nothing reaches a script or an upstream */
        agw_worker_send_problem(w, req, NULL, 0, 400, "bad-route-parameter",
                                "a path segment holds characters a route parameter may not", NULL);
        return 0;
    }
    if (m == AGW_ROUTE_METHOD_NOT_ALLOWED) {
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, allow, strlen(allow));
        agw_worker_send_problem(w, req, NULL, 0, 405, "method-not-allowed", "this route does not accept this method",
                                NULL);
        return 0;
    }
    /* an address over its rate is refused before its credentials are checked (limits.c) */
    if (agw_worker_gate_before_edge(w, g, req, endpoint) == AGW_GATE_ANSWERED)
        return 0;
    /* the edge (DESIGN §9): authentication before any Lua (the authenticator's lock and fetch
     * request are its only parts a check writes: the generation's config is otherwise read-only) */
    agw_auth_result_t user;
    agw_edge_refusal_t refusal;
    int refused = agw_edge_authenticate((agw_auth_t *)&g->conf->auth, &g->conf->auth_policies[endpoint - 1],
                                        &w->auth_cache, req, may_wait, &user, &refusal);
    if (refused == AGW_EDGE_WAIT) {
        auth_wait_t *aw = agw_park_new(w, g, req, sizeof(*aw), g->conf->auth.fetch_timeout_ms / 1000.0 + 0.5,
                                       AUTH_POLL_S, &auth_wait_ops);
        aw->fetches_done = user.fetches_done;
        return 0;
    }
    if (refused != 0) {
        if (refusal.status != 503) /* (a key set that cannot be fetched is not the client's failure) */
            agw_worker_gate_charge(w, g, req, endpoint);
        agw_worker_send_problem(w, req, NULL, endpoint, refusal.status, refusal.kind, refusal.title, NULL);
        return 0;
    }
    int gate = agw_worker_gate(w, g, req, endpoint, params, num_params, &user, start_script);
    if (gate == AGW_GATE_ANSWERED)
        json_decref(user.claims); /* a request that goes on keeps it (agw_edge_user_take) */
    if (gate == AGW_GATE_PASS)
        start_script(w, g, req, endpoint, params, num_params, &user);
    return 0;
}

/* Hands a request that passed the edge and the limits to the runtime (runtime.start). */
static void start_script(agw_worker_t *w, wgen_t *g, h2o_req_t *req, int endpoint, const agw_route_param_t *params,
                         size_t num_params, agw_auth_result_t *user)
{
    size_t path_len = req->query_at != SIZE_MAX ? req->query_at : req->path.len;
    reqref_t *rr = h2o_mem_alloc_shared(&req->pool, sizeof(*rr), on_req_dispose);
    __atomic_add_fetch(&w->inflight, 1, __ATOMIC_RELAXED);
    if (w->draining)
        req->http1_is_persistent = 0; /* a keep-alive connection closes after this response */
    rr->w = w;
    rr->g = g;
    agw_worker_gen_hold(g);
    rr->req = req;
    rr->rid = agw_slots_put(&w->tables.reqs, rr);
    rr->endpoint = endpoint;
    rr->started = ev_now(w->loop);
    rr->logline = NULL;
    rr->out_link = (h2o_linklist_t){NULL, NULL}; /* not queued */
    rr->unsent = 0;
    agw_edge_user_take(&rr->user, user);
    if (w->log.access_fd >= 0) {
        rr->logline = agw_malloc(req->method.len + req->path.len + 2);
        memcpy(rr->logline, req->method.base, req->method.len);
        rr->logline[req->method.len] = '\0';
        memcpy(rr->logline + req->method.len + 1, req->path.base, req->path.len);
        rr->logline[req->method.len + 1 + req->path.len] = '\0';
    }
    AGW_M_ADD(w->m->requests_started, 1);
    agw_worker_watch_client(rr, req);
    rr->trace = NULL;
    agw_worker_trace_begin(w, rr, req, path_len);
    uint32_t waited_us = 0;
    if (w->lim.has_note) { /* the limits decision; a wait for Redis counts in the request's time */
        waited_us = w->lim.note.wait_us;
        rr->trace->limit = w->lim.note;
        rr->started -= w->lim.note.wait_us / 1e6;
        rr->trace->start_us -= w->lim.note.wait_us;
        w->lim.has_note = 0;
    }

    lua_State *L = g->L;
    /* runtime.start(rid, endpoint, method, path, params, query, body, user, waited_ms)
     * (lua/agg/contract.lua, tables.start_args): every request's facts as arguments (nil when
     * absent); the headers are not among them (core.request_headers gives the header block,
     * core.request_user the user and token, when the runtime first needs them) */
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_start);
    lua_pushnumber(L, (lua_Number)rr->rid);
    lua_pushinteger(L, endpoint);
    lua_pushlstring(L, req->method.base, req->method.len);
    lua_pushlstring(L, req->path.base, path_len);
    lua_createtable(L, 0, (int)num_params);
    for (size_t i = 0; i < num_params; i++) {
        lua_pushlstring(L, params[i].name, params[i].name_len);
        lua_pushlstring(L, params[i].value, params[i].value_len);
        lua_rawset(L, -3);
    }
    if (req->query_at != SIZE_MAX)
        lua_pushlstring(L, req->path.base + req->query_at + 1, req->path.len - req->query_at - 1);
    else
        lua_pushnil(L);
    if (req->entity.base != NULL)
        lua_pushlstring(L, req->entity.base, req->entity.len);
    else
        lua_pushnil(L);
    /* the edge's verdict: user is true when it authenticated the request (core.request_user
     * hands the user and the token over when first asked), nil when the endpoint has no auth */
    if (agw_edge_user_none(&rr->user))
        lua_pushnil(L);
    else
        lua_pushboolean(L, 1);
    /* how long the request waited before its script (a Redis rate limit's decision): the runtime
     * starts its deadline that much earlier, so the wait counts in it */
    lua_pushnumber(L, waited_us / 1000.0);
    uint64_t rid = rr->rid;
    /* the runtime failed (a bug, never a script error): do not leave the client hanging */
    if (agw_worker_call_runtime(g, 9) != 0 && agw_slots_get(&w->tables.reqs, rid) == rr) {
        agw_slots_del(&w->tables.reqs, rid);
        rr->rid = 0;
        agw_worker_stop_client_watch(rr);
        agw_worker_send_problem(w, req, rr, endpoint, 500, "gateway-error", "the gateway failed to handle the request",
                                "the error was logged by the gateway");
    }
    /* the calls of a burst of pages go out while the rest of the burst runs (upstream/batch.h);
     * every path to a script comes here: h2o's request, one resumed after a JWKS fetch or a Redis
     * limits check, a batch envelope's entry */
    size_t early = agw_batch_send_early(&w->batch);
    if (early)
        AGW_M_ADD(w->m->early_sent, early);
}
