/* conn.c: one connection of the upstream client (see pool.h for the rules, upstream_internal.h
 * for ownership): connect, the TLS handshake, sending the request, reading and parsing the
 * response, going back to the pool or closing, and the connection's events.
 *
 * Message framing (request encoding, response parsing) is in http1.c; the TLS set-up and
 * OpenSSL's result codes are in tls.c. A TLS connection differs only in conn_tls_*: a handshake
 * step between the TCP connect and the first send, and SSL_write/SSL_read in place of send/read;
 * the plain path pays one well-predicted branch per send and per read for it.
 */
#include "upstream/upstream_internal.h"

#include "base/mem.h"

#include "upstream/tls.h"

#include <errno.h>
#include <ev.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <h2o/memory.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void on_conn_io(struct ev_loop *loop, ev_io *w, int revents);
static void on_conn_timer(agw_timeout_t *t);
static void conn_tls_start(agw_conn_t *c);
static void conn_tls_handshake(agw_conn_t *c);
static void conn_tls_send(agw_conn_t *c);
static int conn_tls_read(agw_conn_t *c);
static int conn_tls_idle_record(agw_conn_t *c);

/* ---- connections ---------------------------------------------------------------------- */

void agw_conn_watch(agw_conn_t *c, int events)
{
    if (c->watching == events)
        return;
    struct ev_loop *loop = c->pool->loop;
    ev_io_stop(loop, &c->io);
    ev_io_set(&c->io, c->fd, events);
    ev_io_start(loop, &c->io);
    c->watching = events;
}

/* Closes the socket and frees the connection. Does not serve the wait queue: callers do,
 * through agw_pool_pump(), once they are done with their own state. */
void agw_conn_close(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (c->batched)
        agw_batch_remove(pool->batch, c);
    if (c->rq != AGW_RQ_NONE)
        agw_batch_rq_remove(pool->batch, c);
    ev_io_stop(pool->loop, &c->io);
    agw_timeout_stop(&pool->timeouts, &c->timer);
    if (c->ssl) {
        /* no close_notify exchange (it could block or wait); marking the connection as shut down
         * keeps OpenSSL from making its session unresumable, unless TLS itself failed */
        if (!c->tls_failed)
            SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
        SSL_free(c->ssl);
    }
    close(c->fd);
    if (c->state == AGW_CONN_IDLE)
        agw_pool_idle_remove(pool, c);
    else if (c->state == AGW_CONN_CONNECTING && c->call == NULL)
        agw_pool_orphan_remove(pool, c);
    if (c->call)
        c->call->conn = NULL;
    agw_h1_response_free(&c->resp);
    free(c);
    pool->open--;
}

/* Puts a connection whose response completed cleanly back into the pool. It keeps watching
 * for reads: bytes or EOF on an idle connection close it at once. */
static void conn_make_idle(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    c->state = AGW_CONN_IDLE;
    c->idle_ms = agw_pool_now_ms(pool);
    agw_pool_idle_push(pool, c);
    if (pool->conf->idle_timeout_ms && !ev_is_active(&pool->idle_timer))
        agw_pool_idle_timer(pool); /* (when it runs, it is due for a connection idle longer) */
}

int agw_conn_give_back(agw_conn_t *c)
{
    /* the upstream saw nothing of the call, so there is nothing to stop by closing; closing would
     * cost a connection per cancelled call (an HTTP/2 client resetting streams as fast as it opens
     * them) */
    agw_pool_t *pool = c->pool;
    agw_call_t *call = c->call;
    if (pool->dying || call->sent != 0)
        return 0;
    if (c->batched && c->state == AGW_CONN_SENDING && c->rq == AGW_RQ_NONE) {
        /* a kept-alive connection whose request waits for agw_batch_flush: back to the idle list */
        agw_batch_remove(pool->batch, c);
        c->call = NULL;
        call->conn = NULL;
        pool->stats.reused--; /* it carried no request */
        conn_make_idle(c);
        return 1;
    }
    if (c->state == AGW_CONN_CONNECTING && c->ssl == NULL && !pool->conf->tls) {
        /* a new plain one still connecting: an orphan, idle once connected (on_conn_io) */
        c->call = NULL;
        call->conn = NULL;
        agw_pool_orphan_push(pool, c);
        return 1;
    }
    return 0;
}

