/* test_upstream_tls.c: the upstream client against https:// upstreams: the scripted upstream of
 * upstream_srv.h speaking TLS on the same loop, with throwaway certificates made by the openssl
 * command at start (a test CA, a server certificate it signed for localhost and 127.0.0.1, and a
 * self-signed one no one trusts). Every wait is bounded. */
#include "tests/upstream/upstream_srv.h"
#include "upstream/tls.h"
#include "upstream/upstream_internal.h" /* a queued connection's fd and mark */

#include <stdio.h>
#include <sys/stat.h>

static char dir[64];            /* temporary folder of the certificates */
static char ca_pem[128];        /* the test CA the client trusts */
static SSL_CTX *trusted_ctx;    /* server certificate signed by the test CA */
static SSL_CTX *untrusted_ctx;  /* self-signed server certificate */

/* ---- certificates and contexts -------------------------------------------------------- */

static void sh(const char *fmt, const char *arg)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), fmt, arg, arg, arg, arg, arg, arg, arg, arg);
    if (system(cmd) != 0) {
        fprintf(stderr, "test setup failed: %s\n", cmd);
        exit(2);
    }
}

static void make_certificates(void)
{
    snprintf(dir, sizeof(dir), "/tmp/agw-tls-test-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        exit(2);
    }
    snprintf(ca_pem, sizeof(ca_pem), "%s/ca.pem", dir);
    /* P-256 keys: quick handshakes, also under ASan */
    sh("cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
       "-subj /CN=aggway-test-ca -keyout ca.key -out ca.pem 2>/dev/null && "
       "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost "
       "-keyout srv.key -out srv.csr 2>/dev/null && "
       "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > srv.ext && "
       "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
       "-extfile srv.ext -out srv.pem 2>/dev/null && "
       "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
       "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 "
       "-keyout self.key -out self.pem 2>/dev/null", dir);
}

static SSL_CTX *server_ctx(const char *cert, const char *key)
{
    char c[128], k[128];
    snprintf(c, sizeof(c), "%s/%s", dir, cert);
    snprintf(k, sizeof(k), "%s/%s", dir, key);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL || SSL_CTX_use_certificate_chain_file(ctx, c) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, k, SSL_FILETYPE_PEM) != 1) {
        fprintf(stderr, "test setup failed: server certificate %s\n", c);
        exit(2);
    }
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

/* conf for an https:// upstream on port, trusting the test CA, expecting server_name. */
static void tls_conf_init(agw_upstream_conf_t *conf, agw_upstream_tls_t *tls, int port,
                          const char *server_name)
{
    conf_init(conf, port);
    conf->url = "https://localhost";
    memset(tls, 0, sizeof(*tls));
    tls->ca_file = ca_pem;
    tls->server_name = server_name;
    tls->verify = 1;
    char err[256] = "";
    CHECK(agw_upstream_tls_init(tls, err, sizeof(err)) == 0);
    conf->tls = tls;
}

/* ---- tests ---------------------------------------------------------------------------- */

static double sequential_new_connections(agw_pool_t *pool, const char *path, int n);
static void expect_tls_failure(srv_t *srv, agw_upstream_conf_t *conf, rec_t *rec, const char *words);

