/* test_upstream_batch.c: the upstream client with a batch (upstream/batch.h): requests on
 * kept-alive connections wait for the flush, a connection closed or a call cancelled before the
 * flush, and the io_uring ring (answers parsed after a callback cancelled their calls, a ring write
 * that fails, the early sends of a burst). Against the scripted upstream of upstream_srv.h on the same libev loop; every wait
 * is bounded. */
#include "tests/upstream/upstream_srv.h"

#include "upstream/upstream_internal.h" /* a queued connection's fd and mark */

#include <poll.h>

/* Write coalescing (upstream/batch.h): with a batch, a request on a kept-alive connection waits for
 * agw_batch_flush; requests on new connections go out when their connect completes. */
static void batched_requests_wait_for_the_flush(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0}, c = {0};
    agw_batch_t batch = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a); /* a new connection: not batched */
    CHECK(wait_for(&a.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK && srv.requests == 1);
    agw_call_start(pool, &req, on_done, &b);
    agw_call_start(pool, &req, on_done, &c); /* the only idle connection is taken: a new one */
    CHECK(wait_for(&c.done, 1, WAIT_S));
    CHECK(c.outcome == AGW_CALL_OK && c.reused == 0);
    run_for(0.05);
    CHECK(b.done == 0 && srv.requests == 2); /* b's request is still queued */
    CHECK(agw_batch_flush(&batch) == 1);
    CHECK(agw_batch_flush(&batch) == 0);
    CHECK(wait_for(&b.done, 1, WAIT_S));
    CHECK(b.outcome == AGW_CALL_OK && b.reused == 1);
    CHECK_STR(b.body, "hello");
    CHECK(srv.requests == 3 && srv.accepted == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* The upstream closes a kept-alive connection while a request waits on it for the flush (the loop
 * polled first): nothing was sent, so the call takes a new connection, whatever its method. */
static void batched_connection_closed_before_the_flush_takes_another(const char *method)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t first = {0}, second = {0};
    agw_batch_t batch = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    agw_call_req_t req = get("/close-after");
    agw_call_start(pool, &req, on_done, &first);
    CHECK(wait_for(&first.done, 1, WAIT_S));
    CHECK(first.outcome == AGW_CALL_OK && stats(pool).idle == 1); /* EOF not seen yet */
    agw_call_req_t next = get("/ok");
    next.method = method;
    agw_call_start(pool, &next, on_done, &second);
    CHECK(wait_for(&second.done, 1, WAIT_S)); /* the loop sees the EOF, then connects anew */
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 0);
    CHECK_STR(second.body, "hello");
    CHECK(srv.accepted == 2 && srv.requests == 2);
    CHECK(agw_batch_flush(&batch) == 0);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 1 && st.idle == 1 && st.retried == 0 && st.reused == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void batched_get_on_closed_connection_takes_another(void)
{
    batched_connection_closed_before_the_flush_takes_another("GET");
}

static void batched_post_on_closed_connection_takes_another(void)
{
    batched_connection_closed_before_the_flush_takes_another("POST");
}

/* Cancelling a call, or destroying its pool, takes its request off the batch. */
static void cancel_and_destroy_leave_the_batch(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0}, c = {0};
    agw_batch_t batch = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a);
    agw_call_start(pool, &req, on_done, &b);
    CHECK(wait_for(&b.done, 1, 3.0) && wait_for(&a.done, 1, WAIT_S));
    CHECK(stats(pool).idle == 2);
    agw_call_t *cb = agw_call_start(pool, &req, on_done, &b);
    agw_call_start(pool, &req, on_done, &c);
    CHECK(batch.head != NULL && batch.head != batch.tail);
    agw_call_cancel(cb);
    CHECK(batch.head != NULL && batch.head == batch.tail);
    agw_pool_destroy(pool);
    CHECK(batch.head == NULL && batch.tail == NULL);
    CHECK(agw_batch_flush(&batch) == 0);
    run_for(0.05);
    CHECK(b.done == 1 && c.done == 0 && srv.requests == 2);
    srv_stop(&srv);
}

