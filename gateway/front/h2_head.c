/* h2_head.c: an HTTP/2 response head's Server-Timing sent without indexing (h2_head.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include "front/h2_head.h"
#include "base/h2_frame.h"
#include "front/interpose.h"

#include <dlfcn.h>
#include <h2o.h>
#include <h2o/http2.h>
#include <h2o/http2_internal.h> /* with guard/h2o_internal/khash.h (CMakeLists.txt) */
#include <h2o/version.h>
#include <string.h>

#if H2O_VERSION_MAJOR != 2 || H2O_VERSION_MINOR != 2
#error "front/h2_head.c defines h2o 2.2's h2o_hpack_flatten_response: check its output against this libh2o"
#endif

/* libh2o's own h2o_hpack_flatten_response (declared by h2o/http2_internal.h, which the definition
 * below must match): found before main runs (a constructor; no thread exists yet), never changed. */
static void (*h2o_flatten)(h2o_buffer_t **, h2o_hpack_header_table_t *, uint32_t, size_t, h2o_res_t *,
                           h2o_timestamp_t *, const h2o_iovec_t *, size_t);

__attribute__((constructor)) static void find_h2o(void)
{
    *(void **)&h2o_flatten = dlsym(RTLD_NEXT, "h2o_hpack_flatten_response");
}

#define INT_MAX_BYTES 10 /* an HPACK integer's bytes, counted (h2o reserves 5: the bound is above its own) */
#define MOVED_MAX 8      /* Server-Timing fields a response may have taken out */
#define KEPT_MAX 64      /* other fields, on the stack while h2o writes them */

static const char TIMING[] = "server-timing";

/* Appends v as an HPACK integer with an n-bit prefix (RFC 7541 §5.1) whose first byte's other bits
 * are first; returns the bytes written (counted only, out NULL). */
static size_t put_int(unsigned char *out, unsigned char first, unsigned n, size_t v)
{
    size_t max = (1u << n) - 1, k = 0;
    if (v < max) {
        if (out)
            out[0] = (unsigned char)(first | v);
        return 1;
    }
    if (out)
        out[k] = (unsigned char)(first | max);
    k++;
    for (v -= max; v >= 128; v >>= 7, k++)
        if (out)
            out[k] = (unsigned char)(0x80 | (v & 0x7f));
    if (out)
        out[k] = (unsigned char)v;
    return k + 1;
}

size_t agw_h2_head_literal(unsigned char *out, const char *name, size_t name_len, const char *value,
                           size_t value_len)
{
    size_t k = 0;
    if (out)
        out[0] = 0x00; /* literal header field without indexing, new name (the index 0) */
    k++;
    k += put_int(out ? out + k : NULL, 0x00, 7, name_len); /* H = 0: the bytes as they are */
    if (out)
        memcpy(out + k, name, name_len);
    k += name_len;
    k += put_int(out ? out + k : NULL, 0x00, 7, value_len);
    if (out)
        memcpy(out + k, value, value_len);
    return k + value_len;
}

static int is_timing(const h2o_header_t *h)
{
    return h->name->len == sizeof(TIMING) - 1 && memcmp(h->name->base, TIMING, sizeof(TIMING) - 1) == 0;
}

