/* pool.h: the HTTP/1.1 client aggway uses to call upstream services: pools and calls.
 *
 * One agw_pool_t per upstream per worker thread: a bounded set of keep-alive connections
 * (max_connections) and a bounded FIFO of calls waiting for one (max_pending). Everything runs
 * on the worker's libev loop; nothing here is thread-safe and nothing blocks.
 *
 * Response framing (status line, headers, Content-Length, chunked with trailers, close-delimited
 * bodies, 1xx interim responses) is read by upstream/http1.h, with libh2o's picohttpparser. A 101
 * (a protocol switch no request of ours asks for) is a bad response.
 *
 * Rules (DESIGN §3, issue "core gateway"):
 *  - a call has one timeout (ms) covering the wait for a connection, connect, send and the whole
 *    response; the caller passes min(call timeout, time left in the request deadline);
 *  - connecting has its own connect_timeout_ms (bounded by the call timeout), counted from the
 *    connect() itself, not from the start of the loop iteration that made the call;
 *  - a call the caller cancels once any of its request went out, or that fails in any way,
 *    closes its connection: it never goes back to the pool; a call cancelled before any byte of
 *    its request went out gives its connection back (a kept-alive one to the idle list; a new
 *    plain one to the next call, which sends once it is connected, or to the idle list once it
 *    has connected), so cancelling cannot make the pool open connection after connection;
 *  - a connection goes back to the pool only when nothing follows its response: bytes after it
 *    (in the same read, left in the socket by a read that filled the buffer, in a further TLS
 *    record, seen by the loop while it was idle, or found by a peek when it is taken from the
 *    idle list) answer no request of ours, so it is closed instead of handing them to the next
 *    call as its answer;
 *  - a reused keep-alive connection that fails before the first response byte (reset, EOF) is
 *    retried once on a new connection, for idempotent methods only (RFC 9110 §9.2.2);
 *  - a body shorter than its Content-Length, a reset, unparsable bytes, or a body over
 *    max_body_bytes (announced by Content-Length or a chunk size, or received) fail the call at
 *    once;
 *  - an answer that comes before the whole request was sent (an upstream refusing a large body
 *    with 413 and no longer reading, or closing) is the call's result, and the connection is
 *    closed; over TLS (https://) the call still waits for the send to finish or fail;
 *  - header names/values and paths containing CR, LF or NUL are rejected before anything is sent.
 *
 * HTTPS upstreams (conf->tls set) speak the same HTTP/1.1 over TLS (OpenSSL, same loop, no
 * blocking call): the handshake follows the TCP connect and is covered by connect_timeout_ms; the
 * certificate chain is verified against the configured CAs and the server name (RFC 6125, through
 * OpenSSL's X509_VERIFY_PARAM host/IP check); a failed handshake or verification is
 * AGW_CALL_TLS; every other rule above holds unchanged. A close-delimited body must end with the
 * TLS close_notify alert, else it is TRUNCATED (RFC 9112 §9.8). Connections are closed without
 * a TLS shutdown exchange (the socket is just closed). The process must ignore SIGPIPE (the
 * server does), since OpenSSL writes with write(2).
 */
#ifndef AGW_UPSTREAM_POOL_H
#define AGW_UPSTREAM_POOL_H

#include "upstream/conf.h"

#include <stddef.h>
#include <stdint.h>

#include "base/header.h" /* agw_header_t */

struct ev_loop;


/* How a call ended. Everything but AGW_CALL_OK is a failed call. */
typedef enum agw_call_outcome {
    AGW_CALL_OK = 0,          /* a complete response arrived (any HTTP status) */
    AGW_CALL_REFUSED,         /* connect() refused or unreachable */
    AGW_CALL_CONNECT_TIMEOUT, /* no connection within connect_timeout_ms */
    AGW_CALL_TIMEOUT,         /* the call's timeout passed (waiting, connecting, sending or
                                 reading); when it is shorter than connect_timeout_ms and passes
                                 while connecting, the outcome is TIMEOUT */
    AGW_CALL_RESET,           /* connection reset or closed before the response was complete */
    AGW_CALL_TRUNCATED,       /* EOF before Content-Length bytes or the last chunk */
    AGW_CALL_BAD_RESPONSE,    /* bytes that are not HTTP/1.x */
    AGW_CALL_TOO_LARGE,       /* body over max_body_bytes */
    AGW_CALL_OVERLOAD,        /* no connection free: the wait queue was full (max_pending), or no
                                 connection came free before the call's timeout (the bulkhead) */
    AGW_CALL_BAD_REQUEST,     /* CR/LF/NUL in path or header; nothing was sent */
    AGW_CALL_TLS,             /* https:// upstream: the TLS handshake failed (certificate not
                                 trusted, wrong name, expired, no common protocol, not TLS at
                                 all); nothing was sent */
    AGW_CALL_LOCAL,           /* the gateway's own side could not open or connect a socket (out of
                                 descriptors: EMFILE, ENFILE; no local port: EADDRNOTAVAIL; no
                                 kernel memory: ENOBUFS, ENOMEM); nothing was sent, and the
                                 upstream is not to blame (its breaker does not count it) */
} agw_call_outcome_t;

