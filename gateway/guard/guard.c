/* guard.c: the limits a hostile client meets at the front (see guard.h). */
#include "guard/guard.h"

#include "base/h2_frame.h"
#include "base/mem.h"

#include <h2o/http2.h>
#include <h2o/http2_internal.h> /* with h2o_internal/khash.h */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>

#include "base/log.h"

/* ---- request headers ------------------------------------------------------------------------ */

const char *agw_guard_headers_fit(const h2o_headers_t *headers, size_t max_headers, size_t max_header_bytes,
                                  size_t *count, size_t *bytes)
{
    *count = headers->size;
    *bytes = 0;
    if (headers->size > max_headers)
        return "too many header fields";
    size_t total = 0;
    for (size_t i = 0; i < headers->size; i++) {
        total += headers->entries[i].name->len + headers->entries[i].value.len;
        if (total > max_header_bytes) {
            *bytes = total;
            return "header fields too large";
        }
    }
    *bytes = total;
    return NULL;
}

/* ---- HTTP/1.1 framing ----------------------------------------------------------------------- */

/* Whether the field name [p, p+n) is name (lowercase), in any case. */
static int name_is(const char *p, size_t n, const char *name)
{
    return n == strlen(name) && strncasecmp(p, name, n) == 0;
}

/* Whether v[0..n) is a Host field value RFC 9110 §7.2 allows: uri-host [":" port], where uri-host
 * is an IP-literal ("[" … "]"), an IPv4 address or a reg-name (unreserved, pct-encoded, sub-delims;
 * RFC 3986 §3.2.2). Checked by its characters, not parsed: what it keeps out is what a reader
 * after the gateway would take for another part of a URI or of the message (whitespace, controls,
 * '/', '?', '#', '@', '\', quotes, bytes over 0x7e). Empty is allowed (§7.2: a target without an
 * authority). */
static int host_value_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            continue;
        if (strchr("-._~!$&'()*+,;=%:[]", c) == NULL || c == '\0')
            return 0;
    }
    return 1;
}

const char *agw_guard_http1_framing(const char *head, size_t len)
{
    const char *p = head, *end = head + len;
    const char *cl = NULL; /* the first Content-Length value */
    size_t cl_len = 0;
    int num_te = 0, num_cl = 0, num_host = 0, bad_host = 0, complete = 0;
    while (p < end && (*p == '\r' || *p == '\n')) /* empty lines before the request line */
        p++;
    const char *nl = memchr(p, '\n', (size_t)(end - p)); /* the request line */
    if (nl == NULL)
        return NULL;
    if (nl == p || nl[-1] != '\r')
        return "a line of the head ends in LF without CR";
    const char *rl_end = nl - 1;
    /* HTTP/1.0 needs no Host; anything else h2o took is HTTP/1.1 */
    int http10 = rl_end - p >= 8 && memcmp(rl_end - 8, "HTTP/1.0", 8) == 0;
    for (p = nl + 1; p < end; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return NULL; /* the head is not complete here: nothing to say */
        /* RFC 9112 §2.2 lets a recipient take a bare LF for a line's end; a proxy in front that
         * does not splits the head otherwise (Host: x\nContent-Length: 41 is one field to it, two
         * here): refused, as every line the gateway's clients send ends in CRLF */
        if (nl == p || nl[-1] != '\r')
            return "a line of the head ends in LF without CR";
        const char *eol = nl - 1;
        if (eol == p) {
            complete = 1;
            break; /* the empty line: the end of the head */
        }
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (colon == NULL)
            continue; /* h2o refused such a line already; not framing */
        const char *v = colon + 1, *ve = eol;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        if (name_is(p, (size_t)(colon - p), "content-length")) {
            if (num_cl++ == 0) {
                cl = v;
                cl_len = (size_t)(ve - v);
            } else if ((size_t)(ve - v) != cl_len || memcmp(v, cl, cl_len) != 0) {
                return "Content-Length fields disagree";
            }
        } else if (name_is(p, (size_t)(colon - p), "transfer-encoding")) {
            num_te++;
        } else if (name_is(p, (size_t)(colon - p), "host")) {
            num_host++;
            bad_host |= !host_value_ok(v, (size_t)(ve - v));
        }
    }
    if (num_cl && num_te)
        return "both Content-Length and Transfer-Encoding";
    if (num_te > 1)
        return "Transfer-Encoding given more than once";
    if (num_te && http10) /* RFC 9112 §6.1: its framing is faulty, Content-Length or not */
        return "Transfer-Encoding in an HTTP/1.0 request";
    if (num_host > 1)
        return "Host given more than once";
    if (bad_host)
        return "Host holds characters a host and port may not";
    if (complete && num_host == 0 && !http10)
        return "an HTTP/1.1 request without Host";
    return NULL;
}

