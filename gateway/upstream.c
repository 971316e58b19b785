/* upstream.c: HTTP/1.1 client with keep-alive pools (see upstream.h).
 *
 * Ownership: the pool owns its idle connections and its live calls; a busy or connecting
 * connection belongs to exactly one call (conn->call, call->conn). Every connection is thus
 * either in the idle list or reachable from a live call, so destroying the pool finds them all.
 *
 * Callbacks are invoked from three places only, each at the top of the loop's owner, never from
 * inside one another: a response completing (on_conn_io, or agw_batch_flush for a batched write
 * that found the answer in, and, with a ring, for every answer read), and the call's own timer
 * (on_call_timer). Every failure detected elsewhere closes the connection at once and arms the
 * call's timer with a zero delay, which is how "never from inside agw_call_start" holds without a
 * second queue. Since callbacks never nest, pool->depth is 0 or 1; agw_pool_destroy() from inside
 * a callback only frees the pool struct once that callback has returned (pool_after_callback).
 *
 * With a ring (uring.h), a plain connection waits on the batch's lists for its I/O: a request on
 * batch->head, an answer to read on rhead, a read done and not yet parsed on lhead; conn_close
 * takes it off whichever it is on, and no callback runs while an operation is in the kernel.
 *
 * A connection whose response completed goes back to the pool before the callback runs, so a
 * callback that starts the next call (a dependent chain) reuses it. The response bytes the
 * callback reads were first swapped into the pool's delivery buffers, so they stay valid even if
 * the callback's own actions close or reuse that connection.
 *
 * Message framing (request encoding, response parsing) is in upstream_http1.c; the TLS set-up and
 * OpenSSL's result codes are in upstream_tls.c. A TLS connection differs only in conn_tls_*:
 * a handshake step between the TCP connect and the first send, and SSL_write/SSL_read in place of
 * send/read; the plain path pays one well-predicted branch per send and per read for it.
 */
#include "upstream.h"

#include "buf.h"
#include "upstream_http1.h"
#include "upstream_tls.h"
#include "uring.h"

#include <errno.h>
#include <ev.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_BUF_SIZE 16384

enum conn_state { CONN_CONNECTING, CONN_HANDSHAKING, CONN_SENDING, CONN_READING, CONN_IDLE };
enum call_state { CALL_QUEUED, CALL_ACTIVE, CALL_FAILING, CALL_DELIVERING };
typedef struct conn {
    agw_pool_t *pool;
    agw_call_t *call;            /* the call using it; NULL when idle */
    struct conn *idle_next;      /* idle list (LIFO), doubly linked for removal on EOF */
    struct conn *idle_prev;
    int fd;
    enum conn_state state;
    int watching;                /* events io is armed for */
    unsigned completed;          /* responses completed on this connection (0: fresh) */
    ev_io io;
    ev_timer timer;              /* connect timeout while connecting and in the TLS handshake, idle
                                    timeout while idle */
    SSL *ssl;                    /* https:// upstreams: the TLS connection; NULL for http:// */
    unsigned tls_failed : 1;     /* a TLS error ended it: its session is not to be resumed */
    agw_h1_response_t resp;      /* the response being read; buffers reused call after call */
    struct conn *batch_next;     /* the pool's batch, while its request waits for agw_batch_flush */
    struct conn *batch_prev;
    unsigned batched : 1;        /* on the batch list */
    unsigned rq : 2;             /* RQ_*: on the batch's read lists (ring only) */
    struct conn *rq_next;        /* the batch's list of reads to make, then of reads made */
    struct conn *rq_prev;
    int rres;                    /* RQ_LANDED: what the read returned (bytes, 0: EOF, -errno) */
    unsigned rslot;              /* RQ_LANDED: the batch's buffer it read into */
} conn_t;

enum { RQ_NONE, RQ_WAITING, RQ_LANDED };

struct agw_call {
    agw_pool_t *pool;
    agw_call_t *next, *prev;     /* pool's list of live calls */
    agw_call_t *qnext, *qprev;   /* wait queue, while CALL_QUEUED */
    conn_t *conn;
    agw_call_cb cb;
    void *data;
    ev_timer timer;              /* whole-call timeout; zero delay to deliver a failure */
    ev_tstamp started;           /* ev_now() at agw_call_start, s */
    enum call_state state;
    agw_call_outcome_t outcome;  /* set when CALL_FAILING */
    int http_status;             /* status seen before a failure, 0 if none */
    unsigned idempotent : 1;     /* may be retried (RFC 9110 §9.2.2) */
    unsigned head : 1;
    unsigned reused : 1;         /* the current connection was kept alive */
    unsigned retried : 1;
    uint64_t timeout_ms;
    size_t req_len, sent;        /* bytes of req, bytes of req sent on this connection */
    char detail[192];
    char req[];                  /* the serialized request */
};

