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

/* How the batch's own request is recorded (metrics, access log) once it is answered: status and
 * bytes of the envelope's answer. data is agw_multi_conf_t's record_data. */
typedef void (*agw_multi_record_cb)(void *data, h2o_req_t *req, int status, size_t bytes);

typedef struct agw_multi_conf {
    size_t max_requests;        /* entries a batch may carry (1..1000) */
    uint64_t deadline_ms;       /* the whole batch's deadline, ms */
    struct ev_loop *loop;       /* the worker's loop (timers) */
    agw_multi_record_cb record; /* records the envelope's answer (may be NULL) */
    void *record_data;
} agw_multi_conf_t;

/* Runs the batch carried by req's body (req: the batch route's request). Answers req later, from
 * the loop, or at once for a malformed envelope. Memory: the batch lives until its answer is sent
 * and every entry's request is disposed; if req is disposed first (client gone) every entry
 * still running is cancelled. */
void agw_multi_start(h2o_req_t *req, const agw_multi_conf_t *conf);

/* True when req is an entry of a batch (nested batches are refused with this). */
int agw_multi_is_entry(const h2o_req_t *req);

#endif
