/* test_lru.c: the first cache tier (cache/lru.h): bounded by bytes, least recently used out first,
 * expiry, prefix purge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/lru.h"
#include "tests/check.h"

static const char *get(agw_lru_t *c, const char *k, uint64_t now)
{
    size_t n;
    const char *v = agw_lru_get(c, k, strlen(k), &n, now);
    static char out[256];
    if (!v)
        return NULL;
    memcpy(out, v, n);
    out[n] = '\0';
    return out;
}

static void set(agw_lru_t *c, const char *k, const char *v, uint64_t exp)
{
    agw_lru_set(c, k, strlen(k), v, strlen(v), exp);
}

static void stores_and_replaces(void)
{
    agw_lru_stats_t st = {0};
    agw_lru_t *c = agw_lru_new(1 << 20, &st);
    set(c, "a", "one", 100);
    CHECK_STR(get(c, "a", 0), "one");
    set(c, "a", "two", 100);
    CHECK_STR(get(c, "a", 0), "two");
    CHECK(st.entries == 1 && st.bytes == 1 + 3 + AGW_LRU_OVERHEAD);
    CHECK(get(c, "b", 0) == NULL);
    CHECK(agw_lru_del(c, "a", 1) == 1 && get(c, "a", 0) == NULL && st.entries == 0 && st.bytes == 0);
    agw_lru_free(c);
}

static void expired_entries_miss_and_go(void)
{
    agw_lru_stats_t st = {0};
    agw_lru_t *c = agw_lru_new(1 << 20, &st);
    set(c, "a", "one", 100);
    CHECK_STR(get(c, "a", 99), "one");
    CHECK(get(c, "a", 100) == NULL);
    CHECK(st.entries == 0 && st.evictions == 0);
    agw_lru_free(c);
}

static void least_recently_used_goes_first_and_bytes_stay_bounded(void)
{
    agw_lru_stats_t st = {0};
    size_t max = 10 * (AGW_LRU_OVERHEAD + 2 + 10);
    agw_lru_t *c = agw_lru_new(max, &st);
    char k[8];
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        set(c, k, "0123456789", 1000);
    }
    CHECK(st.entries == 10 && st.bytes == max);
    CHECK(get(c, "k0", 0) != NULL); /* k0 is now the most recent: k1 goes first */
    set(c, "kX", "0123456789", 1000);
    CHECK(get(c, "k1", 0) == NULL && get(c, "k0", 0) != NULL && get(c, "kX", 0) != NULL);
    CHECK(st.evictions == 1 && st.bytes <= max);
    for (int i = 0; i < 10000; i++) {
        snprintf(k, sizeof(k), "m%d", i);
        set(c, k, "0123456789", 1000);
        CHECK(st.bytes <= max);
    }
    agw_lru_resize(c, max / 2);
    CHECK(st.bytes <= max / 2 && st.entries == (max / 2) / (AGW_LRU_OVERHEAD + 5 + 10));
    agw_lru_free(c);
}

static void oversized_values_are_refused(void)
{
    agw_lru_t *c = agw_lru_new(4096, NULL);
    char big[2000];
    memset(big, 'x', sizeof(big));
    set(c, "a", "small", 10);
    CHECK(agw_lru_set(c, "a", 1, big, sizeof(big), 10) == -1);
    CHECK(get(c, "a", 0) == NULL); /* the old value does not survive a refused replacement */
    agw_lru_free(c);
}

static void purge_by_prefix(void)
{
    agw_lru_t *c = agw_lru_new(1 << 20, NULL);
    set(c, "product:1", "a", 10);
    set(c, "product:2", "b", 10);
    set(c, "reviews:1", "c", 10);
    CHECK(agw_lru_purge_prefix(c, "product:", 8) == 2);
    CHECK(get(c, "product:1", 0) == NULL && get(c, "reviews:1", 0) != NULL);
    CHECK(agw_lru_purge_prefix(c, "", 0) == 1);
    agw_lru_free(c);
}

