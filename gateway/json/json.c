/* json.c: parsing upstream JSON, turning it into Lua values and the "agg.json" Lua module
 * (see json.h). The encoder lives in json/encode.c. */
#include "json/json_internal.h"

#include "base/header.h"
#include "base/heap.h"

#include <errno.h>
#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest integer a double holds exactly: beyond it decoded integers become int64 boxes. */
#define EXACT_INT_MAX 9007199254740992LL

/* ---- parsing ---- */

/* Returns the deepest array/object nesting in the bytes, ignoring brackets inside strings. Stops
 * counting as soon as limit is exceeded. Malformed input is left for jansson to report. */
static unsigned scan_depth(const char *p, size_t len, unsigned limit)
{
    unsigned depth = 0, max = 0;
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max && (max = depth) > limit)
                return max;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return max;
}

/* Writes a one-line reason for a jansson load error. */
static void load_error(const json_error_t *je, char *err, size_t errlen)
{
    switch (json_error_code(je)) {
    case json_error_invalid_utf8:
        snprintf(err, errlen, "invalid UTF-8 at byte %d", je->position);
        break;
    case json_error_numeric_overflow:
        if (strstr(je->text, "integer"))
            snprintf(err, errlen, "integer beyond int64 at line %d column %d", je->line, je->column);
        else
            snprintf(err, errlen, "number out of range at line %d column %d", je->line, je->column);
        break;
    case json_error_stack_overflow:
        snprintf(err, errlen, "nesting too deep at line %d column %d", je->line, je->column);
        break;
    default:
        snprintf(err, errlen, "invalid JSON: %s at line %d column %d", je->text, je->line, je->column);
        break;
    }
}

