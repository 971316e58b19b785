/* test_upstream.c: the upstream HTTP/1.1 client and its keep-alive pool, against the scripted
 * upstream of upstream_srv.h on the same libev loop ("given an upstream that answers like this,
 * the call ends like that"). Every wait is bounded. The same client over TLS: test_upstream_tls.c. */
#include "tests/upstream/upstream_srv.h"
#include "upstream/http1.h"

/* ---- tests ---------------------------------------------------------------------------- */

/* A header value with any control character but HTAB is refused, wherever it sits in a value of
 * any length (the check reads eight bytes at a time); tabs, spaces, visible ASCII and UTF-8 pass. */
static void header_values_with_control_characters_are_never_sent(void)
{
    static const unsigned char controls[] = {0x00, 0x01, 0x08, 0x0a, 0x0b, 0x0c, 0x0d, 0x1b, 0x1f, 0x7f};
    char v[40];
    for (size_t n = 1; n <= 2 * sizeof(v); n++) { /* without tabs (the word-wise path), then with */
        size_t len = n <= sizeof(v) ? n : n - sizeof(v);
        int tabs = n > sizeof(v);
        for (size_t i = 0; i < len; i++)
            v[i] = (char)(tabs && i % 3 == 0 ? '\t' : i % 3 == 1 ? 'a' : i % 3 == 2 ? '\xc3' : '~');
        agw_header_t h = {.name = "x-note", .name_len = 6, .value = v, .value_len = len};
        CHECK(agw_h1_request_invalid("GET", "/a", 2, &h, 1) == NULL);
        for (size_t at = 0; at < len; at++) {
            for (size_t k = 0; k < sizeof(controls); k++) {
                char saved = v[at];
                v[at] = (char)controls[k];
                const char *why = agw_h1_request_invalid("GET", "/a", 2, &h, 1);
                CHECK(why != NULL && strstr(why, "control character") != NULL);
                v[at] = saved;
            }
        }
    }
    /* and the path: '#', a raw byte, a space */
    CHECK(agw_h1_request_invalid("GET", "/a#b", 4, NULL, 0) != NULL);
    CHECK(agw_h1_request_invalid("GET", "/a\xff" "b", 4, NULL, 0) != NULL);
    CHECK(agw_h1_request_invalid("GET", "/a b", 4, NULL, 0) != NULL);
    CHECK(agw_h1_request_invalid("GET", "/a%23b?c=%20", 12, NULL, 0) == NULL);
}

static void outcome_names_are_stable(void)
{
    CHECK_STR(agw_call_outcome_name(AGW_CALL_OK), "ok");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_REFUSED), "refused");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_CONNECT_TIMEOUT), "connect_timeout");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_TIMEOUT), "timeout");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_RESET), "reset");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_TRUNCATED), "truncated");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_BAD_RESPONSE), "bad_response");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_TOO_LARGE), "too_large");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_OVERLOAD), "overload");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_BAD_REQUEST), "bad_request");
    CHECK_STR(agw_call_outcome_name(AGW_CALL_TLS), "tls");
}

static void content_length_response_gives_status_headers_body(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/ok"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK(rec.status == 200);
    CHECK_STR(rec.body, "hello");
    CHECK(strstr(rec.headers, "X-Test: yes\n") != NULL);
    CHECK(rec.reused == 0);
    srv_stop(&srv);
}

static void request_has_method_base_path_host_headers_and_body(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.base_path = "/api";
    conf.host_header = "product.internal:9001";
    agw_header_t hdrs[] = {{"X-Trace", 7, "abc", 3},
                           {"Content-Length", 14, "999", 3}, /* the client's own wins */
                           {"Accept", 6, "application/json", 16}};
    agw_call_req_t req = {.method = "POST", .path = "/items?x=1", .path_len = 10, .headers = hdrs,
                          .num_headers = 3, .body = "{\"a\":1}", .body_len = 7, .timeout_ms = 2000};
    call_once(&srv, &conf, req, &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(srv.last_req, "POST /api/items?x=1 HTTP/1.1\r\nHost: product.internal:9001\r\n"
                            "X-Trace: abc\r\nAccept: application/json\r\nContent-Length: 7\r\n"
                            "\r\n{\"a\":1}");

    agw_call_req_t empty_post = {.method = "POST", .path = "/p", .path_len = 2, .timeout_ms = 2000};
    call_once(&srv, &conf, empty_post, &rec);
    CHECK(strstr(srv.last_req, "\r\nContent-Length: 0\r\n\r\n") != NULL);
    call_once(&srv, &conf, get("/g"), &rec);
    CHECK(strstr(srv.last_req, "Content-Length") == NULL);
    srv_stop(&srv);
}

static void keep_alive_reuses_one_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a);
    CHECK(wait_for(&a.done, 1, 3.0));
    CHECK(stats(pool).idle == 1);
    agw_call_start(pool, &req, on_done, &b);
    CHECK(wait_for(&b.done, 1, 3.0));
    CHECK(a.outcome == AGW_CALL_OK && b.outcome == AGW_CALL_OK);
    CHECK_STR(b.body, "hello");
    CHECK(a.reused == 0 && b.reused == 1);
    CHECK(srv.accepted == 1);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.calls == 2 && st.reused == 1 && st.open == 1 && st.idle == 1);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* Connections hold response buffers only while they read an answer: more answers at once than
 * the pool keeps spare buffer sets for (8), of different shapes, twice on the same connections;
 * each answer is whole and its own (no bytes, headers or trailers of another answer). */
