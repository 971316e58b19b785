/* worker.c: a worker thread: loops, h2o glue (requests, accept) and the worker's life.
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
 *
 * The rest of the worker: vm.c (its generations), core.c (the Lua transport,
 * "agg.core", and upstream calls), request_log.c (problems, tracing, metrics, the access log);
 * worker_internal.h holds what they share.
 */
#include "worker/worker_internal.h"

#include "base/mem.h"
#include "edge/edge.h"
#include "multi/multi.h"

#include "worker/contract.h"

#include "script/script.h"
#include "worker/watchdog.h"
#include "limits/gate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

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

/* Before libev waits: run what libuv has due now, read the upstream answers that came (with a
 * ring), write the upstream requests and send the responses this iteration made (agw_batch_flush,
 * agw_worker_flush_responses: all at once, see upstream/batch.h), then arm a timer for libuv's next
 * deadline. The flush comes after every run of libuv, whose requests may start calls; an answer
 * it reads runs its page's script, which may start more calls or respond, so it repeats until
 * nothing is queued. upstream/batch.h requires a flush before every poll when there is a ring: this
 * watcher is it. */
static void on_prepare(struct ev_loop *loop, ev_prepare *p, int revents)
{
    (void)revents;
    agw_worker_t *w = p->data;
    int timeout, rounds = 0;
    for (;;) {
        size_t n;
        do { /* upstream requests first: their upstreams start on them while responses go out */
            n = agw_batch_flush(&w->batch);
            n += agw_worker_flush_responses(w);
            n += agw_guard_h2_flush(&w->guard); /* GOAWAYs to clients that cancel too much */
        } while (n > 0);
        if ((timeout = uv_backend_timeout(&w->uvloop)) != 0 || rounds++ == 4)
            break;
        run_uv(w);
    }
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

#define AGW_LONG_ENTRY_MS 10 /* an entry into Lua this long updates the loop's clock, ms */

int agw_worker_call_runtime(wgen_t *g, int nargs)
{
    agw_worker_t *w = g->w;
    lua_State *L = g->L;
    int rc = 0;
    if (w->script.depth == 0)
        agw_gc_entry_begin(&w->gc_timer);
    agw_watchdog_enter(&w->script, L, g->conf->script_time_limit_ms); /* an outermost one is timed */
    if (lua_pcall(L, nargs, 0, 0) != 0) {
        agw_log(AGW_LOG_ERROR, "worker %d: runtime error: %s", w->id, lua_tostring(L, -1));
        lua_pop(L, 1);
        rc = -1;
    }
    /* a long entry (a slow script, one the watchdog stopped) leaves the loop's clock behind:
     * requests read after it in this iteration would start their deadlines and call timeouts
     * that long ago, and time out at once */
    if (agw_watchdog_leave(&w->script) >= AGW_LONG_ENTRY_MS)
        ev_now_update(w->loop);
    if (w->script.depth == 0) /* the worker's pauses in Lua (gc.h) */
        agw_metrics_lua_entry(&w->m->lua_gc, agw_gc_entry_us(&w->gc_timer));
    if (w->script.depth == 0 && w->tables.num_pending_aborts)
        process_pending_aborts(w);
    if (w->script.depth == 0 && !h2o_linklist_is_empty(&w->gens.dead))
        agw_worker_free_dead_gens(w);
    return rc;
}

static void abort_request(wgen_t *g, uint64_t rid)
{
    lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_abort);
    lua_pushnumber(g->L, (lua_Number)rid);
    agw_worker_call_runtime(g, 1);
}

static void process_pending_aborts(agw_worker_t *w)
{
    while (w->tables.num_pending_aborts) {
        agw_pending_abort_t pa = w->tables.pending_aborts[--w->tables.num_pending_aborts];
        abort_request(pa.g, pa.rid);
        agw_worker_gen_release(pa.g);
    }
}

/* ---- requests ------------------------------------------------------------------------------- */

/* Forgets request rid of generation g on the runtime side: its calls are cancelled (now, or once
 * the runtime returns when this runs inside it). */