/* ---- batched system calls (io_uring) ----------------------------------------------------- */


/* Four answers land in one ring submission; the first one's callback cancels the three other
 * calls, whose reads are done but not yet parsed: they get no callback, their connections close,
 * and nothing reads freed memory (the ASan build checks). */
typedef struct four {
    agw_call_t *calls[4];
    rec_t recs[4];
    int first_seen;
} four_t;

static four_t *the_four;

static void on_first_of_four_cancels_the_rest(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    four_t *f = the_four;
    on_done(call, r, data);
    f->first_seen++;
    for (int i = 0; i < 4; i++)
        if (f->calls[i] != call && f->recs[i].done == 0)
            agw_call_cancel(f->calls[i]);
}

static void ring_answers_parsed_after_a_callback_cancelled_them_are_dropped(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t b = {0};
    if (!ring_or_skip(&b))
        return;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &b);
    four_t f;
    memset(&f, 0, sizeof(f));
    the_four = &f;
    agw_call_req_t req = get("/ok");
    for (int i = 0; i < 4; i++) /* four connections, then idle */
        CHECK((f.calls[i] = agw_call_start(pool, &req, on_done, &f.recs[i])) != NULL);
    for (int i = 0; i < 4; i++)
        CHECK(wait_flushing(&b, &f.recs[i].done, 1, 3.0));
    CHECK(stats(pool).idle == 4 && srv.accepted == 4);
    memset(&f, 0, sizeof(f));
    for (int i = 0; i < 4; i++) /* on the four kept-alive connections: queued on the batch */
        CHECK((f.calls[i] = agw_call_start(pool, &req, on_first_of_four_cancels_the_rest, &f.recs[i])) != NULL);
    CHECK(agw_batch_flush(&b) == 4); /* one submission writes the four requests */
    for (int i = 0; i < 50 && srv.requests < 8; i++)
        ev_run(loop, EVRUN_NOWAIT); /* the upstream (same loop) reads them and answers */
    CHECK(srv.requests == 8);
    usleep(20000); /* the four answers are in the sockets */
    ev_run(loop, EVRUN_NOWAIT); /* the loop sees them: four reads queued, none parsed */
    CHECK(f.first_seen == 0);
    CHECK(agw_batch_flush(&b) >= 1);
    CHECK(f.first_seen == 1);
    int done = 0;
    for (int i = 0; i < 4; i++)
        done += f.recs[i].done;
    CHECK(done == 1);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 1 && st.idle == 1); /* the cancelled three closed their connections */
    CHECK(b.rhead == NULL && b.lhead == NULL && b.head == NULL);
    run_for(0.02);
    agw_pool_destroy(pool);
    agw_batch_ring_free(&b);
    srv_stop(&srv);
}

/* The upstream's side of sc ends with a reset (SO_LINGER 0), not a FIN. */
static void sconn_reset(sconn_t *sc)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    CHECK(setsockopt(sc->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
    sconn_close(sc);
}

/* Writes text on the upstream's side of sc as is, outside what it serves. */
static void sconn_send_text(sconn_t *sc, const char *text)
{
    size_t n = strlen(text);
    CHECK(send(sc->fd, text, n, MSG_NOSIGNAL) == (ssize_t)n);
}

/* The upstream closes (reset: resets) a kept-alive connection after the loop last polled, while a
 * request waits on it for the flush: the flush's poll finds it before anything is written, so the
 * call, a POST too, takes a new connection and its request reaches the upstream once (nothing to
 * retry). Without the flush's look, the POST went out on the dead connection and failed. */
static void flush_finds_a_connection_closed_since_the_poll(int ring, int reset)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t first = {0}, second = {0};
    agw_batch_t batch = {0};
    if (ring && !ring_or_skip(&batch))
        return;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    CHECK(keep_alive(pool, &batch, &first, 1) && srv.conns != NULL);
    agw_call_req_t post = get("/ok");
    post.method = "POST";
    agw_call_start(pool, &post, on_done, &second); /* queued on the batch, on the kept-alive one */
    CHECK(batch.head != NULL && batch.head->unpeeked);
    int fd = batch.head->fd;
    if (reset)
        sconn_reset(srv.conns);
    else
        sconn_close(srv.conns);
    CHECK(wait_readable(fd, WAIT_S)); /* the EOF (or reset) is there; the loop has not polled */
    CHECK(agw_batch_flush(&batch) == 0); /* nothing written: the call is connecting anew */
    CHECK(batch.head == NULL);
    CHECK(wait_flushing(&batch, &second.done, 1, WAIT_S));
    CHECK_STR(second.detail, "");
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 0);
    CHECK_STR(second.body, "hello");
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 0 && st.reused == 0 && srv.accepted == 2 && srv.requests == 2);
    agw_pool_destroy(pool);
    if (ring)
        agw_batch_ring_free(&batch);
    srv_stop(&srv);
}

