/* config.h: one loaded generation of a scripts folder, as the C side needs it: listeners,
 * workers, upstreams (resolved) and the route table (generation.h wraps it for hot reload). Built
 * by agw_config_load from the same Lua loader (lua/agg/loader.lua) that every worker runs, so
 * `aggway check` and `serve` agree. */
#ifndef AGW_CONFIG_H
#define AGW_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "upstream/breaker.h"
#include "base/buf.h"
#include "redis/redis.h"
#include "edge/auth.h"
#include "script/router.h"
#include "upstream/conf.h"
#include "limits/limit.h"

typedef struct agw_listen_conf {
    char *host;        /* address to bind ("0.0.0.0") */
    int port;          /* TCP port */
    int reuse_port;    /* reuse_port = true: the port may be shared with other processes (of the same
                          user: SO_REUSEPORT), so a port in use is not an error at start-up */
    char *cert_file;   /* PEM certificate chain when TLS is on, else NULL (resolved against the folder) */
    char *key_file;    /* PEM private key when TLS is on, else NULL (resolved against the folder) */
    int cert_line;     /* line of gateway.lua that names cert_file (messages), 0 without TLS */
    int key_line;      /* line of gateway.lua that names key_file */
    struct ssl_ctx_st *ssl_ctx; /* TLS on: the server context built from the two files when this
                                   generation was loaded (listen_tls.h), one reference, freed by
                                   agw_config_free; workers and connections take their own. NULL
                                   for cleartext */
} agw_listen_conf_t;

/* gateway.lua `clients = { … }`: the limits a client meets at the front (guard/guard.h). Read
 * by the workers from the current generation, so a reload changes them. */
typedef struct agw_clients_conf {
    unsigned max_connections;           /* open client connections per gateway, one count for every
                                           worker (worker/client_slots.h; "auto": from RLIMIT_NOFILE, see
                                           agw_config_auto_max_connections) */
    unsigned max_headers;               /* request header fields; more: 431 */
    size_t max_header_bytes;            /* request header names + values, decoded, bytes; more: 431 */
    size_t max_uri_bytes;               /* the request target (path and query, as sent), bytes; more: 414 */
    unsigned max_cancelled_streams;     /* HTTP/2 streams a connection may cancel before their answer
                                           within cancel_window_ms; more: GOAWAY and close */
    uint64_t cancel_window_ms;          /* that window, ms */
    unsigned send_timeout_s;            /* a connection with an answer to send whose client has taken
                                           none of it for this long is closed (accept.c), s */
    size_t max_unsent_bytes;            /* HTTP/2: bytes of answers a connection may hold that its client
                                           has not taken (streams not ended), beyond one answer; an
                                           answer past it gets 503 (respond.c, request.c), bytes */
} agw_clients_conf_t;

/* An endpoint as /routes and the metrics name it. */
typedef struct agw_endpoint_info {
    char *route;       /* "GET /product-page/{id}" */
    char *method;      /* "GET" */
    char *file;        /* the script that defines it */
    uint32_t *limits;  /* indexes in agw_config_t.limits.rules of the rules it is checked against */
    size_t num_limits;
    int priority;      /* 1 (shed last) to 3 (shed first) */
    double deadline_ms; /* its deadline (the script's deadline_ms, else gateway.lua's), ms: a wait
                           before its script starts (a Redis rate limit's) ends by it */
} agw_endpoint_info_t;

