/* test_jwt.c: the JWT verifier, the API key file and the edge's request check (edge/). Keys are
 * made at test time with libcjose (OpenSSL underneath); every forged token is one an attacker can
 * make without the private key. */
#define OPENSSL_SUPPRESS_DEPRECATED /* cjose hands out an RSA *: the test writes its PEM */
#include "tests/check.h"

#include <cjose/cjose.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

#include "edge/apikeys.h"
#include "edge/auth.h"
#include "edge/jwt.h"

#define NOW 1800000000ull

static cjose_jwk_t *rsa_key, *rsa_key2, *ec_key, *ec384_key;

static cjose_jwk_t *new_rsa(const char *kid, size_t bits)
{
    static const uint8_t e[] = {1, 0, 1};
    cjose_jwk_t *k = cjose_jwk_create_RSA_random(bits, e, sizeof(e), NULL);
    cjose_jwk_set_kid(k, kid, strlen(kid), NULL);
    return k;
}

static cjose_jwk_t *new_ec(const char *kid, cjose_jwk_ec_curve crv)
{
    cjose_jwk_t *k = cjose_jwk_create_EC_random(crv, NULL);
    cjose_jwk_set_kid(k, kid, strlen(kid), NULL);
    return k;
}

/* A compact JWS of payload with header (JSON text) signed by key. Caller frees. */
static char *sign(const cjose_jwk_t *key, const char *header, const char *payload)
{
    json_t *h = json_loads(header, 0, NULL);
    cjose_err err;
    cjose_jws_t *jws = cjose_jws_sign(key, (cjose_header_t *)h, (const uint8_t *)payload, strlen(payload), &err);
    json_decref(h);
    if (jws == NULL) {
        fprintf(stderr, "sign: %s\n", err.message);
        return NULL;
    }
    const char *out;
    cjose_jws_export(jws, &out, NULL);
    char *s = strdup(out);
    cjose_jws_release(jws);
    return s;
}

/* base64url(header).base64url(payload).sig as given: tokens no signer would make. */
static char *raw(const char *header, const char *payload, const char *sig)
{
    char *h, *p;
    size_t hl, pl;
    cjose_base64url_encode((const uint8_t *)header, strlen(header), &h, &hl, NULL);
    cjose_base64url_encode((const uint8_t *)payload, strlen(payload), &p, &pl, NULL);
    size_t n = hl + pl + strlen(sig) + 3;
    char *s = malloc(n);
    snprintf(s, n, "%s.%s.%s", h, p, sig);
    free(h);
    free(p);
    return s;
}

static char *jwks_of(cjose_jwk_t **keys, size_t n, const char *extra_member)
{
    agw_buf_t b = {0};
    agw_buf_puts(&b, "{\"keys\":[");
    for (size_t i = 0; i < n; i++) {
        char *j = cjose_jwk_to_json(keys[i], false, NULL);
        if (extra_member) { /* "alg":"PS256" etc. spliced in after the '{' */
            agw_buf_printf(&b, "%s{%s,%s", i ? "," : "", extra_member, j + 1);
        } else {
            agw_buf_printf(&b, "%s%s", i ? "," : "", j);
        }
        free(j);
    }
    agw_buf_puts(&b, "]}");
    agw_buf_putc(&b, '\0');
    return b.base;
}

static const char *AUDS[] = {"aggway"};
static agw_jwt_rules_t rules(void)
{
    agw_jwt_rules_t r = {.issuer = "https://id.test", .audiences = AUDS, .num_audiences = 1, .leeway_s = 60,
                         .max_token_bytes = 8192};
    return r;
}

static char claims_buf[1024];
static const char *claims(long exp_off, const char *more)
{
    snprintf(claims_buf, sizeof(claims_buf), "{\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"sub\":\"u1\","
             "\"exp\":%llu%s%s}", NOW + exp_off, more ? "," : "", more ? more : "");
    return claims_buf;
}

static agw_jwks_t *keys_all(unsigned algs)
{
    cjose_jwk_t *ks[] = {rsa_key, ec_key};
    char *j = jwks_of(ks, 2, NULL);
    char why[256];
    agw_jwks_t *set = agw_jwks_parse(j, strlen(j), algs, why, sizeof(why));
    free(j);
    return set;
}