int agw_guard_http1_head(h2o_req_t *req, const char **head, size_t *len)
{
    if (req->version >= 0x200 || req->conn->callbacks->get_socket == NULL)
        return -1;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (sock == NULL || sock->input == NULL || sock->input->size == 0)
        return -1;
    const char *b = sock->input->bytes, *e = b + sock->input->size;
    while (b < e && (*b == '\r' || *b == '\n'))
        b++;
    if ((size_t)(e - b) < req->input.method.len || memcmp(b, req->input.method.base, req->input.method.len) != 0)
        return -1;
    *head = b;
    *len = (size_t)(e - b);
    return 0;
}

/* ---- HTTP/2 rapid reset --------------------------------------------------------------------- */

/* h2o 2.2.5 has no call to send GOAWAY on one connection: its own is static (enqueue_goaway in
 * lib/http2/connection.c), which encodes the frame into the connection's write buffer, asks for
 * a write and sets the state to HALF_CLOSED; nor a hook on the frames it reads. So the guard does
 * the same on h2o's connection (state, _conns, _read_expect, _headers_unparsed, _write.buf),
 * declared in <h2o/http2_internal.h>, which Debian's libh2o-dev ships without the klib header it
 * includes (h2o_internal/khash.h stands in for it): the compiler lays the fields out as the
 * installed libh2o's header says, and a libh2o whose header drops or renames one fails the
 * build. A library that does not match its own header (a libh2o0.13 built from other sources)
 * is caught at run time: h2_check() verifies a live connection before the guard trusts it (the
 * socket h2o's get_socket callback returns, a state in range, the connection on the context's
 * list), and the guard turns itself off with an error in the log if it does not match. */
typedef h2o_http2_conn_t h2_conn_t;

/* Whether h2 is on ctx's list of HTTP/2 connections. */
static int h2_listed(h2o_context_t *ctx, const h2_conn_t *h2)
{
    for (h2o_linklist_t *n = ctx->http2._conns.next; n != &ctx->http2._conns; n = n->next)
        if (n == &h2->_conns)
            return 1;
    return 0;
}

/* Checks the fields above once, on the first HTTP/2 connection that needs them: h2, which h2o
 * says is the connection on socket sock. 1: trusted. */
static int h2_check_conn(agw_guard_t *g, const h2_conn_t *h2, const h2o_socket_t *sock)
{
    if (g->layout != 0)
        return g->layout > 0;
    int ok = sock != NULL && h2->sock == sock && h2->state >= H2O_HTTP2_CONN_STATE_OPEN &&
             h2->state <= H2O_HTTP2_CONN_STATE_IS_CLOSING && h2_listed(g->ctx, h2);
    g->layout = ok ? 1 : -1;
    if (!ok)
        agw_log(AGW_LOG_ERROR, "the HTTP/2 connection of this libh2o does not match its header: streams cancelled in "
                "bulk (rapid reset) are not limited (clients.max_cancelled_streams is off), header blocks are not "
                "counted before h2o decodes them");
    return ok;
}

/* h2_check_conn for the connection of HTTP/2 request req. */
static int h2_check(agw_guard_t *g, h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket ? req->conn->callbacks->get_socket(req->conn) : NULL;
    return h2_check_conn(g, (const h2_conn_t *)req->conn, sock);
}

/* h2o 2.2.5 never ends a header block on a half-closed connection (its own GOAWAY at a graceful
 * shutdown, or refuse's): in the middle of one, it consumes nothing of the next CONTINUATION and
 * reads it again, forever, its worker with it (refuse, below). And a trailer (a HEADERS frame on a
 * stream receiving its body) without END_HEADERS begins such a block even on a half-closed
 * connection (handle_headers_frame looks at the state only after trailers). So on a half-closed
 * connection, every whole HEADERS frame header without END_HEADERS in sock's unparsed input (which
 * starts at a frame: h2o consumes whole frames) becomes a CONTINUATION's: outside a block, h2o
 * answers it PROTOCOL_ERROR and closes the connection (RFC 9113 §6.10), which a half-closed one
 * was doing. A frame h2o has parsed already in this read is changed too, to no effect. */