static void answers_at_once_on_many_connections_each_get_their_own(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    enum { N = 13 };
    static rec_t recs[2][N];
    memset(recs, 0, sizeof(recs));
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    const char *paths[3] = {"/chunked", "/ok", "/big"};
    int reused = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            agw_call_req_t req = get(paths[(i + round) % 3]);
            agw_call_start(pool, &req, on_done, &recs[round][i]);
        }
        int all = 1;
        for (int i = 0; i < N; i++)
            all = all && wait_for(&recs[round][i].done, 1, 10.0);
        CHECK(all);
        for (int i = 0; i < N; i++) {
            const rec_t *r = &recs[round][i];
            const char *path = paths[(i + round) % 3];
            CHECK(r->outcome == AGW_CALL_OK && r->status == 200);
            if (strcmp(path, "/chunked") == 0) {
                CHECK_STR(r->body, "hello world");
                CHECK(strstr(r->headers, "X-Long-Header-Name-For-Splitting: a-rather-long-value\n") != NULL);
                CHECK(strstr(r->trailers, "abc123") != NULL);
            } else if (strcmp(path, "/ok") == 0) {
                CHECK_STR(r->body, "hello");
                CHECK_STR(r->headers, "Content-Length: 5\nX-Test: yes\n");
                CHECK(r->trailers[0] == '\0');
            } else {
                CHECK(r->body_len == BIG_BODY && strncmp(r->body, "abcdefghij", 10) == 0);
                CHECK(strstr(r->headers, "X-Test") == NULL && strstr(r->headers, "X-Long") == NULL);
                CHECK(r->trailers[0] == '\0');
            }
            reused += r->reused;
        }
    }
    CHECK(reused > 0); /* the second round's answers came on connections that had read one before */
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void http10_response_is_not_kept_alive(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/http10");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, 3.0));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "old");
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void chunked_body_is_decoded_and_trailers_delivered(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/chunked"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello world");
    CHECK(rec.body_len == 11);
    CHECK_STR(rec.trailers, "X-Checksum: abc123\n");
    CHECK(strstr(rec.headers, "Trailer: X-Checksum\n") != NULL);
    CHECK(strstr(rec.headers, "abc123") == NULL);
    srv_stop(&srv);
}

static void response_dripped_byte_by_byte_is_reassembled(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/drip-chunked"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello world");
    CHECK(strstr(rec.headers, "X-Long-Header-Name-For-Splitting: a-rather-long-value\n") != NULL);
    CHECK(strstr(rec.headers, "Transfer-Encoding: chunked\n") != NULL);
    CHECK_STR(rec.trailers, "X-Checksum: abc123\n");
    srv_stop(&srv);
}

static void close_delimited_body_completes_at_eof(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/eof"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "until the end");
    srv_stop(&srv);
}

static void interim_100_continue_is_skipped(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/continue"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK(rec.status == 200);
    CHECK_STR(rec.body, "ok");
    CHECK(strstr(rec.headers, "X-Interim") == NULL);
    srv_stop(&srv);
}

static void interim_responses_end_at_their_headers_whatever_they_announce(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/interim-framed"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK(rec.status == 200);
    CHECK_STR(rec.body, "ok");
    CHECK(strstr(rec.headers, "Link") == NULL);
    srv_stop(&srv);
}

static void unasked_protocol_switch_fails_at_once(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/switch"), &rec);
    CHECK(rec.outcome == AGW_CALL_BAD_RESPONSE);
    CHECK(rec.ms < 1000); /* not the 2000 ms call timeout */
    CHECK(strstr(rec.detail, "101") != NULL);
    srv_stop(&srv);
}

