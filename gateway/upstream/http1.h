/* upstream/http1.h: HTTP/1.1 message framing for the upstream client (used by conn.c, pool.c).
 *
 * Two halves, no sockets and no loop: encoding a request into one buffer (with the CR/LF/NUL
 * checks that keep a caller from injecting headers), and parsing a response with libhttp-parser
 * into a reusable agw_h1_response_t (status, headers, decoded body, trailers; 1xx interim
 * responses skipped, always without a body, except 101, which is a bad response; body limit
 * enforced as soon as it is known: at Content-Length, at each chunk size, at each body byte; the
 * body buffer is sized from Content-Length at most 1 MiB ahead of the bytes received).
 */
#ifndef AGW_UPSTREAM_HTTP1_H
#define AGW_UPSTREAM_HTTP1_H

#include "base/buf.h"
#include "upstream/pool.h"

#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>

/* Why a request must not be sent, as a static string, or NULL when it may: the method is not a
 * token, the path does not start with '/' or holds a space, a control character (CR, LF, NUL
 * included), a byte that is not ASCII or a '#' (RFC 3986 §2, §3.5), a header name is empty or not
 * a token, or a header value holds a control character other than HTAB (RFC 9110 §5.1, §5.5).
 * Also what agg.sys.call_invalid tells the spec harness, so specs refuse what serve refuses. */
const char *agw_h1_request_invalid(const char *method, const char *path, size_t path_len,
                                   const agw_header_t *headers, size_t num_headers);

/* Size in bytes of the request agw_h1_request_write() will produce for req, or 0 with *why set
 * to agw_h1_request_invalid()'s reason when the request must not be sent. */
size_t agw_h1_request_size(const agw_upstream_conf_t *conf, const agw_call_req_t *req,
                           const char **why);

/* Writes the request into out, which has room for agw_h1_request_size() bytes; returns the bytes
 * written. The request line is "METHOD base_path+path HTTP/1.1"; Host comes from the conf; the
 * caller's Host, Content-Length, Connection and Transfer-Encoding headers are dropped so that
 * framing is the client's; Content-Length is sent when there is a body or the method is POST, PUT
 * or PATCH. */
size_t agw_h1_request_write(const agw_upstream_conf_t *conf, const agw_call_req_t *req, char *out);

/* 1 for the methods RFC 9110 §9.2.2 calls idempotent (GET HEAD PUT DELETE OPTIONS TRACE). */
int agw_h1_method_idempotent(const char *method);

/* A header while it is parsed: offsets into hstore, which moves as it grows. */
typedef struct agw_h1_hdr {
    size_t name_off, name_len, value_off, value_len;
} agw_h1_hdr_t;

/* The response being read on one connection. Its buffers are reused from one response to the
 * next; agw_h1_response_swap() hands the bytes of a finished response to someone else. */
typedef struct agw_h1_response {
    http_parser parser;
    size_t max_body;             /* body limit in bytes, 0 for none */
    size_t bytes;                /* bytes fed since agw_h1_response_start() */
    agw_buf_t body;              /* decoded body */
    agw_buf_t hstore;            /* header and trailer names and values, back to back */
    agw_h1_hdr_t *hdrs;          /* headers then trailers */
    size_t nhdrs, hdrs_cap;
    size_t nheaders;             /* hdrs[0, nheaders) are headers, the rest trailers */
    uint64_t expect_len;         /* Content-Length of the final response, or UINT64_MAX */
    int last;                    /* last header callback, to join pieces split by reads */
    unsigned head : 1;           /* the request was HEAD: no body follows */
    unsigned final_headers : 1;  /* headers of the final (non-1xx) response are complete */
    unsigned done : 1;           /* the final response is complete */
    unsigned keep_alive : 1;     /* the connection may carry another request (when done) */
    unsigned too_large : 1;      /* the body is over max_body */
} agw_h1_response_t;

/* Prepares r for the response to a new request; head is 1 for HEAD requests. Keeps buffers. */
void agw_h1_response_start(agw_h1_response_t *r, int head, size_t max_body);

/* Parses n bytes. Returns the bytes used: fewer than n when the response completed (r->done; the
 * rest belongs to no one and the connection must not be reused) or on an error (see
 * agw_h1_response_failed()). */
size_t agw_h1_response_feed(agw_h1_response_t *r, const char *p, size_t n);

/* Tells the parser the upstream closed the connection: completes a close-delimited body
 * (r->done is set, keep_alive cleared). */
void agw_h1_response_eof(agw_h1_response_t *r);

/* After feed: AGW_CALL_TOO_LARGE or AGW_CALL_BAD_RESPONSE when the response cannot be read
 * further, AGW_CALL_OK otherwise. */
agw_call_outcome_t agw_h1_response_failed(const agw_h1_response_t *r);

/* Describes a failure (the cause after "invalid HTTP response: ...") into out. */
void agw_h1_response_describe(const agw_h1_response_t *r, char *out, size_t cap);

/* Exchanges the body and header bytes of r with *body and *hstore (no copy), so a finished
 * response outlives the connection and the connection keeps a buffer for the next one. */
void agw_h1_response_swap(agw_h1_response_t *r, agw_buf_t *body, agw_buf_t *hstore);

/* Frees r's buffers. */
void agw_h1_response_free(agw_h1_response_t *r);

#endif