static void flush_finds_a_closed_connection(void) { flush_finds_a_connection_closed_since_the_poll(0, 0); }
static void flush_finds_a_reset_connection(void) { flush_finds_a_connection_closed_since_the_poll(0, 1); }
static void ring_flush_finds_a_closed_connection(void) { flush_finds_a_connection_closed_since_the_poll(1, 0); }

/* More reused connections than one poll looks at (batch.c's 64) wait for one flush, and the
 * upstream has closed every seventh since the loop last polled: the flush looks at all of them,
 * in rounds; each closed one's call takes a new connection, every other request goes out on its
 * kept-alive one, and every call gets its answer. */
static void flush_looks_at_more_reuses_than_one_poll_takes(void)
{
    enum { N = 70 };
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t batch = {0};
    rec_t *first = calloc(N, sizeof(rec_t)), *second = calloc(N, sizeof(rec_t));
    int fds[N], done = 0;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 0;
    conf.max_pending = 4 * N;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    CHECK(keep_alive(pool, &batch, first, N) && srv.accepted == N);
    agw_call_req_t req = get("/ok");
    for (int i = 0; i < N; i++)
        agw_call_start(pool, &req, on_done, &second[i]); /* each queued on a kept-alive one */
    int queued = 0;
    for (agw_conn_t *c = batch.head; c != NULL; c = c->batch_next)
        if (c->unpeeked)
            fds[queued++] = c->fd;
    CHECK(queued == N);
    int closed = 0, k = 0;
    for (sconn_t *sc = srv.conns, *next; sc != NULL; sc = next, k++) {
        next = sc->next;
        if (k % 7 == 0) {
            sconn_close(sc);
            closed++;
        }
    }
    CHECK(closed == 10);
    /* the closes have reached the gateway's side (bounded wait), and the loop has not polled */
    int readable = 0;
    for (double end = ev_time() + WAIT_S; readable < closed && ev_time() < end;) {
        struct pollfd p[N];
        for (int i = 0; i < N; i++)
            p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        readable = poll(p, N, 10);
    }
    CHECK(readable == closed);
    agw_batch_flush(&batch);
    for (int i = 0; i < N; i++) {
        CHECK(wait_flushing(&batch, &second[i].done, 1, WAIT_S));
        done += second[i].outcome == AGW_CALL_OK && strcmp(second[i].body, "hello") == 0;
    }
    CHECK(done == N);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 0 && srv.requests == 2 * N && srv.accepted == N + closed);
    agw_pool_destroy(pool);
    srv_stop(&srv);
    free(first);
    free(second);
}


static rec_t early_x, early_y;
static sconn_t *stray_to;
static int stray_fd;

/* X's callback, run inside the flush's write of X: meanwhile Y's upstream sends a response no one
 * asked for (a script that runs for long gives it the time). */
