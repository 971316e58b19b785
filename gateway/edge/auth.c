/* auth.c: the edge's authenticators (see auth.h). */
#include "edge/auth.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/clock.h"
#include "base/log.h"

#define JWKS_MAX_BYTES (1024 * 1024) /* a JWKS larger than this is not a key set */
#define JWKS_MIN_REFRESH_S 10        /* Cache-Control max-age below this is taken as this */
#define JWKS_RETRY_S 5               /* after a failed fetch, next try (or refresh_s if shorter) */

/* The key source (auth.h: agw_auth_t.src). The fetcher's settings are copies, so the thread
 * needs nothing of the authenticator. */
typedef struct agw_keysrc {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int refs;                       /* the authenticator, the fetcher thread (lock) */
    agw_jwks_t *keys;               /* current JWKS (lock), or NULL */
    uint64_t keys_set;              /* key sets installed so far (atomic): a cached token names the
                                       one it was verified with, and is verified again under another
                                       (a key removed from the JWKS must stop its tokens) */
    int want_fetch;                 /* an unknown kid asked for a refetch (lock) */
    int stopping;                   /* agw_auth_free (lock) */
    int thread_on;                  /* a fetcher runs (set before it starts, never cleared) */
    uint64_t kid_fetch_at;          /* monotonic s of the last unknown-kid fetch (lock) */
    int kid_fetched;                /* there was one (lock) */
    uint64_t fetches, fetch_failures; /* (atomic) */
    uint64_t fetches_done;          /* fetches finished, failed ones included (atomic) */
    agw_buf_t last_body;            /* the JWKS document the keys were made of (the fetcher's only):
                                       the same document fetched again keeps them, and the tokens
                                       verified with them stay verified */
    agw_fetch_url_t url;            /* copies of the authenticator's settings */
    char *jwks_url;
    unsigned algs;
    uint64_t refresh_s, cooldown_s, fetch_timeout_ms;
} keysrc_t;

static void src_unref(keysrc_t *a)
{
    pthread_mutex_lock(&a->lock);
    int last = --a->refs == 0;
    pthread_mutex_unlock(&a->lock);
    if (!last)
        return;
    agw_jwks_unref(a->keys);
    agw_buf_free(&a->last_body);
    agw_fetch_url_free(&a->url);
    free(a->jwks_url);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->wake);
    free(a);
}

static void src_set_keys(keysrc_t *a, agw_jwks_t *ks)
{
    pthread_mutex_lock(&a->lock);
    agw_jwks_t *old = a->keys;
    a->keys = ks;
    __atomic_add_fetch(&a->keys_set, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&a->lock);
    agw_jwks_unref(old);
}

void agw_auth_init(agw_auth_t *a)
{
    memset(a, 0, sizeof(*a));
    keysrc_t *src = agw_calloc(1, sizeof(*src));
    pthread_mutex_init(&src->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&src->wake, &ca);
    pthread_condattr_destroy(&ca);
    src->refs = 1;
    a->src = src;
    static uint64_t serials;
    a->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    a->rules.leeway_s = 60;
    a->rules.max_token_bytes = 8192;
    a->refresh_s = 300;
    a->cooldown_s = 30;
    a->fetch_timeout_ms = 2000;
}

void agw_auth_set_keys(agw_auth_t *a, agw_jwks_t *ks)
{
    src_set_keys(a->src, ks);
}

static agw_jwks_t *current_keys(agw_auth_t *a)
{
    keysrc_t *src = a->src;
    pthread_mutex_lock(&src->lock);
    agw_jwks_t *ks = agw_jwks_ref(src->keys);
    pthread_mutex_unlock(&src->lock);
    return ks;
}

static uint64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

/* ---- the JWKS fetcher ----------------------------------------------------------------------- */

/* The time until the next fetch after one that gave usable keys, s: refresh_s, or the answer's
 * Cache-Control max-age when shorter (JWKS_MIN_REFRESH_S at least). */
static uint64_t next_after_keys(const keysrc_t *a, uint64_t max_age)
{
    uint64_t next = a->refresh_s;
    if (max_age && max_age < next)
        next = max_age < JWKS_MIN_REFRESH_S ? JWKS_MIN_REFRESH_S : max_age;
    return next;
}

