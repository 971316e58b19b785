/* worker/cache.c: the cache's transport functions for the runtime (lua/agg/cache.lua): tier 1 in
 * this worker's LRU (cache/lru.h), tier 2 in Redis through this worker's client (redis/redis.h),
 * the credential digest of per-user keys, and the cache counters for /metrics.
 *
 *   core.cache_entry(key, decode) -> fresh, stale, error_until, status, payload, headers
 *                                               tier 1 (expired entries miss: nothing returned;
 *                                               an entry that does not parse: false). payload is a
 *                                               raw JSON ref holding the body with the header block
 *                                               as its extra (headers = true) when decode is true, the
 *                                               status 2xx and the body valid JSON; else the body
 *                                               string (headers: the header block string). A 2xx
 *                                               body that is not JSON, when decode: false.
 *   core.cache_set(key, value, until_ms)        tier 1, kept until until_ms (core.now()'s clock)
 *   core.cache_store(key, fresh, stale, error_until, status, headers, body, until_ms [, redis_ttl_ms])
 *                                               -> size | false: the entry of these fields
 *                                               (cache/entry.h) into tier 1 until until_ms and, with
 *                                               redis_ttl_ms, into Redis (SET PX); headers a header
 *                                               block or the raw ref that keeps the answer's headers,
 *                                               body a string or a raw ref; false (nothing stored)
 *                                               when the entry is over AGW_CACHE_ENTRY_MAX. The
 *                                               entry is made here, without a Lua string of it.
 *   core.redis_get(key) -> id | nil             GET key; later runtime.on_redis(id, value|nil, err|nil);
 *                                               nil: not connected (nothing follows)
 *   core.redis_set(key, value, ttl_ms)          SET key value PX ttl_ms (answer ignored, errors counted)
 *   core.digest(s) -> hex                        32 hex digits of SHA-256("aggway-cache-user\0" .. s)
 *   core.cache_counters(stats)                  the runtime's totals (agg.cache.stats) into the metrics
 *   core.cache_span(rid, index, section, outcome, http_status)   a cached section's span (trace, waterfall)
 * core.redis_get and core.redis_set exist only in a generation whose gateway.lua configures redis
 * with cache.redis on (agw_worker_cache_fn_wanted). Every time and ttl_ms the runtime hands over,
 * NaN and infinity too, is clamped to 0 .. AGW_CACHE_ENTRY_MS_MAX before it is converted
 * (cache/entry.h agw_cache_entry_ms).
 */
#include "worker/worker_internal.h"

#include "base/header.h"
#include "base/luamod.h"
#include "base/mem.h"
#include "cache/entry.h"
#include "json/json.h"
#include "ops/trace.h"

#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/log.h"

static uint64_t now_ms(agw_worker_t *w)
{
    return (uint64_t)(ev_now(w->loop) * 1000.0);
}

/* What the tier-1 entry's mark (cache/lru.h) remembers of its body, so that validating it as JSON
 * happens once per stored value, not once per hit. */
enum {
    MARK_JSON_CHECKED = 1, /* validated: the verdict is in the two bits below */
    MARK_JSON_OK = 2,      /* the body is one JSON text (agw_json_validate accepted it) */
    MARK_COMPACT = 4,      /* ... with no whitespace outside strings */
};

/* A hit in one call: the entry is read in C (cache/entry.h) and its body becomes the section's
 * raw JSON ref directly, validated as an upstream body is (an entry may have come from Redis) on
 * its first hit only; no Lua string of the whole entry, no second call to parse it. */