static agw_jwt_status_t verify_with(const agw_jwks_t *ks, const agw_jwks_t *secret, agw_jwt_rules_t r, const char *tok)
{
    json_t *c = NULL;
    uint64_t exp;
    char why[256];
    agw_jwt_status_t st = agw_jwt_verify(ks, secret, &r, tok, strlen(tok), NOW, &c, &exp, why, sizeof(why));
    CHECK((st == AGW_JWT_OK) == (c != NULL));
    json_decref(c);
    return st;
}

#define ALL_ASYM (AGW_JWT_RS256 | AGW_JWT_PS256 | AGW_JWT_ES256)

static void valid_rs256_ps256_es256_tokens_verify(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    CHECK(agw_jwks_count(ks) == 2);
    const char *algs[][2] = {{"RS256", "r1"}, {"PS256", "r1"}, {"ES256", "e1"}};
    for (int i = 0; i < 3; i++) {
        char hdr[96];
        snprintf(hdr, sizeof(hdr), "{\"alg\":\"%s\",\"kid\":\"%s\",\"typ\":\"JWT\"}", algs[i][0], algs[i][1]);
        char *t = sign(i < 2 ? rsa_key : ec_key, hdr, claims(300, NULL));
        json_t *c = NULL;
        uint64_t exp = 0;
        char why[256];
        agw_jwt_rules_t r = rules();
        CHECK(agw_jwt_verify(ks, NULL, &r, t, strlen(t), NOW, &c, &exp, why, sizeof(why)) == AGW_JWT_OK);
        CHECK(exp == NOW + 300);
        CHECK_STR(json_string_value(json_object_get(c, "sub")), "u1");
        json_decref(c);
        free(t);
    }
    agw_jwks_unref(ks);
}

static void a_token_without_kid_is_tried_against_the_keys_of_its_algorithm(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    char *t = sign(rsa_key, "{\"alg\":\"RS256\"}", claims(300, NULL));
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_OK);
    free(t);
    agw_jwks_unref(ks);
}

static void a_forged_signature_or_altered_payload_is_refused(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    char *t = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, NULL));
    char *last = t + strlen(t) - 2;
    *last = *last == 'A' ? 'B' : 'A';
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    /* the payload of another token under this token's signature */
    char *a = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, NULL));
    char *b = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, "\"admin\":true"));
    char *a_sig = strrchr(a, '.'), *b_sig = strrchr(b, '.');
    char mixed[4096];
    snprintf(mixed, sizeof(mixed), "%.*s%s", (int)(b_sig - b), b, a_sig);
    CHECK(verify_with(ks, NULL, rules(), mixed) == AGW_JWT_INVALID);
    /* signed by another RSA key under this key's kid */
    char *other = sign(rsa_key2, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, NULL));
    CHECK(verify_with(ks, NULL, rules(), other) == AGW_JWT_INVALID);
    free(a);
    free(b);
    free(other);
    agw_jwks_unref(ks);
}

/* RFC 8725 §2.1: HS256 with the RSA public key as the HMAC secret. */
static void hs256_signed_with_the_rsa_public_key_is_refused(void)
{
    RSA *rsa = cjose_jwk_get_keydata(rsa_key, NULL);
    BIO *bio = BIO_new(BIO_s_mem());
    PEM_write_bio_RSA_PUBKEY(bio, rsa);
    char *pem;
    long pem_len = BIO_get_mem_data(bio, &pem);
    cjose_jwk_t *as_secret = cjose_jwk_create_oct_spec((const uint8_t *)pem, (size_t)pem_len, NULL);
    char *n_json = cjose_jwk_to_json(rsa_key, false, NULL); /* and the JWK's own text as the secret */
    cjose_jwk_t *as_secret2 = cjose_jwk_create_oct_spec((const uint8_t *)n_json, strlen(n_json), NULL);
    char *t1 = sign(as_secret, "{\"alg\":\"HS256\",\"kid\":\"r1\"}", claims(300, NULL));
    char *t2 = sign(as_secret2, "{\"alg\":\"HS256\"}", claims(300, NULL));
    /* even with HS256 among the configured algorithms and a shared secret configured */
    agw_jwks_t *ks = keys_all(ALL_ASYM | AGW_JWT_HS256);
    char why[200];
    const unsigned char s[] = "0123456789abcdef0123456789abcdef-the-real-secret";
    agw_jwks_t *secret = agw_jwks_secret(s, sizeof(s) - 1, AGW_JWT_HS256, why, sizeof(why));
    CHECK(secret != NULL);
    CHECK(verify_with(ks, NULL, rules(), t1) == AGW_JWT_INVALID);
    CHECK(verify_with(ks, secret, rules(), t1) == AGW_JWT_INVALID);
    CHECK(verify_with(ks, secret, rules(), t2) == AGW_JWT_INVALID);
    /* the real secret verifies */
    cjose_jwk_t *real = cjose_jwk_create_oct_spec(s, sizeof(s) - 1, NULL);
    char *t3 = sign(real, "{\"alg\":\"HS256\"}", claims(300, NULL));
    CHECK(verify_with(ks, secret, rules(), t3) == AGW_JWT_OK);
    CHECK(verify_with(ks, NULL, rules(), t3) == AGW_JWT_INVALID);
    free(t1);
    free(t2);
    free(t3);
    free(n_json);
    cjose_jwk_release(as_secret);
    cjose_jwk_release(as_secret2);
    cjose_jwk_release(real);
    BIO_free(bio);
    agw_jwks_unref(ks);
    agw_jwks_unref(secret);
}