int agw_json_parse(const char *buf, size_t len, unsigned max_depth, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (scan_depth(buf, len, max_depth) > max_depth) {
        snprintf(err, errlen, "nesting deeper than %u levels", max_depth);
        return -1;
    }
    /* a NUL byte is never JSON (raw in a string it is a control character), but jansson stops at
     * one after a value ("[1\0]" loads as [1]): refuse it as the validator does, with its words */
    if (memchr(buf, '\0', len) != NULL) {
        if (agw_json_validate(buf, len, max_depth, NULL, err, errlen) == 0)
            snprintf(err, errlen, "invalid JSON: NUL byte");
        return -1;
    }
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (v == NULL) {
        load_error(&je, err, errlen);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- per-state metatables ---- */

static int int64_arg(lua_State *L, int idx, int64_t *n)
{
    *n = 0; /* luaL_typerror does not return, but the compiler cannot know */
    if (!agw_json_check_int64(L, idx, n))
        return luaL_typerror(L, idx, "agg.int64");
    return 0;
}

static int int64_tostring(lua_State *L)
{
    int64_t n;
    int64_arg(L, 1, &n);
    char tmp[24];
    int len = snprintf(tmp, sizeof(tmp), "%lld", (long long)n);
    lua_pushlstring(L, tmp, (size_t)len);
    return 1;
}

static int int64_eq(lua_State *L)
{
    int64_t a, b;
    int64_arg(L, 1, &a);
    int64_arg(L, 2, &b);
    lua_pushboolean(L, a == b);
    return 1;
}

static int int64_lt(lua_State *L)
{
    int64_t a, b;
    int64_arg(L, 1, &a);
    int64_arg(L, 2, &b);
    lua_pushboolean(L, a < b);
    return 1;
}

static int int64_le(lua_State *L)
{
    int64_t a, b;
    int64_arg(L, 1, &a);
    int64_arg(L, 2, &b);
    lua_pushboolean(L, a <= b);
    return 1;
}

static int ref_gc(lua_State *L)
{
    json_t **p = lua_touserdata(L, 1);
    if (p && *p) {
        json_decref(*p);
        *p = NULL;
    }
    return 0;
}

static int ref_tostring(lua_State *L)
{
    lua_pushfstring(L, "agg.json.ref: %p", lua_touserdata(L, 1));
    return 1;
}

/* The C function of every raw ref's closure (json.h): what marks a raw ref. Calling a raw ref is a
 * mistake: it raises. */
static int raw_ref_call(lua_State *L)
{
    return luaL_error(L, "an agg.json raw ref is JSON text, not a function to call");
}

const char agw_json_regkey[AGW_JSON_NKEYS];
const char agw_json_order_mark;

/* Stores the value at the top of the stack (popped) as registry[name] and registry[key k]. */
static void set_reg(lua_State *L, const char *name, int k)
{
    lua_pushlightuserdata(L, (void *)&agw_json_regkey[k]);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    lua_setfield(L, LUA_REGISTRYINDEX, name);
}

/* Creates this state's registry entries on first use (json.h: AGW_JSON_*). */
static void ensure_state(lua_State *L)
{
    agw_json_regget(L, AGW_JSON_K_ORDER);
    int ready = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (ready)
        return;

    lua_newtable(L);
    lua_pushliteral(L, "agg.array");
    lua_setfield(L, -2, "__name");
    /* shared by every array of every script: protected like json.ordered's (getmetatable gives
     * the name, setmetatable raises), so no script changes how another one's arrays behave */
    lua_pushliteral(L, "agg.array");
    lua_setfield(L, -2, "__metatable");
    set_reg(L, AGW_JSON_ARRAY_MT, AGW_JSON_K_ARRAY);

    static const luaL_Reg int64_mt[] = {
        {"__tostring", int64_tostring}, {"__eq", int64_eq}, {"__lt", int64_lt}, {"__le", int64_le}, {NULL, NULL},
    };
    lua_newtable(L);
    luaL_register(L, NULL, int64_mt);
    lua_pushliteral(L, "agg.int64");
    lua_setfield(L, -2, "__name");
    lua_pushliteral(L, "agg.int64");
    lua_setfield(L, -2, "__metatable");
    set_reg(L, AGW_JSON_INT64_MT, AGW_JSON_K_INT64);

    static const luaL_Reg ref_mt[] = {{"__gc", ref_gc}, {"__tostring", ref_tostring}, {NULL, NULL}};
    lua_newtable(L);
    luaL_register(L, NULL, ref_mt);
    /* guarded like the others: Lua code cannot call __gc by hand (the ref would then hold NULL) */
    lua_pushliteral(L, "agg.json.ref");
    lua_setfield(L, -2, "__metatable");
    set_reg(L, AGW_JSON_REF_MT, AGW_JSON_K_REF);

    lua_newtable(L); /* order side table, weak keys so it never keeps an object alive */
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    set_reg(L, AGW_JSON_ORDER, AGW_JSON_K_ORDER); /* last: its presence means the state is ready */
}

/* Returns 1 if the value at idx has the metatable stored under registry key k (json.h). */
static int has_meta(lua_State *L, int idx, int k)
{
    if (!lua_getmetatable(L, idx))
        return 0;
    agw_json_regget(L, k);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same;
}

void agw_json_push_int64(lua_State *L, int64_t n)
{
    ensure_state(L);
    int64_t *p = lua_newuserdata(L, sizeof(*p));
    *p = n;
    agw_json_regget(L, AGW_JSON_K_INT64);
    lua_setmetatable(L, -2);
}

int agw_json_check_int64(lua_State *L, int idx, int64_t *out)
{
    if (lua_type(L, idx) != LUA_TUSERDATA || !has_meta(L, idx, AGW_JSON_K_INT64))
        return 0;
    *out = *(int64_t *)lua_touserdata(L, idx);
    return 1;
}

void agw_json_push_ref(lua_State *L, json_t *v)
{
    ensure_state(L);
    json_t **p = lua_newuserdata(L, sizeof(*p));
    *p = json_incref(v);
    agw_json_regget(L, AGW_JSON_K_REF);
    lua_setmetatable(L, -2);
}

json_t *agw_json_check_ref(lua_State *L, int idx)
{
    if (lua_type(L, idx) != LUA_TUSERDATA || !has_meta(L, idx, AGW_JSON_K_REF))
        return NULL;
    return *(json_t **)lua_touserdata(L, idx);
}

void agw_json_push_raw_ref(lua_State *L, const char *buf, size_t len, int compact, const char *extra,
                           size_t extra_len)
{
    lua_pushlstring(L, len > 0 ? buf : "", len); /* buf may be NULL when len is 0 */
    lua_pushboolean(L, compact != 0);
    if (extra_len > 0) {
        lua_pushlstring(L, extra, extra_len);
        lua_pushcclosure(L, raw_ref_call, 3);
    } else {
        lua_pushcclosure(L, raw_ref_call, 2);
    }
}

/* 1 when the value at idx is a raw ref (a closure of raw_ref_call), else 0. */
static int is_raw_ref(lua_State *L, int idx)
{
    return lua_tocfunction(L, idx) == raw_ref_call;
}

int agw_json_check_raw_ref(lua_State *L, int idx, agw_json_raw_t *out)
{
    if (!is_raw_ref(L, idx))
        return 0;
    if (idx < 0 && idx > LUA_REGISTRYINDEX)
        idx = lua_gettop(L) + idx + 1;
    /* the strings stay alive after the pops: the closure at idx holds them */
    lua_getupvalue(L, idx, 1);
    out->text = lua_tolstring(L, -1, &out->len);
    lua_getupvalue(L, idx, 2);
    out->compact = lua_toboolean(L, -1);
    lua_pop(L, 2);
    out->extra = NULL;
    out->extra_len = 0;
    if (lua_getupvalue(L, idx, 3) != NULL) {
        out->extra = lua_tolstring(L, -1, &out->extra_len);
        lua_pop(L, 1);
    }
    return 1;
}

int agw_json_is_ref(lua_State *L, int idx)
{
    return is_raw_ref(L, idx) || agw_json_check_ref(L, idx) != NULL;
}

/* ---- json_t -> Lua ---- */

/* Stack slots the recursion reads instead of looking them up per value. */
typedef struct {
    int order; /* absolute index of the order side table */
    int array; /* absolute index of the array metatable */
} push_ctx;

static void push_value(lua_State *L, const push_ctx *c, json_t *v);

static void push_object(lua_State *L, const push_ctx *c, json_t *v)
{
    size_t n = json_object_size(v);
    lua_createtable(L, 0, (int)n);
    if (n == 0)
        return; /* nothing to remember; an empty object encodes as {} anyway */
    lua_createtable(L, (int)n, 0);
    int i = 0;
    for (void *it = json_object_iter(v); it; it = json_object_iter_next(v, it)) {
        lua_pushlstring(L, json_object_iter_key(it), json_object_iter_key_len(it));
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, ++i);
        push_value(L, c, json_object_iter_value(it));
        lua_rawset(L, -4);
    }
    lua_pushvalue(L, -2); /* order[tbl] = keys */
    lua_insert(L, -2);
    lua_rawset(L, c->order);
}

static void push_array(lua_State *L, const push_ctx *c, json_t *v)
{
    size_t n = json_array_size(v);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        push_value(L, c, json_array_get(v, i));
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_pushvalue(L, c->array);
    lua_setmetatable(L, -2);
}

static void push_value(lua_State *L, const push_ctx *c, json_t *v)
{
    luaL_checkstack(L, 6, "JSON nested too deeply");
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        push_object(L, c, v);
        break;
    case JSON_ARRAY:
        push_array(L, c, v);
        break;
    case JSON_STRING:
        lua_pushlstring(L, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER: {
        json_int_t n = json_integer_value(v);
        if (n >= -EXACT_INT_MAX && n <= EXACT_INT_MAX)
            lua_pushnumber(L, (lua_Number)n);
        else
            agw_json_push_int64(L, n);
        break;
    }
    case JSON_REAL:
        lua_pushnumber(L, json_real_value(v));
        break;
    case JSON_TRUE:
        lua_pushboolean(L, 1);
        break;
    case JSON_FALSE:
        lua_pushboolean(L, 0);
        break;
    case JSON_NULL:
        lua_pushlightuserdata(L, NULL);
        break;
    }
}

void agw_json_push(lua_State *L, json_t *v)
{
    ensure_state(L);
    luaL_checkstack(L, 8, "JSON push");
    agw_json_regget(L, AGW_JSON_K_ORDER);
    agw_json_regget(L, AGW_JSON_K_ARRAY);
    push_ctx c = {lua_gettop(L) - 1, lua_gettop(L)};
    push_value(L, &c, v);
    lua_replace(L, c.order); /* move the value down over the two helper slots */
    lua_pop(L, 1);
}

/* ---- the agg.json module ---- */

/* agg.array([t]): t (or a new table) with the array metatable. A table with a metatable of its
 * own is refused: lua_setmetatable does not honour __metatable, so marking a shared read-only view
 * (the agg module, a library) would swap its protection for the array's and let a script write
 * into what every script of the worker shares. */
static int l_array(lua_State *L)
{
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    } else {
        luaL_checktype(L, 1, LUA_TTABLE);
        lua_settop(L, 1);
        if (lua_getmetatable(L, 1)) {
            lua_pop(L, 1);
            if (!has_meta(L, 1, AGW_JSON_K_ARRAY))
                return luaL_argerror(L, 1, "the table has a metatable of its own (agg.array marks a plain table)");
            return 1; /* already an array */
        }
    }
    agw_json_regget(L, AGW_JSON_K_ARRAY);
    lua_setmetatable(L, 1);
    return 1;
}