static void on_early_x(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    on_done(call, r, data);
    sconn_send_text(stray_to, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY");
    CHECK(wait_readable(stray_fd, WAIT_S));
}

/* Without a ring the flush writes its queue one connection at a time, and a write may run a
 * callback: X's upstream answered early and reset the connection just after the flush's poll (here
 * X's and Y's marks are cleared, as the poll clears them), so X's write fails and the read finds the
 * answer. Y, queued behind X and looked at before that callback, gets bytes while it runs: the flush
 * looks at Y again before writing it, and Y's call takes a new connection instead of reading them
 * as its answer. */
static void a_callback_in_the_flush_has_the_rest_looked_at_again(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t kept[2] = {{0}};
    agw_batch_t batch = {0};
    memset(&early_x, 0, sizeof(early_x));
    memset(&early_y, 0, sizeof(early_y));
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    CHECK(keep_alive(pool, &batch, kept, 2));
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_early_x, &early_x);
    agw_call_start(pool, &req, on_done, &early_y);
    agw_conn_t *x = batch.head, *y = x ? x->batch_next : NULL;
    CHECK(x != NULL && y != NULL && x->unpeeked && y->unpeeked);
    sconn_t *sx = server_side(&srv, x->fd);
    stray_to = server_side(&srv, y->fd);
    stray_fd = y->fd;
    CHECK(sx != NULL && stray_to != NULL);
    sconn_send_text(sx, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly");
    sconn_reset(sx);
    CHECK(wait_readable(x->fd, WAIT_S));
    x->unpeeked = y->unpeeked = 0; /* both looked at by the flush's poll, X's answer and reset after */
    agw_batch_flush(&batch);
    CHECK(wait_flushing(&batch, &early_y.done, 1, WAIT_S));
    CHECK(early_x.done == 1);
    CHECK_STR(early_y.body, "hello"); /* "STRAY": bytes sent before its request, read as its answer */
    CHECK(early_y.outcome == AGW_CALL_OK && early_y.reused == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* A request queued on a kept-alive connection the upstream resets after the flush looked at it
 * (check_unpeeked; here its mark is cleared, as if the reset came just after the poll): the ring's
 * write fails, and the plain path of the same flush takes over as without a ring (its write fails
 * too, its read finds the connection gone): the GET is retried once on a new connection before
 * the loop polls again. */
static void ring_write_that_fails_goes_on_through_the_plain_path(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t b = {0};
    rec_t first = {0}, second = {0};
    if (!ring_or_skip(&b))
        return;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &b);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &first);
    CHECK(wait_flushing(&b, &first.done, 1, 3.0));
    CHECK(first.outcome == AGW_CALL_OK && stats(pool).idle == 1 && srv.conns != NULL);
    agw_call_start(pool, &req, on_done, &second); /* queued on the batch */
    CHECK(b.head != NULL);
    sconn_reset(srv.conns); /* the upstream resets the connection */
    usleep(20000);
    b.head->unpeeked = 0;
    CHECK(agw_batch_flush(&b) >= 1);
    CHECK(stats(pool).retried == 1 && b.head == NULL); /* in this flush, not after a poll */
    CHECK(wait_flushing(&b, &second.done, 1, 3.0));
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 0);
    CHECK_STR(second.body, "hello");
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 1 && srv.accepted == 2);
    agw_pool_destroy(pool);
    agw_batch_ring_free(&b);
    srv_stop(&srv);
}

/* ---- early sends (agw_batch_send_early) --------------------------------------------------- */

/* How many of the upstream's connections have bytes it has not read yet (requests the client wrote
 * since the upstream's loop last ran: written by now, not at the iteration's end). */
static int upstream_has_unread(srv_t *srv)
{
    int n = 0;
    for (sconn_t *sc = srv->conns; sc != NULL; sc = sc->next) {
        struct pollfd p = {.fd = sc->fd, .events = POLLIN};
        n += poll(&p, 1, 0) == 1;
    }
    return n;
}

/* upstream_has_unread once it reaches want (bounded: loopback TCP may deliver after the send
 * returns), without running the loop. */