static void alg_none_and_unknown_algorithms_are_refused(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    char *t = raw("{\"alg\":\"none\"}", claims(300, NULL), "");
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    t = raw("{\"alg\":\"none\",\"kid\":\"r1\"}", claims(300, NULL), "AAAA");
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    t = raw("{\"alg\":\"NONE\"}", claims(300, NULL), "AAAA");
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    t = raw("{\"kid\":\"r1\"}", claims(300, NULL), "AAAA");
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    agw_jwks_unref(ks);
}

static void an_algorithm_not_configured_or_not_the_keys_is_refused(void)
{
    agw_jwks_t *only_rs = keys_all(AGW_JWT_RS256 | AGW_JWT_ES256);
    char *ps = sign(rsa_key, "{\"alg\":\"PS256\",\"kid\":\"r1\"}", claims(300, NULL));
    CHECK(verify_with(only_rs, NULL, rules(), ps) == AGW_JWT_INVALID);
    agw_jwks_unref(only_rs);
    /* a JWK whose alg is PS256 verifies PS256 only, whatever else is configured */
    cjose_jwk_t *k[] = {rsa_key};
    char *j = jwks_of(k, 1, "\"alg\":\"PS256\"");
    char why[200];
    agw_jwks_t *pinned = agw_jwks_parse(j, strlen(j), ALL_ASYM, why, sizeof(why));
    CHECK(pinned != NULL);
    char *rs = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, NULL));
    CHECK(verify_with(pinned, NULL, rules(), rs) == AGW_JWT_INVALID);
    CHECK(verify_with(pinned, NULL, rules(), ps) == AGW_JWT_OK);
    /* key type mismatch: an ES256 token under the RSA key's kid */
    char *es = sign(ec_key, "{\"alg\":\"ES256\",\"kid\":\"r1\"}", claims(300, NULL));
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    CHECK(verify_with(ks, NULL, rules(), es) == AGW_JWT_INVALID);
    /* ES384 key with an ES256 token: the curve pins the algorithm */
    cjose_jwk_t *k384[] = {ec384_key};
    char *j384 = jwks_of(k384, 1, NULL);
    agw_jwks_t *ks384 = agw_jwks_parse(j384, strlen(j384), ALL_ASYM | AGW_JWT_ES384, why, sizeof(why));
    CHECK(ks384 != NULL);
    char *es384_as_256 = sign(ec384_key, "{\"alg\":\"ES384\",\"kid\":\"e384\"}", claims(300, NULL));
    CHECK(verify_with(ks384, NULL, rules(), es384_as_256) == AGW_JWT_OK);
    free(es384_as_256);
    free(j384);
    agw_jwks_unref(ks384);
    free(j);
    free(ps);
    free(rs);
    free(es);
    agw_jwks_unref(pinned);
    agw_jwks_unref(ks);
}

