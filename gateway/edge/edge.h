/* edge.h: the edge's hook into the request path (DESIGN §3, §9: route match → auth → limits →
 * script). The worker calls agw_edge_authenticate right after the route matched; a request it
 * refuses is answered by the worker with the problem this fills in, and no Lua runs. A request
 * it lets through carries its user to the runtime (agw_edge_push_user: req.user in scripts).
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
 * when the request may go on (r holds its user: claims or API key, to be pushed or dropped with
 * agw_edge_push_user), or the HTTP status of the refusal: then the response headers of req
 * already hold the challenge (WWW-Authenticate per RFC 6750 §3; Retry-After on 503), *out says
 * what problem to send, and the reason is logged. With may_wait, a token whose kid no key has
 * while a JWKS refetch is coming returns AGW_EDGE_WAIT instead (nothing set or logged): the caller
 * checks the request again once agw_auth_fetches_done(a) passes r->fetches_done (key rotation:
 * the new key's first token is accepted, not refused). Worker thread. */
#define AGW_EDGE_WAIT (-1)
int agw_edge_authenticate(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, h2o_req_t *req,
                          int may_wait, agw_auth_result_t *r, agw_edge_refusal_t *out);

/* Pushes two values for the runtime: the user (nil when the endpoint asked for nothing, else a
 * table { via = "jwt", sub, claims_ref = the claims as a json ref (json.h: Lua tables are made
 * only when read) } or { via = "api_key", app, plan }) and the bearer token (a string, nil without a JWT; the runtime keeps it for the
 * upstreams' identity and never shows it to scripts). Drops r's claims reference. */
void agw_edge_push_user(lua_State *L, agw_auth_result_t *r);

#endif
