/* accept.c: client connections: accepting them on the worker's listeners while the gateway is under
 * clients.max_connections (one count for every worker, client_slots.h: at the cap the listeners
 * pause, and a connection's close on any worker starts them again),
 * accepting without descriptors (the listener rests), and the TLS context a connection holds
 * until it closes.
 *
 * The worker accepts itself (a libev watcher and accept4), then hands the socket to libuv and h2o.
 * libuv's own accept loop is not used: when accept fails for want of descriptors it closes a
 * descriptor it keeps in reserve, drops the waiting connections and opens the reserve again, and
 * if another thread of the process (another worker, the admin listener, the resolver) takes that
 * number meanwhile, its next EMFILE has no reserve and its loop calls accept again at once,
 * without returning to the event loop: the worker spins at 100 % of a core and serves nothing
 * until some other thread frees a descriptor.
 */
#include "worker/worker_internal.h"

#include "base/mem.h"
#include "base/log.h"
#include "base/tcp_info.h"
#include "front/inbuf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* An accepted connection: its libuv handle and, on a TLS listener, a reference to the SSL_CTX it
 * was accepted with, held until the connection closes. h2o 2.2 keeps only a plain pointer to that
 * SSL_CTX until the client's first bytes arrive (SSL_new, which takes OpenSSL's own reference,
 * runs then), and a reload may meanwhile give the listener another one and drop this one. */
typedef struct conn {
    uv_tcp_t tcp;       /* first: h2o's close callback gets its address */
    SSL_CTX *ssl_ctx;   /* one reference, or NULL (cleartext) */
    agw_worker_t *w;
    agw_guard_conn_t guard; /* its HTTP/2 cancel window (guard.h) */
    /* what a graceful shutdown needs to tell an idle connection from a busy one
     * (agw_worker_busy_conns) */
    h2o_socket_t *sock;     /* h2o's socket (freed by h2o just before on_conn_close) */
    h2o_linklist_t link;    /* on w->conns while open */
    unsigned served : 1;    /* a request has begun on it */
    unsigned h2 : 1;        /* an HTTP/2 connection (agw_guard_h2_streams listed it) */
    unsigned h2_idle_asked : 1; /* HTTP/2: h2o was asked to close it as idle (GOAWAY) since a
                                   request last began on it */
    struct st_h2o_http2_conn_t *h2conn; /* HTTP/2: h2o's connection, as the sweep's count found it
                                           (NULL outside a sweep: valid only until h2o runs) */
    unsigned h2_streams;    /* HTTP/2: its open streams at the last count */
    unsigned h2_sending;    /* HTTP/2: its streams sending a body, at the last count */
    uint64_t h2_receiving_ms; /* HTTP/2: how long its oldest request still arriving has been, at the
                                 last count (0: none) */
    double h2_active_at;    /* ev_now() when it was accepted, a request began on it, or a sweep saw
                               it with a stream open */
    double h2_receiving_since; /* ev_now() of the first sweep that saw a request arriving on it since
                                  a request last began on it (0: none seen) */
    uint64_t acked;         /* bytes the client had acknowledged when the stall began (TCP_INFO) */
    size_t queued;          /* libuv's write queue when the stall began, bytes */
    unsigned stalled_s;     /* sweeps since the stall began: an answer to send, and less than
                               SEND_PROGRESS_BYTES of it taken (0: no stall) */
    unsigned stuck;         /* sweeps in a row that found h2o waiting on a write libuv refused */
} conn_t;

/* How long a listener rests when accept finds no descriptor or memory free, s (nginx rests
 * 500 ms, Go's net/http backs off from 5 ms to 1 s): the connections wait in the backlog and
 * are accepted once descriptors come free. */
#define ACCEPT_REST_S 0.1

/* Connections accepted per readiness of a listener, at most: the rest wait for the loop's next
 * iteration (the watcher is level-triggered), so a flood of connections does not hold the worker
 * from the requests it has. */