static void time_claims_are_checked_with_the_leeway(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    const char *h = "{\"alg\":\"RS256\",\"kid\":\"r1\"}";
    struct {
        long exp;
        const char *more;
        agw_jwt_status_t want;
    } cases[] = {
        {-30, NULL, AGW_JWT_OK},                    /* expired within the leeway */
        {-61, NULL, AGW_JWT_INVALID},               /* expired beyond it */
        {300, "\"nbf\":1800000030", AGW_JWT_OK},    /* nbf within the leeway */
        {300, "\"nbf\":1800000100", AGW_JWT_INVALID},
        {300, "\"iat\":1800000100", AGW_JWT_INVALID}, /* issued in the future */
        {300, "\"iat\":1799999000", AGW_JWT_OK},
        {300, "\"nbf\":\"soon\"", AGW_JWT_INVALID},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *t = sign(rsa_key, h, claims(cases[i].exp, cases[i].more));
        agw_jwt_status_t st = verify_with(ks, NULL, rules(), t);
        if (st != cases[i].want)
            fprintf(stderr, "case %zu: got %d\n", i, st);
        CHECK(st == cases[i].want);
        free(t);
    }
    char *no_exp = sign(rsa_key, h, "{\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"sub\":\"u1\"}");
    CHECK(verify_with(ks, NULL, rules(), no_exp) == AGW_JWT_INVALID);
    char *str_exp = sign(rsa_key, h, "{\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"exp\":\"1900000000\"}");
    CHECK(verify_with(ks, NULL, rules(), str_exp) == AGW_JWT_INVALID);
    free(no_exp);
    free(str_exp);
    /* an exp beyond any date (an issuer's own mistake): accepted, with an exp the cache can add a
     * leeway to (a double past 2^64 made an integer is undefined behaviour: UBSan in the debug build) */
    const char *huge[] = {"1e30", "1e300", "18446744073709551615.0"};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        char p[160];
        snprintf(p, sizeof(p), "{\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"sub\":\"u1\",\"exp\":%s}", huge[i]);
        char *t = sign(rsa_key, h, p);
        json_t *c = NULL;
        uint64_t exp = 0;
        char why[256];
        agw_jwt_rules_t r = rules();
        CHECK(agw_jwt_verify(ks, NULL, &r, t, strlen(t), NOW, &c, &exp, why, sizeof(why)) == AGW_JWT_OK);
        CHECK(exp == (uint64_t)1 << 62);
        CHECK(exp + r.leeway_s > exp);
        json_decref(c);
        free(t);
    }
    /* sub is a StringOrURI (RFC 7519 §4.1.2): a number or an object there is refused (limits by
     * user counted every such token as one user); a string, or no sub, passes */
    static const char *const subs[] = {"\"sub\":5,", "\"sub\":{\"id\":\"u1\"},", "\"sub\":null,", "\"sub\":\"u1\",", ""};
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        char c[256];
        snprintf(c, sizeof(c), "{%s\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"exp\":%llu}", subs[i], NOW + 300);
        char *t = sign(rsa_key, h, c);
        agw_jwt_status_t st = verify_with(ks, NULL, rules(), t);
        if (st != (i < 3 ? AGW_JWT_INVALID : AGW_JWT_OK))
            fprintf(stderr, "sub case %zu: got %d\n", i, st);
        CHECK(st == (i < 3 ? AGW_JWT_INVALID : AGW_JWT_OK));
        free(t);
    }
    agw_jwks_unref(ks);
}

static void wrong_issuer_audience_or_missing_claims_are_refused(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    const char *h = "{\"alg\":\"RS256\",\"kid\":\"r1\"}";
    char p[512];
    snprintf(p, sizeof(p), "{\"iss\":\"https://evil.test\",\"aud\":\"aggway\",\"exp\":%llu}", NOW + 300);
    char *t = sign(rsa_key, h, p);
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    snprintf(p, sizeof(p), "{\"iss\":\"https://id.test\",\"aud\":\"billing\",\"exp\":%llu}", NOW + 300);
    t = sign(rsa_key, h, p);
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    free(t);
    snprintf(p, sizeof(p), "{\"iss\":\"https://id.test\",\"aud\":[\"billing\",\"aggway\"],\"exp\":%llu}", NOW + 300);
    t = sign(rsa_key, h, p);
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_OK);
    free(t);
    snprintf(p, sizeof(p), "{\"iss\":\"https://id.test\",\"exp\":%llu}", NOW + 300);
    t = sign(rsa_key, h, p);
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
    agw_jwt_rules_t r = rules();
    r.num_audiences = 0;
    CHECK(verify_with(ks, NULL, r, t) == AGW_JWT_OK);
    const char *req[] = {"sub"};
    r.required = req;
    r.num_required = 1;
    CHECK(verify_with(ks, NULL, r, t) == AGW_JWT_INVALID);
    free(t);
    agw_jwks_unref(ks);
}

