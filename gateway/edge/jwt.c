/* jwt.c: JWT verification with libcjose (see jwt.h for the rules). */
#include "jwt.h"
#include "base/mem.h"

#include <cjose/cjose.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_HEADER_BYTES 1024 /* a JOSE header beyond this is not one an issuer sends */
#define MAX_CLAIMS_DEPTH 16   /* claims nest a few levels; scripts get them as Lua tables */

typedef struct jwk {
    char *kid;          /* NULL: the key has no kid */
    cjose_jwk_t *key;
    unsigned algs;      /* what it may verify (AGW_JWT_* bits) */
} jwk_t;

struct agw_jwks {
    jwk_t *keys;
    size_t num;
    int refs;           /* atomic */
};

static const struct {
    const char *name;
    unsigned bit;
} ALGS[] = {
    {"RS256", AGW_JWT_RS256}, {"RS384", AGW_JWT_RS384}, {"RS512", AGW_JWT_RS512},
    {"PS256", AGW_JWT_PS256}, {"PS384", AGW_JWT_PS384}, {"PS512", AGW_JWT_PS512},
    {"ES256", AGW_JWT_ES256}, {"ES384", AGW_JWT_ES384}, {"ES512", AGW_JWT_ES512},
    {"HS256", AGW_JWT_HS256}, {"HS384", AGW_JWT_HS384}, {"HS512", AGW_JWT_HS512},
};

#define RSA_ALGS (AGW_JWT_RS256 | AGW_JWT_RS384 | AGW_JWT_RS512 | AGW_JWT_PS256 | AGW_JWT_PS384 | AGW_JWT_PS512)

unsigned agw_jwt_alg_bit(const char *name)
{
    for (size_t i = 0; name && i < sizeof(ALGS) / sizeof(ALGS[0]); i++)
        if (strcmp(name, ALGS[i].name) == 0)
            return ALGS[i].bit;
    return 0;
}

static void say(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t whylen, const char *fmt, ...)
{
    if (why == NULL || whylen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
}

static agw_jwks_t *jwks_new(size_t cap)
{
    agw_jwks_t *ks = agw_calloc(1, sizeof(*ks));
    ks->keys = agw_calloc(cap ? cap : 1, sizeof(jwk_t));
    ks->refs = 1;
    return ks;
}

static void jwks_free(agw_jwks_t *ks)
{
    for (size_t i = 0; i < ks->num; i++) {
        free(ks->keys[i].kid);
        cjose_jwk_release(ks->keys[i].key);
    }
    free(ks->keys);
    free(ks);
}

/* The algorithms key k (a JWK object, imported as key) may verify, given the configured algs;
 * 0 with a reason when it may verify none. */
static unsigned key_algs(json_t *k, cjose_jwk_t *key, unsigned algs, char *why, size_t whylen)
{
    unsigned fit;
    switch (cjose_jwk_get_kty(key, NULL)) {
    case CJOSE_JWK_KTY_RSA:
        if (cjose_jwk_get_keysize(key, NULL) < 2048) { /* RFC 7518 §3.3 */
            say(why, whylen, "an RSA key under 2048 bits");
            return 0;
        }
        fit = RSA_ALGS;
        break;
    case CJOSE_JWK_KTY_EC:
        switch (cjose_jwk_EC_get_curve(key, NULL)) {
        case CJOSE_JWK_EC_P_256: fit = AGW_JWT_ES256; break;
        case CJOSE_JWK_EC_P_384: fit = AGW_JWT_ES384; break;
        case CJOSE_JWK_EC_P_521: fit = AGW_JWT_ES512; break;
        default: say(why, whylen, "an EC key on an unknown curve"); return 0;
        }
        break;
    default: /* "oct": a JWKS is public; shared secrets are configured apart */
        say(why, whylen, "a symmetric (oct) key: shared secrets are configured with secret_file, never in a JWKS");
        return 0;
    }
    json_t *use = json_object_get(k, "use");
    if (use && (!json_is_string(use) || strcmp(json_string_value(use), "sig") != 0)) {
        say(why, whylen, "a key whose \"use\" is not \"sig\"");
        return 0;
    }
    json_t *alg = json_object_get(k, "alg");
    if (alg) {
        unsigned bit = json_is_string(alg) ? agw_jwt_alg_bit(json_string_value(alg)) : 0;
        if ((bit & fit) == 0) {
            say(why, whylen, "a key whose \"alg\" does not fit its type");
            return 0;
        }
        fit = bit;
    }
    if ((fit & algs) == 0) {
        say(why, whylen, "a key for algorithms the configuration does not allow");
        return 0;
    }
    return fit & algs;
}

agw_jwks_t *agw_jwks_parse(const char *json, size_t len, unsigned algs, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL) {
        /* a PEM file (a public key or a certificate) given where a JWKS is wanted */
        int pem = len >= 10 && memmem(json, len < 256 ? len : 256, "-----BEGIN", 10) != NULL;
        say(why, whylen, "not JSON: %s (line %d)%s", jerr.text, jerr.line,
            pem ? "; this is a PEM file: jwks_file wants a JWK Set, { \"keys\": [ … ] } (RFC 7517 §5), which "
                  "docs/operations.md, \"Authentication\", shows how to make from it" : "");
        return NULL;
    }
    json_t *list = json_object_get(doc, "keys");
    if (!json_is_array(list)) {
        say(why, whylen, "no \"keys\" list (a JWKS is { \"keys\": [ … ] }, RFC 7517 §5)");
        json_decref(doc);
        return NULL;
    }
    agw_jwks_t *ks = jwks_new(json_array_size(list));
    char skipped[256] = "";
    size_t i;
    json_t *k;
    json_array_foreach(list, i, k) {
        char reason[160] = "not a public key JWK this gateway can read (kty RSA with n and e, or EC with crv, x "
                           "and y; RFC 7518 §6)";
        cjose_jwk_t *key = json_is_object(k) ? cjose_jwk_import_json((cjose_header_t *)k, NULL) : NULL;
        unsigned kalgs = key ? key_algs(k, key, algs & ~AGW_JWT_HMAC, reason, sizeof(reason)) : 0;
        if (kalgs == 0) {
            if (key)
                cjose_jwk_release(key);
            if (skipped[0] == '\0')
                snprintf(skipped, sizeof(skipped), "key %zu skipped: %s", i + 1, reason);
            continue;
        }
        json_t *kid = json_object_get(k, "kid");
        jwk_t *e = &ks->keys[ks->num++];
        e->key = key;
        e->algs = kalgs;
        e->kid = json_is_string(kid) ? agw_strdup(json_string_value(kid)) : NULL;
    }
    json_decref(doc);
    if (ks->num == 0) {
        say(why, whylen, "no usable key (%s)", skipped[0] ? skipped : "the list is empty");
        jwks_free(ks);
        return NULL;
    }
    say(why, whylen, "%s", skipped);
    return ks;
}

