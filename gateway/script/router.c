/* router.c: route table (see router.h). */
#include "script/router.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

static char *dup_n(const char *s, size_t n)
{
    char *p = agw_malloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

int agw_router_add(agw_router_t *r, const char *method, const char *pattern, const agw_route_seg_t *segs,
                   size_t num_segs, int endpoint)
{
    if (num_segs > AGW_ROUTE_MAX_SEGMENTS)
        return -1;
    size_t params = 0;
    for (size_t i = 0; i < num_segs; i++)
        params += segs[i].is_param;
    if (params > AGW_ROUTE_MAX_PARAMS)
        return -1;
    agw_route_t *n = agw_realloc(r->routes, (r->num_routes + 1) * sizeof(*n));
    r->routes = n;
    agw_route_t *rt = &r->routes[r->num_routes++];
    rt->method = agw_strdup(method);
    rt->pattern = agw_strdup(pattern);
    rt->endpoint = endpoint;
    rt->num_segs = num_segs;
    rt->segs = agw_calloc(num_segs ? num_segs : 1, sizeof(*rt->segs));
    for (size_t i = 0; i < num_segs; i++) {
        rt->segs[i].text = dup_n(segs[i].text, segs[i].len);
        rt->segs[i].len = segs[i].len;
        rt->segs[i].is_param = segs[i].is_param;
    }
    return 0;
}

/* Matches the path against one route's segments; fills params. */
static int match_path(const agw_route_t *rt, const char *path, size_t path_len, agw_route_param_t *params,
                      size_t *num_params)
{
    size_t np = 0, pos = 0;
    if (path_len == 0 || path[0] != '/')
        return 0;
    if (rt->num_segs == 0)
        return path_len == 1;
    for (size_t i = 0; i < rt->num_segs; i++) {
        if (pos >= path_len || path[pos] != '/')
            return 0;
        pos++;
        const char *seg = path + pos;
        const char *end = memchr(seg, '/', path_len - pos);
        size_t len = end ? (size_t)(end - seg) : path_len - pos;
        const agw_route_seg_t *s = &rt->segs[i];
        if (s->is_param) {
            /* "." and ".." never fill a parameter: a script writing "/items/" .. id must not be
             * turned into a walk up the upstream's paths */
            if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
                return 0;
            params[np].name = s->text;
            params[np].name_len = s->len;
            params[np].value = seg;
            params[np].value_len = len;
            np++;
        } else if (len != s->len || memcmp(seg, s->text, len) != 0) {
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
    int other_method = 0;
    size_t alen = 0;
    if (allow_size)
        allow[0] = '\0';
    for (size_t i = 0; i < r->num_routes; i++) {
        const agw_route_t *rt = &r->routes[i];
        size_t np = 0;
        if (!match_path(rt, path, path_len, params, &np))
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
    return other_method ? AGW_ROUTE_METHOD_NOT_ALLOWED : AGW_ROUTE_NOT_FOUND;
}

void agw_router_free(agw_router_t *r)
{
    for (size_t i = 0; i < r->num_routes; i++) {
        for (size_t j = 0; j < r->routes[i].num_segs; j++)
            free(r->routes[i].segs[j].text);
        free(r->routes[i].segs);
        free(r->routes[i].method);
        free(r->routes[i].pattern);
    }
    free(r->routes);
    r->routes = NULL;
    r->num_routes = 0;
}