static void oversized_malformed_and_odd_headers_are_refused(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    agw_jwt_rules_t r = rules();
    char big[700];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    char more[800];
    snprintf(more, sizeof(more), "\"pad\":\"%s\"", big);
    char *t = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, more));
    CHECK(verify_with(ks, NULL, r, t) == AGW_JWT_OK);
    r.max_token_bytes = 1000;
    CHECK(verify_with(ks, NULL, r, t) == AGW_JWT_INVALID);
    free(t);
    const char *bad[] = {
        "", "abc", "a.b", "a.b.c.d", "..", "a..c", "eyJhbGciOiJSUzI1NiJ9.eyJ9.abc=", "eyJ hbGc.e30.AAAA",
        "!!!.e30.AAAA",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(verify_with(ks, NULL, rules(), bad[i]) == AGW_JWT_INVALID);
    /* header or payload not JSON, payload not an object, duplicate claims, crit, typ, deep nesting */
    const char *hdrs[][2] = {
        {"not json", "{}"},
        {"{\"alg\":\"RS256\",\"kid\":\"r1\",\"crit\":[\"exp\"]}", NULL},
        {"{\"alg\":\"RS256\",\"kid\":\"r1\",\"typ\":\"JOSE+JSON\"}", NULL},
        {"{\"alg\":\"RS256\",\"kid\":7}", NULL},
    };
    for (size_t i = 0; i < sizeof(hdrs) / sizeof(hdrs[0]); i++) {
        t = raw(hdrs[i][0], hdrs[i][1] ? hdrs[i][1] : claims(300, NULL), "AAAA");
        CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
        free(t);
    }
    const char *payloads[] = {"not json", "[1,2]", "{\"exp\":1,\"exp\":2}",
                              "{\"exp\":1900000000,\"iss\":\"https://id.test\",\"aud\":\"aggway\",\"d\":"
                              "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}"};
    for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]); i++) {
        t = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", payloads[i]);
        CHECK(t != NULL && verify_with(ks, NULL, rules(), t) == AGW_JWT_INVALID);
        free(t);
    }
    agw_jwks_unref(ks);
}

static void an_unknown_kid_is_told_apart(void)
{
    agw_jwks_t *ks = keys_all(ALL_ASYM);
    char *t = sign(rsa_key2, "{\"alg\":\"RS256\",\"kid\":\"r2\"}", claims(300, NULL));
    CHECK(verify_with(ks, NULL, rules(), t) == AGW_JWT_UNKNOWN_KID);
    /* after a rotation that brought r2 */
    cjose_jwk_t *k[] = {rsa_key, rsa_key2};
    char *j = jwks_of(k, 2, NULL);
    char why[200];
    agw_jwks_t *rotated = agw_jwks_parse(j, strlen(j), ALL_ASYM, why, sizeof(why));
    CHECK(verify_with(rotated, NULL, rules(), t) == AGW_JWT_OK);
    free(j);
    free(t);
    agw_jwks_unref(rotated);
    agw_jwks_unref(ks);
}

static void jwks_documents_keep_only_usable_keys(void)
{
    char why[256];
    const char *s = "{\"keys\":[{\"kty\":\"oct\",\"k\":\"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI\",\"kid\":\"o\"}]}";
    CHECK(agw_jwks_parse(s, strlen(s), ALL_ASYM | AGW_JWT_HS256, why, sizeof(why)) == NULL);
    CHECK(strstr(why, "oct") != NULL);
    cjose_jwk_t *small = new_rsa("small", 1024);
    cjose_jwk_t *k[] = {small};
    char *j = jwks_of(k, 1, NULL);
    CHECK(agw_jwks_parse(j, strlen(j), ALL_ASYM, why, sizeof(why)) == NULL);
    CHECK(strstr(why, "2048") != NULL);
    free(j);
    cjose_jwk_release(small);
    cjose_jwk_t *k2[] = {rsa_key};
    j = jwks_of(k2, 1, "\"use\":\"enc\"");
    CHECK(agw_jwks_parse(j, strlen(j), ALL_ASYM, why, sizeof(why)) == NULL);
    free(j);
    CHECK(agw_jwks_parse("[]", 2, ALL_ASYM, why, sizeof(why)) == NULL);
    CHECK(agw_jwks_parse("{\"keys\":[]}", 11, ALL_ASYM, why, sizeof(why)) == NULL);
    CHECK(agw_jwks_parse("{\"keys\":[", 9, ALL_ASYM, why, sizeof(why)) == NULL);
    CHECK(agw_jwks_secret((const unsigned char *)"short", 5, AGW_JWT_HS256, why, sizeof(why)) == NULL);
    CHECK(agw_jwks_secret((const unsigned char *)"0123456789abcdef0123456789abcdef", 32, AGW_JWT_RS256, why,
                          sizeof(why)) == NULL);
}

