/* upstream_srv.h: the scripted upstream and client helpers the upstream client's unit tests share
 * (test_upstream_*.c over plain TCP, one concept each, and test_upstream_tls.c over TLS). The upstream runs on the same
 * libev loop as the client and picks its behaviour from the request path (see srv_respond), so
 * each test reads as "given an upstream that answers like this, the call ends like that". Every
 * wait is bounded. Test-only: static definitions, included once per test program. */
#ifndef AGW_TESTS_UPSTREAM_SRV_H
#define AGW_TESTS_UPSTREAM_SRV_H

#include "base/buf.h"
#include "tests/check.h"
#include "tests/loop_gap.h"
#include "upstream/batch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#define BIG_BODY 300000 /* bytes of the /big answer */
#define CLIENT_READ 16384 /* the client's read buffer (AGW_UPSTREAM_READ_BUF, upstream_internal.h) */

/* The scripted upstream runs on the test's own loop, so when the machine stalls the process (a
 * loaded CI host, a sanitized build) it cannot answer either, while the client's clock runs on. A
 * call that expects an answer therefore gets ANSWER_MS (get(), conf_init), which no such stall
 * reaches, and a wait for something that will come is bounded by WAIT_S; both end as soon as the
 * answer comes, so a normal run is not slower. A test of a timeout sets its short timeout itself,
 * and bounds the time it took by the timeout plus loop_gap_ms(). */
#define ANSWER_MS 20000
#define WAIT_S 25.0

static struct ev_loop *loop;
static int done_flag __attribute__((unused)); /* for callbacks with no record of their own */

/* Ring mode (`test_upstream_pool ring`, …): every pool the tests create is given ring_batch, a batch with
 * an io_uring (upstream/batch.h), flushed before the loop waits as the worker does; so each test also
 * checks its rule with the iteration's I/O batched. Tests that set a batch of their own replace
 * it (they flush it themselves). */
static agw_batch_t ring_batch;
static ev_prepare ring_prepare;

static void ring_on_prepare(struct ev_loop *l, ev_prepare *p, int revents)
{
    (void)l, (void)p, (void)revents;
    while (agw_batch_flush(&ring_batch) > 0) {
    }
}

/* Exit status of a ring-mode run on a kernel without io_uring: ctest reports the test as skipped
 * (SKIP_RETURN_CODE in CMakeLists.txt), not passed; the gateway itself then makes one system call
 * per operation, which the plain runs test. */
#define RING_UNAVAILABLE 77

/* Turns ring mode on when argv[1] is "ring"; exits RING_UNAVAILABLE, saying why, when the kernel
 * gives no io_uring. */
static void ring_mode_from_args(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "ring") != 0)
        return;
    char why[128];
    if (agw_batch_ring_init(&ring_batch, why, sizeof(why)) != 0) {
        fprintf(stderr, "ring mode skipped: %s\n", why);
        exit(RING_UNAVAILABLE);
    }
    ev_prepare_init(&ring_prepare, ring_on_prepare);
    ev_prepare_start(loop, &ring_prepare);
    printf("ring mode: upstream I/O batched through io_uring\n");
}

/* A timer is late by at most the loop's gap (tests/loop_gap.h), ms. */
static double loop_gap_ms(void)
{
    return 1000 * loop_gap_s();
}

/* Opens the test program's loop: SIGPIPE ignored, loop the default loop, ring mode when argv[1] is
 * "ring" (ring_mode_from_args), and the loop's gap measured (tests/loop_gap.h: its timer also
 * wakes the loop every 10 ms, so that every bounded wait notices its deadline). */
static void test_loop_open(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    loop = ev_default_loop(0);
    ring_mode_from_args(argc, argv);
    loop_gap_start(loop);
}

/* Stops the gap's timer, destroys the loop; returns the program's exit status (CHECK_DONE). */
static int test_loop_close(void)
{
    loop_gap_stop(loop);
    ev_loop_destroy(loop);
    return CHECK_DONE();
}

