/* router.c: route table (see router.h). */
#include "script/router.h"

#include "base/hex.h"
#include "base/luamod.h"
#include "base/mem.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int agw_router_add(agw_router_t *r, const char *method, const char *pattern, const agw_route_seg_t *segs,
                   size_t num_segs, int endpoint, char *err, size_t errlen)
{
    if (num_segs > AGW_ROUTE_MAX_SEGMENTS) {
        snprintf(err, errlen, "route '%s' has more than %d segments", pattern, AGW_ROUTE_MAX_SEGMENTS);
        return -1;
    }
    size_t params = 0;
    for (size_t i = 0; i < num_segs; i++)
        params += segs[i].is_param;
    if (params > AGW_ROUTE_MAX_PARAMS) {
        snprintf(err, errlen, "route '%s' has more than %d parameters", pattern, AGW_ROUTE_MAX_PARAMS);
        return -1;
    }
    agw_route_pattern_t *compiled[AGW_ROUTE_MAX_SEGMENTS] = {0};
    for (size_t i = 0; i < num_segs; i++) {
        if (!segs[i].is_param || segs[i].pattern == NULL)
            continue;
        char why[256];
        compiled[i] = agw_route_pattern_compile(segs[i].pattern, segs[i].pattern_len, why, sizeof(why));
        if (compiled[i] == NULL) {
            snprintf(err, errlen, "route '%s': {%.*s:…}: %s", pattern, (int)segs[i].len, segs[i].text, why);
            for (size_t k = 0; k < i; k++)
                agw_route_pattern_free(compiled[k]);
            return -1;
        }
    }
    agw_route_t *n = agw_realloc(r->routes, (r->num_routes + 1) * sizeof(*n));
    r->routes = n;
    agw_route_t *rt = &r->routes[r->num_routes++];
    rt->method = agw_strdup(method);
    rt->pattern = agw_strdup(pattern);
    rt->endpoint = endpoint;
    rt->num_segs = num_segs;
    rt->segs = agw_calloc(num_segs ? num_segs : 1, sizeof(*rt->segs));
    for (size_t i = 0; i < num_segs; i++) {
        rt->segs[i].text = agw_strndup(segs[i].text, segs[i].len);
        rt->segs[i].len = segs[i].len;
        rt->segs[i].is_param = segs[i].is_param;
        rt->segs[i].compiled = compiled[i];
    }
    return 0;
}

/* The segment that the '/' at *pos of path starts: *seg and *len (up to the next '/' or the end),
 * *pos moved past the '/' (the caller adds *len once it took the segment). Returns 0 when there is
 * no '/' at *pos (the path has no more segments). */
static inline int next_segment(const char *path, size_t path_len, size_t *pos, const char **seg, size_t *len)
{
    if (*pos >= path_len || path[*pos] != '/')
        return 0;
    (*pos)++;
    *seg = path + *pos;
    const char *end = memchr(*seg, '/', path_len - *pos);
    *len = end ? (size_t)(end - *seg) : path_len - *pos;
    return 1;
}

/* Whether request segment seg (len bytes, as sent) is the literal segment lit (lit_len bytes) once
 * its %XX escapes are decoded, in either hex case. An upstream that decodes its path reads
 * /users/%61dmin or /users/me%3Aadmin as /users/admin or /users/me:admin (RFC 3986 §6.2.2.2 for
 * the unreserved characters; most servers decode the sub-delims, ':' and '@' too), so the literal
 * route serves such a spelling, with its auth and limits, and no parameter route beside it does (an
 * attack review). A malformed escape never matches. Costs a memcmp as before unless the segment is
 * longer than the literal and holds a '%'. */
static int seg_is_literal(const char *seg, size_t len, const char *lit, size_t lit_len)
{
    if (len == lit_len)
        return memcmp(seg, lit, len) == 0;
    if (len < lit_len || memchr(seg, '%', len) == NULL) /* (an escape is longer than its byte) */
        return 0;
    size_t j = 0;
    for (size_t i = 0; i < len; i++, j++) {
        unsigned char c = (unsigned char)seg[i];
        if (c == '%') {
            int h = i + 2 < len ? agw_hex_digit((unsigned char)seg[i + 1]) : -1;
            int l = i + 2 < len ? agw_hex_digit((unsigned char)seg[i + 2]) : -1;
            if (h < 0 || l < 0)
                return 0;
            c = (unsigned char)(h * 16 + l);
            i += 2;
        }
        if (j >= lit_len || (unsigned char)lit[j] != c)
            return 0;
    }
    return j == lit_len;
}

/* Whether path[pos..) matches the segments of rt from index i on, parameters taking any segment:
 * a bad parameter is a 400 only for a path of a route's shape. */