#define ACCEPT_BATCH 64

/* What a client must take of its answer every clients.send_timeout_s, bytes: 16 KB (a few TCP
 * segments; at the default 60 s, 273 bytes a second). */
#define SEND_PROGRESS_BYTES 16384

/* HTTP/2 timeouts h2o 2.2.5 has in name only, s: h2o's idle timeout (10 s) restarts on every
 * frame, so a client that sends a PING every few seconds and opens no stream held its slot of
 * clients.max_connections for good; and it has no timeout for a request still arriving, so a
 * stream whose body comes a byte at a time did the same. The sweeps close an HTTP/2 connection
 * that has had no stream and begun no request for H2_IDLE_S, or a request arriving for over
 * H2_REQUEST_S, or a request arriving H2_REQUEST_S after one was first seen arriving with none
 * begun since (a client that resets its trickling stream every few seconds, pauses, and opens
 * another): what h2o does to an HTTP/1 connection (10 s for an idle keep-alive connection and for
 * a request's head and body). An idle one is closed by h2o's own idle timeout, made to fire at
 * once (agw_guard_h2_close_idle: GOAWAY with NO_ERROR, then the close), the others by the kernel
 * (shutdown: h2o disposes of the stream still arriving with its connection). */
#define H2_IDLE_S 10
#define H2_REQUEST_S 10


/* clients.max_connections of the generation this worker serves (at least 1). */
static unsigned max_conns(const agw_worker_t *w)
{
    unsigned max = w->gens.cur->conf->clients.max_connections;
    return max ? max : 1;
}

static void on_conn_close(uv_handle_t *h)
{
    conn_t *c = (conn_t *)h;
    agw_worker_t *w = c->w;
    SSL_CTX_free(c->ssl_ctx); /* after h2o's SSL_free: the socket is disposed before its handle closes */
    if (h2o_linklist_is_linked(&c->link))
        h2o_linklist_unlink(&c->link);
    agw_guard_conn_close(&w->guard, &c->guard);
    free(c);
    agw_client_slots_give(w->slots); /* wakes the workers waiting for a slot, this one too */
}

/* Starts the watchers of w's listeners (those not closed by a drain nor resting). */
static void accept_again(agw_worker_t *w)
{
    w->accept_waiting = 0;
    for (size_t i = 0; i < w->num_listeners; i++) {
        listener_t *l = &w->listeners[i];
        if (l->fd >= 0 && !ev_is_active(&l->rest))
            ev_io_start(w->loop, &l->io);
    }
}

/* The gateway is at clients.max_connections: w's listeners pause until a slot comes free (the
 * clients wait in the kernel's backlog, in order, instead of costing descriptors). */
static void pause_accepting(agw_worker_t *w)
{
    for (size_t i = 0; i < w->num_listeners; i++)
        ev_io_stop(w->loop, &w->listeners[i].io);
    w->accept_waiting = 1;
    if (agw_client_slots_wait(w->slots, (unsigned)w->id, max_conns(w)))
        accept_again(w); /* one came free before the wait was seen */
}

void agw_worker_accept_resume(agw_worker_t *w)
{
    if (w->accept_waiting && agw_client_slots_wait(w->slots, (unsigned)w->id, max_conns(w)))
        accept_again(w);
}

void agw_worker_on_slot_free(struct ev_loop *loop, ev_async *a, int revents)
{
    (void)loop, (void)revents;
    agw_worker_accept_resume(a->data);
}

