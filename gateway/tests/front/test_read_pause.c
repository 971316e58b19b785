/* test_read_pause.c: a connection's reading paused and resumed (front/read_pause.h) against a real
 * loopback TCP connection on a libuv loop: what comes while paused waits for the start, and a
 * pause and a start make no system call (epoll_ctl counted: loopback.h). */
#include "loopback.h" /* (first: it asks for _GNU_SOURCE) */
#include "../check.h"
#include "front/read_pause.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uv_loop_t loop;
    uv_tcp_t tcp;
    int peer;          /* the client's end (blocking) */
    char got[256];     /* what the read callback was given */
    size_t got_len;
    int eof, errors, closed;
    char inbuf[4096];
} conn_t;

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_t *c = h->data;
    buf->base = c->inbuf;
    buf->len = sizeof(c->inbuf);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (n == UV_EOF)
        c->eof++;
    else if (n < 0)
        c->errors++;
    else if (n > 0 && c->got_len + (size_t)n <= sizeof(c->got)) {
        memcpy(c->got + c->got_len, buf->base, (size_t)n);
        c->got_len += (size_t)n;
    }
}

/* Opens a loopback connection: c->tcp (on c->loop) is the accepted end, c->peer the client's. */
static int open_conn(conn_t *c)
{
    memset(c, 0, sizeof(*c));
    uv_loop_init(&c->loop);
    return loopback_uv_tcp(&c->loop, &c->tcp, c, &c->peer);
}

/* Runs the loop without waiting, a few times (what the peer sent on loopback is there already). */
static void turn(conn_t *c)
{
    for (int i = 0; i < 4; i++)
        uv_run(&c->loop, UV_RUN_NOWAIT);
}

static void on_close(uv_handle_t *h)
{
    ((conn_t *)h->data)->closed = 1;
}

static void close_conn(conn_t *c)
{
    uv_close((uv_handle_t *)&c->tcp, on_close);
    turn(c);
    CHECK(c->closed);
    uv_loop_close(&c->loop);
    close(c->peer);
}

static int fd_of(conn_t *c)
{
    uv_os_fd_t fd = -1;
    uv_fileno((uv_handle_t *)&c->tcp, &fd);
    return fd;
}

/* The peer sends s; returns when the bytes are in the accepted end's receive queue. */
static void send_peer(conn_t *c, const char *s)
{
    CHECK(write(c->peer, s, strlen(s)) == (ssize_t)strlen(s));
    CHECK(wait_for(fd_of(c), POLLIN));
}

/* The peer shuts its sending side; returns when the FIN has come. */
static void hang_up_peer(conn_t *c)
{
    shutdown(c->peer, SHUT_WR);
    CHECK(wait_for(fd_of(c), POLLRDHUP));
}

static void interposed(void)
{
    CHECK(agw_read_pause_active());
}

static void a_pause_and_a_start_make_no_system_call(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    send_peer(&c, "GET /1");
    turn(&c);
    CHECK(c.got_len == 6);
    int before = ctl_calls;
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    turn(&c);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(!agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    turn(&c);
    CHECK(ctl_calls == before);
    send_peer(&c, "GET /2"); /* still read as before */
    turn(&c);
    CHECK(c.got_len == 12 && memcmp(c.got, "GET /1GET /2", 12) == 0);
    /* libuv's own stop and start, for comparison: the same turn costs system calls (ADD, which
     * fails with EEXIST, then MOD, in libuv 1.44): what the count above would have seen */
    before = ctl_calls;
    CHECK(agw_read_pause_libuv_stop((uv_stream_t *)&c.tcp) == 0);
    turn(&c);
    CHECK(agw_read_pause_libuv_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(ctl_calls > before);
    close_conn(&c);
}

static void bytes_sent_while_paused_wait_for_the_start(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    send_peer(&c, "pipelined");
    turn(&c);
    CHECK(c.got_len == 0 && c.eof == 0 && c.errors == 0); /* the owner is told nothing */
    CHECK(!agw_read_pause_is_paused((uv_stream_t *)&c.tcp)); /* stopped for real: no busy loop */
    CHECK(!uv_is_active((uv_handle_t *)&c.tcp));
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(c.got_len == 9 && memcmp(c.got, "pipelined", 9) == 0);
    CHECK(c.eof == 0 && c.errors == 0);
    close_conn(&c);
}

static void a_hangup_while_paused_is_read_after_the_start(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    send_peer(&c, "last");
    hang_up_peer(&c);
    turn(&c);
    CHECK(c.got_len == 0 && c.eof == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(c.got_len == 4 && c.eof == 1);
    close_conn(&c);
}

/* After libuv itself stopped the stream (the end of the stream), a stop is libuv's (no pause of a
 * stream that does not read) and a start reads the end again. */
static void a_stream_libuv_stopped_is_not_paused(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    hang_up_peer(&c);
    turn(&c);
    CHECK(c.eof == 1);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(!agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(c.eof == 2);
    close_conn(&c);
}

/* A paused stream closes as a stopped one: its close callback runs and no read callback. */
static void a_paused_stream_closes(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    send_peer(&c, "late");
    close_conn(&c);
    CHECK(c.got_len == 0 && c.eof == 0 && c.errors == 0);
    CHECK(c.tcp.alloc_cb == NULL && c.tcp.read_cb == NULL);
}

/* A stop twice, a start twice: as libuv's (the second start of a reading stream is refused). */
static void stops_and_starts_twice(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == UV_EALREADY);
    send_peer(&c, "x");
    turn(&c);
    CHECK(c.got_len == 1);
    close_conn(&c);
}

/* h2o stops reading inside its read callback, when a request has come: the pause begins there.
 * The peer's hangup read in the same turn is not given to the owner; the start reads it. */
static void stop_on_data(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    read_cb(s, n, buf);
    if (n > 0)
        CHECK(uv_read_stop(s) == 0);
}

static void a_pause_begun_in_the_read_callback_keeps_the_hangup(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    send_peer(&c, "GET / HTTP/1.1\r\n\r\n");
    hang_up_peer(&c);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, stop_on_data) == 0);
    turn(&c);
    CHECK(c.got_len == 18 && c.eof == 0 && c.errors == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(c.got_len == 18 && c.eof == 1);
    close_conn(&c);
}

/* A start without callbacks is refused, as libuv's is, and the pause stays in place (a stream left
 * reading with no callback would be reported by epoll for ever and never read). */
static void a_start_without_callbacks_is_refused(void)
{
    conn_t c;
    CHECK(open_conn(&c) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    CHECK(uv_read_stop((uv_stream_t *)&c.tcp) == 0);
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, NULL) == UV_EINVAL);
    CHECK(agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    send_peer(&c, "z");
    turn(&c);
    CHECK(c.got_len == 0 && !agw_read_pause_is_paused((uv_stream_t *)&c.tcp));
    CHECK(uv_read_start((uv_stream_t *)&c.tcp, alloc_cb, read_cb) == 0);
    turn(&c);
    CHECK(c.got_len == 1);
    close_conn(&c);
}

int main(void)
{
    RUN(interposed);
    RUN(a_pause_and_a_start_make_no_system_call);
    RUN(bytes_sent_while_paused_wait_for_the_start);
    RUN(a_hangup_while_paused_is_read_after_the_start);
    RUN(a_stream_libuv_stopped_is_not_paused);
    RUN(a_paused_stream_closes);
    RUN(stops_and_starts_twice);
    RUN(a_pause_begun_in_the_read_callback_keeps_the_hangup);
    RUN(a_start_without_callbacks_is_refused);
    return CHECK_DONE();
}
