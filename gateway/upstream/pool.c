/* pool.c: the upstream client's pool state machine (see pool.h): calls start, wait for a
 * connection in a bounded FIFO (the bulkhead), get the most recently idle connection or a new
 * one, time out as a whole, fail, are cancelled, and are delivered to their callback exactly
 * once. A connection's own life is in conn.c, write coalescing and the io_uring batch in batch.c;
 * upstream_internal.h holds what they share (and the ownership and callback rules).
 *
 * A connection whose response completed goes back to the pool before the callback runs, so a
 * callback that starts the next call (a dependent chain) reuses it. The response bytes the
 * callback reads were first swapped into the pool's delivery buffers, so they stay valid even if
 * the callback's own actions close or reuse that connection.
 */
#include "upstream/upstream_internal.h"

#include "base/buf.h"
#include "base/mem.h"

#include <ev.h>
#include <h2o/memory.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const outcome_names[] = {
    [AGW_CALL_OK] = "ok",
    [AGW_CALL_REFUSED] = "refused",
    [AGW_CALL_CONNECT_TIMEOUT] = "connect_timeout",
    [AGW_CALL_TIMEOUT] = "timeout",
    [AGW_CALL_RESET] = "reset",
    [AGW_CALL_TRUNCATED] = "truncated",
    [AGW_CALL_BAD_RESPONSE] = "bad_response",
    [AGW_CALL_TOO_LARGE] = "too_large",
    [AGW_CALL_OVERLOAD] = "overload",
    [AGW_CALL_BAD_REQUEST] = "bad_request",
    [AGW_CALL_TLS] = "tls",
    [AGW_CALL_LOCAL] = "local",
};

const char *agw_call_outcome_name(agw_call_outcome_t o)
{
    if ((unsigned)o < sizeof(outcome_names) / sizeof(outcome_names[0]) && outcome_names[o])
        return outcome_names[o];
    return "unknown";
}

static void queue_push(agw_pool_t *pool, agw_call_t *call)
{
    call->state = AGW_CALL_QUEUED;
    call->qnext = NULL;
    call->qprev = pool->qtail;
    if (pool->qtail)
        pool->qtail->qnext = call;
    else
        pool->qhead = call;
    pool->qtail = call;
    pool->pending++;
}

static void queue_remove(agw_pool_t *pool, agw_call_t *call)
{
    if (call->qprev)
        call->qprev->qnext = call->qnext;
    else
        pool->qhead = call->qnext;
    if (call->qnext)
        call->qnext->qprev = call->qprev;
    else
        pool->qtail = call->qprev;
    pool->pending--;
}

static void calls_remove(agw_pool_t *pool, agw_call_t *call)
{
    if (call->prev)
        call->prev->next = call->next;
    else
        pool->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
}


/* Invokes the callback with r (a failure when r is NULL) and frees the call. The caller must
 * check pool->dying afterwards. */
void agw_call_deliver(agw_call_t *call, agw_call_result_t *r)
{
    agw_pool_t *pool = call->pool;
    agw_call_result_t failed;
    agw_timeout_stop(&pool->timeouts, &call->timer);
    calls_remove(pool, call);
    if (r == NULL) {
        memset(&failed, 0, sizeof(failed));
        failed.outcome = call->outcome;
        failed.http_status = call->http_status;
        failed.body = "";
        failed.detail = call->detail ? call->detail : agw_call_outcome_name(call->outcome);
        r = &failed;
    }
    r->elapsed_ms = (ev_now(pool->loop) - call->started) * 1000.0;
    r->reused = call->reused;
    call->state = AGW_CALL_DELIVERING;
    if (pool->batch)
        pool->batch->delivered++;
    pool->depth++;
    call->cb(call, r, call->data);
    pool->depth--;
    free(call->detail);
    free(call);
}

/* Fails a call: closes its connection now, delivers the callback from the loop. */
void agw_call_fail(agw_call_t *call, agw_call_outcome_t o, const char *fmt, ...)
{
    agw_pool_t *pool = call->pool;
    va_list ap;
    va_start(ap, fmt);
    if (call->detail == NULL)
        call->detail = agw_malloc(AGW_CALL_DETAIL_MAX);
    vsnprintf(call->detail, AGW_CALL_DETAIL_MAX, fmt, ap);
    va_end(ap);
    call->outcome = o;
    if (call->conn) {
        if (call->conn->resp.final_headers)
            call->http_status = call->conn->resp.status;
        agw_conn_close(call->conn);
    }
    if (call->state == AGW_CALL_QUEUED)
        queue_remove(pool, call);
    call->state = AGW_CALL_FAILING;
    agw_timeout_start(&pool->timeouts, &call->timer, 0.);
}

