/* fuzz_router.c: route patterns and matching (agg.loader.parse_route, agw_router_add_lua,
 * gateway/script/router.h).
 *
 * Input: lines (LF). Lines up to one that reads "--" are routes as a script writes them
 * ("GET /product-page/{id}"); each goes through agg.loader's parse_route in the runtime's Lua VM
 * and, when accepted, into a route table through agw_router_add_lua, as a generation's routes do
 * (endpoint = its line). The lines after "--" are requests, "METHOD /path". Checked:
 *   - an accepted route's segments rebuild its path, literals hold RFC 3986 path characters only
 *     (pchar without percent-encoding), parameter names are identifiers and differ;
 *   - every request's result equals a reference matcher written here (path split at '/', table
 *     order, HEAD served by GET; a literal segment matched by the request's segment decoded, so
 *     /users/%61dmin is /users/admin's; a parameter's characters and pattern judged by route_param.h):
 *     the same endpoint on a match, 400 when no route matches and one would with a parameter
 *     route_param.h refuses, 405 with exactly the other methods that match the path in Allow
 *     (plus HEAD after GET), 404 otherwise;
 *   - captured parameters are the route's names in order, and slices of the path that are
 *     neither empty nor "." nor ".." and hold no '/'. */
#include <ctype.h>
#include <stdint.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route/route_param.h"
#include "script/router.h"
#include "script/script.h"

#define MAX_ROUTES 64

typedef struct {
    char method[16];
    size_t nsegs;
    char *segs[AGW_ROUTE_MAX_SEGMENTS];
    size_t lens[AGW_ROUTE_MAX_SEGMENTS];
    int is_param[AGW_ROUTE_MAX_SEGMENTS];
    agw_route_pattern_t *pattern[AGW_ROUTE_MAX_SEGMENTS];
} ref_route_t;

static lua_State *L;
static int parse_ref = LUA_NOREF;

static void free_ref(ref_route_t *r)
{
    for (size_t j = 0; j < r->nsegs; j++) {
        free(r->segs[j]);
        agw_route_pattern_free(r->pattern[j]);
    }
    r->nsegs = 0;
}

static void fail(const char *what, const char *a, size_t alen)
{
    fprintf(stderr, "fuzz_router: %s: %.*s\n", what, (int)alen, a);
    abort();
}

/* Reference: whether a request's segment spells a route's literal segment. It is decoded whole
 * (%XX in either hex case; a malformed escape spells nothing) and compared with the literal, which
 * holds no '%'. */
static int ref_literal(const char *s, size_t len, const char *lit, size_t lit_len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++, n++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= len || !isxdigit((unsigned char)s[i + 1]) || !isxdigit((unsigned char)s[i + 2]))
                return 0;
            char hex[3] = {s[i + 1], s[i + 2], '\0'};
            c = (char)strtol(hex, NULL, 16);
            i += 2;
        }
        if (n >= lit_len || lit[n] != c)
            return 0;
    }
    return n == lit_len;
}

/* Reference: 1 when path matches route r, -1 when it would but for a parameter route_param.h
 * refuses, 0 when not (router.h's rules, segment by segment from the left). */