void agw_conn_bind(agw_conn_t *c, agw_call_t *call)
{
    c->call = call;
    call->conn = c;
    call->sent = 0;
    agw_h1_response_start(&c->resp, call->head, c->pool->conf->max_body_bytes);
}

/* ---- call completion ------------------------------------------------------------------ */

/* The response buffers of c (which has none) from the pool's spares, when there are any, as its
 * answer's first bytes come. */
static inline void conn_bufs_take(agw_pool_t *pool, agw_conn_t *c)
{
    agw_h1_response_t *r = &c->resp;
    if (pool->nspare == 0 || r->hdrs || r->body.base || r->hstore.base)
        return;
    agw_resp_bufs_t *s = &pool->spare[--pool->nspare];
    r->body = s->body;
    r->hstore = s->hstore;
    r->hdrs = s->hdrs;
    r->hdrs_cap = s->hdrs_cap;
    agw_buf_reset(&r->body);
    agw_buf_reset(&r->hstore);
}

/* The response buffers of c back to the pool's spares (freed when they are full): its answer was
 * handed over. */
static inline void conn_bufs_give(agw_pool_t *pool, agw_conn_t *c)
{
    agw_h1_response_t *r = &c->resp;
    if (pool->nspare < AGW_POOL_SPARE_BUFS) {
        pool->spare[pool->nspare++] = (agw_resp_bufs_t){r->body, r->hstore, r->hdrs, r->hdrs_cap};
    } else {
        agw_buf_free(&r->body);
        agw_buf_free(&r->hstore);
        free(r->hdrs);
    }
    r->body = (agw_buf_t)AGW_BUF_INIT;
    r->hstore = (agw_buf_t)AGW_BUF_INIT;
    r->hdrs = NULL;
    r->hdrs_cap = 0;
}

/* Moves the finished response of c into the pool's delivery buffers and describes it in r; the
 * buffers c read it into (the delivery buffers of the answer before) go back to the spares. */
static void take_response(agw_pool_t *pool, agw_conn_t *c, agw_call_result_t *r)
{
    agw_h1_response_t *resp = &c->resp;
    agw_h1_response_swap(resp, &pool->dbody, &pool->dhstore);
    if (resp->nhdrs > pool->dhdrs_cap) {
        size_t cap = resp->nhdrs < 16 ? 16 : resp->nhdrs;
        agw_header_t *h = agw_realloc(pool->dhdrs, cap * sizeof(*h));
        pool->dhdrs = h;
        pool->dhdrs_cap = cap;
    }
    for (size_t i = 0; i < resp->nhdrs; i++) {
        const agw_h1_hdr_t *e = &resp->hdrs[i];
        pool->dhdrs[i].name = pool->dhstore.base + e->name_off;
        pool->dhdrs[i].name_len = e->name_len;
        pool->dhdrs[i].value = pool->dhstore.base + e->value_off;
        pool->dhdrs[i].value_len = e->value_len;
    }
    r->outcome = AGW_CALL_OK;
    r->http_status = resp->status;
    if (resp->nhdrs) {
        r->headers = pool->dhdrs;
        r->num_headers = resp->nheaders;
        r->trailers = pool->dhdrs + resp->nheaders;
        r->num_trailers = resp->nhdrs - resp->nheaders;
    }
    if (pool->dbody.base) {
        r->body = pool->dbody.base;
        r->body_len = pool->dbody.len;
    }
    conn_bufs_give(pool, c);
}

/* ---- connect, send -------------------------------------------------------------------- */



/* Whether a socket() or connect() error is the gateway's own (descriptors, local ports, kernel
 * memory) rather than the upstream's: such a failure says nothing about the upstream. */
static int local_error(int err)
{
    return err == EMFILE || err == ENFILE || err == EADDRNOTAVAIL || err == ENOBUFS || err == ENOMEM ||
           err == EAGAIN;
}

