/* Route parameters (route/route_param.h), the router's 400 for a bad one (router.h), and the
 * error log's escaping (log.h). */
#include <stdlib.h>
#include <time.h>

#include "tests/check.h"
#include "base/log.h"
#include "route/route_param.h"
#include "script/router.h"

static int valid(const char *s)
{
    return agw_route_param_valid(s, strlen(s));
}

static void test_only_path_characters_reach_a_script(void)
{
    const char *ok[] = {"42", "Zo%C3%AB", "a-b.c_d~e", "!$&'()*+,=", "a:b@c", "%20", "%e2%82%ac", "%F0%9F%98%80",
                        /* dots that are not a dot segment */
                        "...", ".hidden", "..a", "a..", "v1.2"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        CHECK(valid(ok[i]));
    const char *bad[] = {
        "7#",       /* a fragment: the upstream path would end at 7 */
        "7\xff",    /* a raw byte that is not a URI character */
        "7%ff",     /* decodes to a byte that is not UTF-8 */
        "%C3",      /* half a character */
        "%C3x",     /* half a character, then a literal */
        "%c0%af",   /* an overlong '/' */
        "%ed%a0%80", /* a surrogate */
        "a%2Fb",    /* decodes to '/' */
        "a%3fb",    /* '?' */
        "a%23b",    /* '#' */
        "a%0Ab",    /* LF */
        "a%7F",     /* DEL */
        "a%00",     /* NUL */
        "%",        /* not %XX */
        "%4",       /* not %XX */
        "%zz",      /* not hex */
        "a b",      /* space */
        "a\"b", "a<b", "a>b", "a\\b", "a^b", "a`b", "a{b", "a|b", "a}b", "a[b", "a]b", "a?b",
        /* dot segments an upstream resolves: "/users/" .. id .. "/orders" would reach "/orders" */
        "%2e%2e", "%2E%2E", ".%2e", "%2e.", "%2e", "%2E", "..;", ".;", "%2e%2e;", "..;jsessionid=1", ".;x", "..%3Bx", "%2e%2e%3b",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (valid(bad[i]))
            fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(!valid(bad[i]));
    }
    CHECK(!agw_route_param_valid("a\0b", 3));
    /* a long run of escapes: whole characters pass, a broken one anywhere fails */
    char longv[3 * 200 + 1] = "";
    for (int i = 0; i < 100; i++)
        strcat(longv, "%C3%AB");
    CHECK(valid(longv));
    longv[3 * 150 + 1] = '4'; /* %C3 %4B…: breaks one character */
    CHECK(!valid(longv));
}

/* "/users/%61dmin" through an open "/users/{id}" must not reach the upstream path that a
 * protected "/users/admin" guards (upstreams decode %61, RFC 3986 §6.2.2.2, and strip ";x"), nor
 * "/items/%6Fk" make a second cache key for "/items/ok". */
static void test_a_parameter_has_one_spelling(void)
{
    const char *bad[] = {
        /* escaped unreserved characters (§2.3), either hex case */
        "%61dmin", "adm%69n", "%41DMIN", "%6Fk", "%6fk", "o%6B", "o%6b", "%4A", "%4a", "%5A", "%5a", "%7A", "%7a",
        "%30", "%39", "v1%2E2", "v1%2e2", "a%2Db", "a%2db", "a%5Fb", "a%5fb", "a%7Eb", "a%7eb", "%2e%2e%2e", "%2e%2ex",
        /* a path parameter, raw or escaped */
        "admin;x", "admin;", ";", ";..", "a;..", "!$&'()*+,;=", "admin%3Bx", "admin%3bx", "%3B",
        /* in a run of other escapes */
        "%C3%A9%61", "%20%7E",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (valid(bad[i]))
            fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(!valid(bad[i]));
    }
    /* escapes of other characters are other values, and stay */
    const char *ok[] = {"%20", "a%20b", "%C3%A9", "caf%c3%a9", "%2B", "1%2b1", "%25", "100%25", "%2C", "%40",
                        "%3A", "%21", "%27", "%3D", "%22", "%3C%3E", "%5B%5D", "%5C", "%5E", "%60", "%7B%7D", "%7C"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        if (!valid(ok[i]))
            fprintf(stderr, "refused: %s\n", ok[i]);
        CHECK(valid(ok[i]));
    }
    /* every ASCII escape, in both cases: refused exactly when it is unreserved, ';', a control
     * character or '/', '?', '#' */
    for (int c = 0; c < 0x80; c++) {
        int refused = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      strchr("-._~;/?#", c) != NULL || c < 0x20 || c == 0x7f;
        char upper[8], lower[8];
        snprintf(upper, sizeof(upper), "x%%%02Xy", (unsigned)c);
        snprintf(lower, sizeof(lower), "x%%%02xy", (unsigned)c);
        if (valid(upper) == refused || valid(lower) == refused)
            fprintf(stderr, "%s / %s: want %s\n", upper, lower, refused ? "refused" : "accepted");
        CHECK(valid(upper) == !refused);
        CHECK(valid(lower) == !refused);
    }
}

static agw_route_pattern_t *compile(const char *src, char *err, size_t errlen)
{
    return agw_route_pattern_compile(src, strlen(src), err, errlen);
}

static int matches(const char *pattern, const char *value)
{
    char err[256];
    agw_route_pattern_t *p = compile(pattern, err, sizeof(err));
    if (p == NULL) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    int m = agw_route_pattern_match(p, value, strlen(value));
    agw_route_pattern_free(p);
    return m;
}

static void test_patterns_match_the_whole_segment(void)
{
    CHECK(matches("[0-9]+", "42") == 1);
    CHECK(matches("[0-9]+", "") == 0);
    CHECK(matches("[0-9]+", "42a") == 0);
    CHECK(matches("[0-9]+", "a42") == 0);
    CHECK(matches("[0-9]{2,4}", "1") == 0);
    CHECK(matches("[0-9]{2,4}", "12") == 1);
    CHECK(matches("[0-9]{2,4}", "1234") == 1);
    CHECK(matches("[0-9]{2,4}", "12345") == 0);
    CHECK(matches("[0-9]{3}", "123") == 1);
    CHECK(matches("[0-9]{3}", "12") == 0);
    CHECK(matches("[a-z]{2,}", "abcdef") == 1);
    CHECK(matches("sku-[A-Z0-9]+", "sku-AB12") == 1);
    CHECK(matches("sku-[A-Z0-9]+", "SKU-AB12") == 0);
    CHECK(matches("v[0-9]?", "v") == 1);
    CHECK(matches("v[0-9]?", "v12") == 0);
    CHECK(matches("[^.]+", "abc") == 1);
    CHECK(matches("[^.]+", "a.c") == 0);
    CHECK(matches("a.c", "abc") == 1);
    CHECK(matches("a\\.c", "abc") == 0);
    CHECK(matches("a\\.c", "a.c") == 1);
    CHECK(matches("[a\\-z]+", "-az") == 1);
    CHECK(matches("[a\\-z]+", "b") == 0);
    CHECK(matches("[0-9]*x[0-9]*", "x") == 1);
    CHECK(matches("[0-9]*x[0-9]*", "12x34") == 1);
}

static void test_pattern_mistakes_say_what_is_wrong(void)
{
    struct {
        const char *src, *says;
    } cases[] = {
        {"[0-9+", "is not closed"},     {"", "empty"},       {"[]", "empty class"},  {"[z-a]", "backwards"},
        {"(a|b)", "not supported"},     {"a|b", "not supported"}, {"+a", "not supported"}, {"a{2", "a count"},
        {"a{3,2}", "n <= m"},           {"a{300}", "a count"}, {"a\\", "ends the pattern"}, {"^a", "not supported"},
        {"[0-9]+$", "not supported"},   {"a\xc3\xa9", "printable ASCII"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256] = "";
        agw_route_pattern_t *p = compile(cases[i].src, err, sizeof(err));
        CHECK(p == NULL);
        if (p == NULL && strstr(err, cases[i].says) == NULL)
            fprintf(stderr, "'%s' said: %s (wanted %s)\n", cases[i].src, err, cases[i].says);
        CHECK(p == NULL && strstr(err, cases[i].says) != NULL);
        agw_route_pattern_free(p);
    }
    char err[256];
    char many[2 * 40 + 1] = "";
    for (int i = 0; i < 40; i++)
        strcat(many, "a?");
    CHECK(compile(many, err, sizeof(err)) == NULL && strstr(err, "more than 32") != NULL);
}

/* What backtracking matchers take exponential or polynomial time on: linear here. */
static void test_matching_is_linear(void)
{
    size_t n = 200000;
    char *v = malloc(n + 1);
    memset(v, 'a', n);
    v[n] = '\0';
    clock_t t0 = clock();
    CHECK(matches("a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", v) == 0);
    CHECK(matches(".*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*", v) == 1);
    double cpu_s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    /* 2 x 17 atoms x 200,000 bytes: a few ms; a backtracking matcher would not finish. The bound is
     * CPU time, so a busy machine does not move it. */
    CHECK(cpu_s < 2.0);
    free(v);
}

static void test_router_answers_400_for_a_bad_parameter_of_a_routes_shape(void)
{
    agw_router_t r = {0};
    char err[256];
    agw_route_seg_t pub[] = {{.text = "pub", .len = 3}, {.text = "id", .len = 2, .is_param = 1}};
    agw_route_seg_t num[] = {{.text = "n", .len = 1},
                             {.text = "id", .len = 2, .is_param = 1, .pattern = "[0-9]+", .pattern_len = 6}};
    CHECK(agw_router_add(&r, "GET", "GET /pub/{id}", pub, 2, 1, err, sizeof(err)) == 0);
    CHECK(agw_router_add(&r, "GET", "GET /n/{id:[0-9]+}", num, 2, 2, err, sizeof(err)) == 0);
    agw_route_seg_t broken[] = {{.text = "id", .len = 2, .is_param = 1, .pattern = "[0-9", .pattern_len = 4}};
    CHECK(agw_router_add(&r, "GET", "GET /{id:[0-9}", broken, 1, 3, err, sizeof(err)) == -1);
    CHECK(strstr(err, "is not closed") != NULL);
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t np = 0;
    int ep = 0;
    char allow[64];
#define MATCH(path) agw_router_match(&r, "GET", 3, path, strlen(path), &ep, params, &np, allow, sizeof(allow))
    CHECK(MATCH("/pub/7") == AGW_ROUTE_FOUND && ep == 1 && np == 1 && params[0].value_len == 1);
    CHECK(MATCH("/pub/7#") == AGW_ROUTE_BAD_PARAM);
    CHECK(MATCH("/pub/7\xff") == AGW_ROUTE_BAD_PARAM);
    CHECK(MATCH("/pub/7%0A") == AGW_ROUTE_BAD_PARAM);
    CHECK(MATCH("/other/7#") == AGW_ROUTE_NOT_FOUND); /* no route of that shape */
    CHECK(MATCH("/n/42") == AGW_ROUTE_FOUND && ep == 2);
    CHECK(MATCH("/n/4x") == AGW_ROUTE_NOT_FOUND); /* the pattern narrows the route: 404 */
#undef MATCH
    agw_router_free(&r);
}

static void test_router_refuses_another_spelling_of_a_literal_route_through_a_parameter(void)
{
    agw_router_t r = {0};
    char err[256];
    agw_route_seg_t admin[] = {{.text = "users", .len = 5}, {.text = "admin", .len = 5}};
    agw_route_seg_t user[] = {{.text = "users", .len = 5}, {.text = "id", .len = 2, .is_param = 1}};
    agw_route_seg_t me[] = {{.text = "users", .len = 5}, {.text = "me:admin", .len = 8}};
    CHECK(agw_router_add(&r, "GET", "GET /users/admin", admin, 2, 1, err, sizeof(err)) == 0);
    CHECK(agw_router_add(&r, "GET", "GET /users/me:admin", me, 2, 3, err, sizeof(err)) == 0);
    CHECK(agw_router_add(&r, "GET", "GET /users/{id}", user, 2, 2, err, sizeof(err)) == 0);
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t np = 0;
    int ep = 0;
    char allow[64];
#define MATCH(path) agw_router_match(&r, "GET", 3, path, strlen(path), &ep, params, &np, allow, sizeof(allow))
    CHECK(MATCH("/users/admin") == AGW_ROUTE_FOUND && ep == 1);
    CHECK(MATCH("/users/42") == AGW_ROUTE_FOUND && ep == 2);
    /* another spelling of a literal segment is the literal route's, in either hex case (a review:
     * %3A reached the parameter route beside GET /users/me:admin) */
    CHECK(MATCH("/users/%61dmin") == AGW_ROUTE_FOUND && ep == 1);
    CHECK(MATCH("/users/adm%69n") == AGW_ROUTE_FOUND && ep == 1);
    CHECK(MATCH("/%75sers/%41dmin") == AGW_ROUTE_BAD_PARAM); /* (%41 is 'A': the parameter's, refused) */
    CHECK(MATCH("/%75sers/admin") == AGW_ROUTE_FOUND && ep == 1);
    CHECK(MATCH("/users/me:admin") == AGW_ROUTE_FOUND && ep == 3);
    CHECK(MATCH("/users/me%3Aadmin") == AGW_ROUTE_FOUND && ep == 3);
    CHECK(MATCH("/users/me%3aadmin") == AGW_ROUTE_FOUND && ep == 3);
    CHECK(MATCH("/users/me%40admin") == AGW_ROUTE_FOUND && ep == 2); /* '@': another segment */
    CHECK(MATCH("/users/me%3") == AGW_ROUTE_BAD_PARAM);               /* a malformed escape */
    CHECK(MATCH("/users/%6") == AGW_ROUTE_BAD_PARAM);
    /* what no literal route is: a parameter's escapes of unreserved characters and ';' are refused */
    CHECK(MATCH("/users/%62ob") == AGW_ROUTE_BAD_PARAM);
    CHECK(MATCH("/users/admin;x") == AGW_ROUTE_BAD_PARAM);
    CHECK(MATCH("/users/admin%3Bx") == AGW_ROUTE_BAD_PARAM);
#undef MATCH
    agw_router_free(&r);
}

static void test_log_escapes_control_characters(void)
{
    char out[128];
    const char in[] = "a\nb\rc\td\x0b" "e\x0c" "f\x1b[31mg\x7fh\0i";
    size_t n = agw_log_escape(out, sizeof(out), in, sizeof(in) - 1);
    CHECK_STR(out, "a\\nb\\rc\td\\x0be\\x0cf\\x1b[31mg\\x7fh\\x00i");
    CHECK(n == strlen(out));
    /* cut before an escape that does not fit, never in the middle of one */
    n = agw_log_escape(out, 4, "ab\ncd", 5);
    CHECK_STR(out, "ab");
}

int main(void)
{
    RUN(test_only_path_characters_reach_a_script);
    RUN(test_a_parameter_has_one_spelling);
    RUN(test_patterns_match_the_whole_segment);
    RUN(test_pattern_mistakes_say_what_is_wrong);
    RUN(test_matching_is_linear);
    RUN(test_router_answers_400_for_a_bad_parameter_of_a_routes_shape);
    RUN(test_router_refuses_another_spelling_of_a_literal_route_through_a_parameter);
    RUN(test_log_escapes_control_characters);
    return CHECK_DONE();
}
