/* upstream/http1.h: HTTP/1.1 message framing for the upstream client (used by conn.c, pool.c).
 *
 * Two halves, no sockets and no loop: encoding a request into one buffer (with the CR/LF/NUL
 * checks that keep a caller from injecting headers), and reading a response into a reusable
 * agw_h1_response_t (status, headers, decoded body, trailers). The status line is read here;
 * header and trailer fields by picohttpparser's phr_parse_headers and chunked bodies by its
 * phr_decode_chunked (upstream/phr.h, the copy libh2o links). The framing rules (RFC 9112):
 *  - status line "HTTP/1.<digit> <3 digits>[ <reason>]" (§4; the reason and its space may be
 *    missing); a status under 100 is a bad response, and so is 101 (the bytes after it are
 *    another protocol, which no request of ours asks for: we never send Upgrade, RFC 9110
 *    §15.2.2); other 1xx interim responses are skipped, always without a body;
 *  - the header section (status line to empty line) and the trailer section are each at most
 *    AGW_H1_MAX_HEADER_BYTES, with any number of fields; a line folded onto the one before
 *    (obs-fold) is a bad response (§5.2: a gateway may refuse it), as are a name with a space
 *    before the colon (§5.1) and a control character in a value but HTAB;
 *  - HEAD, 204 and 304 end at the headers whatever Content-Length or Transfer-Encoding says
 *    (§6.3); else Transfer-Encoding whose last coding is chunked reads chunks (extensions
 *    ignored, trailers kept), any other Transfer-Encoding reads to the close, Content-Length
 *    (digits only, one field; with Transfer-Encoding as well, a bad response, §6.3 point 3)
 *    that many bytes, and neither to the close;
 *  - the connection stays open after HTTP/1.1 unless Connection lists "close", after HTTP/1.0
 *    only when it lists "keep-alive", and never after a body read to the close;
 *  - the body limit is enforced as soon as it is known: at Content-Length, at each chunk size, at
 *    each body byte; the body buffer is sized from Content-Length at most 1 MiB ahead of the
 *    bytes received.
 */
#ifndef AGW_UPSTREAM_HTTP1_H
#define AGW_UPSTREAM_HTTP1_H

#include "base/buf.h"
#include "upstream/phr.h"
#include "upstream/pool.h"

#include <stddef.h>
#include <stdint.h>

/* Why a request must not be sent, as a static string, or NULL when it may: the method is not a
 * token, the path does not start with '/' or holds a space, a control character (CR, LF, NUL
 * included), a byte that is not ASCII or a '#' (RFC 3986 §2, §3.5), or a dot segment before its
 * query (base/dotseg.h: "..", "%2e%2e", "..;"), a header name is empty or not
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

/* Most bytes of a header section (status line, fields, empty line) and of a trailer section. */
#define AGW_H1_MAX_HEADER_BYTES (80 * 1024)

/* A header or trailer field: offsets into hstore, which moves as it grows. */
typedef struct agw_h1_hdr {
    size_t name_off, name_len, value_off, value_len;
} agw_h1_hdr_t;

/* Where a response is (private to http1.c). */
typedef enum {
    AGW_H1_HEAD,     /* in the status line or header section (of an interim or the final response) */
    AGW_H1_LENGTH,   /* in a body of Content-Length bytes */
    AGW_H1_CHUNKED,  /* in a chunked body */
    AGW_H1_TRAILERS, /* in the trailer section after the last chunk */
    AGW_H1_TO_EOF,   /* in a body that ends when the connection closes */
    AGW_H1_END       /* done, or failed */
} agw_h1_state_t;

/* The response being read on one connection. Its buffers are reused from one response to the
 * next; agw_h1_response_swap() hands the bytes of a finished response to someone else. Fields
 * marked ro may be read by the client; the rest are private to http1.c. */
typedef struct agw_h1_response {
    size_t max_body;             /* ro: body limit in bytes, 0 for none */
    size_t bytes;                /* ro: bytes fed since agw_h1_response_start() */
    unsigned status;             /* ro: status code of the response being read (0 before its
                                  * status line); final once final_headers is set */
    agw_buf_t body;              /* ro: decoded body */
    agw_buf_t hstore;            /* ro: the header section as received, then the trailer section;
                                  * hdrs point into it */
    agw_h1_hdr_t *hdrs;          /* ro: headers then trailers */
    size_t nhdrs, hdrs_cap;      /* ro: fields in hdrs; room in hdrs */
    size_t nheaders;             /* ro: hdrs[0, nheaders) are headers, the rest trailers */
    uint64_t expect_len;         /* ro: Content-Length of the final response, or UINT64_MAX */
    uint64_t left;               /* Content-Length bytes still to come */
    int minor;                   /* HTTP/1.<minor> of the status line */
    size_t line_len;             /* bytes of the status line once read (with its LF), else 0 */
    size_t seen;                 /* bytes of the section in hstore already looked at */
    size_t section;              /* offset in hstore of the section being read */
    struct phr_chunked_decoder chunked; /* chunked body decoder */
    const char *error;           /* why the response is bad, NULL while it is not */
    agw_h1_state_t state;
    unsigned head : 1;           /* ro: the request was HEAD: no body follows */
    unsigned final_headers : 1;  /* ro: headers of the final (non-1xx) response are complete */
    unsigned done : 1;           /* ro: the final response is complete */
    unsigned keep_alive : 1;     /* ro: the connection may carry another request (when done) */
    unsigned too_large : 1;      /* ro: the body is over max_body */
} agw_h1_response_t;

/* Prepares r for the response to a new request; head is 1 for HEAD requests. Keeps buffers. */
void agw_h1_response_start(agw_h1_response_t *r, int head, size_t max_body);

/* Reads n more bytes of the response (p need not outlive the call: what is kept is copied).
 * Returns the bytes used: fewer than n when the response completed (r->done; the rest belongs
 * to no one and the connection must not be reused) or on an error (see
 * agw_h1_response_failed()). Bytes fed after either are not used. */
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
