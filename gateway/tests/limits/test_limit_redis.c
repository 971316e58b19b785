/* test_limit_redis.c: the Redis store's command and the reading of its reply (limits/limit_redis.h):
 * the arguments the script takes, a reply read as the verdict the local store would give, and
 * replies that are not the script's (garbage) refused. With a port argument (test_limits_redis.py
 * starts the redis-server and passes it), the commands also run in that Redis: EVALSHA answered
 * NOSCRIPT, EVAL, then EVALSHA, read back as verdicts. */
#include "limits/limit_redis.h"

#include <hiredis/hiredis.h>
#include <stdlib.h>

#include "../check.h"
#include "rules.h"

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
    agw_limit_redis_command(&c, &b, 0, asks, keys, lens, 2, now, 77);
    CHECK(c.argc == 3 + 2 + 1 + 6 + 1);
    CHECK(arg_is(&c, 0, "EVALSHA") && arg_is(&c, 1, agw_limit_redis_sha()) && arg_is(&c, 2, "2"));
    CHECK(c.lens[3] == 20 && memcmp(c.argv[3], "agw:rl:{per-ip}:\x7f\0\0\x01", 20) == 0);
    CHECK(arg_is(&c, 4, "agw:rl:{daily}:app-1") && arg_is(&c, 5, "1764600000000"));
    CHECK(arg_is(&c, 6, "r") && arg_is(&c, 7, "100000") && arg_is(&c, 8, "300000"));
    CHECK(arg_is(&c, 9, "q") && arg_is(&c, 10, "1000") && arg_is(&c, 11, "1764633600000"));
    CHECK(arg_is(&c, 12, "77")); /* the check, last */
    CHECK(strlen(agw_limit_redis_sha()) == 40);
    agw_limit_redis_command(&c, &b, 1, asks, keys, lens, 1, now, 78);
    CHECK(c.argc == 3 + 1 + 1 + 3 + 1 && arg_is(&c, 0, "EVAL") && c.lens[1] == agw_limit_redis_script_len &&
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
    long long ok[] = {1, 1, 1, 200, 1, 999, 33600000, 77};
    CHECK(agw_limit_redis_verdict(array_of(&f, 8, ok, -1), asks, 2, now, 77, &v) == 0);
    CHECK(v.allowed == 1 && v.decisive == 0 && res[0].remaining == 1 && res[0].reset_ms == 200);
    CHECK(res[0].limit == 3 && res[0].window_s == 1 && res[1].limit == 1000 && res[1].window_s == 86400);
    /* refused by the quota alone: it decides */
    long long no[] = {0, 1, 2, 100, 0, 0, 33600000, 77};
    CHECK(agw_limit_redis_verdict(array_of(&f, 8, no, -1), asks, 2, now, 77, &v) == 0);
    CHECK(v.allowed == 0 && v.decisive == 1 && res[0].allowed == 1 && res[1].allowed == 0);
    /* garbage: each is refused */
    CHECK(agw_limit_redis_verdict(NULL, asks, 2, now, 77, &v) == -2);
    CHECK(agw_limit_redis_verdict(array_of(&f, 4, ok, -1), asks, 2, now, 77, &v) == -2);     /* count */
    CHECK(agw_limit_redis_verdict(array_of(&f, 7, ok, -1), asks, 2, now, 77, &v) == -2);     /* no check */
    CHECK(agw_limit_redis_verdict(array_of(&f, 8, ok, 3), asks, 2, now, 77, &v) == -2);      /* a string */
    /* another command's reply (a server or proxy sent one reply twice: each later reply answers the
     * command after its own; an attack review got a refused client through so) */
    CHECK(agw_limit_redis_verdict(array_of(&f, 8, no, -1), asks, 2, now, 78, &v) == -2);
    long long lie1[] = {1, 1, 1, 200, 0, 0, 33600000, 77};                                    /* all vs. rules */
    long long lie2[] = {1, 1, 4, 200, 1, 999, 33600000, 77};                                  /* over the burst */
    long long lie3[] = {1, 2, 1, 200, 1, 999, 33600000, 77};                                  /* flag 2 */
    long long lie5[] = {1, 1, 1, -5, 1, 999, 33600000, 77};                                   /* negative */
    long long lie6[] = {0, 0, 1, 100, 1, 999, 33600000, 77};                                  /* refused, remaining */
    long long *lies[] = {lie1, lie2, lie3, lie5, lie6};
    for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++)
        CHECK(agw_limit_redis_verdict(array_of(&f, 8, lies[i], -1), asks, 2, now, 77, &v) == -1);
    /* a reset beyond what the rule allows by this gateway's clock (a clock ahead, the rule's numbers
     * before a reload) is cut to it: Redis's verdict stands (an attack review: a correct Redis's
     * refusals were taken for lies, and each dropped the connection) */
    long long far[] = {0, 0, 0, 90000, 0, 0, 86400001, 77};
    CHECK(agw_limit_redis_verdict(array_of(&f, 8, far, -1), asks, 2, now, 77, &v) == 0);
    CHECK(v.allowed == 0 && res[0].reset_ms == 301 && res[1].reset_ms == 86400000);
    redisReply s = {.type = REDIS_REPLY_STRING, .str = (char *)"OK", .len = 2};
    CHECK(agw_limit_redis_verdict(&s, asks, 2, now, 77, &v) == -2);
}

