/* test_limit.c: the limiter's arithmetic on an explicit clock (limits/limit.h). */
#include "limits/limit.h"

#include <sys/socket.h>
#include <pthread.h>
#include <string.h>
#include <stdlib.h>

#include "../check.h"
#include "rules.h"

/* 10 a second, burst 5: five at once, the sixth refused with a wait of 100 ms, one more after it */
static void rate_burst_then_steady(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t r = rate_rule("r", 10, 1, 5);
    uint64_t h = agw_limit_hash(&r, "1.2.3.4", 7), now = 1700000000000;
    agw_limit_result_t res;
    for (int i = 0; i < 5; i++) {
        CHECK(agw_limit_take(s, &r, h, now, &res) == 1);
        CHECK(res.remaining == (uint64_t)(4 - i));
        CHECK(res.limit == 5 && res.window_s == 1);
    }
    CHECK(agw_limit_take(s, &r, h, now, &res) == 0);
    CHECK(res.remaining == 0 && res.reset_ms == 100);
    CHECK(agw_limit_take(s, &r, h, now + 99, &res) == 0);
    CHECK(agw_limit_take(s, &r, h, now + 100, &res) == 1 && res.remaining == 0);
    /* over 10 s once the burst is spent: exactly 10 a second */
    int ok = 0;
    for (uint64_t t = now + 101; t < now + 10101; t++)
        ok += agw_limit_take(s, &r, h, t, &res);
    CHECK(ok == 100);
    /* another key has its own bucket */
    CHECK(agw_limit_take(s, &r, agw_limit_hash(&r, "5.6.7.8", 7), now + 10101, &res) == 1 && res.remaining == 4);
    agw_limit_store_free(s);
}

/* A rate whose interval is no whole number of µs is never counted over: 700,000 a second, burst
 * 1,000, taken as fast as it answers at every ms tick for 2 s, accepts at most the burst and
 * 1,400,000 (the interval truncated to 1 µs accepted 2,000,000: an attack review); 3 a second,
 * burst 3, at most the burst and 3 a second. */
static void a_rate_is_never_counted_over(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t fast = rate_rule("fast", 700000, 1, 1000), slow = rate_rule("slow", 3, 1, 3);
    uint64_t h = agw_limit_hash(&fast, "1.2.3.4", 7), now = 1700000000000;
    agw_limit_result_t res;
    long ok = 0;
    for (uint64_t t = now; t < now + 2000; t++)
        for (int i = 0; i < 4000 && agw_limit_take(s, &fast, h, t, &res) == 1; i++)
            ok++;
    CHECK(ok <= 1000 + 1400000 && ok >= 1000000);
    if (ok > 1000 + 1400000 || ok < 1000000)
        fprintf(stderr, "700,000 a second accepted %ld in 2 s\n", ok);
    h = agw_limit_hash(&slow, "1.2.3.4", 7);
    ok = 0;
    for (uint64_t t = now; t < now + 10000; t++)
        ok += agw_limit_take(s, &slow, h, t, &res);
    CHECK(ok <= 3 + 30 && ok >= 30); /* the burst, then 3 a second for 10 s */
    agw_limit_store_free(s);
}

/* a daily quota resets at 00:00 UTC; a month's at the first of the next month */
static void quota_windows_reset_at_utc_boundaries(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t r = quota_rule("daily", 3, AGW_LIMIT_DAY);
    uint64_t h = agw_limit_hash(&r, "k", 1);
    uint64_t before_midnight = UINT64_C(1764633599000); /* 2025-12-01T23:59:59Z */
    agw_limit_result_t res;
    for (int i = 0; i < 3; i++)
        CHECK(agw_limit_take(s, &r, h, before_midnight, &res) == 1);
    CHECK(agw_limit_take(s, &r, h, before_midnight + 999, &res) == 0);
    CHECK(res.reset_ms == 1 && res.window_s == 86400);
    CHECK(agw_limit_take(s, &r, h, before_midnight + 1000, &res) == 1 && res.remaining == 2);
    CHECK(res.reset_ms == 86400000);
    uint64_t a, b;
    agw_limit_window_bounds(AGW_LIMIT_MONTH, UINT64_C(1709164800000), &a, &b); /* 2024-02-29T00:00Z */
    CHECK(a == UINT64_C(1706745600000) && b == UINT64_C(1709251200000));  /* Feb 1 .. Mar 1 2024 */
    agw_limit_window_bounds(AGW_LIMIT_MONTH, UINT64_C(1767225599000), &a, &b); /* 2025-12-31T23:59:59Z */
    CHECK(a == UINT64_C(1764547200000) && b == UINT64_C(1767225600000));
    agw_limit_window_bounds(AGW_LIMIT_HOUR, UINT64_C(1764633599000), &a, &b);
    CHECK(a == UINT64_C(1764630000000) && b == UINT64_C(1764633600000));
    agw_limit_store_free(s);
}

