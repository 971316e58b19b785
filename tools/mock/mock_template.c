/*
 * mock_template.c -- path patterns and body templates.
 *
 * A path pattern is a list of segments: literal text or "{name}" (exactly one non-empty
 * segment), optionally ending in a "*" segment (any remainder, including nothing). The query
 * string is never part of matching.
 *
 * A body template is the body cut into literal pieces and "{name}" references, compiled once
 * when a route is installed so that answering costs a few memcpy calls. JSON bodies are
 * serialized compactly at compile time; a string value that is exactly "{name}" becomes a
 * MOCK_SEG_JSON_VALUE, rendered as a bare number when the captured text is an integer, so that
 * {"id": "{id}"} answers {"id":7} for /products/7 and {"id":"abc"} for /products/abc.
 */
#include "mock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_ident_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.';
}

/* Length of the "{name}" reference starting at s (s[0] == '{'), or 0 if it is not one. */
static size_t ref_len(const char *s, size_t avail)
{
    size_t i = 1;
    while (i < avail && is_ident_char(s[i]))
        i++;
    return (i > 1 && i < avail && s[i] == '}') ? i + 1 : 0;
}

/* ---- path patterns ---- */

int mock_pattern_compile(mock_pattern *pt, const char *path, char *err, size_t errlen)
{
    memset(pt, 0, sizeof *pt);
    size_t len = strlen(path);
    if (len == 0 || path[0] != '/') {
        snprintf(err, errlen, "must start with '/' (got \"%s\")", path);
        return -1;
    }
    if (strchr(path, '?')) {
        snprintf(err, errlen, "must not contain a query string (queries are ignored for matching)");
        return -1;
    }
    if (len >= 2 && strcmp(path + len - 2, "/*") == 0) {
        pt->rest = true;
        len -= 2;
    }
    /* Split path[1..len) on '/'. "/" alone is one empty segment; a lone "*" is none. */
    const char *p = path + 1, *end = path + len;
    if (pt->rest && len <= 1)
        return 0;
    for (;;) {
        const char *q = memchr(p, '/', (size_t)(end - p));
        if (!q)
            q = end;
        size_t n = (size_t)(q - p);
        pt->segs = agw_realloc(pt->segs, (pt->n + 1) * sizeof *pt->segs);
        bool param = n > 0 && p[0] == '{' && ref_len(p, n) == n;
        if (!param && (memchr(p, '{', n) || memchr(p, '}', n))) {
            snprintf(err, errlen, "segment \"%.*s\" must be literal or a whole {name}", (int)n, p);
            return -1;
        }
        if (n == 1 && p[0] == '*') {
            snprintf(err, errlen, "'*' is only allowed as the last segment (\"/*\")");
            return -1;
        }
        const char *text = param ? p + 1 : p;
        size_t tlen = param ? n - 2 : n;
        pt->segs[pt->n].text = agw_malloc(tlen + 1);
        memcpy(pt->segs[pt->n].text, text, tlen);
        pt->segs[pt->n].text[tlen] = '\0';
        pt->segs[pt->n].len = tlen;
        pt->segs[pt->n].param = param;
        pt->n++;
        if (q == end)
            break;
        p = q + 1;
    }
    return 0;
}

void mock_pattern_free(mock_pattern *pt)
{
    for (size_t i = 0; i < pt->n; i++)
        free(pt->segs[i].text);
    free(pt->segs);
    memset(pt, 0, sizeof *pt);
}

bool mock_pattern_match(const mock_pattern *pt, const char *path, size_t len, mock_params *out)
{
    size_t saved = out->n;
    size_t pos = (len > 0 && path[0] == '/') ? 1 : 0;
    bool more = true; /* segments left in the path */
    for (size_t i = 0; i < pt->n; i++) {
        if (!more)
            goto fail;
        const char *p = path + pos;
        const char *q = memchr(p, '/', len - pos);
        size_t n = q ? (size_t)(q - p) : len - pos;
        if (pt->segs[i].param) {
            if (n == 0 || out->n == MOCK_MAX_PARAMS)
                goto fail;
            out->v[out->n].name = pt->segs[i].text;
            out->v[out->n].name_len = pt->segs[i].len;
            out->v[out->n].val = p;
            out->v[out->n].val_len = n;
            out->n++;
        } else if (n != pt->segs[i].len || memcmp(p, pt->segs[i].text, n) != 0) {
            goto fail;
        }
        pos += n + (q ? 1 : 0);
        more = q != NULL;
    }
    if (pt->rest || !more)
        return true;
fail:
    out->n = saved;
    return false;
}

