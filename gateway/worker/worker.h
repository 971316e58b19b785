/* worker.h: one worker thread: a libev loop with h2o's libuv loop embedded in it (DESIGN §3), an
 * h2o context, a LuaJIT VM per generation of the scripts folder running the runtime
 * (lua/agg/runtime.lua), and one upstream pool per upstream. Nothing in a worker is shared with
 * another worker; the cross-thread entries are agw_worker_drain, agw_worker_drained, agw_worker_busy,
 * agw_worker_install, agw_worker_inflight, agw_worker_requests_started and agw_worker_stop. */
#ifndef AGW_WORKER_H
#define AGW_WORKER_H

#include <h2o.h>
#include <openssl/ssl.h>
#include <pthread.h>

#include "script/config.h"
#include "worker/generation.h"
#include "worker/watchdog.h"
#include "ops/metrics.h"
#include "limits/limit.h"
#include "worker/client_slots.h"

/* A listening socket prepared by the server for one worker. Listener i of a worker is listener i
 * of every generation's configuration (agw_config_t.listen): TLS or cleartext (HTTP/1.1 and h2c)
 * as that says, with the SSL_CTX of the generation the worker serves. */
typedef struct agw_listener_fd {
    int fd;            /* bound, listening, non-blocking socket (SO_REUSEPORT) */
} agw_listener_fd_t;

typedef struct agw_worker agw_worker_t;

/* A generation loaded into a VM for one worker, not yet (or no longer) serving. */
typedef struct agw_worker_gen agw_worker_gen_t;

/* Creates worker number id serving generation gen (it takes a reference) with the listening
 * sockets fds (num_fds of them, in the order of gen->conf.listen; the worker owns them afterwards,
 * and takes a reference to the SSL_CTX of each TLS listener) and starts its thread. The
 * worker loads the scripts folder into its own VM before serving. Returns NULL and appends a
 * message to errors when the VM cannot load the generation. globalconf is shared read-only. The
 * worker is the only writer of metrics (which must outlive it; the admin thread reads them).
 * limits: the process's store of rate limit and quota counts, shared by every worker (outlives them).
 * slots: the gateway's count of open client connections against clients.max_connections, shared
 * by every worker (client_slots.h; outlives them; made for at least id + 1 workers).
 * access_fd: where the access log goes (one JSON line per request, buffered and written from the
 * loop), -1 for none. When listening or the thread fails after the VM loaded, the half-built
 * worker is not freed: the caller reports the error and the process exits. */
agw_worker_t *agw_worker_start(int id, agw_generation_t *gen, h2o_globalconf_t *globalconf,
                               const agw_listener_fd_t *fds, size_t num_fds, agw_metrics_t *metrics, int access_fd,
                               agw_limit_store_t *limits, agw_client_slots_t *slots, agw_buf_t *errors);

/* Whether workers batch their upstream socket I/O through io_uring (upstream/batch.h, "Batched system
 * calls"): the environment's AGGWAY_IO_URING, "on" (or unset) or "off". Returns 1 or 0, or -1
 * with a message in errors for any other value; the server asks once before starting workers,
 * so that a typo stops the start before anything is built. */
int agw_worker_ring_wanted(agw_buf_t *errors);

/* Hot reload, step 1 (calling thread; the worker goes on serving): loads gen into a new VM for
 * worker w (runtime, gateway.lua, every script) and checks that it lists gen's routes. Returns
 * the loaded generation (it holds a reference to gen), or NULL with "file:line: message" lines
 * appended to errors. Hand it to agw_worker_install or free it with agw_worker_discard. */
agw_worker_gen_t *agw_worker_prepare(agw_worker_t *w, agw_generation_t *gen, agw_buf_t *errors);

/* Frees a prepared generation that will not be installed (another worker's failed). NULL is ignored. */
void agw_worker_discard(agw_worker_gen_t *g);

/* Hot reload, step 2 (thread-safe): hands g (from agw_worker_prepare for this w) to the worker,
 * which makes it current on its own loop: new requests use it, requests in flight finish on the
 * generation they started on, which is freed after its last request, call and timer. Upstream
 * pools whose settings did not change pass to g with their keep-alive connections. Connections
 * accepted from then on on a TLS listener get g's certificate (its SSL_CTX); connections already
 * open keep the one they were accepted with. A g the worker has not taken yet is replaced (and
 * freed) by the next install. */
void agw_worker_install(agw_worker_t *w, agw_worker_gen_t *g);

/* Number of the generation w gives new requests to (thread-safe). */
uint64_t agw_worker_generation(const agw_worker_t *w);

/* Graceful shutdown (thread-safe): the worker's listening sockets stop taking connections at once
 * (shut down from the caller's thread, even while the worker is busy: those waiting in their
 * backlogs are reset), then the worker closes them and tells its open connections to wind down;
 * requests in flight go on. */
void agw_worker_drain(agw_worker_t *w);

/* Requests the worker is handling (thread-safe): arrived at the runtime and not yet disposed. */
int agw_worker_inflight(const agw_worker_t *w);

/* Whether the worker has handled agw_worker_drain (thread-safe): its listening sockets are closed,
 * so it accepts no new connection (one the kernel had queued on them is reset, or handed to
 * another listener of the port with net.ipv4.tcp_migrate_req = 1). */
int agw_worker_drained(const agw_worker_t *w);

/* While draining (thread-safe): how many of the worker's client connections must not be cut yet
 * (a request being received or answered, a response being written, a connection that has not
 * sent its first request yet: worker_internal.h agw_worker_busy_conns), counted every 10 ms by
 * the worker; 0 before agw_worker_drained. */
unsigned agw_worker_busy(const agw_worker_t *w);

/* How many requests the worker has handed to the runtime since it started (thread-safe; its
 * metric aggway_requests_started_total): the drain tells a request that started while it waited. */
uint64_t agw_worker_requests_started(const agw_worker_t *w);

/* What the script time limit's watchdog watches of w (watchdog.h): the watchdog knows workers
 * by this alone. Valid as long as w. */
agw_watchdog_target_t *agw_worker_watchdog_target(agw_worker_t *w);

/* Asks the worker to stop (thread-safe), waits up to wait_ms for its thread, drops its references
 * to the listeners' SSL_CTXs and frees the generation handed to it and not yet taken. Returns 0,
 * or -1 when the thread is still running after wait_ms (a script stuck where the script time limit
 * cannot reach, watchdog.h): then nothing is freed and the caller should end the process. The
 * worker's loops, VMs and pools are not freed: this runs only when the process exits (server.c),
 * and the exit releases them. */
int agw_worker_stop(agw_worker_t *w, uint64_t wait_ms);

/* The h2o request handler shared by every worker (registered on the "/" path). */
int agw_worker_on_req(h2o_handler_t *self, h2o_req_t *req);

#endif