static void abandon_request(wgen_t *g, uint64_t rid)
{
    agw_worker_t *w = g->w;
    if (w->script.depth) {
        if (w->tables.num_pending_aborts == w->tables.cap_pending_aborts) {
            w->tables.cap_pending_aborts = w->tables.cap_pending_aborts ? w->tables.cap_pending_aborts * 2 : 16;
            w->tables.pending_aborts = agw_realloc(w->tables.pending_aborts, w->tables.cap_pending_aborts * sizeof(*w->tables.pending_aborts));
        }
        w->tables.pending_aborts[w->tables.num_pending_aborts].rid = rid;
        w->tables.pending_aborts[w->tables.num_pending_aborts++].g = g;
        agw_worker_gen_hold(g);
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
    agw_worker_stop_client_watch(rr);
    if (n > 0 || rr->rid == 0)
        return;
    agw_worker_t *w = rr->w;
    uint64_t rid = rr->rid;
    agw_slots_del(&w->tables.reqs, rid);
    rr->rid = 0;
    agw_worker_record_request(w, rr, 499, 0, NULL, 0, NULL, 0);
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
    reqref_t *rr = NULL;
    while (!h2o_linklist_is_empty(&w->watch_queue)) {
        rr = H2O_STRUCT_FROM_MEMBER(reqref_t, watch_link, w->watch_queue.next);
        if (rr->started + CLIENT_WATCH_DELAY > now + 0.0005)
            break;
        int fd = rr->watch_fd;
        agw_worker_watch_unqueue(rr);
        ev_io_init(&rr->client_watch, on_client_readable, fd, EV_READ);
        rr->client_watch.data = rr;
        ev_io_start(loop, &rr->client_watch);
        rr->watching = 1;
        rr = NULL;
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
    rr->watch_link = (h2o_linklist_t){NULL, NULL};
    if (req->version >= 0x200 || req->conn->callbacks->get_socket == NULL)
        return; /* HTTP/2 reads all the time: a reset stream or a closed connection disposes the request */
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd < 0)
        return;
    agw_worker_t *w = rr->w;
    rr->watch_fd = fd;
    h2o_linklist_insert(&w->watch_queue, &rr->watch_link); /* at the end: oldest first */
    if (!ev_is_active(&w->watch_timer)) {
        w->watch_timer.repeat = CLIENT_WATCH_DELAY;
        ev_timer_again(w->loop, &w->watch_timer);
    }
}

void agw_worker_queue_response(reqref_t *rr, const char *body, size_t len)
{
    agw_worker_t *w = rr->w;
    rr->out = h2o_strdup(&rr->req->pool, body, len);
    h2o_linklist_insert(&w->out_queue, &rr->out_link); /* before the anchor: last */
}

size_t agw_worker_flush_responses(agw_worker_t *w)
{
    static h2o_generator_t generator = {NULL, NULL}; /* the whole body goes in one h2o_send */
    size_t n = 0;
    reqref_t *rr;
    while (!h2o_linklist_is_empty(&w->out_queue)) {
        rr = H2O_STRUCT_FROM_MEMBER(reqref_t, out_link, w->out_queue.next);
        h2o_linklist_unlink(&rr->out_link);
        h2o_req_t *req = rr->req;
        h2o_start_response(req, &generator);
        if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD")))
            h2o_send(req, NULL, 0, 1);
        else
            h2o_send(req, &rr->out, 1, 1);
        n++;
    }
    return n;
}

static void on_req_dispose(void *p)
{
    reqref_t *rr = p;
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
    abandon_request(rr->g, rid);
    agw_worker_gen_release(rr->g);
}

/* Checks request framing that h2o lets through (RFC 9112): a header with an empty name (an
 * obsolete line folding); for HTTP/1, in the raw request head (h2o keeps neither field in
 * req->headers), Content-Length with Transfer-Encoding or Content-Length fields that disagree
 * (guard.h). Returns a reason or NULL. */
static const char *bad_framing(h2o_req_t *req)
{
    for (size_t i = 0; i < req->headers.size; i++)
        if (req->headers.entries[i].name->len == 0)
            return "a header line starts with whitespace (obsolete line folding)";
    const char *head;
    size_t len;
    if (agw_guard_http1_head(req, &head, &len) == 0)
        return agw_guard_http1_framing(head, len);
    return NULL;
}

static void record_batch(void *data, h2o_req_t *req, int status, size_t bytes)
{
    agw_worker_record_c_response(data, req, 0, status, bytes);
}

/* The batch endpoint (multi/multi.h): its entries come back here, each as a request of its own. */
static int on_batch(agw_worker_t *w, h2o_req_t *req)
{
    const agw_config_t *conf = w->gens.cur->conf;
    if (agw_multi_is_entry(req)) {
        agw_worker_send_problem(w, req, NULL, 0, 400, "nested-batch", "a batch may not contain a batch", NULL);
        return 0;
    }
    agw_multi_conf_t mc = {.max_requests = conf->batch_max_requests, .deadline_ms = conf->batch_deadline_ms,
                           .loop = w->loop, .record = record_batch, .record_data = w};
    agw_multi_start(req, &mc);
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

int agw_worker_on_req(h2o_handler_t *self, h2o_req_t *req)
{
    (void)self;
    return handle_req(H2O_STRUCT_FROM_MEMBER(agw_worker_t, ctx, req->conn->ctx), req, 1);
}

/* A request from h2o (may_wait: it may wait for a JWKS refetch; 0 when it has waited already). */
static int handle_req(agw_worker_t *w, h2o_req_t *req, int may_wait)
{
    wgen_t *g = w->gens.cur; /* the request runs on this generation to its end, whatever reloads meanwhile */
    if (req->version >= 0x200) /* header bombs: the guard counts header blocks before h2o decodes them */
        agw_guard_h2_watch(&w->guard, req);
    if (headers_too_large(w, g, req, 0))
        return 0;
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
    const char *framing = bad_framing(req);
    if (framing) {
        req->http1_is_persistent = 0;
        agw_worker_send_problem(w, req, NULL, endpoint, 400, "bad-request", "the request is malformed", framing);
        return 0;
    }
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
        agw_worker_send_problem(w, req, NULL, endpoint, refusal.status, refusal.kind, refusal.title, NULL);
        return 0;
    }
    int gate = agw_worker_gate(w, g, req, endpoint, params, num_params, &user, start_script);
    if (gate == AGW_GATE_ANSWERED)
        json_decref(user.claims); /* agw_edge_push_user drops it for a request that goes on */
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
    if (w->log.access_fd >= 0) {
        rr->logline = agw_malloc(req->method.len + req->path.len + 2);
        memcpy(rr->logline, req->method.base, req->method.len);
        rr->logline[req->method.len] = '\0';
        memcpy(rr->logline + req->method.len + 1, req->path.base, req->path.len);
        rr->logline[req->method.len + 1 + req->path.len] = '\0';
    }
    AGW_M_ADD(w->m->requests_started, 1);
    watch_client(rr, req);
    rr->trace = NULL;
    agw_worker_trace_begin(w, rr, req, path_len);
    if (w->lim.has_note) { /* the limits decision; a wait for Redis counts in the request's time */
        rr->trace->limit = w->lim.note;
        rr->started -= w->lim.note.wait_us / 1e6;
        rr->trace->start_us -= w->lim.note.wait_us;
        w->lim.has_note = 0;
    }

    lua_State *L = g->L;
    /* runtime.start(rid, endpoint, method, path, params, arrival) (lua/agg/contract.lua): the
     * query, the header block, the body and the edge's user and token in arrival, one table per
     * VM whose every field is set on each request (nil when absent) */
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
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_keys);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_arrival);
    int keys = lua_gettop(L) - 1, a = keys + 1;
    if (req->query_at != SIZE_MAX)
        lua_pushlstring(L, req->path.base + req->query_at + 1, req->path.len - req->query_at - 1);
    else
        lua_pushnil(L);
    lua_rawgeti(L, keys, AGW_KEY_ARRIVAL + AGW_ARRIVAL_QUERY);
    lua_insert(L, -2);
    lua_rawset(L, a);
    agw_buf_t *hb = &w->scratch.hdrs;
    { /* at most clients.max_headers fields (headers_too_large) */
        size_t n = req->headers.size;
        agw_header_t small[128], *f = n <= 128 ? small : agw_malloc(n * sizeof(*f));
        for (size_t i = 0; i < n; i++) {
            const h2o_header_t *h = &req->headers.entries[i];
            f[i] = (agw_header_t){.name = h->name->base, .name_len = h->name->len, .value = h->value.base,
                                  .value_len = h->value.len};
        }
        agw_worker_header_block(hb, f, n);
        if (f != small)
            free(f);
    }
    lua_rawgeti(L, keys, AGW_KEY_ARRIVAL + AGW_ARRIVAL_HEADERS);
    lua_pushlstring(L, hb->base ? hb->base : "", hb->len);
    lua_rawset(L, a);
    lua_rawgeti(L, keys, AGW_KEY_ARRIVAL + AGW_ARRIVAL_BODY);
    if (req->entity.base != NULL)
        lua_pushlstring(L, req->entity.base, req->entity.len);
    else
        lua_pushnil(L);
    lua_rawset(L, a);
    /* the edge's verdict: user (a table, or nil when the endpoint has no auth) and the verified
     * bearer token (a JWT's, else nil) */
    agw_edge_push_user(L, user);
    lua_rawgeti(L, keys, AGW_KEY_ARRIVAL + AGW_ARRIVAL_TOKEN);
    lua_insert(L, -2);
    lua_rawset(L, a);
    lua_rawgeti(L, keys, AGW_KEY_ARRIVAL + AGW_ARRIVAL_USER);
    lua_insert(L, -2);
    lua_rawset(L, a);
    lua_remove(L, keys);
    uint64_t rid = rr->rid;
    /* the runtime failed (a bug, never a script error): do not leave the client hanging */
    if (agw_worker_call_runtime(g, 6) != 0 && agw_slots_get(&w->tables.reqs, rid) == rr) {
        agw_slots_del(&w->tables.reqs, rid);
        rr->rid = 0;
        agw_worker_stop_client_watch(rr);
        agw_worker_send_problem(w, req, rr, endpoint, 500, "gateway-error", "the gateway failed to handle the request",
                                "the error was logged by the gateway");
    }
}