/* Opens a new connection for call; failures are delivered from the loop. */
void agw_conn_connect_timeout_start(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (pool->conf->connect_timeout_ms == 0)
        return;
    /* the loop's clock is the start of this iteration, which may have worked for longer than
     * connect_timeout_ms before this call (a handler building a large body, a big decode): the
     * connect's own time starts now */
    ev_now_update(pool->loop);
    c->timer_deferred = 0;
    agw_timeout_start(&pool->timeouts, &c->timer, (double)pool->conf->connect_timeout_ms / 1000.0);
}

void agw_conn_open(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    const agw_upstream_conf_t *conf = pool->conf;
    call->state = AGW_CALL_ACTIVE;
    call->reused = 0;
    int fd = socket(conf->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        agw_call_fail(call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED, "cannot open a socket for %s: %s",
                      conf->name, strerror(err));
        return;
    }
    if (conf->addr.ss_family == AF_INET || conf->addr.ss_family == AF_INET6) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (connect(fd, (const struct sockaddr *)&conf->addr, conf->addrlen) != 0 &&
        errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        agw_call_fail(call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED, "cannot connect to %s (%s): %s",
                      conf->name, conf->url, strerror(err));
        return;
    }
    agw_conn_t *c = agw_calloc(1, sizeof(*c));
    c->pool = pool;
    c->fd = fd;
    c->state = AGW_CONN_CONNECTING;
    c->watching = EV_WRITE;
    ev_io_init(&c->io, on_conn_io, fd, EV_WRITE);
    c->io.data = c;
    agw_timeout_init(&c->timer, on_conn_timer);
    ev_io_start(pool->loop, &c->io);
    agw_conn_connect_timeout_start(c);
    pool->open++;
    agw_conn_bind(c, call);
}

/* The connection failed before the response was complete. A reused connection that dies before
 * the first response byte is most likely one the upstream closed as we picked it: retry once on
 * a fresh connection when the method is idempotent. */
static void conn_lost(agw_conn_t *c, agw_call_outcome_t o, const char *what)
{
    agw_call_t *call = c->call;
    agw_pool_t *pool = c->pool;
    const agw_h1_response_t *r = &c->resp;
    if (c->completed > 0 && r->bytes == 0 && call->idempotent && !call->retried) {
        call->retried = 1;
        pool->stats.retried++;
        agw_conn_close(c);
        agw_conn_open(call);
        return;
    }
    if (r->bytes == 0)
        agw_call_fail(call, o, "%s: %s before any response byte%s", pool->conf->name, what,
                  c->completed ? " (on a reused keep-alive connection)" : "");
    else if (!r->final_headers)
        agw_call_fail(call, o, "%s: %s after %zu response bytes, in the headers", pool->conf->name,
                  what, r->bytes);
    else if (r->expect_len != UINT64_MAX)
        agw_call_fail(call, o, "%s: %s after %zu of %llu body bytes", pool->conf->name, what,
                  r->body.len, (unsigned long long)r->expect_len);
    else
        agw_call_fail(call, o, "%s: %s after %zu body bytes", pool->conf->name, what, r->body.len);
}


/* Sends what is left of the request; then waits for the response. While the socket buffer is
 * full it also watches for reads: an upstream may answer before it has read the whole request (a
 * 413 to a large body, RFC 9112 §9.3) and stop reading, or close; that answer is the call's result
 * (on_conn_io reads it), and the connection is not reused. */
void agw_conn_send(agw_conn_t *c)
{
    agw_call_t *call = c->call;
    if (c->ssl) {
        conn_tls_send(c);
        return;
    }
    while (call->sent < call->req_len) {
        size_t left = call->req_len - call->sent;
        ssize_t n = send(c->fd, call->req + call->sent, left, MSG_NOSIGNAL);
        if (n >= 0) {
            call->sent += (size_t)n;
            if ((size_t)n < left) {
                /* the socket buffer is full: wait rather than spend a syscall on EAGAIN */
                c->state = AGW_CONN_SENDING;
                agw_conn_watch(c, EV_READ | EV_WRITE);
                return;
            }
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->state = AGW_CONN_SENDING;
            agw_conn_watch(c, EV_READ | EV_WRITE);
            return;
        }
        char what[96];
        snprintf(what, sizeof(what), "sending the request failed (%s)", strerror(errno));
        /* the upstream may have answered, then closed without reading the rest: the answer (bytes
         * before a reset stay readable) is the result when it is complete */
        if (agw_conn_read(c))
            conn_lost(c, AGW_CALL_RESET, what);
        return;
    }
    c->state = AGW_CONN_READING;
    agw_conn_watch(c, EV_READ);
}

