/* test_http1.c: response framing of the upstream client (upstream/http1.h), without
 * sockets: what tests/fuzz/fuzz_h1_response.c found, kept as cases, and each rule of the framing
 * read with picohttpparser (cut at every byte, malformed messages, section limits). */
#include <stdio.h>
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

/* ---- picohttpparser framing: what reading with phr_parse_headers/phr_decode_chunked must keep ---- */

/* What the client acts on after reading a message. */
typedef struct {
    size_t used;
    int done, keep_alive, failed, final_headers;
    unsigned status;
    size_t nheaders, nhdrs;
    char fields[512]; /* "name: value\n" per header, then "--\n", then the trailers */
    char body[256];
    size_t body_len;
    char why[160];
} seen_t;

/* Reads msg (len bytes) cut before each of cuts[0, ncuts) (ascending) as the client does: stops
 * at the piece that completes or fails the response; eof: the upstream closes after the bytes. */
static void read_pieces(const char *msg, size_t len, const size_t *cuts, size_t ncuts, int head, size_t max_body,
                        int eof, seen_t *out)
{
    agw_h1_response_t r = {0};
    agw_h1_response_start(&r, head, max_body);
    memset(out, 0, sizeof(*out));
    size_t off = 0;
    for (size_t k = 0; k <= ncuts && off < len; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        if (end <= off)
            continue;
        size_t used = agw_h1_response_feed(&r, msg + off, end - off);
        off += used;
        if (r.done || agw_h1_response_failed(&r) != AGW_CALL_OK || used < end - (off - used))
            break;
    }
    if (eof && !r.done && agw_h1_response_failed(&r) == AGW_CALL_OK)
        agw_h1_response_eof(&r);
    out->used = off;
    out->done = r.done;
    out->keep_alive = r.done && r.keep_alive;
    out->failed = agw_h1_response_failed(&r);
    out->final_headers = r.final_headers;
    out->status = r.final_headers ? r.status : 0;
    out->nheaders = r.nheaders;
    out->nhdrs = r.nhdrs;
    size_t w = 0;
    for (size_t i = 0; i < r.nhdrs && w < sizeof(out->fields); i++) {
        const agw_h1_hdr_t *h = &r.hdrs[i];
        w += (size_t)snprintf(out->fields + w, sizeof(out->fields) - w, "%s%.*s: %.*s\n",
                              i == r.nheaders ? "--\n" : "", (int)h->name_len, r.hstore.base + h->name_off,
                              (int)h->value_len, r.hstore.base + h->value_off);
    }
    out->body_len = r.body.len;
    if (r.body.len)
        memcpy(out->body, r.body.base, r.body.len < sizeof(out->body) - 1 ? r.body.len : sizeof(out->body) - 1);
    if (out->failed != AGW_CALL_OK)
        agw_h1_response_describe(&r, out->why, sizeof(out->why));
    agw_h1_response_free(&r);
}

static void read_whole(const char *msg, int head, size_t max_body, int eof, seen_t *out)
{
    read_pieces(msg, strlen(msg), NULL, 0, head, max_body, eof, out);
}

static int same(const seen_t *a, const seen_t *b)
{
    if (a->failed != b->failed || a->done != b->done)
        return 0;
    if (a->failed != AGW_CALL_OK)
        return 1; /* a failure may be seen at another byte; its kind is what counts */
    return a->used == b->used && a->keep_alive == b->keep_alive && a->status == b->status &&
           a->nheaders == b->nheaders && a->nhdrs == b->nhdrs && strcmp(a->fields, b->fields) == 0 &&
           a->body_len == b->body_len && memcmp(a->body, b->body, a->body_len) == 0;
}

/* Every message, read whole, cut once at every byte and cut twice at every pair of bytes, gives
 * the same response: the sections gathered over reads are parsed as the ones one read holds. */
