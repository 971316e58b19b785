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
#include <stdio.h>
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

/* The two tables hold the same entries, name and value (ours leaves h2o's table as h2o keeps it). */
static int same_table(h2o_hpack_header_table_t *t1, h2o_hpack_header_table_t *t2)
{
    if (t1->num_entries != t2->num_entries || t1->hpack_size != t2->hpack_size)
        return 0;
    for (size_t i = 0; i < t1->num_entries; i++) {
        h2o_hpack_header_table_entry_t *a = h2o_hpack_header_table_get(t1, i), *b = h2o_hpack_header_table_get(t2, i);
        if (!h2o_memis(a->name->base, a->name->len, b->name->base, b->name->len) ||
            !h2o_memis(a->value->base, a->value->len, b->value->base, b->value->len))
            return 0;
    }
    return 1;
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
        CHECK(same_table(&t1, &t2));
    }
    h2o_hpack_dispose_header_table(&t1);
    h2o_hpack_dispose_header_table(&t2);
}

/* Several Server-Timing fields (one empty, one of 200 bytes: a two-byte length) among others, over
 * three responses on the same tables: libh2o's bytes without them, then their literals in order. */
static void several_fields_in_order(void)
{
    static char long_value[201];
    memset(long_value, 'd', 200);
    h2o_hpack_header_table_t t1 = {0}, t2 = {0};
    t1.hpack_capacity = t2.hpack_capacity = 4096;
    for (int round = 0; round < 3; round++) {
        char first[32];
        snprintf(first, sizeof(first), "a;dur=%d", round);
        h2o_header_t with[] = {field(&timing_name, first), field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"),
                               field(&timing_name, ""), field(&completed_name, round ? "false" : "true"),
                               field(&timing_name, long_value)};
        h2o_header_t without[] = {with[1], with[3]};
        static unsigned char a[4096], b[4096];
        size_t na = flatten(ours, &t1, with, 5, 16384, a, sizeof(a));
        size_t nb = flatten(theirs, &t2, without, 2, 16384, b, sizeof(b));
        unsigned char lit[512];
        size_t nl = agw_h2_head_literal(lit, "server-timing", 13, first, strlen(first));
        nl += agw_h2_head_literal(lit + nl, "server-timing", 13, "", 0);
        nl += agw_h2_head_literal(lit + nl, "server-timing", 13, long_value, 200);
        CHECK(nb > 9 && na == nb + nl);
        if (!(nb > 9 && na == nb + nl))
            break;
        CHECK(((size_t)a[0] << 16 | (size_t)a[1] << 8 | a[2]) == na - 9);
        CHECK(memcmp(a + 3, b + 3, nb - 3) == 0 && memcmp(a + nb, lit, nl) == 0);
        CHECK(same_table(&t1, &t2));
    }
    h2o_hpack_dispose_header_table(&t1);
    h2o_hpack_dispose_header_table(&t2);
}

/* At every frame size from 60 to 700 bytes, ours is either libh2o's whole head (the fields indexed
 * by h2o: the bound said the literals might not fit) or libh2o's head without them plus the
 * literals in its one frame, within the size; the second from some size on, and for every size
 * above. */