static void hex_sha256(const char *key, char out[65])
{
    unsigned char h[32];
    SHA256((const unsigned char *)key, strlen(key), h);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

static void api_keys_are_found_by_their_hash(void)
{
    char h1[65], h2[65], doc[512], why[256];
    hex_sha256("key-one", h1);
    hex_sha256("key-two", h2);
    snprintf(doc, sizeof(doc), "[{\"sha256\":\"%s\",\"app\":\"mobile\",\"plan\":\"gold\"},"
             "{\"sha256\":\"%s\",\"app\":\"web\"}]", h1, h2);
    agw_apikeys_t ks;
    CHECK(agw_apikeys_parse(doc, strlen(doc), &ks, why, sizeof(why)) == 0);
    const agw_apikey_t *k = agw_apikeys_find(&ks, "key-one", 7);
    CHECK(k != NULL && strcmp(k->app, "mobile") == 0 && strcmp(k->plan, "gold") == 0);
    k = agw_apikeys_find(&ks, "key-two", 7);
    CHECK(k != NULL && strcmp(k->app, "web") == 0 && strcmp(k->plan, "") == 0);
    CHECK(agw_apikeys_find(&ks, "key-three", 9) == NULL);
    CHECK(agw_apikeys_find(&ks, h1, 64) == NULL); /* the hash itself is not a key */
    agw_apikeys_free(&ks);
    const char *bad[] = {"{}", "[{\"sha256\":\"abc\",\"app\":\"x\"}]", "[{\"app\":\"x\"}]", "nope",
                         "[{\"sha256\":\"" "0000000000000000000000000000000000000000000000000000000000000000"
                         "\",\"app\":\"x\",\"key\":\"raw\"}]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(agw_apikeys_parse(bad[i], strlen(bad[i]), &ks, why, sizeof(why)) == -1);
    snprintf(doc, sizeof(doc), "[{\"sha256\":\"%s\",\"app\":\"a\"},{\"sha256\":\"%s\",\"app\":\"b\"}]", h1, h1);
    CHECK(agw_apikeys_parse(doc, strlen(doc), &ks, why, sizeof(why)) == -1);
    CHECK(strstr(why, "entry 2") != NULL);
}

static void the_request_check_answers_as_rfc_6750_says(void)
{
    agw_auth_t a;
    agw_auth_init(&a);
    a.jwt_on = 1;
    a.algs = ALL_ASYM;
    a.rules.issuer = strdup("https://id.test");
    char **auds = malloc(sizeof(char *));
    auds[0] = strdup("aggway");
    a.rules.audiences = (const char *const *)auds;
    a.rules.num_audiences = 1;
    agw_auth_set_keys(&a, keys_all(ALL_ASYM));
    char *scopes[] = {"orders:read"};
    agw_auth_policy_t p = {.kind = AGW_AUTH_JWT, .scopes = scopes, .num_scopes = 1};
    agw_auth_cache_t cache = {0};
    agw_auth_result_t r;
    agw_auth_check(&a, &p, &cache, NULL, 0, 0, NULL, 0, NOW, &r);
    CHECK(r.status == 401 && r.error == NULL);
    agw_auth_check(&a, &p, &cache, "Basic dXNlcjpwdw==", 18, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 401 && r.error == NULL);
    agw_auth_check(&a, &p, &cache, "Bearer ", 7, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 400 && strcmp(r.error, "invalid_request") == 0);
    agw_auth_check(&a, &p, &cache, "Bearer a b", 10, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 400);
    char *t = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, "\"scope\":\"orders:read profile\""));
    char hdr[4096];
    int n = snprintf(hdr, sizeof(hdr), "bearer %s", t);
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 2, NULL, 0, NOW, &r);
    CHECK(r.status == 400);
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 0 && r.claims != NULL && r.token_len == strlen(t));
    json_decref(r.claims);
    CHECK(cache.misses == 1 && cache.hits == 0);
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 0 && cache.hits == 1);
    json_decref(r.claims);
    /* a cached token still expires */
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 1, NULL, 0, NOW + 300 + 61, &r);
    CHECK(r.status == 401 && strcmp(r.error, "invalid_token") == 0);
    /* scopes: "scp" as a list, and one missing */
    char *t2 = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(300, "\"scp\":[\"profile\"]"));
    n = snprintf(hdr, sizeof(hdr), "Bearer %s", t2);
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 403 && strcmp(r.error, "insufficient_scope") == 0 && r.claims == NULL);
    free(t);
    free(t2);
    /* no keys yet: 503 */
    agw_auth_set_keys(&a, NULL);
    char *t3 = sign(rsa_key, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims(301, NULL));
    n = snprintf(hdr, sizeof(hdr), "Bearer %s", t3);
    agw_auth_check(&a, &p, &cache, hdr, (size_t)n, 1, NULL, 0, NOW, &r);
    CHECK(r.status == 503);
    free(t3);
    /* API keys */
    agw_auth_policy_t pk = {.kind = AGW_AUTH_API_KEY};
    agw_auth_check(&a, &pk, &cache, NULL, 0, 0, "k", 1, NOW, &r);
    CHECK(r.status == 503); /* none configured */
    char h1[65], doc[256], why[128];
    hex_sha256("key-one", h1);
    snprintf(doc, sizeof(doc), "[{\"sha256\":\"%s\",\"app\":\"mobile\",\"plan\":\"gold\"}]", h1);
    CHECK(agw_apikeys_parse(doc, strlen(doc), &a.apikeys, why, sizeof(why)) == 0);
    a.apikeys_on = 1;
    a.apikey_header = strdup("x-api-key");
    agw_auth_check(&a, &pk, &cache, NULL, 0, 0, NULL, 0, NOW, &r);
    CHECK(r.status == 401);
    agw_auth_check(&a, &pk, &cache, NULL, 0, 0, "key-two", 7, NOW, &r);
    CHECK(r.status == 401);
    agw_auth_check(&a, &pk, &cache, NULL, 0, 0, "key-one", 7, NOW, &r);
    CHECK(r.status == 0 && r.key && strcmp(r.key->plan, "gold") == 0);
    agw_auth_policy_t none = {.kind = AGW_AUTH_NONE};
    agw_auth_check(&a, &none, &cache, NULL, 0, 0, NULL, 0, NOW, &r);
    CHECK(r.status == 0);
    agw_auth_cache_free(&cache);
    agw_auth_free(&a);
}