static agw_pool_t *test_pool_create(struct ev_loop *l, const agw_upstream_conf_t *conf)
{
    agw_pool_t *pool = agw_pool_create(l, conf);
    if (pool && ring_batch.ring)
        agw_pool_set_batch(pool, &ring_batch);
    return pool;
}
#define agw_pool_create test_pool_create

/* ---- scripted upstream ---------------------------------------------------------------- */

enum after_write { KEEP, CLOSE, RESET_CONN };

typedef struct srv srv_t;
typedef struct sconn {
    srv_t *srv;
    struct sconn *next;
    int fd;
    ev_io rio, wio;
    ev_timer timer;           /* drip and delayed answers */
    char in[262144];          /* room for a whole request, large bodies included */
    size_t inlen;
    agw_buf_t out;
    size_t outoff;
    enum after_write after;
    int drip;                 /* write one byte per tick (over TLS: one record per byte) */
    int stream;               /* keep writing chunks until the client goes away */
    SSL *ssl;                 /* TLS upstream: the server side of the connection */
    int handshaken;           /* the TLS handshake completed */
    int key_update;           /* after the answer, send a TLS 1.3 KeyUpdate (no data) */
    int half_record;          /* after the answer, send the first half of a record with data */
    int drop_next;            /* /drop-next: close on the next request, answering nothing */
} sconn_t;

struct srv {
    int lfd;
    int port;
    ev_io aio;
    sconn_t *conns;
    int accepted;             /* connections accepted */
    int requests;             /* requests read */
    int eofs;                 /* connections the client closed (EOF or reset) */
    char last_req[4096];      /* the last request, as received */
    SSL_CTX *tls;             /* set: a TLS upstream (srv_start_tls) */
    int stall_tls;            /* read the client's handshake bytes and never answer them */
    int no_close_notify;      /* CLOSE without sending the TLS close_notify alert */
    int handshakes;           /* TLS handshakes completed */
    int resumed;              /* of those, resumed sessions */
    int tls_failures;         /* handshakes that failed (the client refused the certificate, …) */
};

static void sconn_close(sconn_t *sc)
{
    srv_t *srv = sc->srv;
    for (sconn_t **pp = &srv->conns; *pp; pp = &(*pp)->next)
        if (*pp == sc) {
            *pp = sc->next;
            break;
        }
    ev_io_stop(loop, &sc->rio);
    ev_io_stop(loop, &sc->wio);
    ev_timer_stop(loop, &sc->timer);
    if (sc->ssl)
        SSL_free(sc->ssl);
    close(sc->fd);
    agw_buf_free(&sc->out);
    free(sc);
}