static int ref_match(const ref_route_t *r, const char *path, size_t n)
{
    if (n == 0 || path[0] != '/')
        return 0;
    if (r->nsegs == 0)
        return n == 1;
    const char *segs[AGW_ROUTE_MAX_SEGMENTS];
    size_t lens[AGW_ROUTE_MAX_SEGMENTS], count = 0, start = 1;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && path[i] != '/')
            continue;
        if (count == r->nsegs)
            return 0; /* more segments than the route */
        segs[count] = path + start;
        lens[count++] = i - start;
        start = i + 1;
    }
    if (count != r->nsegs)
        return 0;
    for (size_t k = 0; k < count; k++) {
        const char *s = segs[k];
        size_t len = lens[k];
        if (!r->is_param[k]) {
            if (!ref_literal(s, len, r->segs[k], r->lens[k]))
                return 0;
            continue;
        }
        if (len == 0 || (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
            return 0;
        if (!agw_route_param_valid(s, len)) {
            for (size_t j = k + 1; j < count; j++)
                if (!r->is_param[j] && !ref_literal(segs[j], lens[j], r->segs[j], r->lens[j]))
                    return 0;
            return -1;
        }
        if (r->pattern[k] && !agw_route_pattern_match(r->pattern[k], s, len))
            return 0;
    }
    return 1;
}

static void check_allow(const char *allow, const ref_route_t *routes, size_t nroutes, const char *path, size_t pl)
{
    /* every method in Allow matches the path (or is HEAD beside GET), and every one that does is in it */
    char want[256] = "";
    int get = 0;
    for (size_t i = 0; i < nroutes; i++) {
        if (ref_match(&routes[i], path, pl) != 1)
            continue;
        get |= strcmp(routes[i].method, "GET") == 0;
        char item[20];
        snprintf(item, sizeof(item), "%s%s", want[0] ? ", " : "", routes[i].method);
        /* one mention per method */
        char probe[20];
        snprintf(probe, sizeof(probe), "%s", routes[i].method);
        int dup = 0;
        for (const char *p = want; (p = strstr(p, probe)) != NULL; p++)
            if ((p == want || p[-1] == ' ') && (p[strlen(probe)] == ',' || p[strlen(probe)] == '\0'))
                dup = 1;
        if (!dup)
            strcat(want, item);
    }
    if (get && strstr(want, "HEAD") == NULL)
        strcat(want, ", HEAD");
    if (strcmp(want, allow) != 0) {
        fprintf(stderr, "Allow: got '%s', want '%s'\n", allow, want);
        fail("wrong Allow for", path, pl);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL) {
        L = agw_vm_new(NULL);
        lua_getglobal(L, "require");
        lua_pushliteral(L, "agg.loader");
        if (lua_pcall(L, 1, 1, 0) != 0) {
            fprintf(stderr, "fuzz_router: %s\n", lua_tostring(L, -1));
            abort();
        }
        lua_getfield(L, -1, "parse_route");
        parse_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        lua_pop(L, 1);
    }
    static ref_route_t routes[MAX_ROUTES];
    size_t nroutes = 0;
    agw_router_t router = {0};
    const char *p = (const char *)data, *end = p + size;
    int in_routes = 1, line = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *s = p;
        p = nl ? nl + 1 : end;
        line++;
        if (in_routes && len == 2 && s[0] == '-' && s[1] == '-') {
            in_routes = 0;
            continue;
        }
        if (in_routes) {
            if (nroutes == MAX_ROUTES)
                continue;
            int top = lua_gettop(L);
            lua_rawgeti(L, LUA_REGISTRYINDEX, parse_ref);
            lua_pushlstring(L, s, len);
            if (lua_pcall(L, 1, 2, 0) != 0)
                fail("parse_route raised an error", lua_tostring(L, -1), strlen(lua_tostring(L, -1)));
            if (lua_isnil(L, -2)) {
                if (!lua_isstring(L, -1))
                    fail("parse_route refused without a message", s, len);
                lua_settop(L, top);
                continue;
            }
            lua_pop(L, 1);
            int e = lua_gettop(L);
            lua_pushlstring(L, s, len);
            lua_setfield(L, e, "route");
            /* the reference's copy, and the rebuilt path */
            ref_route_t *r = &routes[nroutes];
            lua_getfield(L, e, "method");
            snprintf(r->method, sizeof(r->method), "%s", lua_tostring(L, -1));
            lua_pop(L, 1);
            lua_getfield(L, e, "segments");
            size_t ns = lua_objlen(L, -1);
            agw_buf_t rebuilt = AGW_BUF_INIT;
            int ok = ns <= AGW_ROUTE_MAX_SEGMENTS;
            size_t params = 0;
            for (size_t j = 0; ok && j < ns; j++) {
                lua_rawgeti(L, -1, (int)j + 1);
                int is_param = lua_istable(L, -1);
                size_t patl = 0;
                const char *pat = NULL;
                r->pattern[j] = NULL;
                if (is_param) {
                    lua_getfield(L, -1, "pattern");
                    pat = lua_tolstring(L, -1, &patl);
                    if (pat) {
                        char perr[256];
                        r->pattern[j] = agw_route_pattern_compile(pat, patl, perr, sizeof(perr));
                        if (r->pattern[j] == NULL)
                            fail("parse_route accepted a pattern the router cannot compile", perr, strlen(perr));
                    }
                    lua_pop(L, 1);
                    lua_getfield(L, -1, "param");
                }
                size_t sl;
                const char *seg = lua_tolstring(L, -1, &sl);
                if (seg == NULL)
                    fail("a segment that is no string", s, len);
                r->segs[j] = malloc(sl + 1);
                memcpy(r->segs[j], seg, sl + 1);
                r->lens[j] = sl;
                r->is_param[j] = is_param;
                params += is_param;
                if (is_param && pat) { /* the pattern's bytes as they are (a NUL included) */
                    agw_buf_printf(&rebuilt, "/{%s:", seg);
                    agw_buf_append(&rebuilt, pat, patl);
                    agw_buf_putc(&rebuilt, '}');
                } else
                    agw_buf_printf(&rebuilt, is_param ? "/{%s}" : "/%s", seg);
                if (is_param) {
                    if (sl == 0 || !(seg[0] == '_' || ((seg[0] | 0x20) >= 'a' && (seg[0] | 0x20) <= 'z')))
                        fail("a parameter name that is no identifier", s, len);
                    for (size_t k = 0; k < j; k++)
                        if (r->is_param[k] && strcmp(r->segs[k], seg) == 0)
                            fail("a parameter twice", s, len);
                } else {
                    /* RFC 3986 pchar without pct-encoded */
                    for (size_t k = 0; k < sl; k++)
                        if (!isalnum((unsigned char)seg[k]) && strchr("-._~!$&'()*+,;=:@", seg[k]) == NULL)
                            fail("a literal segment with a byte that is no path character", s, len);
                }
                lua_pop(L, is_param ? 2 : 1);
            }
            lua_pop(L, 1);
            r->nsegs = ok ? ns : 0;
            if (ns == 0)
                agw_buf_putc(&rebuilt, '/');
            size_t rebuilt_len = rebuilt.len;
            agw_buf_putc(&rebuilt, '\0');
            /* the route's path is its last run of non-space bytes */
            size_t k = len;
            while (k > 0 && s[k - 1] != ' ' && s[k - 1] != '\t' && s[k - 1] != '\n' && s[k - 1] != '\r' &&
                   s[k - 1] != '\v' && s[k - 1] != '\f')
                k--;
            if (ok && (rebuilt_len != len - k || memcmp(rebuilt.base, s + k, len - k) != 0))
                fail("segments do not rebuild the route's path", s, len);
            agw_buf_free(&rebuilt);
            size_t before = router.num_routes;
            char aerr[512];
            int rc = agw_router_add_lua(&router, L, e, line, aerr, sizeof(aerr));
            if (lua_gettop(L) != e)
                fail("agw_router_add_lua moved the Lua stack", s, len);
            int want_ok = ok && params <= AGW_ROUTE_MAX_PARAMS;
            if ((rc == 0) != want_ok || router.num_routes != before + (rc == 0))
                fail("agw_router_add_lua's limits", s, len);
            if (rc == 0)
                nroutes++;
            else
                free_ref(r);
            lua_settop(L, top);
            continue;
        }
        /* a request: METHOD SP path */
        const char *sp = memchr(s, ' ', len);
        if (sp == NULL)
            continue;
        const char *m = s, *path = sp + 1;
        size_t ml = (size_t)(sp - s), pl = len - ml - 1;
        int endpoint = 0;
        agw_route_param_t params[AGW_ROUTE_MAX_PARAMS];
        size_t np = 0;
        char allow[128];
        agw_route_result_t res = agw_router_match(&router, m, ml, path, pl, &endpoint, params, &np, allow, sizeof(allow));
        /* the reference: first matching route with the method (HEAD also takes a GET route) */
        size_t want = MAX_ROUTES, any = 0, bad = 0;
        for (size_t i = 0; i < nroutes && want == MAX_ROUTES; i++) {
            int mr = ref_match(&routes[i], path, pl);
            bad |= mr < 0;
            if (mr != 1)
                continue;
            any = 1;
            size_t rl = strlen(routes[i].method);
            if ((rl == ml && memcmp(routes[i].method, m, ml) == 0) ||
                (ml == 4 && memcmp(m, "HEAD", 4) == 0 && strcmp(routes[i].method, "GET") == 0))
                want = i;
        }
        if (want != MAX_ROUTES) {
            if (res != AGW_ROUTE_FOUND || endpoint != router.routes[want].endpoint)
                fail("router and reference differ (found)", s, len);
            const ref_route_t *r = &routes[want];
            size_t pi = 0;
            for (size_t j = 0; j < r->nsegs; j++) {
                if (!r->is_param[j])
                    continue;
                const agw_route_param_t *q = &params[pi++];
                if (q->name_len != r->lens[j] || memcmp(q->name, r->segs[j], q->name_len) != 0)
                    fail("a parameter with another name", s, len);
                if (q->value < path || q->value + q->value_len > path + pl || q->value_len == 0 ||
                    memchr(q->value, '/', q->value_len) != NULL ||
                    (q->value_len <= 2 && memcmp(q->value, "..", q->value_len) == 0))
                    fail("a parameter value that is no path segment", s, len);
            }
            if (pi != np)
                fail("a wrong number of parameters", s, len);
        } else if (bad) {
            if (res != AGW_ROUTE_BAD_PARAM)
                fail("router and reference differ (400)", s, len);
        } else if (any) {
            if (res != AGW_ROUTE_METHOD_NOT_ALLOWED)
                fail("router and reference differ (405)", s, len);
            check_allow(allow, routes, nroutes, path, pl);
        } else if (res != AGW_ROUTE_NOT_FOUND) {
            fail("router and reference differ (404)", s, len);
        }
    }
    for (size_t i = 0; i < nroutes; i++)
        free_ref(&routes[i]);
    agw_router_free(&router);
    if (lua_gc(L, LUA_GCCOUNT, 0) > 32 * 1024)
        lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}