int main(void)
{
    rsa_key = new_rsa("r1", 2048);
    rsa_key2 = new_rsa("r2", 2048);
    ec_key = new_ec("e1", CJOSE_JWK_EC_P_256);
    ec384_key = new_ec("e384", CJOSE_JWK_EC_P_384);
    RUN(valid_rs256_ps256_es256_tokens_verify);
    RUN(a_token_without_kid_is_tried_against_the_keys_of_its_algorithm);
    RUN(a_forged_signature_or_altered_payload_is_refused);
    RUN(hs256_signed_with_the_rsa_public_key_is_refused);
    RUN(alg_none_and_unknown_algorithms_are_refused);
    RUN(an_algorithm_not_configured_or_not_the_keys_is_refused);
    RUN(time_claims_are_checked_with_the_leeway);
    RUN(wrong_issuer_audience_or_missing_claims_are_refused);
    RUN(oversized_malformed_and_odd_headers_are_refused);
    RUN(an_unknown_kid_is_told_apart);
    RUN(jwks_documents_keep_only_usable_keys);
    RUN(api_keys_are_found_by_their_hash);
    RUN(the_request_check_answers_as_rfc_6750_says);
    cjose_jwk_release(rsa_key);
    cjose_jwk_release(rsa_key2);
    cjose_jwk_release(ec_key);
    cjose_jwk_release(ec384_key);
    return CHECK_DONE();
}