/* Short stable name of an outcome ("ok", "refused", "timeout", …), for logs and metrics. */
const char *agw_call_outcome_name(agw_call_outcome_t o);

/* What the callback receives. All pointers are owned by the pool and valid only during the
 * callback (also when the callback starts, cancels or destroys things); copy what you keep.
 * On failures headers and trailers are empty, body is "" and http_status is the status of a
 * response whose headers had arrived (e.g. TOO_LARGE, TRUNCATED), else 0. */
typedef struct agw_call_result {
    agw_call_outcome_t outcome;
    int http_status;                /* 0 when no status line arrived */
    const agw_header_t *headers;    /* response headers in arrival order */
    size_t num_headers;
    const agw_header_t *trailers;   /* chunked trailers, if any */
    size_t num_trailers;
    const char *body;               /* decoded body (chunking removed), NUL-terminated */
    size_t body_len;
    double elapsed_ms;              /* from agw_call_start to completion, ms */
    int reused;                     /* 1 when a keep-alive connection was reused */
    const char *detail;             /* human-readable cause for failures, NULL when ok */
} agw_call_result_t;

typedef struct agw_pool agw_pool_t;
typedef struct agw_call agw_call_t;

/* Called exactly once per call unless the call was cancelled first; never from inside
 * agw_call_start (immediate failures such as AGW_CALL_OVERLOAD are delivered from the loop). The
 * call handle is invalid after the callback returns. The callback may start and cancel other
 * calls and destroy the pool; a connection whose response completed is back in the pool before
 * the callback runs, so a call the callback starts (a dependent chain) reuses it. */
typedef void (*agw_call_cb)(agw_call_t *call, const agw_call_result_t *result, void *data);

/* A request to send. Strings need not be NUL-terminated; they are copied by agw_call_start. */
typedef struct agw_call_req {
    const char *method;             /* "GET", "POST", … (NUL-terminated) */
    const char *path;               /* path + query, starting with '/'; base_path is prepended;
                                       spaces and control characters are BAD_REQUEST */
    size_t path_len;
    const agw_header_t *headers;    /* extra request headers; Host, Content-Length and
                                       Connection are set by the client (the caller's, and
                                       Transfer-Encoding, are dropped); Content-Length is sent
                                       with a body or for POST, PUT and PATCH */
    size_t num_headers;
    size_t num_own;                 /* the last num_own of headers are the gateway's own, well
                                       formed when made (traceparent by trace.h, tracestate
                                       checked when the page request brought it): not checked
                                       again (about 200 instructions a call) */
    const char *body;               /* request body or NULL */
    size_t body_len;
    uint64_t timeout_ms;            /* whole-call timeout, ms (0 fails at once with TIMEOUT) */
} agw_call_req_t;

/* Creates a pool for conf on loop. conf must outlive the pool. Never NULL (base/mem.h). */
agw_pool_t *agw_pool_create(struct ev_loop *loop, const agw_upstream_conf_t *conf);

struct agw_limit_store;

/* Gives the pool the process's store of limits (limits/limit.h; it must outlive the pool): with
 * conf->max_rps set, every call started takes one from a rate of max_rps a second (burst: one
 * second's worth) counted for the upstream's name across every worker's pool of it; a call beyond
 * fails at once with AGW_CALL_OVERLOAD (problem upstream-overloaded) and nothing is sent. Without
 * a store (or max_rps 0) calls are not counted. */
void agw_pool_set_limits(agw_pool_t *pool, struct agw_limit_store *store);

/* Closes every connection and frees the pool. Calls still in flight or queued are cancelled
 * without callbacks; the owner must not use their handles afterwards. Called before the pool's
 * loop is destroyed (it stops the pool's watchers on it). */
void agw_pool_destroy(agw_pool_t *pool);

/* Counters of a pool, for metrics and tests (no-leak checks). */
typedef struct agw_pool_stats {
    unsigned open;        /* connections open (idle + busy + connecting) */
    unsigned idle;        /* idle keep-alive connections */
    unsigned pending;     /* calls waiting for a connection */
    uint64_t calls;       /* calls started */
    uint64_t reused;      /* calls that used a kept-alive connection */
    uint64_t retried;     /* calls retried once on a fresh connection */
    uint64_t cancelled;   /* calls cancelled by the caller */
    uint64_t tls_handshakes; /* TLS handshakes completed (https:// upstreams) */
    uint64_t tls_resumed;    /* of those, the ones that resumed the pool's cached session */
} agw_pool_stats_t;

void agw_pool_stats(const agw_pool_t *pool, agw_pool_stats_t *out);

/* Starts a call. Returns the call handle, or NULL only when the pool is being destroyed (a call
 * started from a callback after agw_pool_destroy: a caller's bug). cb is called exactly once
 * later unless agw_call_cancel() is called first. */
agw_call_t *agw_call_start(agw_pool_t *pool, const agw_call_req_t *req, agw_call_cb cb, void *data);

/* Cancels a call that has not completed: closes its connection (the upstream stops working on an
 * answer no one will read), gives the connection back when none of the request went out (see the
 * rules above), or removes the call from the wait queue. The callback is not called. */
void agw_call_cancel(agw_call_t *call);

#endif