static int redis_port;

/* Sends asks' command at now over c (EVALSHA; EVAL when Redis does not have the script) and reads
 * the verdict. Returns agw_limit_redis_verdict's answer, or -2 when Redis answered an error. */
static int run_check(redisContext *c, agw_limit_ask_t *asks, const char **keys, size_t *lens, size_t n, uint64_t now,
                     agw_limit_verdict_t *v, int *used_eval)
{
    agw_limit_redis_cmd_t cmd;
    agw_buf_t b = {0};
    *used_eval = 0;
    static uint64_t check;
    check++;
    agw_limit_redis_command(&cmd, &b, 0, asks, keys, lens, n, now, check);
    redisReply *r = redisCommandArgv(c, cmd.argc, cmd.argv, cmd.lens);
    if (r && r->type == REDIS_REPLY_ERROR && agw_limit_redis_noscript(r->str)) {
        freeReplyObject(r);
        *used_eval = 1;
        agw_limit_redis_command(&cmd, &b, 1, asks, keys, lens, n, now, check);
        r = redisCommandArgv(c, cmd.argc, cmd.argv, cmd.lens);
    }
    int rc = r == NULL || r->type == REDIS_REPLY_ERROR ? -2 : agw_limit_redis_verdict(r, asks, n, now, check, v);
    if (r)
        freeReplyObject(r);
    agw_buf_free(&b);
    return rc;
}

/* The local store's verdicts, step by step, are the Redis store's. */
static void against_redis(void)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    CHECK(c != NULL && c->err == 0);
    if (c == NULL || c->err)
        return;
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    /* the counts a run before left (the test counts from empty buckets) */
    freeReplyObject(redisCommand(c, "DEL %b %b", "agw:rl:{burst}:\x7f\0\0\x01", (size_t)19, "agw:rl:{daily}:\x7f\0\0\x01",
                                 (size_t)19));
    agw_limit_rule_t r = rate_rule("burst", 10, 1, 3), q = quota_rule("daily", 5, AGW_LIMIT_DAY);
    agw_limit_ask_t asks[2] = {{.rule = &r}, {.rule = &q}};
    const char *keys[2] = {"\x7f\0\0\x01", "\x7f\0\0\x01"};
    size_t lens[2] = {4, 4};
    agw_limit_store_t *s = agw_limit_store_new(64);
    asks[0].hash = agw_limit_hash(&r, keys[0], 4);
    asks[1].hash = agw_limit_hash(&q, keys[1], 4);
    agw_limit_result_t lres[2], rres[2];
    agw_limit_verdict_t lv = {.results = lres}, rv = {.results = rres};
    uint64_t now = 1764600000000;
    uint64_t steps[] = {0, 0, 0, 0, 50, 100, 200, 300, 400, 500, 900};
    int evals = 0;
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int used_eval;
        int rc = run_check(c, asks, keys, lens, 2, now + steps[i], &rv, &used_eval);
        evals += used_eval;
        agw_limit_check(s, asks, 2, now + steps[i], &lv);
        CHECK(rc == 0);
        CHECK(rv.allowed == lv.allowed && rv.decisive == lv.decisive);
        CHECK(rres[rv.decisive].reset_ms == lres[lv.decisive].reset_ms);
        CHECK(rres[rv.decisive].remaining == lres[lv.decisive].remaining);
        if (rv.allowed != lv.allowed)
            fprintf(stderr, "  step %zu: redis %d, local %d\n", i, rv.allowed, lv.allowed);
    }
    CHECK(evals == 1); /* once after the flush, EVALSHA finds it */
    redisReply *g = redisCommand(c, "GET agw:rl:{daily}:%b", keys[1], (size_t)4);
    CHECK(g && g->type == REDIS_REPLY_STRING && strcmp(g->str, "1764633600000:5") == 0);
    freeReplyObject(g);
    agw_limit_store_free(s);
    redisFree(c);
}

int main(int argc, char **argv)
{
    RUN(command_shape);
    RUN(verdicts);
    if (argc > 1) {
        redis_port = atoi(argv[1]);
        RUN(against_redis);
    }
    return CHECK_DONE();
}
