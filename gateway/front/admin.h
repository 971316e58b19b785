/* admin.h: the admin listener (DESIGN §2.4 `admin`, §3 "main thread: … admin listener").
 *
 * Its own thread with its own libev loop and a minimal HTTP/1.1 server (one request per
 * connection, answered with Connection: close), so nothing the workers do (load, a script stuck in
 * a loop) can slow it down; it reads the workers' counters without locks (metrics.h).
 *
 *   GET /healthz   200 "ok" while the process runs
 *   GET /readyz    200 "ready" once every worker serves; 503 "not ready" while starting or stopping
 *   GET /metrics   Prometheus text format 0.0.4 (metrics.h lists what is in it)
 *   GET /routes    JSON list of the routes of the generation serving new requests:
 *                  [{ "route", "method", "script", "generation" }]
 *   GET /reload    JSON record of reloads: the generation serving, generations still alive,
 *                  reloads and failed reloads, and the last reload's result with its error
 *                  messages ("file:line: message")
 *   GET /upstreams JSON state of every upstream: its breaker and each group member's endpoints
 *   GET /limits?rule=NAME&key=VALUE   what a rate limit or quota rule says of a key now: a local
 *                  rule's count; for a Redis rule Redis's last answer to this process and Redis's
 *                  state (limits/limit_seen.h), never a count of the process's as the cluster's
 *   GET /waterfall, /waterfall.json   the last requests of each worker as a waterfall (waterfall.h)
 *   POST /cache/purge?prefix=agw:…   drops the cache entries whose key starts with the prefix
 *                  (percent-decoded; must start with agw:): from every worker's tier 1 within about a
 *                  second, and from Redis at once when the cache uses it; answers JSON
 *                  { "prefix", "workers", "redis_deleted" } (502 with "redis_error" when Redis
 *                  could not be purged) (cache/purge.h)
 * HEAD works as GET; /cache/purge takes POST only; other methods get 405, other paths 404. Requests are limited to 8 KiB of
 * headers and 10 s; at most 64 connections at once: a new one beyond closes the oldest still waiting
 * for its request (so held connections cannot keep the probes out), or itself when all 64 are
 * answering.
 *
 * Host: an HTTP/1.1 request without one, or any with two, is 400 (RFC 9112 §3.2); a Host that is
 * not an IP address, localhost or one of admin.allowed_hosts (any port) is 421 Misdirected
 * Request. A web page whose name an attacker makes resolve to 127.0.0.1 (DNS rebinding) could
 * otherwise read /waterfall.json or /metrics from an operator's browser. A POST carrying Origin
 * is 403 (a page's cross-site POST needs no preflight).
 *
 * Memory after a burst: when the last connection closes, the thread's cache of freed blocks goes
 * back to the heap, and when one of the connections since the loop was made had a descriptor of
 * 1,024 or more (a scrape during a burst of thousands of connections), the loop is made anew, so
 * that libev's per-descriptor arrays (16 bytes a descriptor, grown by doubling and kept at the
 * highest one until the loop ends: 634,848 bytes after a scrape on a descriptor near 20,000) do
 * not stay at the burst's size (docs/performance.md, "A twenty-fifth pass").
 */
#ifndef AGW_ADMIN_H
#define AGW_ADMIN_H

#include "script/config.h"
#include "worker/generation.h"
#include "ops/metrics.h"

typedef struct agw_admin agw_admin_t;

/* One endpoint of the admin listener. The router serves exactly the paths of agw_admin_endpoints
 * (any other is a 404 whose body lists them), and `aggway help` prints the same table, so the two
 * cannot disagree. */
typedef struct agw_admin_endpoint {
    const char *method; /* "GET" (HEAD answers too) or "POST" (the only method taken) */
    const char *path;   /* "/metrics": the path without its query */
    const char *what;   /* one line saying what it answers, for `aggway help` */
} agw_admin_endpoint_t;

/* Every admin endpoint, in the order help lists them; the last entry is { NULL, NULL, NULL }. */
extern const agw_admin_endpoint_t agw_admin_endpoints[];

/* Binds conf->admin_host:admin_port and starts the admin thread, reporting not ready. gens (the
 * generation serving and the reload record), labels (metric label slots) and metrics (num_workers
 * pointers) must stay valid until agw_admin_stop; conf is read only here. Returns NULL (logged)
 * when the port cannot be bound. */
agw_admin_t *agw_admin_start(const agw_config_t *conf, agw_reload_state_t *gens, const agw_metric_labels_t *labels,
                             agw_metrics_t *const *metrics, size_t num_workers);

/* What /readyz and aggway_ready say from now on (thread-safe). */
void agw_admin_set_ready(agw_admin_t *a, int ready);

/* How many times the admin thread has made its loop anew since agw_admin_start (thread-safe; for
 * tests). */
unsigned agw_admin_loops_made(const agw_admin_t *a);

/* How many times a remake found no new loop could be made (no descriptor free for it: the old loop
 * stayed) (thread-safe; for tests). */
unsigned agw_admin_loops_failed(const agw_admin_t *a);

/* How many times its last open connection has closed (thread-safe; for tests): counted after the
 * thread's cache went back to the heap, and before a remake the spell may start. */
unsigned agw_admin_idle_spells(const agw_admin_t *a);

/* How many connections were closed unanswered to make room for a new one (ADMIN_MAX_CONNS open;
 * the oldest still waiting for its request goes). Any thread. */
unsigned agw_admin_evicted(const agw_admin_t *a);

/* Stops the thread, closes every connection and the listener, frees a. Safe while the thread is
 * making its loop anew: the stop is an eventfd of the admin's whole life, not its loop's. */
void agw_admin_stop(agw_admin_t *a);

/* Renders the response to one request (method, target) into out: status line, headers and body;
 * what the admin thread sends. Exposed for tests. */
void agw_admin_respond(agw_admin_t *a, const char *method, size_t mlen, const char *target, size_t tlen,
                       agw_buf_t *out);

#endif