static int l_cache_entry(lua_State *L)
{
    agw_worker_t *w = agw_worker_upg(L)->w;
    size_t klen, vlen;
    const char *key = luaL_checklstring(L, 1, &klen);
    int decode = lua_toboolean(L, 2);
    uint32_t *mark;
    const char *v = w->cache.lru ? agw_lru_get_mark(w->cache.lru, key, klen, &vlen, now_ms(w), &mark) : NULL;
    if (!v)
        return 0;
    agw_cache_entry_t e;
    int compact = 0, json;
    if (agw_cache_entry_parse(v, vlen, &e) != 0)
        goto corrupt;
    json = decode && e.status >= 200 && e.status < 300 && e.blen > 0;
    if (json) {
        if (!(*mark & MARK_JSON_CHECKED)) {
            /* the body's last byte is the entry's last: validate needs no NUL after it */
            int ok = agw_json_validate(e.body, e.blen, AGW_JSON_MAX_DEPTH, &compact, NULL, 0) == 0;
            *mark |= MARK_JSON_CHECKED | (ok ? MARK_JSON_OK : 0) | (ok && compact ? MARK_COMPACT : 0);
        }
        if (!(*mark & MARK_JSON_OK))
            goto corrupt;
        compact = (*mark & MARK_COMPACT) != 0;
    }
    lua_pushnumber(L, (lua_Number)e.fresh_ms);
    lua_pushnumber(L, (lua_Number)e.stale_ms);
    lua_pushnumber(L, (lua_Number)e.error_until_ms);
    lua_pushnumber(L, (lua_Number)e.status);
    if (json) {
        agw_json_push_raw_ref(L, e.body, e.blen, compact, e.headers, e.hlen);
        lua_pushboolean(L, 1);
    } else {
        lua_pushlstring(L, e.body, e.blen);
        lua_pushlstring(L, e.headers, e.hlen);
    }
    return 6;
corrupt:
    lua_pushboolean(L, 0);
    return 1;
}

static int l_cache_set(lua_State *L)
{
    agw_worker_t *w = agw_worker_upg(L)->w;
    size_t klen, vlen;
    const char *key = luaL_checklstring(L, 1, &klen);
    const char *v = luaL_checklstring(L, 2, &vlen);
    uint64_t until = agw_cache_entry_ms(luaL_checknumber(L, 3));
    if (w->cache.lru && until > 0)
        agw_lru_set(w->cache.lru, key, klen, v, vlen, until);
    return 0;
}

/* ---- tier 2's values: an entry behind its key's tag ----------------------------------------
 * Redis answers a connection's commands in order, and the client hands each reply to the command
 * at the head of its queue: a server or a proxy that answered one command twice while others
 * waited gave every later command the reply of the one before it (an attack review: a page got
 * another key's cached section, and kept it in tier 1; with per-user keys, another user's). So a
 * value in Redis is the first REDIS_TAG_LEN bytes of SHA-256 over a domain of its own
 * ("aggway-cache-key" and its NUL) and the key, then the entry; a lookup whose value does not start
 * with its own key's tag is a miss. (A value an older build wrote, without the tag, is a miss, for
 * as long as such a build shares the Redis and writes them.) */
#define REDIS_TAG_LEN 16

/* SHA-256's implementation, fetched from OpenSSL's providers once for the process: EVP_sha256()
 * in EVP_DigestInit_ex fetches it again at every digest, 2,700 of the 7,900 instructions a tag took
 * (callgrind, a 51-byte key). */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!sha256_md)
        abort();
}

/* The first 16 bytes of SHA-256 over domain (its NUL included: each domain a space of its own)
 * and the len bytes at s, into out. */
static void domain_digest16(const char *domain, const char *s, size_t len, unsigned char out[16])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    pthread_once(&sha256_once, sha256_fetch);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        abort();
    EVP_DigestInit_ex2(ctx, sha256_md, NULL);
    EVP_DigestUpdate(ctx, domain, strlen(domain) + 1);
    EVP_DigestUpdate(ctx, s, len);
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    memcpy(out, md, 16);
}

static void redis_tag(const char *key, size_t klen, unsigned char tag[REDIS_TAG_LEN])
{
    _Static_assert(REDIS_TAG_LEN == 16, "a tag is a 16-byte digest");
    domain_digest16("aggway-cache-key", key, klen, tag);
}