static void responses_cut_at_every_byte_read_the_same(void)
{
    static const struct {
        const char *msg;
        int head, eof;
        size_t max_body;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}", 0, 0, 0},
        {"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
         "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nokEXTRA",
         0, 0, 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nTrailer: X-Sum\r\n\r\n"
         "5;name=value;q=\"a b\"\r\nhello\r\n6\r\n world\r\n0;last\r\nX-Sum: abc\r\nX-Two: 2\r\n\r\nNEXT",
         0, 0, 1000},
        {"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 3\r\n\r\nabc", 0, 0, 0},
        {"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", 0, 1, 0},
        {"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", 0, 0, 0},
        {"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", 1, 0, 0},
        {"HTTP/1.1 200\nContent-Length: 2\n\nok", 0, 0, 0}, /* bare LFs, no reason phrase */
        {"\r\nHTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", 0, 0, 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n", 0, 0, 8},
        {"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 0\r\n\r\n", 0, 0, 0},
        /* a malformed field in a section not yet ended (the fuzz harness found it failing when
         * read whole and waiting when cut): told at the section's end either way */
        {"HTTP/1.1 200 OK\r\nContent~~~-Ldngth: 08\r56", 0, 0, 16},
        {"HTTP/1.1 200 OK\r\nX Y: 1\r\nX-Z", 0, 0, 0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *msg = cases[c].msg;
        size_t len = strlen(msg);
        seen_t whole, cut;
        read_whole(msg, cases[c].head, cases[c].max_body, cases[c].eof, &whole);
        int bad = 0;
        for (size_t i = 1; i < len && !bad; i++) {
            size_t one[1] = {i};
            read_pieces(msg, len, one, 1, cases[c].head, cases[c].max_body, cases[c].eof, &cut);
            bad |= !same(&whole, &cut);
            for (size_t j = i + 1; j < len && !bad; j++) {
                size_t two[2] = {i, j};
                read_pieces(msg, len, two, 2, cases[c].head, cases[c].max_body, cases[c].eof, &cut);
                bad |= !same(&whole, &cut);
            }
        }
        if (bad)
            fprintf(stderr, "case %zu read differently when cut\n", c);
        CHECK(!bad);
    }
}

/* What those messages are, read whole. */
static void framing_of_each_kind_of_body(void)
{
    seen_t s;
    read_whole("HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
               "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nokEXTRA",
               0, 0, 0, &s);
    CHECK(s.done && s.status == 201 && s.keep_alive);
    CHECK_STR(s.fields, "Content-Length: 2\n"); /* the interim responses' fields are not kept */
    CHECK(s.body_len == 2 && memcmp(s.body, "ok", 2) == 0);
    CHECK(s.used == strlen("HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                           "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")); /* not the next bytes */

    /* chunk extensions are ignored; trailers are kept after the headers; the next bytes are not used */
    const char *chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nTrailer: X-Sum\r\n\r\n"
                          "5;name=value;q=\"a b\"\r\nhello\r\n6\r\n world\r\n0;last\r\nX-Sum: abc\r\nX-Two: 2\r\n\r\n";
    char buf[400];
    snprintf(buf, sizeof(buf), "%sNEXT", chunked);
    read_whole(buf, 0, 0, 0, &s);
    CHECK(s.done && s.keep_alive && s.used == strlen(chunked));
    CHECK(s.body_len == 11 && memcmp(s.body, "hello world", 11) == 0);
    CHECK(s.nheaders == 2 && s.nhdrs == 4);
    CHECK_STR(s.fields, "Transfer-Encoding: gzip, chunked\nTrailer: X-Sum\n--\nX-Sum: abc\nX-Two: 2\n");

    /* chunked only when it is the last coding: else the body runs to the close */
    read_whole("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello", 0, 0, 1, &s);
    CHECK(s.done && !s.keep_alive && s.body_len == 8 && memcmp(s.body, "5\r\nhello", 8) == 0);

    /* HTTP/1.0 keeps the connection only when asked; HTTP/1.1 unless "close" is listed */
    read_whole("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 3\r\n\r\nabc", 0, 0, 0, &s);
    CHECK(s.done && s.keep_alive);
    read_whole("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", 0, 0, 0, &s);
    CHECK(s.done && !s.keep_alive);
    read_whole("HTTP/1.1 200 OK\r\nConnection: keep-alive , CLOSE\r\nContent-Length: 0\r\n\r\n", 0, 0, 0, &s);
    CHECK(s.done && !s.keep_alive);
    read_whole("HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 0\r\n\r\n", 0, 0, 0, &s);
    CHECK(s.done && s.keep_alive); /* "closed" is not "close" */

    /* to the close: done only at EOF, and the connection is not kept */
    read_whole("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", 0, 0, 0, &s);
    CHECK(!s.done && s.failed == AGW_CALL_OK && s.final_headers);
    read_whole("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", 0, 0, 1, &s);
    CHECK(s.done && !s.keep_alive && s.body_len == 15);

    /* 204, 304 and HEAD end at their headers whatever they announce */
    read_whole("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\nbody?", 0, 0, 0, &s);
    CHECK(s.done && s.keep_alive && s.body_len == 0 && s.used == strlen("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n"));
    read_whole("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", 0, 0, 0, &s);
    CHECK(s.done && s.keep_alive && s.body_len == 0);
    read_whole("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", 1, 0, 0, &s);
    CHECK(s.done && s.keep_alive && s.body_len == 0 && s.status == 200);

    /* a status line without a reason phrase, bare LFs, empty lines before the status line */
    read_whole("HTTP/1.1 200\nContent-Length: 2\n\nok", 0, 0, 0, &s);
    CHECK(s.done && s.status == 200 && s.body_len == 2);
    read_whole("\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, 0, 0, &s);
    CHECK(s.done && s.status == 200);
    /* a value's spaces around it are not part of it; an empty value is one */
    read_whole("HTTP/1.1 200 OK\r\nX-A:   spaced\r\nX-Empty:\r\nContent-Length:  0  \r\n\r\n", 0, 0, 0, &s);
    CHECK(s.done && strstr(s.fields, "X-A: spaced\n") != NULL && strstr(s.fields, "X-Empty: \n") != NULL);

    /* the largest Content-Length (one below UINT64_MAX, which means "none") is a length */
    agw_h1_response_t r = {0};
    agw_h1_response_start(&r, 0, 0);
    const char *big = "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551614\r\n\r\nab";
    CHECK(feed_str(&r, big) == strlen(big));
    CHECK(agw_h1_response_failed(&r) == AGW_CALL_OK && r.expect_len == UINT64_MAX - 1 && r.body.len == 2);
    agw_h1_response_free(&r);
}

/* Each malformed message is a bad response (or too large), and says why. */
static void malformed_responses_are_bad_responses(void)
{
    static const struct {
        const char *msg;
        const char *why; /* in the description */
    } bad[] = {
        {"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 0\r\n\r\n", "obs-fold"},
        {"HTTP/1.1 200 OK\r\nX-Long: a\r\n\tb\r\nContent-Length: 0\r\n\r\n", "obs-fold"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: a\r\n b\r\n\r\n", "obs-fold"},
        {"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "Content-Length is not a number"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "more than one Content-Length"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\nhello!", "more than one Content-Length"},
        {"HTTP/1.1 204 No Content\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "more than one Content-Length"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         "both Transfer-Encoding and Content-Length"},
        {"HTTP/1.1 200 OK\r\nX Y: 1\r\n\r\n", "malformed header field"},
        {"HTTP/1.1 200 OK\r\nX-Y : 1\r\n\r\n", "malformed header field"},
        {"HTTP/1.1 200 OK\r\n: 1\r\n\r\n", "malformed header field"},
        {"HTTP/1.1 200 OK\r\nX-Y: a\x01b\r\n\r\n", "malformed header field"},
        {"HTTP/1.1 200 OK\r\nX-Y: a\rb\r\n\r\n", "malformed header field"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "malformed chunk"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n", "malformed chunk"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX Y: 1\r\n\r\n", "malformed trailer field"},
        {"HTTP/2.0 200 OK\r\n\r\n", "no status line"},
        {"HTTP/1.1 2000 OK\r\n\r\n", "no status line"},
        {"HTTP/1.1 20 OK\r\n\r\n", "no status line"},
        {"HTTP/1.1 200 O\rK\r\nContent-Length: 0\r\n\r\n", "no status line"},
        {"HTTP/1.1 099 Low\r\n\r\n", "status 99 is not an HTTP status"},
        {"HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n", "status 0 is not an HTTP status"},
        {"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "unexpected protocol upgrade (status 101)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        seen_t s;
        read_whole(bad[i].msg, 0, 0, 0, &s);
        if (s.failed != AGW_CALL_BAD_RESPONSE || strstr(s.why, bad[i].why) == NULL)
            fprintf(stderr, "case %zu: outcome %d, \"%s\"\n", i, s.failed, s.why);
        CHECK(s.failed == AGW_CALL_BAD_RESPONSE && strstr(s.why, bad[i].why) != NULL);
        CHECK(!s.done);
    }
}

/* Bytes that are no HTTP fail at once, without waiting for a line end that may never come (a
 * TLS alert from an https:// port named http://, another protocol's greeting). */
static void bytes_that_are_no_status_line_fail_before_a_line_end(void)
{
    static const char *const starts[] = {"\x15\x03\x01\x00\x02\x02\x28", "SSH-2.0-OpenSSH_9.2", "HTTP/1.1 2x",
                                         "HTTP/1.12", "-ERR unknown command", "HTTP/1.1 200X"};
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
        agw_h1_response_t r = {0};
        agw_h1_response_start(&r, 0, 0);
        for (size_t k = 0; k < strlen(starts[i]) && agw_h1_response_failed(&r) == AGW_CALL_OK; k++)
            agw_h1_response_feed(&r, starts[i] + k, 1);
        CHECK(agw_h1_response_failed(&r) == AGW_CALL_BAD_RESPONSE);
        agw_h1_response_free(&r);
    }
    /* a status line's start is no failure yet */
    agw_h1_response_t r = {0};
    agw_h1_response_start(&r, 0, 0);
    CHECK(agw_h1_response_feed(&r, "HTTP/1.1 200", 12) == 12);
    CHECK(agw_h1_response_failed(&r) == AGW_CALL_OK && !r.done);
    agw_h1_response_free(&r);
}

/* A header section (and a trailer section) of up to 80 KiB is read, with any number of fields,
 * in one read or gathered over many; one byte more is a bad response. */
static void header_sections_up_to_80_kib_with_any_number_of_fields(void)
{
    const char *line = "HTTP/1.1 200 OK\r\n", *tail = "Content-Length: 0\r\n\r\n";
    agw_buf_t msg = AGW_BUF_INIT;
    for (int over = 0; over <= 1; over++) {
        agw_buf_reset(&msg);
        agw_buf_puts(&msg, line);
        size_t fields = 0;
        /* "X-NNNNN: v\r\n" fields (12 bytes each) up to the limit, then one of the length that fits */
        while (msg.len + 12 + strlen(tail) <= AGW_H1_MAX_HEADER_BYTES - 40) {
            agw_buf_printf(&msg, "X-%05zu: v\r\n", fields++);
        }
        size_t pad = AGW_H1_MAX_HEADER_BYTES + (size_t)over - msg.len - strlen(tail) - strlen("X-Pad: \r\n");
        agw_buf_puts(&msg, "X-Pad: ");
        for (size_t i = 0; i < pad; i++)
            agw_buf_putc(&msg, 'p');
        agw_buf_puts(&msg, "\r\n");
        agw_buf_puts(&msg, tail);
        CHECK(msg.len == AGW_H1_MAX_HEADER_BYTES + (size_t)over);
        for (size_t piece = 1000; piece <= msg.len; piece = piece == 1000 ? msg.len : msg.len + 1) {
            agw_h1_response_t r = {0};
            agw_h1_response_start(&r, 0, 0);
            for (size_t off = 0; off < msg.len && !r.done && agw_h1_response_failed(&r) == AGW_CALL_OK; off += piece)
                agw_h1_response_feed(&r, msg.base + off, msg.len - off < piece ? msg.len - off : piece);
            if (over) {
                char why[160];
                agw_h1_response_describe(&r, why, sizeof(why));
                CHECK(agw_h1_response_failed(&r) == AGW_CALL_BAD_RESPONSE && strstr(why, "80 KiB") != NULL);
            } else {
                CHECK(r.done && r.nheaders == fields + 2);
                CHECK(r.nheaders > 6000);
                const agw_h1_hdr_t *last = &r.hdrs[r.nheaders - 2];
                CHECK(last->value_len == pad && r.hstore.base[last->value_off + pad - 1] == 'p');
            }
            agw_h1_response_free(&r);
        }
    }
    /* the same for a trailer section */
    agw_buf_reset(&msg);
    agw_buf_puts(&msg, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Big: ");
    for (size_t i = 0; i < AGW_H1_MAX_HEADER_BYTES; i++)
        agw_buf_putc(&msg, 't');
    agw_buf_puts(&msg, "\r\n\r\n");
    seen_t s;
    read_pieces(msg.base, msg.len, NULL, 0, 0, 0, 0, &s);
    CHECK(s.failed == AGW_CALL_BAD_RESPONSE && strstr(s.why, "trailer section over 80 KiB") != NULL);
    agw_buf_free(&msg);
}

/* The body limit holds at Content-Length, at a chunk's size line (before its data comes, even
 * when only the first digits have) and at each byte of a body read to the close. */
static void body_limit_holds_before_the_bytes_come(void)
{
    seen_t s;
    read_whole("HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n", 0, 16, 0, &s);
    CHECK(s.failed == AGW_CALL_TOO_LARGE && s.status == 200 && strstr(s.why, "17 bytes") != NULL);
    read_whole("HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n0123456789abcdef", 0, 16, 0, &s);
    CHECK(s.done && s.body_len == 16);
    read_whole("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n9\r\n", 0, 16, 0, &s);
    CHECK(s.failed == AGW_CALL_TOO_LARGE && s.body_len <= 16);
    read_whole("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfff", 0, 1000, 0, &s);
    CHECK(s.failed == AGW_CALL_TOO_LARGE);
    read_whole("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n8\r\n01234567\r\n0\r\n\r\n", 0, 16,
               0, &s);
    CHECK(s.done && s.body_len == 16);
    read_whole("HTTP/1.1 200 OK\r\n\r\n0123456789abcdefg", 0, 16, 0, &s);
    CHECK(s.failed == AGW_CALL_TOO_LARGE);
}

/* The request line, Host, the caller's fields but the framing ones, and Content-Length exactly
 * when there is a body or the method is POST, PUT or PATCH (no other method, however it starts). */
static void requests_say_content_length_for_a_body_or_post_put_patch(void)
{
    agw_upstream_conf_t conf = {.host_header = "up:9", .base_path = "/v1"};
    agw_header_t hdrs[] = {{"Host", 4, "evil", 4}, {"x-a", 3, "1", 1}, {"transfer-encoding", 17, "chunked", 7}};
    static const struct {
        const char *method;
        int length;
    } cases[] = {{"GET", 0},  {"HEAD", 0}, {"DELETE", 0}, {"OPTIONS", 0}, {"POST", 1}, {"PUT", 1},
                 {"PATCH", 1}, {"P", 0},    {"PUTS", 0},   {"POS", 0},     {"PATCHY", 0}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        agw_call_req_t req = {.method = cases[i].method, .path = "/x?q=1", .path_len = 6, .headers = hdrs, .num_headers = 3};
        const char *why = NULL;
        size_t room = agw_h1_request_size(&conf, &req, &why);
        CHECK(why == NULL && room > 0);
        char *out = malloc(room + 1);
        size_t n = agw_h1_request_write(&conf, &req, out);
        CHECK(n <= room);
        out[n] = '\0';
        char want[160];
        snprintf(want, sizeof(want), "%s /v1/x?q=1 HTTP/1.1\r\nHost: up:9\r\nx-a: 1\r\n%s\r\n", cases[i].method,
                 cases[i].length ? "Content-Length: 0\r\n" : "");
        CHECK_STR(out, want);
        free(out);
    }
    agw_call_req_t with_body = {.method = "GET", .path = "/", .path_len = 1, .body = "{}", .body_len = 2};
    const char *why = NULL;
    size_t room = agw_h1_request_size(&conf, &with_body, &why);
    char *out = malloc(room + 1);
    size_t n = agw_h1_request_write(&conf, &with_body, out);
    out[n] = '\0';
    CHECK_STR(out, "GET /v1/ HTTP/1.1\r\nHost: up:9\r\nContent-Length: 2\r\n\r\n{}");
    free(out);
}

/* The fields before the gateway's own (num_own, last) are checked on every call: a script's field
 * that would split the request is refused whatever follows it, and a num_own larger than the
 * fields trusts none of them. */
static void a_call_s_own_fields_do_not_hide_the_script_s(void)
{
    agw_upstream_conf_t conf = {.host_header = "up:9"};
    agw_header_t hdrs[] = {{"x-a", 3, "1\r\nx-injected: 1", 16},
                           {"traceparent", 11, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", 55}};
    for (size_t own = 0; own <= 5; own++) {
        if (own == 2)
            continue; /* both the gateway's: not this test */
        agw_call_req_t req = {.method = "GET", .path = "/", .path_len = 1, .headers = hdrs, .num_headers = 2,
                              .num_own = own};
        const char *why = NULL;
        CHECK(agw_h1_request_size(&conf, &req, &why) == 0 && why != NULL);
    }
    agw_header_t fine[] = {{"x-a", 3, "1", 1}, hdrs[1]};
    agw_call_req_t req = {.method = "GET", .path = "/", .path_len = 1, .headers = fine, .num_headers = 2, .num_own = 1};
    const char *why = NULL;
    CHECK(agw_h1_request_size(&conf, &req, &why) > 0 && why == NULL);
}

int main(void)
{
    RUN(a_lying_content_length_reserves_no_more_than_a_mebibyte);
    RUN(start_forgets_the_previous_response);
    RUN(one_byte_reads_give_the_same_response);
    RUN(responses_cut_at_every_byte_read_the_same);
    RUN(framing_of_each_kind_of_body);
    RUN(malformed_responses_are_bad_responses);
    RUN(bytes_that_are_no_status_line_fail_before_a_line_end);
    RUN(header_sections_up_to_80_kib_with_any_number_of_fields);
    RUN(body_limit_holds_before_the_bytes_come);
    RUN(requests_say_content_length_for_a_body_or_post_put_patch);
    RUN(a_call_s_own_fields_do_not_hide_the_script_s);
    return CHECK_DONE();
}