static void a_mark_is_the_callers_until_the_value_is_replaced(void)
{
    agw_lru_t *c = agw_lru_new(1 << 20, NULL);
    size_t n;
    uint32_t *mark;
    set(c, "k", "v1", 100);
    CHECK(agw_lru_get_mark(c, "k", 1, &n, 0, &mark) != NULL && *mark == 0);
    *mark = 7;
    CHECK(agw_lru_get_mark(c, "k", 1, &n, 0, &mark) != NULL && *mark == 7); /* kept between hits */
    set(c, "k", "v2", 100);
    CHECK(agw_lru_get_mark(c, "k", 1, &n, 0, &mark) != NULL && *mark == 0); /* new bytes, new mark */
    CHECK(agw_lru_get_mark(c, "k", 1, &n, 200, &mark) == NULL);             /* expired */
    agw_lru_free(c);
}

/* A value stored in parts reads back as the parts one after the other, empty parts included,
 * and counts as many bytes as the same value stored whole. */
static void parts_are_stored_as_one_value(void)
{
    agw_lru_stats_t st = {0};
    agw_lru_t *c = agw_lru_new(1 << 20, &st);
    const struct iovec parts[4] = {{"AGWC1 ", 6}, {"", 0}, {"hdr\0v\0", 6}, {"{}", 2}};
    CHECK(agw_lru_set_parts(c, "k", 1, parts, 4, 100) == 0);
    size_t vlen = 0;
    const char *v = agw_lru_get(c, "k", 1, &vlen, 0);
    CHECK(v != NULL && vlen == 14 && memcmp(v, "AGWC1 hdr\0v\0{}", 14) == 0);
    CHECK(st.entries == 1 && st.bytes == 1 + 14 + AGW_LRU_OVERHEAD);
    agw_lru_free(c);
}

/* Keys that share one bucket (found by trying, as a client that makes keys would): the bucket
 * keeps at most AGW_LRU_CHAIN_MAX of them, the newest are found, and the entries of other buckets
 * stay. */
static void one_bucket_holds_at_most_chain_max_entries(void)
{
    agw_lru_stats_t st = {0};
    agw_lru_t *c = agw_lru_new(1 << 24, &st);
    char keys[40][32], other[32];
    size_t n = 0, target = agw_lru_bucket_of(c, "agw:{p}:1:GET /p/0", 18);
    for (unsigned i = 0;; i++) { /* an entry of another bucket */
        int len = snprintf(other, sizeof(other), "other %u", i);
        if (agw_lru_bucket_of(c, other, (size_t)len) != target)
            break;
    }
    set(c, other, "kept", 1000000);
    for (unsigned i = 1; i < 2000000 && n < 40; i++) {
        int len = snprintf(keys[n], sizeof(keys[n]), "agw:{p}:1:GET /p/%u", i);
        if (agw_lru_bucket_of(c, keys[n], (size_t)len) == target)
            n++;
    }
    CHECK(n == 40);
    for (size_t i = 0; i < n; i++)
        set(c, keys[i], "v", 1000 + i); /* (the first ones end first) */
    CHECK(agw_lru_longest_chain(c) <= AGW_LRU_CHAIN_MAX);
    CHECK(st.entries == AGW_LRU_CHAIN_MAX + 1 && st.evictions == 40 - AGW_LRU_CHAIN_MAX);
    for (size_t i = n - AGW_LRU_CHAIN_MAX; i < n; i++)
        CHECK_STR(get(c, keys[i], 0), "v");
    CHECK(get(c, keys[0], 0) == NULL);
    CHECK_STR(get(c, other, 0), "kept");
    agw_lru_free(c);
}

int main(void)
{
    RUN(one_bucket_holds_at_most_chain_max_entries);
    RUN(a_mark_is_the_callers_until_the_value_is_replaced);
    RUN(stores_and_replaces);
    RUN(parts_are_stored_as_one_value);
    RUN(expired_entries_miss_and_go);
    RUN(least_recently_used_goes_first_and_bytes_stay_bounded);
    RUN(oversized_values_are_refused);
    RUN(purge_by_prefix);
    return CHECK_DONE();
}