/* A GET waiting for its answer: the generation to answer (one reference), the runtime's id and
 * the tag its key's value starts with. */
typedef struct redis_get {
    wgen_t *g;
    agw_redis_t *r; /* the client it was sent on (it answers every command before it is freed) */
    uint64_t id;
    unsigned char tag[REDIS_TAG_LEN];
} redis_get_t;

/* 1 when a lookup's reply cannot be any key's value, only another command's: not a string or nil
 * (an integer, an array: a limits check's). A value tagged for another key is a miss only: a value
 * written by an older build or copied by hand looks the same. */
static int redis_get_shifted(const struct redisReply *reply)
{
    return reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_NIL;
}

static void on_redis_get(void *data, const struct redisReply *reply, const char *err)
{
    redis_get_t *q = data;
    wgen_t *g = q->g;
    agw_worker_t *w = g->w;
    if (!w->cache.closing && g->ref_on_redis != LUA_NOREF) {
        lua_State *L = g->L;
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->ref_on_redis);
        lua_pushnumber(L, (lua_Number)q->id);
        if (err) {
            lua_pushnil(L);
            lua_pushstring(L, err);
        } else if (reply->type == REDIS_REPLY_STRING && reply->len > REDIS_TAG_LEN &&
                   memcmp(reply->str, q->tag, REDIS_TAG_LEN) == 0) {
            lua_pushlstring(L, reply->str + REDIS_TAG_LEN, reply->len - REDIS_TAG_LEN);
            lua_pushnil(L);
        } else if (!redis_get_shifted(reply)) {
            /* (GETRANGE gives "" for a key that is not there: a miss, as GET's nil was; so is a
             * value without this key's tag) */
            lua_pushnil(L);
            lua_pushnil(L);
        } else {
            /* the reply of another command: the connection's replies are shifted (a server or a
             * proxy sent one twice), and every later one would be too until it is dropped */
            lua_pushnil(L);
            lua_pushstring(L, "Redis answered the lookup with another command's reply");
            agw_redis_drop(q->r, "Redis answered a cache lookup with another command's reply");
        }
        agw_worker_call_runtime(g, 3);
    }
    agw_worker_gen_release(g);
    free(q);
}

/* The largest cache entry that goes to or comes from Redis (tier 2): what moves well within the
 * client's timeout_ms. Every command has that timeout, and one that overruns it drops the
 * connection and fails the commands queued behind it, the Redis rate limits' too: a client that
 * asked for large cached sections kept the limits off Redis (an attack review). At 50 KB a
 * millisecond (a loopback or LAN link moves far more, on a busy machine too): 250 KB at the default
 * 5 ms. Larger entries stay in tier 1; a larger value in Redis is read up to this size (GETRANGE),
 * which no entry parses: a miss. */
#define REDIS_BYTES_PER_MS ((uint64_t)50 * 1000)
/* (the client refuses a reply of more bytes than this: a lookup's is its value and a bulk string's
 * framing, "$" and at most 20 digits, and two CRLFs) */
_Static_assert(AGW_CACHE_ENTRY_MAX + REDIS_TAG_LEN + 32 <= AGW_REDIS_MAX_REPLY_BYTES,
               "a cached section's lookup fits a Redis reply");

static size_t redis_entry_max(const agw_worker_t *w)
{
    uint64_t max = agw_redis_conf(w->cache.redis)->timeout_ms * REDIS_BYTES_PER_MS;
    return max < AGW_CACHE_ENTRY_MAX ? (size_t)max : AGW_CACHE_ENTRY_MAX;
}