static void end_blocks_half_closed(h2_conn_t *h2, h2o_socket_t *sock)
{
    if (h2->state != H2O_HTTP2_CONN_STATE_HALF_CLOSED || sock == NULL)
        return;
    uint8_t *buf = (uint8_t *)sock->input->bytes;
    for (size_t off = 0, size = sock->input->size; off + 9 <= size; off += 9 + agw_h2_frame_length(buf + off))
        if (buf[off + 3] == H2O_HTTP2_FRAME_TYPE_HEADERS && !(buf[off + 4] & H2O_HTTP2_FRAME_FLAG_END_HEADERS))
            buf[off + 3] = H2O_HTTP2_FRAME_TYPE_CONTINUATION;
}

/* Ends the header block h2o is in on connection h2 (it waits for a CONTINUATION), as refuse's
 * comment below says: h2o's reader put back to g->expect_default, or else next_frame_type (the type
 * byte of the next frame in h2o's input, NULL when there is none) made 0xff. Returns 0, or -1 when
 * neither could be done. */
static int end_held_block(agw_guard_t *g, h2_conn_t *h2, uint8_t *next_frame_type)
{
    if (g->expect_default != NULL)
        h2->_read_expect = g->expect_default;
    else if (next_frame_type != NULL)
        *next_frame_type = 0xff; /* not CONTINUATION: h2o answers PROTOCOL_ERROR and closes */
    else
        return -1;
    return 0;
}

/* Sends connection h2 (c's) GOAWAY with ENHANCE_YOUR_CALM and reason (RFC 9113 §5.4.1): the
 * frame goes into the write buffer now, so that it is the first the client gets (h2o answers the
 * frames of the streams it ignores from now on with a GOAWAY of its own, a PROTOCOL_ERROR, and
 * closes); no new stream from now on, even among the frames h2o has read and not parsed yet. The
 * write itself is asked for by agw_guard_h2_flush: h2o may be inside its own teardown of the
 * connection here, and a write it does not expect would outlive it (the buffer alone is disposed
 * with the connection).
 * h2o 2.2.5 in HALF_CLOSED while it waits for the CONTINUATION of a header block consumes
 * nothing of that frame and parses it again, forever (expect_continuation_of_headers returns 0),
 * so a connection in the middle of a block is also put back to reading frames by default (h2o's
 * reader seen outside a block, g->expect_default): the CONTINUATION is then a protocol error
 * (RFC 9113 §6.10), and h2o closes the connection without decoding the block. Until that reader
 * has been seen, next_frame_type (the type byte of the next frame in h2o's input, NULL when
 * there is none) is overwritten instead, with the same effect; with neither, the connection is
 * left open (its GOAWAY is sent all the same). */
static void refuse(agw_guard_t *g, agw_guard_conn_t *c, h2_conn_t *h2, const char *reason, int mid_block,
                   uint8_t *next_frame_type)
{
    c->goaway = 1;
    c->h2 = &h2->super;
    if (h2->state != H2O_HTTP2_CONN_STATE_OPEN)
        return; /* closing already */
    h2o_http2_encode_goaway_frame(&h2->_write.buf, h2->pull_stream_ids.max_open, H2O_HTTP2_ERROR_ENHANCE_YOUR_CALM,
                                  h2o_iovec_init(reason, strlen(reason)));
    if (mid_block && end_held_block(g, h2, next_frame_type) != 0)
        goto due;
    h2->state = H2O_HTTP2_CONN_STATE_HALF_CLOSED;
    end_blocks_half_closed(h2, h2->sock); /* (the frames behind the bomb, or behind h2o's position) */
due:
    h2o_linklist_insert(&g->due, &c->due);
}

void agw_guard_init(agw_guard_t *g, h2o_context_t *ctx)
{
    memset(g, 0, sizeof(*g));
    h2o_linklist_init_anchor(&g->due);
    g->ctx = ctx;
}

void agw_guard_dispose(agw_guard_t *g)
{
    agw_buf_free(&g->block);
    free(g->by_fd);
    g->by_fd = NULL;
    g->by_fd_cap = 0;
}

static __thread agw_guard_t *thread_guard; /* the guard of the worker whose thread this is */

