/* auth.h: authentication at the edge (DESIGN §3, §9): after the route matched and before any Lua,
 * a request to an endpoint that asks for it must carry a valid JWT (Authorization: Bearer, RFC
 * 6750 §2.1) or a known API key (edge/apikeys.h); otherwise it is answered here, as an RFC 9457
 * problem with the RFC 6750 §3 WWW-Authenticate challenge, and no script runs.
 *
 * One agw_auth_t per generation (config.h), built from gateway.lua's `auth` block:
 *   auth = { jwt = { issuer, audiences, algorithms, jwks_file | jwks_url, secret_file, leeway_s,
 *                    required_claims, max_token_bytes, jwks_refresh_s, jwks_cooldown_s },
 *            api_keys = { file, header }, default = "jwt" | "api_key" | "none" }
 * and one agw_auth_policy_t per endpoint (the script's `auth`, or the default).
 *
 * Keys: a jwks_file is read when the generation loads (a bad file fails the load). A jwks_url is
 * fetched by a thread of the generation (agw_auth_start), never on a request's path: at start,
 * every jwks_refresh_s (or the answer's Cache-Control max-age, whichever is shorter, at least
 * 10 s), and when a token names a kid no key has (agw_auth_check asks; at most once per
 * jwks_cooldown_s, so random kids cause no fetch storm). A fetch that fails keeps the keys it
 * had; until a first fetch succeeded, requests that need a JWT get 503.
 *
 * Verified tokens are cached per worker (agw_auth_cache_t): the same token again costs a lookup
 * and a compare, not a signature check, until its exp.
 */
#ifndef AGW_EDGE_AUTH_H
#define AGW_EDGE_AUTH_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "edge/apikeys.h"
#include "edge/fetch.h"
#include "edge/jwt.h"

typedef enum agw_auth_kind {
    AGW_AUTH_NONE = 0,
    AGW_AUTH_JWT,
    AGW_AUTH_API_KEY,
} agw_auth_kind_t;

/* What an endpoint asks of its callers. */
typedef struct agw_auth_policy {
    agw_auth_kind_t kind;
    char **scopes;          /* JWT: scopes the token must all have (RFC 6749 §3.3), owned */
    size_t num_scopes;
} agw_auth_policy_t;

typedef struct agw_auth {
    uint64_t serial;                /* unique in the process (cached tokens name it, not the address) */
    /* ---- JWT (jwt_on) ---- */
    int jwt_on;
    agw_jwt_rules_t rules;          /* strings and lists owned */
    unsigned algs;                  /* configured algorithms (AGW_JWT_* bits) */
    agw_jwks_t *secret;             /* HS*: the shared secret of secret_file, or NULL */
    char *jwks_url;                 /* NULL: keys from jwks_file (or only the secret) */
    agw_fetch_url_t url;            /* jwks_url split */
    uint64_t refresh_s;             /* jwks_url: refetch interval, s */
    uint64_t cooldown_s;            /* jwks_url: least time between two unknown-kid refetches, s */
    uint64_t fetch_timeout_ms;      /* jwks_url: one fetch's connect/read bound, ms */
    struct agw_keysrc *src;         /* private: the current key set and the fetcher's state, shared
                                       with the fetcher thread (each holds a reference): freeing the
                                       authenticator (a reload, on a worker thread) never waits for a
                                       fetch in flight */
    /* ---- API keys (apikeys_on) ---- */
    int apikeys_on;
    agw_apikeys_t apikeys;
    char *apikey_header;            /* lowercased header name, "x-api-key" */
} agw_auth_t;

/* Initializes an empty authenticator (nothing configured: every policy but NONE fails). */
void agw_auth_init(agw_auth_t *a);

/* Starts a's JWKS fetcher thread when it has a jwks_url (serve only: `aggway check` loads
 * without it). Its first fetch begins at once. */
void agw_auth_start(agw_auth_t *a);

/* Tells the fetcher to stop (it ends after its fetch in flight, if any, without being waited
 * for) and frees everything else of a. */