/* Frees a call without a callback (cancel, destroy). */
static void call_discard(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    if (call->state == AGW_CALL_QUEUED)
        queue_remove(pool, call);
    if (call->conn && !agw_conn_give_back(call->conn))
        agw_conn_close(call->conn);
    agw_timeout_stop(&pool->timeouts, &call->timer);
    calls_remove(pool, call);
    free(call->detail);
    free(call);
}

static void pool_free_if_dying(agw_pool_t *pool);

/* After a callback may have run for one of pool's connections: the pool is freed if the callback
 * destroyed it, else it serves its wait queue (connections may have come free). */
void agw_pool_after_callback(agw_pool_t *pool)
{
    if (pool->dying)
        pool_free_if_dying(pool);
    else
        agw_pool_pump(pool);
}



/* Gives call a connection: the most recently idle one that is not stale, else one still
 * connecting that a cancelled call left (an orphan: the call's request goes out once it is
 * connected), else a new one. */
void agw_call_assign(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    agw_conn_t *c;
    while ((c = pool->idle) != NULL && agw_conn_stale(c, pool->batch == NULL))
        agw_conn_close(c); /* what it got is handled as on_conn_io would: the connection goes */
    if (c == NULL && (c = pool->orphans) != NULL) {
        agw_pool_orphan_remove(pool, c);
        call->state = AGW_CALL_ACTIVE;
        call->reused = 0;
        agw_conn_bind(c, call);
        /* the call gets the whole connect timeout, as with a connection of its own: the loop may
         * not have looked at this one since its connect() (a long iteration), and a timeout it did
         * not wait for would count against the upstream */
        agw_conn_connect_timeout_start(c);
        return;
    }
    if (c == NULL) {
        agw_conn_open(call);
        return;
    }
    agw_pool_idle_remove(pool, c); /* (the pool's idle_timer stays: when due, it looks again) */
    call->state = AGW_CALL_ACTIVE;
    call->reused = 1;
    pool->stats.reused++;
    agw_conn_bind(c, call);
    c->state = AGW_CONN_SENDING;
    if (pool->batch) {
        agw_batch_push(pool->batch, c); /* written by agw_batch_flush, with the others of this iteration */
        c->unpeeked = 1;                /* and looked at there first, with them (one poll) */
    } else {
        agw_conn_send(c);
    }
}

void agw_pool_set_batch(agw_pool_t *pool, agw_batch_t *batch)
{
    pool->batch = batch;
}

/* Serves the wait queue while connections are free. */
void agw_pool_pump(agw_pool_t *pool)
{
    while (pool->qhead && (pool->idle || pool->orphans || pool->open < pool->max_conns)) {
        agw_call_t *call = pool->qhead;
        /* a call whose time ran out in the queue, or that has less left than it takes to
         * connect, gets no connection: it did not get one in time, so it fails as overload (the
         * bulkhead), not as a slow upstream (which its breaker would count) */
        double left_ms = call->timeout_ms - (ev_now(pool->loop) - call->started) * 1000.0;
        double need_ms = pool->idle ? 1.0 : (double)(pool->conf->connect_timeout_ms ? pool->conf->connect_timeout_ms : 1);
        if (left_ms < need_ms) {
            agw_call_fail(call, AGW_CALL_OVERLOAD, "%s: no free connection within %llu ms (all %u busy)", pool->conf->name,
                      (unsigned long long)call->timeout_ms, pool->conf->max_connections);
            continue;
        }
        queue_remove(pool, call);
        agw_call_assign(call);
    }
}


