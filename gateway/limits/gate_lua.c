/* gate_lua.c: the "agg.limiter" module, the spec harness's way to the limiter (see gate.h). */
#include "limits/gate.h"

#include <lauxlib.h>

#include "base/luamod.h"
#include <stdlib.h>
#include <string.h>

#define STORE_MT "agg.limiter.store"
#define ASKS_MAX 16
#define SLOTS_MAX (1u << 24) /* the largest store new() makes (a spec's; the gateway's is in limit.h) */

typedef struct {
    agw_limit_store_t *s;
} handle_t;

static int l_new(lua_State *L)
{
    lua_Number slots = luaL_optnumber(L, 1, 4096);
    luaL_argcheck(L, slots <= SLOTS_MAX, 1, "at most 16777216 slots");
    handle_t *h = lua_newuserdata(L, sizeof(*h));
    h->s = agw_limit_store_new(slots > 0 ? (size_t)slots : 64);
    luaL_getmetatable(L, STORE_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static int l_gc(lua_State *L)
{
    handle_t *h = luaL_checkudata(L, 1, STORE_MT);
    agw_limit_store_free(h->s);
    h->s = NULL;
    return 0;
}

static const char *str_field(lua_State *L, int t, const char *name)
{
    lua_getfield(L, t, name);
    const char *s = lua_tostring(L, -1); /* the rule table keeps the string alive */
    lua_pop(L, 1);
    return s;
}

/* A rule table as agg.limits normalized it -> r (strings borrowed from the table). */
static void read_rule(lua_State *L, int t, agw_limit_rule_t *r)
{
    memset(r, 0, sizeof(*r));
    r->name = (char *)str_field(L, t, "name");
    const char *key = str_field(L, t, "key");
    if (r->name == NULL || key == NULL)
        luaL_error(L, "limiter: a rule needs name and key");
    r->key = strcmp(key, "ip") == 0 ? AGW_LIMIT_KEY_IP
                    : strcmp(key, "route") == 0   ? AGW_LIMIT_KEY_ROUTE
                    : strcmp(key, "api_key") == 0 ? AGW_LIMIT_KEY_API_KEY
                    : strcmp(key, "user") == 0    ? AGW_LIMIT_KEY_USER
                                                  : AGW_LIMIT_KEY_HEADER;
    r->header = (char *)str_field(L, t, "header");
    const char *window = str_field(L, t, "window");
    if (window) {
        r->is_quota = 1;
        r->quota = agw_luamod_field_u64(L, t, "quota", 1);
        r->window = strcmp(window, "hour") == 0 ? AGW_LIMIT_HOUR : strcmp(window, "day") == 0 ? AGW_LIMIT_DAY
                                                                                              : AGW_LIMIT_MONTH;
    } else {
        r->rate = agw_luamod_field_u64(L, t, "rate", 1);
        r->per_s = agw_luamod_field_u64(L, t, "per_s", 1);
        r->burst = agw_luamod_field_u64(L, t, "burst", r->rate);
        if (r->rate == 0 || r->per_s == 0 || r->burst == 0)
            luaL_error(L, "limiter: rule '%s': rate, per_s and burst must be positive", r->name);
    }
    agw_limit_rule_seal(r);
}

static void set_field(lua_State *L, const char *name, const agw_buf_t *b)
{
    lua_pushlstring(L, b->base ? b->base : "", b->len);
    lua_setfield(L, -2, name);
}

/* The kinds of an ask (see gate.h, store:check). */
enum { ASK_LOCAL, ASK_REMOTE, ASK_ALLOW, ASK_DENY };

/* What store:check does with its asks (its sixth argument). */
enum { MODE_CHECK, MODE_PEEK, MODE_CHARGE };

/* Checks the asks of kind kind among n in s (agw_limit_check: all or none; MODE_PEEK: each peeked
 * as agw_limit_peek_next, nothing counted; MODE_CHARGE: each taken on its own), their results into
 * results at their own indexes. Returns 1 when all accepted (or there were none). */
static int check_kind(agw_limit_store_t *s, const agw_limit_ask_t *asks, const int *kinds, size_t n, int kind,
                      uint64_t now_ms, agw_limit_result_t *results, int mode)
{
    if (mode != MODE_CHECK) {
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            if (kinds[i] != kind)
                continue;
            if (mode == MODE_PEEK)
                agw_limit_peek_next(s, asks[i].rule, asks[i].hash, now_ms, &results[i]);
            else
                agw_limit_take(s, asks[i].rule, asks[i].hash, now_ms, &results[i]);
            ok &= results[i].allowed;
        }
        return ok;
    }
    agw_limit_ask_t sub[ASKS_MAX];
    agw_limit_result_t sub_results[ASKS_MAX];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (kinds[i] == kind)
            sub[m++] = asks[i];
    if (m == 0)
        return 1;
    agw_limit_verdict_t v = {.results = sub_results};
    int ok = agw_limit_check(s, sub, m, now_ms, &v);
    for (size_t i = 0, j = 0; i < n; i++)
        if (kinds[i] == kind)
            results[i] = sub_results[j++];
    return ok;
}

static int l_check(lua_State *L)
{
    handle_t *h = luaL_checkudata(L, 1, STORE_MT);
    if (h->s == NULL) /* unreachable through the module (its metatable is guarded), kept as a check */
        return luaL_error(L, "limiter: the store is closed");
    luaL_checktype(L, 2, LUA_TTABLE);
    uint64_t now_ms = (uint64_t)luaL_checknumber(L, 3);
    int headers = lua_toboolean(L, 4);
    handle_t *remote = lua_isnoneornil(L, 5) ? h : luaL_checkudata(L, 5, STORE_MT);
    static const char *const modes[] = {"check", "peek", "charge", NULL};
    int mode = luaL_checkoption(L, 6, "check", modes);
    size_t n = lua_objlen(L, 2);
    if (n > ASKS_MAX)
        n = ASKS_MAX; /* as the worker: the first 16 */
    agw_limit_rule_t rules[ASKS_MAX];
    agw_limit_ask_t asks[ASKS_MAX];
    agw_limit_result_t results[ASKS_MAX];
    int kinds[ASKS_MAX] = {0};
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 2, (int)i + 1);
        int a = lua_gettop(L);
        luaL_checktype(L, a, LUA_TTABLE);
        lua_getfield(L, a, "rule");
        luaL_checktype(L, -1, LUA_TTABLE);
        read_rule(L, lua_gettop(L), &rules[i]);
        lua_pop(L, 1);
        lua_getfield(L, a, "key");
        size_t len = 0;
        const char *key = lua_tolstring(L, -1, &len);
        asks[i].rule = &rules[i];
        asks[i].hash = agw_limit_hash(&rules[i], key ? key : "", key ? len : 0);
        lua_pop(L, 1);
        const char *outcome = str_field(L, a, "outcome");
        lua_getfield(L, a, "redis");
        kinds[i] = outcome && strcmp(outcome, "allow") == 0  ? ASK_ALLOW
                   : outcome && strcmp(outcome, "deny") == 0 ? ASK_DENY
                   : lua_toboolean(L, -1)                    ? ASK_REMOTE
                                                             : ASK_LOCAL;
        lua_pop(L, 2);
    }
    /* as worker/limits.c: the local rules first; a refusal there answers with them only */
    agw_limit_verdict_t v = {.results = results};
    int allowed, only_denied = 0;
    if (mode == MODE_CHARGE) { /* as worker/limits.c: each ask on its own (a refused take counts
                                  nothing; a Redis rule's charge is a command of its own) */
        check_kind(h->s, asks, kinds, n, ASK_LOCAL, now_ms, results, mode);
        check_kind(remote->s, asks, kinds, n, ASK_REMOTE, now_ms, results, mode);
        lua_createtable(L, (int)n, 0);
        for (size_t i = 0; i < n; i++) {
            lua_pushboolean(L, kinds[i] != ASK_LOCAL && kinds[i] != ASK_REMOTE ? 1 : results[i].allowed);
            lua_rawseti(L, -2, (int)i + 1);
        }
        return 1;
    }
    if (!check_kind(h->s, asks, kinds, n, ASK_LOCAL, now_ms, results, mode)) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (kinds[i] == ASK_LOCAL) {
                asks[k] = asks[i];
                results[k++] = results[i];
            }
        n = k;
        allowed = agw_limit_decide(&v, n);
    } else {
        check_kind(remote->s, asks, kinds, n, ASK_REMOTE, now_ms, results, mode);
        for (size_t i = 0; i < n; i++) {
            if (kinds[i] != ASK_ALLOW && kinds[i] != ASK_DENY)
                continue;
            agw_limit_policy(asks[i].rule, now_ms, &results[i]);
            results[i].allowed = kinds[i] == ASK_ALLOW;
            results[i].remaining = kinds[i] == ASK_ALLOW ? results[i].limit : 0;
            results[i].reset_ms = kinds[i] == ASK_ALLOW ? 0 : 1000;
        }
        allowed = agw_limit_decide(&v, n);
        if (!allowed) {
            only_denied = 1;
            for (size_t i = 0; i < n; i++) {
                if (kinds[i] == ASK_LOCAL && mode == MODE_CHECK)
                    agw_limit_give_back(h->s, asks[i].rule, asks[i].hash, now_ms);
                if (!results[i].allowed && kinds[i] != ASK_DENY)
                    only_denied = 0;
            }
        }
    }
    lua_pushboolean(L, allowed);
    lua_newtable(L);
    agw_buf_t b = {0};
    if (n > 0 && (!allowed || headers)) {
        agw_gate_policy_field(&b, asks, results, n);
        set_field(L, "ratelimit-policy", &b);
        agw_buf_reset(&b);
        agw_gate_ratelimit_field(&b, asks, &v);
        set_field(L, "ratelimit", &b);
    }
    if (!allowed) {
        agw_buf_reset(&b);
        agw_buf_printf(&b, "%llu", (unsigned long long)agw_gate_retry_after_s(&v));
        set_field(L, "retry-after", &b);
        agw_buf_reset(&b);
        if (only_denied)
            agw_gate_problem_redis_deny(&b, asks[v.decisive].rule->name, agw_gate_retry_after_s(&v));
        else
            agw_gate_problem_429(&b, asks, &v, n);
        lua_pushlstring(L, b.base, b.len);
    } else {
        lua_pushnil(L);
    }
    agw_buf_free(&b);
    lua_pushinteger(L, allowed ? 200 : only_denied ? 503 : 429);
    return 4;
}

static int l_shed(lua_State *L)
{
    lua_Number max = luaL_checknumber(L, 1), prio = luaL_checknumber(L, 2), inflight = luaL_checknumber(L, 3);
    lua_pushboolean(L, agw_gate_shed(max > 0 ? (unsigned)max : 0, (int)prio, (int)inflight));
    return 1;
}

int agw_limiter_open(lua_State *L)
{
    static const luaL_Reg methods[] = {{"check", l_check}, {NULL, NULL}};
    static const luaL_Reg fns[] = {{"new", l_new}, {"shed", l_shed}, {NULL, NULL}};
    agw_luamod_class(L, STORE_MT, methods, l_gc); /* guarded: no __gc by hand, then check on freed memory */
    lua_pop(L, 1);
    luaL_newlib(L, fns);
    return 1;
}
