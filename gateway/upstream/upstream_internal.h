/* upstream_internal.h: what the files of the upstream client share (included by pool.c, conn.c
 * and batch.c only; nothing outside gateway/upstream/ includes it): the pool's, the call's and
 * the connection's structs, the intrusive lists that link them, and the functions one of these
 * files calls in another.
 *
 *   pool.c   the pool state machine: calls start, wait in the queue (the bulkhead), get a
 *            connection, time out, fail and are delivered; the pool's life
 *   conn.c   a connection's life: connect, TLS handshake, send, read and parse the response,
 *            keep-alive or close, and the connection's events
 *   batch.c  write coalescing and the io_uring batch (batch.h)
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
 * a callback only frees the pool struct once that callback has returned (agw_pool_after_callback).
 *
 * With a ring (uring.h), a plain connection waits on the batch's lists for its I/O: a request on
 * batch->head, an answer to read on rhead, a read done and not yet parsed on lhead; agw_conn_close
 * takes it off whichever it is on, and no callback runs while an operation is in the kernel.
 */
#ifndef AGW_UPSTREAM_INTERNAL_H
#define AGW_UPSTREAM_INTERNAL_H

#include "base/timeouts.h"
#include "limits/limit.h"
#include "upstream/batch.h"
#include "upstream/http1.h"
#include "upstream/pool.h"

#include <ev.h>
#include <openssl/ssl.h>
#include <sys/types.h>

#define AGW_UPSTREAM_READ_BUF 16384
#define AGW_CALL_DETAIL_MAX 192    /* a failed call's detail, NUL included */
#define AGW_POOL_SPARE_BUFS 8      /* response buffer sets a pool keeps for its connections' next answers */

/* The buffers a connection parses a response into (agw_h1_response_t's), while they wait in the
 * pool's spares. */
typedef struct agw_resp_bufs {
    agw_buf_t body, hstore;
    agw_h1_hdr_t *hdrs;
    size_t hdrs_cap;
} agw_resp_bufs_t;

enum agw_conn_state { AGW_CONN_CONNECTING, AGW_CONN_HANDSHAKING, AGW_CONN_SENDING, AGW_CONN_READING, AGW_CONN_IDLE };
enum agw_call_state { AGW_CALL_QUEUED, AGW_CALL_ACTIVE, AGW_CALL_FAILING, AGW_CALL_DELIVERING };
typedef struct agw_conn {
    agw_pool_t *pool;
    agw_call_t *call;            /* the call using it; NULL when idle */
    struct agw_conn *idle_next;      /* idle list (LIFO), doubly linked for removal on EOF */
    struct agw_conn *idle_prev;
    int fd;
    enum agw_conn_state state;
    int watching;                /* events io is armed for */
    unsigned completed;          /* responses completed on this connection (0: fresh) */
    ev_io io;
    agw_timeout_t timer;         /* connect timeout while connecting and in the TLS handshake, on the
                                    pool's timeouts (an idle connection's: the pool's idle_timer) */
    SSL *ssl;                    /* https:// upstreams: the TLS connection; NULL for http:// */
    agw_h1_response_t resp;      /* the response being read; its buffers only from its first byte
                                    until it is handed over (pool->spare, agw_conn_bufs_take) */
    struct agw_conn *batch_next;     /* the pool's batch, while its request waits for agw_batch_flush */
    struct agw_conn *batch_prev;
    unsigned batched : 1;        /* on the batch list */
    unsigned unpeeked : 1;       /* batched from the idle list without its peek (agw_call_assign):
                                  * agw_batch_flush polls it before the write; only while batched */
    unsigned rq : 2;             /* RQ_*: on the batch's read lists (ring only) */
    /* (the two flags below share the word of the three above: the record of a connection stays
     * at 384 bytes, one of jemalloc's size classes, with one per call in flight) */
    unsigned tls_failed : 1;     /* a TLS error ended it: its session is not to be resumed */
    unsigned timer_deferred : 1; /* the connect timer fired with an event of the socket waiting
                                    and gave it one loop pass (on_conn_timer) */
    uint32_t idle_ms;            /* while idle: when it became idle, agw_pool_now_ms (in the word the
                                    flags above leave free: the record stays at 384 bytes) */
    struct agw_conn *rq_next;        /* the batch's list of reads to make, then of reads made */
    struct agw_conn *rq_prev;
    int rres;                    /* AGW_RQ_LANDED: what the read returned (bytes, 0: EOF, -errno) */
    unsigned rslot;              /* AGW_RQ_LANDED: the batch's buffer it read into */
} agw_conn_t;

