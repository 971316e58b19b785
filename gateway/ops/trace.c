/* trace.c: W3C Trace Context parsing and formatting, span records (see trace.h). */
#include "ops/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

#include "upstream/pool.h"

/* -1 unless c is a lowercase hex digit (§3.2.2: HEXDIGLC = DIGIT / "a"-"f"). */
static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes 2n lowercase hex digits of s into n bytes. Returns 0, or -1 on a bad digit. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int agw_traceparent_parse(const char *s, size_t len, agw_traceparent_t *out)
{
    while (len && (s[0] == ' ' || s[0] == '\t'))
        s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    if (len < AGW_TRACEPARENT_LEN)
        return -1;
    uint8_t version;
    if (unhex(s, &version, 1) != 0 || version == 0xff) /* §3.2.2.1: ff is forbidden */
        return -1;
    if (version == 0 && len != AGW_TRACEPARENT_LEN)
        return -1;
    /* §4.3: a higher version is read as version 00 by its first 55 characters; what follows must
     * start with '-' */
    if (version != 0 && len > AGW_TRACEPARENT_LEN && s[AGW_TRACEPARENT_LEN] != '-')
        return -1;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return -1;
    agw_traceparent_t tp;
    if (unhex(s + 3, tp.trace_id, 16) != 0 || unhex(s + 36, tp.parent_id, 8) != 0 || unhex(s + 53, &tp.flags, 1) != 0)
        return -1;
    if (all_zero(tp.trace_id, 16) || all_zero(tp.parent_id, 8)) /* §3.2.2.3, §3.2.2.4 */
        return -1;
    *out = tp;
    return 0;
}

void agw_trace_hex(char *out, const uint8_t *id, size_t n)
{
    /* two digits per byte from one table: formatted for every upstream call */
    static const char pairs[513] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
                                   "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
                                   "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
                                   "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
                                   "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
                                   "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
                                   "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
                                   "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";
    for (size_t i = 0; i < n; i++)
        memcpy(out + 2 * i, pairs + 2 * id[i], 2);
}

void agw_traceparent_format(char *out, const uint8_t trace_id[16], const uint8_t span_id[8], uint8_t flags)
{
    out[0] = '0', out[1] = '0', out[2] = '-';
    agw_trace_hex(out + 3, trace_id, 16);
    out[35] = '-';
    agw_trace_hex(out + 36, span_id, 8);
    out[52] = '-';
    agw_trace_hex(out + 53, &flags, 1);
}

/* §3.3.1.3.1 key characters after the first: lcalpha / DIGIT / "_" / "-" / "*" / "/" */
static int key_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

/* key = simple-key / multi-tenant-key (§3.3.1.3.1). */
static int valid_key(const char *k, size_t n)
{
    const char *at = memchr(k, '@', n);
    if (at == NULL) { /* simple-key = lcalpha 0*255(key chars) */
        if (n < 1 || n > 256 || !(k[0] >= 'a' && k[0] <= 'z'))
            return 0;
        for (size_t i = 1; i < n; i++)
            if (!key_char((unsigned char)k[i]))
                return 0;
        return 1;
    }
    /* tenant-id "@" system-id: tenant-id = (lcalpha / DIGIT) 0*240(key chars);
     * system-id = lcalpha 0*13(key chars) */
    size_t tn = (size_t)(at - k), sn = n - tn - 1;
    if (tn < 1 || tn > 241 || sn < 1 || sn > 14)
        return 0;
    if (!((k[0] >= 'a' && k[0] <= 'z') || (k[0] >= '0' && k[0] <= '9')))
        return 0;
    for (size_t i = 1; i < tn; i++)
        if (!key_char((unsigned char)k[i]))
            return 0;
    if (!(at[1] >= 'a' && at[1] <= 'z'))
        return 0;
    for (size_t i = 2; i <= sn; i++)
        if (!key_char((unsigned char)at[i]))
            return 0;
    return 1;
}

/* value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr = %x21-2B / %x2D-3C / %x3E-7E */
static int valid_value(const char *v, size_t n)
{
    if (n < 1 || n > 256 || v[n - 1] == ' ')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c > 0x7e || c == ',' || c == '=')
            return 0;
    }
    return 1;
}