static int match_rest_shape(const agw_route_t *rt, size_t i, const char *path, size_t pos, size_t path_len)
{
    for (; i < rt->num_segs; i++) {
        const char *seg;
        size_t len;
        if (!next_segment(path, path_len, &pos, &seg, &len))
            return 0;
        if (!rt->segs[i].is_param && !seg_is_literal(seg, len, rt->segs[i].text, rt->segs[i].len))
            return 0;
        pos += len;
    }
    return pos == path_len;
}

/* Matches the path against one route's segments; fills params. Returns 1 when it matches, 0 when
 * not, -1 when it would but for a parameter holding characters route_param.h refuses. */
static int match_path(const agw_route_t *rt, const char *path, size_t path_len, agw_route_param_t *params,
                      size_t *num_params)
{
    size_t np = 0, pos = 0;
    if (path_len == 0 || path[0] != '/')
        return 0;
    if (rt->num_segs == 0)
        return path_len == 1;
    for (size_t i = 0; i < rt->num_segs; i++) {
        const char *seg;
        size_t len;
        if (!next_segment(path, path_len, &pos, &seg, &len))
            return 0;
        const agw_route_seg_t *s = &rt->segs[i];
        if (s->is_param) {
            /* "." and ".." never fill a parameter: a script writing "/items/" .. id must not be
             * turned into a walk up the upstream's paths */
            if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
                return 0;
            if (!agw_route_param_valid(seg, len))
                return match_rest_shape(rt, i + 1, path, pos + len, path_len) ? -1 : 0;
            if (s->compiled && !agw_route_pattern_match(s->compiled, seg, len))
                return 0;
            params[np].name = s->text;
            params[np].name_len = s->len;
            params[np].value = seg;
            params[np].value_len = len;
            np++;
        } else if (!seg_is_literal(seg, len, s->text, s->len)) {
            return 0;
        }
        pos += len;
    }
    if (pos != path_len)
        return 0;
    *num_params = np;
    return 1;
}

agw_route_result_t agw_router_match(const agw_router_t *r, const char *method, size_t method_len, const char *path,
                                    size_t path_len, int *endpoint, agw_route_param_t *params, size_t *num_params,
                                    char *allow, size_t allow_size)
{
    int other_method = 0, bad_param = 0;
    size_t alen = 0;
    if (allow_size)
        allow[0] = '\0';
    for (size_t i = 0; i < r->num_routes; i++) {
        const agw_route_t *rt = &r->routes[i];
        size_t np = 0;
        int m = match_path(rt, path, path_len, params, &np);
        if (m < 0)
            bad_param = 1;
        if (m <= 0)
            continue;
        int same = strlen(rt->method) == method_len && memcmp(rt->method, method, method_len) == 0;
        /* HEAD is served by a GET route when there is no HEAD route of its own */
        if (!same && method_len == 4 && memcmp(method, "HEAD", 4) == 0 && strcmp(rt->method, "GET") == 0)
            same = 1;
        if (same) {
            *endpoint = rt->endpoint;
            *num_params = np;
            return AGW_ROUTE_FOUND;
        }
        other_method = 1;
        size_t ml = strlen(rt->method);
        if (allow_size && alen + ml + 3 < allow_size && strstr(allow, rt->method) == NULL) {
            if (alen) {
                memcpy(allow + alen, ", ", 2);
                alen += 2;
            }
            memcpy(allow + alen, rt->method, ml);
            alen += ml;
            allow[alen] = '\0';
        }
    }
    /* a GET route answers HEAD too (above), so Allow says so (RFC 9110 §10.2.1, §9.3.2) */
    if (allow_size && strstr(allow, "GET") != NULL && strstr(allow, "HEAD") == NULL && alen + 6 < allow_size) {
        memcpy(allow + alen, ", HEAD", 7);
        alen += 6;
    }
    if (bad_param)
        return AGW_ROUTE_BAD_PARAM;
    return other_method ? AGW_ROUTE_METHOD_NOT_ALLOWED : AGW_ROUTE_NOT_FOUND;
}

void agw_router_free(agw_router_t *r)
{
    for (size_t i = 0; i < r->num_routes; i++) {
        for (size_t j = 0; j < r->routes[i].num_segs; j++) {
            free(r->routes[i].segs[j].text);
            agw_route_pattern_free(r->routes[i].segs[j].compiled);
        }
        free(r->routes[i].segs);
        free(r->routes[i].method);
        free(r->routes[i].pattern);
    }
    free(r->routes);
    r->routes = NULL;
    r->num_routes = 0;
}

/* ---- routes from Lua, and the agg.router module ---------------------------------------------- */

