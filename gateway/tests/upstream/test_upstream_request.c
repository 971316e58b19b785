/* test_upstream_request.c: what the upstream client sends: the request line, Host, headers and
 * body it writes, the requests it refuses to write (control characters, CR/LF/NUL, '#', spaces:
 * upstream/http1.h), and the stable names of call outcomes. Against the scripted upstream of
 * upstream_srv.h on the same libev loop; every wait is bounded. */
#include "tests/upstream/upstream_srv.h"
#include "upstream/http1.h"

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
    const char *bs = agw_h1_request_invalid("GET", "/users/..\\admin", 15, NULL, 0); /* upstreams read '\\' as '/' */
    CHECK(bs != NULL && strstr(bs, "'\\'") != NULL);
    CHECK(agw_h1_request_invalid("GET", "/a%23b?c=%20", 12, NULL, 0) == NULL);
    /* a dot segment before the query, in any spelling: the upstream would resolve it away */
    const char *dots[] = {"/users/../orders", "/users/%2e%2e/orders", "/users/.%2E/orders", "/users/..;/orders",
                          "/users/./orders", "/users/%2e", "/..", "/a/..;x=1", "/a/%2E%2e?q=1", "/a/..%3Bx/b",
                          /* ends an upstream that decodes before it resolves dots reads as '/' */
                          "/users/..%2Fadmin/orders", "/users/..%2fadmin", "/users/%2e%2e%5Cadmin", "/a%2F..%2Fb",
                          "/a/x%2F.%2Fy"};
    for (size_t i = 0; i < sizeof(dots) / sizeof(dots[0]); i++) {
        const char *why = agw_h1_request_invalid("GET", dots[i], strlen(dots[i]), NULL, 0);
        if (why == NULL || strstr(why, "dot segment") == NULL)
            fprintf(stderr, "accepted: %s\n", dots[i]);
        CHECK(why != NULL && strstr(why, "dot segment") != NULL);
    }
    /* dots that are not a segment of their own, and dots in the query, pass */
    const char *fine[] = {"/v1.2/x", "/a/.../b", "/a/..b", "/a/b..", "/a/.hidden", "/a?p=../..", "/a?../b", "/a/%2e%2ex", "/",
                          "/a%2Fb", "/a/..x%2Fy", "/a?q=..%2F.."};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        if (agw_h1_request_invalid("GET", fine[i], strlen(fine[i]), NULL, 0) != NULL)
            fprintf(stderr, "refused: %s\n", fine[i]);
        CHECK(agw_h1_request_invalid("GET", fine[i], strlen(fine[i]), NULL, 0) == NULL);
    }
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
                          .num_headers = 3, .body = "{\"a\":1}", .body_len = 7,
                          .timeout_ms = ANSWER_MS};
    call_once(&srv, &conf, req, &rec);
    CHECK(rec.outcome == AGW_CALL_OK);
    CHECK_STR(srv.last_req, "POST /api/items?x=1 HTTP/1.1\r\nHost: product.internal:9001\r\n"
                            "X-Trace: abc\r\nAccept: application/json\r\nContent-Length: 7\r\n"
                            "\r\n{\"a\":1}");

    agw_call_req_t empty_post = {.method = "POST", .path = "/p", .path_len = 2,
                                 .timeout_ms = ANSWER_MS};
    call_once(&srv, &conf, empty_post, &rec);
    CHECK(strstr(srv.last_req, "\r\nContent-Length: 0\r\n\r\n") != NULL);
    call_once(&srv, &conf, get("/g"), &rec);
    CHECK(strstr(srv.last_req, "Content-Length") == NULL);
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
        CHECK(wait_for(&r[i].done, 1, WAIT_S));
        CHECK(r[i].outcome == AGW_CALL_BAD_REQUEST);
    }
    rec_t n = {0};
    agw_call_start(pool, &nul_path, on_done, &n);
    CHECK(wait_for(&n.done, 1, WAIT_S));
    CHECK(n.outcome == AGW_CALL_BAD_REQUEST);
    CHECK(srv.accepted == 0);
    CHECK(stats(pool).open == 0);
    agw_pool_destroy(pool);
    srv_stop(&srv);
}

int main(int argc, char **argv)
{
    test_loop_open(argc, argv);

    RUN(outcome_names_are_stable);
    RUN(header_values_with_control_characters_are_never_sent);
    RUN(request_has_method_base_path_host_headers_and_body);
    RUN(crlf_nul_in_path_or_header_rejected_before_sending);

    return test_loop_close();
}