struct agw_pool {
    struct ev_loop *loop;
    const agw_upstream_conf_t *conf;
    unsigned max_conns;          /* conf->max_connections, 0 read as no limit */
    unsigned open, nidle, pending;
    conn_t *idle;                /* most recently idle first */
    conn_t *orphans;             /* connections still connecting whose call was cancelled before its
                                    request went out: idle once connected (idle_next/idle_prev) */
    agw_call_t *calls;           /* every live call */
    agw_call_t *qhead, *qtail;   /* wait queue, FIFO */
    agw_pool_stats_t stats;      /* counters only; open/idle/pending filled on demand */
    agw_batch_t *batch;          /* where requests on kept-alive connections wait to be written
                                    (agw_pool_set_batch); NULL: written when the call starts */
    SSL_SESSION *session;        /* https:// upstreams: the last session the upstream issued,
                                    offered by the next new connection (NULL: none yet) */
    int depth;                   /* 1 while a callback runs */
    int dying;                   /* agw_pool_destroy() called during a callback */
    /* The finished response a callback is reading (callbacks never nest): swapped out of the
     * connection, so the connection can be reused or closed during the callback. */
    agw_buf_t dbody, dhstore;
    agw_header_t *dhdrs;
    size_t dhdrs_cap;
    char rbuf[READ_BUF_SIZE];    /* read buffer: every read is parsed before the next one */
};

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

/* ---- lists ---------------------------------------------------------------------------- */

static void idle_push(agw_pool_t *pool, conn_t *c)
{
    c->idle_prev = NULL;
    c->idle_next = pool->idle;
    if (pool->idle)
        pool->idle->idle_prev = c;
    pool->idle = c;
    pool->nidle++;
}

static void idle_remove(agw_pool_t *pool, conn_t *c)
{
    if (c->idle_prev)
        c->idle_prev->idle_next = c->idle_next;
    else
        pool->idle = c->idle_next;
    if (c->idle_next)
        c->idle_next->idle_prev = c->idle_prev;
    pool->nidle--;
}

static void batch_push(agw_batch_t *b, conn_t *c)
{
    c->batch_next = NULL;
    c->batch_prev = b->tail;
    if (b->tail)
        b->tail->batch_next = c;
    else
        b->head = c;
    b->tail = c;
    c->batched = 1;
}

static void batch_remove(agw_batch_t *b, conn_t *c)
{
    if (c->batch_prev)
        c->batch_prev->batch_next = c->batch_next;
    else
        b->head = c->batch_next;
    if (c->batch_next)
        c->batch_next->batch_prev = c->batch_prev;
    else
        b->tail = c->batch_prev;
    c->batched = 0;
}

/* The batch's read lists: RQ_WAITING on rhead/rtail, RQ_LANDED on lhead/ltail. */
static void rq_push(agw_batch_t *b, conn_t *c, unsigned rq)
{
    conn_t **head = rq == RQ_WAITING ? &b->rhead : &b->lhead, **tail = rq == RQ_WAITING ? &b->rtail : &b->ltail;
    c->rq_next = NULL;
    c->rq_prev = *tail;
    if (*tail)
        (*tail)->rq_next = c;
    else
        *head = c;
    *tail = c;
    c->rq = rq;
}

static void rq_remove(agw_batch_t *b, conn_t *c)
{
    conn_t **head = c->rq == RQ_WAITING ? &b->rhead : &b->lhead, **tail = c->rq == RQ_WAITING ? &b->rtail : &b->ltail;
    if (c->rq_prev)
        c->rq_prev->rq_next = c->rq_next;
    else
        *head = c->rq_next;
    if (c->rq_next)
        c->rq_next->rq_prev = c->rq_prev;
    else
        *tail = c->rq_prev;
    c->rq = RQ_NONE;
}

