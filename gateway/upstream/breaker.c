/* breaker.c: circuit breaker (see breaker.h). */
#include "upstream/breaker.h"

#include "base/luamod.h"
#include "base/mem.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#define HANDLE_MT "agw.breaker"

typedef struct {
    agw_breaker_t *b;
    int owned;
} handle_t;

/* Sets the quiet word from state and consecutive (under the lock, or before b is shared). */
static void set_quiet(agw_breaker_t *b)
{
    int q = b->failures == 0 || (b->state == AGW_BREAKER_CLOSED && b->consecutive == 0);
    __atomic_store_n(&b->quiet, q, __ATOMIC_RELEASE);
}

void agw_breaker_init(agw_breaker_t *b, unsigned failures, uint64_t open_ms, unsigned probes)
{
    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->lock, NULL);
    b->failures = failures;
    b->open_ms = open_ms;
    b->probes = probes ? probes : 1;
    __atomic_store_n(&b->state, AGW_BREAKER_CLOSED, __ATOMIC_RELEASE);
    set_quiet(b);
}

void agw_breaker_destroy(agw_breaker_t *b)
{
    pthread_mutex_destroy(&b->lock);
}

agw_breaker_t *agw_breaker_new(unsigned failures, uint64_t open_ms, unsigned probes)
{
    agw_breaker_t *b = agw_malloc(sizeof(*b));
    agw_breaker_init(b, failures, open_ms, probes);
    b->refs = 1;
    return b;
}

agw_breaker_t *agw_breaker_ref(agw_breaker_t *b)
{
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
    return b;
}

