/* fuzz_trace.c: W3C Trace Context parsing (gateway/ops/trace.h).
 *
 * Input: lines (LF). Line 1 is a traceparent value, line 2 a tracestate value, line 3 a request
 * method and line 4 its path, the lines after that section names of upstream spans. Both parsers
 * are compared with references written here straight from the grammar of W3C Trace Context
 * Level 1 (§3.2.2, §3.3.1, §4.3) in another shape (character classes per position; members
 * copied out and checked one by one); a parsed traceparent must format back to the same ids;
 * a trace begun with the input's method, path and sections must keep every text cut and
 * NUL-terminated inside its record, and its traceparent headers must parse back to its ids. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/trace.h"

static int lchex(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
static int lcalpha(unsigned char c) { return c >= 'a' && c <= 'z'; }
static int digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* traceparent per §3.2.2 and §4.3: "VV-<32 hex>-<16 hex>-<2 hex>" after OWS trimming. */
static int ref_traceparent(const char *s, size_t n)
{
    size_t a = 0, b = n;
    while (a < b && (s[a] == ' ' || s[a] == '\t'))
        a++;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
        b--;
    s += a;
    n = b - a;
    static const char shape[] = "hh-hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-hhhhhhhhhhhhhhhh-hh";
    if (n < 55)
        return 0;
    for (size_t i = 0; i < 55; i++)
        if (shape[i] == '-' ? s[i] != '-' : !lchex((unsigned char)s[i]))
            return 0;
    if (s[0] == 'f' && s[1] == 'f')
        return 0;
    int v00 = s[0] == '0' && s[1] == '0';
    if (v00 && n != 55)
        return 0;
    if (!v00 && n > 55 && s[55] != '-')
        return 0;
    int zero = 1;
    for (size_t i = 3; i < 35; i++)
        zero &= s[i] == '0';
    if (zero)
        return 0;
    zero = 1;
    for (size_t i = 36; i < 52; i++)
        zero &= s[i] == '0';
    return !zero;
}

static int key_rest(unsigned char c)
{
    return lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/';
}

static int ref_key(const char *k, size_t n)
{
    size_t ats = 0, at = 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] == '@')
            ats++, at = i;
    if (ats == 0) {
        if (n < 1 || n > 256 || !lcalpha((unsigned char)k[0]))
            return 0;
        for (size_t i = 1; i < n; i++)
            if (!key_rest((unsigned char)k[i]))
                return 0;
        return 1;
    }
    if (ats > 1 || at < 1 || at > 241 || n - at - 1 < 1 || n - at - 1 > 14)
        return 0;
    if (!lcalpha((unsigned char)k[0]) && !digit((unsigned char)k[0]))
        return 0;
    for (size_t i = 1; i < at; i++)
        if (!key_rest((unsigned char)k[i]))
            return 0;
    if (!lcalpha((unsigned char)k[at + 1]))
        return 0;
    for (size_t i = at + 2; i < n; i++)
        if (!key_rest((unsigned char)k[i]))
            return 0;
    return 1;
}

static int ref_value(const char *v, size_t n)
{
    if (n < 1 || n > 256)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        int nblk = (c >= 0x21 && c <= 0x2b) || (c >= 0x2d && c <= 0x3c) || (c >= 0x3e && c <= 0x7e);
        if (!(nblk || (c == ' ' && i + 1 < n)))
            return 0;
    }
    return 1;
}

/* tracestate per §3.3.1: list-members separated by ',' with OWS; empty members allowed. */
static int ref_tracestate(const char *s, size_t n)
{
    if (n > AGW_TRACESTATE_MAX_LEN)
        return 0;
    char keys[AGW_TRACESTATE_MAX_MEMBERS][260];
    size_t nkeys = 0, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != ',')
            continue;
        size_t a = start, b = i;
        start = i + 1;
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        if (a == b)
            continue;
        size_t eq = a;
        while (eq < b && s[eq] != '=')
            eq++;
        if (eq == b || nkeys == AGW_TRACESTATE_MAX_MEMBERS)
            return 0;
        if (!ref_key(s + a, eq - a) || !ref_value(s + eq + 1, b - eq - 1))
            return 0;
        memcpy(keys[nkeys], s + a, eq - a);
        keys[nkeys][eq - a] = '\0';
        for (size_t k = 0; k < nkeys; k++)
            if (strcmp(keys[k], keys[nkeys]) == 0)
                return 0;
        nkeys++;
    }
    return 1;
}