typedef struct agw_config {
    char *dir;                          /* scripts folder as given */
    agw_listen_conf_t *listen;
    size_t num_listen;
    unsigned workers;                   /* worker threads (resolved: "auto" = cores) */
    uint64_t deadline_ms;               /* default request deadline, ms */
    char *batch_path;                   /* batch = { route = "POST /path" }: the batch endpoint's path
                                           (multi/multi.h), NULL when there is none */
    char *batch_route;                  /* "POST <batch_path>": the envelope's route in the metrics
                                           and the access log; NULL when there is none */
    size_t batch_max_requests;          /* batch.max_requests: entries one batch may carry */
    uint64_t batch_deadline_ms;         /* batch.deadline_ms (default: deadline_ms), ms */
    size_t max_request_body_bytes;      /* request body limit, bytes */
    size_t max_request_json_values;     /* values and member names a request body's JSON may make
                                           (req.json, the batch envelope) */
    uint64_t shutdown_grace_ms;         /* SIGTERM/SIGINT: how long in-flight requests may finish, ms */
    uint64_t script_time_limit_ms;      /* how long a script may run without waiting before it is
                                           stopped, ms (watchdog.h) */
    uint64_t script_memory_limit_mb;    /* how large each worker's Lua heap of this generation may
                                           grow through large blocks, MB (base/heap.h) */
    agw_clients_conf_t clients;         /* limits per client (gateway.lua `clients`) */
    agw_upstream_conf_t *upstreams;     /* index i is upstream index i+1 in Lua */
    agw_breaker_t **breakers;           /* one per upstream, shared by every worker (and by the next
                                           generation when the upstream does not change); one
                                           reference each */
    size_t num_upstreams;
    agw_upstream_conf_t *eps;           /* every upstream's endpoint slots, one pool each (gateway.lua `url` or
                                           `endpoints`; a URL with a host name takes AGW_ADDRS_PER_NAME
                                           slots, see names): upstream i's are eps[ep_first[i]] up to
                                           eps[ep_first[i + 1]], in the order configured (Lua's
                                           endpoint numbers, 1-based, count from ep_first[i]) */
    size_t *ep_first;                   /* num_upstreams + 1 entries */
    agw_ep_name_t *names;               /* the endpoint URLs whose host is a name: their slots in eps
                                           are re-resolved (group/directory.h); AGW_ADDRS_PER_NAME
                                           slots each, those it does not fill have addrlen 0 */
    size_t num_names;
    agw_router_t router;                /* route table, endpoint indexes are 1-based as in Lua */
    agw_endpoint_info_t *endpoints;     /* index e-1 describes endpoint e */
    size_t num_endpoints;
    agw_auth_t auth;                    /* the edge's authenticators (gateway.lua's auth; edge/auth.h) */
    agw_auth_policy_t *auth_policies;   /* index e-1: what endpoint e asks of its callers */
    char *admin_host;                   /* admin listener address ("127.0.0.1") */
    int admin_port;                     /* admin listener port, 0 when there is none */
    char *admin_allowed_hosts;          /* names a request's Host may give besides IP addresses and
                                           localhost: lowercase, separated by one space; NULL: none */
    char *access_log;                   /* NULL: off; "stderr"; or a file path (relative ones resolved
                                           against the scripts folder) */
    int access_log_line;                /* gateway.lua's line that sets it (messages), 0 when off */
    /* tracing = { otlp_http = "http://host:port/path", service_name, timeout_ms } (trace.h, otlp.h) */
    char *otlp_url;                     /* the collector's URL as configured; NULL: spans are not exported
                                           (traceparent is propagated all the same) */
    char *otlp_host_header;             /* "host:port" for the Host header */
    char *otlp_path;                    /* "/v1/traces" */
    struct sockaddr_storage otlp_addr;  /* resolved once at load time */
    socklen_t otlp_addrlen;
    char *otlp_service_name;            /* resource attribute service.name ("aggway") */
    uint64_t otlp_timeout_ms;           /* one export (connect, send, status line) at most, ms */
    agw_limits_conf_t limits;           /* limits = { … } and max_in_flight (limits/limit.h) */
    /* redis = { url, timeout_ms } (redis/redis.h): host NULL when gateway.lua has no redis block */
    agw_redis_conf_t redis;
    /* cache = { memory_bytes, redis } (cache/lru.h, lua/agg/cache.lua) */
    size_t cache_memory_bytes;          /* tier 1 of the whole process, bytes (split evenly over the workers) */
    int cache_redis;                    /* 1: tier 2 in Redis (needs redis.host) */
} agw_config_t;

/* Loads and checks dir (gateway.lua, every endpoint script) in a fresh Lua VM, resolves upstream
 * hosts and reads the TLS files: the CA files of https:// upstreams and the certificate chain and
 * private key of every TLS listener (a new SSL_CTX each, listen_tls.h). Returns 0 and fills *conf
 * (free with agw_config_free), or -1 with one "file:line: message" per line appended to errors,
 * e.g. "scripts/gateway.lua:4: listen[2].tls.key: the private key … does not match the
 * certificate …". Nothing is left allocated on failure. Any thread; used by `aggway check`,
 * start-up and every reload alike, so the three agree. */
int agw_config_load(const char *dir, agw_config_t *conf, agw_buf_t *errors);

/* The client connection cap `clients.max_connections = "auto"` stands for: half of the descriptors
 * RLIMIT_NOFILE (soft) allows beyond 64 kept for listeners, files and the like, at least 16; the
 * other half is left for upstream sockets, so a flood of clients cannot take the descriptors the
 * gateway needs to answer them. */
unsigned agw_config_auto_max_connections(void);

/* Frees everything agw_config_load allocated (the breakers and the listeners' SSL_CTXs: one
 * reference each; connections and workers that took their own keep theirs). */
void agw_config_free(agw_config_t *conf);

/* 1 when a and b describe the same upstream as far as a connection pool is concerned (name,
 * URL, resolved address, Host header, base path, connect and idle timeouts, max_connections,
 * max_pending, max_body_bytes, TLS settings), so a pool made for one can serve the other. */
int agw_upstream_conf_same(const agw_upstream_conf_t *a, const agw_upstream_conf_t *b);

/* Deep copy of u into *out (strings and TLS settings duplicated, one more reference to the TLS
 * SSL_CTX); free with agw_upstream_conf_clear. */
void agw_upstream_conf_copy(agw_upstream_conf_t *out, const agw_upstream_conf_t *u);

/* Frees u's strings and TLS settings (one SSL_CTX reference) and zeroes it (the struct itself
 * belongs to the caller). */
void agw_upstream_conf_clear(agw_upstream_conf_t *u);

#endif