static void on_call_timer(agw_timeout_t *t)
{
    agw_call_t *call = H2O_STRUCT_FROM_MEMBER(agw_call_t, timer, t);
    agw_pool_t *pool = call->pool;
    if (call->state != AGW_CALL_FAILING && call->conn && call->conn->state == AGW_CONN_READING &&
        (ev_is_pending(&call->conn->io) || call->conn->rq == AGW_RQ_WAITING)) {
        /* the request went out and the answer came in the poll that made this timer due: libev
         * runs the timer first (it was queued last), so read what came before calling the upstream
         * late. An answer in hand is the result (without this, a busy loop iteration turned answers
         * that had arrived into timeouts, and those opened breakers of healthy upstreams). With a
         * ring the answer may also wait on the batch for its read: only for an owner that lets the
         * loop poll before it flushes (the worker flushes first, so its reads never wait that long) */
        agw_conn_t *c = call->conn;
        ev_clear_pending(pool->loop, &c->io);
        if (c->rq == AGW_RQ_WAITING)
            agw_batch_rq_remove(pool->batch, c);
        if (!agw_conn_read(c)) { /* the call completed (or failed) and was delivered */
            agw_pool_after_callback(pool);
            return;
        }
    }
    if (call->state != AGW_CALL_FAILING) {
        const char *where = "waiting for a connection";
        size_t got = 0;
        if (call->conn) {
            agw_conn_t *c = call->conn;
            got = c->resp.bytes;
            where = c->state == AGW_CONN_CONNECTING   ? "connecting"
                    : c->state == AGW_CONN_HANDSHAKING ? "in the TLS handshake"
                    : c->state == AGW_CONN_SENDING  ? "sending the request"
                    : c->resp.final_headers     ? "reading the response body"
                                                : "waiting for the response headers";
        }
        if (call->conn == NULL) /* the bulkhead: no connection came free in time */
            agw_call_fail(call, AGW_CALL_OVERLOAD, "%s: no free connection within %llu ms (all %u busy)", pool->conf->name,
                      (unsigned long long)call->timeout_ms, pool->conf->max_connections);
        else
            agw_call_fail(call, AGW_CALL_TIMEOUT, "%s: no response within %llu ms (%s, %zu bytes received)",
                      pool->conf->name, (unsigned long long)call->timeout_ms, where, got);
    }
    agw_call_deliver(call, NULL);
    agw_pool_after_callback(pool);
}

/* ---- public --------------------------------------------------------------------------- */

void agw_pool_idle_timer(agw_pool_t *pool)
{
    uint64_t limit = pool->conf->idle_timeout_ms;
    if (limit > AGW_POOL_IDLE_MAX_MS)
        limit = AGW_POOL_IDLE_MAX_MS;
    uint32_t now = agw_pool_now_ms(pool);
    agw_conn_t *c;
    while ((c = pool->idle_oldest) != NULL && (uint32_t)(now - c->idle_ms) >= limit)
        agw_conn_close(c);
    if (c != NULL) {
        /* (stopped first: a connection that went idle since the timer came due, earlier in the
         * same loop pass, may have started it again, and libev's watchers are set only while
         * stopped) */
        ev_timer_stop(pool->loop, &pool->idle_timer);
        ev_timer_set(&pool->idle_timer, (double)(limit - (uint32_t)(now - c->idle_ms)) / 1000.0, 0.);
        ev_timer_start(pool->loop, &pool->idle_timer);
    }
}

static void on_idle_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop, (void)revents;
    agw_pool_t *pool = w->data;
    agw_pool_idle_timer(pool);
    agw_pool_pump(pool); /* (connections closed: room for new ones) */
}

agw_pool_t *agw_pool_create(struct ev_loop *loop, const agw_upstream_conf_t *conf)
{
    agw_pool_t *pool = agw_calloc(1, sizeof(*pool));
    pool->loop = loop;
    pool->conf = conf;
    pool->max_conns = conf->max_connections ? conf->max_connections : ~0u;
    ev_init(&pool->idle_timer, on_idle_timer);
    pool->idle_timer.data = pool;
    agw_timeouts_init(&pool->timeouts, loop);
    return pool;
}

void agw_pool_set_limits(agw_pool_t *pool, struct agw_limit_store *store)
{
    const agw_upstream_conf_t *c = pool->conf;
    pool->limits = store;
    pool->max_rps = (agw_limit_rule_t){.name = c->name, .key = AGW_LIMIT_KEY_ROUTE, .rate = c->max_rps, .per_s = 1,
                                       .burst = c->max_rps};
    if (c->max_rps) {
        agw_limit_rule_seal(&pool->max_rps);
        pool->max_rps_hash = agw_limit_hash(&pool->max_rps, "upstream", 8);
    }
}