/* One fetch of jwks_url. Returns the time until the next scheduled one, s. */
static uint64_t fetch_once(keysrc_t *a)
{
    agw_buf_t body = {0};
    uint64_t max_age = 0;
    char why[256] = "";
    __atomic_add_fetch(&a->fetches, 1, __ATOMIC_RELAXED);
    uint64_t next = a->refresh_s < JWKS_RETRY_S ? a->refresh_s : JWKS_RETRY_S;
    int had = __atomic_load_n(&a->keys, __ATOMIC_RELAXED) != NULL; /* (only this thread sets it now) */
    if (agw_fetch_get(&a->url, a->fetch_timeout_ms, JWKS_MAX_BYTES, &body, &max_age, why, sizeof(why)) != 0) {
        agw_log(AGW_LOG_WARN, "auth.jwt.jwks_url %s: fetch failed: %s; %s", a->jwks_url, why,
                had ? "the keys fetched before stay in use" : "tokens cannot be verified until a fetch succeeds");
    } else if (had && body.len == a->last_body.len && (body.len == 0 || memcmp(body.base, a->last_body.base, body.len) == 0)) {
        /* the same document: the keys in use are its keys (a new set would make every worker
         * verify every cached token again, at every refresh) */
        agw_buf_free(&body);
        return next_after_keys(a, max_age);
    } else {
        agw_jwks_t *ks = agw_jwks_parse(body.base, body.len, a->algs, why, sizeof(why));
        if (ks == NULL) {
            agw_log(AGW_LOG_WARN, "auth.jwt.jwks_url %s: the answer is not a usable JWKS: %s; %s", a->jwks_url, why,
                    had ? "the keys fetched before stay in use" : "tokens cannot be verified yet");
        } else {
            if (why[0])
                agw_log(AGW_LOG_WARN, "auth.jwt.jwks_url %s: %s", a->jwks_url, why);
            src_set_keys(a, ks);
            agw_buf_free(&a->last_body);
            a->last_body = body; /* (kept: the next fetch compares with it) */
            return next_after_keys(a, max_age);
        }
    }
    __atomic_add_fetch(&a->fetch_failures, 1, __ATOMIC_RELAXED);
    agw_buf_free(&body);
    return next;
}

static void *fetcher_main(void *arg)
{
    keysrc_t *a = arg;
    uint64_t next_at = 0; /* monotonic s: next scheduled fetch */
    pthread_mutex_lock(&a->lock);
    while (!a->stopping) {
        uint64_t now = mono_s();
        uint64_t kid_at = a->kid_fetch_at + a->cooldown_s; /* an unknown kid may refetch from then on */
        int for_kid = a->want_fetch && (!a->kid_fetched || now >= kid_at);
        int due = now >= next_at || for_kid;
        if (!due) {
            uint64_t until = next_at;
            if (a->want_fetch && kid_at < until)
                until = kid_at;
            struct timespec ts = agw_clock_after_ms(CLOCK_MONOTONIC, (until - now) * 1000);
            pthread_cond_timedwait(&a->wake, &a->lock, &ts);
            continue;
        }
        a->want_fetch = 0;
        pthread_mutex_unlock(&a->lock);
        uint64_t wait = fetch_once(a);
        pthread_mutex_lock(&a->lock);
        if (for_kid) {
            a->kid_fetched = 1;
            a->kid_fetch_at = now;
        }
        __atomic_add_fetch(&a->fetches_done, 1, __ATOMIC_RELEASE);
        next_at = mono_s() + wait;
        a->want_fetch = 0; /* asked during the fetch: that fetch answered it */
    }
    pthread_mutex_unlock(&a->lock);
    src_unref(a);
    return NULL;
}