enum { AGW_RQ_NONE, AGW_RQ_WAITING, AGW_RQ_LANDED };

struct agw_call {
    agw_pool_t *pool;
    agw_call_t *next, *prev;     /* pool's list of live calls */
    agw_call_t *qnext, *qprev;   /* wait queue, while AGW_CALL_QUEUED */
    agw_conn_t *conn;
    agw_call_cb cb;
    void *data;
    agw_timeout_t timer;         /* whole-call timeout, on the pool's timeouts; zero delay to deliver
                                    a failure */
    ev_tstamp started;           /* ev_now() at agw_call_start, s */
    enum agw_call_state state;
    agw_call_outcome_t outcome;  /* set when AGW_CALL_FAILING */
    int http_status;             /* status seen before a failure, 0 if none */
    unsigned idempotent : 1;     /* may be retried (RFC 9110 §9.2.2) */
    unsigned head : 1;
    unsigned reused : 1;         /* the current connection was kept alive */
    unsigned retried : 1;
    uint64_t timeout_ms;
    size_t req_len, sent;        /* bytes of req, bytes of req sent on this connection */
    char *detail;                /* why it failed (AGW_CALL_DETAIL_MAX bytes, allocated by
                                    agw_call_fail: a call that succeeds carries none) */
    char req[];                  /* the serialized request */
};

struct agw_pool {
    struct ev_loop *loop;
    const agw_upstream_conf_t *conf;
    unsigned max_conns;          /* conf->max_connections, 0 read as no limit */
    unsigned open, nidle, pending;
    agw_conn_t *idle;                /* most recently idle first */
    agw_conn_t *idle_oldest;     /* the idle list's last: idle the longest */
    ev_timer idle_timer;         /* due when idle_oldest has been idle for conf->idle_timeout_ms
                                    (agw_pool_idle_timer): one timer for every idle connection of the
                                    pool, not one each, started and stopped with every call */
    agw_timeouts_t timeouts;     /* its calls' and connects' timeouts: one libev timer for all, in an
                                    array that a burst's calls do not keep grown (base/timeouts.h) */
    agw_conn_t *orphans;         /* connections still connecting whose call was cancelled before its
                                    request went out: idle once connected (idle_next/idle_prev) */
    agw_call_t *calls;           /* every live call */
    agw_call_t *qhead, *qtail;   /* wait queue, FIFO */
    agw_pool_stats_t stats;      /* counters only; open/idle/pending filled on demand */
    agw_batch_t *batch;          /* where requests on kept-alive connections wait to be written
                                    (agw_pool_set_batch); NULL: written when the call starts */
    SSL_SESSION *session;        /* https:// upstreams: the last session the upstream issued,
                                    offered by the next new connection (NULL: none yet) */
    struct agw_limit_store *limits; /* the process's limits (agw_pool_set_limits), or NULL */
    agw_limit_rule_t max_rps;    /* conf->max_rps as a rate rule named after the upstream */
    uint64_t max_rps_hash;       /* the upstream's key in limits */
    int depth;                   /* 1 while a callback runs */
    int dying;                   /* agw_pool_destroy() called during a callback */
    /* The finished response a callback is reading (callbacks never nest): swapped out of the
     * connection, so the connection can be reused or closed during the callback. */
    agw_buf_t dbody, dhstore;
    agw_header_t *dhdrs;
    size_t dhdrs_cap;
    /* Response buffers no connection reads into: a connection takes a set when its answer's first
     * bytes come and gives it back once the answer was handed over, so the thousands of
     * connections that wait for slow upstreams hold none (about 1 KB each when they kept theirs;
     * docs/performance.md). Past AGW_POOL_SPARE_BUFS sets the buffers are freed. */
    agw_resp_bufs_t spare[AGW_POOL_SPARE_BUFS];
    unsigned nspare;
    char rbuf[AGW_UPSTREAM_READ_BUF];    /* read buffer: every read is parsed before the next one */
};

