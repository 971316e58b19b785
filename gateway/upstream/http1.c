/* upstream/http1.c: HTTP/1.1 request encoding and response framing (see upstream/http1.h). */
#include "upstream/http1.h"

#include "base/dotseg.h"
#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

/* Most body bytes reserved from a Content-Length before they arrive. */
#define PRESIZE_MAX (1024 * 1024)

/* ---- request -------------------------------------------------------------------------- */

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

/* Whether the request says Content-Length: it has a body, or its method defines a meaning for
 * one (POST, PUT, PATCH: RFC 9110 §8.6, a user agent should send it then even for 0 bytes). By the
 * first byte first: a GET costs one compare, not three calls to strcmp (twice a call). */
static int sends_length(const agw_call_req_t *req)
{
    const char *m = req->method;
    return req->body != NULL || req->body_len > 0 ||
           (m[0] == 'P' && (strcmp(m + 1, "OST") == 0 || strcmp(m + 1, "UT") == 0 || strcmp(m + 1, "ATCH") == 0));
}

int agw_h1_method_idempotent(const char *m)
{
    static const char *const idempotent[] = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"};
    for (size_t i = 0; i < sizeof(idempotent) / sizeof(idempotent[0]); i++)
        if (strcmp(m, idempotent[i]) == 0)
            return 1;
    return 0;
}


/* agw_h1_request_invalid's mark of a path byte that may begin a dot segment ('.', '%2e'). */
#define DOTS 5

const char *agw_h1_request_invalid(const char *method, const char *path, size_t path_len,
                                   const agw_header_t *headers, size_t num_headers)
{
    if (!agw_header_is_token(method, method ? strlen(method) : 0))
        return "method is not an HTTP token";
    if (path_len == 0 || path[0] != '/')
        return "path does not start with '/'";
    /* the request target is sent as the script built it: a byte that is not a URI character
     * would be sent raw (RFC 3986 §2: non-ASCII must be percent-encoded) and a '#' would cut the
     * path at a fragment the upstream never sees (§3.5) */
    static const unsigned char BAD[256] = {[0 ... ' '] = 1, [0x7f] = 1, [0x80 ... 0xff] = 2, ['#'] = 3, ['\\'] = 4,
                                           ['.'] = DOTS, ['%'] = DOTS};
    static const char *const why[] = {
        NULL, "path contains a space or a control character (CR, LF, NUL, ...)",
        "path contains a byte that is not ASCII (percent-encode it: agg.escape)",
        "path contains '#', which would start a fragment (percent-encode it: agg.escape)",
        "path contains '\\', which is no URI character and which upstreams may read as '/' (percent-encode it: "
        "agg.escape)"};
    int dots = 0; /* a '.' or a '%': a dot segment is possible */
    for (size_t i = 0; i < path_len; i++) {
        unsigned char b = BAD[(unsigned char)path[i]];
        if (b == DOTS)
            dots = 1;
        else if (b)
            return why[b];
    }
    /* a dot segment would be resolved by the upstream into another path than the one written:
     * "/users/" .. v .. "/orders" with v ".." or "%2e%2e" reaches "/orders" (RFC 3986 §5.2.4). Its
     * ends are '/' and also the escapes %2F and %5C, which servers that decode before they
     * resolve dots (nginx) read as '/': agg.escape("../admin") is "..%2Fadmin" */
    for (size_t i = 1, seg = 1; dots && i <= path_len; i++) { /* (none: "/products/42", the common case) */
        size_t sep = 0; /* the separator's length at i, 0 when path[i] is none */
        if (i == path_len || path[i] == '/' || path[i] == '?')
            sep = 1;
        else if (path[i] == '%' && i + 2 < path_len &&
                 ((path[i + 1] == '2' && (path[i + 2] == 'f' || path[i + 2] == 'F')) ||
                  (path[i + 1] == '5' && (path[i + 2] == 'c' || path[i + 2] == 'C'))))
            sep = 3;
        if (sep == 0)
            continue;
        if (i > seg && (path[seg] == '.' || path[seg] == '%') && agw_dot_segment(path + seg, i - seg))
            return "path contains a dot segment ('..', '.', '%2e%2e', '..;', '..%2F'), which the upstream would "
                   "resolve into another path";
        if (i < path_len && path[i] == '?')
            break;
        seg = i + sep;
        i += sep - 1;
    }
    for (size_t i = 0; i < num_headers; i++) {
        const agw_header_t *h = &headers[i];
        if (!agw_header_is_token(h->name, h->name_len))
            return "header name is empty or not an HTTP token";
        /* field values are visible characters, spaces and HTABs (RFC 9110 §5.5): CR, LF and NUL
         * would split or cut the request, the other controls (VT, FF, ESC, DEL …) are refused too */
        if (agw_header_has_control(h->value, h->value_len))
            return "header value contains a control character (only HTAB is allowed)";
    }
    return NULL;
}

