/* router.h: the route table: method + path pattern with {param} segments -> endpoint index.
 *
 * Routes are tried in table order (the loader puts routes with more literal segments first), so
 * "/products/featured" wins over "/products/{id}". Matching splits nothing and allocates nothing:
 * captures are offsets into the path. */
#ifndef AGW_ROUTER_H
#define AGW_ROUTER_H

#include <stddef.h>

#include "route/route_param.h"

struct lua_State;

#define AGW_ROUTE_MAX_SEGMENTS 32
#define AGW_ROUTE_MAX_PARAMS 16

typedef struct agw_route_seg {
    char *text;        /* literal text, or the parameter name when is_param */
    size_t len;
    int is_param;
    const char *pattern;          /* agw_router_add's input: the parameter's pattern source, or NULL */
    size_t pattern_len;
    agw_route_pattern_t *compiled; /* in the table: the compiled pattern, or NULL (any valid segment) */
} agw_route_seg_t;

typedef struct agw_route {
    char *method;             /* "GET", … */
    agw_route_seg_t *segs;
    size_t num_segs;
    int endpoint;             /* 1-based endpoint index in the Lua runtime */
    char *pattern;            /* "GET /product-page/{id}", for messages */
} agw_route_t;

typedef struct agw_router {
    agw_route_t *routes;
    size_t num_routes;
} agw_router_t;

/* One captured parameter: name from the route, value is a slice of the request path, still
 * percent-encoded as the client sent it (so "%2F" cannot become a '/' in an upstream path). A
 * parameter never matches an empty segment, "." or "..", nor a segment its pattern refuses; its
 * value holds only what route_param.h allows. */
typedef struct agw_route_param {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} agw_route_param_t;

typedef enum agw_route_result {
    AGW_ROUTE_FOUND = 0,
    AGW_ROUTE_NOT_FOUND,          /* no pattern matches the path: 404 */
    AGW_ROUTE_METHOD_NOT_ALLOWED, /* a pattern matches with another method: 405 */
    AGW_ROUTE_BAD_PARAM,          /* no route matches, and a route's parameter would hold characters
                                     route_param.h refuses: 400 */
} agw_route_result_t;

/* Appends a route; segs/texts are copied, parameter patterns compiled. Returns 0, or -1 with a
 * message in err (errlen bytes) when there are too many segments or parameters, or a pattern
 * does not compile. */
int agw_router_add(agw_router_t *r, const char *method, const char *pattern, const agw_route_seg_t *segs,
                   size_t num_segs, int endpoint, char *err, size_t errlen);

/* Appends the route of the endpoint table at index idx of L's stack (agg.loader's shape: method,
 * route, segments = { "literal" | { param = name, pattern = src | nil } … }) as endpoint. Same
 * returns as agw_router_add. Used by the configuration and by agg.router (the spec harness). */
int agw_router_add_lua(agw_router_t *r, struct lua_State *L, int idx, int endpoint, char *err, size_t errlen);

/* The "agg.router" Lua module, for the loader and the spec harness, so that both route with this
 * code: compile(src) -> true | nil, message (a parameter pattern, route_param.h);
 * new(endpoints) -> router; router:match(method, path) -> "found", index, params |
 * "not_found" | "method_not_allowed", allow | "bad_param". */
int agw_router_open(struct lua_State *L);

/* Matches method + path (no query string). On AGW_ROUTE_FOUND sets *endpoint and fills params
 * (at most AGW_ROUTE_MAX_PARAMS) with *num_params. On AGW_ROUTE_METHOD_NOT_ALLOWED writes the
 * allowed methods, comma-separated, to allow (allow_size bytes, NUL-terminated). */
agw_route_result_t agw_router_match(const agw_router_t *r, const char *method, size_t method_len, const char *path,
                                    size_t path_len, int *endpoint, agw_route_param_t *params, size_t *num_params,
                                    char *allow, size_t allow_size);

/* Frees the table. */
void agw_router_free(agw_router_t *r);

#endif