/* The pool's clock for idle times, ms: ev_now() in ms, cut to 32 bits. Compared only by
 * difference ((uint32_t)(now - then)), which holds for times up to 49 days apart: the longest idle
 * timeout the pool applies (AGW_POOL_IDLE_MAX_MS). ev_now() follows the system clock: a step of
 * it closes the connections idle at that moment at the timer's next run (they are opened again
 * as calls need them), where a per-connection libev timer kept its monotonic delay. */
#define AGW_POOL_IDLE_MAX_MS UINT32_MAX
static inline uint32_t agw_pool_now_ms(const agw_pool_t *pool)
{
    return (uint32_t)(uint64_t)(ev_now(pool->loop) * 1000.0);
}

/* Puts c first on the idle list. Connections go idle in the order of the pool's clock, so the
 * list runs from the most recently idle to the longest idle (idle_oldest). */
static inline void agw_pool_idle_push(agw_pool_t *pool, agw_conn_t *c)
{
    c->idle_prev = NULL;
    c->idle_next = pool->idle;
    if (pool->idle)
        pool->idle->idle_prev = c;
    else
        pool->idle_oldest = c;
    pool->idle = c;
    pool->nidle++;
}

static inline void agw_pool_idle_remove(agw_pool_t *pool, agw_conn_t *c)
{
    if (c->idle_prev)
        c->idle_prev->idle_next = c->idle_next;
    else
        pool->idle = c->idle_next;
    if (c->idle_next)
        c->idle_next->idle_prev = c->idle_prev;
    else
        pool->idle_oldest = c->idle_prev;
    pool->nidle--;
}

/* The orphans list (agw_pool.orphans) shares the idle list's links: a connection is on at most
 * one of the two. */
static inline void agw_pool_orphan_push(agw_pool_t *pool, agw_conn_t *c)
{
    c->idle_prev = NULL;
    c->idle_next = pool->orphans;
    if (pool->orphans)
        pool->orphans->idle_prev = c;
    pool->orphans = c;
}

static inline void agw_pool_orphan_remove(agw_pool_t *pool, agw_conn_t *c)
{
    if (c->idle_prev)
        c->idle_prev->idle_next = c->idle_next;
    else
        pool->orphans = c->idle_next;
    if (c->idle_next)
        c->idle_next->idle_prev = c->idle_prev;
}

/* Closes the idle connections that have been idle for the pool's idle_timeout_ms (the longest
 * idle first), then arms idle_timer for the next one to reach it, if any (pool.c). */
void agw_pool_idle_timer(agw_pool_t *pool);

static inline void agw_batch_push(agw_batch_t *b, agw_conn_t *c)
{
    c->batch_next = NULL;
    c->batch_prev = b->tail;
    if (b->tail)
        b->tail->batch_next = c;
    else
        b->head = c;
    b->tail = c;
    c->batched = 1;
    b->queued++;
}

static inline void agw_batch_remove(agw_batch_t *b, agw_conn_t *c)
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
    c->unpeeked = 0;
    b->queued--;
}

/* The batch's read lists: AGW_RQ_WAITING on rhead/rtail, AGW_RQ_LANDED on lhead/ltail. */
static inline void agw_batch_rq_push(agw_batch_t *b, agw_conn_t *c, unsigned rq)
{
    agw_conn_t **head = rq == AGW_RQ_WAITING ? &b->rhead : &b->lhead, **tail = rq == AGW_RQ_WAITING ? &b->rtail : &b->ltail;
    c->rq_next = NULL;
    c->rq_prev = *tail;
    if (*tail)
        (*tail)->rq_next = c;
    else
        *head = c;
    *tail = c;
    c->rq = rq;
}