static int l_is_array(lua_State *L)
{
    lua_pushboolean(L, lua_type(L, 1) == LUA_TTABLE && has_meta(L, 1, AGW_JSON_K_ARRAY));
    return 1;
}

/* Parses a whole decimal integer string ("-123"); returns 0 on junk or overflow. */
static int parse_int64(const char *s, size_t len, int64_t *out)
{
    if (len == 0 || strlen(s) != len || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')))
        return 0;
    char *end;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno != 0 || end != s + len || end == s || (s[0] == '-' && len == 1))
        return 0;
    *out = n;
    return 1;
}

static int l_int64(lua_State *L)
{
    int64_t n;
    if (agw_json_check_int64(L, 1, &n)) {
        lua_settop(L, 1);
        return 1;
    }
    if (lua_type(L, 1) == LUA_TNUMBER) {
        double d = lua_tonumber(L, 1);
        if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
            return luaL_error(L, "agg.int64: %f is not an integer in int64 range", d);
        n = (int64_t)d;
    } else if (lua_type(L, 1) == LUA_TSTRING) {
        size_t len;
        const char *s = lua_tolstring(L, 1, &len);
        if (!parse_int64(s, len, &n))
            return luaL_error(L, "agg.int64: '%s' is not a decimal integer in int64 range", s);
    } else {
        return luaL_typerror(L, 1, "string or number");
    }
    agw_json_push_int64(L, n);
    return 1;
}