static int upstream_unread_reaches(srv_t *srv, int want)
{
    int n;
    for (double end = ev_time() + WAIT_S; (n = upstream_has_unread(srv)) < want && ev_time() < end;)
        usleep(1000);
    return n;
}

/* Starts n calls of /ok (each on a kept-alive connection, queued on the batch), answered into recs. */
static void start_queued(agw_pool_t *pool, rec_t *recs, int n)
{
    agw_call_req_t req = get("/ok");
    for (int i = 0; i < n; i++)
        agw_call_start(pool, &req, on_done, &recs[i]);
}

/* A burst's requests go out before the iteration ends: nothing while fewer than
 * AGW_BATCH_EARLY_FIRST are queued (a cancelled call's connection, given back, does not count);
 * at that count all of them, written (the upstream has them unread) with no callback run; then
 * again at twice as many more; the iteration's flush starts the count again. Every call is
 * answered on its kept-alive connection. */
static void early_sends_write_a_burst_before_the_iteration_ends(void)
{
    enum { N = 30, F = AGW_BATCH_EARLY_FIRST };
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t batch = {0};
    rec_t *first = calloc(N, sizeof(rec_t)), *second = calloc(N, sizeof(rec_t));
    if (!ring_or_skip(&batch))
        goto out;
    agw_pool_t *pool = kept_alive_pool(&srv, &conf, &batch, first, N);
    CHECK(upstream_has_unread(&srv) == 0);
    start_queued(pool, second, F - 1);
    agw_call_req_t req = get("/ok");
    agw_call_t *gone = agw_call_start(pool, &req, on_done, NULL);
    agw_call_cancel(gone); /* its connection goes back to the idle list: F - 1 queued */
    CHECK(batch.queued == F - 1);
    CHECK(agw_batch_send_early(&batch) == 0 && batch.head != NULL); /* too few: they wait */
    CHECK(upstream_has_unread(&srv) == 0);
    start_queued(pool, second + F - 1, 1);
    CHECK(agw_batch_send_early(&batch) == F && batch.head == NULL && batch.queued == 0);
    CHECK(upstream_unread_reaches(&srv, F) == F);
    start_queued(pool, second + F, 2 * F - 1); /* the next early send waits for twice as many */
    CHECK(agw_batch_send_early(&batch) == 0 && upstream_has_unread(&srv) == F);
    start_queued(pool, second + 3 * F - 1, 1);
    CHECK(agw_batch_send_early(&batch) == 2 * F);
    CHECK(upstream_unread_reaches(&srv, 3 * F) == 3 * F);
    int answered = 0;
    for (int i = 0; i < N; i++)
        answered += second[i].done;
    CHECK(answered == 0); /* no callback ran: nothing was read */
    CHECK(agw_batch_flush(&batch) == 0); /* the iteration ends: the count starts again */
    start_queued(pool, second + 3 * F, F);
    CHECK(agw_batch_send_early(&batch) == F);
    CHECK(upstream_unread_reaches(&srv, 4 * F) == 4 * F);
    int ok = 0;
    for (int i = 0; i < 4 * F; i++) {
        CHECK(wait_flushing(&batch, &second[i].done, 1, WAIT_S));
        ok += second[i].outcome == AGW_CALL_OK && second[i].reused == 1 && strcmp(second[i].body, "hello") == 0;
    }
    CHECK(ok == 4 * F);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 0 && st.cancelled == 1 && srv.accepted == N && srv.requests == N + 4 * F);
    agw_pool_destroy(pool);
    agw_batch_ring_free(&batch);
    srv_stop(&srv);
out:
    free(first);
    free(second);
}

/* The upstream closes a kept-alive connection after the loop last polled, while a request of the
 * burst waits on it: the early send looks first (one poll) and writes nothing on it; that call
 * takes a new connection, and every call of the burst is answered once. */