void agw_auth_start(agw_auth_t *a)
{
    keysrc_t *src = a->src;
    if (!a->jwt_on || a->jwks_url == NULL || src->thread_on)
        return;
    src->jwks_url = agw_strdup(a->jwks_url);
    src->url = a->url;
    src->url.host = agw_strdup(a->url.host);
    src->url.path = agw_strdup(a->url.path);
    src->algs = a->algs;
    src->refresh_s = a->refresh_s;
    src->cooldown_s = a->cooldown_s;
    src->fetch_timeout_ms = a->fetch_timeout_ms;
    if (src->jwks_url == NULL || src->url.host == NULL || src->url.path == NULL)
        abort();
    src->refs++; /* the thread's (before it runs: no lock needed yet) */
    src->thread_on = 1;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, fetcher_main, src) != 0) {
        agw_log(AGW_LOG_ERROR, "auth.jwt.jwks_url: cannot start the fetcher thread");
        src->refs--;
        src->thread_on = 0;
    }
    pthread_attr_destroy(&attr);
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void agw_auth_free(agw_auth_t *a)
{
    keysrc_t *src = a->src;
    if (src) {
        pthread_mutex_lock(&src->lock);
        src->stopping = 1;
        pthread_cond_signal(&src->wake);
        pthread_mutex_unlock(&src->lock);
        src_unref(src); /* the fetcher drops its own reference when it ends */
    }
    agw_jwks_unref(a->secret);
    free((char *)a->rules.issuer);
    free_strings((char **)a->rules.audiences, a->rules.num_audiences);
    free_strings((char **)a->rules.required, a->rules.num_required);
    free(a->jwks_url);
    agw_fetch_url_free(&a->url);
    agw_apikeys_free(&a->apikeys);
    free(a->apikey_header);
    memset(a, 0, sizeof(*a));
}

void agw_auth_policy_clear(agw_auth_policy_t *p)
{
    free_strings(p->scopes, p->num_scopes);
    memset(p, 0, sizeof(*p));
}

uint64_t agw_auth_fetches_done(const agw_auth_t *a)
{
    return __atomic_load_n(&a->src->fetches_done, __ATOMIC_ACQUIRE);
}

/* An unknown kid (or no keys yet): ask the fetcher for a refetch (it applies the cooldown).
 * Returns 1 when a fetch is coming soon (the cooldown does not hold it back). */
static int ask_refetch(agw_auth_t *a)
{
    keysrc_t *src = a->src;
    if (!src->thread_on)
        return 0;
    pthread_mutex_lock(&src->lock);
    if (!src->want_fetch) {
        src->want_fetch = 1;
        pthread_cond_signal(&src->wake);
    }
    int coming = !src->kid_fetched || mono_s() >= src->kid_fetch_at + src->cooldown_s;
    pthread_mutex_unlock(&src->lock);
    return coming;
}

/* ---- the verified-token cache ----------------------------------------------------------------- */

/* The slot of a token: FNV-1a over its length and last 32 bytes (of the signature, which differs
 * from token to token). A token that collides only takes the slot over; a hit compares every byte. */
static uint64_t hash_token(const char *t, size_t len)
{
    uint64_t h = (1469598103934665603ull ^ len) * 1099511628211ull;
    for (size_t i = len > 32 ? len - 32 : 0; i < len; i++)
        h = (h ^ (unsigned char)t[i]) * 1099511628211ull;
    return h;
}

static void entry_clear(agw_auth_cache_entry_t *e)
{
    free(e->token);
    json_decref(e->claims);
    memset(e, 0, sizeof(*e));
}

void agw_auth_cache_free(agw_auth_cache_t *c)
{
    for (size_t i = 0; c->slots && i < AGW_AUTH_CACHE_SIZE; i++)
        entry_clear(&c->slots[i]);
    free(c->slots);
    c->slots = NULL;
}

static agw_auth_cache_entry_t *cache_slot(agw_auth_cache_t *c, const char *t, size_t len)
{
    if (c->slots == NULL)
        c->slots = agw_calloc(AGW_AUTH_CACHE_SIZE, sizeof(*c->slots));
    return &c->slots[hash_token(t, len) % AGW_AUTH_CACHE_SIZE];
}

/* ---- checking a request --------------------------------------------------------------------- */