/* ---- accept --------------------------------------------------------------------------------- */

/* An accepted connection: its libuv handle and, on a TLS listener, a reference to the SSL_CTX it
 * was accepted with, held until the connection closes. h2o 2.2 keeps only a plain pointer to that
 * SSL_CTX until the client's first bytes arrive (SSL_new, which takes OpenSSL's own reference,
 * runs then), and a reload may meanwhile give the listener another one and drop this one. */
typedef struct conn {
    uv_tcp_t tcp;       /* first: h2o's close callback gets its address */
    SSL_CTX *ssl_ctx;   /* one reference, or NULL (cleartext) */
    agw_worker_t *w;
    agw_guard_conn_t guard; /* its HTTP/2 cancel window (guard.h) */
} conn_t;

static void accept_one(listener_t *l);

/* This worker's share of clients.max_connections (at least 1). */
static unsigned conn_share(agw_worker_t *w)
{
    const agw_config_t *conf = w->gens.cur->conf;
    unsigned workers = conf->workers ? conf->workers : 1;
    unsigned share = (conf->clients.max_connections + workers - 1) / workers;
    return share ? share : 1;
}

static void on_conn_close(uv_handle_t *h)
{
    conn_t *c = (conn_t *)h;
    agw_worker_t *w = c->w;
    SSL_CTX_free(c->ssl_ctx); /* after h2o's SSL_free: the socket is disposed before its handle closes */
    agw_guard_conn_close(&w->guard, &c->guard);
    free(c);
    w->client_conns--;
    /* a slot came free: a listener paused at the cap takes the connection libuv holds for it */
    for (size_t i = 0; i < w->num_listeners && w->num_paused && w->client_conns < conn_share(w); i++) {
        listener_t *l = &w->listeners[i];
        if (l->paused && !uv_is_closing((uv_handle_t *)&l->handle)) {
            l->paused = 0;
            w->num_paused--;
            accept_one(l);
        }
    }
}

