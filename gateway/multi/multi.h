/* multi.h: the batch endpoint (gateway.lua `batch = { route = "POST /batch", max_requests = 20 }`):
 * one client request carries several requests for routes of this gateway, and one JSON answer
 * carries an entry per request (README "Batching").
 *
 * The envelope is a JSON object { "requests": [ { "method", "path", "headers", "body" }, … ] }.
 * Each entry becomes a request of its own on the worker's h2o context, on a connection object
 * that stands for the batch's client (its peer and local address are the client's), and goes
 * through h2o_process_request: the same handlers, hence the same router, authentication, limits,
 * metrics and access log as a request that came alone. Entries run in parallel; the batch's
 * deadline bounds them all (an entry still running then is answered 504 deadline-exceeded and
 * cancelled). An entry never fails the batch: only a malformed envelope does (400 problem whose
 * detail names the entry, e.g. "requests[3].path: …"). A batch inside a batch is refused (that
 * entry is answered 400 nested-batch).
 *
 * The answer: 200, { "responses": [ { "status", "headers": { name: value }, "body" }, … ] } in the
 * order of the requests; headers are the entry's content-type, cache-control, retry-after,
 * location, etag, www-authenticate, x-aggregation-completed and the RateLimit fields; body is the
 * entry's JSON when its content-type is JSON (and the body is valid JSON), else a string, absent
 * when empty. Everything runs on the worker's thread and loop. */
#ifndef AGW_MULTI_H
#define AGW_MULTI_H

#include <h2o.h>
#include <ev.h>
#include <stddef.h>
#include <stdint.h>

/* A batch that runs (opaque). */
typedef struct multi agw_multi_t;

/* How the batch's own request is recorded (metrics, access log) once it is answered: status and
 * bytes of the envelope's answer. data is agw_multi_conf_t's record_data. */
typedef void (*agw_multi_record_cb)(void *data, h2o_req_t *req, int status, size_t bytes);

/* The batch's request was disposed before its answer (an HTTP/2 stream reset, a connection
 * closed): running entries had not been answered, and are cancelled right after this returns.
 * Runs in h2o's dispose callback of req. data is agw_multi_conf_t's record_data. */
typedef void (*agw_multi_abandoned_cb)(void *data, h2o_req_t *req, size_t running);

/* Whether the envelope's answer of bytes may be sent to req's client: NULL when it may, else the
 * application/problem+json body (NUL-terminated, static) the batch answers 503 with instead. data
 * is agw_multi_conf_t's record_data. */
typedef const char *(*agw_multi_admit_cb)(void *data, h2o_req_t *req, size_t bytes);

typedef struct agw_multi_conf {
    size_t max_requests;        /* entries a batch may carry (1..1000) */
    size_t max_values;          /* values and member names the envelope's JSON may hold (0: any) */
    uint64_t deadline_ms;       /* the whole batch's deadline, ms */
    struct ev_loop *loop;       /* the worker's loop (timers) */
    agw_multi_record_cb record; /* records the envelope's answer (may be NULL) */
    agw_multi_abandoned_cb abandoned; /* (may be NULL) */
    agw_multi_admit_cb admit;   /* (may be NULL: every answer is sent) */
    void *record_data;
} agw_multi_conf_t;

/* Runs the batch carried by req's body (req: the batch route's request). Answers req later, from
 * the loop, or at once for a malformed envelope. Returns the batch, or NULL when it has answered
 * already; the handle is the caller's until conf->record or conf->abandoned runs (or it calls
 * agw_multi_abandon). Memory: the batch lives until its answer is sent and every entry's request
 * is disposed; if req is disposed first (client gone) every entry still running is cancelled. */
agw_multi_t *agw_multi_start(h2o_req_t *req, const agw_multi_conf_t *conf);

/* The batch's client has gone (seen by the caller: over HTTP/1, h2o does not read the client's
 * socket while the batch runs): every entry still running is cancelled, and the batch will never
 * answer; the caller finishes req. Neither callback runs for it. m is invalid afterwards. */
void agw_multi_abandon(agw_multi_t *m);

/* True when req is an entry of a batch (nested batches are refused with this). */
int agw_multi_is_entry(const h2o_req_t *req);

#endif
