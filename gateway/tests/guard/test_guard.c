/* Unit tests of the front guard's pure parts (guard/guard.h): HTTP/1.1 framing read from a raw
 * request head, and the request header caps. */
#include "guard/guard.h"

#include "tests/check.h"

#define FRAMING(s) agw_guard_http1_framing(s, sizeof(s) - 1)

static void content_length_with_transfer_encoding_is_refused(void)
{
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
              "both Content-Length and Transfer-Encoding");
    /* any case, either order, spaces around the value */
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\ntransfer-encoding:chunked\r\nCONTENT-LENGTH:  5 \r\n\r\n"),
              "both Content-Length and Transfer-Encoding");
}

static void a_bare_lf_and_an_http_1_0_transfer_encoding_are_refused(void)
{
    /* RFC 9112 §2.2: a proxy in front that does not take a bare LF for a line's end reads one field
     * (Host: x\nContent-Length: 41) where the gateway would read two */
    const char *lf = "a line of the head ends in LF without CR";
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nHost: x\nContent-Length: 41\r\n\r\n"), lf);
    CHECK_STR(FRAMING("GET / HTTP/1.1\nHost: x\r\n\r\n"), lf);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: x\r\n\n"), lf);
    CHECK_STR(FRAMING("GET / HTTP/1.1\n\n"), lf);
    /* §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing */
    CHECK_STR(FRAMING("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), "Transfer-Encoding in an HTTP/1.0 request");
    CHECK(FRAMING("POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok") == NULL);
}

static void content_lengths_that_disagree_are_refused_identical_ones_accepted(void)
{
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 37\r\n\r\n"),
              "Content-Length fields disagree");
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n"),
              "Content-Length fields disagree");
    CHECK(FRAMING("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: b\r\ncontent-length: 5 \r\n\r\n") == NULL);
}

static void transfer_encoding_twice_is_refused(void)
{
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
              "Transfer-Encoding given more than once");
}

static void plain_requests_and_what_follows_the_head_pass(void)
{
    CHECK(FRAMING("GET / HTTP/1.1\r\nHost: x\r\n\r\n") == NULL);
    CHECK(FRAMING("\r\nPOST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n") == NULL);
    /* only the head counts: a pipelined request's fields are its own */
    CHECK(FRAMING("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
                  "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == NULL);
    /* a name that only starts like one of them is another field */
    CHECK(FRAMING("POST / HTTP/1.1\r\nHost: x\r\nContent-Length-X: 1\r\nTransfer-Encoding: chunked\r\n\r\n") == NULL);
    /* a head that does not end within the bytes given: nothing to say */
    CHECK(FRAMING("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Enc") == NULL);
}

static void host_is_one_valid_field_on_http_1_1(void)
{
    /* RFC 9112 §3.2: missing (HTTP/1.1), more than one, or an invalid value: 400 */
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"), "an HTTP/1.1 request without Host");
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"), "Host given more than once");
    CHECK_STR(FRAMING("GET / HTTP/1.0\r\nHost: a\r\nHOST: b\r\n\r\n"), "Host given more than once");
    const char *bad = "Host holds characters a host and port may not";
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: user@a\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a\\b\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a#b\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n"), bad);
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHost: \xc3\xa9.example\r\n\r\n"), bad);
    /* what §7.2 allows: a name, a port, an IP literal, an escape, empty; HTTP/1.0 without one */
    CHECK(FRAMING("GET / HTTP/1.1\r\nHost: api.example.com:8443\r\n\r\n") == NULL);
    CHECK(FRAMING("GET / HTTP/1.1\r\nhost:[::1]:80\r\n\r\n") == NULL);
    CHECK(FRAMING("GET / HTTP/1.1\r\nHost: a%2Db_c~d\r\n\r\n") == NULL);
    CHECK(FRAMING("GET / HTTP/1.1\r\nHost:\r\n\r\n") == NULL);
    CHECK(FRAMING("GET / HTTP/1.0\r\n\r\n") == NULL);
    /* a field whose name only starts with host is another field */
    CHECK_STR(FRAMING("GET / HTTP/1.1\r\nHostname: a\r\n\r\n"), "an HTTP/1.1 request without Host");
    /* the smuggling reasons come first */
    CHECK_STR(FRAMING("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
              "both Content-Length and Transfer-Encoding");
}

static void hpack_fields_are_counted_without_a_table(void)
{
    /* :method GET (indexed 2), :path literal with indexing (name index 4), a new-name literal
     * without indexing, a table size update (no field), a never-indexed literal, index 62 */
    static const uint8_t block[] = {0x82, 0x44, 0x03, '/', 'a', 'b', 0x00, 0x01, 'x', 0x01, 'y',
                                    0x3f, 0xe1, 0x1f, 0x10, 0x01, 'k', 0x01, 'v', 0xbe};
    CHECK(agw_guard_hpack_fields(block, sizeof(block), 100) == 5);
    CHECK(agw_guard_hpack_fields(block, 6, 100) == 2);  /* cut after the literal: 2 whole fields */
    CHECK(agw_guard_hpack_fields(block, 5, 100) == 1);  /* the literal is cut off: not counted */
    uint8_t bomb[16000];
    memset(bomb, 0xbe, sizeof(bomb));
    CHECK(agw_guard_hpack_fields(bomb, sizeof(bomb), 416) == 417); /* stops once past the limit */
    CHECK(agw_guard_hpack_fields(bomb, sizeof(bomb), 100000) == 16000);
    /* a multi-byte index (§5.1): 0xff 0x80 0x01 is 127 + 128 */
    static const uint8_t big[] = {0xff, 0x80, 0x01, 0x82};
    CHECK(agw_guard_hpack_fields(big, sizeof(big), 100) == 2);
}

static h2o_iovec_t names[4] = {{"a", 1}, {"bb", 2}, {"ccc", 3}, {"dddd", 4}};

static void header_caps_count_then_bytes(void)
{
    h2o_header_t e[4];
    for (int i = 0; i < 4; i++)
        e[i] = (h2o_header_t){.name = &names[i], .value = {"0123456789", 10}};
    h2o_headers_t hs = {e, 4, 4};
    size_t count, bytes;
    CHECK(agw_guard_headers_fit(&hs, 4, 50, &count, &bytes) == NULL && count == 4 && bytes == 50);
    CHECK_STR(agw_guard_headers_fit(&hs, 3, 1000, &count, &bytes), "too many header fields");
    CHECK(count == 4);
    CHECK_STR(agw_guard_headers_fit(&hs, 4, 49, &count, &bytes), "header fields too large");
    CHECK(bytes == 50);
}

int main(void)
{
    RUN(content_length_with_transfer_encoding_is_refused);
    RUN(a_bare_lf_and_an_http_1_0_transfer_encoding_are_refused);
    RUN(content_lengths_that_disagree_are_refused_identical_ones_accepted);
    RUN(transfer_encoding_twice_is_refused);
    RUN(plain_requests_and_what_follows_the_head_pass);
    RUN(header_caps_count_then_bytes);
    RUN(host_is_one_valid_field_on_http_1_1);
    RUN(hpack_fields_are_counted_without_a_table);
    return CHECK_DONE();
}