static int l_is_int64(lua_State *L)
{
    int64_t n;
    lua_pushboolean(L, agw_json_check_int64(L, 1, &n));
    return 1;
}

/* setorder(t, keys): records a copy of keys (strings, duplicates dropped) as t's key order;
 * setorder(t, nil) forgets it. */
static int l_setorder(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 2);
    agw_json_regget(L, AGW_JSON_K_ORDER); /* 3 */
    lua_pushvalue(L, 1);
    if (lua_isnil(L, 2)) {
        lua_pushnil(L);
        lua_rawset(L, 3);
        lua_settop(L, 1);
        return 1;
    }
    luaL_checktype(L, 2, LUA_TTABLE);
    /* a key list made by keys() is already checked and never changes: share it, no copy */
    lua_getfield(L, LUA_REGISTRYINDEX, "agw.json.frozen");
    if (lua_istable(L, -1)) {
        lua_pushvalue(L, 2);
        lua_rawget(L, -2);
        int frozen = lua_toboolean(L, -1);
        lua_pop(L, 2);
        if (frozen) {
            lua_pushvalue(L, 2);
            lua_rawset(L, 3);
            lua_settop(L, 1);
            return 1;
        }
    } else {
        lua_pop(L, 1);
    }
    int n = (int)lua_objlen(L, 2);
    lua_createtable(L, n, 0); /* 5: the copy */
    lua_createtable(L, 0, n); /* 6: seen */
    int out = 0;
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        if (lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "agg.json.setorder: key #%d is a %s, not a string", i, luaL_typename(L, -1));
        lua_pushvalue(L, -1);
        lua_rawget(L, 6);
        int dup = !lua_isnil(L, -1);
        lua_pop(L, 1);
        if (!dup) {
            lua_pushvalue(L, -1);
            lua_pushboolean(L, 1);
            lua_rawset(L, 6);
            lua_rawseti(L, 5, ++out);
        } else {
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_rawset(L, 3);
    lua_settop(L, 1);
    return 1;
}

/* keys(list) -> a checked, de-duplicated copy of list that setorder shares instead of copying;
 * for key orders fixed in code (a page section's status, data, error). Do not change it later. */