/* Hands fd, a connection just accepted on l (non-blocking), to libuv and h2o. */
static void accept_one(listener_t *l, int fd)
{
    agw_worker_t *w = l->worker;
    conn_t *conn = agw_calloc(1, sizeof(*conn));
    conn->w = w;
    conn->guard.fd = -1;
    conn->h2_active_at = ev_now(w->loop);
    uv_tcp_init(&w->uvloop, &conn->tcp); /* on_conn_close gives its slot back, whatever happens next */
    if (uv_tcp_open(&conn->tcp, fd) != 0) {
        close(fd); /* the handle does not hold it: its close leaves fd alone */
        uv_close((uv_handle_t *)&conn->tcp, on_conn_close);
        return;
    }
    agw_guard_conn_open(&w->guard, &conn->guard, fd, AGW_WORKER_MAX_FIELDS(&w->gens.cur->conf->clients),
                        AGW_WORKER_MAX_BLOCK_BYTES(&w->gens.cur->conf->clients));
    uv_tcp_nodelay(&conn->tcp, 1);
    if ((conn->ssl_ctx = l->accept_ctx.ssl_ctx) != NULL)
        SSL_CTX_up_ref(conn->ssl_ctx);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&conn->tcp, on_conn_close);
    conn->sock = sock;
    h2o_linklist_insert(&w->conns, &conn->link);
    agw_inbuf_expect((uv_stream_t *)&conn->tcp); /* (h2o's first read of a plain connection teaches front/inbuf.h) */
    h2o_accept(&l->accept_ctx, sock);
    agw_inbuf_expect(NULL);
    static atomic_int inbuf_warned;
    if (conn->ssl_ctx == NULL && !agw_inbuf_learnt() && atomic_exchange(&inbuf_warned, 1) == 0)
        agw_log(AGW_LOG_WARN, "h2o's read callback of a plain connection is not interposed: each plain connection's "
                              "input buffer is h2o's 5 KB block, not 2 KB (front/inbuf.h)");
}

void agw_worker_conn_request(agw_worker_t *w, h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket ? req->conn->callbacks->get_socket(req->conn) : NULL;
    agw_guard_conn_t *gc = sock ? agw_guard_conn_by_fd(&w->guard, h2o_socket_get_fd(sock)) : NULL;
    if (gc == NULL)
        return;
    conn_t *c = H2O_STRUCT_FROM_MEMBER(conn_t, guard, gc);
    c->served = 1;
    c->h2_active_at = ev_now(w->loop); /* (a request got through: the connection is neither idle nor stuck) */
    c->h2_receiving_since = 0;
    c->h2_idle_asked = 0;
}

static void count_h2(void *arg, agw_guard_conn_t *gc, const agw_guard_h2_count_t *k)
{
    (void)arg;
    conn_t *c = H2O_STRUCT_FROM_MEMBER(conn_t, guard, gc);
    c->h2 = 1;
    c->h2_streams = k->streams;
    c->h2_sending = k->sending;
    c->h2_receiving_ms = k->receiving_ms;
    c->h2conn = k->conn;
}

/* Counts the HTTP/2 connections' streams afresh (count_h2): h2o's connection of each is known
 * until h2o runs again, and none is kept from an earlier count (h2o may have freed it since). */
static void count_h2_conns(agw_worker_t *w)
{
    for (h2o_linklist_t *l = w->conns.next; l != &w->conns; l = l->next)
        H2O_STRUCT_FROM_MEMBER(conn_t, link, l)->h2conn = NULL;
    agw_guard_h2_streams(&w->guard, count_h2, NULL);
}

unsigned agw_worker_busy_conns(agw_worker_t *w)
{
    count_h2_conns(w);
    int fresh = (ev_now(w->loop) - w->drain_started) * 1000.0 < AGW_DRAIN_FIRST_REQUEST_MS;
    unsigned busy = ev_is_pending(&w->uv_io) ? 1 : 0; /* bytes libuv has not handed to h2o yet */
    for (h2o_linklist_t *l = w->conns.next; l != &w->conns; l = l->next) {
        conn_t *c = H2O_STRUCT_FROM_MEMBER(conn_t, link, l);
        h2o_socket_t *s = c->sock;
        if (s->input == NULL) /* h2o has disposed of the socket: it is closing */
            continue;
        /* bytes in h2o's input: an HTTP/1 request from its first byte until it has been answered
         * (h2o 2.2.5 keeps a request's head and body there until then), an HTTP/2 frame not whole
         * yet. (sock->bytes_read is not a running total in h2o 2.2.5's libuv binding: the size of
         * the last read.) */
        if (s->input->size > 0 || (c->h2 && c->h2_streams > 0))
            busy++;
        else if (!c->served) /* its first request may be on its way (a write here is the TLS
                                handshake's, which a client that left may hold for good) */
            busy += fresh;
        else if (h2o_socket_is_writing(s)) /* a response going out */
            busy++;
    }
    return busy;
}