void agw_guard_conn_open(agw_guard_t *g, agw_guard_conn_t *c, int fd, unsigned max_fields, size_t max_block_bytes)
{
    thread_guard = g;
    c->fd = fd;
    c->max_fields = max_fields;
    c->max_block_bytes = max_block_bytes;
    if (fd < 0)
        return;
    if ((size_t)fd >= g->by_fd_cap) {
        size_t cap = g->by_fd_cap ? g->by_fd_cap : 256;
        while (cap <= (size_t)fd)
            cap *= 2;
        agw_guard_conn_t **t = agw_realloc(g->by_fd, cap * sizeof(*t));
        memset(t + g->by_fd_cap, 0, (cap - g->by_fd_cap) * sizeof(*t));
        g->by_fd = t;
        g->by_fd_cap = cap;
    }
    g->by_fd[fd] = c; /* a descriptor number is reused only once its socket has closed */
}

void agw_guard_conn_close(agw_guard_t *g, agw_guard_conn_t *c)
{
    if (h2o_linklist_is_linked(&c->due))
        h2o_linklist_unlink(&c->due);
    /* the number may already belong to a connection accepted after this one's socket closed */
    if (c->fd >= 0 && (size_t)c->fd < g->by_fd_cap && g->by_fd[c->fd] == c)
        g->by_fd[c->fd] = NULL;
}

agw_guard_conn_t *agw_guard_conn_of(agw_guard_t *g, h2o_req_t *req)
{
    if (req->version < 0x200 || req->conn->callbacks->get_socket == NULL)
        return NULL;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    return fd >= 0 && (size_t)fd < g->by_fd_cap ? g->by_fd[fd] : NULL;
}

agw_guard_conn_t *agw_guard_conn_by_fd(agw_guard_t *g, int fd)
{
    return fd >= 0 && (size_t)fd < g->by_fd_cap ? g->by_fd[fd] : NULL;
}

int agw_guard_h2_shutdown(agw_guard_t *g)
{
    static const char reason[] = "graceful shutdown";
    for (h2o_linklist_t *n = g->ctx->http2._conns.next; n != &g->ctx->http2._conns; n = n->next) {
        h2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2_conn_t, _conns, n);
        if (h2->sock == NULL)
            continue;
        if (!h2_check_conn(g, h2, h2->sock))
            return -1;
        agw_guard_conn_t *c = agw_guard_conn_by_fd(g, h2o_socket_get_fd(h2->sock));
        if (h2->state != H2O_HTTP2_CONN_STATE_OPEN || c == NULL || c->shutdown_told)
            continue; /* closing already (a GOAWAY of its own), or told */
        c->shutdown_told = 1;
        h2o_http2_encode_goaway_frame(&h2->_write.buf, INT32_MAX, H2O_HTTP2_ERROR_NONE,
                                      h2o_iovec_init(reason, sizeof(reason) - 1));
        h2o_http2_conn_request_write(h2);
    }
    return 0;
}


/* How long the oldest stream of h2 still receiving its request has been at it, ms (0: none; at
 * least 1 when one is), by h2o's timestamps of the streams (the loop's time when each began). */
static uint64_t oldest_receiving_ms(h2_conn_t *h2)
{
    const khash_t(h2o_http2_stream_t) *m = h2->streams;
    if (m == NULL || m->size > m->n_buckets || (m->n_buckets & (m->n_buckets - 1)) != 0)
        return 0; /* not a map as khash.h lays it out */
    struct timeval now = *h2o_get_timestamp(h2->super.ctx, NULL, NULL), first = now;
    int any = 0;
    for (uint32_t i = 0; i < m->n_buckets; i++) {
        if (!agw_kh_occupied(m, i))
            continue;
        const h2o_http2_stream_t *st = m->vals[i];
        if (st == NULL || st->stream_id != m->keys[i])
            return 0; /* not the layout read: nothing is told */
        if (st->state == H2O_HTTP2_STREAM_STATE_RECV_HEADERS || st->state == H2O_HTTP2_STREAM_STATE_RECV_BODY) {
            const struct timeval *b = &st->req.timestamps.request_begin_at;
            if (!any || timercmp(b, &first, <))
                first = *b;
            any = 1;
        }
    }
    if (!any)
        return 0;
    if (!timercmp(&first, &now, <)) /* (h2o's cached time: a stream begun since it was read) */
        return 1;
    struct timeval d;
    timersub(&now, &first, &d);
    uint64_t ms = (uint64_t)d.tv_sec * 1000 + (uint64_t)d.tv_usec / 1000;
    return ms ? ms : 1;
}

