/* limit_redis.c: the Redis store's command and reply (see limit_redis.h). The script's text comes
 * from the build (CMakeLists.txt embeds gateway/limits/limit_redis.lua). */
#include "limits/limit_redis.h"
#include "redis/redis.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <string.h>

/* the reply to a command of AGW_LIMIT_REDIS_MAX rules must fit the client's array limit */
_Static_assert(2 + 3 * AGW_LIMIT_REDIS_MAX <= AGW_REDIS_MAX_ELEMENTS,
               "the limits reply outgrows the Redis client's array limit");

/* A command's check as it goes and comes back: below 2^53, exact in the script's doubles. */
#define CHECK_OF(check) ((check) & ((UINT64_C(1) << 53) - 1))

static char sha_hex[SHA_DIGEST_LENGTH * 2 + 1];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

static void compute_sha(void)
{
    unsigned char d[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)agw_limit_redis_script, agw_limit_redis_script_len, d);
    for (int i = 0; i < SHA_DIGEST_LENGTH; i++)
        snprintf(sha_hex + 2 * i, 3, "%02x", d[i]);
}

const char *agw_limit_redis_sha(void)
{
    pthread_once(&sha_once, compute_sha);
    return sha_hex;
}

void agw_limit_redis_command(agw_limit_redis_cmd_t *cmd, agw_buf_t *b, int eval, const agw_limit_ask_t *asks,
                             const char *const *keys, const size_t *key_lens, size_t num, uint64_t now_ms,
                             uint64_t check)
{
    if (num > AGW_LIMIT_REDIS_MAX)
        num = AGW_LIMIT_REDIS_MAX;
    /* offsets first (buf may move while it grows), pointers at the end */
    size_t off[4 + 4 * AGW_LIMIT_REDIS_MAX];
    int n = 0;
    agw_buf_reset(b);
#define ARG_BEGIN() (off[n] = b->len)
#define ARG_END() (cmd->lens[n] = b->len - off[n], n++)
    ARG_BEGIN();
    agw_buf_puts(b, eval ? "EVAL" : "EVALSHA");
    ARG_END();
    ARG_BEGIN();
    if (eval)
        agw_buf_append(b, agw_limit_redis_script, agw_limit_redis_script_len);
    else
        agw_buf_puts(b, agw_limit_redis_sha());
    ARG_END();
    ARG_BEGIN();
    agw_buf_printf(b, "%zu", num);
    ARG_END();
    for (size_t i = 0; i < num; i++) {
        ARG_BEGIN();
        agw_buf_printf(b, "agw:rl:{%s}:", asks[i].rule->name);
        agw_buf_append(b, keys[i], key_lens[i]);
        ARG_END();
    }
    ARG_BEGIN();
    agw_buf_printf(b, "%" PRIu64, now_ms);
    ARG_END();
    for (size_t i = 0; i < num; i++) {
        const agw_limit_rule_t *r = asks[i].rule;
        uint64_t a, c;
        if (r->is_quota) {
            uint64_t start;
            agw_limit_window_bounds(r->window, now_ms, &start, &c);
            a = r->quota;
        } else {
            a = agw_limit_emission_us(r);
            c = a * r->burst;
        }
        ARG_BEGIN();
        agw_buf_puts(b, r->is_quota ? "q" : "r");
        ARG_END();
        ARG_BEGIN();
        agw_buf_printf(b, "%" PRIu64, a);
        ARG_END();
        ARG_BEGIN();
        agw_buf_printf(b, "%" PRIu64, c);
        ARG_END();
    }
    ARG_BEGIN();
    agw_buf_printf(b, "%" PRIu64, CHECK_OF(check));
    ARG_END();
#undef ARG_BEGIN
#undef ARG_END
    cmd->argc = n;
    for (int i = 0; i < n; i++)
        cmd->argv[i] = b->base + off[i];
}

int agw_limit_redis_noscript(const char *err)
{
    return err != NULL && strncmp(err, "NOSCRIPT", 8) == 0;
}

int agw_limit_redis_verdict(const struct redisReply *reply, const agw_limit_ask_t *asks, size_t num, uint64_t now_ms,
                            uint64_t check, agw_limit_verdict_t *v)
{
    /* this command's reply: its shape, and its check (else another command's) */
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 + 3 * num)
        return -2;
    for (size_t i = 0; i < reply->elements; i++)
        if (reply->element[i]->type != REDIS_REPLY_INTEGER)
            return -2;
    if ((uint64_t)reply->element[1 + 3 * num]->integer != CHECK_OF(check))
        return -2;
    /* … and a verdict its rules allow */
    for (size_t i = 0; i < reply->elements; i++)
        if (reply->element[i]->integer < 0)
            return -1;
    long long all = reply->element[0]->integer;
    if (all > 1)
        return -1;
    for (size_t i = 0; i < num; i++) {
        const agw_limit_rule_t *r = asks[i].rule;
        agw_limit_result_t *out = &v->results[i];
        agw_limit_policy(r, now_ms, out);
        long long allowed = reply->element[1 + 3 * i]->integer;
        uint64_t remaining = (uint64_t)reply->element[2 + 3 * i]->integer;
        uint64_t reset_ms = (uint64_t)reply->element[3 + 3 * i]->integer;
        /* a rate's reset is at most the time its bucket takes to fill, a quota's its window, by this
         * gateway's clock and rule: one counted by a clock ahead of this worker's (another gateway's,
         * another worker's loop time) or by the rule's looser numbers before a reload is further
         * off, and is cut to it (Redis's verdict stands: an attack review found a correct Redis's
         * refusals taken for lies) */
        uint64_t max_reset = r->is_quota ? out->window_s * 1000 : agw_limit_emission_us(r) * r->burst / 1000 + 1;
        if (reset_ms > max_reset)
            reset_ms = max_reset;
        if (allowed > 1 || remaining > out->limit || (allowed == 0 && remaining != 0))
            return -1;
        out->allowed = (int)allowed;
        out->remaining = remaining;
        out->reset_ms = reset_ms;
    }
    if (agw_limit_decide(v, num) != (int)all)
        return -1;
    return 0;
}