size_t agw_h1_request_size(const agw_upstream_conf_t *conf, const agw_call_req_t *req,
                           const char **why)
{
    /* the caller's own fields are not checked again; a count past the fields trusts none */
    size_t checked = req->num_own <= req->num_headers ? req->num_headers - req->num_own : req->num_headers;
    if ((*why = agw_h1_request_invalid(req->method, req->path, req->path_len, req->headers, checked)))
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

/* Fields parsed into an array on the stack; a section with more takes one from the heap. */
#define STACK_FIELDS 32

/* Reasons agw_h1_response_describe() words apart from the others. */
static const char E_STATUS[] = "status is not an HTTP status";
static const char E_UPGRADE[] = "unexpected protocol upgrade";

static void fail(agw_h1_response_t *r, const char *why)
{
    r->error = why;
    r->state = AGW_H1_END;
}

static void finish(agw_h1_response_t *r)
{
    r->done = 1;
    r->state = AGW_H1_END;
}

static void truncate_buf(agw_buf_t *b, size_t len)
{
    b->len = len;
    if (b->base)
        b->base[len] = '\0';
}

#define DIGIT(c) ((unsigned char)((c) - '0') <= 9)

/* The status line "HTTP/1.<digit> <3 digits>[ <reason>]" (RFC 9112 §4), byte by byte: what each
 * of its first 12 bytes may be ('d': a digit). */
static const char STATUS_FORM[] = "HTTP/1.d ddd";

/* Whether the n bytes at line could start a status line (so that bytes that are no HTTP, a TLS
 * alert or another protocol's greeting, fail at once instead of when a line end comes). */
static int status_prefix(const char *line, size_t n)
{
    for (size_t i = 0; i < n && i < sizeof(STATUS_FORM) - 1; i++)
        if (STATUS_FORM[i] == 'd' ? !DIGIT(line[i]) : line[i] != STATUS_FORM[i])
            return 0;
    /* after the status code: the reason's space or the line's end */
    return n <= 12 || line[12] == ' ' || line[12] == '\r' || line[12] == '\n';
}

/* Reads the status line (line: len bytes up to and with its LF; the reason phrase is not kept,
 * RFC 9112 §4, but may hold no control character but HTAB, a bare CR included, §2.2). Returns 0,
 * or -1 with r->error set. */
static int status_line(agw_h1_response_t *r, const char *line, size_t len)
{
    len -= len >= 2 && line[len - 2] == '\r' ? 2 : 1;
    int ok = len >= 12 && memcmp(line, "HTTP/1.", 7) == 0 && DIGIT(line[7]) && line[8] == ' ' && DIGIT(line[9]) &&
             DIGIT(line[10]) && DIGIT(line[11]) && (len == 12 || line[12] == ' ');
    for (size_t i = 13; ok && i < len; i++)
        ok = ((unsigned char)line[i] >= 0x20 && line[i] != 0x7f) || line[i] == '\t';
    if (!ok) {
        fail(r, "no status line \"HTTP/1.x NNN reason\"");
        return -1;
    }
    r->minor = line[7] - '0';
    r->status = (unsigned)(line[9] - '0') * 100 + (unsigned)(line[10] - '0') * 10 + (unsigned)(line[11] - '0');
    return 0;
}

static void hdrs_room(agw_h1_response_t *r, size_t n)
{
    if (n <= r->hdrs_cap)
        return;
    size_t cap = r->hdrs_cap ? r->hdrs_cap : 16;
    while (cap < n)
        cap *= 2;
    r->hdrs = agw_realloc(r->hdrs, cap * sizeof(*r->hdrs));
    r->hdrs_cap = cap;
}

/* Whether fields (len bytes, a line starting at 0) hold the empty line that ends a section,
 * looking at the line ends from `from` on (those before it were looked at already). */
static int has_end(const char *fields, size_t len, size_t from)
{
    for (const char *q = fields + from, *e = fields + len; (q = memchr(q, '\n', (size_t)(e - q))) != NULL; q++) {
        size_t j = (size_t)(q - fields);
        if (j == 0 || q[-1] == '\n' || (q[-1] == '\r' && (j == 1 || q[-2] == '\n')))
            return 1;
    }
    return 0;
}

/* Calls phr_parse_headers on a section's fields (buf, len bytes) into ph (room entries), or,
 * when they are more, into a heap array of one entry per line. Returns its answer; *out is the
 * array that holds the fields (the caller frees it when it is not ph). */
static int parse_fields(const char *buf, size_t len, struct phr_header *ph, size_t room, struct phr_header **out,
                        size_t *num)
{
    *out = ph;
    *num = room;
    int ret = phr_parse_headers(buf, len, ph, num, 0);
    if (ret != -1 || *num < room)
        return ret; /* parsed, incomplete, or malformed before the array was full */
    size_t lines = 1;
    for (const char *q = buf; (q = memchr(q, '\n', (size_t)(buf + len - q))) != NULL; q++)
        lines++;
    *out = agw_malloc(lines * sizeof(**out));
    *num = lines;
    return phr_parse_headers(buf, len, *out, num, 0);
}

/* Case-insensitive comparison of an ASCII token with a lowercase one. */
static int token_is(const char *s, size_t len, const char *lower, size_t lower_len)
{
    return len == lower_len && strncasecmp(s, lower, len) == 0;
}

/* The next element of a comma-separated list (RFC 9110 §5.6.1: empty elements and the spaces
 * around elements are skipped) from *p (before end): 1 with *tok and *len set and *p past it, 0
 * when there is none. */
static int next_token(const char **p, const char *end, const char **tok, size_t *len)
{
    const char *q = *p;
    while (q < end && (*q == ' ' || *q == '\t' || *q == ','))
        q++;
    if (q == end) {
        *p = q;
        return 0;
    }
    const char *start = q;
    while (q < end && *q != ',')
        q++;
    const char *stop = q;
    while (stop > start && (stop[-1] == ' ' || stop[-1] == '\t'))
        stop--;
    *tok = start;
    *len = (size_t)(stop - start);
    *p = q;
    return 1;
}

/* Content-Length's value (RFC 9110 §8.6: 1*DIGIT; the spaces around it are allowed): 0 with
 * *out set, -1 when it is not one or over UINT64_MAX - 1 (UINT64_MAX means "none"). */
static int parse_length(const char *v, size_t len, uint64_t *out)
{
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    if (len == 0)
        return -1;
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, (unsigned)(v[i] - '0'), &n))
            return -1;
    }
    if (n == UINT64_MAX)
        return -1;
    *out = n;
    return 0;
}