static void queue_push(agw_pool_t *pool, agw_call_t *call)
{
    call->state = CALL_QUEUED;
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

/* The orphans list (agw_pool.orphans) shares the idle list's links: a connection is on at most
 * one of the two. */
static void orphan_push(agw_pool_t *pool, conn_t *c)
{
    c->idle_prev = NULL;
    c->idle_next = pool->orphans;
    if (pool->orphans)
        pool->orphans->idle_prev = c;
    pool->orphans = c;
}

static void orphan_remove(agw_pool_t *pool, conn_t *c)
{
    if (c->idle_prev)
        c->idle_prev->idle_next = c->idle_next;
    else
        pool->orphans = c->idle_next;
    if (c->idle_next)
        c->idle_next->idle_prev = c->idle_prev;
}

/* ---- connections ---------------------------------------------------------------------- */

static void conn_watch(conn_t *c, int events)
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
 * through pump(), once they are done with their own state. */
static void conn_close(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (c->batched)
        batch_remove(pool->batch, c);
    if (c->rq != RQ_NONE)
        rq_remove(pool->batch, c);
    ev_io_stop(pool->loop, &c->io);
    ev_timer_stop(pool->loop, &c->timer);
    if (c->ssl) {
        /* no close_notify exchange (it could block or wait); marking the connection as shut down
         * keeps OpenSSL from making its session unresumable, unless TLS itself failed */
        if (!c->tls_failed)
            SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
        SSL_free(c->ssl);
    }
    close(c->fd);
    if (c->state == CONN_IDLE)
        idle_remove(pool, c);
    else if (c->state == CONN_CONNECTING && c->call == NULL)
        orphan_remove(pool, c);
    if (c->call)
        c->call->conn = NULL;
    agw_h1_response_free(&c->resp);
    free(c);
    pool->open--;
}

/* Puts a connection whose response completed cleanly back into the pool. It keeps watching
 * for reads: bytes or EOF on an idle connection close it at once. */
static void conn_make_idle(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    c->state = CONN_IDLE;
    idle_push(pool, c);
    if (pool->conf->idle_timeout_ms) {
        ev_timer_set(&c->timer, (double)pool->conf->idle_timeout_ms / 1000.0, 0.);
        ev_timer_start(pool->loop, &c->timer);
    }
}

static void conn_bind(conn_t *c, agw_call_t *call)
{
    c->call = call;
    call->conn = c;
    call->sent = 0;
    agw_h1_response_start(&c->resp, call->head, c->pool->conf->max_body_bytes);
}

/* ---- call completion ------------------------------------------------------------------ */

/* Moves the finished response of c into the pool's delivery buffers and describes it in r. */
static void take_response(agw_pool_t *pool, conn_t *c, agw_call_result_t *r)
{
    agw_h1_response_t *resp = &c->resp;
    agw_h1_response_swap(resp, &pool->dbody, &pool->dhstore);
    if (resp->nhdrs > pool->dhdrs_cap) {
        size_t cap = resp->nhdrs < 16 ? 16 : resp->nhdrs;
        agw_header_t *h = realloc(pool->dhdrs, cap * sizeof(*h));
        if (h == NULL)
            abort();
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
    r->http_status = resp->parser.status_code;
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
}

/* Invokes the callback with r (a failure when r is NULL) and frees the call. The caller must
 * check pool->dying afterwards. */
static void deliver(agw_call_t *call, agw_call_result_t *r)
{
    agw_pool_t *pool = call->pool;
    agw_call_result_t failed;
    ev_timer_stop(pool->loop, &call->timer);
    calls_remove(pool, call);
    if (r == NULL) {
        memset(&failed, 0, sizeof(failed));
        failed.outcome = call->outcome;
        failed.http_status = call->http_status;
        failed.body = "";
        failed.detail = call->detail;
        r = &failed;
    }
    r->elapsed_ms = (ev_now(pool->loop) - call->started) * 1000.0;
    r->reused = call->reused;
    call->state = CALL_DELIVERING;
    pool->depth++;
    call->cb(call, r, call->data);
    pool->depth--;
    free(call);
}

/* Fails a call: closes its connection now, delivers the callback from the loop. */
static void call_fail(agw_call_t *call, agw_call_outcome_t o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void call_fail(agw_call_t *call, agw_call_outcome_t o, const char *fmt, ...)
{
    agw_pool_t *pool = call->pool;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->detail, sizeof(call->detail), fmt, ap);
    va_end(ap);
    call->outcome = o;
    if (call->conn) {
        if (call->conn->resp.final_headers)
            call->http_status = call->conn->resp.parser.status_code;
        conn_close(call->conn);
    }
    if (call->state == CALL_QUEUED)
        queue_remove(pool, call);
    call->state = CALL_FAILING;
    ev_timer_stop(pool->loop, &call->timer);
    ev_timer_set(&call->timer, 0., 0.);
    ev_timer_start(pool->loop, &call->timer);
}

static void conn_make_idle(conn_t *c);

/* Unbinds the connection of a cancelled call whose request has not gone out: a kept-alive one
 * waiting for agw_batch_flush goes back to the idle list; a new plain one still connecting stays
 * open with no call (an orphan) and becomes idle once connected (on_conn_io). The upstream saw
 * nothing of the call, so there is nothing to stop by closing; closing would cost a connection per
 * cancelled call (an HTTP/2 client resetting streams as fast as it opens them). Returns 0 when
 * the connection must be closed instead (some of the request went out, TLS, a pool being freed). */
static int conn_give_back(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    agw_call_t *call = c->call;
    if (pool->dying || call->sent != 0)
        return 0;
    if (c->batched && c->state == CONN_SENDING && c->rq == RQ_NONE) {
        batch_remove(pool->batch, c);
        c->call = NULL;
        call->conn = NULL;
        pool->stats.reused--; /* it carried no request */
        conn_make_idle(c);
        return 1;
    }
    if (c->state == CONN_CONNECTING && c->ssl == NULL && !pool->conf->tls) {
        c->call = NULL;
        call->conn = NULL;
        orphan_push(pool, c);
        return 1;
    }
    return 0;
}

/* Frees a call without a callback (cancel, destroy). */
static void call_discard(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    if (call->state == CALL_QUEUED)
        queue_remove(pool, call);
    if (call->conn && !conn_give_back(call->conn))
        conn_close(call->conn);
    ev_timer_stop(pool->loop, &call->timer);
    calls_remove(pool, call);
    free(call);
}

static void pool_free_if_dying(agw_pool_t *pool);
static void pump(agw_pool_t *pool);

/* After a callback may have run for one of pool's connections: the pool is freed if the callback
 * destroyed it, else it serves its wait queue (connections may have come free). */
static void pool_after_callback(agw_pool_t *pool)
{
    if (pool->dying)
        pool_free_if_dying(pool);
    else
        pump(pool);
}

/* ---- connect, send -------------------------------------------------------------------- */

static void on_conn_io(struct ev_loop *loop, ev_io *w, int revents);
static void on_conn_timer(struct ev_loop *loop, ev_timer *w, int revents);

/* Whether a socket() or connect() error is the gateway's own (descriptors, local ports, kernel
 * memory) rather than the upstream's: such a failure says nothing about the upstream. */
static int local_error(int err)
{
    return err == EMFILE || err == ENFILE || err == EADDRNOTAVAIL || err == ENOBUFS || err == ENOMEM ||
           err == EAGAIN;
}

/* Opens a new connection for call; failures are delivered from the loop. */
static void call_connect(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    const agw_upstream_conf_t *conf = pool->conf;
    call->state = CALL_ACTIVE;
    call->reused = 0;
    int fd = socket(conf->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        call_fail(call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED,
                  "cannot open a socket for %s: %s", conf->name, strerror(err));
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
        call_fail(call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED, "cannot connect to %s (%s): %s",
                  conf->name, conf->url, strerror(err));
        return;
    }
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        abort();
    c->pool = pool;
    c->fd = fd;
    c->state = CONN_CONNECTING;
    c->watching = EV_WRITE;
    ev_io_init(&c->io, on_conn_io, fd, EV_WRITE);
    c->io.data = c;
    ev_init(&c->timer, on_conn_timer);
    c->timer.data = c;
    ev_io_start(pool->loop, &c->io);
    if (conf->connect_timeout_ms) {
        /* the loop's clock is the start of this iteration, which may have worked for longer than
         * connect_timeout_ms before this call (a handler building a large body, a big decode):
         * the connect's own time starts now */
        ev_now_update(pool->loop);
        ev_timer_set(&c->timer, (double)conf->connect_timeout_ms / 1000.0, 0.);
        ev_timer_start(pool->loop, &c->timer);
    }
    pool->open++;
    conn_bind(c, call);
}

/* The connection failed before the response was complete. A reused connection that dies before
 * the first response byte is most likely one the upstream closed as we picked it: retry once on
 * a fresh connection when the method is idempotent. */
static void conn_lost(conn_t *c, agw_call_outcome_t o, const char *what)
{
    agw_call_t *call = c->call;
    agw_pool_t *pool = c->pool;
    const agw_h1_response_t *r = &c->resp;
    if (c->completed > 0 && r->bytes == 0 && call->idempotent && !call->retried) {
        call->retried = 1;
        pool->stats.retried++;
        conn_close(c);
        call_connect(call);
        return;
    }
    if (r->bytes == 0)
        call_fail(call, o, "%s: %s before any response byte%s", pool->conf->name, what,
                  c->completed ? " (on a reused keep-alive connection)" : "");
    else if (!r->final_headers)
        call_fail(call, o, "%s: %s after %zu response bytes, in the headers", pool->conf->name,
                  what, r->bytes);
    else if (r->expect_len != UINT64_MAX)
        call_fail(call, o, "%s: %s after %zu of %llu body bytes", pool->conf->name, what,
                  r->body.len, (unsigned long long)r->expect_len);
    else
        call_fail(call, o, "%s: %s after %zu body bytes", pool->conf->name, what, r->body.len);
}

static void conn_tls_send(conn_t *c);
static int conn_tls_read(conn_t *c);
static int conn_tls_idle_record(conn_t *c);
static int conn_read(conn_t *c);
static int conn_took(conn_t *c, const char *buf, ssize_t n, size_t cap);

/* Sends what is left of the request; then waits for the response. While the socket buffer is
 * full it also watches for reads: an upstream may answer before it has read the whole request (a
 * 413 to a large body, RFC 9112 §9.3) and stop reading, or close; that answer is the call's result
 * (on_conn_io reads it), and the connection is not reused. */
static void conn_send(conn_t *c)
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
                c->state = CONN_SENDING;
                conn_watch(c, EV_READ | EV_WRITE);
                return;
            }
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->state = CONN_SENDING;
            conn_watch(c, EV_READ | EV_WRITE);
            return;
        }
        char what[96];
        snprintf(what, sizeof(what), "sending the request failed (%s)", strerror(errno));
        /* the upstream may have answered, then closed without reading the rest: the answer (bytes
         * before a reset stay readable) is the result when it is complete */
        if (conn_read(c))
            conn_lost(c, AGW_CALL_RESET, what);
        return;
    }
    c->state = CONN_READING;
    conn_watch(c, EV_READ);
}

