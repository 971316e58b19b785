/*
 * mock_response.c -- turning a matched route, and its fault, into bytes on the wire.
 *
 * This module decides what the bytes are (heads, bodies, chunk framing, the broken variants);
 * mock_conn.c decides when and how they leave (delay, cut, drip, RST, streaming). A route's
 * status line and headers are formatted once, when the route is installed.
 */
#include "mock.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Scratch space for rendering a body before its length is known; single-threaded process. */
static agw_buf_t scratch;

static bool valid_header_name(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
            return false;
    return true;
}

int mock_response_prepare(mock_route *r, const char *content_type, json_t *headers, char *err,
                          size_t errlen)
{
    agw_buf_t extra = {0}, extra_no_ct = {0}, head = {0}, head_json = {0};
    const char *user_ct = NULL;
    const char *name;
    json_t *val;
    json_object_foreach(headers, name, val) {
        const char *v = json_string_value(val);
        if (!valid_header_name(name)) {
            snprintf(err, errlen, "headers.%s: not a valid header name", name);
            goto fail;
        }
        if (!v || strpbrk(v, "\r\n")) {
            snprintf(err, errlen, "headers.%s: must be a string without CR or LF", name);
            goto fail;
        }
        if (!strcasecmp(name, "Content-Length") || !strcasecmp(name, "Transfer-Encoding") ||
            !strcasecmp(name, "Connection")) {
            snprintf(err, errlen, "headers.%s: set by the mock itself (see the faults for "
                                  "broken framing)", name);
            goto fail;
        }
        agw_buf_printf(&extra, "%s: %s\r\n", name, v);
        if (!strcasecmp(name, "Content-Type"))
            user_ct = v;
        else
            agw_buf_printf(&extra_no_ct, "%s: %s\r\n", name, v);
    }
    agw_buf_printf(&head, "HTTP/1.1 %d %s\r\n", r->status, agw_http_reason(r->status));
    agw_buf_append(&head_json, head.base, head.len);
    if (content_type && !user_ct)
        agw_buf_printf(&head, "Content-Type: %s\r\n", content_type);
    agw_buf_append(&head, extra.base, extra.len);
    agw_buf_puts(&head_json, "Content-Type: application/json\r\n");
    agw_buf_append(&head_json, extra_no_ct.base, extra_no_ct.len);
    r->head = head.base;
    r->head_json = head_json.base;
    agw_buf_free(&extra);
    agw_buf_free(&extra_no_ct);
    return 0;
fail:
    agw_buf_free(&extra);
    agw_buf_free(&extra_no_ct);
    return -1;
}

static const char *connection_header(const mock_request *req)
{
    if (!req->keep_alive)
        return "Connection: close\r\n";
    return req->http10 ? "Connection: keep-alive\r\n" : "";
}

