/* test_resp_headers.c: script/resp_headers.h's lane for known names (agw_resp_known_t) gives what
 * the rules give, for fixed tables and a seeded random run of tables that mix known names, other
 * spellings, owned names, odd values and lists, and it takes the tables it is for; and
 * agw_resp_known_init refuses a list the rules would change. */
#include "tests/check.h"
#include "script/resp_headers.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the worker's list (worker/respond.c): cache-control, content-type, retry-after, vary,
 * x-aggregation-completed */
extern const char *const agw_worker_own_headers[];

static lua_State *L;
static agw_resp_known_t known;

/* The warnings of one read, joined with newlines. */
static char warned[8192];
static size_t nwarned;

static void on_warn(void *data, const char *msg)
{
    (void)data;
    int n = snprintf(warned + nwarned, sizeof(warned) - nwarned, "%s\n", msg);
    if (n > 0 && (size_t)n < sizeof(warned) - nwarned)
        nwarned += (size_t)n;
}

/* Reads the table at the top of L with the lane and without; CHECKs that the sets and the
 * warnings are the same. Returns 1 when the lane took the table (its bytes hold each name once:
 * the rules keep the name as given and lowercased beside each value). */
static int same_both_ways(const char *what)
{
    agw_resp_headers_t a = AGW_RESP_HEADERS_INIT, b = AGW_RESP_HEADERS_INIT;
    int top = lua_gettop(L);
    nwarned = 0;
    agw_resp_headers_read(&a, L, -1, &known, on_warn, NULL);
    char wa[sizeof(warned)];
    memcpy(wa, warned, nwarned + 1);
    warned[0] = '\0';
    nwarned = 0;
    agw_resp_headers_read(&b, L, -1, NULL, on_warn, NULL);
    CHECK(lua_gettop(L) == top);
    int same = a.n == b.n && strcmp(wa, warned) == 0;
    for (size_t i = 0; same && i < a.n; i++)
        same = a.h[i].name_len == b.h[i].name_len && a.h[i].value_len == b.h[i].value_len &&
               memcmp(a.h[i].name, b.h[i].name, a.h[i].name_len) == 0 &&
               memcmp(a.h[i].value, b.h[i].value, a.h[i].value_len) == 0;
    if (!same) {
        fprintf(stderr, "  %s: the lane gave %zu headers, the rules %zu\n", what, a.n, b.n);
        check_failures++;
    }
    size_t once = 0;
    for (size_t i = 0; i < a.n; i++)
        once += a.h[i].name_len + a.h[i].value_len;
    int took = a.n > 0 && a.bytes.len == once && b.bytes.len != once;
    agw_resp_headers_free(&a);
    agw_resp_headers_free(&b);
    warned[0] = '\0';
    nwarned = 0;
    return took;
}

static void set_str(const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void test_a_page_s_own_headers_take_the_lane(void)
{
    lua_newtable(L);
    set_str("x-aggregation-completed", "true");
    set_str("cache-control", "max-age=60");
    CHECK(same_both_ways("a complete page"));
    agw_resp_headers_t s = AGW_RESP_HEADERS_INIT;
    agw_resp_headers_read(&s, L, -1, &known, NULL, NULL);
    CHECK(s.n == 2);
    CHECK(s.h[0].name_len == 13 && memcmp(s.h[0].name, "cache-control", 13) == 0);
    CHECK(s.h[0].value_len == 10 && memcmp(s.h[0].value, "max-age=60", 10) == 0);
    CHECK(s.h[1].name_len == 23 && memcmp(s.h[1].name, "x-aggregation-completed", 23) == 0);
    CHECK(s.h[1].value_len == 4 && memcmp(s.h[1].value, "true", 4) == 0);
    CHECK(agw_resp_headers_find(&s, "cache-control", 13) == &s.h[0]);
    agw_resp_headers_free(&s);
    lua_pop(L, 1);

    lua_newtable(L); /* a problem page's */
    set_str("content-type", "application/problem+json");
    set_str("cache-control", "no-store");
    set_str("x-aggregation-completed", "false");
    set_str("retry-after", "3");
    set_str("vary", "accept-language, x-tenant");
    CHECK(same_both_ways("a problem page"));
    lua_pop(L, 1);

    lua_newtable(L); /* none */
    CHECK(!same_both_ways("an empty table"));
    lua_pop(L, 1);
}

static void test_anything_else_goes_to_the_rules(void)
{
    static const struct {
        const char *k, *v;
    } odd[] = {
        {"Cache-Control", "max-age=1"}, /* another spelling */
        {"x-other", "1"},               /* not known */
        {"cache-control", " no-store"}, /* spaces around the value */
        {"cache-control", "no-store\t"},
        {"cache-control", ""},
        {"cache-control", "a\r\nx-injected: 1"}, /* a control character */
        {"date", "Thu, 01 Jan 1970 00:00:00 GMT"},
        {"content-length", "5"},
    };
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        lua_newtable(L);
        set_str("x-aggregation-completed", "true");
        set_str(odd[i].k, odd[i].v);
        CHECK(!same_both_ways(odd[i].k));
        lua_pop(L, 1);
    }
    lua_newtable(L); /* a number value, a list, a boolean, a long value */
    lua_pushnumber(L, 5);
    lua_setfield(L, -2, "retry-after");
    CHECK(!same_both_ways("a number"));
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 2, 0);
    lua_pushstring(L, "a");
    lua_rawseti(L, -2, 1);
    lua_pushstring(L, "b");
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "vary");
    CHECK(!same_both_ways("a list"));
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "vary");
    CHECK(!same_both_ways("a boolean"));
    lua_pop(L, 1);
    lua_newtable(L);
    char *big = malloc(AGW_RESP_HEADER_VALUE_MAX + 2);
    memset(big, 'a', AGW_RESP_HEADER_VALUE_MAX + 1);
    big[AGW_RESP_HEADER_VALUE_MAX + 1] = '\0';
    set_str("cache-control", big);
    CHECK(!same_both_ways("a value over the limit"));
    big[AGW_RESP_HEADER_VALUE_MAX] = '\0';
    set_str("cache-control", big);
    CHECK(same_both_ways("a value at the limit"));
    free(big);
    lua_pop(L, 1);
}

