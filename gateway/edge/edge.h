/* edge.h: the edge's hook into the request path (DESIGN §3, §9: route match → auth → limits →
 * script). The worker calls agw_edge_authenticate right after the route matched; a request it
 * refuses is answered by the worker with the problem this fills in, and no Lua runs. A request
 * it lets through keeps its user (agw_edge_user_t) for the runtime to ask for (req.user in scripts).
 */
#ifndef AGW_EDGE_EDGE_H
#define AGW_EDGE_EDGE_H

#include <h2o.h>
#include <lua.h>

#include "edge/auth.h"

/* The problem a refused request gets: kind (its type URN's last part), title, HTTP status. */
typedef struct agw_edge_refusal {
    int status;         /* 400, 401, 403, 503 */
    const char *kind;   /* "unauthorized", "insufficient-scope", "invalid-request", "authentication-unavailable" */
    const char *title;  /* says what the client must do, never why a key did not verify */
} agw_edge_refusal_t;

/* Authenticates req for endpoint policy p of a (edge/auth.h) at the wall clock's time. Returns 0
 * when the request may go on (r holds its user: claims or API key, to be taken with
 * agw_edge_user_take or its claims dropped), or the HTTP status of the refusal: then the response headers of req
 * already hold the challenge (WWW-Authenticate per RFC 6750 §3; Retry-After on 503), *out says
 * what problem to send, and the reason is logged. With may_wait, a token whose kid no key has
 * while a JWKS refetch is coming returns AGW_EDGE_WAIT instead (nothing set or logged): the caller
 * checks the request again once agw_auth_fetches_done(a) passes r->fetches_done (key rotation:
 * the new key's first token is accepted, not refused). Worker thread. */
#define AGW_EDGE_WAIT (-1)
int agw_edge_authenticate(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, h2o_req_t *req,
                          int may_wait, agw_auth_result_t *r, agw_edge_refusal_t *out);

/* The edge's verdict a request keeps for the runtime until a script or an identity asks for it
 * (core.request_user): a page's handler is started without it, as most pages never read req.user
 * or forward the token. Ownership: claims holds one reference, dropped by agw_edge_user_drop. */
typedef struct agw_edge_user {
    json_t *claims;          /* JWT accepted: its claims, else NULL */
    const agw_apikey_t *key; /* API key accepted: its entry (valid while the generation lives), else NULL */
    const char *token;       /* JWT accepted: the bearer token, in the request's header (valid with the
                                request), else NULL */
    size_t token_len;
} agw_edge_user_t;

/* Moves r's verdict into u: u takes r's claims reference (r->claims becomes NULL), the API key and
 * the token's place in the request. u is empty (agw_edge_user_none) for an endpoint without auth. */
void agw_edge_user_take(agw_edge_user_t *u, agw_auth_result_t *r);

/* Whether u holds no user (neither a JWT's claims nor an API key). */
static inline int agw_edge_user_none(const agw_edge_user_t *u)
{
    return u->claims == NULL && u->key == NULL;
}

/* Pushes two values for the runtime: the user (a table { via = "jwt", sub, claims_ref = the claims
 * as a json ref (json.h: Lua tables are made only when read) } or { via = "api_key", app, plan })
 * and the bearer token (a string; nil without a JWT: the runtime keeps it for the upstreams'
 * identity and never shows it to scripts). u keeps its claims reference. Pushes nothing and returns
 * 0 when u holds no user; else returns 2. */
int agw_edge_user_push(lua_State *L, const agw_edge_user_t *u);

/* Drops u's claims reference; u then holds no user. */
void agw_edge_user_drop(agw_edge_user_t *u);

#endif
