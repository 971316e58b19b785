/* guard.h: the limits a hostile client meets at the front, before any script runs.
 *
 * The front is h2o 2.2.5 (Debian's libh2o), which leaves some of what an edge server must refuse
 * to its user. These functions are what the worker checks on each request and connection:
 *
 *  - request headers: a cap on their number and on their decoded size (HPACK lets a 16 KB
 *    HEADERS frame decode to megabytes of repeated references), checked on h2o's decoded list
 *    before anything is copied for the script (agw_guard_headers_fit);
 *  - HTTP/1.1 request framing: two Content-Length fields that disagree, or Content-Length with
 *    Transfer-Encoding; and Host missing, given twice or invalid. h2o takes the first
 *    Content-Length, frames by Transfer-Encoding without closing and takes the last Host, and
 *    keeps none of these fields in req->headers, so the raw request head is read again here
 *    (agw_guard_http1_framing) and the worker answers 400 and closes the connection (RFC 9112
 *    §3.2, §6.1, §6.3), whatever the route: no request pipelined behind it is ever read;
 *  - HTTP/2 rapid reset (CVE-2023-44487): a connection that cancels more than a bounded number of
 *    streams before they are answered, within a window, gets GOAWAY (ENHANCE_YOUR_CALM) and is
 *    closed (agw_guard_h2_cancelled, agw_guard_h2_flush);
 *  - HTTP/2 header bombs: each request header block, a HEADERS frame and its CONTINUATIONs, is
 *    counted (fields and encoded bytes) before h2o decodes it, from the connection's first frame
 *    on (agw_guard_conn_open, agw_guard_h2_watch).
 *
 * h2o 2.2.5 has no public call for either: guard.c uses fields of h2o's HTTP/2 connection as the
 * installed <h2o/http2_internal.h> declares them (a changed header fails the build; a library that
 * does not match its header turns the guard off with an error in the log), and defines
 * h2o_http2_accept, which libh2o calls through its PLT for every new HTTP/2 connection.
 *
 * gateway.lua's `clients` block sets the limits (config.h, agw_clients_conf_t).
 */
#ifndef AGW_GUARD_H
#define AGW_GUARD_H

#include <h2o.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/buf.h"

struct st_h2o_http2_conn_t; /* h2o's HTTP/2 connection (<h2o/http2_internal.h>) */

/* ---- request headers ------------------------------------------------------------------------ */

/* Whether the decoded request headers fit: at most max_headers fields and max_header_bytes of
 * names and values together (h2o's list: for HTTP/2 the fields after HPACK decoding, pseudo-headers
 * not included; for HTTP/1 the fields h2o keeps). O(fields), stops at the first limit passed.
 * Returns NULL when they fit, else why, a static string ("too many header fields", "header fields
 * too large"); the counts go to *count and *bytes (up to where the check stopped). */
const char *agw_guard_headers_fit(const h2o_headers_t *headers, size_t max_headers, size_t max_header_bytes,
                                  size_t *count, size_t *bytes);

/* ---- HTTP/1.1 framing ----------------------------------------------------------------------- */

/* Checks the raw head of an HTTP/1.x request (head: the bytes from the request line on, len of
 * them available; the head ends at its first empty line) for framing h2o lets through:
 * Content-Length with Transfer-Encoding (RFC 9112 §6.1: a smuggling vector), Content-Length
 * fields whose values differ (§6.3: unrecoverable), a Transfer-Encoding given twice or in an
 * HTTP/1.0 request (§6.1: faulty framing), a line that ends in a bare LF (§2.2 lets a recipient
 * take it for a line's end, as picohttpparser does; a proxy in front that does not reads other
 * fields). Identical repeated Content-Length values are accepted (§6.3 allows it). Also the Host field, which h2o 2.2.5 takes the last of and keeps out of
 * req->headers: §3.2 says a server MUST answer 400 to an HTTP/1.1 request without it, to one with
 * more than one, and to one whose value is invalid (RFC 9110 §7.2: uri-host [":" port]; checked
 * by its characters). HTTP/1.0 needs none. Returns NULL when the head is sound (or not complete
 * within len: h2o parsed it, so that does not happen), else a static reason for the problem's
 * detail. */
const char *agw_guard_http1_framing(const char *head, size_t len);

/* The head of HTTP/1 request req as h2o received it: the socket's input buffer, which holds the
 * current request from its first byte until h2o has answered it. Returns 0 with *head and *len
 * set, or -1 when req is not HTTP/1 or the buffer does not start with req's method (nothing to
 * check against). */
int agw_guard_http1_head(h2o_req_t *req, const char **head, size_t *len);

/* ---- HTTP/2 rapid reset --------------------------------------------------------------------- */

/* What the guard keeps per client connection; embedded by the caller (the worker's connection),
 * zeroed at accept. */