/* Whether idle connection c has unread bytes or EOF: an event the loop saw but on_conn_io has not
 * handled yet (found by this iteration's poll, while a watcher that ran before the pool's is
 * looking for a connection), or bytes that came after the poll (a peek: one system call per
 * reuse). Bytes sent before our request are no answer to it: c must not carry one. Over TLS they may be a record without data (a session ticket, a key
 * update), which is read here, and c stays usable. */
static int conn_stale(conn_t *c)
{
    if (!ev_is_pending(&c->io)) {
        /* nothing the loop saw; bytes may have come since it polled (a second response sent just
         * after the first, while the worker ran a script): a peek finds them, or EOF */
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

/* Gives call a connection: the most recently idle one that is not stale, or a new one. */
static void call_assign(agw_call_t *call)
{
    agw_pool_t *pool = call->pool;
    conn_t *c;
    while ((c = pool->idle) != NULL && conn_stale(c))
        conn_close(c); /* what it got is handled as on_conn_io would: the connection goes */
    if (c == NULL) {
        call_connect(call);
        return;
    }
    idle_remove(pool, c);
    ev_timer_stop(pool->loop, &c->timer);
    call->state = CALL_ACTIVE;
    call->reused = 1;
    pool->stats.reused++;
    conn_bind(c, call);
    c->state = CONN_SENDING;
    if (pool->batch)
        batch_push(pool->batch, c); /* written by agw_batch_flush, with the others of this iteration */
    else
        conn_send(c);
}

void agw_pool_set_batch(agw_pool_t *pool, agw_batch_t *batch)
{
    pool->batch = batch;
}

/* ---- batched system calls (io_uring, uring.h) ------------------------------------------ */

#define RING_ENTRIES 64        /* operations per submission: the sends of one at most */
#define SLOT_SIZE READ_BUF_SIZE
_Static_assert(AGW_BATCH_READS <= RING_ENTRIES, "a submission of reads fits on the ring");

int agw_batch_ring_init(agw_batch_t *batch, char *err, size_t errcap)
{
    char *slots = malloc((size_t)AGW_BATCH_READS * SLOT_SIZE);
    agw_uring_t *ring = slots ? agw_uring_open(RING_ENTRIES, err, errcap) : NULL;
    if (ring == NULL) {
        if (slots == NULL)
            snprintf(err, errcap, "out of memory");
        free(slots);
        return -1;
    }
    batch->ring = ring;
    batch->slots = slots;
    return 0;
}

void agw_batch_ring_free(agw_batch_t *batch)
{
    agw_uring_close(batch->ring);
    batch->ring = NULL;
    free(batch->slots);
    batch->slots = NULL;
}

/* A ring write of c's request returned res (bytes or -errno). As conn_send: all sent, wait for the
 * answer; a full socket buffer, wait to write the rest; anything else (an error, EINTR) goes back
 * on the batch, and the plain path (agw_batch_flush) writes again and acts on what it gets,
 * callbacks and all. Runs no callback. */
static void ring_sent(void *ctx, void *data, int res)
{
    agw_batch_t *b = ctx;
    conn_t *c = data;
    agw_call_t *call = c->call;
    size_t left = call->req_len - call->sent;
    if (res > 0)
        call->sent += (size_t)res;
    if (res >= 0 && (size_t)res == left) {
        c->state = CONN_READING;
        conn_watch(c, EV_READ);
    } else if (res >= 0 || res == -EAGAIN || res == -EWOULDBLOCK) {
        c->state = CONN_SENDING;
        conn_watch(c, EV_READ | EV_WRITE);
    } else {
        batch_push(b, c);
    }
}

/* A ring read of c returned res: kept on the landed list, parsed once every result is in. */
static void ring_read(void *ctx, void *data, int res)
{
    conn_t *c = data;
    c->rres = res;
    rq_push(ctx, c, RQ_LANDED);
}

/* Reads every answer queued by on_conn_io, AGW_BATCH_READS per submission, then parses them in
 * the order they were queued (the order libev ran the connections' watchers). A callback run by
 * one may close connections still on the landed list (conn_close takes them off); a read that
 * filled its slot, or was interrupted, goes on with plain reads. */
static size_t flush_reads(agw_batch_t *b)
{
    size_t n = 0;
    conn_t *c;
    while (b->rhead) {
        for (unsigned k = 0; k < AGW_BATCH_READS && (c = b->rhead) != NULL; k++) {
            rq_remove(b, c);
            c->rslot = k;
            agw_uring_recv(b->ring, c->fd, b->slots + (size_t)k * SLOT_SIZE, SLOT_SIZE, c); /* fits: see above */
        }
        agw_uring_run(b->ring, ring_read, b);
        while ((c = b->lhead) != NULL) {
            agw_pool_t *pool = c->pool;
            rq_remove(b, c);
            if (conn_took(c, b->slots + (size_t)c->rslot * SLOT_SIZE, c->rres, SLOT_SIZE) == 2)
                conn_read(c);
            pool_after_callback(pool);
            n++;
        }
    }
    return n;
}

/* Writes the queued requests of plain connections, RING_ENTRIES per submission. Only the entries
 * queued when it starts: one that failed is put back behind them for the plain path. TLS
 * connections stay on the batch (OpenSSL writes them). No callback runs here. */
static size_t flush_sends(agw_batch_t *b)
{
    size_t n = 0;
    conn_t *c = b->head, *last = b->tail, *next;
    int end = c == NULL;
    while (!end) {
        unsigned k = 0;
        for (; !end && k < RING_ENTRIES; c = next) {
            next = c->batch_next;
            end = c == last;
            if (c->ssl == NULL) {
                agw_call_t *call = c->call;
                /* fits: k < RING_ENTRIES, the ring's size, and every run empties it */
                agw_uring_send(b->ring, c->fd, call->req + call->sent, call->req_len - call->sent, c);
                batch_remove(b, c);
                k++;
            }
        }
        agw_uring_run(b->ring, ring_sent, b);
        n += k;
    }
    return n;
}

size_t agw_batch_flush(agw_batch_t *batch)
{
    size_t n = 0;
    conn_t *c;
    if (batch->ring) {
        n += flush_reads(batch); /* answers first: their scripts may make more requests */
        n += flush_sends(batch);
    }
    /* one at a time from the head: a write may deliver a callback (an upstream that answered and
     * closed before reading), which may queue or close other connections and destroy this pool;
     * afterwards the pool is freed or serves its queue, as after any callback (on_conn_io) */
    while ((c = batch->head) != NULL) {
        agw_pool_t *pool = c->pool;
        batch_remove(batch, c);
        conn_send(c);
        pool_after_callback(pool);
        n++;
    }
    return n;
}

/* Serves the wait queue while connections are free. */
static void pump(agw_pool_t *pool)
{
    while (pool->qhead && (pool->idle || pool->open < pool->max_conns)) {
        agw_call_t *call = pool->qhead;
        /* a call whose time ran out in the queue, or that has less left than it takes to
         * connect, gets no connection: it did not get one in time, so it fails as overload (the
         * bulkhead), not as a slow upstream (which its breaker would count) */
        double left_ms = call->timeout_ms - (ev_now(pool->loop) - call->started) * 1000.0;
        double need_ms = pool->idle ? 1.0 : (double)(pool->conf->connect_timeout_ms ? pool->conf->connect_timeout_ms : 1);
        if (left_ms < need_ms) {
            call_fail(call, AGW_CALL_OVERLOAD, "%s: no free connection within %llu ms (all %u busy)", pool->conf->name,
                      (unsigned long long)call->timeout_ms, pool->conf->max_connections);
            continue;
        }
        queue_remove(pool, call);
        call_assign(call);
    }
}

/* ---- response ------------------------------------------------------------------------- */

/* The final response arrived: the connection goes back to the pool (clean: no stray bytes
 * after it), then the callback runs. */
static void conn_complete(conn_t *c, int clean)
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
        conn_close(c);
    pump(pool); /* the queue's head before anything the callback starts */
    deliver(call, &r);
}

static void conn_eof(conn_t *c)
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
static int conn_drained(conn_t *c, size_t n, size_t cap)
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
static inline int conn_got(conn_t *c, const char *buf, size_t n, size_t cap)
{
    agw_pool_t *pool = c->pool;
    size_t used = agw_h1_response_feed(&c->resp, buf, n);
    agw_call_outcome_t o = agw_h1_response_failed(&c->resp);
    if (o != AGW_CALL_OK) {
        char why[160];
        agw_h1_response_describe(&c->resp, why, sizeof(why));
        call_fail(c->call, o, "%s: %s", pool->conf->name, why);
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
static int conn_took(conn_t *c, const char *buf, ssize_t n, size_t cap)
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
static int conn_read(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (c->ssl)
        return conn_tls_read(c);
    int r;
    do {
        ssize_t n = read(c->fd, pool->rbuf, sizeof(pool->rbuf));
        r = conn_took(c, pool->rbuf, n < 0 ? -(ssize_t)errno : n, sizeof(pool->rbuf));
    } while (r == 2);
    return r;
}

/* ---- TLS ------------------------------------------------------------------------------ */

/* Describes a TLS failure of c into out, marking c so that its session is not resumed. */
static void conn_tls_describe(conn_t *c, agw_tls_status_t st, char *out, size_t cap)
{
    if (st == AGW_TLS_FAILED)
        c->tls_failed = 1;
    agw_tls_describe(c->ssl, st, out, cap);
}

/* One step of the handshake; when it completes, the request is sent. The connect timer keeps
 * running until then: connect_timeout_ms covers TCP connect and handshake together. */
static void conn_tls_handshake(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    ERR_clear_error();
    int rc = SSL_connect(c->ssl);
    if (rc == 1) {
        ev_timer_stop(pool->loop, &c->timer);
        pool->stats.tls_handshakes++;
        if (SSL_session_reused(c->ssl))
            pool->stats.tls_resumed++;
        c->state = CONN_SENDING;
        conn_tls_send(c);
        return;
    }
    agw_tls_status_t st = agw_tls_status(c->ssl, rc);
    if (st == AGW_TLS_WANT_READ || st == AGW_TLS_WANT_WRITE) {
        conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
        return;
    }
    char why[160];
    c->tls_failed = 1;
    agw_tls_describe(c->ssl, st, why, sizeof(why));
    if (pool->session) { /* the upstream may have changed: start afresh next time */
        SSL_SESSION_free(pool->session);
        pool->session = NULL;
    }
    call_fail(c->call, AGW_CALL_TLS, "TLS handshake with upstream %s failed: %s", pool->conf->name, why);
}

/* The TCP connection is up: starts TLS on it, offering the pool's last session. */
static void conn_tls_start(conn_t *c)
{
    agw_pool_t *pool = c->pool;
    if (pool->session && !SSL_SESSION_is_resumable(pool->session)) {
        SSL_SESSION_free(pool->session);
        pool->session = NULL;
    }
    c->ssl = agw_tls_conn_new(pool->conf->tls, c->fd, pool->session, &pool->session);
    if (c->ssl == NULL) {
        call_fail(c->call, AGW_CALL_TLS, "TLS handshake with upstream %s failed: cannot set up a TLS connection",
                  pool->conf->name);
        return;
    }
    c->state = CONN_HANDSHAKING;
    conn_tls_handshake(c);
}

/* conn_send over TLS. SSL_write is retried with the same arguments after WANT_*, as OpenSSL
 * requires; it may need the socket readable first. */
static void conn_tls_send(conn_t *c)
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
            c->state = CONN_SENDING;
            conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
            return;
        }
        char why[160], what[192];
        conn_tls_describe(c, st, why, sizeof(why));
        snprintf(what, sizeof(what), "sending the request failed (%s)", why);
        conn_lost(c, st == AGW_TLS_FAILED ? AGW_CALL_BAD_RESPONSE : AGW_CALL_RESET, what);
        return;
    }
    c->state = CONN_READING;
    conn_watch(c, EV_READ);
}