static int l_redis_get(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    agw_worker_t *w = g->w;
    size_t klen;
    const char *key = luaL_checklstring(L, 1, &klen);
    if (!w->cache.redis)
        return 0;
    redis_get_t *q = agw_malloc(sizeof(*q));
    q->g = g;
    q->r = w->cache.redis;
    q->id = ++w->cache.redis_next_id;
    redis_tag(key, klen, q->tag);
    char last[32]; /* GETRANGE key 0 tag+max-1: at most the tag and the largest entry tier 2 holds */
    int ll = snprintf(last, sizeof(last), "%zu", REDIS_TAG_LEN + redis_entry_max(w) - 1);
    const char *argv[4] = {"GETRANGE", key, "0", last};
    size_t lens[4] = {8, klen, 1, (size_t)ll};
    if (agw_redis_command(w->cache.redis, on_redis_get, q, 4, argv, lens) != 0) {
        free(q);
        return 0;
    }
    agw_worker_gen_hold(g);
    lua_pushnumber(L, (lua_Number)q->id);
    return 1;
}

/* A SET's answer (data: the client it was sent on): counted by the client, and a failed SET only
 * costs a later miss; but a reply other than +OK is another command's, and the connection's
 * replies are shifted. */
static void on_redis_set(void *data, const struct redisReply *reply, const char *err)
{
    if (err == NULL && !agw_redis_reply_is_ok(reply))
        agw_redis_drop(data, "Redis answered a cache store with another command's reply");
}

/* Whether redis_set sends an entry of len bytes and ttl_ms: the worker has Redis, the ttl is 1 ms
 * or more and the entry is no larger than redis_entry_max. */
static int redis_stores(const agw_worker_t *w, uint64_t ttl_ms, size_t len)
{
    return w->cache.redis != NULL && ttl_ms >= 1 && len <= redis_entry_max(w);
}

/* SET key value PX ttl_ms in the worker's Redis (core.redis_set, core.cache_store), the value the
 * key's tag and the n parts of the entry (their bytes in all: len) joined; nothing unless
 * redis_stores. ttl (ms, the runtime's number) is clamped to 1 ms .. AGW_CACHE_ENTRY_MS_MAX, which
 * Redis takes (its bound is LLONG_MAX less its clock; a PX past it, or 0, is refused: an attack
 * review). The client copies the command before this returns. */
static void redis_set(agw_worker_t *w, const char *key, size_t klen, const struct iovec *parts, int n, size_t len,
                      lua_Number ttl)
{
    uint64_t ttl_ms = agw_cache_entry_ms(ttl);
    if (!redis_stores(w, ttl_ms, len))
        return;
    agw_buf_t v = AGW_BUF_INIT;
    agw_buf_reserve(&v, REDIS_TAG_LEN + len);
    redis_tag(key, klen, (unsigned char *)v.base);
    v.len = REDIS_TAG_LEN;
    for (int i = 0; i < n; i++)
        agw_buf_append(&v, parts[i].iov_base, parts[i].iov_len);
    char px[32];
    int pl = snprintf(px, sizeof(px), "%llu", (unsigned long long)ttl_ms);
    const char *argv[5] = {"SET", key, v.base, "PX", px};
    size_t lens[5] = {3, klen, v.len, 2, (size_t)pl};
    agw_redis_command(w->cache.redis, on_redis_set, w->cache.redis, 5, argv, lens);
    agw_buf_free(&v);
}

/* A time for an entry (core.now()'s clock, ms): a whole number from 0 to 10^15 - 1 (the entry's
 * bound); the runtime gives floor'd times, anything else is clamped (agw_cache_entry_ms). */
static uint64_t entry_ms(lua_State *L, int idx)
{
    return agw_cache_entry_ms(luaL_checknumber(L, idx));
}

/* The bytes of argument idx: a string, or a raw JSON ref's text (extra 0) or its header block
 * (extra 1, made into block: json/json.h's extra, base/header.h); nil is none. */