agw_jwks_t *agw_jwks_secret(const unsigned char *secret, size_t len, unsigned algs, char *why, size_t whylen)
{
    if ((algs & AGW_JWT_HMAC) == 0) {
        say(why, whylen, "a shared secret is for HS256, HS384 or HS512: list one of them in algorithms");
        return NULL;
    }
    if (len < 32) {
        say(why, whylen, "the shared secret has %zu bytes; HS256 needs at least 32 (RFC 7518 §3.2)", len);
        return NULL;
    }
    cjose_jwk_t *key = cjose_jwk_create_oct_spec(secret, len, NULL);
    if (key == NULL) {
        say(why, whylen, "the shared secret cannot be made a key");
        return NULL;
    }
    agw_jwks_t *ks = jwks_new(1);
    ks->keys[0].key = key;
    ks->keys[0].algs = algs & AGW_JWT_HMAC;
    ks->num = 1;
    return ks;
}

size_t agw_jwks_count(const agw_jwks_t *ks)
{
    return ks ? ks->num : 0;
}

agw_jwks_t *agw_jwks_ref(agw_jwks_t *ks)
{
    if (ks)
        __atomic_add_fetch(&ks->refs, 1, __ATOMIC_RELAXED);
    return ks;
}

void agw_jwks_unref(agw_jwks_t *ks)
{
    if (ks && __atomic_sub_fetch(&ks->refs, 1, __ATOMIC_ACQ_REL) == 0)
        jwks_free(ks);
}

/* ---- verification --------------------------------------------------------------------------- */

/* Whether token is three non-empty base64url parts (RFC 7515 §7.1; no padding, no whitespace). */
static int compact_form(const char *t, size_t len)
{
    int dots = 0;
    size_t part = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '.') {
            if (part == 0)
                return 0;
            dots++;
            part = 0;
        } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                   c == '_') {
            part++;
        } else {
            return 0;
        }
    }
    return dots == 2 && part > 0;
}