/* Framing of a response whose header section is complete (fields hdrs[0, nhdrs)): says how its
 * body is delimited (RFC 9112 §6.3) and whether the connection may carry another request. */
static void on_header_section(agw_h1_response_t *r)
{
    uint64_t length = UINT64_MAX;
    int has_te = 0, chunked = 0, close = 0, keep = 0;
    for (size_t i = 0; i < r->nhdrs; i++) {
        const agw_h1_hdr_t *h = &r->hdrs[i];
        const char *name = r->hstore.base + h->name_off, *v = r->hstore.base + h->value_off;
        const char *end = v + h->value_len, *tok;
        size_t tlen;
        if (token_is(name, h->name_len, "content-length", 14)) {
            /* one field, one number: duplicates (even equal ones, RFC 9110 §8.6 allows refusing
             * them) and lists could frame the body two ways */
            if (length != UINT64_MAX) {
                fail(r, "more than one Content-Length");
                return;
            }
            if (parse_length(v, h->value_len, &length) < 0) {
                fail(r, "Content-Length is not a number");
                return;
            }
        } else if (token_is(name, h->name_len, "transfer-encoding", 17)) {
            has_te = 1;
            while (next_token(&v, end, &tok, &tlen))
                chunked = token_is(tok, tlen, "chunked", 7); /* the last coding decides */
        } else if (token_is(name, h->name_len, "connection", 10)) {
            while (next_token(&v, end, &tok, &tlen)) {
                close |= token_is(tok, tlen, "close", 5);
                keep |= token_is(tok, tlen, "keep-alive", 10);
            }
        }
    }
    /* both: one of them lies, and which one depends on who reads (RFC 9112 §6.3 point 3: ought
     * to be handled as an error; request smuggling and response splitting use it) */
    if (has_te && length != UINT64_MAX) {
        fail(r, "both Transfer-Encoding and Content-Length");
        return;
    }
    if (r->status < 100) {
        fail(r, E_STATUS);
        return;
    }
    /* 101: the bytes after it are another protocol (we never send Upgrade, RFC 9110 §15.2.2) */
    if (r->status == 101) {
        fail(r, E_UPGRADE);
        return;
    }
    if (r->status < 200) {
        /* interim (100 Continue, 103 Early Hints): ends here, the final one follows; only the
         * final one's fields are kept */
        agw_buf_reset(&r->hstore);
        r->nhdrs = 0;
        r->line_len = r->seen = 0;
        return;
    }
    r->final_headers = 1;
    r->nheaders = r->nhdrs;
    r->keep_alive = r->minor >= 1 ? !close : keep;
    if (r->head || r->status == 204 || r->status == 304) {
        finish(r); /* no body, whatever the fields say (RFC 9112 §6.3 point 1) */
        return;
    }
    if (has_te && chunked) {
        memset(&r->chunked, 0, sizeof(r->chunked)); /* consume_trailer 0: trailers are read here */
        r->state = AGW_H1_CHUNKED;
    } else if (length != UINT64_MAX && !has_te) {
        r->expect_len = r->left = length;
        if (r->max_body && length > r->max_body) {
            r->too_large = 1;
            r->state = AGW_H1_END;
            return;
        }
        /* sized ahead from Content-Length up to PRESIZE_MAX; beyond, the buffer grows with the
         * bytes that arrive, so a length that lies (or a large max_body_bytes) reserves nothing
         * an upstream does not send (a length of 10^12 with no limit aborted on malloc) */
        if (length)
            agw_buf_reserve(&r->body, length < PRESIZE_MAX ? (size_t)length : PRESIZE_MAX);
        r->state = AGW_H1_LENGTH;
        if (length == 0)
            finish(r);
    } else {
        /* neither, or a coding other than chunked last: the body ends at the close (§6.3
         * points 4 and 8) */
        r->keep_alive = 0;
        r->state = AGW_H1_TO_EOF;
    }
}

