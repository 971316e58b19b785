/* upstream/http1.c: HTTP/1.1 request encoding and response framing (see upstream/http1.h). */
#include "upstream/http1.h"

#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { LAST_NONE, LAST_FIELD, LAST_VALUE };

/* Most body bytes reserved from a Content-Length before they arrive. */
#define PRESIZE_MAX (1024 * 1024)

/* ---- request -------------------------------------------------------------------------- */

/* RFC 9110 §5.6.2 token characters, as a table: header names are checked on every call */
static const unsigned char tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1,
    ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1,
    ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1,
    ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1,
    ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
};

static int is_token(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!tchar[(unsigned char)s[i]])
            return 0;
    return 1;
}

/* Headers the client sets itself. */
static int is_framing_header(const agw_header_t *h)
{
    static const struct {
        const char *name;
        size_t len;
    } own[] = {{"host", 4}, {"content-length", 14}, {"connection", 10}, {"transfer-encoding", 17}};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (h->name_len == own[i].len && strncasecmp(h->name, own[i].name, own[i].len) == 0)
            return 1;
    return 0;
}

static const char *base_path(const agw_upstream_conf_t *conf)
{
    return conf->base_path ? conf->base_path : "";
}

static int sends_length(const agw_call_req_t *req)
{
    return req->body != NULL || req->body_len > 0 || strcmp(req->method, "POST") == 0 ||
           strcmp(req->method, "PUT") == 0 || strcmp(req->method, "PATCH") == 0;
}

int agw_h1_method_idempotent(const char *m)
{
    static const char *const idempotent[] = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"};
    for (size_t i = 0; i < sizeof(idempotent) / sizeof(idempotent[0]); i++)
        if (strcmp(m, idempotent[i]) == 0)
            return 1;
    return 0;
}

/* Whether v (len bytes) holds a control character other than HTAB (C0 or DEL). Eight bytes at a
 * time (a word with a byte below 0x20 or equal to 0x7f is looked at byte by byte): a call's header
 * values, traceparent included, are checked on every call. */
static int has_control(const char *v, size_t len)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x, del;
        memcpy(&x, v + i, 8);
        del = x ^ (ones * 0x7f);
        if ((((x - ones * 0x20) & ~x) | ((del - ones) & ~del)) & highs)
            break;
    }
    for (; i < len; i++) {
        unsigned char ch = (unsigned char)v[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            return 1;
    }
    return 0;
}

const char *agw_h1_request_invalid(const char *method, const char *path, size_t path_len,
                                   const agw_header_t *headers, size_t num_headers)
{
    if (!is_token(method, method ? strlen(method) : 0))
        return "method is not an HTTP token";
    if (path_len == 0 || path[0] != '/')
        return "path does not start with '/'";
    /* the request target is sent as the script built it: a byte that is not a URI character
     * would be sent raw (RFC 3986 §2: non-ASCII must be percent-encoded) and a '#' would cut the
     * path at a fragment the upstream never sees (§3.5) */
    static const unsigned char BAD[256] = {[0 ... ' '] = 1, [0x7f] = 1, [0x80 ... 0xff] = 2, ['#'] = 3};
    static const char *const why[] = {
        NULL, "path contains a space or a control character (CR, LF, NUL, ...)",
        "path contains a byte that is not ASCII (percent-encode it: agg.escape)",
        "path contains '#', which would start a fragment (percent-encode it: agg.escape)"};
    for (size_t i = 0; i < path_len; i++)
        if (BAD[(unsigned char)path[i]])
            return why[BAD[(unsigned char)path[i]]];
    for (size_t i = 0; i < num_headers; i++) {
        const agw_header_t *h = &headers[i];
        if (!is_token(h->name, h->name_len))
            return "header name is empty or not an HTTP token";
        /* field values are visible characters, spaces and HTABs (RFC 9110 §5.5): CR, LF and NUL
         * would split or cut the request, the other controls (VT, FF, ESC, DEL …) are refused too */
        if (has_control(h->value, h->value_len))
            return "header value contains a control character (only HTAB is allowed)";
    }
    return NULL;
}

size_t agw_h1_request_size(const agw_upstream_conf_t *conf, const agw_call_req_t *req,
                           const char **why)
{
    if ((*why = agw_h1_request_invalid(req->method, req->path, req->path_len, req->headers, req->num_headers)))
        return 0;
    size_t mlen = strlen(req->method);
    size_t n = mlen + 1 + strlen(base_path(conf)) + req->path_len +
               strlen(" HTTP/1.1\r\nHost: ") + strlen(conf->host_header) + 2;
    for (size_t i = 0; i < req->num_headers; i++) {
        const agw_header_t *h = &req->headers[i];
        if (!is_framing_header(h))
            n += h->name_len + 2 + h->value_len + 2;
    }
    if (sends_length(req))
        n += strlen("Content-Length: \r\n") + 20;
    return n + 2 + req->body_len;
}

