/* test_entry.c: reading a cache entry in C (cache/entry.h) accepts what lua/agg/cache.lua's
 * M.encode writes and refuses what M.decode refuses; writing one in C gives M.encode's bytes; a
 * time the runtime hands over is clamped before it becomes an integer. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "base/buf.h"
#include "cache/entry.h"
#include "tests/check.h"

static int parse(const char *s, agw_cache_entry_t *e)
{
    return agw_cache_entry_parse(s, strlen(s), e);
}

static void reads_the_fields_and_points_into_the_bytes(void)
{
    const char *v = "AGWC1 1000 2000 3000 200 15 9\ncontent-type\0x\0{\"a\":1}xx";
    agw_cache_entry_t e;
    CHECK(agw_cache_entry_parse(v, 30 + 15 + 9, &e) == 0);
    CHECK(e.fresh_ms == 1000 && e.stale_ms == 2000 && e.error_until_ms == 3000 && e.status == 200);
    CHECK(e.hlen == 15 && e.headers == v + 30 && memcmp(e.headers, "content-type\0x\0", 15) == 0);
    CHECK(e.blen == 9 && memcmp(e.body, "{\"a\":1}xx", 9) == 0);
    CHECK(parse("AGWC1 1 2 3 404 0 0\n", &e) == 0 && e.status == 404 && e.hlen == 0 && e.blen == 0);
}

static void refuses_what_is_not_an_entry(void)
{
    agw_cache_entry_t e;
    CHECK(parse("", &e) == -1);
    CHECK(parse("AGWC2 1 2 3 200 0 2\n{}", &e) == -1);            /* another format */
    CHECK(parse("AGWC1 1 2 3 200 0 3\n{}", &e) == -1);            /* body shorter than said */
    CHECK(parse("AGWC1 1 2 3 200 0 1\n{}", &e) == -1);            /* bytes after the body */
    CHECK(parse("AGWC1 1 2 3 200 5 0\n{}", &e) == -1);            /* headers past the end */
    CHECK(parse("AGWC1 +1 2 3 200 0 2\n{}", &e) == -1);           /* digits only */
    CHECK(parse("AGWC1 1e3 2 3 200 0 2\n{}", &e) == -1);
    CHECK(parse("AGWC1 1  2 3 200 0 2\n{}", &e) == -1);           /* an empty field */
    CHECK(parse("AGWC1 1 2 3 200 0 2 {}", &e) == -1);             /* no newline */
    CHECK(parse("AGWC1 1234567890123456 2 3 200 0 2\n{}", &e) == -1); /* 16 digits */
    CHECK(parse("AGWC1 123456789012345 2 3 200 0 2\n{}", &e) == 0);   /* 15 are fine */
    CHECK(parse("AGWC1 1 2 3 200 0 18446744073709551615\n", &e) == -1);
    /* over AGW_CACHE_ENTRY_MAX bytes */
    size_t n = AGW_CACHE_ENTRY_MAX + 1;
    char *big = malloc(n);
    memset(big, ' ', n);
    memcpy(big, "AGWC1 1 2 3 200 0 ", 18);
    CHECK(agw_cache_entry_parse(big, n, &e) == -1);
    free(big);
}

/* The whole entry of e's fields in b, emptied first: its first line (agw_cache_entry_head), the
 * headers and the body, as the worker stores the three parts (worker/cache.c). Returns b->len. */
static size_t entry_bytes(agw_buf_t *b, const agw_cache_entry_t *e)
{
    char line[AGW_CACHE_ENTRY_HEAD_MAX];
    size_t n = agw_cache_entry_head(line, e);
    agw_buf_reset(b);
    agw_buf_append(b, line, n);
    agw_buf_append(b, e->headers ? e->headers : "", e->hlen);
    agw_buf_append(b, e->body ? e->body : "", e->blen);
    return b->len;
}

/* The bytes M.encode makes of the same fields ("%s %d %d %d %d %d %d\n" .. headers .. body), and
 * what the parser reads back; an entry with no header and no body; the largest times. */
