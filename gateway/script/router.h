/* router.h: the route table: method + path pattern with {param} segments -> endpoint index.
 *
 * Routes are tried in table order (the loader puts routes with more literal segments first), so
 * "/products/featured" wins over "/products/{id}". Matching splits nothing and allocates nothing:
 * captures are offsets into the path. */
#ifndef AGW_ROUTER_H
#define AGW_ROUTER_H

#include <stddef.h>

#define AGW_ROUTE_MAX_SEGMENTS 32
#define AGW_ROUTE_MAX_PARAMS 16

typedef struct agw_route_seg {
    char *text;        /* literal text, or the parameter name when is_param */
    size_t len;
    int is_param;
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
 * parameter never matches an empty segment, "." or "..". */
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
} agw_route_result_t;

/* Appends a route; segs/texts are copied. Returns 0, or -1 when there are too many segments. */
int agw_router_add(agw_router_t *r, const char *method, const char *pattern, const agw_route_seg_t *segs,
                   size_t num_segs, int endpoint);

/* Matches method + path (no query string). On AGW_ROUTE_FOUND sets *endpoint and fills params
 * (at most AGW_ROUTE_MAX_PARAMS) with *num_params. On AGW_ROUTE_METHOD_NOT_ALLOWED writes the
 * allowed methods, comma-separated, to allow (allow_size bytes, NUL-terminated). */
agw_route_result_t agw_router_match(const agw_router_t *r, const char *method, size_t method_len, const char *path,
                                    size_t path_len, int *endpoint, agw_route_param_t *params, size_t *num_params,
                                    char *allow, size_t allow_size);

/* Frees the table. */
void agw_router_free(agw_router_t *r);

#endif