static char *put(char *p, const void *s, size_t len)
{
    memcpy(p, s, len);
    return p + len;
}

size_t agw_h1_request_write(const agw_upstream_conf_t *conf, const agw_call_req_t *req, char *out)
{
    char *p = out;
    p = put(p, req->method, strlen(req->method));
    *p++ = ' ';
    p = put(p, base_path(conf), strlen(base_path(conf)));
    p = put(p, req->path, req->path_len);
    p = put(p, " HTTP/1.1\r\nHost: ", strlen(" HTTP/1.1\r\nHost: "));
    p = put(p, conf->host_header, strlen(conf->host_header));
    p = put(p, "\r\n", 2);
    for (size_t i = 0; i < req->num_headers; i++) {
        const agw_header_t *h = &req->headers[i];
        if (is_framing_header(h))
            continue;
        p = put(p, h->name, h->name_len);
        p = put(p, ": ", 2);
        p = put(p, h->value, h->value_len);
        p = put(p, "\r\n", 2);
    }
    if (sends_length(req)) {
        char num[24];
        int len = snprintf(num, sizeof(num), "%zu", req->body_len);
        p = put(p, "Content-Length: ", strlen("Content-Length: "));
        p = put(p, num, (size_t)len);
        p = put(p, "\r\n", 2);
    }
    p = put(p, "\r\n", 2);
    if (req->body_len)
        p = put(p, req->body, req->body_len);
    return (size_t)(p - out);
}

/* ---- response ------------------------------------------------------------------------- */

static int on_message_begin(http_parser *p)
{
    agw_h1_response_t *r = p->data;
    /* also after a 1xx interim response: only the final response is kept */
    r->nhdrs = r->nheaders = 0;
    agw_buf_reset(&r->hstore);
    agw_buf_reset(&r->body);
    r->last = LAST_NONE;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    agw_h1_response_t *r = p->data;
    if (r->last != LAST_FIELD) {
        if (r->nhdrs == r->hdrs_cap) {
            size_t cap = r->hdrs_cap ? r->hdrs_cap * 2 : 16;
            agw_h1_hdr_t *hdrs = agw_realloc(r->hdrs, cap * sizeof(*hdrs));
            r->hdrs = hdrs;
            r->hdrs_cap = cap;
        }
        agw_h1_hdr_t *h = &r->hdrs[r->nhdrs++];
        h->name_off = h->value_off = r->hstore.len;
        h->name_len = h->value_len = 0;
        r->last = LAST_FIELD;
    }
    agw_buf_append(&r->hstore, at, len);
    r->hdrs[r->nhdrs - 1].name_len += len;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    agw_h1_response_t *r = p->data;
    agw_h1_hdr_t *h = &r->hdrs[r->nhdrs - 1];
    if (r->last != LAST_VALUE) {
        h->value_off = r->hstore.len;
        h->value_len = 0;
        r->last = LAST_VALUE;
    }
    agw_buf_append(&r->hstore, at, len);
    h->value_len += len;
    return 0;
}

/* Returns 1 when no body follows (1xx, HEAD, 204, 304), -1 to stop at once when Content-Length
 * announces a body over max_body, the status is not one, or it is 101. */
static int on_headers_complete(http_parser *p)
{
    agw_h1_response_t *r = p->data;
    r->nheaders = r->nhdrs;
    r->last = LAST_NONE;
    if (p->status_code < 100)
        return -1; /* not an HTTP status (RFC 9110 §15: three digits, 1xx to 5xx): a bad response */
    /* 101: the bytes after it are another protocol, which no request of ours asked for (we never
     * send Upgrade, RFC 9110 §15.2.2): a bad response, not an interim one to wait past */
    if (p->status_code == 101)
        return -1;
    /* 1xx, HEAD, 204 and 304 end at the headers, whatever Content-Length or Transfer-Encoding
     * says (RFC 9112 §6.3); an interim response's final one follows */
    if (p->status_code < 200)
        return 1;
    r->final_headers = 1;
    if (r->head || p->status_code == 204 || p->status_code == 304)
        return 1;
    if (!(p->flags & F_CHUNKED) && p->content_length != UINT64_MAX) {
        r->expect_len = p->content_length;
        if (r->max_body && p->content_length > r->max_body) {
            r->too_large = 1;
            return -1;
        }
        /* sized ahead from Content-Length up to PRESIZE_MAX; beyond, the buffer grows with the
         * bytes that arrive, so a length that lies (or a large max_body_bytes) reserves nothing
         * an upstream does not send (a length of 10^12 with no limit aborted on malloc) */
        if (p->content_length)
            agw_buf_reserve(&r->body, p->content_length < PRESIZE_MAX ? (size_t)p->content_length : PRESIZE_MAX);
    }
    return 0;
}