static void pool_free_if_dying(agw_pool_t *pool)
{
    if (pool->dying && pool->depth == 0) {
        agw_timeouts_free(&pool->timeouts); /* (inside a timeout's callback: that run ends) */
        agw_buf_free(&pool->dbody);
        agw_buf_free(&pool->dhstore);
        free(pool->dhdrs);
        for (unsigned i = 0; i < pool->nspare; i++) {
            agw_buf_free(&pool->spare[i].body);
            agw_buf_free(&pool->spare[i].hstore);
            free(pool->spare[i].hdrs);
        }
        if (pool->session)
            SSL_SESSION_free(pool->session);
        free(pool);
    }
}

void agw_pool_destroy(agw_pool_t *pool)
{
    if (pool == NULL || pool->dying)
        return;
    pool->dying = 1;
    while (pool->calls)
        call_discard(pool->calls);
    while (pool->idle)
        agw_conn_close(pool->idle);
    ev_timer_stop(pool->loop, &pool->idle_timer);
    while (pool->orphans)
        agw_conn_close(pool->orphans);
    /* inside a callback the pool is freed when the callback returns */
    pool_free_if_dying(pool);
}

void agw_pool_stats(const agw_pool_t *pool, agw_pool_stats_t *out)
{
    *out = pool->stats;
    out->open = pool->open;
    out->idle = pool->nidle;
    out->pending = pool->pending;
}

agw_call_t *agw_call_start(agw_pool_t *pool, const agw_call_req_t *req, agw_call_cb cb, void *data)
{
    const char *why = NULL;
    if (pool->dying)
        return NULL; /* started from a callback after agw_pool_destroy(): a caller bug */
    size_t len = agw_h1_request_size(pool->conf, req, &why);
    agw_call_t *call = agw_malloc(sizeof(*call) + len + 1);
    memset(call, 0, sizeof(*call));
    call->pool = pool;
    call->cb = cb;
    call->data = data;
    call->started = ev_now(pool->loop);
    call->timeout_ms = req->timeout_ms;
    call->state = AGW_CALL_ACTIVE;
    agw_timeout_init(&call->timer, on_call_timer);
    call->next = pool->calls;
    if (pool->calls)
        pool->calls->prev = call;
    pool->calls = call;
    pool->stats.calls++;

    if (why) {
        agw_call_fail(call, AGW_CALL_BAD_REQUEST, "%s: bad request, nothing sent: %s",
                  pool->conf->name, why);
        return call;
    }
    call->req_len = agw_h1_request_write(pool->conf, req, call->req);
    call->head = strcmp(req->method, "HEAD") == 0;
    call->idempotent = agw_h1_method_idempotent(req->method);
    if (req->timeout_ms == 0) {
        agw_call_fail(call, AGW_CALL_TIMEOUT, "%s: timeout_ms is 0, nothing sent", pool->conf->name);
        return call;
    }
    agw_limit_result_t lr;
    if (pool->limits && pool->conf->max_rps &&
        !agw_limit_take(pool->limits, &pool->max_rps, pool->max_rps_hash, (uint64_t)(ev_now(pool->loop) * 1000.0), &lr)) {
        agw_call_fail(call, AGW_CALL_OVERLOAD, "%s: over max_rps (%llu calls a second across the workers), nothing sent",
                      pool->conf->name, (unsigned long long)pool->conf->max_rps);
        return call;
    }
    agw_timeout_start(&pool->timeouts, &call->timer, (double)req->timeout_ms / 1000.0);
    if (pool->qhead == NULL && (pool->idle || pool->orphans || pool->open < pool->max_conns))
        agw_call_assign(call);
    else if (pool->pending < pool->conf->max_pending)
        queue_push(pool, call);
    else
        agw_call_fail(call, AGW_CALL_OVERLOAD,
                  "%s: overloaded, %u connections busy and %u calls waiting (max_pending)",
                  pool->conf->name, pool->open, pool->pending);
    agw_pool_pump(pool);
    return call;
}

void agw_call_cancel(agw_call_t *call)
{
    if (call == NULL || call->state == AGW_CALL_DELIVERING)
        return;
    agw_pool_t *pool = call->pool;
    pool->stats.cancelled++;
    call_discard(call);
    if (!pool->dying)
        agw_pool_pump(pool);
}