/* Reads a header section (trailers 0: status line and fields) or the trailer section (1) from
 * p (n bytes), keeping its bytes in hstore from r->section on. The section is read where it
 * lies when one read holds all of it, and gathered in hstore when it spans reads (a section is
 * parsed again from its start then, with only the new bytes looked at for its end). Returns the
 * bytes of p used; r->state tells what follows. */
static size_t read_section(agw_h1_response_t *r, const char *p, size_t n, int trailers)
{
    size_t prev = r->hstore.len - r->section; /* bytes of the section from earlier reads */
    const char *buf = p;
    size_t len = n;
    if (prev) {
        size_t take = n < AGW_H1_MAX_HEADER_BYTES + 1 - prev ? n : AGW_H1_MAX_HEADER_BYTES + 1 - prev;
        agw_buf_append(&r->hstore, p, take);
        buf = r->hstore.base + r->section;
        len = prev + take;
    }
    size_t skip = 0; /* the status line */
    if (!trailers && !prev && (*p == '\r' || *p == '\n')) {
        /* empty lines before a status line (after a body that an upstream ended with one CRLF
         * too many) are skipped, as RFC 9112 §2.2 asks of servers before a request line */
        size_t k = 0;
        while (k < n && (p[k] == '\r' || p[k] == '\n'))
            k++;
        return k;
    }
    if (!trailers) {
        if (!r->line_len) {
            const char *lf = memchr(buf + r->seen, '\n', len - r->seen);
            if (lf == NULL) {
                if (r->seen <= sizeof(STATUS_FORM) - 1 && !status_prefix(buf, len)) {
                    fail(r, "no status line \"HTTP/1.x NNN reason\"");
                    return 0;
                }
                goto incomplete;
            }
            if (status_line(r, buf, (size_t)(lf - buf) + 1) < 0)
                return 0;
            r->line_len = r->seen = (size_t)(lf - buf) + 1;
        }
        skip = r->line_len;
    }
    /* gathered over reads: parsed once the new bytes hold its end */
    if (prev && !has_end(buf + skip, len - skip, r->seen > skip ? r->seen - skip : 0))
        goto incomplete;
    struct phr_header stack[STACK_FIELDS], *ph;
    size_t num;
    int ret = parse_fields(buf + skip, len - skip, stack, STACK_FIELDS, &ph, &num);
    /* a malformed field is told once the section's end has come, as it is when the section is
     * gathered: the same bytes fail the same way however reads cut them */
    if (ret == -1 && !prev && !has_end(buf + skip, len - skip, 0))
        ret = -2;
    if (ret == -2) {
        if (ph != stack)
            free(ph);
        goto incomplete;
    }
    size_t end = ret < 0 ? 0 : skip + (size_t)ret;
    if (ret < 0 || end > AGW_H1_MAX_HEADER_BYTES) {
        if (ph != stack)
            free(ph);
        fail(r, ret < 0 ? (trailers ? "malformed trailer field" : "malformed header field")
                        : (trailers ? "trailer section over 80 KiB" : "header section over 80 KiB"));
        return 0;
    }
    if (prev)
        truncate_buf(&r->hstore, r->section + end);
    else
        agw_buf_append(&r->hstore, p, end);
    hdrs_room(r, r->nhdrs + num);
    for (size_t i = 0; i < num; i++) {
        if (ph[i].name == NULL) {
            /* a line folded onto the one before: RFC 9112 §5.2 lets a gateway refuse it */
            if (ph != stack)
                free(ph);
            fail(r, trailers ? "folded trailer field (obs-fold)" : "folded header field (obs-fold)");
            return 0;
        }
        agw_h1_hdr_t *h = &r->hdrs[r->nhdrs++];
        h->name_off = r->section + (size_t)(ph[i].name - buf);
        h->name_len = ph[i].name_len;
        h->value_off = r->section + (size_t)(ph[i].value - buf);
        h->value_len = ph[i].value_len;
    }
    if (ph != stack)
        free(ph);
    if (trailers)
        finish(r);
    else
        on_header_section(r);
    return end - prev;

incomplete:
    if (len > AGW_H1_MAX_HEADER_BYTES) {
        fail(r, trailers ? "trailer section over 80 KiB" : "header section over 80 KiB");
        return 0;
    }
    if (!prev)
        agw_buf_append(&r->hstore, p, n);
    r->seen = len;
    return n;
}