/* Whether idle connection c has unread bytes or EOF: an event the loop saw but on_conn_io has not
 * handled yet (found by this iteration's poll, while a watcher that ran before the pool's is
 * looking for a connection), or bytes that came after the poll (a peek: one system call per
 * reuse; with a batch, agw_batch_flush's one poll for all the iteration's reuses instead). Bytes
 * sent before our request are no answer to it: c must not carry one. Over TLS they may be a
 * record without data (a session ticket, a key update), which is read here, and c stays usable. */
int agw_conn_stale(agw_conn_t *c, int peek)
{
    if (!ev_is_pending(&c->io)) {
        /* nothing the loop saw; bytes may have come since it polled (a second response sent just
         * after the first, while the worker ran a script): a peek finds them, or EOF */
        if (!peek)
            return 0;
        char b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            return 1; /* rare: not worth a second look, a fresh connection is safe */
    }
    if (c->ssl && conn_tls_idle_record(c)) {
        ev_clear_pending(c->pool->loop, &c->io);
        return 0;
    }
    return 1;
}

/* ---- response ------------------------------------------------------------------------- */

/* The final response arrived: the connection goes back to the pool (clean: no stray bytes
 * after it), then the callback runs. */
static void conn_complete(agw_conn_t *c, int clean)
{
    agw_pool_t *pool = c->pool;
    agw_call_t *call = c->call;
    agw_call_result_t r;
    memset(&r, 0, sizeof(r));
    r.body = "";
    take_response(pool, c, &r);
    c->call = NULL;
    call->conn = NULL;
    c->completed++;
    if (clean && c->resp.keep_alive)
        conn_make_idle(c);
    else
        agw_conn_close(c);
    agw_pool_pump(pool); /* the queue's head before anything the callback starts */
    agw_call_deliver(call, &r);
}

static void conn_eof(agw_conn_t *c)
{
    agw_h1_response_eof(&c->resp);
    if (c->resp.done)
        conn_complete(c, 0);
    else if (c->resp.final_headers)
        conn_lost(c, AGW_CALL_TRUNCATED, "connection closed by the upstream");
    else
        conn_lost(c, AGW_CALL_RESET, "connection closed by the upstream");
}

/* Whether nothing follows a complete response of which the last read (n bytes) used every byte,
 * so that the connection may carry the next request. A plain read shorter than its buffer (cap
 * bytes) drained the socket; one that filled it may have left bytes there, which a peek finds
 * (rare: no syscall in the common case). Over TLS, records OpenSSL has not read may wait in the
 * socket: reading them tells data (an answer to no request) from records without data (a session
 * ticket, a key update), which leave the connection usable. */
