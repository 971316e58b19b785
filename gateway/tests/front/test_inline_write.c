/* test_inline_write.c: writes finished at once (front/inline_write.h) on a real loopback TCP
 * connection and a libuv loop: when callbacks come, with what status, in what order, what a
 * close does to a listed one, a write the socket takes in part, and that a response's write makes
 * no epoll_ctl (counted: loopback.h). */
#include "loopback.h" /* (first: it asks for _GNU_SOURCE) */
#include "../check.h"
#include "front/inline_write.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uv_loop_t loop;
    uv_tcp_t tcp;
    int peer;
    int closed;
} conn_t;

static int order[8], norder, statuses[8];

static void write_cb(uv_write_t *req, int status)
{
    int tag = (int)(intptr_t)req->data;
    if (norder < 8) {
        statuses[norder] = status;
        order[norder++] = tag;
    }
}

static int open_conn(conn_t *c, uv_loop_t *loop)
{
    memset(c, 0, sizeof(*c));
    return loopback_uv_tcp(loop, &c->tcp, c, &c->peer);
}

static void on_close(uv_handle_t *h)
{
    ((conn_t *)h->data)->closed = 1;
}

static void turn(uv_loop_t *loop)
{
    for (int i = 0; i < 4; i++)
        uv_run(loop, UV_RUN_NOWAIT);
}

static void close_conn(conn_t *c, uv_loop_t *loop)
{
    uv_close((uv_handle_t *)&c->tcp, on_close);
    turn(loop);
    CHECK(c->closed);
    close(c->peer);
}

/* What the peer has received, up to len bytes, without waiting. */
static size_t peer_read(conn_t *c, char *buf, size_t len)
{
    size_t got = 0;
    int fl = fcntl(c->peer, F_GETFL);
    fcntl(c->peer, F_SETFL, fl | O_NONBLOCK);
    ssize_t n;
    while (got < len && (n = read(c->peer, buf + got, len - got)) > 0)
        got += (size_t)n;
    fcntl(c->peer, F_SETFL, fl);
    return got;
}

/* want bytes the peer receives, waiting for each part up to 10 s (a loaded machine may deliver
 * loopback traffic late); returns how many came. */
static size_t peer_read_all(conn_t *c, char *buf, size_t want)
{
    size_t got = 0;
    while (got < want && wait_for(c->peer, POLLIN)) {
        size_t n = peer_read(c, buf + got, want - got);
        if (n == 0)
            break; /* (the end of the stream) */
        got += n;
    }
    return got;
}

static void interposed(void)
{
    CHECK(agw_inline_write_active());
}

static void a_write_taken_at_once_finishes_from_the_list(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    turn(&loop);
    norder = 0;
    int before = ctl_calls;
    uv_write_t req = {.data = (void *)1};
    uv_buf_t b = uv_buf_init((char *)"HTTP/1.1 200 OK\r\n\r\n", 19);
    CHECK(uv_write(&req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) == 0);
    CHECK(norder == 0);                     /* never from inside uv_write */
    CHECK(agw_inline_write_pending() == 1);
    char got[64];
    CHECK(peer_read_all(&c, got, 19) == 19); /* the bytes went at once */
    CHECK(agw_inline_write_finish() == 1);
    CHECK(norder == 1 && order[0] == 1 && statuses[0] == 0);
    CHECK(agw_inline_write_finish() == 0 && norder == 1); /* once */
    turn(&loop);
    CHECK(ctl_calls == before);
    /* libuv's own uv_write, for comparison: its pending queue's drain re-arms the watcher */
    before = ctl_calls;
    uv_write_t req2 = {.data = (void *)2};
    CHECK(agw_inline_write_libuv(&req2, (uv_stream_t *)&c.tcp, &b, 1, write_cb) == 0);
    turn(&loop);
    CHECK(norder == 2 && order[1] == 2 && statuses[1] == 0);
    CHECK(ctl_calls > before);
    close_conn(&c, &loop);
    uv_loop_close(&loop);
}