/* Reads chunked body bytes: decoded into the body in place (the bytes are appended, then
 * phr_decode_chunked takes out the framing). The limit is checked against the body so far plus
 * what the current chunk's size line announces, which only grows with more bytes: read in one
 * piece or many, the same bytes fail the same way. */
static size_t read_chunked(agw_h1_response_t *r, const char *p, size_t n)
{
    size_t before = r->body.len, got = n;
    agw_buf_append(&r->body, p, n);
    ssize_t rest = phr_decode_chunked(&r->chunked, r->body.base + before, &got);
    truncate_buf(&r->body, before + got);
    if (r->max_body &&
        (r->body.len > r->max_body || r->chunked.bytes_left_in_chunk > r->max_body - r->body.len)) {
        truncate_buf(&r->body, before);
        r->too_large = 1;
        r->state = AGW_H1_END;
        return 0;
    }
    if (rest == -1) {
        fail(r, "malformed chunk");
        return 0;
    }
    if (rest == -2)
        return n;
    /* the last chunk: the trailer section follows */
    r->state = AGW_H1_TRAILERS;
    r->section = r->hstore.len;
    r->seen = 0;
    return n - (size_t)rest;
}

void agw_h1_response_start(agw_h1_response_t *r, int head, size_t max_body)
{
    r->max_body = max_body;
    r->bytes = 0;
    /* no bytes of an earlier response (the buffers swapped in may hold one) */
    agw_buf_reset(&r->body);
    agw_buf_reset(&r->hstore);
    r->nhdrs = r->nheaders = 0;
    r->expect_len = UINT64_MAX;
    r->left = 0;
    r->status = 0;
    r->minor = 0;
    r->line_len = r->seen = r->section = 0;
    r->error = NULL;
    r->state = AGW_H1_HEAD;
    r->head = head != 0;
    r->final_headers = r->done = r->keep_alive = r->too_large = 0;
}

