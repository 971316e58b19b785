/* apikeys.c: API keys by their SHA-256 (see apikeys.h). */
#include "apikeys.h"
#include "base/hex.h"
#include "base/mem.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_hex32(const char *s, unsigned char out[32])
{
    if (strlen(s) != 64)
        return -1;
    for (int i = 0; i < 32; i++) {
        int hi = agw_hex_digit((unsigned char)s[2 * i]), lo = agw_hex_digit((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

int agw_apikeys_parse(const char *json, size_t len, agw_apikeys_t *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (doc == NULL) {
        snprintf(why, whylen, "not JSON: %s (line %d)", jerr.text, jerr.line);
        return -1;
    }
    if (!json_is_array(doc)) {
        snprintf(why, whylen, "must be a JSON list like [ { \"sha256\": \"<64 hex digits>\", \"app\": \"mobile\", "
                 "\"plan\": \"gold\" } ]");
        json_decref(doc);
        return -1;
    }
    out->keys = agw_calloc(json_array_size(doc) ? json_array_size(doc) : 1, sizeof(*out->keys));
    size_t i;
    json_t *e;
    json_array_foreach(doc, i, e) {
        const char *k;
        json_t *v;
        if (!json_is_object(e)) {
            snprintf(why, whylen, "entry %zu is not an object", i + 1);
            goto bad;
        }
        json_object_foreach(e, k, v) if (strcmp(k, "sha256") && strcmp(k, "app") && strcmp(k, "plan")) {
            snprintf(why, whylen, "entry %zu: unknown member \"%.40s\" (sha256, app, plan)", i + 1, k);
            goto bad;
        }
        json_t *h = json_object_get(e, "sha256"), *app = json_object_get(e, "app"), *plan = json_object_get(e, "plan");
        agw_apikey_t *key = &out->keys[out->num];
        if (!json_is_string(h) || parse_hex32(json_string_value(h), key->sha256) != 0) {
            snprintf(why, whylen, "entry %zu: \"sha256\" must be the key's SHA-256 as 64 hex digits "
                     "(printf %%s KEY | sha256sum)", i + 1);
            goto bad;
        }
        if (!json_is_string(app) || json_string_length(app) == 0 || (plan && !json_is_string(plan))) {
            snprintf(why, whylen, "entry %zu: \"app\" must be a non-empty string and \"plan\" a string", i + 1);
            goto bad;
        }
        for (size_t j = 0; j < out->num; j++)
            if (memcmp(out->keys[j].sha256, key->sha256, 32) == 0) {
                snprintf(why, whylen, "entry %zu: the same key as entry %zu", i + 1, j + 1);
                goto bad;
            }
        key->app = agw_strdup(json_string_value(app));
        key->plan = agw_strdup(plan ? json_string_value(plan) : "");
        out->num++;
    }
    json_decref(doc);
    return 0;
bad:
    json_decref(doc);
    agw_apikeys_free(out);
    return -1;
}

const agw_apikey_t *agw_apikeys_find(const agw_apikeys_t *ks, const char *key, size_t len)
{
    unsigned char h[32];
    SHA256((const unsigned char *)key, len, h);
    const agw_apikey_t *found = NULL;
    for (size_t i = 0; i < ks->num; i++) { /* every entry, whatever matched */
        int same = CRYPTO_memcmp(ks->keys[i].sha256, h, 32) == 0;
        found = same ? &ks->keys[i] : found;
    }
    return found;
}

void agw_apikeys_free(agw_apikeys_t *ks)
{
    for (size_t i = 0; i < ks->num; i++) {
        free(ks->keys[i].app);
        free(ks->keys[i].plan);
    }
    free(ks->keys);
    memset(ks, 0, sizeof(*ks));
}