static void callbacks_come_in_the_order_of_the_writes(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t a, b;
    CHECK(open_conn(&a, &loop) == 0 && open_conn(&b, &loop) == 0);
    norder = 0;
    uv_write_t r1 = {.data = (void *)1}, r2 = {.data = (void *)2}, r3 = {.data = (void *)3};
    uv_buf_t x = uv_buf_init((char *)"x", 1), none = uv_buf_init((char *)"", 0);
    CHECK(uv_write(&r1, (uv_stream_t *)&b.tcp, &x, 1, write_cb) == 0);
    CHECK(uv_write(&r2, (uv_stream_t *)&a.tcp, &x, 1, write_cb) == 0);
    CHECK(uv_write(&r3, (uv_stream_t *)&b.tcp, &none, 1, write_cb) == 0); /* (no bytes: taken at once) */
    CHECK(agw_inline_write_finish() == 3);
    CHECK(norder == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3);
    close_conn(&a, &loop);
    close_conn(&b, &loop);
    uv_loop_close(&loop);
}

/* libuv refuses a write at once on a stream it no longer writes (after uv_shutdown here; after a
 * failed read for a TLS close_notify in the gateway): the callback says so, uv_write returns 0. */
static void a_write_refused_at_once_is_answered(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    uv_shutdown_t sreq;
    CHECK(uv_shutdown(&sreq, (uv_stream_t *)&c.tcp, NULL) == 0);
    turn(&loop);
    norder = 0;
    uv_write_t req = {.data = (void *)7};
    uv_buf_t b = uv_buf_init((char *)"bye", 3);
    CHECK(agw_inline_write_libuv(&req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) < 0); /* libuv's: refused */
    CHECK(uv_write(&req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) == 0);
    CHECK(agw_inline_write_finish() == 1);
    CHECK(norder == 1 && order[0] == 7 && statuses[0] < 0);
    close_conn(&c, &loop);
    uv_loop_close(&loop);
}

/* A close cancels a listed write's callback before libuv closes (the request may be freed by the
 * close callback): UV_ECANCELED once, never again from the list. */
static void a_close_cancels_a_listed_write(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    norder = 0;
    uv_write_t *req = malloc(sizeof(*req));
    req->data = (void *)5;
    uv_buf_t b = uv_buf_init((char *)"data", 4);
    CHECK(uv_write(req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) == 0);
    uv_close((uv_handle_t *)&c.tcp, on_close);
    CHECK(norder == 1 && order[0] == 5 && statuses[0] == UV_ECANCELED);
    free(req); /* (as h2o's close callback frees its socket) */
    turn(&loop);
    CHECK(c.closed);
    CHECK(agw_inline_write_finish() == 0 && norder == 1);
    CHECK(agw_inline_write_pending() == 0);
    close(c.peer);
    uv_loop_close(&loop);
}

/* More than the socket takes: the rest goes to libuv, which finishes it when the peer reads; the
 * peer gets every byte in order. */
static void a_write_taken_in_part_is_finished_by_libuv(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    enum { LEN = 8 << 20 };
    char *data = malloc(LEN), *got = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        data[i] = (char)(i * 7 + i / 4096);
    uv_buf_t bufs[3] = {uv_buf_init(data, 100), uv_buf_init(data + 100, LEN / 2), uv_buf_init(data + 100 + LEN / 2, LEN / 2 - 100)};
    norder = 0;
    uv_write_t req = {.data = (void *)9};
    CHECK(uv_write(&req, (uv_stream_t *)&c.tcp, bufs, 3, write_cb) == 0);
    CHECK(agw_inline_write_pending() == 0); /* not all taken: libuv's */
    size_t n = 0;
    for (int i = 0; i < 100000 && (n < LEN || norder == 0); i++) {
        n += peer_read(&c, got + n, LEN - n);
        uv_run(&loop, UV_RUN_NOWAIT);
    }
    CHECK(n == LEN && memcmp(got, data, LEN) == 0);
    CHECK(norder == 1 && order[0] == 9 && statuses[0] == 0);
    free(data);
    free(got);
    close_conn(&c, &loop);
    uv_loop_close(&loop);
}