/* Tables of random entries from pools of names and values: whatever the mix, the same set. */
static void test_random_tables_give_the_same_set(void)
{
    static const char *const NAMES[] = {"cache-control", "content-type", "retry-after", "vary",
                                        "x-aggregation-completed", "Cache-Control", "CONTENT-TYPE", "x-a",
                                        "date", "te", "x y", "set-cookie"};
    static const char *const VALUES[] = {"no-store", "true", "false", "max-age=5", " x", "x ", "", "a\x01b",
                                         "private, max-age=3", "\xc3\xa9t\xc3\xa9", "a\tb"};
    unsigned seed = 12345, lane = 0;
    const size_t nn = sizeof(NAMES) / sizeof(NAMES[0]), nv = sizeof(VALUES) / sizeof(VALUES[0]);
    for (int round = 0; round < 3000; round++) {
        lua_newtable(L);
        int entries = (int)(rand_r(&seed) % 6);
        for (int e = 0; e < entries; e++) {
            /* (known names four times as often: tables the lane takes come up) */
            unsigned r = (unsigned)rand_r(&seed);
            const char *k = r % 5 ? NAMES[r % 5] : NAMES[(r / 5) % nn];
            unsigned kind = (unsigned)rand_r(&seed) % 10;
            if (kind == 0) {
                lua_pushinteger(L, rand_r(&seed) % 100);
            } else if (kind == 1) {
                lua_createtable(L, 1, 0);
                lua_pushstring(L, VALUES[(unsigned)rand_r(&seed) % nv]);
                lua_rawseti(L, -2, 1);
            } else {
                lua_pushstring(L, kind < 6 ? VALUES[(unsigned)rand_r(&seed) % 4] : VALUES[(unsigned)rand_r(&seed) % nv]);
            }
            lua_setfield(L, -2, k);
        }
        lane += (unsigned)same_both_ways("a random table");
        lua_pop(L, 1);
    }
    CHECK(lane > 300); /* (the lane took a fair part of them) */
}

static void test_a_list_the_rules_would_change_is_refused(void)
{
    agw_resp_known_t k;
    static const char *const upper[] = {"Cache-Control", NULL};
    static const char *const unsorted[] = {"vary", "cache-control", NULL};
    static const char *const twice[] = {"vary", "vary", NULL};
    static const char *const owned[] = {"connection", NULL};
    static const char *const date[] = {"date", NULL};
    static const char *const not_token[] = {"x y", NULL};
    static const char *const many[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", NULL};
    const char *const *bad[] = {upper, unsorted, twice, owned, date, not_token, many};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(agw_resp_known_init(&k, L, bad[i]) == -1);
        CHECK(k.n == 0);
    }
    /* the worker's list: a mistake in it would turn its lane off */
    CHECK(agw_resp_known_init(&k, L, agw_worker_own_headers) == 0);
    CHECK(k.n == 5);
}

/* A table of 100 fields and a cache-control (the runtime's `private` on a copy of a script's
 * table): 64 fields are read, and the cache-control always, whatever the table's order. */
static void test_a_cache_control_past_the_cap_is_kept(void)
{
    for (int round = 0; round < 50; round++) {
        lua_newtable(L);
        char k[32];
        for (int i = 0; i < 100; i++) {
            snprintf(k, sizeof(k), "x-f%d-%d", round, i);
            set_str(k, "v");
        }
        set_str("cache-control", "private");
        agw_resp_headers_t set = AGW_RESP_HEADERS_INIT;
        nwarned = 0;
        agw_resp_headers_read(&set, L, -1, NULL, on_warn, NULL);
        CHECK(set.n == AGW_RESP_HEADERS_MAX || set.n == AGW_RESP_HEADERS_MAX + 1);
        const agw_resp_header_t *cc = agw_resp_headers_find(&set, "cache-control", 13);
        CHECK(cc != NULL && cc->value_len == 7 && memcmp(cc->value, "private", 7) == 0);
        CHECK(strstr(warned, "more than 64 response headers") != NULL);
        agw_resp_headers_free(&set);
        warned[0] = '\0';
        nwarned = 0;
        lua_pop(L, 1);
    }
}

int main(void)
{
    L = luaL_newstate();
    luaL_openlibs(L);
    if (agw_resp_known_init(&known, L, agw_worker_own_headers) != 0) {
        fprintf(stderr, "the known names were refused\n");
        return 1;
    }
    RUN(test_a_page_s_own_headers_take_the_lane);
    RUN(test_anything_else_goes_to_the_rules);
    RUN(test_random_tables_give_the_same_set);
    RUN(test_a_list_the_rules_would_change_is_refused);
    RUN(test_a_cache_control_past_the_cap_is_kept);
    lua_close(L);
    return CHECK_DONE();
}