/* A chunk whose size line takes the body over max_body stops at once, as Content-Length does. */
static int on_chunk_header(http_parser *p)
{
    agw_h1_response_t *r = p->data;
    if (r->max_body && p->content_length > r->max_body - r->body.len) {
        r->too_large = 1;
        return -1;
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    agw_h1_response_t *r = p->data;
    if (r->max_body && len > r->max_body - r->body.len) {
        r->too_large = 1;
        return -1;
    }
    agw_buf_append(&r->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    agw_h1_response_t *r = p->data;
    if (p->status_code < 200)
        return 0; /* interim response (100 Continue, 103 Early Hints): the final one follows */
    r->done = 1;
    r->keep_alive = http_should_keep_alive(p) != 0;
    http_parser_pause(p, 1); /* stop right after it: later bytes are no response of ours */
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
};

void agw_h1_response_start(agw_h1_response_t *r, int head, size_t max_body)
{
    http_parser_init(&r->parser, HTTP_RESPONSE);
    r->parser.data = r;
    r->max_body = max_body;
    r->bytes = 0;
    /* no bytes of an earlier response (the buffers swapped in may hold one) until the first byte
     * of this one (on_message_begin resets them again after a 1xx) */
    agw_buf_reset(&r->body);
    agw_buf_reset(&r->hstore);
    r->nhdrs = r->nheaders = 0;
    r->expect_len = UINT64_MAX;
    r->head = head != 0;
    r->final_headers = r->done = r->keep_alive = r->too_large = 0;
}

size_t agw_h1_response_feed(agw_h1_response_t *r, const char *p, size_t n)
{
    r->bytes += n;
    return http_parser_execute(&r->parser, &settings, p, n);
}

void agw_h1_response_eof(agw_h1_response_t *r)
{
    if (!r->final_headers)
        return;
    http_parser_execute(&r->parser, &settings, NULL, 0);
    r->keep_alive = 0;
}

agw_call_outcome_t agw_h1_response_failed(const agw_h1_response_t *r)
{
    if (r->too_large)
        return AGW_CALL_TOO_LARGE;
    if (r->done)
        return AGW_CALL_OK;
    if (r->parser.upgrade || HTTP_PARSER_ERRNO(&r->parser) != HPE_OK)
        return AGW_CALL_BAD_RESPONSE;
    return AGW_CALL_OK;
}

void agw_h1_response_describe(const agw_h1_response_t *r, char *out, size_t cap)
{
    if (r->too_large && r->expect_len != UINT64_MAX)
        snprintf(out, cap, "response body of %llu bytes is over max_body_bytes (%zu)",
                 (unsigned long long)r->expect_len, r->max_body);
    else if (r->too_large)
        snprintf(out, cap, "response body is over max_body_bytes (%zu)", r->max_body);
    else if (r->parser.upgrade || (HTTP_PARSER_ERRNO(&r->parser) == HPE_CB_headers_complete &&
                                   r->parser.status_code == 101))
        snprintf(out, cap, "unexpected protocol upgrade (status %u)", r->parser.status_code);
    else if (HTTP_PARSER_ERRNO(&r->parser) == HPE_CB_headers_complete)
        snprintf(out, cap, "invalid HTTP response: status %u is not an HTTP status", r->parser.status_code);
    else
        snprintf(out, cap, "invalid HTTP response after %zu bytes: %s (%s)", r->bytes,
                 http_errno_description(HTTP_PARSER_ERRNO(&r->parser)),
                 http_errno_name(HTTP_PARSER_ERRNO(&r->parser)));
}

void agw_h1_response_swap(agw_h1_response_t *r, agw_buf_t *body, agw_buf_t *hstore)
{
    agw_buf_t t = r->body;
    r->body = *body;
    *body = t;
    t = r->hstore;
    r->hstore = *hstore;
    *hstore = t;
}

void agw_h1_response_free(agw_h1_response_t *r)
{
    agw_buf_free(&r->body);
    agw_buf_free(&r->hstore);
    free(r->hdrs);
    r->hdrs = NULL;
    r->nhdrs = r->hdrs_cap = 0;
}