void agw_guard_h2_streams(agw_guard_t *g, void (*fn)(void *arg, agw_guard_conn_t *c, const agw_guard_h2_count_t *count),
                          void *arg)
{
    for (h2o_linklist_t *n = g->ctx->http2._conns.next; n != &g->ctx->http2._conns; n = n->next) {
        h2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2_conn_t, _conns, n);
        if (h2->sock == NULL) /* its socket is gone: the connection is being freed */
            continue;
        if (!h2_check_conn(g, h2, h2->sock)) /* (checked once, on the first connection seen) */
            return;
        agw_guard_conn_t *c = agw_guard_conn_by_fd(g, h2o_socket_get_fd(h2->sock));
        if (c == NULL)
            continue;
        agw_guard_h2_count_t k = {.conn = h2,
                                  .streams = h2->num_streams.pull.open + h2->num_streams.push.open,
                                  .sending = h2->num_streams.pull.send_body + h2->num_streams.push.send_body};
        /* streams not answering yet (being received, or handled): only then is one walked */
        if (k.streams > h2->num_streams.pull.half_closed + h2->num_streams.push.half_closed)
            k.receiving_ms = oldest_receiving_ms(h2);
        fn(arg, c, &k);
    }
}

int agw_guard_h2_cancelled(agw_guard_t *g, h2o_req_t *req, uint64_t now_ms, unsigned max_cancelled,
                           uint64_t window_ms)
{
    agw_guard_conn_t *c = agw_guard_conn_of(g, req);
    if (c == NULL || c->goaway || !h2_check(g, req))
        return 0;
    if (now_ms - c->window_start_ms >= window_ms) {
        c->window_start_ms = now_ms;
        c->cancelled = 0;
    }
    if (++c->cancelled <= max_cancelled)
        return 0;
    h2_conn_t *h2 = (h2_conn_t *)req->conn;
    refuse(g, c, h2, "too many streams cancelled", h2->_headers_unparsed != NULL, NULL);
    return 1;
}

/* Whether h2o still has c's connection open: it is on the context's list of HTTP/2 connections,
 * on c's socket, and c is still the connection of that socket. */
static h2_conn_t *live_h2(agw_guard_t *g, agw_guard_conn_t *c)
{
    for (h2o_linklist_t *n = g->ctx->http2._conns.next; n != &g->ctx->http2._conns; n = n->next) {
        h2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2_conn_t, _conns, n);
        if ((h2o_conn_t *)h2 == c->h2)
            return h2->sock && h2o_socket_get_fd(h2->sock) == c->fd && (size_t)c->fd < g->by_fd_cap &&
                           g->by_fd[c->fd] == c
                       ? h2
                       : NULL;
    }
    return NULL;
}

int agw_guard_h2_close_idle(agw_guard_t *g, agw_guard_conn_t *c, struct st_h2o_http2_conn_t *conn)
{
    h2_conn_t *h2 = conn;
    /* (no walk of the context's list: the sweep closes any number of connections at once) */
    if (g->layout <= 0 || h2 == NULL || h2->sock == NULL || h2o_socket_get_fd(h2->sock) != c->fd)
        return 0;
    /* h2o links _timeout_entry, with on_idle_timeout as its callback (the only one it ever sets
     * there), while no stream is half closed (update_idle_timeout) */
    if (h2->state != H2O_HTTP2_CONN_STATE_OPEN || c->goaway || !h2o_timeout_is_linked(&h2->_timeout_entry) ||
        h2->num_streams.pull.half_closed + h2->num_streams.push.half_closed != 0)
        return 0;
    h2o_timeout_unlink(&h2->_timeout_entry);
    h2o_timeout_link(g->ctx->loop, &g->ctx->zero_timeout, &h2->_timeout_entry);
    return 1;
}

/* ---- HTTP/2 header bombs -------------------------------------------------------------------- */