static void head_response_has_no_body_and_keeps_alive(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    /* the upstream answers "Content-Length: 5" and, as HEAD requires, no body bytes */
    agw_call_req_t head = {.method = "HEAD", .path = "/ok", .path_len = 3, .timeout_ms = 2000};
    agw_call_start(pool, &head, on_done, &a);
    CHECK(wait_for(&a.done, 1, 3.0));
    CHECK(a.outcome == AGW_CALL_OK && a.status == 200 && a.body_len == 0);
    CHECK(strstr(a.headers, "Content-Length: 5\n") != NULL);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &b);
    CHECK(wait_for(&b.done, 1, 3.0));
    CHECK(b.outcome == AGW_CALL_OK && b.reused == 1);
    CHECK_STR(b.body, "hello");
    CHECK(srv.accepted == 1);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void max_connections_then_queue_then_overload(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t r[4] = {{0}};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 2;
    conf.max_pending = 1;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/slow");
    for (int i = 0; i < 4; i++)
        CHECK(agw_call_start(pool, &req, on_done, &r[i]) != NULL);
    CHECK(r[3].done == 0); /* never from inside agw_call_start */
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 2 && st.pending == 1);
    CHECK(wait_for(&r[3].done, 1, 1.0));
    CHECK(r[3].outcome == AGW_CALL_OVERLOAD);
    CHECK(r[0].done == 0);
    CHECK(wait_for(&r[2].done, 1, 3.0));
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].done == 1 && r[i].outcome == AGW_CALL_OK);
        CHECK_STR(r[i].body, "slow");
    }
    CHECK(r[2].reused == 1);
    CHECK(r[2].ms >= 250); /* waited for a connection, then its own slow answer */
    CHECK(srv.accepted == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* The bulkhead: a call that gets no connection within its timeout fails as overload (not as a
 * slow upstream), at its own timeout. */
static void queue_wait_counts_toward_timeout(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 1;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t hang = get("/hang");
    agw_call_req_t quick = get("/ok");
    quick.timeout_ms = 100;
    agw_call_start(pool, &hang, on_done, &a);
    agw_call_start(pool, &quick, on_done, &b);
    CHECK(wait_for(&b.done, 1, 2.0));
    CHECK(b.outcome == AGW_CALL_OVERLOAD);
    CHECK(b.ms >= 95 && b.ms < 500);
    CHECK(strstr(b.detail, "no free connection within 100 ms") != NULL);
    CHECK(a.done == 0);
    CHECK(stats(pool).pending == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

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
    CHECK(wait_for(&rec.done, 1, 2.0));
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
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, 2.0));
    CHECK(rec.outcome == AGW_CALL_CONNECT_TIMEOUT);
    CHECK(rec.ms >= 95 && rec.ms < 1000);
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
    CHECK(wait_for(&rec.done, 1, 3.0));
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
    CHECK(wait_for(&rec.done, 1, 3.0));
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
    CHECK(rec.ms >= 145 && rec.ms < 1000);
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
    CHECK(wait_for(&rec.done, 1, 3.0));
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
    CHECK(wait_for(&rec.done, 1, 3.0));
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
    CHECK(wait_for(&rec.done, 1, 1.0));
    CHECK(rec.outcome == AGW_CALL_TIMEOUT);
    CHECK(srv.accepted == 0);
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
    CHECK(wait_for(&srv.requests, 1, 2.0));
    agw_call_cancel(call);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 0 && st.cancelled == 1);
    CHECK(wait_for(&srv.eofs, 1, 2.0)); /* the upstream sees the connection go */
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
    CHECK(wait_for(&c.done, 1, 3.0));
    CHECK(a.outcome == AGW_CALL_OK && c.outcome == AGW_CALL_OK && c.reused == 1);
    CHECK(b.done == 0);
    CHECK(srv.requests == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void crlf_nul_in_path_or_header_rejected_before_sending(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t r[6] = {{0}};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_header_t bad_value = {"X-A", 3, "a\r\nInjected: 1", 14};
    agw_header_t nul_value = {"X-A", 3, "a\0b", 3};
    agw_header_t bad_name = {"X A", 3, "v", 1};
    agw_header_t empty_name = {"", 0, "v", 1};
    agw_call_req_t reqs[6] = {get("/a\r\nX: y"), get("/ok"), get("/ok"), get("/ok"), get("/ok"),
                              get("/a b")};
    reqs[1].headers = &bad_value;
    reqs[2].headers = &nul_value;
    reqs[3].headers = &bad_name;
    reqs[4].headers = &empty_name;
    for (int i = 1; i < 5; i++)
        reqs[i].num_headers = 1;
    agw_call_req_t nul_path = get("/a");
    nul_path.path = "/a\0b";
    nul_path.path_len = 4;
    for (int i = 0; i < 6; i++)
        agw_call_start(pool, &reqs[i], on_done, &r[i]);
    for (int i = 0; i < 6; i++) {
        CHECK(wait_for(&r[i].done, 1, 1.0));
        CHECK(r[i].outcome == AGW_CALL_BAD_REQUEST);
    }
    rec_t n = {0};
    agw_call_start(pool, &nul_path, on_done, &n);
    CHECK(wait_for(&n.done, 1, 1.0));
    CHECK(n.outcome == AGW_CALL_BAD_REQUEST);
    CHECK(srv.accepted == 0);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* The upstream closes a keep-alive connection right after answering; the client has not read the
 * EOF yet when the next call picks the connection (the race every keep-alive client meets). The
 * first call's callback starts the next one, as a dependent chain does, so the pick comes before
 * the loop can poll again, whether reads are batched or not. */
typedef struct reuse_chain {
    agw_pool_t *pool;
    const char *method;
    rec_t first, *second;
    unsigned idle_at_pick;
} reuse_chain_t;

static void on_first_then_reuse(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    reuse_chain_t *t = data;
    on_done(call, r, &t->first);
    t->idle_at_pick = stats(t->pool).idle;
    agw_call_req_t next = get("/ok");
    next.method = t->method;
    CHECK(agw_call_start(t->pool, &next, on_done, t->second) != NULL);
}

static void reused_connection_closed_by_upstream(const char *method, const char *first_path, rec_t *second,
                                                 agw_pool_stats_t *st, srv_t *srv)
{
    agw_upstream_conf_t conf;
    srv_start(srv);
    conf_init(&conf, srv->port);
    memset(second, 0, sizeof(*second));
    reuse_chain_t t = {.method = method, .second = second};
    t.pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get(first_path);
    agw_call_start(t.pool, &req, on_first_then_reuse, &t);
    CHECK(wait_for(&second->done, 1, 3.0));
    CHECK(t.first.outcome == AGW_CALL_OK);
    CHECK(t.idle_at_pick == 1); /* EOF not seen yet */
    run_for(0.02);
    *st = stats(t.pool);
    agw_pool_destroy(t.pool);
    srv_stop(srv);
}

/* The same race when the next call comes from a later loop iteration, before the loop has read
 * the EOF (the loop polled, saw only the answer): the peek finds it too. Without a ring only:
 * with one, the answer is parsed just before the poll that sees the EOF, so no later iteration
 * finds the EOF unread. */
static void later_call_finds_the_closed_connection_by_a_peek(void)
{
    if (ring_batch.ring) {
        fprintf(stderr, "skip (ring mode: no iteration sees the answer without the EOF)\n");
        return;
    }
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t first = {0}, second = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/close-after");
    agw_call_start(pool, &req, on_done, &first);
    CHECK(wait_for(&first.done, 1, 3.0));
    CHECK(first.outcome == AGW_CALL_OK);
    CHECK(stats(pool).idle == 1); /* EOF not seen yet */
    agw_call_req_t next = get("/ok");
    agw_call_start(pool, &next, on_done, &second);
    CHECK(wait_for(&second.done, 1, 3.0));
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 0);
    CHECK_STR(second.body, "hello");
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 0 && st.reused == 0 && srv.accepted == 2 && srv.requests == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

/* The upstream closed the connection before the next call picks it: the peek on taking it from
 * the idle list finds the EOF, and the call opens a new connection at once, whatever its method
 * (nothing was sent; no retry is spent). */
static void closed_connection_found_by_a_peek_takes_a_new_one(const char *method)
{
    srv_t srv;
    rec_t rec;
    agw_pool_stats_t st;
    reused_connection_closed_by_upstream(method, "/close-after", &rec, &st, &srv);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello");
    CHECK(rec.reused == 0);
    CHECK(st.retried == 0 && st.reused == 0);
    CHECK(srv.accepted == 2 && srv.requests == 2);
}

static void get_closed_connection_found_by_a_peek_takes_a_new_one(void)
{
    closed_connection_found_by_a_peek_takes_a_new_one("GET");
}

static void post_closed_connection_found_by_a_peek_takes_a_new_one(void)
{
    closed_connection_found_by_a_peek_takes_a_new_one("POST");
}

/* The upstream closes the kept-alive connection only when the next request arrives (after the
 * peek): an idempotent call is retried once on a new connection. */
static void get_retried_once_when_reused_connection_was_closed(void)
{
    srv_t srv;
    rec_t rec;
    agw_pool_stats_t st;
    reused_connection_closed_by_upstream("GET", "/drop-next", &rec, &st, &srv);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello");
    CHECK(rec.reused == 0);
    CHECK(st.retried == 1 && st.reused == 1);
    CHECK(srv.accepted == 2);
}

static void post_not_retried_when_reused_connection_was_closed(void)
{
    srv_t srv;
    rec_t rec;
    agw_pool_stats_t st;
    reused_connection_closed_by_upstream("POST", "/drop-next", &rec, &st, &srv);
    CHECK(rec.outcome == AGW_CALL_RESET);
    CHECK(strstr(rec.detail, "before any response byte") != NULL);
    CHECK(st.retried == 0 && st.open == 0);
    CHECK(srv.accepted == 1);
}

/* A POST of 8 MiB, more than the socket buffers hold, to an upstream that answers 413 from the
 * headers and then stops reading or closes: the answer is the result, at once, and the
 * connection (whose request was cut short) is not kept. */
static void answer_before_the_request_is_sent_is_the_result(const char *path)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    size_t n = 8 << 20;
    char *body = malloc(n);
    memset(body, 'b', n);
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    /* the timeout only tells an answer read at once from one read after the timeout: long, so that
     * copying and faulting in the 8 MiB on a machine with a load average of 15 stays far below it
     * (it took more than the 2 s this had, plain and ring alike, the outcome then a timeout) */
    agw_call_req_t req = {.method = "POST", .path = path, .path_len = strlen(path), .body = body,
                          .body_len = n, .timeout_ms = 20000};
    memset(&rec, 0, sizeof(rec));
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, 25.0));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK(rec.status == 413);
    CHECK_STR(rec.body, "too big!");
    /* before the call's timeout, which is when a client that reads only after sending would end
     * (an outcome of timeout, checked above too). Not a fixed 1000 ms: the call first copies the
     * 8 MiB body into a fresh buffer, which beside two busy loops took 270 ms of page faults (the
     * answer came 300-820 ms after the start, plain and ring alike), and more than 2 s at a load
     * average of 15 */
    CHECK(rec.ms < req.timeout_ms);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
    free(body);
}