/* Takes the connection libuv has accepted on l's socket and hands it to h2o. */
static void accept_one(listener_t *l)
{
    agw_worker_t *w = l->worker;
    conn_t *conn = agw_calloc(1, sizeof(*conn));
    conn->w = w;
    conn->guard.fd = -1;
    uv_tcp_init(&w->uvloop, &conn->tcp);
    w->client_conns++; /* on_conn_close counts it down, whatever happens next */
    if (uv_accept((uv_stream_t *)&l->handle, (uv_stream_t *)&conn->tcp) != 0) {
        uv_close((uv_handle_t *)&conn->tcp, on_conn_close);
        return;
    }
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&conn->tcp, &fd) == 0)
        agw_guard_conn_open(&w->guard, &conn->guard, fd, AGW_WORKER_MAX_FIELDS(&w->gens.cur->conf->clients),
                            AGW_WORKER_MAX_BLOCK_BYTES(&w->gens.cur->conf->clients));
    uv_tcp_nodelay(&conn->tcp, 1);
    if ((conn->ssl_ctx = l->accept_ctx.ssl_ctx) != NULL)
        SSL_CTX_up_ref(conn->ssl_ctx);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&conn->tcp, on_conn_close);
    h2o_accept(&l->accept_ctx, sock);
}

/* A client connection is ready on l. At the worker's share of clients.max_connections the
 * listener pauses: libuv keeps the connection it accepted and stops polling the listening socket
 * until on_conn_close takes it (uv_accept restarts the polling), so further clients wait in the
 * kernel's backlog instead of costing descriptors. When accept itself fails for want of
 * descriptors (EMFILE, ENFILE), libuv drops the pending connections with a descriptor it keeps
 * for that (no busy loop); the log says so at most once per 10 s. */