/* ---- templates ---- */

static void add_seg(mock_template *t, mock_seg_kind kind, const char *text, size_t len)
{
    if (kind == MOCK_SEG_LITERAL) {
        if (len == 0)
            return;
        if (t->n > 0 && t->segs[t->n - 1].kind == MOCK_SEG_LITERAL) { /* merge literals */
            size_t old = t->segs[t->n - 1].len;
            t->segs[t->n - 1].text = agw_realloc(t->segs[t->n - 1].text, old + len + 1);
            memcpy(t->segs[t->n - 1].text + old, text, len);
            t->segs[t->n - 1].text[old + len] = '\0';
            t->segs[t->n - 1].len = old + len;
            return;
        }
    }
    t->segs = agw_realloc(t->segs, (t->n + 1) * sizeof *t->segs);
    t->segs[t->n].kind = kind;
    t->segs[t->n].text = agw_malloc(len + 1);
    memcpy(t->segs[t->n].text, text, len);
    t->segs[t->n].text[len] = '\0';
    t->segs[t->n].len = len;
    t->n++;
}

/* Adds s as a literal, JSON-escaped (without the quotes) when json is set. */
static void add_literal(mock_template *t, const char *s, size_t len, bool json)
{
    if (!json) {
        add_seg(t, MOCK_SEG_LITERAL, s, len);
        return;
    }
    json_t *piece = json_stringn(s, len);
    char *dumped = json_dumps(piece, JSON_ENCODE_ANY);
    add_seg(t, MOCK_SEG_LITERAL, dumped + 1, strlen(dumped) - 2); /* drop the quotes */
    free(dumped);
    json_decref(piece);
}

/* Adds text with each {name} turned into a reference of kind ref; literal pieces are JSON-
 * escaped when json is set. */
static void add_text(mock_template *t, const char *s, size_t len, mock_seg_kind ref, bool json)
{
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        size_t r;
        if (s[i] != '{' || (r = ref_len(s + i, len - i)) == 0)
            continue;
        add_literal(t, s + start, i - start, json);
        add_seg(t, ref, s + i + 1, r - 2);
        i += r - 1;
        start = i + 1;
    }
    add_literal(t, s + start, len - start, json);
}

void mock_template_text(mock_template *t, const char *text, size_t len)
{
    memset(t, 0, sizeof *t);
    add_text(t, text, len, MOCK_SEG_RAW, false);
}

/* Shortest decimal form of d that reads back as d ("4.6", not "4.5999999999999996"). */
static void format_real(double d, char *out, size_t outlen)
{
    if (!isfinite(d)) {
        snprintf(out, outlen, "null");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, outlen, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
    if (!strpbrk(out, ".eEn")) /* keep it a real: 3.0, not 3 */
        strncat(out, ".0", outlen - strlen(out) - 1);
}

static void add_json(mock_template *t, json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        bool first = true;
        add_seg(t, MOCK_SEG_LITERAL, "{", 1);
        json_object_foreach(v, key, val) {
            if (!first)
                add_seg(t, MOCK_SEG_LITERAL, ",", 1);
            first = false;
            add_seg(t, MOCK_SEG_LITERAL, "\"", 1);
            add_text(t, key, strlen(key), MOCK_SEG_JSON_STR, true);
            add_seg(t, MOCK_SEG_LITERAL, "\":", 2);
            add_json(t, val);
        }
        add_seg(t, MOCK_SEG_LITERAL, "}", 1);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *val;
        add_seg(t, MOCK_SEG_LITERAL, "[", 1);
        json_array_foreach(v, i, val) {
            if (i > 0)
                add_seg(t, MOCK_SEG_LITERAL, ",", 1);
            add_json(t, val);
        }
        add_seg(t, MOCK_SEG_LITERAL, "]", 1);
        break;
    }
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        if (len > 2 && s[0] == '{' && ref_len(s, len) == len) {
            add_seg(t, MOCK_SEG_JSON_VALUE, s + 1, len - 2);
        } else {
            add_seg(t, MOCK_SEG_LITERAL, "\"", 1);
            add_text(t, s, len, MOCK_SEG_JSON_STR, true);
            add_seg(t, MOCK_SEG_LITERAL, "\"", 1);
        }
        break;
    }
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        add_seg(t, MOCK_SEG_LITERAL, num, strlen(num));
        break;
    case JSON_REAL:
        format_real(json_real_value(v), num, sizeof num);
        add_seg(t, MOCK_SEG_LITERAL, num, strlen(num));
        break;
    case JSON_TRUE:
        add_seg(t, MOCK_SEG_LITERAL, "true", 4);
        break;
    case JSON_FALSE:
        add_seg(t, MOCK_SEG_LITERAL, "false", 5);
        break;
    case JSON_NULL:
        add_seg(t, MOCK_SEG_LITERAL, "null", 4);
        break;
    }
}