/* FNV-1a, 32 bits: the X-Checksum trailer of the chunked fault. */
static uint32_t fnv1a(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

/* Rewrites the JSON body in scratch so that it carries \xff\xfe inside a string value. */
static void inject_invalid_utf8(void)
{
    static const char bad[] = "\"bad \xff\xfe bytes\"";
    agw_buf_t out = {0};
    char first = scratch.len ? scratch.base[0] : 0;
    if (first == '{' && scratch.len > 2) {
        agw_buf_puts(&out, "{\"invalid\":");
        agw_buf_puts(&out, bad);
        agw_buf_puts(&out, ",");
        agw_buf_append(&out, scratch.base + 1, scratch.len - 1);
    } else if (first == '[' && scratch.len > 2) {
        agw_buf_puts(&out, "[");
        agw_buf_puts(&out, bad);
        agw_buf_puts(&out, ",");
        agw_buf_append(&out, scratch.base + 1, scratch.len - 1);
    } else {
        agw_buf_puts(&out, "{\"invalid\":");
        agw_buf_puts(&out, bad);
        agw_buf_puts(&out, "}");
    }
    agw_buf_free(&scratch);
    scratch = out;
}

/* Appends scratch as a chunked body: up to four chunks, then the X-Checksum trailer. */
static void append_chunked(agw_buf_t *b)
{
    size_t step = (scratch.len + 3) / 4;
    for (size_t off = 0; off < scratch.len; off += step) {
        size_t n = scratch.len - off < step ? scratch.len - off : step;
        agw_buf_printf(b, "%zx\r\n", n);
        agw_buf_append(b, scratch.base + off, n);
        agw_buf_puts(b, "\r\n");
    }
    agw_buf_printf(b, "0\r\nX-Checksum: %08x\r\n\r\n", fnv1a(scratch.base, scratch.len));
}

static bool each_missing(const mock_route *r, const char *v, size_t n)
{
    size_t k;
    json_t *m;
    json_array_foreach(r->each_missing, k, m) {
        if (json_string_length(m) == n && memcmp(json_string_value(m), v, n) == 0)
            return true;
    }
    return false;
}

/* Appends the route's body for request params p: the template, or with `each` a JSON array of
 * one rendered copy per comma-separated value of that query parameter ({each} = the value). */
static void render_body(const mock_route *r, const mock_params *p, agw_buf_t *out)
{
    if (!r->each) {
        mock_template_render(&r->body, p, out);
        return;
    }
    const char *v = NULL;
    size_t vlen = 0;
    agw_buf_puts(out, "[");
    bool first = true;
    if (mock_params_get(p, r->each, strlen(r->each), &v, &vlen) && p->n < MOCK_MAX_PARAMS) {
        const char *end = v + vlen;
        while (v < end) {
            const char *comma = memchr(v, ',', (size_t)(end - v));
            const char *vend = comma ? comma : end;
            size_t n = (size_t)(vend - v);
            if (n > 0 && !each_missing(r, v, n)) {
                mock_params q = *p;
                q.v[q.n].name = "each";
                q.v[q.n].name_len = 4;
                q.v[q.n].val = v;
                q.v[q.n].val_len = n;
                q.n++;
                if (!first)
                    agw_buf_puts(out, ",");
                first = false;
                mock_template_render(&r->body, &q, out);
            }
            v = comma ? comma + 1 : end;
        }
    }
    agw_buf_puts(out, "]");
}

void mock_response_route(mock_conn *c, const mock_request *req, const mock_route *r,
                         const mock_params *p, mock_fault fault, ev_tstamp delay_s)
{
    static const char html[] = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>"
                               "<body><h1>Bad Gateway</h1><p>upstream error</p></body></html>\n";
    static const char garbage[] = "\x16\x03\x01\x00\xff NOT HTTP \x00\x01\x02 garbage\r\n\r\n";
    mock_reply rp = {
        .fault = fault,
        .delay_s = delay_s,
        .huge_bytes = r->huge_bytes,
        .drip_s = r->drip_s,
        .idle_close_s = r->idle_close_s,
        .close = !req->keep_alive || fault == MOCK_FAULT_GARBAGE,
    };
    agw_buf_t *b = mock_conn_reply_begin(c, &rp);
    size_t start = b->len, cut = 0;
    switch (fault) {
    case MOCK_FAULT_HANG:
        break;
    case MOCK_FAULT_GARBAGE:
        agw_buf_append(b, garbage, sizeof garbage - 1);
        break;
    case MOCK_FAULT_HUGE:
        agw_buf_printf(b, "%sContent-Length: %llu\r\n%s\r\n", r->head_json,
                        (unsigned long long)r->huge_bytes, connection_header(req));
        break;
    case MOCK_FAULT_CHUNKED:
        scratch.len = 0;
        render_body(r, p, &scratch);
        agw_buf_printf(b, "%sTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n%s\r\n",
                        r->head, connection_header(req));
        if (!req->head)
            append_chunked(b);
        break;
    default: {
        const char *head = r->head;
        scratch.len = 0;
        if (fault == MOCK_FAULT_NON_JSON) {
            head = r->head_json;
            agw_buf_append(&scratch, html, sizeof html - 1);
        } else {
            render_body(r, p, &scratch);
            if (fault == MOCK_FAULT_INVALID_UTF8) {
                head = r->head_json;
                inject_invalid_utf8();
            }
        }
        agw_buf_printf(b, "%sContent-Length: %zu\r\n%s\r\n", head, scratch.len,
                        connection_header(req));
        cut = b->len - start + scratch.len / 2;
        if (!req->head)
            agw_buf_append(b, scratch.base, scratch.len);
        break;
    }
    }
    bool cutting = fault == MOCK_FAULT_RESET || fault == MOCK_FAULT_SHORT;
    mock_conn_reply_end(c, cutting ? cut : 0);
}

void mock_response_simple(mock_conn *c, const mock_request *req, int status,
                          const char *content_type, const char *body, size_t len)
{
    mock_reply rp = {.fault = MOCK_FAULT_NONE, .close = !req->keep_alive};
    agw_buf_t *b = mock_conn_reply_begin(c, &rp);
    agw_buf_printf(b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n",
                    status, agw_http_reason(status), content_type, len, connection_header(req));
    if (!req->head)
        agw_buf_append(b, body, len);
    mock_conn_reply_end(c, 0);
}

void mock_response_json(mock_conn *c, const mock_request *req, int status, json_t *json)
{
    static const char fallback[] = "{\"error\":\"answer not encodable as JSON\"}";
    char *text = json ? json_dumps(json, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15))
                     : NULL;
    if (text)
        mock_response_simple(c, req, status, "application/json", text, strlen(text));
    else
        mock_response_simple(c, req, 500, "application/json", fallback, sizeof fallback - 1);
    free(text);
    json_decref(json);
}

/* The huge body is {"items":[0,0,...,0]}, padded with one space after '[' when needed so that
 * it is exactly total bytes (total >= 16). Any byte can be computed from its offset, so the
 * body is streamed without ever being held in memory. */
void mock_response_huge_fill(agw_buf_t *out, uint64_t total, uint64_t off, size_t n)
{
    static const char prefix[] = "{\"items\":[";
    const uint64_t plen = sizeof prefix - 1, middle = total - plen - 2;
    agw_buf_reserve(out, n);
    char *dst = out->base + out->len;
    for (size_t k = 0; k < n; k++) {
        uint64_t i = off + k;
        char ch;
        if (i < plen) {
            ch = prefix[i];
        } else if (i >= total - 2) {
            ch = i == total - 2 ? ']' : '}';
        } else {
            uint64_t j = i - plen;
            if (middle % 2 == 0) { /* even middle: one leading space, then an odd "0,...,0" */
                if (j == 0) {
                    dst[k] = ' ';
                    continue;
                }
                j--;
            }
            ch = (j % 2 == 0) ? '0' : ',';
        }
        dst[k] = ch;
    }
    out->len += n;
    out->base[out->len] = '\0';
}