static void on_accept(uv_stream_t *server, int status)
{
    listener_t *l = server->data;
    agw_worker_t *w = l->worker;
    if (status != 0) {
        double now = ev_now(w->loop);
        if (now - w->accept_warned >= 10.0) {
            w->accept_warned = now;
            agw_log(AGW_LOG_WARN, "worker %d: cannot accept client connections: %s; they are closed until "
                    "descriptors come free (raise the open-files limit or lower clients.max_connections)",
                    w->id, uv_strerror(status));
        }
        return;
    }
    if (w->client_conns >= conn_share(w)) {
        if (!l->paused) {
            l->paused = 1;
            w->num_paused++;
        }
        return;
    }
    accept_one(l);
}

/* ---- thread --------------------------------------------------------------------------------- */

/* Once a second: the runtime's retry/hedge/single-flight totals of every live generation and the
 * current generation's pool gauges; the cache purges the admin listener posted. */
static void purge_tier1(void *arg, const char *prefix, size_t len)
{
    agw_worker_t *w = arg;
    if (w->cache.lru)
        agw_lru_purge_prefix(w->cache.lru, prefix, len);
}

/* Once a second: when no request started for AGW_GC_IDLE_S ticks and none is in flight, full
 * collections of every VM and the C heap's free memory back to the kernel, once per idle spell,
 * then the C heap's trim again every AGW_GC_TRIM_S s while it stays idle (gc.h); and the VMs'
 * heap size for the metrics. */
static void worker_idle_tick(agw_worker_t *w)
{
    uint64_t started = AGW_M_GET(w->m->requests_started);
    size_t heap = 0;
    if (started != w->idle_started || started != AGW_M_GET(w->m->requests_ended)) {
        w->idle_started = started;
        w->idle_ticks = 0;
    } else if (++w->idle_ticks == AGW_GC_IDLE_S) {
        for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live; l = l->next) {
            wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
            agw_gc_idle(g->L, &w->m->lua_gc);
        }
        agw_worker_log_release_spares(w); /* the records of the requests and calls of the burst */
        agw_worker_calls_release_spares(w);
        agw_gc_trim();
    } else if (w->idle_ticks % AGW_GC_TRIM_S == 0) {
        agw_gc_trim(); /* what idle upstream connections closing since then freed */
    }
    agw_gc_timer_calibrate(&w->gc_timer);
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live; l = l->next)
        heap += (size_t)lua_gc(H2O_STRUCT_FROM_MEMBER(wgen_t, link, l)->L, LUA_GCCOUNT, 0) * 1024u;
    AGW_M_SET(w->m->lua_gc.heap_bytes, heap);
}

