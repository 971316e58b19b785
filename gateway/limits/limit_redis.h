/* limit_redis.h: the cluster-wide store of rate limits and quotas (issue 18, `store = "redis"`):
 * the command a check sends to Redis and the reading of its answer. Pure functions of their
 * arguments (no socket, no loop): the worker sends the command with redis/redis.h's client.
 *
 * One request's redis rules are checked by one script call, EVALSHA of limit_redis.lua (EVAL of
 * its text when Redis answers NOSCRIPT: a restarted or flushed Redis), which judges every rule and
 * counts the request under all of them or none (only accepted requests are counted), with the
 * arithmetic of the local store (limit.h: GCRA for rates, fixed UTC windows for quotas). Keys are
 * `agw:rl:{RULE}:KEY` (KEY: the bytes the rule counts by, as the local store hashes them: a client
 * address is its 4 or 16 bytes), set with an expiry (a rate's key when its bucket is full again, a
 * quota's at its window's end, plus 1 s). One script call touches every rule's key of a request:
 * the store is one Redis server (with replicas if wanted), not a Redis Cluster, where keys of
 * several rules ({RULE} is a hash tag) would sit in different slots (CROSSSLOT).
 *
 * Error bound: the counts are exact across every gateway sharing the Redis as long as their clocks
 * agree (the script takes the caller's time; keep instances on NTP: a skew of d ms moves a rate's
 * bucket by d ms and a quota's window edge by d ms).
 */
#ifndef AGW_LIMIT_REDIS_H
#define AGW_LIMIT_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "limits/limit.h"

struct redisReply;

/* The script's text (gateway/limits/limit_redis.lua, embedded at build time) and its length. */
extern const char agw_limit_redis_script[];
extern const size_t agw_limit_redis_script_len;

/* The script's SHA-1 in lower-case hex (what EVALSHA names it by): 40 characters and a NUL.
 * Computed once; thread-safe. */
const char *agw_limit_redis_sha(void);

/* Most rules one command carries. */
#define AGW_LIMIT_REDIS_MAX 16

/* A command's arguments: argv[i] points into buf (valid until buf changes). */
typedef struct agw_limit_redis_cmd {
    int argc;
    const char *argv[4 + 4 * AGW_LIMIT_REDIS_MAX];
    size_t lens[4 + 4 * AGW_LIMIT_REDIS_MAX];
} agw_limit_redis_cmd_t;

/* Fills *cmd with `EVALSHA sha num KEY... now_ms ARG... check` (eval: `EVAL script num ...`
 * instead) for the num rules of asks (num <= AGW_LIMIT_REDIS_MAX), keys[i]/key_lens[i] being the
 * bytes rule i counts by, at now_ms (ms since the epoch, UTC). check (below 2^53) comes back as the
 * reply's last element: the caller gives each command in flight on a connection its own, so that
 * a reply shifted onto another command (a server or proxy that sent one twice) is refused. b is
 * reset and holds the bytes. */
void agw_limit_redis_command(agw_limit_redis_cmd_t *cmd, agw_buf_t *b, int eval, const agw_limit_ask_t *asks,
                             const char *const *keys, const size_t *key_lens, size_t num, uint64_t now_ms,
                             uint64_t check);

/* 1 when err (an error reply's text from redis.h) says that Redis does not have the script. */
int agw_limit_redis_noscript(const char *err);

/* Reads the script's reply for the num rules of asks checked at now_ms with check (the command's,
 * agw_limit_redis_command) into *v (v->results: num entries): allowed, remaining and reset per
 * rule from Redis (a reset beyond what the rule allows by this gateway's clock, from a clock ahead
 * or the rule's numbers before a reload, cut to it), limit and window from the rules
 * (agw_limit_policy), the decisive rule as agw_limit_decide. Returns 0; -2 when the reply is not
 * this command's (another shape, or another check: the connection's replies are shifted, and the
 * caller drops it); -1 when it is, with a verdict its rules do not allow (a negative number, a flag
 * not 0/1, a remaining over the rule's limit, a verdict that disagrees with its rules). On -1 and
 * -2 *v is unspecified and the caller applies the rules' on_redis_error. */
int agw_limit_redis_verdict(const struct redisReply *reply, const agw_limit_ask_t *asks, size_t num, uint64_t now_ms,
                            uint64_t check, agw_limit_verdict_t *v);

#endif
