/* fetch.h: one blocking HTTP/1.1 GET over http:// or https://, for a thread of its own (the JWKS
 * fetcher, edge/auth.h): never on a worker's loop. Bounded in time (connect, each read and write)
 * and in size; the response is read by the upstream client's HTTP/1.1 reader (upstream/http1.h:
 * Content-Length, chunked, close; the same framing rules and refusals). https
 * verifies the server's certificate against the system's CA store and its name (OpenSSL). */
#ifndef AGW_EDGE_FETCH_H
#define AGW_EDGE_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

typedef struct agw_fetch_url {
    char *host;       /* "id.example" */
    int port;         /* 443 */
    char *path;       /* "/jwks" (with query, if any) */
    int tls;          /* https */
} agw_fetch_url_t;

/* Splits url ("http[s]://host[:port]/path") into *out (free with agw_fetch_url_free). Returns 0,
 * or -1 with why. */
int agw_fetch_url_parse(const char *url, agw_fetch_url_t *out, char *why, size_t whylen);

void agw_fetch_url_free(agw_fetch_url_t *u);

/* GETs u within timeout_ms in all: the connection, the TLS handshake, the request and the whole
 * answer, against one deadline (a server that sends a byte now and then cannot make it last
 * longer; the host name's lookup, getaddrinfo, is the system resolver's and has its own timeouts);
 * a body over max_bytes is an error. On a 200 answer returns 0 with the body appended to body and
 * *max_age_s set from Cache-Control max-age (0 when absent); otherwise -1 with why (the status,
 * a refused connection, a timeout, a certificate that does not verify). */
int agw_fetch_get(const agw_fetch_url_t *u, uint64_t timeout_ms, size_t max_bytes, agw_buf_t *body,
                  uint64_t *max_age_s, char *why, size_t whylen);

#endif