static void on_stats_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = t->data;
    agw_cache_inbox_take(&w->m->purge, purge_tier1, w); /* POST /cache/purge (cache/purge.h) */
    agw_worker_reap_pools(w); /* pools of endpoint addresses that went away (group/directory.h) */
    for (size_t i = 0; i < w->gens.cur->conf->num_upstreams; i++)
        agw_worker_publish_pool(w->gens.cur, i);
    for (h2o_linklist_t *l = w->gens.live.next; l != &w->gens.live;) {
        wgen_t *g = H2O_STRUCT_FROM_MEMBER(wgen_t, link, l);
        h2o_linklist_t *next = l->next;
        if (g->ref_report_stats != LUA_NOREF) {
            agw_worker_gen_hold(g);
            lua_rawgeti(g->L, LUA_REGISTRYINDEX, g->ref_report_stats);
            lua_pushboolean(g->L, g == w->gens.cur); /* current: only it health checks (agg.health) */
            agw_worker_call_runtime(g, 1);
            next = l->next; /* the list may have changed meanwhile; g is still on it (held) */
            agw_worker_gen_release(g);
        }
        l = next;
    }
    worker_idle_tick(w);
}

static void *worker_main(void *arg)
{
    agw_worker_t *w = arg;
    agw_watchdog_attach(&w->script);
    /* A client connection's input buffer: 4 KB (h2o's default is 8 KB, per thread). libuv's read
     * asks h2o for 4 KB free at every read, so this is the least a read gets; a request bigger
     * than that grows its buffer as before. Half the default is 4 KB less per open connection
     * (tools/bench/memory: 5,000 pages in flight on 5,000 connections). */
    h2o_socket_buffer_prototype._initial_buf.capacity = H2O_SOCKET_INITIAL_INPUT_BUFFER_SIZE;
    ev_run(w->loop, 0);
    agw_guard_dispose(&w->guard);
    agw_worker_cache_close(w);
    agw_auth_cache_free(&w->auth_cache);
    agw_worker_log_close(w);
    agw_worker_calls_release_spares(w);
    return NULL;
}

int agw_worker_ring_wanted(agw_buf_t *errors)
{
    const char *v = getenv("AGGWAY_IO_URING");
    if (v == NULL || strcmp(v, "on") == 0)
        return 1;
    if (strcmp(v, "off") == 0)
        return 0;
    agw_buf_printf(errors, "AGGWAY_IO_URING=%s: must be on or off (unset: on)\n", v);
    return -1;
}

