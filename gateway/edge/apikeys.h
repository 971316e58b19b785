/* apikeys.h: API keys (DESIGN §9.1 "Edge"): a client sends its key in a header (X-API-Key unless
 * configured otherwise); the gateway holds only the SHA-256 of each key, in a JSON file:
 *
 *   [ { "sha256": "9f86d0…", "app": "mobile", "plan": "gold" }, … ]
 *
 * A key is found by hashing what the client sent and comparing that hash with every entry's in
 * constant time (CRYPTO_memcmp, no early exit over the list), so neither the key nor how much of
 * a hash matched shows in the time of an answer. The raw key is never kept, logged or shown to
 * scripts (they see app and plan). Immutable once loaded; shared by every worker.
 */
#ifndef AGW_EDGE_APIKEYS_H
#define AGW_EDGE_APIKEYS_H

#include <stddef.h>

typedef struct agw_apikey {
    unsigned char sha256[32]; /* SHA-256 of the key's bytes */
    char *app;                /* the application the key was issued to */
    char *plan;               /* its plan or group (limits use it), "" when the file gives none */
} agw_apikey_t;

typedef struct agw_apikeys {
    agw_apikey_t *keys;
    size_t num;
} agw_apikeys_t;

/* Parses the key file's text (len bytes) into *out (free with agw_apikeys_free). Returns 0, or -1
 * with why: not JSON, not a list, an entry without a 64-hex-digit "sha256" or a string "app", an
 * unknown member, a hash listed twice (entries are named by their 1-based position). */
int agw_apikeys_parse(const char *json, size_t len, agw_apikeys_t *out, char *why, size_t whylen);

/* The entry of key (len bytes as the client sent it), or NULL when it is not listed. Constant
 * time over the list for a given list size. */
const agw_apikey_t *agw_apikeys_find(const agw_apikeys_t *ks, const char *key, size_t len);

/* Frees what agw_apikeys_parse allocated and zeroes *ks. */
void agw_apikeys_free(agw_apikeys_t *ks);

#endif