int agw_tracestate_valid(const char *s, size_t len)
{
    if (len > AGW_TRACESTATE_MAX_LEN)
        return 0;
    struct {
        const char *k;
        size_t n;
    } keys[AGW_TRACESTATE_MAX_MEMBERS];
    size_t members = 0;
    const char *p = s, *end = s + len;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *mend = comma ? comma : end;
        const char *a = p, *b = mend;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a < b) { /* an empty list-member is allowed and ignored (§3.3.1.1) */
            const char *eq = memchr(a, '=', (size_t)(b - a));
            if (eq == NULL || members == AGW_TRACESTATE_MAX_MEMBERS)
                return 0;
            if (!valid_key(a, (size_t)(eq - a)) || !valid_value(eq + 1, (size_t)(b - eq - 1)))
                return 0;
            for (size_t i = 0; i < members; i++) /* §3.3.1.1: keys are unique */
                if (keys[i].n == (size_t)(eq - a) && memcmp(keys[i].k, a, keys[i].n) == 0)
                    return 0;
            keys[members].k = a;
            keys[members].n = (size_t)(eq - a);
            members++;
        }
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 1;
}

void agw_trace_random_id(uint64_t *rng, uint8_t *id, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t x = *rng;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *rng = x;
            uint64_t v = x * 0x2545F4914F6CDD1Dull;
            size_t k = n - i < 8 ? n - i : 8;
            memcpy(id + i, &v, k);
        }
    } while (all_zero(id, n));
}

/* Frees the failure details of tr's spans (agw_span_t.detail). */
static void release_details(agw_trace_t *tr)
{
    for (size_t i = 0; i < tr->num_spans; i++) {
        if (tr->spans[i].detail) { /* (rare: a failed attempt's; free(NULL) is a call per span) */
            free(tr->spans[i].detail);
            tr->spans[i].detail = NULL;
        }
    }
}

void agw_trace_init(agw_trace_t *tr)
{
    tr->num_spans = 0;
    tr->spans_dropped = 0;
    tr->spans = tr->inline_spans;
    tr->spans_cap = AGW_TRACE_INLINE_SPANS;
}

agw_trace_t *agw_trace_new(void)
{
    agw_trace_t *tr = agw_malloc(sizeof(*tr));
    agw_trace_init(tr);
    return tr;
}

void agw_trace_dispose(agw_trace_t *tr)
{
    release_details(tr);
    if (tr->spans != tr->inline_spans)
        free(tr->spans);
    agw_trace_init(tr);
}

void agw_trace_free(agw_trace_t *tr)
{
    if (!tr)
        return;
    release_details(tr);
    if (tr->spans != tr->inline_spans)
        free(tr->spans);
    free(tr);
}

/* Room for one more span past spans_cap (< AGW_TRACE_MAX_SPANS): the array doubles, capped. */
static void grow_spans(agw_trace_t *tr)
{
    uint32_t cap = tr->spans_cap * 2 < AGW_TRACE_MAX_SPANS ? tr->spans_cap * 2 : AGW_TRACE_MAX_SPANS;
    if (tr->spans == tr->inline_spans) {
        agw_span_t *a = agw_malloc(cap * sizeof(*a));
        memcpy(a, tr->inline_spans, tr->num_spans * sizeof(*a));
        tr->spans = a;
    } else {
        tr->spans = agw_realloc(tr->spans, cap * sizeof(*tr->spans));
    }
    tr->spans_cap = cap;
}