typedef struct agw_guard_conn {
    uint64_t window_start_ms;        /* private: start of the current cancel window */
    unsigned cancelled;              /* private: streams cancelled before their answer in it */
    int fd;                          /* ro: the connection's socket */
    h2o_conn_t *h2;                  /* private: h2o's connection, set when a GOAWAY is due */
    h2o_linklist_t due;              /* private: on the guard's list while a GOAWAY is due */
    h2o_socket_cb h2o_read;          /* private: h2o's read callback, when the guard's runs first
                                        (agw_guard_h2_watch); NULL before */
    unsigned max_fields;             /* ro: header fields per header block before GOAWAY */
    size_t max_block_bytes;          /* ro: encoded bytes per header block before GOAWAY */
    size_t unsent;                   /* HTTP/2: bytes of the answers on its streams whose requests have
                                        not ended (their client has not taken them all): counted by
                                        the worker (respond.c, request.c), bounded by
                                        clients.max_unsent_bytes */
    unsigned goaway : 1;             /* ro: GOAWAY sent (or due): the connection is closing */
    unsigned shutdown_told : 1;      /* private: the graceful shutdown's GOAWAY sent (agw_guard_h2_shutdown) */
} agw_guard_conn_t;

/* The per-worker side of the rapid-reset guard: connections whose GOAWAY is due. */
typedef struct agw_guard {
    h2o_linklist_t due;              /* agw_guard_conn_t.due, oldest first */
    h2o_context_t *ctx;              /* the worker's h2o context (its list of HTTP/2 connections) */
    agw_guard_conn_t **by_fd;        /* live connections by socket; NULL where none */
    size_t by_fd_cap;
    int layout;                      /* h2o's HTTP/2 connection layout: 0 unchecked, 1 as expected,
                                        -1 not (the rapid-reset guard is off; guard.c) */
    ssize_t (*expect_default)(struct st_h2o_http2_conn_t *conn, const uint8_t *src, size_t len,
                              const char **err_desc); /* h2o's frame reader outside a header block
                                        (its _read_expect then), NULL until seen (guard.c) */
    agw_buf_t block;                 /* scratch: the header block being counted */
} agw_guard_t;

/* Sets up g for the worker whose h2o context is ctx. */
void agw_guard_init(agw_guard_t *g, h2o_context_t *ctx);

/* Frees what g holds (not the connections). */
void agw_guard_dispose(agw_guard_t *g);

/* Registers c, a connection just accepted on socket fd (c zeroed by the caller), on the worker's
 * thread. max_fields, max_block_bytes: the most header fields and encoded bytes of one HTTP/2
 * request header block (HEADERS and its CONTINUATION frames) that h2o may decode on it; past
 * either the connection gets GOAWAY (agw_guard_h2_watch). If the connection turns out to be
 * HTTP/2, the guard counts its header blocks from its first frame on: the guard defines
 * h2o_http2_accept, which libh2o calls for every new HTTP/2 connection (guard.c). */
void agw_guard_conn_open(agw_guard_t *g, agw_guard_conn_t *c, int fd, unsigned max_fields, size_t max_block_bytes);

/* Forgets c (its socket has closed; c is about to be freed). */
void agw_guard_conn_close(agw_guard_t *g, agw_guard_conn_t *c);

/* The connection of HTTP/2 request req's socket, or NULL (not HTTP/2, unknown socket). */
agw_guard_conn_t *agw_guard_conn_of(agw_guard_t *g, h2o_req_t *req);

/* The connection registered on socket fd (agw_guard_conn_open), or NULL. */
agw_guard_conn_t *agw_guard_conn_by_fd(agw_guard_t *g, int fd);

/* For a graceful shutdown: sends each HTTP/2 connection of the worker's h2o context that has not
 * had it yet (call it again: a connection may turn HTTP/2 later, after its TLS handshake or an
 * upgrade) a GOAWAY with the last stream id 2^31-1 and NO_ERROR (RFC 9113 §6.8: no new streams; those already opened
 * go on), and leaves the connection open. h2o 2.2.5's own (h2o_context_request_shutdown) sends
 * a second GOAWAY a second later and then closes each connection whose streams have all been
 * answered, cutting a request whose body is still arriving (an upload); here the connection
 * stays until its streams are done or the process ends (agw_guard_h2_streams tells which are
 * busy). Returns 0, or -1 when h2o's HTTP/2 connection layout is not trusted (see guard.c): the
 * caller then falls back on h2o's. On the worker's thread, outside h2o's callbacks. */
int agw_guard_h2_shutdown(agw_guard_t *g);