/* Callbacks that each write again (h2o's HTTP/2 writes its next frames from a write's callback)
 * while the list is full: one call finishes the writes listed when it began, no more; theirs wait
 * for the next call (the loop must not stay in it while the socket takes bytes). */
enum { AGAIN_N = 100 };
static uv_write_t again_reqs[2 * AGAIN_N];
static int again_calls;

static void again_cb(uv_write_t *req, int status)
{
    (void)status;
    again_calls++;
    size_t i = (size_t)(req - again_reqs);
    if (i < AGAIN_N) { /* a first write: one more (its own request) */
        uv_buf_t b = uv_buf_init((char *)"y", 1);
        CHECK(uv_write(&again_reqs[AGAIN_N + i], req->handle, &b, 1, again_cb) == 0);
    }
}

static void callbacks_that_write_again_wait_for_the_next_call(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    agw_inline_write_disable(); /* (a fresh list of 64 slots: it fills while the callbacks write) */
    agw_inline_write_enable();
    uv_buf_t b = uv_buf_init((char *)"x", 1);
    for (int i = 0; i < AGAIN_N; i++)
        CHECK(uv_write(&again_reqs[i], (uv_stream_t *)&c.tcp, &b, 1, again_cb) == 0);
    again_calls = 0;
    CHECK(agw_inline_write_finish() == AGAIN_N);
    CHECK(again_calls == AGAIN_N);
    CHECK(agw_inline_write_pending() == AGAIN_N);
    CHECK(agw_inline_write_finish() == AGAIN_N);
    CHECK(again_calls == 2 * AGAIN_N && agw_inline_write_pending() == 0);
    char got[4 * AGAIN_N];
    CHECK(peer_read_all(&c, got, 2 * AGAIN_N) == 2 * AGAIN_N);
    close_conn(&c, &loop);
    uv_loop_close(&loop);
}

/* A write to a closing handle is libuv's refusal, returned: nothing is listed (the handle's close
 * callback may free the request before the list is read). */
static void a_write_to_a_closing_handle_is_refused(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    uv_close((uv_handle_t *)&c.tcp, on_close);
    norder = 0;
    uv_write_t req = {.data = (void *)4};
    uv_buf_t b = uv_buf_init((char *)"x", 1);
    CHECK(uv_write(&req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) < 0);
    CHECK(agw_inline_write_pending() == 0);
    turn(&loop);
    CHECK(c.closed && norder == 0);
    close(c.peer);
    uv_loop_close(&loop);
}

/* A thread that did not enable it gets libuv's uv_write. */
static void a_thread_not_enabled_gets_libuv(void)
{
    agw_inline_write_disable();
    uv_loop_t loop;
    uv_loop_init(&loop);
    conn_t c;
    CHECK(open_conn(&c, &loop) == 0);
    norder = 0;
    uv_write_t req = {.data = (void *)3};
    uv_buf_t b = uv_buf_init((char *)"x", 1);
    CHECK(uv_write(&req, (uv_stream_t *)&c.tcp, &b, 1, write_cb) == 0);
    CHECK(agw_inline_write_pending() == 0);
    turn(&loop);
    CHECK(norder == 1 && statuses[0] == 0);
    close_conn(&c, &loop);
    uv_loop_close(&loop);
    agw_inline_write_enable();
}

int main(void)
{
    agw_inline_write_enable();
    RUN(interposed);
    RUN(a_write_taken_at_once_finishes_from_the_list);
    RUN(callbacks_come_in_the_order_of_the_writes);
    RUN(a_write_refused_at_once_is_answered);
    RUN(a_close_cancels_a_listed_write);
    RUN(a_write_taken_in_part_is_finished_by_libuv);
    RUN(callbacks_that_write_again_wait_for_the_next_call);
    RUN(a_write_to_a_closing_handle_is_refused);
    RUN(a_thread_not_enabled_gets_libuv);
    agw_inline_write_disable();
    return CHECK_DONE();
}