static void answer_before_a_large_body_is_read_ends_the_call(void)
{
    answer_before_the_request_is_sent_is_the_result("/early-hold");
}

static void answer_then_close_before_a_large_body_is_read_ends_the_call(void)
{
    answer_before_the_request_is_sent_is_the_result("/early-close");
}

static void idle_connection_closed_by_upstream_is_removed(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/close-after");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, 3.0));
    run_for(0.05);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 0 && st.idle == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void idle_timeout_closes_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.idle_timeout_ms = 50;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, 3.0));
    CHECK(stats(pool).idle == 1);
    CHECK(wait_for(&srv.eofs, 1, 2.0));
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void announced_body_over_limit_fails_at_headers(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_body_bytes = 1000;
    call_once(&srv, &conf, get("/huge"), &rec);
    CHECK(rec.outcome == AGW_CALL_TOO_LARGE);
    CHECK(rec.status == 200);
    CHECK(strstr(rec.detail, "100000000") != NULL);
    srv_stop(&srv);
}

static void announced_chunk_over_limit_fails_at_its_size_line(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_body_bytes = 1000;
    call_once(&srv, &conf, get("/huge-chunk"), &rec);
    CHECK(rec.outcome == AGW_CALL_TOO_LARGE);
    CHECK(rec.status == 200);
    CHECK(rec.ms < 1000); /* not the 2000 ms call timeout */
    srv_stop(&srv);
}