static inline void agw_batch_rq_remove(agw_batch_t *b, agw_conn_t *c)
{
    agw_conn_t **head = c->rq == AGW_RQ_WAITING ? &b->rhead : &b->lhead, **tail = c->rq == AGW_RQ_WAITING ? &b->rtail : &b->ltail;
    if (c->rq_prev)
        c->rq_prev->rq_next = c->rq_next;
    else
        *head = c->rq_next;
    if (c->rq_next)
        c->rq_next->rq_prev = c->rq_prev;
    else
        *tail = c->rq_prev;
    c->rq = AGW_RQ_NONE;
}

/* ---- conn.c --------------------------------------------------------------------------- */

/* Watches c's socket for events (EV_READ, EV_WRITE or both); no system call when unchanged. */
void agw_conn_watch(agw_conn_t *c, int events);

/* Closes the socket and frees the connection, taking it off every list it is on. Does not serve
 * the wait queue: callers do, through agw_pool_pump(), once they are done with their own state. */
void agw_conn_close(agw_conn_t *c);

/* Makes c carry call: a new response is started (buffers reused). */
void agw_conn_bind(agw_conn_t *c, agw_call_t *call);

/* Opens a new connection for call; failures are delivered from the loop. */
void agw_conn_open(agw_call_t *call);

/* Starts c's connect timeout (conf->connect_timeout_ms; none when 0) from now, not from the loop
 * iteration's start, with its one deferral unspent (on_conn_timer): a new connection's, and an
 * orphan's when a call takes it over (agw_call_assign). conn.c. */
void agw_conn_connect_timeout_start(agw_conn_t *c);

/* Sends what is left of c's request, then waits for the response (plain or TLS). */
void agw_conn_send(agw_conn_t *c);

/* Whether idle connection c has unread bytes or EOF: an event the loop saw and did not hand it
 * yet, or (peek non-zero) bytes a peek finds. It is then closed, not reused. A caller that queues
 * c on the batch passes peek 0 and sets c->unpeeked: agw_batch_flush looks at all such
 * connections with one poll(2) before writing. */
int agw_conn_stale(agw_conn_t *c, int peek);

/* Handles bytes or EOF on batched connection c before its request went out (the loop's event, or
 * agw_batch_flush's poll): no answer to that request. c is closed (over TLS, unless it was a
 * record without data: c is then kept) and its call takes another connection, which may be
 * queued on the batch. Runs no callback. */
void agw_conn_batched_event(agw_conn_t *c);

/* Unbinds the connection of a call being cancelled when none of its request went out, and keeps
 * the connection (pool.h's rules). Returns 1 when kept, 0 when the caller must close it. */
int agw_conn_give_back(agw_conn_t *c);

/* Reads and parses what the upstream sent. Returns 1 when the response needs more (c still
 * serves its call), 0 when the call completed or failed (c may be gone). */
int agw_conn_read(agw_conn_t *c);

/* Acts on what a plain read of c into buf (cap bytes) returned: n > 0 bytes, 0 at EOF, or -errno.
 * Returns 2 when the response needs more and the socket may hold more (the read filled buf, or
 * was interrupted), 1 when it needs more, 0 when the call completed or failed (c may be gone). */
int agw_conn_took(agw_conn_t *c, const char *buf, ssize_t n, size_t cap);

/* ---- pool.c --------------------------------------------------------------------------- */

/* Invokes the callback with r (a failure when r is NULL) and frees the call. The caller must
 * check pool->dying afterwards (agw_pool_after_callback). */
void agw_call_deliver(agw_call_t *call, agw_call_result_t *r);

/* Fails a call: closes its connection now, delivers the callback from the loop. */
void agw_call_fail(agw_call_t *call, agw_call_outcome_t o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Gives call a connection: the most recently idle one that is not stale, or a new one. */
void agw_call_assign(agw_call_t *call);

/* Serves the wait queue while connections are free. */
void agw_pool_pump(agw_pool_t *pool);

/* After a callback may have run for one of pool's connections: the pool is freed if the callback
 * destroyed it, else it serves its wait queue (connections may have come free). */
void agw_pool_after_callback(agw_pool_t *pool);

#endif
