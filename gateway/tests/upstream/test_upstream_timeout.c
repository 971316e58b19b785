/* test_upstream_timeout.c: how an upstream call ends early: the connect refused or timed out, the
 * call's timeout (counted from the start, an answer in hand when it fires still the result), and
 * cancels, of a call that is sending, queued or still connecting, that never call back. Against
 * the scripted upstream of upstream_srv.h on the same libev loop; every wait is bounded. */
#include "tests/upstream/upstream_srv.h"
#include "upstream/upstream_internal.h" /* (the pool's timeouts, for the burst case) */

static void connect_refused_on_closed_port(void)
{
    agw_upstream_conf_t conf;
    rec_t rec;
    int port;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &len);
    port = ntohs(sa.sin_port);
    close(fd); /* bound, never listened: nothing accepts on that port */
    conf_init(&conf, port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    memset(&rec, 0, sizeof(rec));
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(rec.done == 0);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_REFUSED);
    CHECK(strstr(rec.detail, "refused") != NULL);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
}

static void connect_times_out_when_backlog_is_full(void)
{
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    int port, fillers[4];
    /* a listener that never accepts, with its accept queue full: further SYNs are dropped */
    int lfd = listen_socket(0, &port);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 4; i++) {
        fillers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(fillers[i], (struct sockaddr *)&sa, sizeof(sa));
    }
    conf_init(&conf, port);
    conf.connect_timeout_ms = 100;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    loop_gap_reset();
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_CONNECT_TIMEOUT);
    CHECK(rec.ms >= 95 && rec.ms < 1000 + loop_gap_ms()); /* late by no more than a stall */
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    for (int i = 0; i < 4; i++)
        close(fillers[i]);
    close(lfd);
}

static void connect_timeout_counts_from_the_connect_not_from_the_loop_iteration(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.connect_timeout_ms = 50;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    ev_run(loop, EVRUN_NOWAIT); /* the loop's clock reads now */
    usleep(120000);             /* and the iteration works on (a handler building a body, a big decode) */
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello");
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* The connect completes while the loop is busy past connect_timeout_ms (50 pages in one
 * iteration on a loaded machine): the completion and the due timer come in the same poll, and
 * libev would run the timer first. The connection that is up is used, not a connect timeout. */
static void connect_done_when_the_connect_timer_fires_is_a_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.connect_timeout_ms = 50;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &rec);
    usleep(120000); /* the iteration that connected works on past the connect timeout */
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello");
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void call_times_out_on_hanging_upstream(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_call_req_t req = get("/hang");
    req.timeout_ms = 150;
    call_once(&srv, &conf, req, &rec);
    CHECK(rec.outcome == AGW_CALL_TIMEOUT);
    CHECK(rec.ms >= 145 && rec.ms < 1000 + loop_gap_ms()); /* late by no more than a stall */
    CHECK(strstr(rec.detail, "150 ms") != NULL);
    run_for(0.02);
    CHECK(srv.eofs == 1); /* the connection was closed, not kept */
    srv_stop(&srv);
}

/* The answer and the call's timeout come in the same loop iteration (the loop was busy past the
 * timeout, and the answer came before the loop polled again): libev would run the timer first.
 * The answer that is in is the result, not a timeout. */
