/* conf.h: the static description of one upstream (gateway.lua `upstreams = { name = { url, … } }`),
 * built by script/config.c at load time and shared read-only by every worker's pool (pool.h). */
#ifndef AGW_UPSTREAM_CONF_H
#define AGW_UPSTREAM_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct agw_upstream_tls; /* upstream/tls.h */

/* Static description of one upstream, built from gateway.lua by config.c; shared read-only
 * by every worker. */
typedef struct agw_upstream_conf {
    char *name;                     /* the name scripts use ("product") */
    char *url;                      /* as configured, for messages */
    char *host_header;              /* value of the Host header ("127.0.0.1:9001") */
    char *base_path;                /* path prefix from the URL without trailing '/', "" if none */
    struct sockaddr_storage addr;   /* resolved once at load time */
    socklen_t addrlen;
    uint64_t timeout_ms;            /* default call timeout, ms */
    uint64_t connect_timeout_ms;    /* connect timeout, ms (0: only the call timeout applies) */
    uint64_t idle_timeout_ms;       /* keep-alive connection idle time before it is closed, ms
                                       (0: kept until the upstream closes it) */
    unsigned max_connections;       /* open connections at most, per worker (0: no limit) */
    unsigned max_pending;           /* calls waiting for a connection at most, per worker
                                       (0: no waiting, OVERLOAD when every connection is busy) */
    size_t max_body_bytes;          /* response body limit, bytes (0: no limit) */
    uint64_t max_rps;               /* calls started per second at most, across the process's
                                       workers (0: no limit); beyond, a call fails at once with
                                       OVERLOAD and nothing is sent (agw_pool_set_limits) */
    struct agw_upstream_tls *tls;   /* https:// upstreams: TLS settings with a built ctx; NULL for
                                       http:// */
    int health_checked;             /* 1: gateway.lua has health = { … } for it (its endpoints are
                                       probed by lua/agg/health.lua); for /upstreams and the metrics */
} agw_upstream_conf_t;

#define AGW_ADDRS_PER_NAME 8 /* endpoint slots of a URL whose host is a name: its addresses used at most */

/* One endpoint URL whose host is a name, not an address (script/config.h agw_config_t.names): its
 * addresses are endpoints of their own, in AGW_ADDRS_PER_NAME slots (group/directory.h). */
typedef struct agw_ep_name {
    char *host;             /* the name as configured ("product.internal") */
    int port;               /* the URL's port */
    char *where;            /* "upstreams.product.endpoints[2]" (messages) */
    size_t first;           /* its slots are conf->eps[first .. first + AGW_ADDRS_PER_NAME) */
    uint64_t every_ms;      /* resolve_every_s in ms; 0: resolved when the folder loads only */
} agw_ep_name_t;

#endif