static int l_keys(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    lua_newtable(L);     /* 2: scratch table for setorder to fill */
    lua_pushcfunction(L, l_setorder);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 1);
    lua_call(L, 2, 0);   /* checks and copies the list into the order table */
    agw_json_regget(L, AGW_JSON_K_ORDER);
    lua_pushvalue(L, 2);
    lua_rawget(L, -2);   /* the copy */
    lua_getfield(L, LUA_REGISTRYINDEX, "agw.json.frozen");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "agw.json.frozen");
    }
    lua_pushvalue(L, -2);
    lua_pushboolean(L, 1);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    return 1;
}

/* ordered(list[, name]) -> a metatable for objects whose members encode in list's order (list as
 * for keys()): setmetatable({ status = …, data = … }, M). Members not in the list follow, sorted,
 * as for setorder. For objects the gateway makes many times with the same keys (a page's sections,
 * problems): a metatable costs nothing per object, where setorder records each object in a side
 * table. The metatable is shared by every such object of every request, so it is protected:
 * getmetatable(obj) gives name (default "agg.json.ordered") and setmetatable(obj, …) raises, so
 * that no script can change how another script's objects encode. */
static int l_ordered(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    const char *name = luaL_optstring(L, 2, "agg.json.ordered");
    lua_settop(L, 1);
    lua_pushcfunction(L, l_keys);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1); /* 2: the checked copy */
    lua_createtable(L, 0, 2);
    lua_pushlightuserdata(L, (void *)&agw_json_order_mark);
    lua_pushvalue(L, 2);
    lua_rawset(L, -3);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__metatable");
    return 1;
}

static int l_decode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    lua_Number max_nodes = luaL_optnumber(L, 2, 0); /* 0: no cap */
    char err[160];
    if (agw_json_validate(s, len, AGW_JSON_MAX_DEPTH, NULL, err, sizeof(err)) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    if (max_nodes >= 1 && max_nodes < 1e15) {
        size_t cap = (size_t)max_nodes;
        if (agw_json_count_nodes(s, len, cap) > cap) {
            lua_pushnil(L);
            lua_pushfstring(L, "more than %d values and member names", (int)(cap < 0x7fffffff ? cap : 0x7fffffff));
            return 2;
        }
    }
    ensure_state(L);
    agw_json_push_text(L, s, len); /* Lua strings end in NUL, as push_text needs */
    return 1;
}

/* parse(s [, extra]) -> raw ref | nil, err: validates like an upstream body is validated (the same
 * limits), without parsing it; extra (bytes, optional) is kept with it for raw_extra, as the
 * transport keeps a response's header block. The spec harness gives stubbed answers to the
 * runtime this way. */
