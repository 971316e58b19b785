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

/* Lookups the fetches gave up on that may still run at once (each on a thread, until the
 * resolver's own timeouts end it); with that many running, a fetch fails at once. */
#define AGW_FETCH_MAX_LOOKUPS 4

struct addrinfo;
/* The lookup agw_fetch_get makes (getaddrinfo(3)'s signature; getaddrinfo itself): a unit test puts
 * a slow one in its place. Set it before any fetch runs. */
extern int (*agw_fetch_resolver)(const char *host, const char *port, const struct addrinfo *hints,
                                 struct addrinfo **res);

/* How many lookups that their fetch gave up on still run (any thread). */
int agw_fetch_abandoned_lookups(void);

/* GETs u within timeout_ms in all: the host name's lookup, the connection, the TLS handshake, the
 * request and the whole answer, against one deadline (a server that sends a byte now and then
 * cannot make it last longer, nor a resolver that does not answer: the lookup, getaddrinfo, runs
 * on a thread of its own, which finishes it after the fetch gave up on it; while
 * AGW_FETCH_MAX_LOOKUPS such lookups still run, a fetch fails at once);
 * a body over max_bytes is an error. On a 200 answer returns 0 with the body appended to body and
 * *max_age_s set from Cache-Control max-age (0 when absent); otherwise -1 with why (the status,
 * a refused connection, a timeout, a certificate that does not verify). */
int agw_fetch_get(const agw_fetch_url_t *u, uint64_t timeout_ms, size_t max_bytes, agw_buf_t *body,
                  uint64_t *max_age_s, char *why, size_t whylen);

#endif