size_t agw_h1_response_feed(agw_h1_response_t *r, const char *p, size_t n)
{
    size_t off = 0;
    r->bytes += n;
    while (off < n) {
        size_t take;
        switch (r->state) {
        case AGW_H1_HEAD:
            off += read_section(r, p + off, n - off, 0);
            break;
        case AGW_H1_LENGTH:
            take = n - off < r->left ? n - off : (size_t)r->left;
            agw_buf_append(&r->body, p + off, take);
            off += take;
            r->left -= take;
            if (r->left == 0)
                finish(r);
            break;
        case AGW_H1_CHUNKED:
            off += read_chunked(r, p + off, n - off);
            break;
        case AGW_H1_TRAILERS:
            off += read_section(r, p + off, n - off, 1);
            break;
        case AGW_H1_TO_EOF:
            if (r->max_body && n - off > r->max_body - r->body.len) {
                r->too_large = 1;
                r->state = AGW_H1_END;
                return off;
            }
            agw_buf_append(&r->body, p + off, n - off);
            off = n;
            break;
        case AGW_H1_END:
            return off;
        }
    }
    return off;
}

void agw_h1_response_eof(agw_h1_response_t *r)
{
    if (!r->final_headers)
        return;
    if (r->state == AGW_H1_TO_EOF)
        finish(r);
    r->keep_alive = 0;
}

agw_call_outcome_t agw_h1_response_failed(const agw_h1_response_t *r)
{
    if (r->too_large)
        return AGW_CALL_TOO_LARGE;
    if (r->done)
        return AGW_CALL_OK;
    return r->error ? AGW_CALL_BAD_RESPONSE : AGW_CALL_OK;
}

void agw_h1_response_describe(const agw_h1_response_t *r, char *out, size_t cap)
{
    if (r->too_large && r->expect_len != UINT64_MAX)
        snprintf(out, cap, "response body of %llu bytes is over max_body_bytes (%zu)",
                 (unsigned long long)r->expect_len, r->max_body);
    else if (r->too_large)
        snprintf(out, cap, "response body is over max_body_bytes (%zu)", r->max_body);
    else if (r->error == E_UPGRADE)
        snprintf(out, cap, "unexpected protocol upgrade (status %u)", r->status);
    else if (r->error == E_STATUS)
        snprintf(out, cap, "invalid HTTP response: status %u is not an HTTP status", r->status);
    else
        snprintf(out, cap, "invalid HTTP response after %zu bytes: %s", r->bytes, r->error ? r->error : "?");
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