void agw_auth_free(agw_auth_t *a);

/* Frees a policy's scopes. */
void agw_auth_policy_clear(agw_auth_policy_t *p);

/* Installs ks as a's current key set (takes the caller's reference; the previous is dropped).
 * The fetcher uses it; so do tests. */
void agw_auth_set_keys(agw_auth_t *a, agw_jwks_t *ks);

/* A worker's cache of verified tokens: direct-mapped, AGW_AUTH_CACHE_SIZE entries, each the
 * token's bytes, the authenticator it was verified for, its claims and exp. Worker thread only. */
#define AGW_AUTH_CACHE_SIZE 1024
typedef struct agw_auth_cache_entry {
    uint64_t serial;          /* the authenticator it was verified for (agw_auth_t.serial); 0: free */
    uint64_t keys_set;        /* the authenticator's key set it was verified with (a JWKS fetched
                                 again is another: the token is verified again) */
    char *token;
    size_t len;
    uint64_t exp_s;           /* valid while now < exp_s + leeway */
    json_t *claims;           /* one reference */
} agw_auth_cache_entry_t;

typedef struct agw_auth_cache {
    agw_auth_cache_entry_t *slots; /* AGW_AUTH_CACHE_SIZE of them, allocated on first use */
    uint64_t hits, misses;
} agw_auth_cache_t;

/* Frees a cache's entries (the cache struct is the caller's). */
void agw_auth_cache_free(agw_auth_cache_t *c);

/* The outcome of agw_auth_check. */
typedef struct agw_auth_result {
    int status;               /* 0: authenticated (or not asked); else 400, 401, 403 or 503 */
    const char *error;        /* RFC 6750 §3.1 code: "invalid_request", "invalid_token",
                                 "insufficient_scope"; NULL when the request had no credentials
                                 (RFC 6750 §3.1: no error code then) or on 503 */
    const char *title;        /* for the problem and error_description: says nothing of keys */
    const char *challenge;    /* "Bearer" or "APIKey" */
    char why[256];            /* the reason, for the log only */
    json_t *claims;           /* JWT ok: the claims (one reference for the caller) */
    const agw_apikey_t *key;  /* API key ok: its entry (valid while a lives) */
    const char *token;        /* JWT ok: the token in the request's header (valid with it) */
    size_t token_len;
    int refetching;           /* 401 for an unknown kid, and a refetch of the JWKS is coming (not
                                 held back by the cooldown): the request may wait for it */
    uint64_t fetches_done;    /* with refetching: agw_auth_fetches_done() when it was asked */
} agw_auth_result_t;

/* Checks a request against policy p of authenticator a. authorization: the Authorization header
 * (NULL when absent; num_authorization how many there were: more than one is 400
 * invalid_request); apikey: the API key header's value or NULL. now_s: seconds since the epoch.
 * Fills *r. A token with an unknown kid makes the fetcher refetch (cooldown). Worker thread. */
void agw_auth_check(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, const char *authorization,
                    size_t authorization_len, size_t num_authorization, const char *apikey, size_t apikey_len,
                    uint64_t now_s, agw_auth_result_t *r);

/* Fills *r with a 400 invalid_request (RFC 6750 §3.1) for a request that carries n (> 1) headers
 * named name that each could be its credential (API keys): which one would count is ambiguous,
 * and a limit keyed by the header could count another than the one the edge checked. challenge:
 * "APIKey". */
void agw_auth_refuse_duplicates(agw_auth_result_t *r, const char *challenge, const char *name, size_t n);

/* How many JWKS fetches have finished (thread-safe): a request refused for an unknown kid
 * while a refetch was coming may be checked again once this passes r->fetches_done. */
uint64_t agw_auth_fetches_done(const agw_auth_t *a);

/* The scopes of claims ("scope": space-separated, or "scp": a list; DESIGN §9.1) as a new JSON
 * list (one reference for the caller). */
json_t *agw_auth_scopes(json_t *claims);

#endif