json_t *agw_auth_scopes(json_t *claims)
{
    json_t *out = json_array();
    json_t *scope = json_object_get(claims, "scope"), *scp = json_object_get(claims, "scp");
    if (json_is_string(scope)) {
        const char *s = json_string_value(scope);
        while (*s) {
            while (*s == ' ')
                s++;
            size_t n = strcspn(s, " ");
            if (n)
                json_array_append_new(out, json_stringn(s, n));
            s += n;
        }
    } else if (json_is_array(scp)) {
        size_t i;
        json_t *v;
        json_array_foreach(scp, i, v) if (json_is_string(v)) json_array_append(out, v);
    } else if (json_is_string(scp)) {
        json_array_append(out, scp);
    }
    return out;
}

static int has_scope(json_t *scopes, const char *want)
{
    size_t i;
    json_t *v;
    json_array_foreach(scopes, i, v) if (strcmp(json_string_value(v), want) == 0) return 1;
    return 0;
}

static void fail(agw_auth_result_t *r, int status, const char *error, const char *title)
{
    r->status = status;
    r->error = error;
    r->title = title;
}

/* b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" (RFC 6750 §2.1): 1 for
 * the characters of the first part, 2 for '=' */
static const unsigned char B64TOKEN[256] = {
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1,
    ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1,
    ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
    ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1, ['-'] = 1, ['.'] = 1, ['_'] = 1, ['~'] = 1, ['+'] = 1, ['/'] = 1, ['='] = 2,
};

/* The token of "Bearer <token>" (RFC 6750 §2.1: b64token, the scheme case-insensitive). Returns 1
 * and the token, 0 when the scheme is not Bearer, -1 when it is but the rest is malformed. */
static int bearer(const char *h, size_t len, const char **tok, size_t *tok_len)
{
    if (len < 6 || strncasecmp(h, "bearer", 6) != 0 || (len > 6 && h[6] != ' '))
        return 0;
    size_t i = 6;
    while (i < len && h[i] == ' ')
        i++;
    size_t start = i;
    while (i < len && B64TOKEN[(unsigned char)h[i]] == 1)
        i++;
    if (i == start)
        return -1;
    while (i < len && h[i] == '=')
        i++;
    size_t end = i;
    while (i < len && (h[i] == ' ' || h[i] == '\t'))
        i++;
    if (end == start || i != len)
        return -1;
    *tok = h + start;
    *tok_len = end - start;
    return 1;
}