/* A NumericDate claim (RFC 7519 §2): 1 and *out when present and a number >= 0, 0 when absent,
 * -1 when it is something else. */
static int numeric_date(json_t *claims, const char *name, double *out)
{
    json_t *v = json_object_get(claims, name);
    if (v == NULL)
        return 0;
    if (!json_is_number(v) || json_number_value(v) < 0)
        return -1;
    *out = json_number_value(v);
    return 1;
}

static int depth_ok(json_t *v, int left)
{
    if (!json_is_object(v) && !json_is_array(v))
        return 1;
    if (left == 0)
        return 0;
    size_t i;
    const char *k;
    json_t *e;
    if (json_is_array(v)) {
        json_array_foreach(v, i, e) if (!depth_ok(e, left - 1)) return 0;
    } else {
        json_object_foreach(v, k, e) if (!depth_ok(e, left - 1)) return 0;
    }
    return 1;
}

static int aud_ok(json_t *aud, const agw_jwt_rules_t *r)
{
    for (size_t i = 0; i < r->num_audiences; i++) {
        if (json_is_string(aud) && strcmp(json_string_value(aud), r->audiences[i]) == 0)
            return 1;
        size_t j;
        json_t *a;
        if (json_is_array(aud))
            json_array_foreach(aud, j, a) if (json_is_string(a) && strcmp(json_string_value(a), r->audiences[i]) == 0)
                return 1;
    }
    return 0;
}

/* Checks the claims (RFC 7519 §4.1). Returns 0, or -1 with why. */
static int check_claims(json_t *claims, const agw_jwt_rules_t *r, uint64_t now_s, uint64_t *exp_s, char *why,
                        size_t whylen)
{
    double exp = 0, nbf = 0, iat = 0, now = (double)now_s, leeway = (double)r->leeway_s;
    int has = numeric_date(claims, "exp", &exp);
    if (has <= 0) {
        say(why, whylen, has < 0 ? "\"exp\" is not a NumericDate" : "no \"exp\" claim");
        return -1;
    }
    if (now >= exp + leeway) {
        say(why, whylen, "expired %.0f s ago", now - exp);
        return -1;
    }
    if ((has = numeric_date(claims, "nbf", &nbf)) < 0 || (has > 0 && now + leeway < nbf)) {
        say(why, whylen, has < 0 ? "\"nbf\" is not a NumericDate" : "not valid before %.0f s from now", nbf - now);
        return -1;
    }
    if ((has = numeric_date(claims, "iat", &iat)) < 0 || (has > 0 && iat > now + leeway)) {
        say(why, whylen, has < 0 ? "\"iat\" is not a NumericDate" : "issued %.0f s in the future", iat - now);
        return -1;
    }
    /* the subject names the user (limits by user, result.user): a StringOrURI (RFC 7519 §4.1.2);
     * a number or an object there left limits by user counting every such token as one user */
    json_t *sub = json_object_get(claims, "sub");
    if (sub != NULL && !json_is_string(sub)) {
        say(why, whylen, "\"sub\" is not a string");
        return -1;
    }
    if (r->issuer) {
        json_t *iss = json_object_get(claims, "iss");
        if (!json_is_string(iss) || strcmp(json_string_value(iss), r->issuer) != 0) {
            say(why, whylen, "\"iss\" is not the configured issuer");
            return -1;
        }
    }
    if (r->num_audiences && !aud_ok(json_object_get(claims, "aud"), r)) {
        say(why, whylen, "\"aud\" names none of the configured audiences");
        return -1;
    }
    for (size_t i = 0; i < r->num_required; i++)
        if (json_object_get(claims, r->required[i]) == NULL) {
            say(why, whylen, "the required claim \"%s\" is missing", r->required[i]);
            return -1;
        }
    /* (a signed exp beyond any date: converting a double past 2^64 is undefined; 2^62 s is ever) */
    *exp_s = exp < 4611686018427387904.0 ? (uint64_t)exp : (uint64_t)1 << 62;
    return 0;
}

/* The key of ks that fits (kid, alg), or NULL. A key without kid fits any kid only in a set of
 * one shared secret; a token without kid is tried against every key that may verify alg. */
static int try_keys(const agw_jwks_t *ks, cjose_jws_t *jws, const char *kid, unsigned alg, int *kid_seen)
{
    if (ks == NULL)
        return 0;
    for (size_t i = 0; i < ks->num; i++) {
        const jwk_t *k = &ks->keys[i];
        int secret = (k->algs & AGW_JWT_HMAC) != 0;
        if (kid && !secret && (k->kid == NULL || strcmp(k->kid, kid) != 0))
            continue;
        if (kid || secret)
            *kid_seen = 1;
        if ((k->algs & alg) == 0)
            continue; /* pinned: this key never verifies this algorithm */
        if (cjose_jws_verify(jws, k->key, NULL))
            return 1;
    }
    return 0;
}