agw_worker_t *agw_worker_start(int id, agw_generation_t *gen, h2o_globalconf_t *globalconf,
                               const agw_listener_fd_t *fds, size_t num_fds, agw_metrics_t *metrics, int access_fd,
                               agw_limit_store_t *limits, agw_buf_t *errors)
{
    agw_worker_t *w = agw_calloc(1, sizeof(*w));
    agw_gc_timer_init(&w->gc_timer); /* before any entry into Lua */
    w->id = id;
    w->script.id = id;
    w->m = metrics;
    w->limits = limits;
    agw_worker_log_init(&w->log, access_fd, gen->conf.admin_port != 0, w);
    w->rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)time(NULL) << 8) ^ (uint64_t)(id + 1);
    /* trace ids must not repeat across gateways started in the same second */
    if (getrandom(&w->log.trace_rng, sizeof(w->log.trace_rng), GRND_NONBLOCK) != (ssize_t)sizeof(w->log.trace_rng))
        w->log.trace_rng = w->rng ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)w;
    if (w->log.trace_rng == 0)
        w->log.trace_rng = w->rng;
    wgen_t *first = agw_worker_prepare(w, gen, errors);
    if (first == NULL) {
        free(w);
        return NULL;
    }
    agw_worker_gens_init(&w->gens);
    w->loop = ev_loop_new(EVFLAG_AUTO);
    uv_loop_init(&w->uvloop);
    ev_io_init(&w->uv_io, on_uv_io, uv_backend_fd(&w->uvloop), EV_READ);
    w->uv_io.data = w;
    ev_io_start(w->loop, &w->uv_io);
    ev_init(&w->uv_timer, on_uv_timer);
    w->uv_timer.data = w;
    h2o_linklist_init_anchor(&w->out_queue);
    h2o_linklist_init_anchor(&w->watch_queue);
    /* the upstream I/O of each loop iteration in batched system calls (io_uring, upstream/batch.h);
     * AGGWAY_IO_URING=off makes one system call per operation */
    if (agw_worker_ring_wanted(errors) == 1) {
        char why[128];
        if (agw_batch_ring_init(&w->batch, why, sizeof(why)) != 0)
            agw_log(AGW_LOG_WARN, "upstream I/O: one system call per operation: %s (worker %d)", why, id);
    }
    if (id == 0 && w->batch.ring)
        agw_log(AGW_LOG_INFO, "upstream I/O: batched per loop iteration (io_uring)");
    ev_prepare_init(&w->uv_prepare, on_prepare);
    w->uv_prepare.data = w;
    ev_prepare_start(w->loop, &w->uv_prepare);
    ev_async_init(&w->stop_async, on_stop);
    ev_async_start(w->loop, &w->stop_async);
    ev_async_init(&w->drain_async, on_drain);
    w->drain_async.data = w;
    ev_async_start(w->loop, &w->drain_async);
    ev_async_init(&w->gens.reload_async, agw_worker_on_reload);
    w->gens.reload_async.data = w;
    ev_async_start(w->loop, &w->gens.reload_async);
    ev_timer_init(&w->stats_timer, on_stats_timer, 1., 1.);
    w->stats_timer.data = w;
    ev_timer_start(w->loop, &w->stats_timer);
    ev_init(&w->watch_timer, on_watch_timer);
    w->watch_timer.data = w;

    h2o_context_init(&w->ctx, &w->uvloop, globalconf);
    agw_guard_init(&w->guard, &w->ctx);

    w->listeners = agw_calloc(num_fds ? num_fds : 1, sizeof(*w->listeners));
    w->num_listeners = num_fds;
    for (size_t i = 0; i < num_fds; i++) {
        listener_t *l = &w->listeners[i];
        l->worker = w;
        l->accept_ctx.ctx = &w->ctx;
        l->accept_ctx.hosts = globalconf->hosts;
        l->accept_ctx.ssl_ctx = NULL; /* the generation's (agw_worker_gen_activate) */
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
    agw_worker_gen_activate(w, first); /* also gives the TLS listeners their SSL_CTX */
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        agw_buf_puts(errors, "cannot start a worker thread\n");
        return NULL;
    }
    w->script.thread = w->thread; /* before the watchdog starts (server.c) */
    return w;
}

uint64_t agw_worker_generation(const agw_worker_t *w)
{
    return __atomic_load_n(&w->gens.serving, __ATOMIC_ACQUIRE);
}

void agw_worker_drain(agw_worker_t *w)
{
    ev_async_send(w->loop, &w->drain_async);
}

agw_watchdog_target_t *agw_worker_watchdog_target(agw_worker_t *w)
{
    return &w->script;
}

int agw_worker_inflight(const agw_worker_t *w)
{
    return __atomic_load_n(&w->inflight, __ATOMIC_RELAXED);
}

int agw_worker_stop(agw_worker_t *w, uint64_t wait_ms)
{
    ev_async_send(w->loop, &w->stop_async);
    struct timespec until = agw_clock_after_ms(CLOCK_REALTIME, wait_ms); /* pthread_timedjoin_np's clock */
    if (pthread_timedjoin_np(w->thread, NULL, &until) != 0)
        return -1; /* still running: leave everything it may touch alone */
    for (size_t i = 0; i < w->num_listeners; i++) { /* connections still open keep their own */
        SSL_CTX_free(w->listeners[i].accept_ctx.ssl_ctx);
        w->listeners[i].accept_ctx.ssl_ctx = NULL;
    }
    wgen_t *pending = agw_worker_gens_take(&w->gens);
    if (pending)
        agw_worker_gen_discard(pending);
    return 0;
}
