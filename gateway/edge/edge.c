/* edge.c: the edge's hook into the request path (see edge.h). */
#include "edge/edge.h"

#include <string.h>
#include <time.h>

#include "json/json.h"
#include "base/log.h"

/* h2o keeps the pointers it is given: the value is copied into the request's memory (name is
 * a literal). */
static void add_header(h2o_req_t *req, const char *name, const char *value, size_t len)
{
    h2o_iovec_t v = h2o_strdup(&req->pool, value, len);
    h2o_add_header_by_str(&req->pool, &req->res.headers, name, strlen(name), 0, NULL, v.base, v.len);
}

/* WWW-Authenticate (RFC 6750 §3; RFC 9110 §11.6.1): the scheme, realm, and when the request
 * carried credentials, the error code, its description and (insufficient_scope) the scopes. */
static void set_challenge(h2o_req_t *req, const agw_auth_policy_t *p, const agw_auth_t *a, const agw_auth_result_t *r)
{
    char v[1024];
    int n;
    if (strcmp(r->challenge, "APIKey") == 0)
        n = snprintf(v, sizeof(v), "APIKey realm=\"aggway\", header=\"%s\"", a->apikey_header ? a->apikey_header : "x-api-key");
    else
        n = snprintf(v, sizeof(v), "Bearer realm=\"aggway\"");
    if (r->error && strcmp(r->challenge, "Bearer") == 0) {
        n += snprintf(v + n, sizeof(v) - (size_t)n, ", error=\"%s\", error_description=\"%s\"", r->error, r->title);
        if (strcmp(r->error, "insufficient_scope") == 0 && p->num_scopes) {
            n += snprintf(v + n, sizeof(v) - (size_t)n, ", scope=\"");
            for (size_t i = 0; i < p->num_scopes && (size_t)n < sizeof(v); i++)
                n += snprintf(v + n, sizeof(v) - (size_t)n, "%s%s", i ? " " : "", p->scopes[i]);
            if ((size_t)n < sizeof(v))
                n += snprintf(v + n, sizeof(v) - (size_t)n, "\"");
        }
    }
    if ((size_t)n >= sizeof(v))
        n = (int)sizeof(v) - 1;
    add_header(req, "www-authenticate", v, (size_t)n);
}

int agw_edge_authenticate(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, h2o_req_t *req,
                          int may_wait, agw_auth_result_t *r, agw_edge_refusal_t *out)
{
    if (p->kind == AGW_AUTH_NONE) {
        memset(r, 0, sizeof(*r));
        return 0;
    }
    const char *authz = NULL, *key = NULL;
    size_t authz_len = 0, key_len = 0, num_authz = 0, num_keys = 0;
    const char *key_name = a->apikey_header ? a->apikey_header : "x-api-key";
    size_t key_name_len = strlen(key_name);
    for (size_t i = 0; i < req->headers.size; i++) {
        const h2o_header_t *h = &req->headers.entries[i];
        if (h->name == &H2O_TOKEN_AUTHORIZATION->buf) {
            if (num_authz++ == 0) {
                authz = h->value.base;
                authz_len = h->value.len;
            }
        } else if (h2o_lcstris(h->name->base, h->name->len, key_name, key_name_len)) {
            if (num_keys++ == 0) {
                key = h->value.base;
                key_len = h->value.len;
            }
        }
    }
    if (p->kind == AGW_AUTH_API_KEY && num_keys > 1)
        agw_auth_refuse_duplicates(r, "APIKey", key_name, num_keys);
    else
        agw_auth_check(a, p, cache, authz, authz_len, num_authz, key, key_len, (uint64_t)time(NULL), r);
    if (r->status == 0)
        return 0;
    if (may_wait && r->refetching)
        return AGW_EDGE_WAIT;
    out->status = r->status;
    out->title = r->title;
    out->kind = r->status == 400   ? "invalid-request"
                : r->status == 403 ? "insufficient-scope"
                : r->status == 503 ? "authentication-unavailable"
                                   : "unauthorized";
    set_challenge(req, p, a, r);
    if (r->status == 503)
        add_header(req, "retry-after", "5", 1);
    agw_log(r->status == 503 ? AGW_LOG_WARN : AGW_LOG_INFO, "auth: %.*s %.*s refused with %d: %s", (int)req->method.len,
            req->method.base, (int)(req->path.len > 200 ? 200 : req->path.len), req->path.base, r->status, r->why);
    return r->status;
}

void agw_edge_user_take(agw_edge_user_t *u, agw_auth_result_t *r)
{
    u->claims = r->claims;
    u->key = r->claims ? NULL : r->key;
    u->token = r->claims ? r->token : NULL;
    u->token_len = r->claims ? r->token_len : 0;
    r->claims = NULL;
}

int agw_edge_user_push(lua_State *L, const agw_edge_user_t *u)
{
    if (u->claims) {
        /* the claims as a json ref: Lua tables only if a script or an identity reads them */
        lua_createtable(L, 0, 3);
        lua_pushliteral(L, "jwt");
        lua_setfield(L, -2, "via");
        json_t *sub = json_object_get(u->claims, "sub");
        if (json_is_string(sub)) {
            lua_pushstring(L, json_string_value(sub));
            lua_setfield(L, -2, "sub");
        }
        agw_json_push_ref(L, u->claims);
        lua_setfield(L, -2, "claims_ref");
        lua_pushlstring(L, u->token, u->token_len);
        return 2;
    }
    if (u->key) {
        lua_createtable(L, 0, 3);
        lua_pushliteral(L, "api_key");
        lua_setfield(L, -2, "via");
        lua_pushstring(L, u->key->app);
        lua_setfield(L, -2, "app");
        lua_pushstring(L, u->key->plan);
        lua_setfield(L, -2, "plan");
        lua_pushnil(L);
        return 2;
    }
    return 0;
}

void agw_edge_user_drop(agw_edge_user_t *u)
{
    json_decref(u->claims);
    u->claims = NULL;
    u->key = NULL;
    u->token = NULL;
    u->token_len = 0;
}