void agw_breaker_unref(agw_breaker_t *b)
{
    if (b == NULL || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    agw_breaker_destroy(b);
    free(b);
}

const char *agw_breaker_state_name(agw_breaker_state_t s)
{
    return s == AGW_BREAKER_OPEN ? "open" : s == AGW_BREAKER_HALF_OPEN ? "half-open" : "closed";
}

agw_breaker_decision_t agw_breaker_allow(agw_breaker_t *b, uint64_t now_ms, uint64_t *retry_after_ms)
{
    /* closed lets every call through and changes nothing: read without the lock, so workers do
     * not take turns on the breaker's cache line for the common case (state and consecutive are
     * written with atomic stores, under the lock) */
    if (b->failures == 0 || __atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == AGW_BREAKER_CLOSED)
        return AGW_BREAKER_ALLOW;
    agw_breaker_decision_t d = AGW_BREAKER_ALLOW;
    pthread_mutex_lock(&b->lock);
    if (b->state == AGW_BREAKER_OPEN && now_ms >= b->opened_at_ms + b->open_ms) {
        __atomic_store_n(&b->state, AGW_BREAKER_HALF_OPEN, __ATOMIC_RELEASE);
        b->probes_out = 0;
    }
    if (b->state == AGW_BREAKER_OPEN) {
        d = AGW_BREAKER_DENY;
        if (retry_after_ms)
            *retry_after_ms = b->opened_at_ms + b->open_ms - now_ms;
    } else if (b->state == AGW_BREAKER_HALF_OPEN) {
        if (b->probes_out < b->probes) {
            b->probes_out++;
            d = AGW_BREAKER_PROBE;
        } else {
            d = AGW_BREAKER_DENY;
            if (retry_after_ms)
                *retry_after_ms = 1000; /* a probe is out: try again soon */
        }
    }
    if (d == AGW_BREAKER_DENY)
        b->denied++;
    pthread_mutex_unlock(&b->lock);
    return d;
}

int agw_breaker_report(agw_breaker_t *b, agw_breaker_result_t r, int probe, uint64_t now_ms)
{
    if (b->failures == 0)
        return -1;
    /* a success (or an ignored outcome) while closed with no failure counted changes nothing */
    if (r != AGW_BREAKER_FAILURE && !probe && __atomic_load_n(&b->state, __ATOMIC_ACQUIRE) == AGW_BREAKER_CLOSED &&
        __atomic_load_n(&b->consecutive, __ATOMIC_RELAXED) == 0)
        return -1;
    int changed = -1;
    pthread_mutex_lock(&b->lock);
    if (probe && b->probes_out > 0)
        b->probes_out--;
    if (b->state == AGW_BREAKER_HALF_OPEN && probe) {
        if (r == AGW_BREAKER_SUCCESS) {
            __atomic_store_n(&b->state, AGW_BREAKER_CLOSED, __ATOMIC_RELEASE);
            __atomic_store_n(&b->consecutive, 0, __ATOMIC_RELAXED);
            b->closed++;
            changed = AGW_BREAKER_CLOSED;
        } else if (r == AGW_BREAKER_FAILURE) {
            __atomic_store_n(&b->state, AGW_BREAKER_OPEN, __ATOMIC_RELEASE);
            b->opened_at_ms = now_ms;
            b->opened++;
            changed = AGW_BREAKER_OPEN;
        }
    } else if (b->state == AGW_BREAKER_CLOSED) {
        if (r == AGW_BREAKER_SUCCESS) {
            __atomic_store_n(&b->consecutive, 0, __ATOMIC_RELAXED);
        } else if (r == AGW_BREAKER_FAILURE &&
                   __atomic_add_fetch(&b->consecutive, 1, __ATOMIC_RELAXED) >= b->failures) {
            __atomic_store_n(&b->state, AGW_BREAKER_OPEN, __ATOMIC_RELEASE);
            b->opened_at_ms = now_ms;
            b->opened++;
            changed = AGW_BREAKER_OPEN;
        }
    }
    set_quiet(b);
    pthread_mutex_unlock(&b->lock);
    return changed;
}

/* ---- Lua handles ---- */

/* The handle at index 1 of a method call. Every method has the handles' metatable as upvalue 1
 * (push_handle): comparing with it saves luaL_checkudata's registry lookup by name, six times a
 * page. Raises "bad argument #1 … (agw.breaker expected, got …)" for anything else. */
static agw_breaker_t *check(lua_State *L)
{
    handle_t *h = lua_touserdata(L, 1);
    int ok = h != NULL && lua_getmetatable(L, 1);
    if (ok) {
        ok = lua_rawequal(L, -1, lua_upvalueindex(1));
        lua_pop(L, 1);
    }
    if (!ok)
        luaL_typerror(L, 1, HANDLE_MT);
    if (h->b == NULL) /* unreachable through the module (its metatable is guarded), kept as a check */
        luaL_error(L, "breaker: the handle is closed");
    return h->b;
}

static int l_allow(lua_State *L)
{
    agw_breaker_t *b = check(L);
    lua_Number now = luaL_checknumber(L, 2);
    uint64_t after = 0;
    agw_breaker_decision_t d = agw_breaker_allow(b, now > 0 ? (uint64_t)now : 0, &after);
    /* the decision's string, made once per metatable (upvalues 2-4, push_handle): no interning
     * of "allow" three times a page */
    lua_pushvalue(L, lua_upvalueindex(d == AGW_BREAKER_DENY ? 4 : d == AGW_BREAKER_PROBE ? 3 : 2));
    lua_pushnumber(L, (lua_Number)after);
    return 2;
}

static int l_report(lua_State *L)
{
    agw_breaker_t *b = check(L);
    const char *r = luaL_checkstring(L, 2);
    agw_breaker_result_t res = strcmp(r, "success") == 0   ? AGW_BREAKER_SUCCESS
                               : strcmp(r, "failure") == 0 ? AGW_BREAKER_FAILURE
                                                           : AGW_BREAKER_IGNORE;
    lua_Number now = luaL_checknumber(L, 4);
    int changed = agw_breaker_report(b, res, lua_toboolean(L, 3), now > 0 ? (uint64_t)now : 0);
    if (changed < 0)
        return 0;
    lua_pushstring(L, agw_breaker_state_name((agw_breaker_state_t)changed));
    return 1;
}

static int l_state(lua_State *L)
{
    agw_breaker_t *b = check(L);
    pthread_mutex_lock(&b->lock);
    agw_breaker_state_t s = b->state;
    unsigned c = b->consecutive;
    pthread_mutex_unlock(&b->lock);
    lua_pushstring(L, agw_breaker_state_name(s));
    lua_pushinteger(L, (lua_Integer)c);
    return 2;
}

static int l_gc(lua_State *L)
{
    handle_t *h = luaL_checkudata(L, 1, HANDLE_MT);
    if (h->owned && h->b) {
        agw_breaker_destroy(h->b);
        free(h->b);
    }
    h->b = NULL;
    return 0;
}

static void push_handle(lua_State *L, agw_breaker_t *b, int owned)
{
    handle_t *h = lua_newuserdata(L, sizeof(*h));
    h->b = b;
    h->owned = owned;
    static const luaL_Reg methods[] = {{"allow", l_allow}, {"report", l_report}, {"state", l_state}, {NULL, NULL}};
    if (agw_luamod_class(L, HANDLE_MT, methods, l_gc)) { /* the metatable is each method's upvalue 1 */
        /* allow's answers, made once per metatable: upvalues 2, 3, 4 (l_allow) */
        lua_getfield(L, -1, "__index");
        lua_pushvalue(L, -2);
        lua_pushliteral(L, "allow");
        lua_pushliteral(L, "probe");
        lua_pushliteral(L, "deny");
        lua_pushcclosure(L, l_allow, 4);
        lua_setfield(L, -2, "allow");
        lua_pop(L, 1);
    }
    lua_setmetatable(L, -2);
}

void agw_breaker_push(lua_State *L, agw_breaker_t *b)
{
    push_handle(L, b, 0);
}

static int l_new(lua_State *L)
{
    lua_Number failures = luaL_checknumber(L, 1), open_ms = luaL_checknumber(L, 2), probes = luaL_optnumber(L, 3, 1);
    agw_breaker_t *b = agw_malloc(sizeof(*b));
    agw_breaker_init(b, failures > 0 ? (unsigned)failures : 0, open_ms > 0 ? (uint64_t)open_ms : 0,
                     probes > 0 ? (unsigned)probes : 1);
    push_handle(L, b, 1);
    return 1;
}

/* quiet_word(handle) -> the address of its breaker's quiet word (breaker.h) */
static int l_quiet_word(lua_State *L)
{
    handle_t *h = luaL_checkudata(L, 1, HANDLE_MT);
    if (h->b == NULL)
        return luaL_error(L, "breaker: the handle is closed");
    lua_pushlightuserdata(L, &h->b->quiet);
    return 1;
}

int agw_breaker_open(lua_State *L)
{
    static const luaL_Reg fns[] = {{"new", l_new}, {"quiet_word", l_quiet_word}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
