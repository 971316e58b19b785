/* worker.h: one worker thread: a libev loop with h2o's libuv loop embedded in it (DESIGN §3), an
 * h2o context, a LuaJIT VM running the runtime (lua/agg/runtime.lua), and one upstream pool per
 * upstream. Nothing in a worker is shared with another worker; the only cross-thread entry is
 * agw_worker_stop(). */
#ifndef AGW_WORKER_H
#define AGW_WORKER_H

#include <h2o.h>
#include <openssl/ssl.h>
#include <pthread.h>

#include "config.h"
#include "metrics.h"

/* A listening socket prepared by the server for one worker. */
typedef struct agw_listener_fd {
    int fd;            /* bound, listening, non-blocking socket (SO_REUSEPORT) */
    SSL_CTX *ssl_ctx;  /* shared TLS context, or NULL for cleartext (HTTP/1.1 and h2c) */
} agw_listener_fd_t;

typedef struct agw_worker agw_worker_t;

/* Creates worker number id for conf (which must outlive it) with the listening sockets fds
 * (num_fds of them; the worker owns them afterwards) and starts its thread. The worker loads the
 * scripts folder into its own VM before serving. Returns NULL and appends a message to errors
 * when the VM cannot load the generation. globalconf is shared read-only. The worker is the only
 * writer of metrics (which must outlive it; the admin thread reads them). access_fd: where the
 * access log goes (one JSON line per request, buffered and written from the loop), -1 for none. */
agw_worker_t *agw_worker_start(int id, const agw_config_t *conf, h2o_globalconf_t *globalconf,
                               const agw_listener_fd_t *fds, size_t num_fds, agw_metrics_t *metrics, int access_fd,
                               agw_buf_t *errors);

/* Graceful shutdown (thread-safe): the worker closes its listening sockets and tells its open
 * connections to wind down; requests in flight go on. */
void agw_worker_drain(agw_worker_t *w);

/* Requests the worker is handling (thread-safe): arrived at the runtime and not yet disposed. */
int agw_worker_inflight(const agw_worker_t *w);

/* Asks the worker to stop (thread-safe), waits for its thread and frees it. */
void agw_worker_stop(agw_worker_t *w);

/* The h2o request handler shared by every worker (registered on the "/" path). */
int agw_worker_on_req(h2o_handler_t *self, h2o_req_t *req);

#endif