static void check_jwt(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, const char *authorization,
                      size_t authorization_len, size_t num_authorization, uint64_t now_s, agw_auth_result_t *r)
{
    r->challenge = "Bearer";
    if (!a->jwt_on) {
        fail(r, 503, NULL, "authentication is not available");
        snprintf(r->why, sizeof(r->why), "the endpoint asks for a JWT but gateway.lua configures no auth.jwt");
        return;
    }
    if (authorization == NULL) {
        fail(r, 401, NULL, "a bearer token is required");
        snprintf(r->why, sizeof(r->why), "no Authorization header");
        return;
    }
    if (num_authorization > 1) {
        fail(r, 400, "invalid_request", "the request carries more than one Authorization header");
        snprintf(r->why, sizeof(r->why), "%zu Authorization headers", num_authorization);
        return;
    }
    if (authorization_len < 6 || strncasecmp(authorization, "bearer", 6) != 0 ||
        (authorization_len > 6 && authorization[6] != ' ')) {
        fail(r, 401, NULL, "a bearer token is required");
        snprintf(r->why, sizeof(r->why), "the Authorization header is not of the Bearer scheme");
        return;
    }
    /* a cached token was checked to be a b64token when it was verified: the same bytes need no
     * second scan (the span: after the spaces that follow the scheme, up to trailing blanks) */
    const char *tok = authorization + 6;
    size_t len = authorization_len - 6;
    while (len && *tok == ' ')
        tok++, len--;
    while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
        len--;
    json_t *claims = NULL;
    agw_auth_cache_entry_t *e = cache && len ? cache_slot(cache, tok, len) : NULL;
    /* (read before the keys are: a set installed meanwhile leaves this entry to be verified again) */
    uint64_t keys_set = __atomic_load_n(&a->src->keys_set, __ATOMIC_ACQUIRE);
    if (e && e->serial == a->serial && e->keys_set == keys_set && e->len == len && memcmp(e->token, tok, len) == 0 &&
        now_s < e->exp_s + a->rules.leeway_s) {
        claims = json_incref(e->claims);
        cache->hits++;
    } else {
        if (bearer(authorization, authorization_len, &tok, &len) <= 0) {
            fail(r, 400, "invalid_request", "the Authorization header is malformed");
            snprintf(r->why, sizeof(r->why), "Authorization: Bearer without a well-formed token");
            return;
        }
        agw_jwks_t *ks = current_keys(a);
        if (ks == NULL && a->secret == NULL) {
            fail(r, 503, NULL, "authentication is not available yet");
            snprintf(r->why, sizeof(r->why), "no JWKS yet from %s", a->jwks_url ? a->jwks_url : "(none)");
            ask_refetch(a);
            return;
        }
        uint64_t exp = 0;
        uint64_t done = agw_auth_fetches_done(a); /* before the keys were read */
        agw_jwt_status_t st =
            agw_jwt_verify(ks, a->secret, &a->rules, tok, len, now_s, &claims, &exp, r->why, sizeof(r->why));
        agw_jwks_unref(ks);
        if (st != AGW_JWT_OK) {
            if (st == AGW_JWT_UNKNOWN_KID && ask_refetch(a)) {
                r->refetching = 1;
                r->fetches_done = done;
            }
            fail(r, 401, "invalid_token", "the access token is not valid");
            return;
        }
        if (cache) {
            cache->misses++;
            entry_clear(e);
            e->token = agw_malloc(len);
            memcpy(e->token, tok, len);
            e->len = len;
            e->serial = a->serial;
            e->keys_set = keys_set;
            e->exp_s = exp;
            e->claims = json_incref(claims);
        }
    }
    if (p->num_scopes) {
        json_t *scopes = agw_auth_scopes(claims);
        for (size_t i = 0; i < p->num_scopes; i++)
            if (!has_scope(scopes, p->scopes[i])) {
                fail(r, 403, "insufficient_scope", "the access token lacks a scope this resource requires");
                snprintf(r->why, sizeof(r->why), "no scope \"%s\"", p->scopes[i]);
                json_decref(scopes);
                json_decref(claims);
                return;
            }
        json_decref(scopes);
    }
    r->claims = claims;
    r->token = tok;
    r->token_len = len;
}

void agw_auth_refuse_duplicates(agw_auth_result_t *r, const char *challenge, const char *name, size_t n)
{
    memset(r, 0, sizeof(*r));
    r->challenge = challenge;
    fail(r, 400, "invalid_request", "the request carries more than one credential header");
    snprintf(r->why, sizeof(r->why), "%zu %s headers", n, name);
}

void agw_auth_check(agw_auth_t *a, const agw_auth_policy_t *p, agw_auth_cache_t *cache, const char *authorization,
                    size_t authorization_len, size_t num_authorization, const char *apikey, size_t apikey_len,
                    uint64_t now_s, agw_auth_result_t *r)
{
    memset(r, 0, sizeof(*r));
    switch (p->kind) {
    case AGW_AUTH_NONE:
        return;
    case AGW_AUTH_JWT:
        check_jwt(a, p, cache, authorization, authorization_len, num_authorization, now_s, r);
        return;
    case AGW_AUTH_API_KEY:
        r->challenge = "APIKey";
        if (!a->apikeys_on) {
            fail(r, 503, NULL, "authentication is not available");
            snprintf(r->why, sizeof(r->why), "the endpoint asks for an API key but gateway.lua configures no auth.api_keys");
        } else if (apikey == NULL || apikey_len == 0) {
            fail(r, 401, NULL, "an API key is required");
            snprintf(r->why, sizeof(r->why), "no %s header", a->apikey_header);
        } else if ((r->key = agw_apikeys_find(&a->apikeys, apikey, apikey_len)) == NULL) {
            fail(r, 401, "invalid_key", "the API key is not valid");
            snprintf(r->why, sizeof(r->why), "an API key that is not in the key file");
        }
        return;
    }
}