/* The definition libh2o's call reaches (h2_head.h); exported whatever the default visibility. */
__attribute__((visibility("default"))) void h2o_hpack_flatten_response(h2o_buffer_t **buf,
                                                                       h2o_hpack_header_table_t *header_table,
                                                                       uint32_t stream_id, size_t max_frame_size,
                                                                       h2o_res_t *res, h2o_timestamp_t *ts,
                                                                       const h2o_iovec_t *server_name,
                                                                       size_t content_length)
{
    h2o_header_t kept[KEPT_MAX], timing[MOVED_MAX];
    size_t n = res->headers.size, nk = 0, nt = 0, lit = 0;
    /* an upper bound of what h2o writes, as it reserves room (hpack.c: calc_headers_capacity, the
     * status, date, server and content-length fields) */
    size_t bound = H2O_HTTP2_FRAME_HEADER_SIZE + 5 + 2 + H2O_TIMESTR_RFC1123_LEN + 5 + server_name->len + 3 + 20;
    for (size_t i = 0; i < n; i++) {
        const h2o_header_t *h = &res->headers.entries[i];
        if (is_timing(h)) {
            if (nt == MOVED_MAX)
                goto h2os;
            timing[nt++] = *h;
            lit += agw_h2_head_literal(NULL, h->name->base, h->name->len, h->value.base, h->value.len);
        } else {
            if (nk == KEPT_MAX)
                goto h2os;
            kept[nk++] = *h;
            bound += h->name->len + h->value.len + 1 + 2 * INT_MAX_BYTES;
        }
    }
    if (nt == 0 || bound - H2O_HTTP2_FRAME_HEADER_SIZE + lit > max_frame_size)
        goto h2os;
    h2o_header_t *entries = res->headers.entries;
    res->headers.entries = kept, res->headers.size = nk;
    size_t start = (*buf)->size;
    h2o_flatten(buf, header_table, stream_id, max_frame_size, res, ts, server_name, content_length);
    res->headers.entries = entries, res->headers.size = n;
    agw_h2_head_append(buf, start, stream_id, max_frame_size, timing, nt, lit);
    return;
h2os: /* h2o's alone (Server-Timing indexed as h2o does) */
    h2o_flatten(buf, header_table, stream_id, max_frame_size, res, ts, server_name, content_length);
}

int agw_h2_head_append(h2o_buffer_t **buf, size_t start, uint32_t stream_id, size_t max_frame_size,
                       const h2o_header_t *fields, size_t n, size_t lit)
{
    /* one HEADERS frame (the bound said so): its payload grows by the literals */
    size_t payload = (*buf)->size - start - H2O_HTTP2_FRAME_HEADER_SIZE;
    unsigned char *fh = (unsigned char *)(*buf)->bytes + start;
    int one_frame = payload + lit <= max_frame_size && agw_h2_frame_length(fh) == payload;
    unsigned char *out = (unsigned char *)h2o_buffer_reserve(buf, lit + H2O_HTTP2_FRAME_HEADER_SIZE).base;
    if (out == NULL)
        return -1; /* (no memory: h2o's head goes without the fields) */
    if (!one_frame) {
        /* (not seen: the bound is above h2o's own) the literals go in a CONTINUATION frame of
         * their own after h2o's last frame, which ends the header block no longer */
        const unsigned char *b = (const unsigned char *)(*buf)->bytes;
        size_t at = start, last = start;
        for (; at + H2O_HTTP2_FRAME_HEADER_SIZE <= (*buf)->size;
             at += H2O_HTTP2_FRAME_HEADER_SIZE + agw_h2_frame_length(b + at))
            last = at;
        (*buf)->bytes[last + 4] = (char)(b[last + 4] & ~H2O_HTTP2_FRAME_FLAG_END_HEADERS);
        out = h2o_http2_encode_frame_header(out, lit, H2O_HTTP2_FRAME_TYPE_CONTINUATION,
                                            H2O_HTTP2_FRAME_FLAG_END_HEADERS, (int32_t)stream_id);
        (*buf)->size += H2O_HTTP2_FRAME_HEADER_SIZE;
    }
    for (size_t i = 0; i < n; i++)
        out += agw_h2_head_literal(out, fields[i].name->base, fields[i].name->len, fields[i].value.base,
                                   fields[i].value.len);
    (*buf)->size += lit;
    if (one_frame) {
        payload += lit;
        fh = (unsigned char *)(*buf)->bytes + start; /* (the reserve may have moved the bytes) */
        fh[0] = (unsigned char)(payload >> 16), fh[1] = (unsigned char)(payload >> 8), fh[2] = (unsigned char)payload;
    }
    return one_frame ? 0 : 1;
}

int agw_h2_head_active(void)
{
    if (!agw_interposed("h2o_hpack_flatten_response", (void *)h2o_hpack_flatten_response))
        return 0;
    return h2o_flatten != NULL ? 1 : -1;
}