/* two rules: the second refuses, the first's take is given back; the refusing rule decides */
static void refused_request_is_not_counted(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t rate = rate_rule("per-ip", 100, 1, 10), quota = quota_rule("daily", 2, AGW_LIMIT_DAY);
    agw_limit_ask_t asks[2] = {{&rate, agw_limit_hash(&rate, "a", 1)}, {&quota, agw_limit_hash(&quota, "a", 1)}};
    agw_limit_result_t res[2];
    agw_limit_verdict_t v = {.results = res};
    uint64_t now = UINT64_C(1764590400000); /* noon */
    CHECK(agw_limit_check(s, asks, 2, now, &v) == 1 && v.decisive == 1 && res[1].remaining == 1);
    CHECK(agw_limit_check(s, asks, 2, now, &v) == 1 && v.decisive == 1);
    for (int i = 0; i < 5; i++) {
        CHECK(agw_limit_check(s, asks, 2, now, &v) == 0);
        CHECK(v.decisive == 1 && res[1].reset_ms == 12 * 3600000);
    }
    agw_limit_result_t peek;
    agw_limit_peek(s, &rate, asks[0].hash, now, &peek);
    CHECK(peek.remaining == 8); /* two accepted, five refused: two counted */
    /* the most restrictive accepted rule is the one with the fewest left */
    agw_limit_rule_t tight = rate_rule("tight", 1, 1, 1);
    agw_limit_ask_t two[2] = {{&rate, asks[0].hash}, {&tight, agw_limit_hash(&tight, "a", 1)}};
    CHECK(agw_limit_check(s, two, 2, now, &v) == 1 && v.decisive == 1);
    CHECK(agw_limit_check(s, two, 2, now, &v) == 0 && v.decisive == 1 && res[1].reset_ms == 1000);
    agw_limit_store_free(s);
}

/* a peek of a spent rate says when the next request fits, as a refused take does, and counts
 * nothing; a quota's peek and an accepted one are agw_limit_peek's */
static void peek_next_says_when_one_fits(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t r = rate_rule("slow", 1, 10, 5); /* one per 10 s, a bucket of 5: full in 50 s */
    uint64_t h = agw_limit_hash(&r, "a", 1), now = UINT64_C(1764590400000);
    agw_limit_result_t peek, take;
    agw_limit_peek_next(s, &r, h, now, &peek);
    CHECK(peek.allowed && peek.remaining == 5);
    for (int i = 0; i < 5; i++)
        CHECK(agw_limit_take(s, &r, h, now, &take) == 1);
    agw_limit_peek(s, &r, h, now, &peek);
    CHECK(!peek.allowed && peek.reset_ms == 50000); /* the plain peek: until full */
    agw_limit_peek_next(s, &r, h, now, &peek);
    CHECK(agw_limit_take(s, &r, h, now, &take) == 0);
    CHECK(!peek.allowed && peek.remaining == 0 && peek.reset_ms == take.reset_ms && take.reset_ms == 10000);
    CHECK(peek.limit == 5 && peek.window_s == 50);
    agw_limit_peek_next(s, &r, h, now + 9999, &peek);
    CHECK(!peek.allowed && peek.reset_ms == 1);
    agw_limit_peek_next(s, &r, h, now + 10000, &peek);
    CHECK(peek.allowed && peek.remaining == 1);
    CHECK(agw_limit_take(s, &r, h, now + 10000, &take) == 1); /* the peeks counted nothing */
    agw_limit_rule_t q = quota_rule("daily", 1, AGW_LIMIT_DAY);
    uint64_t hq = agw_limit_hash(&q, "a", 1);
    CHECK(agw_limit_take(s, &q, hq, now, &take) == 1);
    agw_limit_peek_next(s, &q, hq, now, &peek);
    CHECK(!peek.allowed && peek.reset_ms == 12 * 3600000); /* noon: the day ends in 12 h */
    agw_limit_store_free(s);
}