/* An HPACK integer with an n-bit prefix at *p (RFC 7541 §5.1); advances *p. -1 when cut off. */
static long hpack_int(const uint8_t **p, const uint8_t *end, int n)
{
    if (*p >= end)
        return -1;
    long mask = (1L << n) - 1, v = **p & mask;
    (*p)++;
    if (v < mask)
        return v;
    for (int shift = 0; *p < end && shift < 28; shift += 7) {
        uint8_t b = *(*p)++;
        v += (long)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return -1;
}

/* Skips an HPACK string literal (§5.2). 0, or -1 when cut off. */
static int hpack_skip_string(const uint8_t **p, const uint8_t *end)
{
    long n = hpack_int(p, end, 7);
    if (n < 0 || n > end - *p)
        return -1;
    *p += n;
    return 0;
}

unsigned agw_guard_hpack_fields(const uint8_t *block, size_t len, unsigned stop)
{
    const uint8_t *p = block, *end = block + len;
    unsigned fields = 0;
    while (p < end && fields <= stop) {
        uint8_t b = *p;
        if (b & 0x80) { /* indexed field (§6.1) */
            if (hpack_int(&p, end, 7) < 0)
                break;
        } else if ((b & 0xe0) == 0x20) { /* dynamic table size update (§6.3): no field */
            if (hpack_int(&p, end, 5) < 0)
                break;
            continue;
        } else { /* a literal (§6.2): with indexing (6-bit index), without or never indexed (4-bit) */
            long idx = hpack_int(&p, end, (b & 0x40) ? 6 : 4);
            if (idx < 0 || (idx == 0 && hpack_skip_string(&p, end) < 0) || hpack_skip_string(&p, end) < 0)
                break;
        }
        fields++;
    }
    return fields;
}

/* Whether the header block in g->block (a HEADERS frame's fragment and the CONTINUATIONs after
 * it so far) is a bomb: more fields than c->max_fields, or more bytes than c->max_block_bytes. */
static int block_too_large(agw_guard_t *g, const agw_guard_conn_t *c)
{
    return g->block.len > c->max_block_bytes ||
           agw_guard_hpack_fields((const uint8_t *)g->block.base, g->block.len, c->max_fields) > c->max_fields;
}

/* Walks the whole frames of buf (size bytes) from off on, counting each header block (a HEADERS
 * frame's fragment and the CONTINUATIONs after it; held, held_len: the start of a block that the
 * frames from off on may continue, NULL when none). Returns the offset of the first frame with
 * which a block passes c's limits, or SIZE_MAX. */
static size_t find_bomb(agw_guard_t *g, const agw_guard_conn_t *c, const uint8_t *buf, size_t size, size_t off,
                        const char *held, size_t held_len)
{
    agw_buf_reset(&g->block);
    int in_block = held != NULL; /* g->block holds a block's start */
    if (held)
        agw_buf_append(&g->block, held, held_len);
    while (off + 9 <= size) {
        size_t flen = agw_h2_frame_length(buf + off);
        uint8_t type = buf[off + 3], flags = buf[off + 4];
        if (off + 9 + flen > size)
            break; /* not all here: h2o waits for it too, and this runs again then */
        const uint8_t *p = buf + off + 9, *end = p + flen;
        size_t at = off;
        off += 9 + flen;
        if (type == 1 /* HEADERS */) {
            if ((flags & 0x8 /* PADDED */) && p < end) {
                size_t pad = *p++;
                end = pad <= (size_t)(end - p) ? end - pad : p; /* a bad pad length: h2o refuses the frame */
            }
            if (flags & 0x20 /* PRIORITY */)
                p = end - p >= 5 ? p + 5 : end;
            agw_buf_reset(&g->block);
            agw_buf_append(&g->block, p, (size_t)(end - p));
            in_block = !(flags & 0x4 /* END_HEADERS */);
        } else if (type == 9 /* CONTINUATION */ && in_block) {
            agw_buf_append(&g->block, p, flen);
            in_block = !(flags & 0x4);
        } else {
            in_block = 0; /* any other frame ends a block, as a protocol error that h2o answers */
            continue;
        }
        if (block_too_large(g, c))
            return at;
    }
    return SIZE_MAX;
}

/* Counts the header blocks in the unparsed input of c's connection from off on (whole frames:
 * h2o consumes them whole, so a block's fragments consumed already are in h2o's
 * _headers_unparsed, and the input from off starts at a frame). The first block with too many
 * fields or bytes, in its HEADERS frame or once continued, gets the connection GOAWAY (refuse)
 * before h2o decodes it. mid_block: the frames from off on may continue the block h2o holds in
 * _headers_unparsed. */
static void scan_headers(agw_guard_t *g, agw_guard_conn_t *c, h2o_socket_t *sock, size_t off, int mid_block)
{
    if (c->goaway)
        return;
    h2_conn_t *h2 = (h2_conn_t *)sock->data;
    const uint8_t *buf = (const uint8_t *)sock->input->bytes;
    /* h2o's reader outside a block (a stream was opened: the preface is behind) */
    if (h2->_headers_unparsed == NULL && h2->pull_stream_ids.max_open > 0 && g->expect_default == NULL)
        g->expect_default = h2->_read_expect;
    int held = mid_block && h2->_headers_unparsed != NULL;
    if (find_bomb(g, c, buf, sock->input->size, off, held ? h2->_headers_unparsed->bytes : NULL,
                  held ? h2->_headers_unparsed->size : 0) == SIZE_MAX)
        return;
    /* when h2o is in the middle of a block, it parses from off on: off is the block's next
     * CONTINUATION */
    refuse(g, c, h2, "header block too large", held, held ? (uint8_t *)&buf[off + 3] : NULL);
}

/* The length of the HTTP/2 connection preface (RFC 9113 §3.4) when sock's unparsed input starts
 * with it (h2o has not read it yet: the first read of a connection watched from its start), else 0.
 * No frame can start with those bytes: their length field would be 5 MB. */
static size_t preface_len(h2o_socket_t *sock)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    return sock->input->size >= sizeof(preface) - 1 && memcmp(sock->input->bytes, preface, sizeof(preface) - 1) == 0
               ? sizeof(preface) - 1
               : 0;
}