/* conn_read over TLS (same result). Decrypted bytes OpenSSL still holds raise no event on the
 * socket, so the loop goes on while SSL_has_pending(); after that, the socket's readiness says
 * when to come back. */
static int conn_tls_read(conn_t *c)
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
            conn_watch(c, EV_READ);
            return 1;
        }
        agw_tls_status_t st = agw_tls_status(c->ssl, n);
        switch (st) {
        case AGW_TLS_WANT_READ:
        case AGW_TLS_WANT_WRITE:
            conn_watch(c, st == AGW_TLS_WANT_READ ? EV_READ : EV_WRITE);
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
 * (a post-handshake message OpenSSL handled), so the connection stays in the pool. */
static int conn_tls_idle_record(conn_t *c)
{
    ERR_clear_error();
    int n = SSL_read(c->ssl, c->pool->rbuf, sizeof(c->pool->rbuf));
    if (n <= 0 && agw_tls_status(c->ssl, n) == AGW_TLS_WANT_READ)
        return 1;
    ERR_clear_error();
    return 0;
}

/* ---- events --------------------------------------------------------------------------- */

static void on_conn_io(struct ev_loop *loop, ev_io *w, int revents)
{
    conn_t *c = w->data;
    agw_pool_t *pool = c->pool;
    if (c->batched) {
        /* bytes or EOF before our request went out (the loop polled before agw_batch_flush): no
         * answer to it, and the connection is done (over TLS, unless it was a record without data,
         * as for an idle connection); the call takes another, as from a stale idle connection
         * (call_assign) */
        if (c->ssl && conn_tls_idle_record(c))
            return;
        agw_call_t *call = c->call;
        pool->stats.reused--; /* it carried no request: call_assign counts the next pick */
        conn_close(c);
        call_assign(call);
        pump(pool);
        return;
    }
    switch (c->state) {
    case CONN_IDLE:
        /* the upstream closed it (or sent bytes no one asked for); over TLS it may also have sent
         * a record that carries no data (a session ticket, a key update), which keeps it */
        if (c->ssl == NULL || !conn_tls_idle_record(c))
            conn_close(c);
        break;
    case CONN_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (c->call == NULL) { /* an orphan (conn_give_back): idle once connected */
            if (err) {
                conn_close(c);
            } else {
                orphan_remove(pool, c);
                ev_timer_stop(loop, &c->timer);
                conn_watch(c, EV_READ);
                conn_make_idle(c);
            }
            break;
        }
        if (err) {
            call_fail(c->call, local_error(err) ? AGW_CALL_LOCAL : AGW_CALL_REFUSED, "cannot connect to %s (%s): %s",
                      pool->conf->name, pool->conf->url, strerror(err));
            break;
        }
        if (pool->conf->tls) {
            conn_tls_start(c);
            break;
        }
        ev_timer_stop(loop, &c->timer);
        c->state = CONN_SENDING;
        conn_send(c);
        break;
    }
    case CONN_HANDSHAKING:
        conn_tls_handshake(c);
        break;
    case CONN_SENDING:
        /* plain: an answer before the whole request went out (see conn_send); over TLS the events
         * are the ones SSL_write asked for */
        if (c->ssl == NULL && (revents & EV_READ) && !conn_read(c))
            break;
        if (c->ssl || (revents & EV_WRITE))
            conn_send(c);
        break;
    case CONN_READING:
        if (c->ssl == NULL && pool->batch && pool->batch->ring) {
            /* read with every other answer of this iteration (agw_batch_flush) */
            if (c->rq == RQ_NONE)
                rq_push(pool->batch, c, RQ_WAITING);
            return;
        }
        conn_read(c);
        break;
    }
    pool_after_callback(pool);
}

