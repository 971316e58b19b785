/* test_http1.c: response framing of the upstream client (upstream/http1.h), without
 * sockets: what tests/fuzz/fuzz_h1_response.c found, kept as cases. */
#include <stdlib.h>

#include "tests/check.h"
#include "upstream/http1.h"

static size_t feed_str(agw_h1_response_t *r, const char *s)
{
    return agw_h1_response_feed(r, s, strlen(s));
}

/* A response read on a connection whose previous response was not handed on (the fuzz harness
 * found a start that kept the previous body: a body limit then counted bytes of another answer). */
static void start_forgets_the_previous_response(void)
{
    agw_h1_response_t r = {0};
    agw_h1_response_start(&r, 0, 16);
    const char *first = "HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 12\r\n\r\n0123456789ab";
    CHECK(feed_str(&r, first) == strlen(first));
    CHECK(r.done && r.body.len == 12);
    agw_h1_response_start(&r, 1, 16);
    CHECK(r.body.len == 0);
    CHECK(r.hstore.len == 0);
    CHECK(r.nhdrs == 0 && !r.done && !r.too_large);
    const char *second = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n";
    CHECK(feed_str(&r, second) == strlen(second));
    CHECK(r.done && r.body.len == 0 && r.nheaders == 1);
    CHECK(agw_h1_response_failed(&r) == AGW_CALL_OK);
    agw_h1_response_free(&r);
}

/* The same bytes read one at a time give the same response as one read. */
static void one_byte_reads_give_the_same_response(void)
{
    const char *msg = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Long: ab\r\n\r\n"
                      "5\r\nhello\r\n0\r\nServer-Timing: db;dur=53\r\n\r\n";
    agw_h1_response_t a = {0}, b = {0};
    agw_h1_response_start(&a, 0, 0);
    agw_h1_response_start(&b, 0, 0);
    CHECK(feed_str(&a, msg) == strlen(msg));
    for (size_t i = 0; i < strlen(msg) && !b.done; i++)
        CHECK(agw_h1_response_feed(&b, msg + i, 1) == 1);
    CHECK(a.done && b.done && a.nheaders == 2 && b.nheaders == 2 && a.nhdrs == 3 && b.nhdrs == 3);
    CHECK(a.body.len == 5 && b.body.len == 5 && memcmp(a.body.base, b.body.base, 5) == 0);
    CHECK(a.hstore.len == b.hstore.len && memcmp(a.hstore.base, b.hstore.base, a.hstore.len) == 0);
    agw_h1_response_free(&a);
    agw_h1_response_free(&b);
}

/* A Content-Length no upstream sends, with no body limit: memory follows the bytes that arrive
 * (the fuzz harness found an abort: the whole length was reserved up front). */
static void a_lying_content_length_reserves_no_more_than_a_mebibyte(void)
{
    agw_h1_response_t r = {0};
    agw_h1_response_start(&r, 0, 0);
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n0123";
    CHECK(feed_str(&r, head) == strlen(head));
    CHECK(!r.done && agw_h1_response_failed(&r) == AGW_CALL_OK);
    CHECK(r.expect_len == 1000000000000ull && r.body.len == 4);
    CHECK(r.body.cap <= 2 * 1024 * 1024 + 1);
    agw_h1_response_free(&r);
    /* within a limit, the whole body is still taken in one buffer */
    agw_h1_response_start(&r, 0, 8 * 1024 * 1024);
    const char *big = "HTTP/1.1 200 OK\r\nContent-Length: 3000000\r\n\r\n";
    CHECK(feed_str(&r, big) == strlen(big));
    char *body = malloc(3000000);
    memset(body, 'x', 3000000);
    CHECK(agw_h1_response_feed(&r, body, 3000000) == 3000000);
    CHECK(r.done && r.body.len == 3000000);
    free(body);
    agw_h1_response_free(&r);
}

int main(void)
{
    RUN(a_lying_content_length_reserves_no_more_than_a_mebibyte);
    RUN(start_forgets_the_previous_response);
    RUN(one_byte_reads_give_the_same_response);
    return CHECK_DONE();
}