static const char *entry_part(lua_State *L, int idx, int extra, agw_buf_t *block, size_t *len)
{
    *len = 0;
    if (lua_isnoneornil(L, idx))
        return "";
    if (lua_type(L, idx) == LUA_TSTRING)
        return lua_tolstring(L, idx, len);
    agw_json_raw_t r;
    if (!agw_json_check_raw_ref(L, idx, &r))
        luaL_typerror(L, idx, "string or agg.json raw ref");
    if (!extra) {
        *len = r.len;
        return r.text;
    }
    agw_header_block_of_pairs(block, r.extra, r.extra_len);
    *len = block->len;
    return block->base ? block->base : "";
}

static int l_cache_store(lua_State *L)
{
    agw_worker_t *w = agw_worker_upg(L)->w;
    size_t klen;
    const char *key = luaL_checklstring(L, 1, &klen);
    agw_cache_entry_t e = {.fresh_ms = entry_ms(L, 2), .stale_ms = entry_ms(L, 3), .error_until_ms = entry_ms(L, 4),
                           .status = entry_ms(L, 5)};
    /* every argument checked before the block is made: nothing below raises, and the block is the
     * worker's scratch (worker/scratch.h), which nothing else uses meanwhile */
    e.body = entry_part(L, 7, 0, NULL, &e.blen);
    uint64_t until = entry_ms(L, 8);
    lua_Number ttl = luaL_optnumber(L, 9, 0);
    e.headers = entry_part(L, 6, 1, &w->scratch.hdrs, &e.hlen); /* (last: it checks arg 6 before the block) */
    if (e.hlen + e.blen > AGW_CACHE_ENTRY_MAX) { /* too big whatever its header line: not copied */
        lua_pushboolean(L, 0);
        return 1;
    }
    char line[AGW_CACHE_ENTRY_HEAD_MAX];
    size_t head = agw_cache_entry_head(line, &e), n = head + e.hlen + e.blen;
    if (n > AGW_CACHE_ENTRY_MAX) {
        lua_pushboolean(L, 0);
        return 1;
    }
    /* tier 1 copies the three parts into its entry; Redis (tier 2) is sent them joined */
    const struct iovec parts[3] = {{line, head}, {(void *)e.headers, e.hlen}, {(void *)e.body, e.blen}};
    if (w->cache.lru && until > 0)
        agw_lru_set_parts(w->cache.lru, key, klen, parts, 3, until);
    redis_set(w, key, klen, parts, 3, n, ttl); /* (joined only when it is sent) */
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

static int l_redis_set(lua_State *L)
{
    agw_worker_t *w = agw_worker_upg(L)->w;
    size_t klen, vlen;
    const char *key = luaL_checklstring(L, 1, &klen);
    const char *v = luaL_checklstring(L, 2, &vlen);
    const struct iovec part = {(void *)v, vlen};
    redis_set(w, key, klen, &part, 1, vlen, luaL_checknumber(L, 3));
    return 0;
}

/* core.digest(s) -> 32 lowercase hex digits: the first 16 bytes of SHA-256 over a domain
 * ("aggway-cache-user" and its NUL) and s. What agg.cache puts in a key in place of a credential
 * or a vary header's value (a key must not hold them; every instance computes the same). */
static int l_digest(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    unsigned char md[16];
    domain_digest16("aggway-cache-user", s, len, md);
    char hex[32];
    agw_trace_hex(hex, md, 16); /* lowercase, two digits a byte from one table */
    lua_pushlstring(L, hex, 32);
    return 1;
}

/* core.cache_span(rid, upstream_index, section, outcome, http_status): a span of no duration for
 * a section served from the cache (outcome "hit", or "stale"/"refresh": a stale copy), so the
 * trace, the waterfall and the exported spans show it (ops/trace.h AGW_SPAN_CACHE_*). */
static int l_cache_span(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    agw_worker_t *w = g->w;
    reqref_t *rr = agw_slots_get(&w->tables.reqs, (uint64_t)luaL_checknumber(L, 1));
    int index = (int)luaL_checkinteger(L, 2);
    if (rr == NULL || rr->trace == NULL || index < 1 || (size_t)index > g->conf->num_upstreams)
        return 0;
    size_t slen = 0;
    const char *section = luaL_checklstring(L, 3, &slen);
    const char *outcome = luaL_checkstring(L, 4);
    unsigned flags = strcmp(outcome, "hit") == 0 ? AGW_SPAN_CACHE_HIT : AGW_SPAN_CACHE_STALE;
    uint64_t now = agw_worker_now_us(w);
    int i = agw_trace_add_span(rr->trace, &w->log.trace_rng, g->gen->upstream_slot[index - 1], section, slen, flags, 1, now);
    if (i >= 0)
        agw_trace_end_span(rr->trace, i, AGW_CALL_OK, (int)luaL_optinteger(L, 5, 0), NULL, now);
    return 0;
}

/* core.cache_counters(stats): stats is agg.cache.stats (totals of this generation's VM); the
 * growth since the last report goes into this worker's counters. */
static int l_cache_counters(lua_State *L)
{
    wgen_t *g = agw_worker_upg(L);
    agw_worker_t *w = g->w;
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *fields[AGW_M_CACHE_OUTCOMES] = {"hits", "misses", "stale", "stale_if_error", "refreshes",
                                                       "negative"};
    for (size_t i = 0; i < AGW_M_CACHE_OUTCOMES; i++) {
        lua_getfield(L, 1, fields[i]);
        uint64_t v = lua_isnumber(L, -1) ? agw_luamod_to_u64(lua_tonumber(L, -1)) : 0;
        lua_pop(L, 1);
        if (v > g->cache_reported[i]) {
            AGW_M_ADD(w->m->cache[i], v - g->cache_reported[i]);
            g->cache_reported[i] = v;
        }
    }
    return 0;
}

const luaL_Reg agw_worker_cache_fns[] = {
    {"cache_entry", l_cache_entry}, {"cache_set", l_cache_set}, {"cache_store", l_cache_store},
    {"redis_get", l_redis_get},     {"redis_set", l_redis_set},
    {"digest", l_digest},       {"cache_counters", l_cache_counters}, {"cache_span", l_cache_span}, {NULL, NULL}};

int agw_worker_cache_fn_wanted(const agw_config_t *conf, const char *name)
{
    if (strncmp(name, "redis_", 6) == 0)
        return conf->cache_redis;
    return 1;
}

void agw_worker_cache_configure(agw_worker_t *w, const agw_config_t *conf)
{
    size_t per = conf->cache_memory_bytes / (conf->workers ? conf->workers : 1);
    if (!w->cache.lru)
        w->cache.lru = agw_lru_new(per, &w->m->lru);
    else
        agw_lru_resize(w->cache.lru, per);
    int want = (conf->cache_redis || conf->limits.num_redis > 0) && conf->redis.host; /* one client serves both */
    if (w->cache.redis && (!want || !agw_redis_conf_same(agw_redis_conf(w->cache.redis), &conf->redis))) {
        agw_redis_t *old = w->cache.redis;
        w->cache.redis = NULL;
        agw_redis_free(old); /* its GETs answer "client closed": those calls go upstream; parked
                                limits checks take their rules' on_redis_error */
    }
    if (want && !w->cache.redis) {
        w->cache.redis = agw_redis_new(w->loop, &conf->redis, &w->m->redis);
        char owner[32];
        snprintf(owner, sizeof(owner), "worker %d", w->id);
        agw_redis_set_owner(w->cache.redis, owner);
    }
}

void agw_worker_cache_close(agw_worker_t *w)
{
    w->cache.closing = 1;
    agw_redis_free(w->cache.redis);
    w->cache.redis = NULL;
    agw_lru_free(w->cache.lru);
    w->cache.lru = NULL;
}