/* What agw_guard_h2_streams says of one HTTP/2 connection. */
typedef struct agw_guard_h2_count {
    struct st_h2o_http2_conn_t *conn; /* h2o's connection: valid until h2o next runs (for
                                         agw_guard_h2_close_idle in the same turn of the loop) */
    unsigned streams;        /* its open streams (a request being received, handled or answered:
                                h2o's counts of client and push streams) */
    unsigned sending;        /* of them, those sending a response's body (h2o's SEND_BODY state:
                                headers sent, DATA frames to go, which the client's flow-control
                                window may hold back) */
    uint64_t receiving_ms;   /* how long the oldest stream still receiving its request (its
                                headers or body: h2o has not handed it over) has been at it, ms;
                                0 when none is */
} agw_guard_h2_count_t;

/* For a graceful shutdown and the client timeouts (worker/accept.c): calls fn(arg, c, count) for
 * each HTTP/2 connection of the worker's h2o context that the guard knows (c, registered by
 * agw_guard_conn_open). Reads h2o's HTTP/2 connection as the rapid-reset guard does (see
 * guard.c), its streams too when some have not been answered; when that layout is not trusted,
 * calls fn for none (the caller then cannot tell an HTTP/2 connection from another). */
void agw_guard_h2_streams(agw_guard_t *g, void (*fn)(void *arg, agw_guard_conn_t *c, const agw_guard_h2_count_t *count),
                          void *arg);

/* Closes c's HTTP/2 connection (conn, as agw_guard_h2_streams gave it in this turn of the loop:
 * no walk of h2o's list of connections, which made a sweep of N idle connections cost N²/2 steps)
 * as h2o's own idle timeout does, for a connection the gateway finds
 * idle although h2o's timer keeps restarting (it restarts on every frame, a PING included):
 * GOAWAY with NO_ERROR and "idle timeout" as its debug data (RFC 9113 §6.8: the client learns
 * that no stream was processed and may retry on a new connection), then the close once the frame
 * is written. It moves h2o's idle entry of the connection (_timeout_entry) to the context's zero
 * timeout, so h2o's on_idle_timeout runs on the loop's next turn; a frame read before that
 * restarts h2o's timer instead (the caller closes the connection itself on a later sweep). Returns
 * 1 when it did; 0 when it could not: the layout is not trusted (see guard.c), the connection is
 * not one h2o holds open (closing, a GOAWAY sent or due) or a stream of it is half closed (h2o's
 * idle entry is not linked then). On the worker's thread, outside h2o's callbacks. */
int agw_guard_h2_close_idle(agw_guard_t *g, agw_guard_conn_t *c, struct st_h2o_http2_conn_t *conn);

/* An HTTP/2 stream of req's connection ended before the gateway answered it (the client reset
 * it, or left). Counts it in the connection's window of window_ms; past max_cancelled in one
 * window the connection stops taking new streams at once (h2o ignores HEADERS from then on), its
 * GOAWAY (ENHANCE_YOUR_CALM, RFC 9113 §5.4.1) is put in its write buffer, and the write is due:
 * agw_guard_h2_flush asks for it. Runs in h2o's dispose callback of the request, where h2o may be
 * tearing the connection down: it touches nothing but the connection's state and write buffer.
 * now_ms: the loop's clock. Returns 1 when this stream made the GOAWAY due. */
int agw_guard_h2_cancelled(agw_guard_t *g, h2o_req_t *req, uint64_t now_ms, unsigned max_cancelled,
                           uint64_t window_ms);

/* Counts the header fields of an HPACK header block (RFC 7541 §6) without decoding it (no
 * dynamic table needed: every representation says its own length). A representation cut off at
 * len is not counted. Returns the count, stopping early once it passes stop. */
unsigned agw_guard_hpack_fields(const uint8_t *block, size_t len, unsigned stop);

/* HTTP/2 request req is on a connection the guard should read ahead of h2o (when it does not
 * already: connections h2o_http2_accept saw are watched from their first frame): from now on,
 * each request header block (a HEADERS frame and the CONTINUATION frames that continue it, RFC
 * 9113 §4.3) that h2o has received but not decoded yet is counted first
 * (agw_guard_hpack_fields), and one with more header fields or encoded bytes than the
 * connection's limits (agw_guard_conn_open; a header bomb: HPACK references that h2o would decode
 * into megabytes before the gateway sees one) gets the connection GOAWAY (ENHANCE_YOUR_CALM)
 * before h2o decodes it; h2o takes no stream after it. A continued block is counted as a whole,
 * the part h2o holds already included, each time a CONTINUATION arrives (h2o 2.2.5 alone takes up
 * to H2O_MAX_REQLEN, 408 KB, of continued block and decodes all of it). Frames already in the
 * buffer behind req's are counted now. Call on each HTTP/2 request (only the first per
 * connection does anything). */
void agw_guard_h2_watch(agw_guard_t *g, h2o_req_t *req);

/* Sends the due GOAWAYs, on connections h2o still has open (the last open streams finish, then
 * h2o closes the connection). Call from the loop outside h2o's callbacks (the worker's prepare
 * watcher). Returns how many were sent. */
size_t agw_guard_h2_flush(agw_guard_t *g);

#endif