void agw_trace_begin(agw_trace_t *tr, uint64_t *rng, const agw_traceparent_t *parent, uint64_t now_us,
                     const char *method, size_t mlen, const char *path, size_t plen)
{
    if (parent) {
        memcpy(tr->trace_id, parent->trace_id, 16);
        memcpy(tr->parent_id, parent->parent_id, 8);
        tr->flags = parent->flags & AGW_TRACE_FLAG_SAMPLED; /* other bits are not defined for 00 */
        tr->has_parent = 1;
    } else {
        agw_trace_random_id(rng, tr->trace_id, 16);
        memset(tr->parent_id, 0, 8);
        tr->flags = AGW_TRACE_FLAG_SAMPLED; /* a trace started here is recorded */
        tr->has_parent = 0;
    }
    agw_trace_random_id(rng, tr->span_id, 8);
    agw_traceparent_format(tr->traceparent, tr->trace_id, tr->span_id, tr->flags);
    tr->status = 0;
    tr->start_us = now_us;
    tr->end_us = 0;
    release_details(tr);
    tr->num_spans = 0;
    tr->spans_dropped = 0;
    memset(&tr->limit, 0, sizeof(tr->limit));
    size_t n = 0;
    if (mlen > AGW_TRACE_TARGET_MAX / 4)
        mlen = AGW_TRACE_TARGET_MAX / 4;
    memcpy(tr->target, method, mlen);
    n = mlen;
    tr->target[n++] = ' ';
    if (plen > AGW_TRACE_TARGET_MAX - 1 - n)
        plen = AGW_TRACE_TARGET_MAX - 1 - n;
    memcpy(tr->target + n, path, plen);
    tr->target[n + plen] = '\0';
}

void agw_trace_traceparent(const agw_trace_t *tr, int i, char *out)
{
    memcpy(out, tr->traceparent, AGW_TRACEPARENT_LEN);
    if (i >= 0 && (size_t)i < tr->num_spans)
        agw_trace_hex(out + 36, tr->spans[i].span_id, 8);
}

int agw_trace_add_span(agw_trace_t *tr, uint64_t *rng, unsigned up, const char *section, size_t slen, unsigned flags,
                       unsigned attempt, uint64_t now_us)
{
    if (tr->num_spans == AGW_TRACE_MAX_SPANS) {
        tr->spans_dropped++;
        return -1;
    }
    if (tr->num_spans == tr->spans_cap)
        grow_spans(tr);
    agw_span_t *s = &tr->spans[tr->num_spans];
    agw_trace_random_id(rng, s->span_id, 8);
    s->start_us = now_us;
    s->end_us = now_us;
    s->upstream = (uint16_t)up;
    s->http_status = 0;
    s->outcome = AGW_SPAN_CANCELLED;
    s->flags = (uint8_t)(flags | AGW_SPAN_OPEN);
    s->attempt = (uint8_t)(attempt > 255 ? 255 : attempt);
    s->endpoint = 0;
    if (slen > AGW_SPAN_SECTION_MAX - 1)
        slen = AGW_SPAN_SECTION_MAX - 1;
    if (slen)
        memcpy(s->section, section, slen);
    s->section[slen] = '\0';
    s->detail = NULL;
    return (int)tr->num_spans++;
}

void agw_trace_end_span(agw_trace_t *tr, int i, unsigned outcome, int http_status, const char *detail,
                        uint64_t now_us)
{
    if (i < 0 || (size_t)i >= tr->num_spans)
        return;
    agw_span_t *s = &tr->spans[i];
    if (!(s->flags & AGW_SPAN_OPEN))
        return;
    s->flags &= (uint8_t)~AGW_SPAN_OPEN;
    s->end_us = now_us > s->start_us ? now_us : s->start_us;
    s->outcome = (uint8_t)outcome;
    s->http_status = (uint16_t)(http_status > 0 && http_status < 1000 ? http_status : 0);
    if (detail && detail[0])
        s->detail = agw_strndup(detail, strnlen(detail, AGW_SPAN_DETAIL_MAX - 1));
}

void agw_trace_finish(agw_trace_t *tr, int status, uint64_t now_us)
{
    tr->status = status;
    tr->end_us = now_us > tr->start_us ? now_us : tr->start_us;
    for (size_t i = 0; i < tr->num_spans; i++)
        agw_trace_end_span(tr, (int)i, AGW_SPAN_CANCELLED, 0, NULL, tr->end_us);
}

const char *agw_span_outcome_name(unsigned outcome)
{
    if (outcome == AGW_SPAN_CANCELLED)
        return "cancelled";
    return agw_call_outcome_name((agw_call_outcome_t)outcome);
}

const char *agw_trace_limit_store_name(uint8_t store)
{
    return store == AGW_TRACE_LIMIT_REDIS      ? "redis"
           : store == AGW_TRACE_LIMIT_FALLBACK ? "fallback"
           : store == AGW_TRACE_LIMIT_SHADOW   ? "shadow"
                                               : "local";
}