static void https_call_gives_status_headers_body(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec = {0};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK(rec.status == 200);
    CHECK_STR(rec.body, "hello");
    CHECK(strstr(rec.headers, "X-Test: yes\n") != NULL);
    CHECK(strncmp(srv.last_req, "GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n", 35) == 0);
    CHECK(srv.handshakes == 1 && stats(pool).tls_handshakes == 1);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void keep_alive_over_tls_needs_one_handshake(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    for (int i = 0; i < 5; i++) {
        rec_t rec = {0};
        agw_call_start(pool, &req, on_done, &rec);
        CHECK(wait_for(&rec.done, 1, WAIT_S));
        CHECK(rec.outcome == AGW_CALL_OK && rec.reused == (i > 0));
        CHECK_STR(rec.body, "hello");
    }
    agw_pool_stats_t st = stats(pool);
    CHECK(srv.accepted == 1 && srv.handshakes == 1 && srv.requests == 5);
    CHECK(st.tls_handshakes == 1 && st.reused == 4 && st.idle == 1);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

/* Write coalescing over TLS: a request on a kept-alive connection waits for agw_batch_flush, then
 * goes out as an SSL_write like any other. */
static void batched_request_over_tls_waits_for_the_flush(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    agw_batch_t batch = {0};
    rec_t a = {0}, b = {0};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a); /* a new connection: sent after its handshake */
    CHECK(wait_for(&a.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK && srv.requests == 1);
    agw_call_start(pool, &req, on_done, &b);
    run_for(0.05);
    CHECK(b.done == 0 && srv.requests == 1);
    CHECK(agw_batch_flush(&batch) == 1);
    CHECK(wait_for(&b.done, 1, WAIT_S));
    CHECK(b.outcome == AGW_CALL_OK && b.reused == 1);
    CHECK_STR(b.body, "hello");
    CHECK(srv.accepted == 1 && srv.handshakes == 1 && srv.requests == 2);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

/* An early send (agw_batch_send_early) writes the plain connections queued and none of the TLS ones
 * (OpenSSL writes them in the flush), and leaves those to be looked at again: with TLS connections
 * alone it writes nothing; beside plain ones, the upstream closes a TLS one after the early send
 * and before the flush, and its POST takes a new connection instead of going out on the closed one
 * (it failed so when the early send's look stood for the flush's). */
static void early_send_leaves_tls_connections_to_be_looked_at_again(void)
{
    enum { F = AGW_BATCH_EARLY_FIRST };
    srv_t srv, plain_srv;
    agw_upstream_conf_t conf, plain_conf;
    agw_upstream_tls_t tls;
    agw_batch_t batch = {0};
    rec_t first[F] = {0}, second[F] = {0}, plain_first[2 * F] = {0}, plain_second[2 * F] = {0};
    if (!ring_or_skip(&batch))
        return;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    conf.max_connections = 0;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_pool_set_batch(pool, &batch);
    CHECK(keep_alive(pool, &batch, first, F));
    agw_pool_t *plain = kept_alive_pool(&plain_srv, &plain_conf, &batch, plain_first, 2 * F);
    agw_call_req_t req = get("/ok");
    agw_call_req_t post = get("/ok");
    post.method = "POST";
    for (int i = 0; i < F; i++)
        agw_call_start(pool, &post, on_done, &second[i]);
    CHECK(agw_batch_send_early(&batch) == 0 && batch.queued == F); /* TLS alone: nothing written */
    for (int i = 0; i < 2 * F; i++) { /* the next early send waits for twice as many more than the F left */
        agw_call_start(plain, &req, on_done, &plain_second[i]);
        if (i == F - 1)
            CHECK(agw_batch_send_early(&batch) == 0 && batch.queued == 2 * F);
    }
    CHECK(agw_batch_send_early(&batch) == 2 * F && batch.queued == F); /* the plain ones */
    int marked = 0;
    for (agw_conn_t *c = batch.head; c != NULL; c = c->batch_next)
        marked += c->ssl != NULL && c->unpeeked;
    CHECK(marked == F);
    int fd = batch.head ? batch.head->fd : -1;
    sconn_t *sc = server_side(&srv, fd);
    CHECK(sc != NULL);
    if (sc)
        sconn_close(sc);
    CHECK(wait_readable(fd, WAIT_S)); /* the close is there; the loop has not polled */
    int ok = 0;
    for (int i = 0; i < 2 * F; i++) {
        if (i < F) {
            CHECK(wait_flushing(&batch, &second[i].done, 1, WAIT_S));
            ok += second[i].outcome == AGW_CALL_OK;
        }
        CHECK(wait_flushing(&batch, &plain_second[i].done, 1, WAIT_S));
        ok += plain_second[i].outcome == AGW_CALL_OK;
    }
    CHECK(ok == 3 * F && stats(pool).retried == 0 && srv.accepted == F + 1 && plain_srv.accepted == 2 * F);
    agw_pool_destroy(pool);
    agw_pool_destroy(plain);
    agw_upstream_tls_free(&tls);
    agw_batch_ring_free(&batch);
    srv_stop(&srv);
    srv_stop(&plain_srv);
}

static void tls_record_without_data_keeps_idle_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t a = {0}, b = {0};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/key-update");
    agw_call_start(pool, &req, on_done, &a);
    CHECK(wait_for(&a.done, 1, WAIT_S));
    run_for(0.05); /* the KeyUpdate arrives on the idle connection */
    CHECK(stats(pool).idle == 1);
    agw_call_start(pool, &req, on_done, &b);
    CHECK(wait_for(&b.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK && b.outcome == AGW_CALL_OK && b.reused == 1);
    CHECK(srv.accepted == 1 && stats(pool).retried == 0);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

/* Part of a record with data on an idle connection (an answer to no request, whose rest could come
 * with the next call's answer): OpenSSL holds it and asks for more, which is no record without
 * data, so the connection is closed, not kept for the next call. */
static void part_of_a_tls_data_record_closes_the_idle_connection(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t a = {0};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/then-half-record");
    agw_call_start(pool, &req, on_done, &a);
    CHECK(wait_for(&a.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK);
    CHECK_STR(a.body, "hello");
    for (int i = 0; i < 100 && stats(pool).open > 0; i++)
        run_for(0.05); /* the half record arrives on the idle connection */
    CHECK(stats(pool).open == 0 && stats(pool).idle == 0);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void tls_record_after_a_response_is_no_answer_to_the_next_call(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    then_t t = {.next = "/ok"};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    t.pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/then-stale");
    agw_call_start(t.pool, &req, on_then, &t);
    CHECK(wait_for(&t.second.done, 1, WAIT_S));
    CHECK(t.first.outcome == AGW_CALL_OK);
    CHECK_STR(t.first.body, "first");
    CHECK(t.second.outcome == AGW_CALL_OK);
    CHECK_STR(t.second.body, "hello"); /* not "stale", the record that followed the first answer */
    CHECK(t.second.reused == 0);
    agw_pool_destroy(t.pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

/* Runs n calls of path on pool one after the other, each on a new connection (the upstream
 * closes after answering). Returns the mean time per call, ms. */
static double sequential_new_connections(agw_pool_t *pool, const char *path, int n)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        rec_t rec = {0};
        agw_call_req_t req = get(path);
        agw_call_start(pool, &req, on_done, &rec);
        CHECK(wait_for(&rec.done, 1, WAIT_S));
        CHECK(rec.outcome == AGW_CALL_OK);
        total += rec.ms;
        /* let the client see the upstream's close before the next call */
        for (double end = ev_time() + WAIT_S; stats(pool).open > 0 && ev_time() < end;)
            ev_run(loop, EVRUN_ONCE);
    }
    return total / n;
}

static void reconnect_resumes_the_tls_session(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    enum { N = 20 };
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    double resumed_ms = sequential_new_connections(pool, "/close-after", N);
    agw_pool_stats_t st = stats(pool);
    CHECK(srv.accepted == N && srv.handshakes == N);
    CHECK(st.tls_handshakes == N && st.tls_resumed == N - 1); /* all but the first */
    CHECK(srv.resumed == N - 1);
    agw_pool_destroy(pool);
    /* the same calls with a new pool each time: no session to offer, a full handshake each */
    double full_ms = 0;
    for (int i = 0; i < N; i++) {
        agw_pool_t *fresh = agw_pool_create(loop, &conf);
        full_ms += sequential_new_connections(fresh, "/close-after", 1);
        CHECK(stats(fresh).tls_resumed == 0);
        agw_pool_destroy(fresh);
    }
    full_ms /= N;
    CHECK(srv.resumed == N - 1);
    fprintf(stderr, "  new connection + call: %.2f ms with a full handshake, %.2f ms resumed (mean of %d)\n",
            full_ms, resumed_ms, N);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void tls12_upstream_keeps_alive_and_resumes(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    SSL_CTX *ctx = server_ctx("srv.pem", "srv.key");
    SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
    srv_start_tls(&srv, ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    sequential_new_connections(pool, "/close-after", 3);
    rec_t a = {0}, b = {0};
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &a);
    CHECK(wait_for(&a.done, 1, WAIT_S));
    agw_call_start(pool, &req, on_done, &b);
    CHECK(wait_for(&b.done, 1, WAIT_S));
    CHECK(a.outcome == AGW_CALL_OK && b.outcome == AGW_CALL_OK && b.reused == 1);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.tls_handshakes == 4 && st.tls_resumed == 3 && srv.resumed == 3);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
    SSL_CTX_free(ctx);
}

static void upstream_below_tls12_fails_the_handshake(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    SSL_CTX *ctx = server_ctx("srv.pem", "srv.key");
    SSL_CTX_set_security_level(ctx, 0); /* let the server offer TLS 1.1 at all */
    SSL_CTX_set_min_proto_version(ctx, TLS1_1_VERSION);
    SSL_CTX_set_max_proto_version(ctx, TLS1_1_VERSION);
    srv_start_tls(&srv, ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    expect_tls_failure(&srv, &conf, &rec, "protocol version"); /* the client offers 1.2 and up only */
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
    SSL_CTX_free(ctx);
}

static void chunked_body_over_tls_is_decoded(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    call_once(&srv, &conf, get("/chunked"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello world");
    CHECK_STR(rec.trailers, "X-Checksum: abc123\n");
    /* one TLS record per byte */
    call_once(&srv, &conf, get("/drip-chunked"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello world");
    CHECK(strstr(rec.headers, "X-Long-Header-Name-For-Splitting: a-rather-long-value\n") != NULL);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static int big_ok;

static void on_big(agw_call_t *call, const agw_call_result_t *r, void *data)
{
    on_done(call, r, data);
    int ok = r->outcome == AGW_CALL_OK && r->body_len == BIG_BODY;
    for (size_t i = 0; ok && i < r->body_len; i++)
        ok = r->body[i] == (char)('a' + i % 26);
    big_ok = ok;
}

static void big_body_across_many_tls_records_arrives_whole(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    for (int i = 0; i < 2; i++) { /* the second on the kept-alive connection */
        rec_t rec = {0};
        agw_call_req_t req = get("/big");
        big_ok = 0;
        agw_call_start(pool, &req, on_big, &rec);
        CHECK(wait_for(&rec.done, 1, WAIT_S));
        CHECK(big_ok);
    }
    CHECK(srv.accepted == 1);
    /* and a large request body, written across records */
    static char body[200000];
    memset(body, 'q', sizeof(body));
    agw_call_req_t post = {.method = "POST", .path = "/ok", .path_len = 3, .body = body,
                           .body_len = sizeof(body), .timeout_ms = ANSWER_MS};
    rec_t rec = {0};
    agw_call_start(pool, &post, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_OK && srv.requests == 3);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void close_delimited_body_needs_close_notify(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    call_once(&srv, &conf, get("/eof"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "until the end");
    /* RFC 9112 §9.8: a TCP close without close_notify may be a truncation */
    srv.no_close_notify = 1;
    call_once(&srv, &conf, get("/eof"), &rec);
    CHECK(rec.outcome == AGW_CALL_TRUNCATED);
    CHECK(strstr(rec.detail, "close_notify") != NULL);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void get_retried_once_when_reused_tls_connection_was_closed(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t first = {0}, second = {0};
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_start(pool, &req, on_done, &first);
    CHECK(wait_for(&first.done, 1, WAIT_S));
    CHECK(stats(pool).idle == 1);
    /* the upstream will close the idle connection (close_notify, FIN) as the next request comes:
     * after the client's peek, so the client does not see it before sending */
    srv.conns->drop_next = 1;
    agw_call_req_t next = get("/ok");
    agw_call_start(pool, &next, on_done, &second);
    CHECK(wait_for(&second.done, 1, WAIT_S));
    CHECK(second.outcome == AGW_CALL_OK);
    CHECK_STR(second.body, "hello");
    agw_pool_stats_t st = stats(pool);
    CHECK(st.retried == 1 && srv.accepted == 2);
    CHECK(st.tls_resumed == 1); /* the retry's connection resumed the first one's session */
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void truncated_reset_and_too_large_fail_over_tls(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    call_once(&srv, &conf, get("/short"), &rec);
    CHECK(rec.outcome == AGW_CALL_TRUNCATED);
    CHECK(strstr(rec.detail, "10 of 100 body bytes") != NULL);
    call_once(&srv, &conf, get("/reset"), &rec);
    CHECK(rec.outcome == AGW_CALL_RESET);
    call_once(&srv, &conf, get("/garbage"), &rec);
    CHECK(rec.outcome == AGW_CALL_BAD_RESPONSE);
    conf.max_body_bytes = 64 * 1024;
    call_once(&srv, &conf, get("/stream"), &rec);
    CHECK(rec.outcome == AGW_CALL_TOO_LARGE);
    CHECK(rec.ms < 2000 + loop_gap_ms()); /* at the limit: not at the call's timeout */
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

/* A call to srv that must fail in the handshake; returns its record. */
static void expect_tls_failure(srv_t *srv, agw_upstream_conf_t *conf, rec_t *rec, const char *words)
{
    agw_pool_t *pool = agw_pool_create(loop, conf);
    agw_call_req_t req = get("/ok");
    memset(rec, 0, sizeof(*rec));
    loop_gap_reset();
    agw_call_start(pool, &req, on_done, rec);
    CHECK(wait_for(&rec->done, 1, WAIT_S));
    CHECK(rec->outcome == AGW_CALL_TLS);
    CHECK(rec->status == 0);
    CHECK(strstr(rec->detail, "TLS handshake with upstream test failed: ") == rec->detail);
    if (strstr(rec->detail, words) == NULL)
        fprintf(stderr, "  detail \"%s\" lacks \"%s\"\n", rec->detail, words);
    CHECK(strstr(rec->detail, words) != NULL);
    CHECK(rec->ms < 2000 + loop_gap_ms()); /* at once: not at the call's timeout */
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 0 && st.tls_handshakes == 0);
    CHECK(srv->requests == 0); /* nothing was sent */
    agw_pool_destroy(pool);
}

static void untrusted_certificate_fails_the_call(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, untrusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    expect_tls_failure(&srv, &conf, &rec, "certificate verify failed: self-signed certificate");
    CHECK(wait_for(&srv.tls_failures, 1, WAIT_S)); /* the upstream saw the client refuse it */
    agw_upstream_tls_free(&tls);
    /* the system trust store does not know it either */
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_upstream_tls_free(&tls);
    tls.ca_file = NULL;
    CHECK(agw_upstream_tls_init(&tls, rec.detail, sizeof(rec.detail)) == 0);
    expect_tls_failure(&srv, &conf, &rec, "certificate verify failed");
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void certificate_for_another_name_fails_the_call(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, trusted_ctx);
    tls_conf_init(&conf, &tls, srv.port, "api.example.com");
    expect_tls_failure(&srv, &conf, &rec, "certificate verify failed: hostname mismatch");
    agw_upstream_tls_free(&tls);
    tls_conf_init(&conf, &tls, srv.port, "127.0.0.2"); /* an IP address checks the IP SANs */
    expect_tls_failure(&srv, &conf, &rec, "certificate verify failed: IP address mismatch");
    agw_upstream_tls_free(&tls);
    tls_conf_init(&conf, &tls, srv.port, "127.0.0.1");
    call_once(&srv, &conf, get("/ok"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void verify_false_accepts_any_certificate(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start_tls(&srv, untrusted_ctx);
    conf_init(&conf, srv.port);
    memset(&tls, 0, sizeof(tls));
    tls.server_name = "whatever.example";
    tls.verify = 0;
    CHECK(agw_upstream_tls_init(&tls, rec.detail, sizeof(rec.detail)) == 0);
    conf.tls = &tls;
    call_once(&srv, &conf, get("/ok"), &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(rec.body, "hello");
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void plaintext_upstream_on_https_url_fails_promptly(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec;
    srv_start(&srv); /* answers the ClientHello with an HTTP 400, as HTTP servers do */
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    expect_tls_failure(&srv, &conf, &rec, "does not seem to speak TLS");
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void handshake_that_hangs_is_a_connect_timeout(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec = {0};
    srv_start_tls(&srv, trusted_ctx);
    srv.stall_tls = 1;
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    conf.connect_timeout_ms = 150;
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    loop_gap_reset();
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_CONNECT_TIMEOUT);
    CHECK(rec.ms >= 145 && rec.ms < 1500 + loop_gap_ms()); /* late by no more than a stall */
    CHECK(strstr(rec.detail, "TLS handshake did not complete") != NULL);
    CHECK(stats(pool).open == 0);
    CHECK(wait_for(&srv.eofs, 1, WAIT_S));
    /* a call timeout shorter than the connect timeout ends it as a timeout, saying where */
    conf.connect_timeout_ms = ANSWER_MS;
    req.timeout_ms = 150;
    memset(&rec, 0, sizeof(rec));
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&rec.done, 1, WAIT_S));
    CHECK(rec.outcome == AGW_CALL_TIMEOUT);
    CHECK(strstr(rec.detail, "in the TLS handshake") != NULL);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void cancel_during_handshake_closes_without_callback(void)
{
    srv_t srv;
    agw_upstream_conf_t conf;
    agw_upstream_tls_t tls;
    rec_t rec = {0};
    srv_start_tls(&srv, trusted_ctx);
    srv.stall_tls = 1;
    tls_conf_init(&conf, &tls, srv.port, "localhost");
    agw_pool_t *pool = agw_pool_create(loop, &conf);
    agw_call_req_t req = get("/ok");
    agw_call_t *call = agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&srv.accepted, 1, WAIT_S));
    run_for(0.02); /* the ClientHello is out: the client waits for the server's answer */
    agw_call_cancel(call);
    agw_pool_stats_t st = stats(pool);
    CHECK(st.open == 0 && st.cancelled == 1);
    CHECK(wait_for(&srv.eofs, 1, WAIT_S));
    run_for(0.05);
    CHECK(rec.done == 0);
    /* and a pool destroyed with a handshake in flight */
    agw_call_start(pool, &req, on_done, &rec);
    CHECK(wait_for(&srv.accepted, 2, WAIT_S));
    run_for(0.02);
    agw_pool_destroy(pool);
    CHECK(wait_for(&srv.eofs, 2, WAIT_S));
    CHECK(rec.done == 0);
    agw_upstream_tls_free(&tls);
    srv_stop(&srv);
}

static void unreadable_or_empty_ca_file_is_an_init_error(void)
{
    agw_upstream_tls_t tls = {.ca_file = "/nonexistent/ca.pem", .server_name = "localhost", .verify = 1};
    char err[256] = "";
    CHECK(agw_upstream_tls_init(&tls, err, sizeof(err)) == -1);
    CHECK(tls.ctx == NULL);
    CHECK(strstr(err, "cannot load CA file /nonexistent/ca.pem") != NULL);
    char empty[128];
    snprintf(empty, sizeof(empty), "%s/srv.ext", dir); /* a file with no certificate in it */
    tls.ca_file = empty;
    CHECK(agw_upstream_tls_init(&tls, err, sizeof(err)) == -1);
    CHECK(strstr(err, "cannot load CA file") != NULL);
}

int main(int argc, char **argv)
{
    make_certificates();
    trusted_ctx = server_ctx("srv.pem", "srv.key");
    untrusted_ctx = server_ctx("self.pem", "self.key");
    test_loop_open(argc, argv);

    RUN(https_call_gives_status_headers_body);
    RUN(keep_alive_over_tls_needs_one_handshake);
    RUN(batched_request_over_tls_waits_for_the_flush);
    RUN(early_send_leaves_tls_connections_to_be_looked_at_again);
    RUN(tls_record_without_data_keeps_idle_connection);
    RUN(part_of_a_tls_data_record_closes_the_idle_connection);
    RUN(tls_record_after_a_response_is_no_answer_to_the_next_call);
    RUN(reconnect_resumes_the_tls_session);
    RUN(tls12_upstream_keeps_alive_and_resumes);
    RUN(upstream_below_tls12_fails_the_handshake);
    RUN(chunked_body_over_tls_is_decoded);
    RUN(big_body_across_many_tls_records_arrives_whole);
    RUN(close_delimited_body_needs_close_notify);
    RUN(get_retried_once_when_reused_tls_connection_was_closed);
    RUN(truncated_reset_and_too_large_fail_over_tls);
    RUN(untrusted_certificate_fails_the_call);
    RUN(certificate_for_another_name_fails_the_call);
    RUN(verify_false_accepts_any_certificate);
    RUN(plaintext_upstream_on_https_url_fails_promptly);
    RUN(handshake_that_hangs_is_a_connect_timeout);
    RUN(cancel_during_handshake_closes_without_callback);
    RUN(unreadable_or_empty_ca_file_is_an_init_error);

    SSL_CTX_free(trusted_ctx);
    SSL_CTX_free(untrusted_ctx);
    sh("rm -rf %s", dir);
    return test_loop_close();
}