static void on_conn_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    conn_t *c = w->data;
    agw_pool_t *pool = c->pool;
    (void)loop;
    (void)revents;
    if (c->state == CONN_IDLE || c->call == NULL) /* idle, or an orphan that did not connect in time */
        conn_close(c);
    else
        call_fail(c->call, AGW_CALL_CONNECT_TIMEOUT, "%s: no connection to %s within %llu ms%s",
                  pool->conf->name, pool->conf->url,
                  (unsigned long long)pool->conf->connect_timeout_ms,
                  c->state == CONN_HANDSHAKING ? " (the TLS handshake did not complete)" : "");
    pump(pool);
}

static void on_call_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    agw_call_t *call = w->data;
    agw_pool_t *pool = call->pool;
    (void)revents;
    if (call->state != CALL_FAILING && call->conn && call->conn->state == CONN_READING &&
        (ev_is_pending(&call->conn->io) || call->conn->rq == RQ_WAITING)) {
        /* the request went out and the answer came in the poll that made this timer due: libev
         * runs the timer first (it was queued last), so read what came before calling the upstream
         * late. An answer in hand is the result (without this, a busy loop iteration turned answers
         * that had arrived into timeouts, and those opened breakers of healthy upstreams). With a
         * ring the answer may also wait on the batch for its read: only for an owner that lets the
         * loop poll before it flushes (the worker flushes first, so its reads never wait that long) */
        conn_t *c = call->conn;
        ev_clear_pending(loop, &c->io);
        if (c->rq == RQ_WAITING)
            rq_remove(pool->batch, c);
        if (!conn_read(c)) { /* the call completed (or failed) and was delivered */
            pool_after_callback(pool);
            return;
        }
    }
    if (call->state != CALL_FAILING) {
        const char *where = "waiting for a connection";
        size_t got = 0;
        if (call->conn) {
            conn_t *c = call->conn;
            got = c->resp.bytes;
            where = c->state == CONN_CONNECTING   ? "connecting"
                    : c->state == CONN_HANDSHAKING ? "in the TLS handshake"
                    : c->state == CONN_SENDING  ? "sending the request"
                    : c->resp.final_headers     ? "reading the response body"
                                                : "waiting for the response headers";
        }
        if (call->conn == NULL) /* the bulkhead: no connection came free in time */
            call_fail(call, AGW_CALL_OVERLOAD, "%s: no free connection within %llu ms (all %u busy)", pool->conf->name,
                      (unsigned long long)call->timeout_ms, pool->conf->max_connections);
        else
            call_fail(call, AGW_CALL_TIMEOUT, "%s: no response within %llu ms (%s, %zu bytes received)",
                      pool->conf->name, (unsigned long long)call->timeout_ms, where, got);
    }
    deliver(call, NULL);
    pool_after_callback(pool);
}