static void sconn_after_write(sconn_t *sc)
{
    if (sc->after == CLOSE) {
        if (sc->ssl && !sc->srv->no_close_notify)
            SSL_shutdown(sc->ssl); /* sends close_notify; the client's answer is not awaited */
        sconn_close(sc);
    } else if (sc->after == RESET_CONN) {
        struct linger lg = {1, 0};
        setsockopt(sc->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        sconn_close(sc);
    }
}

/* send(), or SSL_write() on a TLS upstream with its WANT_* results as EAGAIN. */
static ssize_t sconn_write(sconn_t *sc, const char *p, size_t n)
{
    if (sc->ssl == NULL)
        return send(sc->fd, p, n, MSG_NOSIGNAL);
    ERR_clear_error();
    int w = SSL_write(sc->ssl, p, (int)n);
    if (w > 0)
        return w;
    int e = SSL_get_error(sc->ssl, w);
    ERR_clear_error();
    errno = e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? EAGAIN : EPIPE;
    return -1;
}

/* read(), or SSL_read() on a TLS upstream (WANT_* as EAGAIN, a TLS failure as a reset). */
static ssize_t sconn_read(sconn_t *sc, char *p, size_t n)
{
    if (sc->ssl == NULL)
        return read(sc->fd, p, n);
    ERR_clear_error();
    int r = SSL_read(sc->ssl, p, (int)n);
    if (r > 0)
        return r;
    int e = SSL_get_error(sc->ssl, r);
    ERR_clear_error();
    if (e == SSL_ERROR_ZERO_RETURN)
        return 0;
    errno = e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? EAGAIN : ECONNRESET;
    return -1;
}

/* Writes what is buffered; returns 0 when sc was closed. */
static int sconn_flush(sconn_t *sc)
{
    while (sc->outoff < sc->out.len || sc->stream) {
        if (sc->stream && sc->outoff == sc->out.len) {
            static const char chunk[] = "1000\r\n";
            agw_buf_reset(&sc->out);
            sc->outoff = 0;
            agw_buf_append(&sc->out, chunk, sizeof(chunk) - 1);
            for (int i = 0; i < 4096; i++)
                agw_buf_putc(&sc->out, 'x');
            agw_buf_append(&sc->out, "\r\n", 2);
        }
        size_t n = sc->drip ? 1 : sc->out.len - sc->outoff;
        ssize_t w = sconn_write(sc, sc->out.base + sc->outoff, n);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ev_io_start(loop, &sc->wio);
            return 1;
        }
        if (w < 0) {
            sc->srv->eofs++;
            sconn_close(sc);
            return 0;
        }
        sc->outoff += (size_t)w;
        if (sc->drip && sc->outoff < sc->out.len) {
            ev_timer_set(&sc->timer, 0.001, 0.);
            ev_timer_start(loop, &sc->timer);
            return 1;
        }
    }
    ev_io_stop(loop, &sc->wio);
    agw_buf_reset(&sc->out);
    sc->outoff = 0;
    if (sc->key_update && sc->ssl) {
        sc->key_update = 0;
        SSL_key_update(sc->ssl, SSL_KEY_UPDATE_NOT_REQUESTED);
        SSL_do_handshake(sc->ssl); /* sends it now */
        ERR_clear_error();
    }
    if (sc->half_record && sc->ssl) {
        /* a response no one asked for, in one record of which half goes out (its rest never
         * does): the record is made into a memory BIO, then half of it written to the socket */
        static const char stale[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale";
        sc->half_record = 0;
        BIO *sock = SSL_get_wbio(sc->ssl), *mem = BIO_new(BIO_s_mem());
        BIO_up_ref(sock);
        SSL_set0_wbio(sc->ssl, mem);
        if (SSL_write(sc->ssl, stale, sizeof(stale) - 1) > 0) {
            char *rec;
            long len = BIO_get_mem_data(mem, &rec);
            if (send(sc->fd, rec, (size_t)len / 2, MSG_NOSIGNAL) < 0)
                perror("half record");
        }
        SSL_set0_wbio(sc->ssl, sock); /* frees mem */
        ERR_clear_error();
    }
    int keep = sc->after == KEEP;
    sconn_after_write(sc);
    return keep;
}

static void srv_on_write(struct ev_loop *l, ev_io *w, int revents)
{
    (void)l, (void)revents;
    sconn_flush(w->data);
}

static void srv_on_timer(struct ev_loop *l, ev_timer *w, int revents)
{
    (void)l, (void)revents;
    sconn_flush(w->data);
}

static void srv_send(sconn_t *sc, const char *s)
{
    agw_buf_puts(&sc->out, s);
}

/* Answers one request according to its path. Returns 0 when sc was closed. */
static int srv_respond(sconn_t *sc, const char *path)
{
#define IS(p) (strncmp(path, p " ", strlen(p) + 1) == 0)
    sc->after = KEEP;
    if (IS("/hang"))
        return 1;
    if (IS("/chunked") || IS("/drip-chunked")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n"
                     "X-Long-Header-Name-For-Splitting: a-rather-long-value\r\n\r\n"
                     "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc123\r\n\r\n");
        sc->drip = IS("/drip-chunked");
    } else if (IS("/eof")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end");
        sc->after = CLOSE;
    } else if (IS("/continue")) {
        srv_send(sc, "HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n"
                     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    } else if (IS("/interim-framed")) {
        /* 1xx responses end at their empty line whatever they say about a body (RFC 9112 §6.3) */
        srv_send(sc, "HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n"
                     "HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\nLink: </a.css>\r\n\r\n"
                     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    } else if (IS("/switch")) { /* a protocol switch no one asked for, then silence */
        srv_send(sc, "HTTP/1.1 101 Switching Protocols\r\n\r\n");
    } else if (IS("/huge-chunk")) { /* a chunk announced far over the limit, then silence */
        srv_send(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nfffffffffff\r\nxx");
    } else if (IS("/exact-then-stale")) {
        /* an answer that fills the client's read buffer exactly, then, in the same write, an
         * answer to no request: the client's read stops at the first one's last byte */
        const char *head = "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n";
        int blen = CLIENT_READ - (int)(strlen(head) - 2 + 5); /* a 5-digit length */
        agw_buf_printf(&sc->out, head, blen);
        for (int i = 0; i < blen; i++)
            agw_buf_putc(&sc->out, 'e');
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale");
    } else if (IS("/then-stale")) {
        /* an answer, then in a write of its own (over TLS a record of its own) an answer to no
         * request */
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        if (!sconn_flush(sc))
            return 0;
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale");
    } else if (IS("/reset")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 512\r\n\r\n");
        for (int i = 0; i < 120; i++)
            agw_buf_putc(&sc->out, 'r');
        sc->after = RESET_CONN;
    } else if (IS("/short")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten!!");
        sc->after = CLOSE;
    } else if (IS("/garbage")) {
        srv_send(sc, "SSH-2.0-OpenSSH_9.2\r\nthis is not http\r\n\r\n");
    } else if (IS("/huge")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\nxxxx");
    } else if (IS("/stream")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        sc->stream = 1;
    } else if (IS("/drop-next")) { /* kept alive, but closed when the next request comes */
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        sc->drop_next = 1;
    } else if (IS("/close-after")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        sc->after = CLOSE;
    } else if (IS("/slow")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow");
        ev_timer_set(&sc->timer, 0.15, 0.);
        ev_timer_start(loop, &sc->timer);
        return 1;
    } else if (IS("/then-half-record")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        sc->half_record = 1;
    } else if (IS("/key-update")) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        sc->key_update = 1;
    } else if (IS("/big")) {
        /* BIG_BODY bytes 'a'..'z' repeated: many TLS records, many reads */
        agw_buf_printf(&sc->out, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", BIG_BODY);
        for (int i = 0; i < BIG_BODY; i++)
            agw_buf_putc(&sc->out, (char)('a' + i % 26));
    } else if (IS("/http10")) {
        srv_send(sc, "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold");
    } else if (strncmp(sc->srv->last_req, "HEAD ", 5) == 0) {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Test: yes\r\n\r\n");
    } else {
        srv_send(sc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Test: yes\r\n\r\nhello");
    }
#undef IS
    return sconn_flush(sc);
}

/* Length of the complete request at the start of in, or 0 if more bytes are needed. */
static size_t request_length(const char *in, size_t len)
{
    const char *end = memmem(in, len, "\r\n\r\n", 4);
    if (end == NULL)
        return 0;
    size_t head = (size_t)(end - in) + 4, body = 0;
    for (const char *p = in; p < end; p++)
        if (strncasecmp(p, "\r\nContent-Length:", 17) == 0)
            body = strtoul(p + 17, NULL, 10);
    return head + body <= len ? head + body : 0;
}

/* The TLS server's handshake step. Returns 1 once it is complete. */
static int sconn_handshake(sconn_t *sc)
{
    srv_t *srv = sc->srv;
    if (srv->stall_tls) { /* swallow the ClientHello, answer nothing */
        char sink[4096];
        ssize_t n = read(sc->fd, sink, sizeof(sink));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            srv->eofs++;
            sconn_close(sc);
        }
        return 0;
    }
    ERR_clear_error();
    int r = SSL_accept(sc->ssl);
    if (r != 1) {
        int e = SSL_get_error(sc->ssl, r);
        ERR_clear_error();
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            srv->tls_failures++;
            srv->eofs++;
            sconn_close(sc);
        }
        return 0;
    }
    sc->handshaken = 1;
    srv->handshakes++;
    srv->resumed += SSL_session_reused(sc->ssl) != 0;
    return 1;
}

static void srv_on_read(struct ev_loop *l, ev_io *w, int revents)
{
    sconn_t *sc = w->data;
    (void)l, (void)revents;
    if (sc->ssl && !sc->handshaken && !sconn_handshake(sc))
        return;
again:;
    ssize_t n = sconn_read(sc, sc->in + sc->inlen, sizeof(sc->in) - sc->inlen);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            sc->srv->eofs++;
            sconn_close(sc);
        }
        return;
    }
    sc->inlen += (size_t)n;
    if (sc->srv->tls == NULL && (unsigned char)sc->in[0] == 0x16) {
        /* a TLS ClientHello on a plain HTTP port: answer as an HTTP server does, then close */
        srv_send(sc, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        sc->after = CLOSE;
        sconn_flush(sc);
        return;
    }
    if (strncmp(sc->in, "POST /early-", 12) == 0 && memmem(sc->in, sc->inlen, "\r\n\r\n", 4)) {
        /* answers from the headers alone, never reading the body, then stops reading
         * (/early-hold) or closes with the body unread, which resets the connection (/early-close) */
        int close_it = strncmp(sc->in, "POST /early-close ", 18) == 0;
        sc->srv->requests++;
        srv_send(sc, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo big!");
        sc->after = close_it ? CLOSE : KEEP;
        if (!close_it)
            ev_io_stop(loop, &sc->rio);
        sconn_flush(sc);
        return;
    }
    size_t len;
    while ((len = request_length(sc->in, sc->inlen)) > 0) {
        srv_t *srv = sc->srv;
        size_t keep = len < sizeof(srv->last_req) - 1 ? len : sizeof(srv->last_req) - 1;
        memcpy(srv->last_req, sc->in, keep);
        srv->last_req[keep] = '\0';
        srv->requests++;
        memmove(sc->in, sc->in + len, sc->inlen - len);
        sc->inlen -= len;
        const char *path = strchr(srv->last_req, ' ');
        if (sc->drop_next) { /* the keep-alive connection dies just as a request comes */
            if (sc->ssl)
                SSL_shutdown(sc->ssl); /* close_notify: a clean close, the session stays resumable */
            srv->eofs++;
            sconn_close(sc);
            return;
        }
        if (!srv_respond(sc, path ? path + 1 : "/"))
            return;
    }
    if (sc->ssl && SSL_pending(sc->ssl) > 0) /* decrypted bytes raise no event on the socket */
        goto again;
}

static void srv_on_accept(struct ev_loop *l, ev_io *w, int revents)
{
    srv_t *srv = w->data;
    (void)l, (void)revents;
    int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    sconn_t *sc = calloc(1, sizeof(*sc));
    sc->srv = srv;
    sc->fd = fd;
    ev_io_init(&sc->rio, srv_on_read, fd, EV_READ);
    ev_io_init(&sc->wio, srv_on_write, fd, EV_WRITE);
    ev_init(&sc->timer, srv_on_timer);
    sc->rio.data = sc->wio.data = sc->timer.data = sc;
    if (srv->tls) {
        sc->ssl = SSL_new(srv->tls);
        SSL_set_fd(sc->ssl, fd);
        SSL_set_accept_state(sc->ssl);
    }
    ev_io_start(loop, &sc->rio);
    sc->next = srv->conns;
    srv->conns = sc;
    srv->accepted++;
}

static int listen_socket(int backlog, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        perror("test upstream");
        exit(2);
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

static void srv_start(srv_t *srv)
{
    memset(srv, 0, sizeof(*srv));
    srv->lfd = listen_socket(64, &srv->port);
    ev_io_init(&srv->aio, srv_on_accept, srv->lfd, EV_READ);
    srv->aio.data = srv;
    ev_io_start(loop, &srv->aio);
}

/* Starts a TLS upstream with ctx (owned by the caller). */
static void srv_start_tls(srv_t *srv, SSL_CTX *ctx)
{
    srv_start(srv);
    srv->tls = ctx;
}

static void srv_stop(srv_t *srv)
{
    while (srv->conns)
        sconn_close(srv->conns);
    ev_io_stop(loop, &srv->aio);
    close(srv->lfd);
}

/* ---- client side helpers -------------------------------------------------------------- */

typedef struct rec {
    int done;                 /* callbacks received */
    agw_call_outcome_t outcome;
    int status;
    char body[256];
    size_t body_len;
    char headers[1024];       /* "name: value\n" each */
    char trailers[256];
    char detail[256];
    double ms;
    int reused;
} rec_t;

static void copy_headers(char *out, size_t cap, const agw_header_t *h, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%.*s: %.*s\n", (int)h[i].name_len,
                                h[i].name, (int)h[i].value_len, h[i].value);
}

static void on_done(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    rec_t *rec = data;
    (void)call;
    rec->done++;
    rec->outcome = r->outcome;
    rec->status = r->http_status;
    rec->body_len = r->body_len;
    snprintf(rec->body, sizeof(rec->body), "%s", r->body);
    copy_headers(rec->headers, sizeof(rec->headers), r->headers, r->num_headers);
    copy_headers(rec->trailers, sizeof(rec->trailers), r->trailers, r->num_trailers);
    snprintf(rec->detail, sizeof(rec->detail), "%s", r->detail ? r->detail : "");
    if (getenv("TEST_VERBOSE"))
        fprintf(stderr, "  %s %d %.1f ms %s\n", agw_call_outcome_name(r->outcome), r->http_status,
                r->elapsed_ms, rec->detail);
    rec->ms = r->elapsed_ms;
    rec->reused = r->reused;
    CHECK(r->body[r->body_len] == '\0');
    CHECK((r->outcome == AGW_CALL_OK) == (r->detail == NULL));
}

static void conf_init(agw_upstream_conf_t *conf, int port)
{
    memset(conf, 0, sizeof(*conf));
    struct sockaddr_in *sa = (struct sockaddr_in *)&conf->addr;
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    conf->addrlen = sizeof(*sa);
    conf->name = "test";
    conf->url = "http://127.0.0.1";
    conf->host_header = "127.0.0.1";
    conf->base_path = "";
    conf->timeout_ms = ANSWER_MS;
    conf->connect_timeout_ms = ANSWER_MS;
    conf->idle_timeout_ms = 2 * ANSWER_MS; /* a kept-alive connection outlasts a stall too */
    conf->max_connections = 4;
    conf->max_pending = 16;
    conf->max_body_bytes = 1 << 20;
}

static agw_call_req_t get(const char *path)
{
    agw_call_req_t req = {.method = "GET", .path = path, .path_len = strlen(path),
                          .timeout_ms = ANSWER_MS};
    return req;
}

/* Runs the loop until *counter reaches target or max_s passes; returns whether it did. */
static int wait_for(const int *counter, int target, double max_s)
{
    double end = ev_time() + max_s;
    while (*counter < target && ev_time() < end)
        ev_run(loop, EVRUN_ONCE);
    return *counter >= target;
}

/* Runs the loop like wait_for, flushing batch b after every iteration (as the worker's prepare
 * watcher does before it waits). */
static int wait_flushing(agw_batch_t *b, const int *counter, int target, double max_s)
{
    double end = ev_time() + max_s;
    while (*counter < target && ev_time() < end) {
        while (agw_batch_flush(b) > 0) {
        }
        if (*counter >= target)
            break;
        ev_run(loop, EVRUN_ONCE);
    }
    while (agw_batch_flush(b) > 0) {
    }
    return *counter >= target;
}

/* The server side of the upstream connection whose client side is fd, or NULL. */
static sconn_t *server_side(srv_t *srv, int fd)
{
    struct sockaddr_in mine, peer;
    socklen_t len = sizeof(mine);
    if (getsockname(fd, (struct sockaddr *)&mine, &len) != 0)
        return NULL;
    for (sconn_t *sc = srv->conns; sc != NULL; sc = sc->next) {
        len = sizeof(peer);
        if (getpeername(sc->fd, (struct sockaddr *)&peer, &len) == 0 && peer.sin_port == mine.sin_port)
            return sc;
    }
    return NULL;
}

static void run_for(double s)
{
    int never = 0;
    wait_for(&never, 1, s);
}

static agw_pool_stats_t stats(agw_pool_t *pool)
{
    agw_pool_stats_t st;
    agw_pool_stats(pool, &st);
    return st;
}

/* Gives b a ring; without io_uring in the kernel says so and returns 0 (the test is skipped: the
 * gateway then makes one system call per operation, which the other tests cover). */
static int ring_or_skip(agw_batch_t *b)
{
    char why[128];
    if (agw_batch_ring_init(b, why, sizeof(why)) == 0)
        return 1;
    fprintf(stderr, "skip (%s)\n", why);
    return 0;
}

/* Waits (bounded) until fd has bytes or EOF to read. */
static int wait_readable(int fd, double max_s)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, (int)(max_s * 1000)) == 1;
}