static int l_parse(lua_State *L)
{
    size_t len, elen = 0;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *extra = luaL_optlstring(L, 2, NULL, &elen);
    char err[160];
    int compact;
    if (agw_json_validate(s, len, AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    agw_json_push_raw_ref(L, s, len, compact, extra, elen);
    return 1;
}

/* raw(ref) -> string: the text of a raw ref (the ref's own string). */
static int l_raw(lua_State *L)
{
    if (!is_raw_ref(L, 1))
        return luaL_typerror(L, 1, "agg.json raw ref");
    lua_getupvalue(L, 1, 1);
    return 1;
}

/* A header block kept past this size in a thread's scratch (raw_extra) is freed after use: the
 * scratch holds what common answers need, not the largest header section it ever saw. */
#define EXTRA_SCRATCH_KEEP 16384

/* raw_extra(ref) -> string | nil: the header block (base/header.h: "name\0value\0…", names
 * lowercased, each once) of the fields kept after a raw ref's text (agw_json_push_raw_ref's extra:
 * an upstream body's response headers as they came, or a block already), nil when none. The block
 * is made here, when read, not for every answer, in a buffer the thread keeps for it (a Lua error
 * in lua_pushlstring, out of memory, leaves it to the next call: nothing leaks). */
static int l_raw_extra(lua_State *L)
{
    static __thread agw_buf_t scratch = AGW_BUF_INIT;
    agw_json_raw_t r;
    if (!agw_json_check_raw_ref(L, 1, &r))
        return luaL_typerror(L, 1, "agg.json raw ref");
    if (r.extra_len == 0)
        return 0;
    if (scratch.cap > EXTRA_SCRATCH_KEEP)
        agw_buf_free(&scratch);
    agw_buf_reset(&scratch);
    agw_header_block_of_pairs(&scratch, r.extra, r.extra_len);
    lua_pushlstring(L, scratch.len ? scratch.base : "", scratch.len);
    return 1;
}

static int l_is_ref(lua_State *L)
{
    lua_pushboolean(L, agw_json_is_ref(L, 1));
    return 1;
}

/* The answer of encode and encode_rows: the text in b when rc is 0, else nil and err. Frees b. */
static int push_encoded(lua_State *L, int rc, agw_buf_t *b, const char *err)
{
    if (rc == 0)
        lua_pushlstring(L, b->base, b->len); /* may raise only on out of memory */
    agw_buf_free(b);
    if (rc != 0) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    return 1;
}

static int l_encode(lua_State *L)
{
    luaL_checkany(L, 1);
    agw_buf_t b = AGW_BUF_INIT;
    char err[256];
    /* the text becomes a string of the scripts' heap: in a script's call its room under
     * script_memory_limit_mb bounds the text (and the C buffer it is written in) as it is made,
     * with 4 MB more (base/heap.h AGW_LUA_HUGE_BLOCK); past it, once more after a collection,
     * then an error as any other encoding error */
    agw_lua_heap_t *h = agw_heap_lua_of(L);
    size_t room = agw_heap_lua_room(h);
    int rc;
    for (int again = 0;; again++) {
        size_t max = room < AGW_JSON_ENCODE_MAX_BYTES - AGW_LUA_HUGE_BLOCK ? room + AGW_LUA_HUGE_BLOCK
                                                                           : AGW_JSON_ENCODE_MAX_BYTES;
        rc = agw_json_encode_max(L, 1, &b, max, err, sizeof(err));
        /* the heap's bound stopped it (a value the text could not take), or the last value passed
         * it (the bound is checked before each value) */
        int bounded = max < AGW_JSON_ENCODE_MAX_BYTES && (b.len > max || (rc != 0 && strncmp(err, "more than ", 10) == 0));
        if (!bounded)
            break;
        rc = -1;
        if (again) {
            snprintf(err, sizeof(err), "not enough memory: the text would take the scripts' heap past "
                                       "script_memory_limit_mb");
            break;
        }
        lua_gc(L, LUA_GCCOLLECT, 0); /* garbage does not count */
        room = agw_heap_lua_room(h);
        agw_buf_reset(&b);
    }
    return push_encoded(L, rc, &b, err);
}

/* encode_rows(rows, members) -> string | nil, err (agw_json_encode_rows) */
static int l_encode_rows(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *members[AGW_JSON_ROW_MEMBERS];
    int n = (int)lua_objlen(L, 2);
    if (n > AGW_JSON_ROW_MEMBERS)
        return luaL_error(L, "encode_rows: at most %d members", AGW_JSON_ROW_MEMBERS);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "encode_rows: member names must be strings");
        members[i] = lua_tostring(L, -1); /* held by the members table */
        lua_pop(L, 1);
    }
    agw_buf_t b = AGW_BUF_INIT;
    char err[256];
    int rc = agw_json_encode_rows(L, 1, members, n, &b, err, sizeof(err));
    return push_encoded(L, rc, &b, err);
}

/* materialize(ref) -> the ref's JSON as Lua values; any other value is returned unchanged. */
static int l_materialize(lua_State *L)
{
    luaL_checkany(L, 1);
    json_t *tree = agw_json_check_ref(L, 1);
    agw_json_raw_t r;
    if (tree != NULL) {
        agw_json_push(L, tree);
    } else if (agw_json_check_raw_ref(L, 1, &r)) {
        ensure_state(L); /* the Lua values straight from the validated text (json/push.c) */
        agw_json_push_text(L, r.text, r.len);
    } else {
        lua_settop(L, 1);
    }
    return 1;
}

int agw_json_open(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        {"array", l_array},       {"is_array", l_is_array},       {"int64", l_int64},
        {"is_int64", l_is_int64}, {"setorder", l_setorder},       {"decode", l_decode},
        {"encode", l_encode},     {"materialize", l_materialize}, {"parse", l_parse},
        {"keys", l_keys},         {"ordered", l_ordered},         {"raw", l_raw},
        {"raw_extra", l_raw_extra}, {"is_ref", l_is_ref},         {"encode_rows", l_encode_rows},
        {NULL, NULL},
    };
    ensure_state(L);
    luaL_newlib(L, funcs);
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
    return 1;
}