static int conn_drained(agw_conn_t *c, size_t n, size_t cap)
{
    if (c->ssl)
        return SSL_pending(c->ssl) == 0 && conn_tls_idle_record(c);
    if (n < cap)
        return 1;
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Parses the n bytes just read into buf (cap bytes: pool->rbuf, or a ring's slot). Returns 1 when
 * the response needs more, 0 when the call completed or failed. */
static inline int conn_got(agw_conn_t *c, const char *buf, size_t n, size_t cap)
{
    agw_pool_t *pool = c->pool;
    if (c->resp.bytes == 0)
        conn_bufs_take(pool, c);
    size_t used = agw_h1_response_feed(&c->resp, buf, n);
    agw_call_outcome_t o = agw_h1_response_failed(&c->resp);
    if (o != AGW_CALL_OK) {
        char why[160];
        agw_h1_response_describe(&c->resp, why, sizeof(why));
        agw_call_fail(c->call, o, "%s: %s", pool->conf->name, why);
        return 0;
    }
    if (c->resp.done) {
        /* clean: the whole request went out (not an early answer) and nothing follows the
         * response, in the bytes read, the socket or TLS's records */
        conn_complete(c, used == n && c->call->sent == c->call->req_len && conn_drained(c, n, cap));
        return 0;
    }
    return 1;
}

/* Acts on what a plain read of c into buf (cap bytes) returned: n > 0 bytes, 0 at EOF, or -errno.
 * Returns 2 when the response needs more and the socket may hold more (the read filled buf, or
 * was interrupted), 1 when it needs more, 0 when the call completed or failed (c may be gone). */
int agw_conn_took(agw_conn_t *c, const char *buf, ssize_t n, size_t cap)
{
    if (n > 0) {
        if (!conn_got(c, buf, (size_t)n, cap))
            return 0;
        return (size_t)n < cap ? 1 : 2; /* drained, or more may wait */
    }
    if (n == 0) {
        conn_eof(c);
        return 0;
    }
    if (n == -EINTR || n == -ECANCELED) /* interrupted (ECANCELED: a ring read, never cancelled now) */
        return 2;
    if (n == -EAGAIN || n == -EWOULDBLOCK)
        return 1; /* level-triggered io tells us when there is more */
    if (n == -ECONNRESET) {
        conn_lost(c, AGW_CALL_RESET, "connection reset by the upstream");
    } else {
        char what[96];
        snprintf(what, sizeof(what), "read failed (%s)", strerror((int)-n));
        conn_lost(c, AGW_CALL_RESET, what);
    }
    return 0;
}

/* Reads and parses what the upstream sent. Returns 1 when the response needs more (c still
 * serves its call), 0 when the call completed or failed (c may be gone). */
int agw_conn_read(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (c->ssl)
        return conn_tls_read(c);
    int r;
    do {
        ssize_t n = read(c->fd, pool->rbuf, sizeof(pool->rbuf));
        r = agw_conn_took(c, pool->rbuf, n < 0 ? -(ssize_t)errno : n, sizeof(pool->rbuf));
    } while (r == 2);
    return r;
}

/* ---- TLS ------------------------------------------------------------------------------ */

/* Describes a TLS failure of c into out, marking c so that its session is not resumed. */
static void conn_tls_describe(agw_conn_t *c, agw_tls_status_t st, char *out, size_t cap)
{
    if (st == AGW_TLS_FAILED)
        c->tls_failed = 1;
    agw_tls_describe(c->ssl, st, out, cap);
}

/* One step of the handshake; when it completes, the request is sent. The connect timer keeps
 * running until then: connect_timeout_ms covers TCP connect and handshake together. */
static void conn_tls_handshake(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    ERR_clear_error();
    int rc = SSL_connect(c->ssl);
    if (rc == 1) {
        agw_timeout_stop(&pool->timeouts, &c->timer);
        pool->stats.tls_handshakes++;
        if (SSL_session_reused(c->ssl))
            pool->stats.tls_resumed++;
        c->state = AGW_CONN_SENDING;
        conn_tls_send(c);
        return;
    }
    agw_tls_status_t st = agw_tls_status(c->ssl, rc);
    if (st == AGW_TLS_WANT_READ || st == AGW_TLS_WANT_WRITE) {
        agw_conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
        return;
    }
    char why[160];
    c->tls_failed = 1;
    agw_tls_describe(c->ssl, st, why, sizeof(why));
    if (pool->session) { /* the upstream may have changed: start afresh next time */
        SSL_SESSION_free(pool->session);
        pool->session = NULL;
    }
    agw_call_fail(c->call, AGW_CALL_TLS, "TLS handshake with upstream %s failed: %s", pool->conf->name, why);
}

/* The TCP connection is up: starts TLS on it, offering the pool's last session. */
static void conn_tls_start(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (pool->session && !SSL_SESSION_is_resumable(pool->session)) {
        SSL_SESSION_free(pool->session);
        pool->session = NULL;
    }
    c->ssl = agw_tls_conn_new(pool->conf->tls, c->fd, pool->session, &pool->session);
    if (c->ssl == NULL) {
        agw_call_fail(c->call, AGW_CALL_TLS, "TLS handshake with upstream %s failed: cannot set up a TLS connection",
                  pool->conf->name);
        return;
    }
    c->state = AGW_CONN_HANDSHAKING;
    conn_tls_handshake(c);
}

/* conn_send over TLS. SSL_write is retried with the same arguments after WANT_*, as OpenSSL
 * requires; it may need the socket readable first. */
static void conn_tls_send(agw_conn_t *c)
{
    agw_call_t *call = c->call;
    while (call->sent < call->req_len) {
        size_t left = call->req_len - call->sent;
        ERR_clear_error();
        int n = SSL_write(c->ssl, call->req + call->sent, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0) {
            call->sent += (size_t)n;
            continue;
        }
        agw_tls_status_t st = agw_tls_status(c->ssl, n);
        if (st == AGW_TLS_WANT_READ || st == AGW_TLS_WANT_WRITE) {
            c->state = AGW_CONN_SENDING;
            agw_conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
            return;
        }
        char why[160], what[192];
        conn_tls_describe(c, st, why, sizeof(why));
        snprintf(what, sizeof(what), "sending the request failed (%s)", why);
        conn_lost(c, st == AGW_TLS_FAILED ? AGW_CALL_BAD_RESPONSE : AGW_CALL_RESET, what);
        return;
    }
    c->state = AGW_CONN_READING;
    agw_conn_watch(c, EV_READ);
}

/* conn_read over TLS (same result). Decrypted bytes OpenSSL still holds raise no event on the
 * socket, so the loop goes on while SSL_has_pending(); after that, the socket's readiness says
 * when to come back. */
static int conn_tls_read(agw_conn_t *c)
{
    agw_pool_t *pool = c->pool;
    for (;;) {
        ERR_clear_error();
        int n = SSL_read(c->ssl, pool->rbuf, sizeof(pool->rbuf));
        if (n > 0) {
            if (!conn_got(c, pool->rbuf, (size_t)n, sizeof(pool->rbuf)))
                return 0;
            if (SSL_has_pending(c->ssl))
                continue;
            agw_conn_watch(c, EV_READ);
            return 1;
        }
        agw_tls_status_t st = agw_tls_status(c->ssl, n);
        switch (st) {
        case AGW_TLS_WANT_READ:
        case AGW_TLS_WANT_WRITE:
            agw_conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
            return 1;
        case AGW_TLS_CLOSED:
            ERR_clear_error();
            conn_eof(c);
            return 0;
        case AGW_TLS_EOF:
            ERR_clear_error();
            /* RFC 9112 §9.8: without close_notify only Content-Length and chunked framing can say
             * the response is complete; a close-delimited body is not */
            if (c->resp.final_headers)
                conn_lost(c, AGW_CALL_TRUNCATED, "connection closed without a TLS close_notify");
            else
                conn_eof(c);
            return 0;
        default: {
            char why[160];
            conn_tls_describe(c, st, why, sizeof(why));
            conn_lost(c, st == AGW_TLS_FAILED ? AGW_CALL_BAD_RESPONSE : AGW_CALL_RESET, why);
            return 0;
        }
        }
    }
}

/* An idle TLS connection became readable. Returns 1 when what arrived was only TLS housekeeping
 * (a post-handshake message OpenSSL handled), so the connection stays in the pool. Part of a
 * record that OpenSSL holds while it waits for the rest may be data (an answer to no request,
 * whose rest would come with the next call's answer): not housekeeping, the connection goes. */
static int conn_tls_idle_record(agw_conn_t *c)
{
    ERR_clear_error();
    int n = SSL_read(c->ssl, c->pool->rbuf, sizeof(c->pool->rbuf));
    if (n <= 0 && agw_tls_status(c->ssl, n) == AGW_TLS_WANT_READ)
        return !SSL_has_pending(c->ssl);
    ERR_clear_error();
    return 0;
}

/* ---- events --------------------------------------------------------------------------- */

void agw_conn_batched_event(agw_conn_t *c)
{
    /* no answer to the queued request, and the connection is done (over TLS, unless it was a
     * record without data, as for an idle connection); the call takes another, as from a stale
     * idle connection (agw_call_assign) */
    agw_pool_t *pool = c->pool;
    if (c->ssl && conn_tls_idle_record(c)) {
        ev_clear_pending(pool->loop, &c->io);
        return;
    }
    agw_call_t *call = c->call;
    pool->stats.reused--; /* it carried no request: agw_call_assign counts the next pick */
    agw_conn_close(c);
    agw_call_assign(call);
    agw_pool_pump(pool);
}

static void on_conn_io(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    agw_conn_t *c = w->data;
    agw_pool_t *pool = c->pool;
    if (c->batched) {
        /* bytes or EOF before our request went out (the loop polled before agw_batch_flush) */
        agw_conn_batched_event(c);
        return;
    }
    switch (c->state) {
    case AGW_CONN_IDLE:
        /* the upstream closed it (or sent bytes no one asked for); over TLS it may also have sent
         * a record that carries no data (a session ticket, a key update), which keeps it */
        if (c->ssl == NULL || !conn_tls_idle_record(c))
            agw_conn_close(c);
        break;
    case AGW_CONN_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (c->call == NULL) { /* an orphan (agw_conn_give_back): idle once connected */
            if (err) {
                agw_conn_close(c);
            } else {
                agw_pool_orphan_remove(pool, c);
                agw_timeout_stop(&pool->timeouts, &c->timer);
                agw_conn_watch(c, EV_READ);
                conn_make_idle(c);
            }
            break;
        }
        if (err) {
            agw_call_fail(c->call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED, "cannot connect to %s (%s): %s",
                          pool->conf->name, pool->conf->url, strerror(err));
            break;
        }
        if (pool->conf->tls) {
            conn_tls_start(c);
            break;
        }
        agw_timeout_stop(&pool->timeouts, &c->timer);
        c->state = AGW_CONN_SENDING;
        agw_conn_send(c);
        break;
    }
    case AGW_CONN_HANDSHAKING:
        conn_tls_handshake(c);
        break;
    case AGW_CONN_SENDING:
        /* plain: an answer before the whole request went out (see conn_send); over TLS the events
         * are the ones SSL_write asked for */
        if (c->ssl == NULL && (revents & EV_READ) && !agw_conn_read(c))
            break;
        if (c->ssl || (revents & EV_WRITE))
            agw_conn_send(c);
        break;
    case AGW_CONN_READING:
        if (c->ssl == NULL && pool->batch && pool->batch->ring) {
            /* read with every other answer of this iteration (agw_batch_flush) */
            if (c->rq == AGW_RQ_NONE)
                agw_batch_rq_push(pool->batch, c, AGW_RQ_WAITING);
            return;
        }
        agw_conn_read(c);
        break;
    }
    agw_pool_after_callback(pool);
}

static void on_conn_timer(agw_timeout_t *t)
{
    agw_conn_t *c = H2O_STRUCT_FROM_MEMBER(agw_conn_t, timer, t);
    agw_pool_t *pool = c->pool;
    if ((c->state == AGW_CONN_CONNECTING || c->state == AGW_CONN_HANDSHAKING) && ev_is_pending(&c->io) &&
        !c->timer_deferred) {
        /* the connect (or a handshake step) completed in the poll that made this timer due: the
         * loop was busy past connect_timeout_ms (a loaded machine, many pages in one iteration)
         * and libev runs the pool's timer first (it was queued last). The socket's event is handled
         * first: the timeout is due again after it (a zero delay started in the timeouts' run
         * waits for the loop's next turn, base/timeouts.h), once, and then only counts what is still not
         * done (without this, 50 pages at once beside two busy loops turned connects that had
         * completed into 504s) */
        c->timer_deferred = 1;
        agw_timeout_start(&pool->timeouts, &c->timer, 0.);
        return;
    }
    if (c->call == NULL) /* an orphan that did not connect in time (idle ones: the pool's idle_timer) */
        agw_conn_close(c);
    else
        agw_call_fail(c->call, AGW_CALL_CONNECT_TIMEOUT, "%s: no connection to %s within %llu ms%s",
                  pool->conf->name, pool->conf->url,
                  (unsigned long long)pool->conf->connect_timeout_ms,
                  c->state == AGW_CONN_HANDSHAKING ? " (the TLS handshake did not complete)" : "");
    agw_pool_pump(pool);
}