/* a full table lets through uncounted and says so; expired slots are taken over */
static void full_table_and_takeover(void)
{
    agw_limit_store_t *s = agw_limit_store_new(64);
    agw_limit_rule_t r = rate_rule("r", 1, 1, 1);
    agw_limit_result_t res;
    uint64_t now = 1000000;
    for (unsigned i = 0; i < 64; i++) /* every slot live for a second */
        CHECK(agw_limit_take(s, &r, (uint64_t)i + 1, now, &res) == 1);
    CHECK(agw_limit_store_full(s) == 0);
    CHECK(agw_limit_take(s, &r, 1000, now, &res) == 1 && agw_limit_store_full(s) == 1);
    CHECK(agw_limit_take(s, &r, 1000, now + 1000, &res) == 1 && agw_limit_store_full(s) == 1);
    CHECK(agw_limit_take(s, &r, 1000, now + 1000, &res) == 0); /* now counted in a taken-over slot */
    agw_limit_store_free(s);
}

/* workers at once on one key: exactly burst accepted */
struct race { agw_limit_store_t *s; agw_limit_rule_t *r; uint64_t h; int ok; };
static void *racer(void *p)
{
    struct race *x = p;
    agw_limit_result_t res;
    for (int i = 0; i < 20000; i++)
        x->ok += agw_limit_take(x->s, x->r, x->h, 5000, &res);
    return NULL;
}
static void concurrent_takes_are_exact(void)
{
    agw_limit_store_t *s = agw_limit_store_new(1024);
    agw_limit_rule_t r = rate_rule("r", 1, 3600, 1000);
    struct race x[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        x[i] = (struct race){s, &r, agw_limit_hash(&r, "same", 4), 0};
        pthread_create(&t[i], NULL, racer, &x[i]);
    }
    int total = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        total += x[i].ok;
    }
    CHECK(total == 1000);
    agw_limit_store_free(s);
}

/* The "ip" key of an address in text (agw_limit_ip_key_of_text, as the admin page reads it) copied
 * to out; their length. */
static size_t ip_key(const char *text, char out[16])
{
    unsigned char a[16];
    const char *k = NULL;
    size_t n = agw_limit_ip_key_of_text(text, a, &k);
    if (n)
        memcpy(out, k, n);
    return n;
}

static void ip_keys_count_ipv6_by_its_64_and_mapped_ipv4_as_ipv4(void)
{
    char a[16], b[16];
    CHECK(ip_key("192.0.2.7", a) == 4 && memcmp(a, "\xc0\x00\x02\x07", 4) == 0);
    /* a client's fresh addresses in its /64 share one count; another /64 has its own */
    CHECK(ip_key("2001:db8:1:2::1", a) == 8 && ip_key("2001:db8:1:2:ffff:1:2:3", b) == 8 && memcmp(a, b, 8) == 0);
    CHECK(ip_key("2001:db8:1:3::1", b) == 8 && memcmp(a, b, 8) != 0);
    /* a dual-stack listener's IPv4 clients: each its own count, the same as over IPv4 */
    CHECK(ip_key("::ffff:192.0.2.7", a) == 4 && memcmp(a, "\xc0\x00\x02\x07", 4) == 0);
    CHECK(ip_key("::ffff:192.0.2.8", b) == 4 && memcmp(a, b, 4) != 0);
    const char *k = NULL;
    CHECK(agw_limit_ip_key(AF_UNIX, "x", &k) == 0);
    CHECK(ip_key("not-an-address", a) == 0);
}

int main(void)
{
    RUN(rate_burst_then_steady);
    RUN(a_rate_is_never_counted_over);
    RUN(ip_keys_count_ipv6_by_its_64_and_mapped_ipv4_as_ipv4);
    RUN(quota_windows_reset_at_utc_boundaries);
    RUN(refused_request_is_not_counted);
    RUN(peek_next_says_when_one_fits);
    RUN(full_table_and_takeover);
    RUN(concurrent_takes_are_exact);
    return CHECK_DONE();
}