void mock_template_json(mock_template *t, json_t *v)
{
    memset(t, 0, sizeof *t);
    add_json(t, v);
}

void mock_template_free(mock_template *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->segs[i].text);
    free(t->segs);
    memset(t, 0, sizeof *t);
}

static bool lookup(const mock_params *p, const char *name, size_t nlen, const char **val,
                   size_t *vlen);

bool mock_params_get(const mock_params *p, const char *name, size_t nlen, const char **val,
                     size_t *vlen)
{
    return lookup(p, name, nlen, val, vlen);
}

/* Finds the value of name: path captures first, then the query string (raw, not decoded). */
static bool lookup(const mock_params *p, const char *name, size_t nlen, const char **val,
                   size_t *vlen)
{
    for (size_t i = 0; i < p->n; i++) {
        if (p->v[i].name_len == nlen && memcmp(p->v[i].name, name, nlen) == 0) {
            *val = p->v[i].val;
            *vlen = p->v[i].val_len;
            return true;
        }
    }
    const char *q = p->query, *end = p->query ? p->query + p->query_len : NULL;
    while (q && q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *pend = amp ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(pend - q));
        const char *kend = eq ? eq : pend;
        if ((size_t)(kend - q) == nlen && memcmp(q, name, nlen) == 0) {
            *val = eq ? eq + 1 : pend;
            *vlen = (size_t)(pend - *val);
            return true;
        }
        q = amp ? amp + 1 : NULL;
    }
    return false;
}

/* True if s is a JSON integer we may emit bare: 0 or -?[1-9][0-9]*, at most 18 digits. */
static bool is_json_int(const char *s, size_t n)
{
    size_t i = (n > 0 && s[0] == '-') ? 1 : 0;
    if (i == n || n - i > 18 || (s[i] == '0' && n - i > 1))
        return false;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

static void append_json_escaped(agw_buf_t *out, const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        agw_buf_append(out, s + start, i - start);
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            agw_buf_append(out, e, 2);
        } else {
            agw_buf_printf(out, "\\u%04x", ch);
        }
        start = i + 1;
    }
    agw_buf_append(out, s + start, n - start);
}

void mock_template_render(const mock_template *t, const mock_params *p, agw_buf_t *out)
{
    for (size_t i = 0; i < t->n; i++) {
        const char *val;
        size_t vlen;
        if (t->segs[i].kind == MOCK_SEG_LITERAL) {
            agw_buf_append(out, t->segs[i].text, t->segs[i].len);
            continue;
        }
        bool found = lookup(p, t->segs[i].text, t->segs[i].len, &val, &vlen);
        switch (t->segs[i].kind) {
        case MOCK_SEG_RAW:
            if (found)
                agw_buf_append(out, val, vlen);
            else
                agw_buf_printf(out, "{%s}", t->segs[i].text);
            break;
        case MOCK_SEG_JSON_STR:
            if (found)
                append_json_escaped(out, val, vlen);
            else
                agw_buf_printf(out, "{%s}", t->segs[i].text);
            break;
        case MOCK_SEG_JSON_VALUE:
            if (found && is_json_int(val, vlen)) {
                agw_buf_append(out, val, vlen);
            } else {
                agw_buf_append(out, "\"", 1);
                if (found)
                    append_json_escaped(out, val, vlen);
                else
                    agw_buf_printf(out, "{%s}", t->segs[i].text);
                agw_buf_append(out, "\"", 1);
            }
            break;
        case MOCK_SEG_LITERAL:
            break;
        }
    }
}
