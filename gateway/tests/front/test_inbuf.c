/* test_inbuf.c: a plain client connection's input buffer in a 2 KB block (front/inbuf.h), on real
 * h2o sockets over loopback TCP connections on a libuv loop: the block, what a thread learns and
 * from what, that a request bigger than the block arrives whole, and that a read stopped and
 * started again keeps the block. */
#include "loopback.h" /* (first: it asks for _GNU_SOURCE) */
#include "../check.h"
#include "front/inbuf.h"
#include "front/read_pause.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uv_loop_t loop;
    uv_tcp_t *tcp;     /* freed by its close callback */
    h2o_socket_t *sock;
    int peer;          /* the client's end (blocking) */
    char got[32768];   /* what the reads brought, in order */
    size_t got_len;
    int reads, errors;
} conn_t;

static int closed_handles;

static void on_handle_closed(uv_handle_t *h)
{
    free(h);
    closed_handles++;
}

/* h2o's read callback: keeps the buffer's bytes (as HTTP/1 keeps a request's until it is whole)
 * and copies what is new. */
static void on_read(h2o_socket_t *sock, const char *err)
{
    conn_t *c = sock->data;
    if (err != NULL) {
        c->errors++;
        return;
    }
    c->reads++;
    size_t have = sock->input->size;
    if (have > c->got_len && have <= sizeof(c->got)) {
        memcpy(c->got + c->got_len, sock->input->bytes + c->got_len, have - c->got_len);
        c->got_len = have;
    }
}

/* Opens a loopback connection whose accepted end is an h2o socket on c->loop (not reading yet). */
static int open_conn(conn_t *c)
{
    memset(c, 0, sizeof(*c));
    uv_loop_init(&c->loop);
    c->tcp = malloc(sizeof(*c->tcp));
    if (loopback_uv_tcp(&c->loop, c->tcp, NULL, &c->peer) != 0)
        return -1;
    c->sock = h2o_uv_socket_create((uv_stream_t *)c->tcp, on_handle_closed);
    c->sock->data = c;
    return 0;
}

/* Starts h2o's reading of c, declared to inbuf.h as accept.c declares a connection when declare. */
static void start_reading(conn_t *c, int declare)
{
    if (declare)
        agw_inbuf_expect((uv_stream_t *)c->tcp);
    h2o_socket_read_start(c->sock, on_read);
    agw_inbuf_expect(NULL);
}

/* The peer sends n bytes of s; the loop turns until the h2o socket's buffer holds want bytes (at
 * most 1,000 turns, each after the bytes are in the kernel's queue or 10 s). */
static void send_and_read(conn_t *c, const char *s, size_t n, size_t want)
{
    CHECK(write(c->peer, s, n) == (ssize_t)n);
    for (int i = 0; i < 1000 && c->got_len < want; i++) {
        uv_os_fd_t fd = -1;
        uv_fileno((uv_handle_t *)c->tcp, &fd);
        wait_for(fd, POLLIN);
        uv_run(&c->loop, UV_RUN_NOWAIT);
    }
    CHECK(c->got_len == want);
}

static void close_conn(conn_t *c)
{
    int before = closed_handles;
    h2o_socket_close(c->sock);
    for (int i = 0; i < 4; i++)
        uv_run(&c->loop, UV_RUN_NOWAIT);
    CHECK(closed_handles == before + 1);
    CHECK(uv_loop_close(&c->loop) == 0);
    close(c->peer);
}

static const char request[] = "GET /product-page/42 HTTP/1.1\r\nHost: a\r\n\r\n";

/* A test callback that is not h2o's */
static void other_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h, (void)suggested;
    buf->base = NULL;
    buf->len = 0;
}

static void interposed(void)
{
    CHECK(agw_read_pause_active()); /* inbuf.h's callback is given at read_pause.c's uv_read_start */
    CHECK(offsetof(h2o_buffer_t, _buf) + AGW_INBUF_CAPACITY == AGW_INBUF_BLOCK);
}

/* On a thread that did not call agw_inbuf_thread_init, h2o's buffer is h2o's (its prototype's
 * 8 KB: the thread's own, untouched) and nothing is learnt from a declared connection. */
static void *untouched_thread(void *arg)
{
    int *ok = arg;
    conn_t *c = malloc(sizeof(*c));
    if (open_conn(c) == 0) {
        start_reading(c, 1);
        send_and_read(c, request, sizeof(request) - 1, sizeof(request) - 1);
        *ok = !agw_inbuf_learnt() && c->sock->input->capacity == H2O_SOCKET_INITIAL_INPUT_BUFFER_SIZE * 2 &&
              memcmp(c->got, request, sizeof(request) - 1) == 0;
        close_conn(c);
    }
    free(c);
    /* the buffer went to this thread's recycling list, which the thread's end would leak */
    h2o_mem_recycle_t *r = &h2o_socket_buffer_prototype.allocator;
    while (r->cnt > 0)
        free(h2o_mem_alloc_recycle(r, offsetof(h2o_buffer_t, _buf) + H2O_SOCKET_INITIAL_INPUT_BUFFER_SIZE * 2));
    return NULL;
}