static void writes_what_encode_writes(void)
{
    static const char want[] = "AGWC1 1000 2000 3000 200 15 9\ncontent-type\0x\0{\"a\":1}xx";
    agw_cache_entry_t e = {.fresh_ms = 1000, .stale_ms = 2000, .error_until_ms = 3000, .status = 200,
                           .headers = "content-type\0x\0", .hlen = 15, .body = "{\"a\":1}xx", .blen = 9};
    agw_buf_t b = AGW_BUF_INIT;
    CHECK(entry_bytes(&b, &e) == sizeof(want) - 1);
    CHECK(b.len == sizeof(want) - 1 && memcmp(b.base, want, b.len) == 0);
    agw_cache_entry_t back;
    CHECK(agw_cache_entry_parse(b.base, b.len, &back) == 0);
    CHECK(back.fresh_ms == 1000 && back.status == 200 && back.hlen == 15 && back.blen == 9);
    agw_cache_entry_t empty = {.fresh_ms = 1, .stale_ms = 1, .error_until_ms = 1, .status = 404};
    CHECK(entry_bytes(&b, &empty) == strlen("AGWC1 1 1 1 404 0 0\n"));
    CHECK_STR(b.base, "AGWC1 1 1 1 404 0 0\n");
    CHECK(agw_cache_entry_parse(b.base, b.len, &back) == 0 && back.hlen == 0 && back.blen == 0);
    agw_cache_entry_t big = {.fresh_ms = 999999999999999ull, .stale_ms = 999999999999999ull,
                             .error_until_ms = 999999999999999ull, .status = 599};
    entry_bytes(&b, &big);
    CHECK(agw_cache_entry_parse(b.base, b.len, &back) == 0 && back.fresh_ms == 999999999999999ull);
    agw_buf_free(&b);
}

/* The first line alone, for numbers of every digit count: what encode writes before the parts. */
static void the_first_line_alone(void)
{
    static const uint64_t ns[] = {0, 7, 10, 99, 100, 101, 999, 1000, 12345, 1764800000123ull, 999999999999999ull};
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
        agw_cache_entry_t e = {.fresh_ms = ns[i], .stale_ms = ns[i] + 1, .error_until_ms = ns[i], .status = 200,
                               .headers = "", .hlen = 0, .body = "{}", .blen = 2};
        char line[AGW_CACHE_ENTRY_HEAD_MAX], want[160];
        size_t n = agw_cache_entry_head(line, &e);
        int wn = snprintf(want, sizeof(want), "AGWC1 %llu %llu %llu 200 0 2\n", (unsigned long long)ns[i],
                          (unsigned long long)ns[i] + 1, (unsigned long long)ns[i]);
        CHECK(n == (size_t)wn && memcmp(line, want, n) == 0);
    }
    agw_cache_entry_t most = {.fresh_ms = 999999999999999ull, .stale_ms = 999999999999999ull,
                              .error_until_ms = 999999999999999ull, .status = 999999999999999ull,
                              .hlen = 999999999999999ull, .blen = 999999999999999ull};
    char line[AGW_CACHE_ENTRY_HEAD_MAX];
    CHECK(agw_cache_entry_head(line, &most) == 6 + 6 * 16);
}

/* A Lua number as an entry's time or a lifetime: clamped before it is converted, whatever it is (an
 * attack review: stale-if-error=1e400 became a Redis PX of 0, 10^17 seconds one past LLONG_MAX). */
static void times_are_clamped_before_they_are_converted(void)
{
    CHECK(agw_cache_entry_ms(NAN) == 0);
    CHECK(agw_cache_entry_ms(-NAN) == 0);
    CHECK(agw_cache_entry_ms(-INFINITY) == 0);
    CHECK(agw_cache_entry_ms(-1e300) == 0);
    CHECK(agw_cache_entry_ms(0.0) == 0);
    CHECK(agw_cache_entry_ms(0.5) == 0);
    CHECK(agw_cache_entry_ms(1.0) == 1);
    CHECK(agw_cache_entry_ms(1764800000123.75) == 1764800000123ull);
    CHECK(agw_cache_entry_ms(999999999999998.0) == 999999999999998ull);
    CHECK(agw_cache_entry_ms(999999999999999.0) == AGW_CACHE_ENTRY_MS_MAX);
    CHECK(agw_cache_entry_ms(1e17 * 1000) == AGW_CACHE_ENTRY_MS_MAX);       /* 9.3e18 went past LLONG_MAX */
    CHECK(agw_cache_entry_ms(18446744073709551616.0) == AGW_CACHE_ENTRY_MS_MAX); /* 2^64 */
    CHECK(agw_cache_entry_ms(INFINITY) == AGW_CACHE_ENTRY_MS_MAX);            /* 1e400: was PX 0 */
    CHECK(AGW_CACHE_ENTRY_MS_MAX < (uint64_t)LLONG_MAX / 1000);               /* a PX Redis takes */
}

int main(void)
{
    RUN(reads_the_fields_and_points_into_the_bytes);
    RUN(refuses_what_is_not_an_entry);
    RUN(writes_what_encode_writes);
    RUN(the_first_line_alone);
    RUN(times_are_clamped_before_they_are_converted);
    return CHECK_DONE();
}