static void an_early_send_finds_a_connection_closed_since_the_poll(void)
{
    enum { F = AGW_BATCH_EARLY_FIRST };
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t batch = {0};
    rec_t first[F] = {0}, second[F] = {0};
    if (!ring_or_skip(&batch))
        return;
    agw_pool_t *pool = kept_alive_pool(&srv, &conf, &batch, first, F);
    start_queued(pool, second, F);
    CHECK(batch.head != NULL && batch.head->unpeeked);
    int fd = batch.head->fd;
    sconn_t *sc = server_side(&srv, fd);
    CHECK(sc != NULL);
    if (sc)
        sconn_close(sc);
    CHECK(wait_readable(fd, WAIT_S)); /* the EOF is there; the loop has not polled */
    CHECK(agw_batch_send_early(&batch) == F - 1 && batch.head == NULL);
    int ok = 0;
    for (int i = 0; i < F; i++) {
        CHECK(wait_flushing(&batch, &second[i].done, 1, WAIT_S));
        ok += second[i].outcome == AGW_CALL_OK && strcmp(second[i].body, "hello") == 0;
    }
    CHECK(ok == F);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 0 && srv.accepted == F + 1 && srv.requests == 2 * F);
    agw_pool_destroy(pool);
    agw_batch_ring_free(&batch);
    srv_stop(&srv);
}

static agw_pool_t *inner_pool;
static agw_batch_t *inner_batch;
static rec_t inner_recs[AGW_BATCH_EARLY_FIRST];
static size_t inner_sent = 99;

/* A callback run inside the flush (the answer it parsed): starts a burst and tries an early send. */
static void on_answer_starts_a_burst(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    on_done(call, r, data);
    start_queued(inner_pool, inner_recs, AGW_BATCH_EARLY_FIRST);
    inner_sent = agw_batch_send_early(inner_batch);
}

/* An early send asked for inside agw_batch_flush (a script the flush's answer ran started a burst)
 * writes nothing: the flush writes the burst before it returns. */
static void an_early_send_inside_the_flush_waits_for_it(void)
{
    enum { F = AGW_BATCH_EARLY_FIRST };
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t batch = {0};
    rec_t first[F + 1] = {0}, trigger = {0};
    if (!ring_or_skip(&batch))
        return;
    agw_pool_t *pool = kept_alive_pool(&srv, &conf, &batch, first, F + 1);
    inner_pool = pool, inner_batch = &batch;
    memset(inner_recs, 0, sizeof(inner_recs));
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_answer_starts_a_burst, &trigger);
    CHECK(wait_flushing(&batch, &trigger.done, 1, WAIT_S));
    CHECK(inner_sent == 0 && batch.head == NULL); /* the flush that ran the callback wrote them */
    int ok = 0;
    for (int i = 0; i < F; i++) {
        CHECK(wait_flushing(&batch, &inner_recs[i].done, 1, WAIT_S));
        ok += inner_recs[i].outcome == AGW_CALL_OK;
    }
    CHECK(ok == F && srv.requests == 2 * (F + 1));
    agw_pool_destroy(pool);
    agw_batch_ring_free(&batch);
    srv_stop(&srv);
}

/* Without a ring an early send writes nothing (a plain write may run a callback, which must not
 * run where the owner calls it): the burst waits for the iteration's flush, as before. */
static void without_a_ring_early_sends_write_nothing(void)
{
    enum { N = 2 * AGW_BATCH_EARLY_FIRST };
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_batch_t batch = {0};
    rec_t first[N] = {0}, second[N] = {0};
    agw_pool_t *pool = kept_alive_pool(&srv, &conf, &batch, first, N);
    start_queued(pool, second, N);
    CHECK(agw_batch_send_early(&batch) == 0 && batch.head != NULL && upstream_has_unread(&srv) == 0);
    CHECK(agw_batch_flush(&batch) == N && upstream_unread_reaches(&srv, N) == N);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        CHECK(wait_flushing(&batch, &second[i].done, 1, WAIT_S));
        ok += second[i].outcome == AGW_CALL_OK;
    }
    CHECK(ok == N);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* Starts a call that takes the pool's one kept-alive connection (its request queued on the batch)
 * and cancels it, n times. Returns -1 when every cancel gave the connection back, else the first
 * iteration that did not (described on stderr). */