/* A TLS connection whose client reset it was never closed: libuv clears a stream's writable flag
 * when a read fails (ECONNRESET), h2o 2.2.5 then closes TLS with a close_notify whose uv_write
 * fails at once (UV_EPIPE), and its libuv binding ignores that failure, so the write's callback,
 * which disposes of the socket, never runs: the descriptor, the connection's memory and its slot
 * of clients.max_connections were lost for good, and a graceful shutdown waited for it until its
 * grace ran out. Found here: h2o waits on a write (its write callback is set) on a stream libuv
 * no longer writes and holds no write for. Seen twice, by a sweep and by the recheck
 * REFUSED_RECHECK_S later (the loop has run libuv in between: a write that just completed has had
 * its callback by then), the callback is called with h2o's I/O error, as libuv would have: h2o
 * disposes of the socket its own way. Returns 1 when it did, -1 at a first sighting (to be looked
 * at again), 0 otherwise. Since front/inline_write.h answers a write libuv refuses at once through
 * its callback, this finds such a write only where that does not (another libuv release, an
 * executable that does not interpose uv_write): it stays as the fallback. */
static int finish_refused_write(conn_t *c)
{
    h2o_socket_t *s = c->sock;
    if (s->_cb.write == NULL || uv_is_writable((uv_stream_t *)&c->tcp) || c->tcp.write_queue_size > 0) {
        c->stuck = 0;
        return 0;
    }
    if (++c->stuck < 2)
        return -1;
    h2o_socket_cb cb = s->_cb.write;
    s->_cb.write = NULL;
    cb(s, h2o_socket_error_io);
    return 1;
}

/* How long after a sweep that found a refused write it is looked at again, s: long enough for the
 * loop to have run libuv in between (a write that just completed has had its callback), short
 * enough that a TLS client's close gives its slot back well within a second. */
#define REFUSED_RECHECK_S 0.05

void agw_worker_on_refused_recheck(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)loop, (void)revents;
    agw_worker_t *w = t->data;
    for (h2o_linklist_t *l = w->conns.next; l != &w->conns; l = l->next) {
        conn_t *c = H2O_STRUCT_FROM_MEMBER(conn_t, link, l);
        if (c->stuck > 0 && c->sock->input != NULL && c->guard.fd >= 0)
            finish_refused_write(c); /* (a second sighting finishes it or clears it) */
    }
}