static void streamed_body_over_limit_fails_promptly(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_body_bytes = 64 * 1024;
    /* the upstream never stops sending: only failing at the limit ends the call */
    call_once(&srv, &conf, get("/stream"), &rec);
    CHECK(rec.outcome == AGW_CALL_TOO_LARGE);
    CHECK(rec.ms < 1000);
    CHECK(wait_for(&srv.eofs, 1, 2.0));
    srv_stop(&srv);
}

static void short_body_then_eof_is_truncated(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/short"), &rec);
    CHECK(rec.outcome == AGW_CALL_TRUNCATED);
    CHECK(strstr(rec.detail, "10 of 100 body bytes") != NULL);
    srv_stop(&srv);
}

static void reset_mid_body_is_reset(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/reset"), &rec);
    CHECK(rec.outcome == AGW_CALL_RESET);
    CHECK(strstr(rec.detail, "reset") != NULL);
    srv_stop(&srv);
}

static void garbage_is_bad_response(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t rec;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    call_once(&srv, &conf, get("/garbage"), &rec);
    CHECK(rec.outcome == AGW_CALL_BAD_RESPONSE);
    CHECK(rec.status == 0);
    run_for(0.02);
    CHECK(srv.eofs == 1);
    srv_stop(&srv);
}

/* A callback that starts the next call on the same pool, then (on the second) destroys it. */
typedef struct chain {
    agw_pool_t *pool;
    rec_t recs[2];
    int step;
    int done;
} chain_t;