/* The next line of data (without its LF), or the rest when there is no LF; NULL at the end. */
static const char *next_line(const char **p, const char *end, size_t *len)
{
    if (*p > end)
        return NULL;
    const char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    *len = nl ? (size_t)(nl - s) : (size_t)(end - s);
    *p = nl ? nl + 1 : end + 1;
    return s;
}

static agw_trace_t tr;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    size_t tpl = 0, tsl = 0, ml = 0, pl = 0;
    const char *tp = next_line(&p, end, &tpl), *ts = next_line(&p, end, &tsl);
    const char *method = next_line(&p, end, &ml), *path = next_line(&p, end, &pl);
    if (!tp)
        tp = "", tpl = 0;
    if (!ts)
        ts = "", tsl = 0;
    if (!method)
        method = "GET", ml = 3;
    if (!path)
        path = "/", pl = 1;

    agw_traceparent_t parent;
    int ok = agw_traceparent_parse(tp, tpl, &parent) == 0;
    if (ok != ref_traceparent(tp, tpl))
        abort();
    if (agw_tracestate_valid(ts, tsl) != ref_tracestate(ts, tsl))
        abort();

    uint64_t rng = 0x9e3779b97f4a7c15ull ^ size;
    if (tr.spans == NULL) /* first input: the record is reused by every later one, heap spans too */
        agw_trace_init(&tr);
    agw_trace_begin(&tr, &rng, ok ? &parent : NULL, 1000, method, ml, path, pl);
    if (memchr(tr.target, '\0', sizeof(tr.target)) == NULL)
        abort();
    char hdr[AGW_TRACEPARENT_LEN];
    agw_traceparent_t back;
    agw_trace_traceparent(&tr, -1, hdr);
    if (agw_traceparent_parse(hdr, sizeof(hdr), &back) != 0 || memcmp(back.trace_id, tr.trace_id, 16) != 0 ||
        memcmp(back.parent_id, tr.span_id, 8) != 0 || back.flags != tr.flags)
        abort();
    if (ok && (memcmp(tr.trace_id, parent.trace_id, 16) != 0 || tr.flags != (parent.flags & AGW_TRACE_FLAG_SAMPLED)))
        abort();
    const char *sec;
    size_t sl, i = 0;
    while ((sec = next_line(&p, end, &sl)) != NULL) {
        int k = agw_trace_add_span(&tr, &rng, (unsigned)sl, sec, sl, (unsigned)i & 15, (unsigned)sl, 1000 + i);
        if (k >= 0) {
            if (memchr(tr.spans[k].section, '\0', AGW_SPAN_SECTION_MAX) == NULL)
                abort();
            agw_trace_traceparent(&tr, k, hdr);
            if (agw_traceparent_parse(hdr, sizeof(hdr), &back) != 0 ||
                memcmp(back.parent_id, tr.spans[k].span_id, 8) != 0)
                abort();
            if (i % 3 == 0) {
                /* the section line is the failure's detail too: cut to fit, NUL-terminated */
                char detail[512];
                snprintf(detail, sizeof(detail), "%.*s", (int)sl, sec);
                agw_trace_end_span(&tr, k, (unsigned)sl % 8, (int)sl * 37, i % 2 ? detail : NULL, 999 + i);
                /* the record's own copy, cut to AGW_SPAN_DETAIL_MAX - 1 bytes; none for NULL or "" */
                const char *d = tr.spans[k].detail;
                size_t want = i % 2 ? strnlen(detail, AGW_SPAN_DETAIL_MAX - 1) : 0;
                if (want == 0 ? d != NULL : (d == NULL || d == detail || strlen(d) != want || memcmp(d, detail, want) != 0))
                    abort();
            }
        }
        i++;
    }
    agw_trace_finish(&tr, 200, 2000);
    for (size_t k = 0; k < tr.num_spans; k++)
        if ((tr.spans[k].flags & AGW_SPAN_OPEN) || tr.spans[k].end_us < tr.spans[k].start_us)
            abort();
    if (tr.num_spans + tr.spans_dropped != i)
        abort();
    return 0;
}