static int start_and_cancel(agw_pool_t *pool, const agw_call_req_t *req, int n)
{
    for (int i = 0; i < n; i++) {
        agw_call_t *c = agw_call_start(pool, req, on_done, NULL);
        agw_pool_stats_t taken = stats(pool);
        agw_call_cancel(c);
        agw_pool_stats_t back = stats(pool);
        if (!(taken.idle == 0 && taken.open == 1 && taken.reused == 1 && back.idle == 1 &&
              back.open == 1 && back.reused == 0)) {
            fprintf(stderr,
                    "  iteration %d: after the start idle %u open %u reused %llu (want 0 1 1), "
                    "after the cancel idle %u open %u reused %llu (want 1 1 0)\n",
                    i, taken.idle, taken.open, (unsigned long long)taken.reused, back.idle,
                    back.open, (unsigned long long)back.reused);
            return i;
        }
    }
    return -1;
}

/* A call cancelled while its request waits on the batch (nothing sent) gives its kept-alive
 * connection back: the next call reuses it, and the upstream saw one connection, no cancelled
 * request. The upstream runs in this process, so it answers only when the test's loop runs: the
 * calls get a timeout no stall of a loaded machine reaches (with 2 s, a 2 s stall of the process
 * between the first call's start and its answer timed it out, and the loop below then had no
 * kept-alive connection to take); the waits end as soon as the answers come. */
static void cancel_before_the_flush_gives_the_connection_back(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t first = {0}, third = {0};
    agw_batch_t batch = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &first);
    CHECK(wait_for(&first.done, 1, WAIT_S));
    CHECK_STR(first.detail, ""); /* the call ended OK (else: how it ended) */
    int first_ok = first.done == 1 && first.outcome == AGW_CALL_OK;
    CHECK(first_ok && stats(pool).idle == 1 && stats(pool).open == 1);
    int failed_at = -1;
    if (first_ok) {
        /* as a client resetting stream after stream would */
        failed_at = start_and_cancel(pool, &req, 100);
        CHECK(failed_at == -1);
    }
    if (first_ok && failed_at == -1) {
        CHECK(agw_batch_flush(&batch) == 0);
        agw_call_start(pool, &req, on_done, &third);
        CHECK(agw_batch_flush(&batch) == 1);
        CHECK(wait_for(&third.done, 1, WAIT_S));
        CHECK_STR(third.detail, "");
        CHECK(third.outcome == AGW_CALL_OK && third.reused == 1);
        CHECK(srv.accepted == 1 && srv.requests == 2);
        agw_pool_stats_t st = stats(pool);
        CHECK(st.cancelled == 100 && st.reused == 1);
    }
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

int main(int argc, char **argv)
{
    test_loop_open(argc, argv);

    RUN(cancel_before_the_flush_gives_the_connection_back);
    RUN(batched_requests_wait_for_the_flush);
    RUN(batched_get_on_closed_connection_takes_another);
    RUN(batched_post_on_closed_connection_takes_another);
    RUN(flush_finds_a_closed_connection);
    RUN(flush_finds_a_reset_connection);
    RUN(ring_flush_finds_a_closed_connection);
    RUN(flush_looks_at_more_reuses_than_one_poll_takes);
    RUN(a_callback_in_the_flush_has_the_rest_looked_at_again);
    RUN(cancel_and_destroy_leave_the_batch);
    RUN(ring_answers_parsed_after_a_callback_cancelled_them_are_dropped);
    RUN(ring_write_that_fails_goes_on_through_the_plain_path);
    RUN(early_sends_write_a_burst_before_the_iteration_ends);
    RUN(an_early_send_finds_a_connection_closed_since_the_poll);
    RUN(an_early_send_inside_the_flush_waits_for_it);
    RUN(without_a_ring_early_sends_write_nothing);

    return test_loop_close();
}