agw_jwt_status_t agw_jwt_verify(const agw_jwks_t *keys, const agw_jwks_t *keys2, const agw_jwt_rules_t *rules,
                                const char *token, size_t len, uint64_t now_s, json_t **claims, uint64_t *exp_s,
                                char *why, size_t whylen)
{
    *claims = NULL;
    if (len > rules->max_token_bytes) {
        say(why, whylen, "the token has %zu bytes, more than max_token_bytes (%zu)", len, rules->max_token_bytes);
        return AGW_JWT_INVALID;
    }
    if (!compact_form(token, len)) {
        say(why, whylen, "not a compact JWS (three base64url parts separated by '.')");
        return AGW_JWT_INVALID;
    }
    if ((size_t)(memchr(token, '.', len) ? (const char *)memchr(token, '.', len) - token : 0) > MAX_HEADER_BYTES) {
        say(why, whylen, "the JOSE header is longer than %d bytes", MAX_HEADER_BYTES);
        return AGW_JWT_INVALID;
    }
    cjose_err err;
    cjose_jws_t *jws = cjose_jws_import(token, len, &err);
    if (jws == NULL) {
        say(why, whylen, "malformed JWS: %s", err.message ? err.message : "cannot be decoded");
        return AGW_JWT_INVALID;
    }
    agw_jwt_status_t st = AGW_JWT_INVALID;
    json_t *hdr = (json_t *)cjose_jws_get_protected(jws);
    json_t *alg_v = json_object_get(hdr, "alg"), *kid_v = json_object_get(hdr, "kid");
    json_t *typ = json_object_get(hdr, "typ");
    const char *alg_name = json_is_string(alg_v) ? json_string_value(alg_v) : NULL;
    unsigned alg = agw_jwt_alg_bit(alg_name);
    if (alg == 0) {
        say(why, whylen, "algorithm \"%.20s\" is not accepted", alg_name ? alg_name : "(none given)");
        goto out;
    }
    if (json_object_get(hdr, "crit")) {
        say(why, whylen, "the header has \"crit\" extensions, none of which is understood");
        goto out;
    }
    if (typ && !(json_is_string(typ) && (strcasecmp(json_string_value(typ), "JWT") == 0 ||
                                         strcasecmp(json_string_value(typ), "at+jwt") == 0 ||
                                         strcasecmp(json_string_value(typ), "application/at+jwt") == 0))) {
        say(why, whylen, "the header's \"typ\" is not JWT");
        goto out;
    }
    if (kid_v && !json_is_string(kid_v)) {
        say(why, whylen, "the header's \"kid\" is not a string");
        goto out;
    }
    const char *kid = kid_v ? json_string_value(kid_v) : NULL;
    int kid_seen = 0;
    if (!try_keys(keys, jws, kid, alg, &kid_seen) && !try_keys(keys2, jws, kid, alg, &kid_seen)) {
        if (kid && !kid_seen) {
            say(why, whylen, "no key has kid \"%.64s\"", kid);
            st = AGW_JWT_UNKNOWN_KID;
        } else {
            say(why, whylen, "the signature does not verify with any key allowed for %s", alg_name);
        }
        goto out;
    }
    uint8_t *plain = NULL;
    size_t plain_len = 0;
    if (!cjose_jws_get_plaintext(jws, &plain, &plain_len, NULL)) {
        say(why, whylen, "no payload");
        goto out;
    }
    json_error_t jerr;
    json_t *c = json_loadb((const char *)plain, plain_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(c)) {
        say(why, whylen, "the payload is not a JSON object%s%s", c ? "" : ": ", c ? "" : jerr.text);
        json_decref(c);
        goto out;
    }
    if (!depth_ok(c, MAX_CLAIMS_DEPTH)) {
        say(why, whylen, "the claims nest deeper than %d levels", MAX_CLAIMS_DEPTH);
        json_decref(c);
        goto out;
    }
    if (check_claims(c, rules, now_s, exp_s, why, whylen) != 0) {
        json_decref(c);
        goto out;
    }
    *claims = c;
    st = AGW_JWT_OK;
out:
    cjose_jws_release(jws);
    return st;
}