static char *lua_strdup_field(lua_State *L, int idx, const char *name)
{
    lua_getfield(L, idx, name);
    const char *s = lua_tostring(L, -1);
    char *out = agw_strdup(s ? s : "");
    lua_pop(L, 1);
    return out;
}

int agw_router_add_lua(agw_router_t *r, lua_State *L, int idx, int endpoint, char *err, size_t errlen)
{
    int top = lua_gettop(L);
    if (idx < 0)
        idx = top + idx + 1;
    char *method = lua_strdup_field(L, idx, "method");
    char *route = lua_strdup_field(L, idx, "route");
    agw_route_seg_t segs[AGW_ROUTE_MAX_SEGMENTS + 1];
    memset(segs, 0, sizeof(segs));
    lua_getfield(L, idx, "segments");
    int segs_idx = lua_gettop(L);
    size_t ns = lua_objlen(L, segs_idx);
    int rc;
    if (ns > AGW_ROUTE_MAX_SEGMENTS) {
        snprintf(err, errlen, "route '%s' has more than %d segments", route, AGW_ROUTE_MAX_SEGMENTS);
        rc = -1;
    } else {
        luaL_checkstack(L, (int)ns * 3 + 2, "route segments");
        for (size_t j = 0; j < ns; j++) {
            lua_rawgeti(L, segs_idx, (int)j + 1); /* stays on the stack: the strings live while it does */
            if (lua_istable(L, -1)) {
                lua_getfield(L, -1, "param");
                segs[j].text = (char *)lua_tolstring(L, -1, &segs[j].len);
                lua_getfield(L, -2, "pattern");
                segs[j].pattern = lua_tolstring(L, -1, &segs[j].pattern_len);
                segs[j].is_param = 1;
            } else {
                segs[j].text = (char *)lua_tolstring(L, -1, &segs[j].len);
            }
        }
        rc = agw_router_add(r, method, route, segs, ns, endpoint, err, errlen);
    }
    lua_settop(L, top);
    free(method);
    free(route);
    return rc;
}

#define ROUTER_MT "agg.router"

static int l_compile(lua_State *L)
{
    size_t len;
    const char *src = luaL_checklstring(L, 1, &len);
    char err[256];
    agw_route_pattern_t *p = agw_route_pattern_compile(src, len, err, sizeof(err));
    if (p == NULL) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    agw_route_pattern_free(p);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    agw_router_t *r = lua_newuserdata(L, sizeof(*r));
    memset(r, 0, sizeof(*r));
    luaL_getmetatable(L, ROUTER_MT);
    lua_setmetatable(L, -2);
    size_t n = lua_objlen(L, 1);
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 1, (int)i + 1);
        char err[512];
        if (agw_router_add_lua(r, L, -1, (int)i + 1, err, sizeof(err)) != 0)
            return luaL_error(L, "%s", err);
        lua_pop(L, 1);
    }
    return 1;
}

static int l_match(lua_State *L)
{
    agw_router_t *r = luaL_checkudata(L, 1, ROUTER_MT);
    size_t mlen, plen;
    const char *method = luaL_checklstring(L, 2, &mlen);
    const char *path = luaL_checklstring(L, 3, &plen);
    int endpoint = 0;
    agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
    size_t np = 0;
    char allow[128];
    switch (agw_router_match(r, method, mlen, path, plen, &endpoint, params, &np, allow, sizeof(allow))) {
    case AGW_ROUTE_FOUND:
        lua_pushliteral(L, "found");
        lua_pushinteger(L, endpoint);
        lua_createtable(L, 0, (int)np);
        for (size_t i = 0; i < np; i++) {
            lua_pushlstring(L, params[i].name, params[i].name_len);
            lua_pushlstring(L, params[i].value, params[i].value_len);
            lua_rawset(L, -3);
        }
        return 3;
    case AGW_ROUTE_METHOD_NOT_ALLOWED:
        lua_pushliteral(L, "method_not_allowed");
        lua_pushstring(L, allow);
        return 2;
    case AGW_ROUTE_BAD_PARAM:
        lua_pushliteral(L, "bad_param");
        return 1;
    default:
        lua_pushliteral(L, "not_found");
        return 1;
    }
}

static int l_gc(lua_State *L)
{
    agw_router_free(luaL_checkudata(L, 1, ROUTER_MT));
    return 0;
}

int agw_router_open(lua_State *L)
{
    static const luaL_Reg methods[] = {{"match", l_match}, {NULL, NULL}};
    static const luaL_Reg fns[] = {{"compile", l_compile}, {"new", l_new}, {NULL, NULL}};
    agw_luamod_class(L, ROUTER_MT, methods, l_gc);
    lua_pop(L, 1);
    luaL_newlib(L, fns);
    return 1;
}
