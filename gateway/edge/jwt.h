/* jwt.h: verifying a JSON Web Token (RFC 7519) signed as a JWS in compact form (RFC 7515) with a
 * key of a JSON Web Key Set (RFC 7517), by the rules of JWT best current practice (RFC 8725).
 *
 * The rules (each a test in gateway/tests/test_jwt.c):
 * - The algorithm is pinned per key, never taken from the token alone (RFC 8725 §2.1, §3.1): a
 *   key verifies only the algorithms of its JWK "alg" member, or when it has none, the configured
 *   algorithms that fit its type (RSA: RS*, PS*; EC: the ES* of its curve). HS* verify only with
 *   the configured shared secret (agw_jwks_add_secret), never with a key of a JWKS: a JWKS holds
 *   public keys, and an RSA public key used as an HMAC secret is the classic confusion attack.
 *   "none" is refused whatever the configuration.
 * - The header is parsed with a size cap; "crit" is refused (no extension is understood, RFC 7515
 *   §4.1.11); "typ", when present, must be "JWT" or "at+jwt" (RFC 9068 §2.1).
 * - Claims: "exp" is required and checked, "nbf" and "iat" checked when present, each with the
 *   leeway (seconds); "iss" equal to the configured issuer; "aud" (a string or a list) holding one
 *   of the configured audiences; every claim of required_claims present. Duplicate member names
 *   are refused (RFC 7519 §4).
 *
 * Signatures are checked by libcjose (Debian's libcjose-dev 0.6.2, on OpenSSL's libcrypto).
 * Everything here is pure (no I/O, no clock): the caller passes the time and the keys, so the
 * unit tests and every thread share it. An agw_jwks_t is immutable once built and reference
 * counted: workers verify with it while a fetcher builds the next one (edge/auth.h).
 */
#ifndef AGW_EDGE_JWT_H
#define AGW_EDGE_JWT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* The signature algorithms (RFC 7518 §3.1), as a bit set. */
enum {
    AGW_JWT_RS256 = 1 << 0, AGW_JWT_RS384 = 1 << 1, AGW_JWT_RS512 = 1 << 2,
    AGW_JWT_PS256 = 1 << 3, AGW_JWT_PS384 = 1 << 4, AGW_JWT_PS512 = 1 << 5,
    AGW_JWT_ES256 = 1 << 6, AGW_JWT_ES384 = 1 << 7, AGW_JWT_ES512 = 1 << 8,
    AGW_JWT_HS256 = 1 << 9, AGW_JWT_HS384 = 1 << 10, AGW_JWT_HS512 = 1 << 11,
};
#define AGW_JWT_HMAC (AGW_JWT_HS256 | AGW_JWT_HS384 | AGW_JWT_HS512)

/* The bit of algorithm name ("RS256"), 0 for a name that is not one of the above ("none"
 * included). */
unsigned agw_jwt_alg_bit(const char *name);

/* A set of verification keys (private: use the functions below). */
typedef struct agw_jwks agw_jwks_t;

/* Builds a key set from a JWKS document (RFC 7517 §5: { "keys": [ … ] }) of len bytes. algs: the
 * configured algorithms (bit set); a key is kept with the algorithms it may verify (see the rules
 * above). Keys that cannot be used are skipped with a note in why (a private key is used for its
 * public part only; "use" other than "sig", "oct" keys, RSA keys under 2048 bits, unknown types
 * and curves are skipped). Returns a set with one reference, or NULL with the reason in why
 * (not JSON, no "keys" list, no usable key). Any thread. */
agw_jwks_t *agw_jwks_parse(const char *json, size_t len, unsigned algs, char *why, size_t whylen);

/* A key set of one shared secret (len bytes, at least 32: RFC 7518 §3.2) for the HS* algorithms
 * of algs, with no kid: it verifies tokens of those algorithms whatever their kid. Returns NULL
 * when the secret is too short or algs holds no HS* algorithm, with why. */
agw_jwks_t *agw_jwks_secret(const unsigned char *secret, size_t len, unsigned algs, char *why, size_t whylen);

/* Number of keys in the set. */
size_t agw_jwks_count(const agw_jwks_t *ks);

/* One more reference (thread-safe); returns ks. NULL is returned as NULL. */
agw_jwks_t *agw_jwks_ref(agw_jwks_t *ks);

/* Drops a reference (thread-safe); the last frees the set. NULL is ignored. */
void agw_jwks_unref(agw_jwks_t *ks);

/* What the verifier checks besides the signature. */
typedef struct agw_jwt_rules {
    const char *issuer;           /* "iss" must equal this; NULL: not checked */
    const char *const *audiences; /* "aud" must hold one of these; num_audiences 0: not checked */
    size_t num_audiences;
    const char *const *required;  /* claims that must be present (besides exp) */
    size_t num_required;
    uint64_t leeway_s;            /* clock skew allowed on exp, nbf and iat, seconds (RFC 7519 §4.1.4) */
    size_t max_token_bytes;       /* longer tokens are refused before any decoding */
} agw_jwt_rules_t;

typedef enum agw_jwt_status {
    AGW_JWT_OK = 0,
    AGW_JWT_INVALID,       /* malformed, forged, expired, wrong issuer or audience: 401 invalid_token */
    AGW_JWT_UNKNOWN_KID,   /* well formed, but no key of the set has its kid (a refetch may find it) */
} agw_jwt_status_t;

/* Verifies token (len bytes, the compact JWS without "Bearer ") against keys (one set, or two:
 * keys2 may be NULL; typically the JWKS and the shared secret) and rules at time now_s (seconds
 * since the Unix epoch). On AGW_JWT_OK *claims is the token's payload (a JSON object, one
 * reference for the caller: json_decref) and *exp_s its "exp". Otherwise *claims is NULL and why
 * holds the reason, for the log only (never for the client: it may name keys). Any thread. */
agw_jwt_status_t agw_jwt_verify(const agw_jwks_t *keys, const agw_jwks_t *keys2, const agw_jwt_rules_t *rules,
                                const char *token, size_t len, uint64_t now_s, json_t **claims, uint64_t *exp_s,
                                char *why, size_t whylen);

#endif