void agw_worker_send_sweep(agw_worker_t *w)
{
    unsigned limit = w->gens.cur->conf->clients.send_timeout_s;
    count_h2_conns(w);
    unsigned closed = 0, suspects = 0, h2_slow = 0;
    for (h2o_linklist_t *l = w->conns.next; l != &w->conns; l = l->next) {
        conn_t *c = H2O_STRUCT_FROM_MEMBER(conn_t, link, l);
        h2o_socket_t *s = c->sock;
        if (s->input == NULL || c->guard.fd < 0) /* closing */
            continue;
        int refused = finish_refused_write(c);
        if (refused > 0)
            continue;
        suspects += refused < 0; /* looked at again REFUSED_RECHECK_S from now, not a second */
        if (c->h2) {
            double now = ev_now(w->loop);
            if (c->h2_streams > 0)
                c->h2_active_at = now;
            /* (not forgotten when a sweep sees none arriving: a client that resets its trickling
             * stream, waits a moment and opens another is not making progress either; only a
             * request that begins is, agw_worker_conn_request) */
            if (c->h2_receiving_ms > 0 && c->h2_receiving_since == 0)
                c->h2_receiving_since = now;
            int idle = c->h2_streams == 0 && c->tcp.write_queue_size == 0 && now - c->h2_active_at > H2_IDLE_S;
            int slow = c->h2_receiving_ms > H2_REQUEST_S * 1000 ||
                       (c->h2_receiving_since > 0 && now - c->h2_receiving_since > H2_REQUEST_S);
            if (idle && !slow && !c->h2_idle_asked && agw_guard_h2_close_idle(&w->guard, &c->guard, c->h2conn)) {
                c->h2_idle_asked = 1; /* h2o sends GOAWAY and closes; a frame read first restarts its
                                         timer, and the next sweep that finds it idle closes it below */
                continue;
            }
            if (idle || slow) {
                /* the kernel ends the read: h2o closes the connection (a slow request's stream is
                 * disposed of with it; an idle one has nothing to lose) */
                shutdown(c->guard.fd, SHUT_RDWR);
                c->h2_receiving_since = 0;
                h2_slow += slow; /* (an idle one closed is routine, as h2o's own idle timeout: not logged) */
                continue;
            }
        }
        /* an answer to send: bytes libuv could not hand to the kernel (an HTTP/1 response, TLS
         * records, HTTP/2 frames: the kernel's buffers are full), or an HTTP/2 body held back by
         * the client's flow-control window. (An answer the kernel took whole is h2o's: the
         * connection then waits for the next request under h2o's request timeout.) */
        int pending = c->tcp.write_queue_size > 0 || (c->h2 && c->h2_sending > 0);
        if (!pending) {
            c->stalled_s = 0;
            continue;
        }
        /* progress: SEND_PROGRESS_BYTES acknowledged by the client since the stall began (not
         * any byte: an HTTP/2 client that answers a PING each second, or opens its window a byte
         * at a time, acknowledges a few bytes a second and took nothing of its answer), or,
         * where the kernel cannot tell (no TCP_INFO), any change in what libuv holds */
        uint64_t acked = agw_tcp_bytes_acked(c->guard.fd);
        if (c->stalled_s == 0) { /* the stall begins: its baseline */
            c->acked = acked;
            c->queued = c->tcp.write_queue_size;
        } else if (acked >= c->acked + SEND_PROGRESS_BYTES || (acked == 0 && c->tcp.write_queue_size != c->queued)) {
            c->acked = acked;
            c->queued = c->tcp.write_queue_size;
            c->stalled_s = 1;
            continue;
        }
        if (++c->stalled_s <= limit)
            continue;
        /* the kernel fails the pending write and ends the read: h2o closes the connection its own
         * way (its requests are disposed of, their pages abandoned as for a client that left);
         * with SO_LINGER 0 that close resets the connection, so the kernel drops the answer it
         * still holds at once instead of trying to deliver it for minutes (nginx's
         * reset_timedout_connection) */
        struct linger lg = {1, 0};
        setsockopt(c->guard.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        shutdown(c->guard.fd, SHUT_RDWR);
        c->stalled_s = 0;
        closed++;
    }
    if (suspects > 0 && !ev_is_active(&w->refused_timer)) {
        ev_timer_set(&w->refused_timer, REFUSED_RECHECK_S, 0.);
        ev_timer_start(w->loop, &w->refused_timer);
    }
    if (closed > 0 || h2_slow > 0) {
        double now = ev_now(w->loop);
        if (now - w->send_warned >= 10.0) {
            w->send_warned = now;
            if (closed > 0)
                agw_log(AGW_LOG_WARN, "worker %d: closed %u client connection(s) that took none of their answer for "
                        "%u s (clients.send_timeout_s)", w->id, closed, limit);
            if (h2_slow > 0)
                agw_log(AGW_LOG_WARN, "worker %d: closed %u HTTP/2 connection(s) whose request was still arriving "
                        "after %d s", w->id, h2_slow, H2_REQUEST_S);
        }
    }
}

/* Logs that accept failed (err: its errno) and what happens meanwhile, at most once per 10 s per
 * worker. */
static void warn_accept(agw_worker_t *w, int err)
{
    double now = ev_now(w->loop);
    if (now - w->accept_warned < 10.0)
        return;
    w->accept_warned = now;
    agw_log(AGW_LOG_WARN, "worker %d: cannot accept client connections: %s; they wait until descriptors come "
            "free (raise the open-files limit or lower clients.max_connections)", w->id, strerror(err));
}

static void on_rest_over(struct ev_loop *loop, ev_timer *t, int revents)
{
    (void)revents;
    listener_t *l = t->data;
    if (l->fd >= 0 && !l->worker->accept_waiting)
        ev_io_start(loop, &l->io);
}

/* Connections wait in l's backlog. Accepts them (at most ACCEPT_BATCH) while the gateway is under
 * clients.max_connections, each with a slot taken first; at the cap the worker's listeners pause
 * (pause_accepting) until a connection closes on any worker. When accept fails for want of descriptors or memory (EMFILE,
 * ENFILE, ENOBUFS, ENOMEM) the listener rests ACCEPT_REST_S and tries again: the connections wait,
 * and the worker serves the ones it has meanwhile. Errors of the new connection itself
 * (ECONNABORTED, a network error accept(2) says to treat as EAGAIN) skip it. */
static void on_listener_ready(struct ev_loop *loop, ev_io *io, int revents)
{
    (void)revents;
    listener_t *l = io->data;
    agw_worker_t *w = l->worker;
    /* h2o starts a new connection's timeouts (request, TLS handshake, HTTP/2 idle) on libuv's
     * clock, which moves only in uv_run: after a quiet spell it was seconds behind, and the next
     * run found the new connection's timeout past and closed it (the first client after 10 s of
     * quiet was reset) */
    uv_update_time(&w->uvloop);
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        if (!agw_client_slots_take(w->slots, max_conns(w))) {
            pause_accepting(w);
            return;
        }
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            accept_one(l, fd);
            continue;
        }
        int err = errno;
        agw_client_slots_give(w->slots); /* no connection: the slot goes back */
        switch (err) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case EOPNOTSUPP:
        case ENETUNREACH:
        case ETIMEDOUT:
        case EPERM: /* a firewall rule refused it */
            continue;
        default: /* EMFILE, ENFILE, ENOBUFS, ENOMEM; anything else, rather than spin on it */
            if (err == EINVAL && __atomic_load_n(&w->listeners_shut, __ATOMIC_ACQUIRE)) {
                ev_io_stop(loop, &l->io); /* shut down by the drain (agw_worker_drain): on_drain closes it */
                return;
            }
            warn_accept(w, err);
            ev_io_stop(loop, &l->io);
            ev_timer_set(&l->rest, ACCEPT_REST_S, 0.);
            ev_timer_start(loop, &l->rest);
            return;
        }
    }
}

void agw_worker_listener_start(listener_t *l)
{
    agw_worker_t *w = l->worker;
    ev_io_init(&l->io, on_listener_ready, l->fd, EV_READ);
    l->io.data = l;
    ev_init(&l->rest, on_rest_over);
    l->rest.data = l;
    ev_io_start(w->loop, &l->io);
}

void agw_worker_listener_close(listener_t *l)
{
    agw_worker_t *w = l->worker;
    if (l->fd < 0)
        return;
    ev_io_stop(w->loop, &l->io);
    ev_timer_stop(w->loop, &l->rest);
    close(l->fd);
    l->fd = -1;
}