static void on_chain(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    chain_t *ch = data;
    on_done(call, r, &ch->recs[ch->step]);
    if (ch->step++ == 0) {
        agw_call_req_t req = get("/ok");
        CHECK(agw_call_start(ch->pool, &req, on_chain, ch) != NULL);
        agw_call_req_t hang = get("/hang");
        agw_call_start(ch->pool, &hang, on_chain, ch); /* cancelled by the destroy below */
    } else {
        agw_pool_destroy(ch->pool);
        ch->done = 1;
    }
}

static void callback_may_start_next_call_on_same_connection_and_destroy_pool(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    chain_t ch = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port); /* max_connections 4: reuse is a choice, not forced */
    ch.pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(ch.pool, &req, on_chain, &ch);
    CHECK(wait_for(&ch.done, 1, 3.0));
    run_for(0.05);
    CHECK(ch.step == 2);
    CHECK(ch.recs[0].outcome == AGW_CALL_OK && ch.recs[1].outcome == AGW_CALL_OK);
    CHECK(ch.recs[1].reused == 1);
    CHECK(srv.accepted == 2); /* the kept-alive one, and a new one for /hang */
    CHECK(wait_for(&srv.eofs, 2, 2.0)); /* both closed by the destroy */
    srv_stop(&srv);
}

static void bytes_after_a_response_that_filled_the_read_buffer_are_no_answer(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    then_t t = {.next = "/ok"};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    t.pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/exact-then-stale");
    agw_call_start(t.pool, &req, on_then, &t);
    CHECK(wait_for(&t.second.done, 1, 3.0));
    CHECK(t.first.outcome == AGW_CALL_OK &&
          t.first.body_len == CLIENT_READ - strlen("HTTP/1.1 200 OK\r\nContent-Length: 16342\r\n\r\n"));
    CHECK(t.second.outcome == AGW_CALL_OK);
    CHECK_STR(t.second.body, "hello"); /* not "stale", the bytes that were already there */
    CHECK(t.second.reused == 0);
    agw_pool_destroy(t.pool);
    srv_stop(&srv);
}

/* Starts b's call from a watcher that runs before the pool's own in the same loop iteration. */
typedef struct early_start {
    agw_pool_t *pool;
    rec_t *rec;
    ev_timer timer;
} early_start_t;

static void on_early_start(struct ev_loop *l, ev_timer *w, int revents)
{
    early_start_t *e = w->data;
    (void)l, (void)revents;
    agw_call_req_t req = get("/ok");
    agw_call_start(e->pool, &req, on_done, e->rec);
}