static void every_frame_size_gives_one_of_the_two(void)
{
    h2o_header_t with[] = {field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"), field(&completed_name, "true"),
                           field(&timing_name, "product;dur=0.7, reviews;dur=0.4")};
    h2o_header_t without[] = {with[0], with[1]};
    unsigned char lit[128];
    size_t nl = agw_h2_head_literal(lit, "server-timing", 13, with[2].value.base, with[2].value.len);
    int literal_from = 0, whole = 0, bad = 0;
    for (size_t max = 60; max <= 700; max++) {
        h2o_hpack_header_table_t t[3] = {{0}, {0}, {0}};
        t[0].hpack_capacity = t[1].hpack_capacity = t[2].hpack_capacity = 4096;
        static unsigned char a[4096], b[4096], c[4096];
        size_t na = flatten(ours, &t[0], with, 3, max, a, sizeof(a));
        size_t nb = flatten(theirs, &t[1], without, 2, max, b, sizeof(b));
        size_t nc = flatten(theirs, &t[2], with, 3, max, c, sizeof(c));
        if (na == nc && memcmp(a, c, na) == 0) {
            whole++;
            if (literal_from)
                bad++; /* (whole again above a size that took the literals) */
        } else if (na == nb + nl && na - 9 <= max && ((size_t)a[0] << 16 | (size_t)a[1] << 8 | a[2]) == na - 9 &&
                   memcmp(a + 3, b + 3, nb - 3) == 0 && memcmp(a + nb, lit, nl) == 0) {
            if (!literal_from)
                literal_from = (int)max;
        } else {
            bad++;
        }
        for (int i = 0; i < 3; i++)
            h2o_hpack_dispose_header_table(&t[i]);
    }
    CHECK(bad == 0);
    CHECK(whole > 0 && literal_from > 60 && literal_from < 400);
}

/* Should h2o's block be more than one frame, the literals go in a CONTINUATION frame of their own
 * (agw_h2_head_append: the bound keeps the interposed call from it; here a block of libh2o's made
 * with frames of 40 bytes). */
static void a_block_of_several_frames_gets_a_continuation(void)
{
    h2o_header_t without[] = {field(&H2O_TOKEN_CONTENT_TYPE->buf, "application/json"),
                              field(&completed_name, "true, and a value long enough for two frames")};
    h2o_header_t timing[] = {field(&timing_name, "a;dur=1")};
    h2o_hpack_header_table_t t = {0};
    t.hpack_capacity = 4096;
    h2o_buffer_t *b;
    h2o_buffer_init(&b, &h2o_socket_buffer_prototype);
    h2o_res_t res;
    memset(&res, 0, sizeof(res));
    res.status = 200;
    res.headers.entries = without, res.headers.size = res.headers.capacity = 2;
    h2o_timestamp_t ts = {{0, 0}, &tstr};
    h2o_iovec_t server = {NULL, 0};
    theirs(&b, &t, 5, 40, &res, &ts, &server, 422);
    size_t before = b->size;
    unsigned char lit[64];
    size_t nl = agw_h2_head_literal(lit, "server-timing", 13, "a;dur=1", 7);
    CHECK(agw_h2_head_append(&b, 0, 5, 40, timing, 1, nl) == 1);
    CHECK(b->size == before + 9 + nl);
    /* the frames: HEADERS, CONTINUATION…, then ours; only the last ends the block */
    const unsigned char *p = (const unsigned char *)b->bytes;
    size_t at = 0, frames = 0, ends = 0, last = 0;
    while (at + 9 <= b->size) {
        size_t len = (size_t)p[at] << 16 | (size_t)p[at + 1] << 8 | p[at + 2];
        CHECK(p[at + 3] == (frames == 0 ? 0x1 : 0x9)); /* HEADERS, then CONTINUATION */
        CHECK(p[at + 8] == 5 && p[at + 5] == 0 && p[at + 6] == 0 && p[at + 7] == 0);
        if (p[at + 4] & 0x4)
            ends++;
        last = at;
        frames++;
        at += 9 + len;
    }
    CHECK(at == b->size && frames >= 3 && ends == 1 && (p[last + 4] & 0x4));
    CHECK(((size_t)p[last] << 16 | (size_t)p[last + 1] << 8 | p[last + 2]) == nl && memcmp(p + last + 9, lit, nl) == 0);
    h2o_buffer_dispose(&b);
    h2o_hpack_dispose_header_table(&t);
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
    RUN(several_fields_in_order);
    RUN(every_frame_size_gives_one_of_the_two);
    RUN(a_block_of_several_frames_gets_a_continuation);
    RUN(other_heads_are_h2os);
    return CHECK_DONE();
}