/* Gives pool (batched on b) n kept-alive connections: n calls of /ok started at once, each on a
 * new connection, answered into recs (n records). Returns whether every one was answered and its
 * connection is idle. */
static int keep_alive(agw_pool_t *pool, agw_batch_t *b, rec_t *recs, int n)
{
    agw_call_req_t req = get("/ok");
    int ok = 1;
    for (int i = 0; i < n; i++)
        agw_call_start(pool, &req, on_done, &recs[i]);
    for (int i = 0; i < n; i++)
        ok = ok && wait_flushing(b, &recs[i].done, 1, WAIT_S) && recs[i].outcome == AGW_CALL_OK;
    return ok && stats(pool).idle == (unsigned)n;
}

/* Starts the upstream and a pool batched on batch, with no limit of connections (conf: its
 * settings, which the pool reads until it is destroyed), and gives it n kept-alive connections
 * (answered into recs). */
static agw_pool_t *kept_alive_pool(srv_t *srv, agw_upstream_conf_t *conf, agw_batch_t *batch, rec_t *recs, int n)
{
    srv_start(srv);
    conf_init(conf, srv->port);
    conf->max_connections = 0;
    agw_pool_t *pool = agw_pool_create(loop, conf);
    agw_pool_set_batch(pool, batch);
    CHECK(keep_alive(pool, batch, recs, n) && srv->accepted == n);
    return pool;
}


/* Two calls in a row: the first one's callback starts the second (path next) on the same pool,
 * as a dependent chain does, so the second may take the connection the first just freed. */
typedef struct then {
    agw_pool_t *pool;
    const char *next;
    rec_t first, second;
} then_t;

static void on_then(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    then_t *t = data;
    on_done(call, r, &t->first);
    agw_call_req_t req = get(t->next);
    CHECK(agw_call_start(t->pool, &req, on_done, &t->second) != NULL);
}

/* Starts one call with req on a fresh pool for srv and waits for it; loop_gap_ms() then reads the
 * longest stall of the loop since the call's start. */
static void call_once(srv_t *srv, agw_upstream_conf_t *conf, agw_call_req_t req, rec_t *rec)
{
    loop_gap_reset();
    agw_pool_t *pool = agw_pool_create(loop, conf);
    memset(rec, 0, sizeof(*rec));
    CHECK(agw_call_start(pool, &req, on_done, rec) != NULL);
    CHECK(wait_for(&rec->done, 1, WAIT_S));
    CHECK(stats(pool).pending == 0);
    agw_pool_destroy(pool);
    (void)srv;
}

#pragma GCC diagnostic pop

#endif
