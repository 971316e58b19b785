/* test_limit_redis.c: the Redis store's command and the reading of its reply (limits/limit_redis.h):
 * the arguments the script takes, a reply read as the verdict the local store would give, and
 * replies that are not the script's (garbage) refused. The script itself runs in a real Redis in
 * tests/integration/test_limits_redis.py. */
#include "limits/limit_redis.h"

#include <hiredis/hiredis.h>
#include <stdlib.h>

#include "../check.h"

static agw_limit_rule_t rate_rule(const char *name, uint64_t rate, uint64_t per_s, uint64_t burst)
{
    agw_limit_rule_t r = {.name = (char *)name, .key = AGW_LIMIT_KEY_IP, .rate = rate, .per_s = per_s, .burst = burst};
    agw_limit_rule_seal(&r);
    return r;
}

static agw_limit_rule_t quota_rule(const char *name, uint64_t quota, agw_limit_window_t w)
{
    agw_limit_rule_t r = {.name = (char *)name, .key = AGW_LIMIT_KEY_IP, .is_quota = 1, .quota = quota, .window = w};
    agw_limit_rule_seal(&r);
    return r;
}

static int arg_is(const agw_limit_redis_cmd_t *c, int i, const char *want)
{
    return i < c->argc && c->lens[i] == strlen(want) && memcmp(c->argv[i], want, c->lens[i]) == 0;
}

static void command_shape(void)
{
    agw_limit_rule_t r = rate_rule("per-ip", 10, 1, 3), q = quota_rule("daily", 1000, AGW_LIMIT_DAY);
    agw_limit_ask_t asks[2] = {{.rule = &r}, {.rule = &q}};
    const char *keys[2] = {"\x7f\0\0\x01", "app-1"};
    size_t lens[2] = {4, 5};
    agw_limit_redis_cmd_t c;
    agw_buf_t b = {0};
    uint64_t now = 1764600000000; /* 2025-12-01T14:40Z: the day ends at 1764633600000 */
    agw_limit_redis_command(&c, &b, 0, asks, keys, lens, 2, now);
    CHECK(c.argc == 3 + 2 + 1 + 6);
    CHECK(arg_is(&c, 0, "EVALSHA") && arg_is(&c, 1, agw_limit_redis_sha()) && arg_is(&c, 2, "2"));
    CHECK(c.lens[3] == 20 && memcmp(c.argv[3], "agw:rl:{per-ip}:\x7f\0\0\x01", 20) == 0);
    CHECK(arg_is(&c, 4, "agw:rl:{daily}:app-1") && arg_is(&c, 5, "1764600000000"));
    CHECK(arg_is(&c, 6, "r") && arg_is(&c, 7, "100000") && arg_is(&c, 8, "300000"));
    CHECK(arg_is(&c, 9, "q") && arg_is(&c, 10, "1000") && arg_is(&c, 11, "1764633600000"));
    CHECK(strlen(agw_limit_redis_sha()) == 40);
    agw_limit_redis_command(&c, &b, 1, asks, keys, lens, 1, now);
    CHECK(c.argc == 3 + 1 + 1 + 3 && arg_is(&c, 0, "EVAL") && c.lens[1] == agw_limit_redis_script_len &&
          memcmp(c.argv[1], agw_limit_redis_script, c.lens[1]) == 0);
    CHECK(agw_limit_redis_noscript("NOSCRIPT No matching script. Please use EVAL.") &&
          !agw_limit_redis_noscript("ERR x") && !agw_limit_redis_noscript(NULL));
    agw_buf_free(&b);
}

/* A reply built by hand: type and n integers (or a string element at bad_at >= 0). */
typedef struct fake_reply {
    redisReply top, el[16], *ptrs[16];
} fake_reply_t;

static const redisReply *array_of(fake_reply_t *f, size_t n, const long long *v, int bad_at)
{
    memset(f, 0, sizeof(*f));
    f->top.type = REDIS_REPLY_ARRAY;
    f->top.elements = n;
    f->top.element = f->ptrs;
    for (size_t i = 0; i < n; i++) {
        f->el[i].type = (int)i == bad_at ? REDIS_REPLY_STRING : REDIS_REPLY_INTEGER;
        f->el[i].integer = v[i];
        f->el[i].str = (char *)"x";
        f->el[i].len = 1;
        f->ptrs[i] = &f->el[i];
    }
    return &f->top;
}

static void verdicts(void)
{
    agw_limit_rule_t r = rate_rule("per-ip", 10, 1, 3), q = quota_rule("daily", 1000, AGW_LIMIT_DAY);
    agw_limit_ask_t asks[2] = {{.rule = &r}, {.rule = &q}};
    agw_limit_result_t res[2];
    agw_limit_verdict_t v = {.results = res};
    uint64_t now = 1764600000000;
    fake_reply_t f;
    /* accepted by both: the rate has fewer left, so it decides; policies from the rules */
    long long ok[] = {1, 1, 1, 200, 1, 999, 33600000};
    CHECK(agw_limit_redis_verdict(array_of(&f, 7, ok, -1), asks, 2, now, &v) == 0);
    CHECK(v.allowed == 1 && v.decisive == 0 && res[0].remaining == 1 && res[0].reset_ms == 200);
    CHECK(res[0].limit == 3 && res[0].window_s == 1 && res[1].limit == 1000 && res[1].window_s == 86400);
    /* refused by the quota alone: it decides */
    long long no[] = {0, 1, 2, 100, 0, 0, 33600000};
    CHECK(agw_limit_redis_verdict(array_of(&f, 7, no, -1), asks, 2, now, &v) == 0);
    CHECK(v.allowed == 0 && v.decisive == 1 && res[0].allowed == 1 && res[1].allowed == 0);
    /* garbage: each is refused */
    CHECK(agw_limit_redis_verdict(NULL, asks, 2, now, &v) == -1);
    CHECK(agw_limit_redis_verdict(array_of(&f, 4, ok, -1), asks, 2, now, &v) == -1);     /* count */
    CHECK(agw_limit_redis_verdict(array_of(&f, 7, ok, 3), asks, 2, now, &v) == -1);      /* a string */
    long long lie1[] = {1, 1, 1, 200, 0, 0, 33600000};                                    /* all vs. rules */
    long long lie2[] = {1, 1, 4, 200, 1, 999, 33600000};                                  /* over the burst */
    long long lie3[] = {1, 2, 1, 200, 1, 999, 33600000};                                  /* flag 2 */
    long long lie4[] = {1, 1, 1, 200, 1, 999, 86400001};                                  /* reset > window */
    long long lie5[] = {1, 1, 1, -5, 1, 999, 33600000};                                   /* negative */
    long long lie6[] = {0, 0, 1, 100, 1, 999, 33600000};                                  /* refused, remaining */
    long long *lies[] = {lie1, lie2, lie3, lie4, lie5, lie6};
    for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++)
        CHECK(agw_limit_redis_verdict(array_of(&f, 7, lies[i], -1), asks, 2, now, &v) == -1);
    redisReply s = {.type = REDIS_REPLY_STRING, .str = (char *)"OK", .len = 2};
    CHECK(agw_limit_redis_verdict(&s, asks, 2, now, &v) == -1);
}

int main(void)
{
    RUN(command_shape);
    RUN(verdicts);
    return CHECK_DONE();
}