/* Counts the header blocks that came with the preface in sock's input, before h2o reads the
 * preface (and sends its own SETTINGS, which must be its first frame: RFC 9113 §3.4): a bomb's
 * frame is changed into one h2o refuses at once (a HEADERS into a CONTINUATION outside a block, a
 * CONTINUATION into a HEADERS inside one: PROTOCOL_ERROR, §6.10), so h2o never decodes it. */
static void check_first_frames(agw_guard_t *g, agw_guard_conn_t *c, h2o_socket_t *sock)
{
    size_t off = preface_len(sock);
    if (off == 0)
        return;
    uint8_t *buf = (uint8_t *)sock->input->bytes;
    size_t at = find_bomb(g, c, buf, sock->input->size, off, NULL, 0);
    if (at == SIZE_MAX)
        return;
    buf[at + 3] = buf[at + 3] == 1 ? 9 : 1;
    c->goaway = 1;
    agw_log(AGW_LOG_WARN, "client connection %d: a header block too large in its first frames (over %u fields or %zu "
            "bytes): refused before it was decoded", c->fd, c->max_fields, c->max_block_bytes);
}

/* The connection's read callback while the guard reads ahead of h2o: the unparsed input starts at
 * a frame (h2o consumes whole frames), so it is scanned from its start, then h2o parses it. */
static void on_h2_read(h2o_socket_t *sock, const char *err)
{
    agw_guard_t *g = thread_guard;
    int fd = h2o_socket_get_fd(sock);
    agw_guard_conn_t *c = g && fd >= 0 && (size_t)fd < g->by_fd_cap ? g->by_fd[fd] : NULL;
    if (c == NULL || c->h2o_read == NULL)
        return; /* cannot happen: the callback is only set with both */
    if (err == NULL && preface_len(sock) > 0) {
        check_first_frames(g, c, sock); /* the first read of a connection watched from its start */
    } else if (err == NULL) {
        scan_headers(g, c, sock, 0, 1);
        h2_conn_t *h2 = (h2_conn_t *)sock->data;
        if (h2->state == H2O_HTTP2_CONN_STATE_HALF_CLOSED && h2->_headers_unparsed != NULL &&
            h2->_read_expect != g->expect_default) {
            /* half-closed in the middle of a block (h2o's own GOAWAY came between its frames): ended
             * as refuse ends one (its CONTINUATION a protocol error), before h2o reads it again */
            end_held_block(g, h2, sock->input->size >= 9 ? (uint8_t *)&sock->input->bytes[3] : NULL);
        }
        end_blocks_half_closed(h2, sock);
    }
    c->h2o_read(sock, err);
}

/* Reads ahead of h2o on c's connection h2 from now on (agw_guard_h2_watch). 0, or -1 when h2o
 * is not reading it (closing). */
static int watch(agw_guard_t *g, agw_guard_conn_t *c, h2_conn_t *h2)
{
    h2o_socket_t *sock = h2->sock;
    if (sock->_cb.read == NULL || sock->data != h2)
        return -1; /* not reading (closing): nothing to read ahead of */
    thread_guard = g;
    c->h2o_read = sock->_cb.read;
    sock->_cb.read = on_h2_read; /* h2o sets it once per HTTP/2 connection (h2o_http2_accept) */
    return 0;
}