/* ---- public --------------------------------------------------------------------------- */

agw_pool_t *agw_pool_create(struct ev_loop *loop, const agw_upstream_conf_t *conf)
{
    agw_pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return NULL;
    pool->loop = loop;
    pool->conf = conf;
    pool->max_conns = conf->max_connections ? conf->max_connections : ~0u;
    return pool;
}

static void pool_free_if_dying(agw_pool_t *pool)
{
    if (pool->dying && pool->depth == 0) {
        agw_buf_free(&pool->dbody);
        agw_buf_free(&pool->dhstore);
        free(pool->dhdrs);
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
        conn_close(pool->idle);
    while (pool->orphans)
        conn_close(pool->orphans);
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
    agw_call_t *call = malloc(sizeof(*call) + len + 1);
    if (call == NULL)
        return NULL;
    memset(call, 0, sizeof(*call));
    call->pool = pool;
    call->cb = cb;
    call->data = data;
    call->started = ev_now(pool->loop);
    call->timeout_ms = req->timeout_ms;
    call->state = CALL_ACTIVE;
    ev_timer_init(&call->timer, on_call_timer, (double)req->timeout_ms / 1000.0, 0.);
    call->timer.data = call;
    call->next = pool->calls;
    if (pool->calls)
        pool->calls->prev = call;
    pool->calls = call;
    pool->stats.calls++;

    if (why) {
        call_fail(call, AGW_CALL_BAD_REQUEST, "%s: bad request, nothing sent: %s",
                  pool->conf->name, why);
        return call;
    }
    call->req_len = agw_h1_request_write(pool->conf, req, call->req);
    call->head = strcmp(req->method, "HEAD") == 0;
    call->idempotent = agw_h1_method_idempotent(req->method);
    if (req->timeout_ms == 0) {
        call_fail(call, AGW_CALL_TIMEOUT, "%s: timeout_ms is 0, nothing sent", pool->conf->name);
        return call;
    }
    ev_timer_start(pool->loop, &call->timer);
    if (pool->qhead == NULL && (pool->idle || pool->open < pool->max_conns))
        call_assign(call);
    else if (pool->pending < pool->conf->max_pending)
        queue_push(pool, call);
    else
        call_fail(call, AGW_CALL_OVERLOAD,
                  "%s: overloaded, %u connections busy and %u calls waiting (max_pending)",
                  pool->conf->name, pool->open, pool->pending);
    pump(pool);
    return call;
}

void agw_call_cancel(agw_call_t *call)
{
    if (call == NULL || call->state == CALL_DELIVERING)
        return;
    agw_pool_t *pool = call->pool;
    pool->stats.cancelled++;
    call_discard(call);
    if (!pool->dying)
        pump(pool);
}
