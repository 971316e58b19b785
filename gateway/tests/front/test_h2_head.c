/* test_h2_head.c: an HTTP/2 response head's Server-Timing sent without indexing (front/h2_head.h).
 * The process's h2o_hpack_flatten_response (ours) against libh2o's own, each with a header table
 * of its own: ours must write libh2o's bytes for the head without Server-Timing, then the literal
 * fields, in the one HEADERS frame, and leave the dynamic table as libh2o's call leaves it (the
 * next response's bytes are compared too). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT, RTLD_DEFAULT */
#endif
#include "../check.h"
#include "front/h2_head.h"

#include <dlfcn.h>
#include <h2o.h>
#include <h2o/http2.h>
#include <h2o/http2_internal.h> /* with guard/h2o_internal/khash.h (CMakeLists.txt) */
#include <stdlib.h>
#include <string.h>

typedef void (*flatten_fn)(h2o_buffer_t **, h2o_hpack_header_table_t *, uint32_t, size_t, h2o_res_t *,
                           h2o_timestamp_t *, const h2o_iovec_t *, size_t);

static flatten_fn ours, theirs;
static h2o_timestamp_string_t tstr = {"Sun, 06 Dec 2026 18:00:00 GMT", ""};
static h2o_iovec_t timing_name = {(char *)"server-timing", 13};
static h2o_iovec_t completed_name = {(char *)"x-aggregation-completed", 23};

static h2o_header_t field(h2o_iovec_t *name, const char *value)
{
    h2o_header_t h = {name, NULL, {(char *)value, strlen(value)}};
    return h;
}

/* One response head written by fn on table t: its bytes (frame header and payload) in out. */
static size_t flatten(flatten_fn fn, h2o_hpack_header_table_t *t, h2o_header_t *hs, size_t n, size_t max_frame,
                      unsigned char *out, size_t cap)
{
    h2o_buffer_t *b;
    h2o_buffer_init(&b, &h2o_socket_buffer_prototype);
    h2o_res_t res;
    memset(&res, 0, sizeof(res));
    res.status = 200;
    res.headers.entries = hs, res.headers.size = n, res.headers.capacity = n;
    h2o_timestamp_t ts = {{0, 0}, &tstr};
    h2o_iovec_t server = {NULL, 0};
    fn(&b, t, 1, max_frame, &res, &ts, &server, 422);
    size_t len = b->size;
    CHECK(res.headers.entries == hs && res.headers.size == n); /* (given back as they were) */
    if (len <= cap)
        memcpy(out, b->bytes, len);
    h2o_buffer_dispose(&b);
    return len <= cap ? len : 0;
}

static void interposed(void)
{
    CHECK(agw_h2_head_active());
    CHECK(ours != NULL && theirs != NULL && ours != theirs);
}

/* RFC 7541 §5.1 integers with a 7-bit prefix, strings without Huffman code. */
static void the_literal_is_rfc_7541s(void)
{
    unsigned char out[400];
    size_t n = agw_h2_head_literal(out, "ab", 2, "xyz", 3);
    CHECK(n == 8 && agw_h2_head_literal(NULL, "ab", 2, "xyz", 3) == 8);
    CHECK(memcmp(out, "\x00\x02" "ab" "\x03" "xyz", 8) == 0);
    static char v[300];
    memset(v, 'v', sizeof(v));
    n = agw_h2_head_literal(out, "ab", 2, v, 126); /* 126: one byte */
    CHECK(n == 1 + 1 + 2 + 1 + 126 && out[4] == 126);
    n = agw_h2_head_literal(out, "ab", 2, v, 127); /* 127: 0x7f then 0 */
    CHECK(n == 1 + 1 + 2 + 2 + 127 && out[4] == 0x7f && out[5] == 0x00);
    n = agw_h2_head_literal(out, "ab", 2, v, 300); /* 300 - 127 = 173 = 0x80|45, 1 */
    CHECK(n == 1 + 1 + 2 + 3 + 300 && out[4] == 0x7f && out[5] == (0x80 | 45) && out[6] == 1);
}