static void idle_connection_with_unread_bytes_is_not_reused(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t a = {0}, b = {0};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a);
    CHECK(wait_for(&a.done, 1, 3.0));
    CHECK(stats(pool).idle == 1);
    /* bytes no request asked for reach the idle connection; the next iteration's poll sees them,
     * and a watcher of higher priority starts a call before the pool's watcher has run */
    static const char stale[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale";
    CHECK(send(srv.conns->fd, stale, sizeof(stale) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(stale) - 1);
    usleep(20000);
    early_start_t e = {.pool = pool, .rec = &b};
    ev_timer_init(&e.timer, on_early_start, 0., 0.);
    ev_set_priority(&e.timer, EV_MAXPRI);
    e.timer.data = &e;
    ev_timer_start(loop, &e.timer);
    CHECK(wait_for(&b.done, 1, 3.0));
    CHECK(b.outcome == AGW_CALL_OK);
    CHECK_STR(b.body, "hello");
    CHECK(b.reused == 0);
    CHECK(srv.accepted == 2);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

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
    CHECK(wait_for(&a.done, 1, 3.0));
    CHECK(a.outcome == AGW_CALL_OK && srv.requests == 1);
    agw_call_start(pool, &req, on_done, &b);
    agw_call_start(pool, &req, on_done, &c); /* the only idle connection is taken: a new one */
    CHECK(wait_for(&c.done, 1, 3.0));
    CHECK(c.outcome == AGW_CALL_OK && c.reused == 0);
    run_for(0.05);
    CHECK(b.done == 0 && srv.requests == 2); /* b's request is still queued */
    CHECK(agw_batch_flush(&batch) == 1);
    CHECK(agw_batch_flush(&batch) == 0);
    CHECK(wait_for(&b.done, 1, 3.0));
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
    CHECK(wait_for(&first.done, 1, 3.0));
    CHECK(first.outcome == AGW_CALL_OK && stats(pool).idle == 1); /* EOF not seen yet */
    agw_call_req_t next = get("/ok");
    next.method = method;
    agw_call_start(pool, &next, on_done, &second);
    CHECK(wait_for(&second.done, 1, 3.0)); /* the loop sees the EOF, then connects anew */
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
    CHECK(wait_for(&b.done, 1, 3.0) && wait_for(&a.done, 1, 3.0));
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

/* A request queued on a kept-alive connection the upstream has since reset: the ring's write
 * fails, and the plain path of the same flush takes over as without a ring (its write fails too,
 * its read finds the connection gone): the GET is retried once on a new connection before the
 * loop polls again. */
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
    struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* the upstream resets the connection */
    CHECK(setsockopt(srv.conns->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
    sconn_close(srv.conns);
    usleep(20000);
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

/* A call cancelled while its request waits on the batch (nothing sent) gives its kept-alive
 * connection back: the next call reuses it, and the upstream saw one connection, no cancelled
 * request. */
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
    CHECK(wait_for(&first.done, 1, 3.0));
    for (int i = 0; i < 100; i++) { /* as a client resetting stream after stream would */
        agw_call_t *c = agw_call_start(pool, &req, on_done, NULL);
        CHECK(stats(pool).idle == 0);
        agw_call_cancel(c);
        CHECK(stats(pool).idle == 1 && stats(pool).open == 1);
    }
    CHECK(agw_batch_flush(&batch) == 0);
    agw_call_start(pool, &req, on_done, &third);
    CHECK(agw_batch_flush(&batch) == 1);
    CHECK(wait_for(&third.done, 1, 3.0));
    CHECK(third.outcome == AGW_CALL_OK && third.reused == 1);
    CHECK(srv.accepted == 1 && srv.requests == 2);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.cancelled == 100 && st.reused == 1);
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
    CHECK(wait_for(&second.done, 1, 3.0));
    CHECK(second.outcome == AGW_CALL_OK && second.reused == 1);
    CHECK(srv.accepted == 1 && srv.requests == 1);
    /* the next call takes a connection still connecting that a cancelled call left */
    rec_t third = {0};
    agw_pool_t *fresh = agw_pool_create(loop, &conf);
    for (int i = 0; i < 100; i++) /* as a client resetting stream after stream would */
        agw_call_cancel(agw_call_start(fresh, &req, on_done, NULL));
    agw_call_start(fresh, &req, on_done, &third);
    CHECK(stats(fresh).open == 1);
    CHECK(wait_for(&third.done, 1, 3.0));
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

/* The callback reuses its own connection for a new call and cancels it, which closes that
 * connection (or, with a batch, where the request has not gone out yet, puts it back on the idle
 * list), before it reads the result: the result must still be intact. */
static void on_reuse_then_cancel(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    agw_pool_t *pool = data;
    (void)call;
    agw_call_req_t req = get("/hang");
    agw_call_t *next = agw_call_start(pool, &req, on_done, NULL);
    CHECK(stats(pool).idle == 0); /* it took the connection that just finished */
    agw_call_cancel(next);
    CHECK(ring_batch.ring ? stats(pool).idle == 1 : stats(pool).open == 0);
    CHECK(r->body_len == 5 && memcmp(r->body, "hello", 5) == 0);
    CHECK(r->num_headers == 2 && r->headers[1].value_len == 3 &&
          memcmp(r->headers[1].value, "yes", 3) == 0);
    done_flag++;
}

static void result_stays_valid_when_callback_closes_its_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    srv_start(&srv);
    conf_init(&conf, srv.port);
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    done_flag = 0;
    agw_call_start(pool, &req, on_reuse_then_cancel, pool);
    CHECK(wait_for(&done_flag, 1, 3.0));
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

static void destroy_cancels_everything_without_callbacks(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    rec_t r[4] = {{0}};
    srv_start(&srv);
    conf_init(&conf, srv.port);
    conf.max_connections = 2;
    conf.max_pending = 1;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t hang = get("/hang");
    for (int i = 0; i < 3; i++) /* 2 busy, 1 queued */
        agw_call_start(pool, &hang, on_done, &r[i]);
    CHECK(wait_for(&srv.requests, 2, 2.0));
    agw_call_start(pool, &hang, on_done, &r[3]); /* overloaded, not yet delivered */
    CHECK(stats(pool).pending == 1);
    agw_pool_destroy(pool);
    CHECK(wait_for(&srv.eofs, 2, 2.0));
    run_for(0.05);
    for (int i = 0; i < 4; i++)
        CHECK(r[i].done == 0);
    srv_stop(&srv);
}

static void wake(struct ev_loop *l, ev_timer *w, int revents)
{
    (void)l, (void)w, (void)revents;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    loop = ev_default_loop(0);
    ring_mode_from_args(argc, argv);
    ev_timer guard; /* wakes the loop so that every bounded wait notices its deadline */
    ev_timer_init(&guard, wake, 0.01, 0.01);
    ev_timer_start(loop, &guard);

    RUN(outcome_names_are_stable);
    RUN(header_values_with_control_characters_are_never_sent);
    RUN(content_length_response_gives_status_headers_body);
    RUN(request_has_method_base_path_host_headers_and_body);
    RUN(keep_alive_reuses_one_connection);
    RUN(answers_at_once_on_many_connections_each_get_their_own);
    RUN(http10_response_is_not_kept_alive);
    RUN(chunked_body_is_decoded_and_trailers_delivered);
    RUN(response_dripped_byte_by_byte_is_reassembled);
    RUN(close_delimited_body_completes_at_eof);
    RUN(interim_100_continue_is_skipped);
    RUN(interim_responses_end_at_their_headers_whatever_they_announce);
    RUN(unasked_protocol_switch_fails_at_once);
    RUN(head_response_has_no_body_and_keeps_alive);
    RUN(max_connections_then_queue_then_overload);
    RUN(queue_wait_counts_toward_timeout);
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
    RUN(crlf_nul_in_path_or_header_rejected_before_sending);
    RUN(get_retried_once_when_reused_connection_was_closed);
    RUN(later_call_finds_the_closed_connection_by_a_peek);
    RUN(get_closed_connection_found_by_a_peek_takes_a_new_one);
    RUN(post_closed_connection_found_by_a_peek_takes_a_new_one);
    RUN(post_not_retried_when_reused_connection_was_closed);
    RUN(answer_before_a_large_body_is_read_ends_the_call);
    RUN(answer_then_close_before_a_large_body_is_read_ends_the_call);
    RUN(idle_connection_closed_by_upstream_is_removed);
    RUN(idle_timeout_closes_connection);
    RUN(announced_body_over_limit_fails_at_headers);
    RUN(announced_chunk_over_limit_fails_at_its_size_line);
    RUN(streamed_body_over_limit_fails_promptly);
    RUN(short_body_then_eof_is_truncated);
    RUN(reset_mid_body_is_reset);
    RUN(garbage_is_bad_response);
    RUN(callback_may_start_next_call_on_same_connection_and_destroy_pool);
    RUN(result_stays_valid_when_callback_closes_its_connection);
    RUN(cancel_before_the_flush_gives_the_connection_back);
    RUN(cancel_while_connecting_keeps_the_connection);
    RUN(bytes_after_a_response_that_filled_the_read_buffer_are_no_answer);
    RUN(idle_connection_with_unread_bytes_is_not_reused);
    RUN(destroy_cancels_everything_without_callbacks);
    RUN(batched_requests_wait_for_the_flush);
    RUN(batched_get_on_closed_connection_takes_another);
    RUN(batched_post_on_closed_connection_takes_another);
    RUN(cancel_and_destroy_leave_the_batch);
    RUN(ring_answers_parsed_after_a_callback_cancelled_them_are_dropped);
    RUN(ring_write_that_fails_goes_on_through_the_plain_path);

    ev_timer_stop(loop, &guard);
    ev_loop_destroy(loop);
    return CHECK_DONE();
}