static void a_thread_that_did_not_ask_keeps_h2os_buffer(void)
{
    pthread_t t;
    int ok = 0;
    CHECK(pthread_create(&t, NULL, untouched_thread, &ok) == 0);
    pthread_join(t, NULL);
    CHECK(ok);
}

/* (From here on, the main thread has called agw_inbuf_thread_init.) */
static void nothing_is_learnt_from_a_connection_not_declared(void)
{
    conn_t *c = malloc(sizeof(*c));
    CHECK(open_conn(c) == 0);
    start_reading(c, 0);
    send_and_read(c, request, sizeof(request) - 1, sizeof(request) - 1);
    CHECK(!agw_inbuf_learnt());
    CHECK(c->sock->input->capacity == 4096); /* h2o's 4,096 free bytes: a block of its own */
    close_conn(c);
    free(c);
}

static void nothing_is_learnt_from_a_tls_socket_or_a_callback_outside_libh2o(void)
{
    uv_loop_t loop;
    uv_tcp_t tcp;
    uv_loop_init(&loop);
    uv_tcp_init(&loop, &tcp);
    h2o_socket_t fake;
    memset(&fake, 0, sizeof(fake));
    tcp.data = &fake;
    /* an address inside libh2o, standing for h2o's callback (never called) */
    uv_alloc_cb in_h2o = (uv_alloc_cb)(void (*)(void))h2o_socket_read_start;
    agw_inbuf_expect((uv_stream_t *)&tcp);
    fake.ssl = (void *)&fake; /* a TLS socket: its callback is alloc_inbuf_ssl */
    CHECK(agw_inbuf_alloc_cb((uv_stream_t *)&tcp, in_h2o) == in_h2o);
    fake.ssl = NULL; /* a plain one, but a callback of ours */
    CHECK(agw_inbuf_alloc_cb((uv_stream_t *)&tcp, other_alloc) == other_alloc);
    CHECK(agw_inbuf_alloc_cb((uv_stream_t *)&tcp, NULL) == NULL);
    agw_inbuf_expect(NULL);
    CHECK(agw_inbuf_alloc_cb((uv_stream_t *)&tcp, in_h2o) == in_h2o); /* not declared */
    CHECK(!agw_inbuf_learnt());
    uv_close((uv_handle_t *)&tcp, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(uv_loop_close(&loop) == 0);
}

static void a_declared_plain_connection_reads_into_the_small_block(void)
{
    conn_t *c = malloc(sizeof(*c));
    CHECK(open_conn(c) == 0);
    start_reading(c, 1);
    CHECK(agw_inbuf_learnt());
    send_and_read(c, request, sizeof(request) - 1, sizeof(request) - 1);
    CHECK(memcmp(c->got, request, sizeof(request) - 1) == 0);
    CHECK(c->sock->input->capacity == AGW_INBUF_CAPACITY);
    /* a read stopped and started again (HTTP/1 does it around each request; read_pause.h pauses
     * it) still reads into the block, which the consumed request left empty */
    h2o_buffer_consume(&c->sock->input, c->sock->input->size);
    c->got_len = 0;
    h2o_socket_read_stop(c->sock);
    h2o_socket_read_start(c->sock, on_read);
    send_and_read(c, request, sizeof(request) - 1, sizeof(request) - 1);
    CHECK(memcmp(c->got, request, sizeof(request) - 1) == 0);
    CHECK(c->sock->input->capacity == AGW_INBUF_CAPACITY);
    close_conn(c);
    free(c);
}

static void every_plain_connection_after_reads_into_the_small_block(void)
{
    conn_t *c = malloc(sizeof(*c));
    CHECK(open_conn(c) == 0);
    start_reading(c, 0); /* (learnt already: no declaration needed) */
    send_and_read(c, request, sizeof(request) - 1, sizeof(request) - 1);
    CHECK(c->sock->input->capacity == AGW_INBUF_CAPACITY);
    CHECK(agw_inbuf_alloc_cb((uv_stream_t *)c->tcp, other_alloc) == other_alloc);
    close_conn(c);
    free(c);
}

/* 20,000 bytes kept unconsumed (a request's head that is not whole yet): the buffer grows past the
 * block, by h2o's rules, and every byte arrives in order. */
static void a_request_bigger_than_the_block_arrives_whole(void)
{
    conn_t *c = malloc(sizeof(*c));
    CHECK(open_conn(c) == 0);
    start_reading(c, 0);
    size_t n = 20000;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + i % 26);
    send_and_read(c, big, n, n);
    CHECK(memcmp(c->got, big, n) == 0);
    CHECK(c->sock->input->capacity >= n);
    CHECK(c->reads >= 2); /* (more than one read: the block holds about 2 KB) */
    free(big);
    close_conn(c);
    free(c);
}

int main(void)
{
    RUN(interposed);
    RUN(a_thread_that_did_not_ask_keeps_h2os_buffer);
    agw_inbuf_thread_init();
    RUN(nothing_is_learnt_from_a_connection_not_declared);
    RUN(nothing_is_learnt_from_a_tls_socket_or_a_callback_outside_libh2o);
    RUN(a_declared_plain_connection_reads_into_the_small_block);
    RUN(every_plain_connection_after_reads_into_the_small_block);
    RUN(a_request_bigger_than_the_block_arrives_whole);
    return CHECK_DONE();
}
