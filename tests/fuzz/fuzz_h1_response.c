/* fuzz_h1_response.c: upstream response framing (gateway/upstream/http1.h).
 *
 * Input: byte 0 holds options (bit 0: the request was HEAD; bits 1-2: the body limit, none, 16,
 * 1,000 or 64 KiB; bit 3: the upstream closes the connection after the bytes), byte 1 a seed for
 * the split points, the rest is what the upstream sends. The bytes are parsed twice: in one feed,
 * and in pieces cut at points drawn from the seed (down to one byte at a time), as reads would
 * cut them. Both parses must agree on everything the client acts on (bytes used, done, keep-alive,
 * outcome, status, headers, trailers, body), and each must keep the header's promises: the body
 * never over the limit, a Content-Length body exactly that long, HEAD/1xx/204/304 without body. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "upstream/http1.h"

typedef struct {
    size_t used;
    int done, keep_alive, failed;
    unsigned status;
    size_t nheaders, nhdrs;
    agw_buf_t body, hdrs; /* body; "name\0value\0" per header, then trailers */
} result_t;

static void snapshot(const agw_h1_response_t *r, size_t used, result_t *out)
{
    out->used = used;
    out->done = r->done;
    out->keep_alive = r->done && r->keep_alive;
    out->failed = agw_h1_response_failed(r);
    out->status = r->final_headers ? r->status : 0;
    out->nheaders = r->final_headers ? r->nheaders : 0;
    out->nhdrs = r->done ? r->nhdrs : out->nheaders;
    agw_buf_reset(&out->body);
    agw_buf_reset(&out->hdrs);
    if (r->done)
        agw_buf_append(&out->body, r->body.base, r->body.len);
    for (size_t i = 0; i < out->nhdrs; i++) {
        const agw_h1_hdr_t *h = &r->hdrs[i];
        if (h->name_off + h->name_len > r->hstore.len || h->value_off + h->value_len > r->hstore.len)
            abort(); /* a header outside the store */
        agw_buf_append(&out->hdrs, r->hstore.base + h->name_off, h->name_len);
        agw_buf_append(&out->hdrs, "", 1);
        agw_buf_append(&out->hdrs, r->hstore.base + h->value_off, h->value_len);
        agw_buf_append(&out->hdrs, "", 1);
    }
}

/* Feeds data in pieces (the lengths from rng; all at once when rng is NULL) as the client does:
 * stops at the first piece that completes the response or fails it. */
static size_t feed(agw_h1_response_t *r, const char *data, size_t n, uint32_t *rng, int eof)
{
    size_t off = 0;
    while (off < n) {
        size_t piece = n - off;
        if (rng) {
            *rng = *rng * 1103515245u + 12345u;
            size_t max = (*rng >> 16) % 4 == 0 ? 1 : 1 + (*rng >> 8) % 64;
            if (piece > max)
                piece = max;
        }
        size_t used = agw_h1_response_feed(r, data + off, piece);
        off += used;
        if (r->done || agw_h1_response_failed(r) != AGW_CALL_OK || used < piece)
            return off;
    }
    if (eof)
        agw_h1_response_eof(r);
    return off;
}

static void check_promises(const agw_h1_response_t *r)
{
    if (r->max_body && r->body.len > r->max_body)
        abort(); /* body over the limit */
    if (!r->done)
        return;
    unsigned st = r->status;
    if (st < 200 || st > 999)
        abort(); /* a final response is no 1xx */
    if (r->head || st == 204 || st == 304) {
        if (r->body.len != 0)
            abort(); /* no body may follow */
    } else if (r->expect_len != UINT64_MAX && r->body.len != r->expect_len) {
        abort(); /* Content-Length promised another length */
    }
}

static agw_h1_response_t one, split;
static result_t ra, rb;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int head = data[0] & 1;
    static const size_t limits[4] = {0, 16, 1000, 65536};
    size_t max_body = limits[(data[0] >> 1) & 3];
    int eof = (data[0] >> 3) & 1;
    uint32_t rng = data[1];
    const char *msg = (const char *)data + 2;
    size_t n = size - 2;

    agw_h1_response_start(&one, head, max_body);
    size_t used = feed(&one, msg, n, NULL, eof);
    check_promises(&one);
    snapshot(&one, used, &ra);

    agw_h1_response_start(&split, head, max_body);
    used = feed(&split, msg, n, &rng, eof);
    check_promises(&split);
    snapshot(&split, used, &rb);

    /* a failure may be noticed at different bytes (a limit passed in the middle of a piece); the
     * rest must agree byte for byte */
    if (ra.failed != rb.failed || ra.done != rb.done)
        abort();
    if (ra.failed == AGW_CALL_OK) {
        if (ra.used != rb.used || ra.keep_alive != rb.keep_alive || ra.status != rb.status ||
            ra.nheaders != rb.nheaders || ra.nhdrs != rb.nhdrs || ra.body.len != rb.body.len ||
            ra.hdrs.len != rb.hdrs.len || (ra.body.len && memcmp(ra.body.base, rb.body.base, ra.body.len) != 0) ||
            (ra.hdrs.len && memcmp(ra.hdrs.base, rb.hdrs.base, ra.hdrs.len) != 0))
            abort();
    }
    /* a response reused for the next call starts clean */
    agw_buf_t b = AGW_BUF_INIT, h = AGW_BUF_INIT;
    agw_h1_response_swap(&split, &b, &h);
    agw_buf_free(&b);
    agw_buf_free(&h);
    return 0;
}