/* ours = libh2o's bytes for the head without Server-Timing, the frame 'lit' bytes longer, then the
 * literals; twice on the same tables (the second response's bytes depend on the table the first
 * left). */
static void timing_goes_as_literals_and_the_table_is_h2os(void)
{
    h2o_hpack_header_table_t t1 = {0}, t2 = {0};
    t1.hpack_capacity = t2.hpack_capacity = 4096;
    const char *values[] = {"product;dur=0.7, reviews;dur=0.4", "product;dur=1.2, reviews;dur=0.9, stock;dur=3.1"};
    for (int round = 0; round < 2; round++) {
        h2o_header_t with[] = {field(&H2O_TOKEN_CACHE_CONTROL->buf, "no-store"), field(&completed_name, "true"),
                               field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"),
                               field(&timing_name, values[round])};
        h2o_header_t without[] = {with[0], with[1], with[2]};
        static unsigned char a[4096], b[4096];
        size_t na = flatten(ours, &t1, with, 4, 16384, a, sizeof(a));
        size_t nb = flatten(theirs, &t2, without, 3, 16384, b, sizeof(b));
        unsigned char lit[256];
        size_t nl = agw_h2_head_literal(lit, "server-timing", 13, values[round], strlen(values[round]));
        CHECK(nb > 9 && na == nb + nl);
        if (!(nb > 9 && na == nb + nl))
            return;
        size_t pa = (size_t)a[0] << 16 | (size_t)a[1] << 8 | a[2], pb = (size_t)b[0] << 16 | (size_t)b[1] << 8 | b[2];
        CHECK(pb == nb - 9 && pa == pb + nl);
        CHECK(a[3] == 0x01 /* HEADERS */ && (a[4] & 0x04) /* END_HEADERS */);
        CHECK(memcmp(a + 3, b + 3, nb - 3) == 0); /* type, flags, stream, and h2o's fields */
        CHECK(memcmp(a + nb, lit, nl) == 0);
        CHECK(t1.num_entries == t2.num_entries && t1.hpack_size == t2.hpack_size);
    }
    h2o_hpack_dispose_header_table(&t1);
    h2o_hpack_dispose_header_table(&t2);
}

/* A head without Server-Timing, and one too large for a frame with the literals, are libh2o's. */
static void other_heads_are_h2os(void)
{
    static char big[20000];
    memset(big, 'b', sizeof(big) - 1);
    struct {
        h2o_header_t hs[3];
        size_t n, max_frame;
    } cases[] = {
        {{field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"), field(&completed_name, "true")}, 2, 16384},
        {{field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"), field(&timing_name, "a;dur=1"),
          field(&completed_name, big)}, 3, 16384},
        /* (the bound counts 21 bytes a field besides its name and value: a frame of 100 bytes at
         * most leaves the literals out) */
        {{field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"), field(&timing_name, "a;dur=1")}, 2, 100},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        h2o_hpack_header_table_t t1 = {0}, t2 = {0};
        t1.hpack_capacity = t2.hpack_capacity = 4096;
        static unsigned char a[40000], b[40000];
        size_t na = flatten(ours, &t1, cases[i].hs, cases[i].n, cases[i].max_frame, a, sizeof(a));
        size_t nb = flatten(theirs, &t2, cases[i].hs, cases[i].n, cases[i].max_frame, b, sizeof(b));
        CHECK(na > 9 && na == nb && memcmp(a, b, na) == 0);
        h2o_hpack_dispose_header_table(&t1);
        h2o_hpack_dispose_header_table(&t2);
    }
}

int main(void)
{
    *(void **)&ours = dlsym(RTLD_DEFAULT, "h2o_hpack_flatten_response");
    *(void **)&theirs = dlsym(RTLD_NEXT, "h2o_hpack_flatten_response");
    RUN(interposed);
    if (ours == NULL || theirs == NULL || ours == theirs)
        return 1;
    RUN(the_literal_is_rfc_7541s);
    RUN(timing_goes_as_literals_and_the_table_is_h2os);
    RUN(other_heads_are_h2os);
    return CHECK_DONE();
}