static void answer_in_hand_when_the_timeout_fires_is_the_result(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/hang");
    req.timeout_ms = 100;
    agw_call_start(pool, &req, on_done, &rec);
    run_for(0.03);
    CHECK(srv.requests == 1 && srv.conns != NULL && rec.done == 0);
    static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nlate!";
    CHECK(send(srv.conns->fd, answer, sizeof(answer) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(answer) - 1);
    usleep(150000); /* the loop is busy elsewhere past the call's timeout */
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "late!");
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 1 && st.idle == 1); /* a clean answer: the connection is kept */
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* A timeout with nothing in is still a timeout, and the connection goes. */
static void timeout_with_nothing_in_is_a_timeout(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/hang");
    req.timeout_ms = 100;
    agw_call_start(pool, &req, on_done, &rec);
    run_for(0.03);
    usleep(150000);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_TIMEOUT);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void zero_timeout_fails_from_the_loop(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    req.timeout_ms = 0;
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(rec.done == 0);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_TIMEOUT);
    CHECK(srv.accepted == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* A burst's timeouts: 5,000 calls wait for the one connection, whose call hangs. Each call's
 * timeout is on the pool's set (base/timeouts.h), which grows to hold them; they come due in
 * one run of the set, each call is delivered once (the waiting ones as overload, the one on the
 * connection as a timeout), and the set's array is back to its minimum: libev's own timer heap
 * kept a burst's size for good (docs/performance.md, "A twenty-seventh pass"). */
enum { BURST_CALLS = 5000 };
static int burst_done, burst_overload, burst_timeout;

static void on_burst_done(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    (void)call, (void)data;
    burst_done++;
    burst_overload += r->outcome == AGW_CALL_OVERLOAD;
    burst_timeout += r->outcome == AGW_CALL_TIMEOUT;
}

static void a_burst_of_timeouts_gives_its_memory_back(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 1;
    conf.max_pending = BURST_CALLS;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/hang");
    req.timeout_ms = 200;
    burst_done = burst_overload = burst_timeout = 0;
    for (int i = 0; i < BURST_CALLS; i++)
        CHECK(agw_call_start(pool, &req, on_burst_done, NULL) != NULL);
    CHECK(pool->timeouts.n >= BURST_CALLS && pool->timeouts.cap >= BURST_CALLS); /* (and the connect) */
    CHECK(stats(pool).pending == BURST_CALLS - 1);
    CHECK(wait_for(&burst_done, BURST_CALLS, WAIT_S));
    CHECK(burst_overload == BURST_CALLS - 1 && burst_timeout == 1);
    CHECK(pool->timeouts.n == 0 && pool->timeouts.cap == AGW_TIMEOUTS_MIN_CAP);
    run_for(0.05);
    CHECK(burst_done == BURST_CALLS); /* each once */
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void cancel_closes_connection_without_callback(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/hang");
    agw_call_t *call = agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&srv.requests, 1, WAIT_S));
    agw_call_cancel(call);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 0 && st.cancelled == 1);
    CHECK(wait_for(&srv.eofs, 1, WAIT_S)); /* the upstream sees the connection go */
    run_for(0.05);
    CHECK(rec.done == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void cancel_queued_call_leaves_queue_without_callback(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0}, c = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 1;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t slow = get("/slow");
    agw_call_start(pool, &slow, on_done, &a);
    agw_call_t *queued = agw_call_start(pool, &slow, on_done, &b);
    agw_call_start(pool, &slow, on_done, &c);
    CHECK(stats(pool).pending == 2);
    agw_call_cancel(queued);
    CHECK(stats(pool).pending == 1);
    CHECK(wait_for(&c.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK && c.outcome == AGW_CALL_OK && c.reused == 1);
    CHECK(b.done == 0);
    CHECK(srv.requests == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* A call cancelled while its new connection is still connecting leaves the connection to finish
 * connecting; it then waits idle for the next call. */
static void cancel_while_connecting_keeps_the_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t second = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_t *c = agw_call_start(pool, &req, on_done, NULL);
    agw_call_cancel(c);
    CHECK(stats(pool).open == 1 && stats(pool).idle == 0);
    for (int i = 0; i < 50 && stats(pool).idle == 0; i++)
        run_for(0.01);
    CHECK(stats(pool).idle == 1 && stats(pool).open == 1);
    agw_call_start(pool, &req, on_done, &second);
    CHECK(wait_for(&second.done, 1, WAIT_S));
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 1);
    CHECK(srv.accepted == 1 && srv.requests == 1);
    /* the next call takes a connection still connecting that a cancelled call left */
    rec_t third = {0};
    agw_pool_t *fresh = agw_pool_create(loop, &conf);
    for (int i = 0; i < 100; i++) /* as a client resetting stream after stream would */
        agw_call_cancel(agw_call_start(fresh, &req, on_done, NULL));
    agw_call_start(fresh, &req, on_done, &third);
    CHECK(stats(fresh).open == 1);
    CHECK(wait_for(&third.done, 1, WAIT_S));
    CHECK(third.outcome == AGW_CALL_OK && srv.accepted == 2 && srv.requests == 2);
    agw_pool_destroy(fresh);
    /* an orphan still connecting when the pool goes is closed with it */
    c = agw_call_start(pool, &req, on_done, NULL);
    agw_call_t *c2 = agw_call_start(pool, &req, on_done, NULL);
    agw_call_cancel(c);
    agw_call_cancel(c2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

int main(int argc, char **argv)
{
    test_loop_open(argc, argv);

    RUN(connect_refused_on_closed_port);
    RUN(connect_times_out_when_backlog_is_full);
    RUN(connect_timeout_counts_from_the_connect_not_from_the_loop_iteration);
    RUN(connect_done_when_the_connect_timer_fires_is_a_connection);
    RUN(call_times_out_on_hanging_upstream);
    RUN(zero_timeout_fails_from_the_loop);
    RUN(answer_in_hand_when_the_timeout_fires_is_the_result);
    RUN(timeout_with_nothing_in_is_a_timeout);
    RUN(cancel_closes_connection_without_callback);
    RUN(cancel_queued_call_leaves_queue_without_callback);
    RUN(cancel_while_connecting_keeps_the_connection);
    RUN(a_burst_of_timeouts_gives_its_memory_back);

    return test_loop_close();
}