void agw_guard_h2_watch(agw_guard_t *g, h2o_req_t *req)
{
    agw_guard_conn_t *c = agw_guard_conn_of(g, req);
    if (c == NULL || c->h2o_read != NULL || !h2_check(g, req))
        return;
    h2_conn_t *h2 = (h2_conn_t *)req->conn;
    if (watch(g, c, h2) != 0)
        return;
    /* h2o is parsing req's HEADERS frame, the first in its input (it consumes it once the handler
     * returns): the frames behind it in this read are counted now */
    h2o_socket_t *sock = h2->sock;
    const uint8_t *buf = (const uint8_t *)sock->input->bytes;
    if (sock->input->size >= 9 && (buf[3] == 1 || buf[3] == 9)) {
        /* req's block ends in this frame (HEADERS, or the CONTINUATION with END_HEADERS) */
        size_t flen = agw_h2_frame_length(buf);
        scan_headers(g, c, sock, 9 + flen, 0);
    }
}

/* ---- HTTP/2 connections from their first frame ---------------------------------------------- */

/* libh2o's own, found past this definition (dlsym RTLD_NEXT) */
typedef void (*http2_accept_fn)(h2o_accept_ctx_t *ctx, h2o_socket_t *sock, struct timeval connected_at);

/* h2o_http2_accept stands in for libh2o's: h2o starts every HTTP/2 connection with it (after
 * the TLS handshake chose h2, or when a cleartext connection starts with the HTTP/2 preface), and
 * calls it through its PLT (libh2o 2.2.5 is not linked -Bsymbolic), so the definition of the
 * executable is the one called. Before libh2o's parses what the client sent with the preface,
 * the header blocks in it are counted (find_bomb): a bomb's frame is changed into one h2o
 * refuses at once (a HEADERS into a CONTINUATION outside a block, a CONTINUATION into a HEADERS
 * inside one: PROTOCOL_ERROR, RFC 9113 §6.10), so it is never decoded; then the guard reads ahead
 * of h2o on the connection from its first read on (watch), not only from its first request. */
void h2o_http2_accept(h2o_accept_ctx_t *ctx, h2o_socket_t *sock, struct timeval connected_at)
{
    static http2_accept_fn real;
    if (real == NULL)
        real = (http2_accept_fn)dlsym(RTLD_NEXT, "h2o_http2_accept");
    agw_guard_t *g = thread_guard;
    int fd = h2o_socket_get_fd(sock);
    agw_guard_conn_t *c = g && g->ctx == ctx->ctx && fd >= 0 && (size_t)fd < g->by_fd_cap ? g->by_fd[fd] : NULL;
    if (c != NULL && c->max_fields > 0 && sock->input != NULL)
        check_first_frames(g, c, sock);
    h2o_linklist_t *last = ctx->ctx->http2._conns.prev;
    real(ctx, sock, connected_at);
    /* the connection h2o made, unless it is closed already */
    if (c == NULL || ctx->ctx->http2._conns.prev == last || ctx->ctx->http2._conns.prev == &ctx->ctx->http2._conns)
        return;
    h2_conn_t *h2 = H2O_STRUCT_FROM_MEMBER(h2_conn_t, _conns, ctx->ctx->http2._conns.prev);
    if (h2->sock == sock && c->h2o_read == NULL && h2_check_conn(g, h2, sock))
        watch(g, c, h2);
}

size_t agw_guard_h2_flush(agw_guard_t *g)
{
    size_t n = 0;
    while (!h2o_linklist_is_empty(&g->due)) {
        agw_guard_conn_t *c = H2O_STRUCT_FROM_MEMBER(agw_guard_conn_t, due, g->due.next);
        h2o_linklist_unlink(&c->due);
        h2_conn_t *h2 = live_h2(g, c);
        if (h2 == NULL || h2->state == H2O_HTTP2_CONN_STATE_IS_CLOSING)
            continue; /* closed meanwhile */
        /* as h2o's own GOAWAY on a protocol error: the frame is in the buffer
         * (agw_guard_h2_cancelled); once written, the connection closes when its open streams
         * are done (do_emit_writereq in HALF_CLOSED) */
        h2o_http2_conn_request_write(h2);
        n++;
    }
    return n;
}
