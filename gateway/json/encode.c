/* json/encode.c: the JSON encoder for Lua values and json_t (see json.h, DESIGN §2.3).
 *
 * It runs for every page, so it allocates nothing but the output buffer (and a key array only
 * when an object has more keys than fit on the C stack), uses raw table access only (no Lua code
 * runs, so it cannot raise) and builds the error path only when there is an error. */
#include "json/json_internal.h"

#include "base/mem.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXACT_INT_LIMIT 9007199254740992.0 /* 2^53 */

/* ---- numbers ---- */

/* Writes the shortest "%.Ng" form of d that reads back to d into tmp (at least 32 bytes); d is
 * finite and non-zero. For normal doubles a decimal of up to 15 digits that reads back to d is
 * what %.15g prints (DBL_DIG), so trying 15, 16, 17 finds the shortest; subnormals hold fewer
 * digits and are searched from 1. */
static int shortest(char *tmp, double d)
{
    int prec = fabs(d) < 2.2250738585072014e-308 ? 1 : 15;
    int len = 0;
    for (; prec <= 17; prec++) {
        len = snprintf(tmp, 32, "%.*g", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    return len;
}

/* Writes v in decimal into tmp (at least 21 bytes, NUL-terminated) and returns the length: what
 * snprintf("%lld") prints, at a tenth of its cost (integers are most numbers of a page). */
static int format_int(char *tmp, long long v)
{
    char rev[24];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    int n = 0, len = 0;
    do {
        rev[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        tmp[len++] = '-';
    while (n)
        tmp[len++] = rev[--n];
    tmp[len] = 0;
    return len;
}

/* Formats d into tmp (at least 32 bytes) and returns the length; see agw_json_encode_number. */
static int format_number(char *tmp, double d)
{
    if (isnan(d) || isinf(d))
        return (int)(memcpy(tmp, "null", 5), 4);
    if (d == 0)
        return signbit(d) ? (int)(memcpy(tmp, "-0.0", 5), 4) : (int)(memcpy(tmp, "0", 2), 1);
    if (d == floor(d) && fabs(d) < EXACT_INT_LIMIT)
        return format_int(tmp, (long long)d);
    return shortest(tmp, d);
}

void agw_json_encode_number(agw_buf_t *out, double d)
{
    char tmp[32];
    int len = format_number(tmp, d);
    agw_buf_append(out, tmp, (size_t)len);
}

/* Appends a real from upstream: shortest form, but always with a fraction or an exponent. */
static void encode_real(agw_buf_t *out, double d)
{
    char tmp[40];
    int len = format_number(tmp, d);
    if (!isfinite(d)) {
        agw_buf_append(out, tmp, (size_t)len);
        return;
    }
    if (strpbrk(tmp, ".eE") == NULL) {
        memcpy(tmp + len, ".0", 3);
        len += 2;
    }
    agw_buf_append(out, tmp, (size_t)len);
}

/* ---- strings ---- */

size_t agw_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* The escape for an ASCII byte that needs one: '"', '\\' and control characters. Everything else
 * ('/', DEL, non-ASCII) is written as is. */
static const char *escape_of(unsigned char c, char tmp[8])
{
    switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    }
    snprintf(tmp, 8, "\\u%04x", c);
    return tmp;
}

/* Bytes that a JSON string cannot hold as they are: control characters, '"', '\\', and every
 * byte of a multi-byte UTF-8 sequence (checked by agw_utf8_seq). */
static const unsigned char NOT_PLAIN[256] = {
    [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 1,
};

/* The bytes agw_json_encode_string writes for str (len bytes), quotes included: an escape is 2
 * bytes, a control character without a short one 6 (valid UTF-8 assumed: the encoding itself
 * refuses the rest). */
static size_t escaped_len(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = len + 2;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x80 && NOT_PLAIN[s[i]])
            n += s[i] < 0x20 && s[i] != '\n' && s[i] != '\r' && s[i] != '\t' && s[i] != '\b' && s[i] != '\f' ? 5 : 1;
    return n;
}

int agw_json_encode_string(agw_buf_t *out, const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t start_len = out->len, run = 0, i = 0;
    char tmp[8];
    agw_buf_reserve(out, len + 2);
    /* most strings (keys, ids, names) are plain ASCII: copied in one go */
    while (i < len && !NOT_PLAIN[s[i]])
        i++;
    if (i == len) {
        char *o = out->base + out->len;
        o[0] = '"';
        memcpy(o + 1, str, len);
        o[len + 1] = '"';
        o[len + 2] = '\0';
        out->len += len + 2;
        return 0;
    }
    agw_buf_putc(out, '"'); /* s[0..i) is plain: it goes out with the first escape or at the end */
    while (i < len) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t n = agw_utf8_seq(s + i, len - i);
            if (n == 0) {
                out->len = start_len;
                if (out->base)
                    out->base[out->len] = '\0';
                return -1;
            }
            i += n;
            continue;
        }
        if (!NOT_PLAIN[c]) {
            i++;
            continue;
        }
        const char *esc = escape_of(c, tmp);
        agw_buf_append(out, str + run, i - run);
        agw_buf_puts(out, esc);
        run = ++i;
    }
    agw_buf_append(out, str + run, len - run);
    agw_buf_putc(out, '"');
    return 0;
}

void agw_json_encode_string_or(agw_buf_t *out, const char *s, size_t len, const char *fallback)
{
    size_t mark = out->len;
    if (agw_json_encode_string(out, s, len) != 0) {
        out->len = mark;
        agw_buf_puts(out, fallback);
    }
}

/* ---- json_t ---- */

void agw_json_encode_value(const json_t *v, agw_buf_t *out)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        agw_buf_putc(out, '{');
        int first = 1;
        for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it)) {
            if (!first)
                agw_buf_putc(out, ',');
            first = 0;
            if (agw_json_encode_string(out, json_object_iter_key(it), json_object_iter_key_len(it)) != 0)
                agw_buf_puts(out, "null"); /* unreachable for jansson keys; keeps output JSON-shaped */
            agw_buf_putc(out, ':');
            agw_json_encode_value(json_object_iter_value(it), out);
        }
        agw_buf_putc(out, '}');
        break;
    }
    case JSON_ARRAY: {
        agw_buf_putc(out, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                agw_buf_putc(out, ',');
            agw_json_encode_value(json_array_get(v, i), out);
        }
        agw_buf_putc(out, ']');
        break;
    }
    case JSON_STRING:
        if (agw_json_encode_string(out, json_string_value(v), json_string_length(v)) != 0)
            agw_buf_puts(out, "null");
        break;
    case JSON_INTEGER:
        agw_buf_printf(out, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        encode_real(out, json_real_value(v));
        break;
    case JSON_TRUE:
        agw_buf_puts(out, "true");
        break;
    case JSON_FALSE:
        agw_buf_puts(out, "false");
        break;
    case JSON_NULL:
        agw_buf_puts(out, "null");
        break;
    }
}

/* ---- Lua values ---- */

/* A string key borrowed from a table that stays on the Lua stack while it is used. */
typedef struct {
    const char *s;
    size_t len;
} skey;

/* One step of the path from the encoded value to the current one: a key or a 0-based index. */
typedef struct {
    const char *key; /* NULL for an array element */
    size_t len;      /* key length, or the element index */
} step_t;

typedef struct {
    lua_State *L;
    agw_buf_t *out;
    char *err;
    size_t errlen;
    int regs;  /* absolute stack slot of the first of the registry tables (json_internal.h), one per
                  AGW_JSON_K_*, each fetched on first use (reg()): a page of raw refs needs one */
    unsigned have; /* bit k: slot regs + k holds its table */
    int failed;
    size_t tables_left; /* tables this encoding may still visit (AGW_JSON_ENCODE_MAX_TABLES) */
    size_t max_bytes;   /* the text's bound (AGW_JSON_ENCODE_MAX_BYTES, or agw_json_encode_max's) */
    skey *keys; /* scratch for sorting keys, used as a stack by nested objects */
    size_t nkeys, capkeys;
    skey inline_keys[64];
    step_t path[AGW_JSON_ENCODE_MAX_DEPTH + 1]; /* path[1..depth]: the steps to the current value */
} enc_t;

static int encode_value(enc_t *e, int idx, int depth);

/* The stack slot of registry table k (AGW_JSON_K_*), fetched on its first use; the key-order
 * table is an empty one when the module was never opened in this state (no orders to honour). */
static int reg(enc_t *e, int k)
{
    int slot = e->regs + k;
    if (!(e->have & (1u << k))) {
        agw_json_regget(e->L, k);
        if (k == AGW_JSON_K_ORDER && lua_isnil(e->L, -1)) {
            lua_pop(e->L, 1);
            lua_newtable(e->L);
        }
        lua_replace(e->L, slot);
        e->have |= 1u << k;
    }
    return slot;
}

/* Returns 1 when key can follow a '.' in a path: [A-Za-z_][A-Za-z0-9_]*. */
static int is_ident(const char *key, size_t len)
{
    if (len == 0 || (key[0] >= '0' && key[0] <= '9'))
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* Writes the path of the value at depth into p, JSON style ("$.a.b[3]", $["odd key"]). */
static void path_append(enc_t *e, int depth, char *p, size_t room)
{
    int n = snprintf(p, room, "$");
    for (int d = 1; d <= depth && n >= 0 && (size_t)n < room; d++) {
        const step_t *st = &e->path[d];
        if (st->key == NULL)
            n += snprintf(p + n, room - (size_t)n, "[%zu]", st->len);
        else if (is_ident(st->key, st->len))
            n += snprintf(p + n, room - (size_t)n, ".%.*s", (int)st->len, st->key);
        else
            n += snprintf(p + n, room - (size_t)n, "[\"%.*s\"]", (int)(st->len > 64 ? 64 : st->len), st->key);
    }
}

/* Records an error for the value at depth ("<what> at $.path"); returns -1. */
static int fail(enc_t *e, int depth, const char *what)
{
    if (e->failed)
        return -1;
    e->failed = 1;
    int n = snprintf(e->err, e->errlen, "%s at ", what);
    if (n >= 0 && (size_t)n < e->errlen)
        path_append(e, depth, e->err + n, e->errlen - (size_t)n);
    return -1;
}

static int key_cmp(const void *a, const void *b)
{
    const skey *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static void key_push(enc_t *e, const char *s, size_t len)
{
    if (e->nkeys == e->capkeys) {
        size_t cap = e->capkeys * 2;
        skey *k = e->keys == e->inline_keys ? agw_malloc(cap * sizeof(*k)) : agw_realloc(e->keys, cap * sizeof(*k));
        if (e->keys == e->inline_keys)
            memcpy(k, e->inline_keys, sizeof(e->inline_keys));
        e->keys = k;
        e->capkeys = cap;
    }
    e->keys[e->nkeys].s = s;
    e->keys[e->nkeys++].len = len;
}

/* Writes `"key":value` for the string key at the top of the stack (popped), reading the value
 * from the table at t. Returns 1 when written, 0 when the value is nil, -1 on error. */
static int encode_member(enc_t *e, int t, int depth, int first)
{
    size_t len;
    const char *k = lua_tolstring(e->L, -1, &len);
    lua_pushvalue(e->L, -1);
    lua_rawget(e->L, t);
    if (lua_isnil(e->L, -1)) {
        lua_pop(e->L, 2);
        return 0;
    }
    e->path[depth + 1] = (step_t){k, len};
    if (!first)
        agw_buf_putc(e->out, ',');
    if (e->out->len + 6 * len + 2 > e->max_bytes && e->out->len + escaped_len(k, len) > e->max_bytes) {
        char what[64];
        snprintf(what, sizeof(what), "more than %zu bytes of JSON text", e->max_bytes);
        return fail(e, depth + 1, what);
    }
    if (agw_json_encode_string(e->out, k, len) != 0)
        return fail(e, depth + 1, "invalid UTF-8 in key");
    agw_buf_putc(e->out, ':');
    int rc = encode_value(e, lua_gettop(e->L), depth + 1);
    lua_pop(e->L, 2);
    return rc < 0 ? -1 : 1;
}

/* Writes the members named by keys[from..nkeys) in that order, after `written` members. */
static int encode_members(enc_t *e, int t, int depth, size_t from, int written)
{
    for (size_t i = from; i < e->nkeys; i++) {
        lua_pushlstring(e->L, e->keys[i].s, e->keys[i].len);
        int rc = encode_member(e, t, depth, written == 0);
        if (rc < 0)
            return -1;
        written += rc;
    }
    return written;
}

static int encode_array(enc_t *e, int t, size_t n, int depth)
{
    agw_buf_putc(e->out, '[');
    for (size_t i = 1; i <= n; i++) {
        if (i > 1)
            agw_buf_putc(e->out, ',');
        e->path[depth + 1] = (step_t){NULL, i - 1};
        lua_rawgeti(e->L, t, (int)i);
        int rc = encode_value(e, lua_gettop(e->L), depth + 1);
        lua_pop(e->L, 1);
        if (rc < 0)
            return -1;
    }
    agw_buf_putc(e->out, ']');
    return 0;
}

/* An object with a remembered key order (its list at the top of the stack): remembered keys
 * first, skipping removed ones, then keys the script added, sorted. */
static int encode_ordered(enc_t *e, int t, int depth)
{
    lua_State *L = e->L;
    int list = lua_gettop(L);
    size_t total = 0, nlist = lua_objlen(L, list);
    for (lua_pushnil(L); lua_next(L, t); lua_pop(L, 1), total++) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 2);
            return fail(e, depth, "sparse or mixed table");
        }
    }
    agw_buf_putc(e->out, '{');
    int written = 0;
    for (size_t i = 1; i <= nlist && (size_t)written < total; i++) {
        lua_rawgeti(L, list, (int)i);
        int rc = encode_member(e, t, depth, written == 0);
        if (rc < 0)
            return -1;
        written += rc;
    }
    if ((size_t)written < total) { /* added keys: those not in the list, sorted */
        size_t base = e->nkeys;
        for (size_t i = 1; i <= nlist; i++) {
            lua_rawgeti(L, list, (int)i);
            size_t len;
            const char *s = lua_tolstring(L, -1, &len); /* the list keeps the string alive */
            lua_pop(L, 1);
            key_push(e, s, len);
        }
        qsort(e->keys + base, e->nkeys - base, sizeof(skey), key_cmp);
        size_t extra = e->nkeys;
        for (lua_pushnil(L); lua_next(L, t); lua_pop(L, 1)) {
            skey k;
            k.s = lua_tolstring(L, -2, &k.len);
            if (!bsearch(&k, e->keys + base, extra - base, sizeof(skey), key_cmp))
                key_push(e, k.s, k.len);
        }
        qsort(e->keys + extra, e->nkeys - extra, sizeof(skey), key_cmp);
        written = encode_members(e, t, depth, extra, written);
        e->nkeys = base;
        if (written < 0)
            return -1;
    }
    agw_buf_putc(e->out, '}');
    return 0;
}

/* A plain table: {} when empty, an array when its keys are exactly 1..n, an object (keys sorted)
 * when they are all strings. */
static int encode_plain(enc_t *e, int t, int depth)
{
    lua_State *L = e->L;
    size_t base = e->nkeys, nnum = 0;
    double max = 0;
    for (lua_pushnil(L); lua_next(L, t); lua_pop(L, 1)) {
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING && nnum == 0) {
            size_t len;
            const char *s = lua_tolstring(L, -2, &len);
            key_push(e, s, len);
            continue;
        }
        double k = kt == LUA_TNUMBER ? lua_tonumber(L, -2) : 0;
        if (kt != LUA_TNUMBER || e->nkeys > base || k < 1 || k != floor(k)) {
            lua_pop(L, 2);
            e->nkeys = base;
            return fail(e, depth, "sparse or mixed table");
        }
        nnum++;
        if (k > max)
            max = k;
    }
    if (nnum > 0) {
        if (max != (double)nnum)
            return fail(e, depth, "sparse or mixed table");
        return encode_array(e, t, nnum, depth);
    }
    qsort(e->keys + base, e->nkeys - base, sizeof(skey), key_cmp);
    agw_buf_putc(e->out, '{');
    int written = encode_members(e, t, depth, base, 0);
    e->nkeys = base;
    if (written < 0)
        return -1;
    agw_buf_putc(e->out, '}');
    return 0;
}

static int encode_table(enc_t *e, int t, int depth)
{
    lua_State *L = e->L;
    if (depth >= AGW_JSON_ENCODE_MAX_DEPTH) {
        char what[64];
        snprintf(what, sizeof(what), "nesting deeper than %d levels (a cycle?)", AGW_JSON_ENCODE_MAX_DEPTH);
        return fail(e, depth, what);
    }
    if (!lua_checkstack(L, 8))
        return fail(e, depth, "out of Lua stack");
    if (e->tables_left == 0) {
        char what[96];
        snprintf(what, sizeof(what), "more than %zu tables (one reached through several references counts each time)",
                 AGW_JSON_ENCODE_MAX_TABLES);
        return fail(e, depth, what);
    }
    e->tables_left--;
    if (lua_getmetatable(L, t)) {
        if (lua_rawequal(L, -1, reg(e, AGW_JSON_K_ARRAY))) {
            lua_pop(L, 1);
            return encode_array(e, t, lua_objlen(L, t), depth);
        }
        lua_pushlightuserdata(L, (void *)&agw_json_order_mark); /* json.ordered's metatables */
        lua_rawget(L, -2);
        if (lua_istable(L, -1)) {
            lua_remove(L, -2);
            return encode_ordered(e, t, depth);
        }
        lua_pop(L, 1);
        /* a call result (agg.result's metatable names it) is not data: its fields as they are would
         * leave out what is read lazily (data) and carry a failed call's upstream body to the
         * client; agg.page makes it a section, .data is its data */
        lua_pushliteral(L, "__metatable");
        lua_rawget(L, -2);
        size_t nl = 0;
        const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &nl) : NULL;
        int is_result = name != NULL && nl == 10 && memcmp(name, "agg.result", 10) == 0;
        lua_pop(L, 2);
        if (is_result)
            return fail(e, depth, "a call result, which is not JSON data (agg.page makes it a section; r.data is its data)");
    }
    lua_pushvalue(L, t);
    lua_rawget(L, reg(e, AGW_JSON_K_ORDER));
    return lua_isnil(L, -1) ? encode_plain(e, t, depth) : encode_ordered(e, t, depth);
}

/* A raw ref: its validated text, without the whitespace outside strings (so an upstream that
 * pretty-prints gives the same page as one that does not; DESIGN §2.3 "as it went in"). */
static int encode_raw(enc_t *e, const agw_json_raw_t *r, int depth)
{
    (void)depth;
    if (r->compact) {
        agw_buf_append(e->out, r->text, r->len);
        return 0;
    }
    agw_buf_reserve(e->out, r->len);
    char *out = e->out->base + e->out->len;
    size_t n = 0;
    int in_string = 0;
    for (size_t i = 0; i < r->len; i++) {
        char c = r->text[i];
        if (in_string) {
            out[n++] = c;
            if (c == '\\' && i + 1 < r->len)
                out[n++] = r->text[++i];
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
            out[n++] = c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            out[n++] = c;
        }
    }
    e->out->len += n;
    e->out->base[e->out->len] = '\0';
    return 0;
}

static int encode_userdata(enc_t *e, int idx, int depth)
{
    lua_State *L = e->L;
    if (!lua_getmetatable(L, idx))
        return fail(e, depth, "cannot encode userdata");
    int is_int64 = lua_rawequal(L, -1, reg(e, AGW_JSON_K_INT64));
    int is_ref = !is_int64 && lua_rawequal(L, -1, reg(e, AGW_JSON_K_REF));
    lua_pop(L, 1);
    if (is_int64)
        agw_buf_printf(e->out, "%lld", (long long)*(int64_t *)lua_touserdata(L, idx));
    else if (is_ref)
        agw_json_encode_value(*(json_t **)lua_touserdata(L, idx), e->out);
    else
        return fail(e, depth, "cannot encode userdata");
    return 0;
}

/* The value at idx, whose lua_type is type. */
static int encode_typed(enc_t *e, int idx, int type, int depth)
{
    if (e->out->len > e->max_bytes) { /* (one comparison a value: a string, a raw ref or a table
                                            may take it past once) */
        char what[64];
        snprintf(what, sizeof(what), "more than %zu bytes of JSON text", e->max_bytes);
        return fail(e, depth, what);
    }
    lua_State *L = e->L;
    size_t len;
    const char *s;
    switch (type) {
    case LUA_TNIL:
        agw_buf_puts(e->out, "null");
        return 0;
    case LUA_TBOOLEAN:
        agw_buf_puts(e->out, lua_toboolean(L, idx) ? "true" : "false");
        return 0;
    case LUA_TNUMBER:
        agw_json_encode_number(e->out, lua_tonumber(L, idx));
        return 0;
    case LUA_TSTRING:
        s = lua_tolstring(L, idx, &len);
        /* a string may take up to 6 times its bytes (control characters): near the bound, the
         * bytes it would take are counted first (agw_json_encode_max's bound holds the C buffer
         * too, not only the text) */
        if (e->out->len + 6 * len + 2 > e->max_bytes && e->out->len + escaped_len(s, len) > e->max_bytes) {
            char what[64];
            snprintf(what, sizeof(what), "more than %zu bytes of JSON text", e->max_bytes);
            return fail(e, depth, what);
        }
        if (agw_json_encode_string(e->out, s, len) != 0)
            return fail(e, depth, "invalid UTF-8 in string");
        return 0;
    case LUA_TTABLE: {
        int top = lua_gettop(L);
        int rc = encode_table(e, idx, depth);
        lua_settop(L, top);
        return rc;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL) {
            agw_buf_puts(e->out, "null");
            return 0;
        }
        return fail(e, depth, "cannot encode light userdata");
    case LUA_TUSERDATA:
        return encode_userdata(e, idx, depth);
    case LUA_TFUNCTION: {
        agw_json_raw_t r;
        if (agw_json_check_raw_ref(L, idx, &r))
            return encode_raw(e, &r, depth);
        return fail(e, depth, "cannot encode function");
    }
    default: {
        char what[48];
        snprintf(what, sizeof(what), "cannot encode %s", lua_typename(L, lua_type(L, idx)));
        return fail(e, depth, what);
    }
    }
}

static int encode_value(enc_t *e, int idx, int depth)
{
    return encode_typed(e, idx, lua_type(e->L, idx), depth);
}

/* Sets up e for L (the registry tables' slots above the stack's top, see enc_t) and returns 0, or
 * -1 with the error recorded when the stack cannot grow. */
static int enc_begin(enc_t *e, lua_State *L, agw_buf_t *out, char *err, size_t errlen)
{
    /* field by field: the path and the key scratch (6 KB) are written before they are read, and
     * zeroing them cost more than encoding a page of raw refs */
    e->L = L, e->out = out, e->err = err, e->errlen = errlen;
    e->failed = 0, e->have = 0, e->tables_left = AGW_JSON_ENCODE_MAX_TABLES;
    e->max_bytes = AGW_JSON_ENCODE_MAX_BYTES;
    e->keys = e->inline_keys, e->nkeys = 0, e->capkeys = sizeof(e->inline_keys) / sizeof(e->inline_keys[0]);
    if (!lua_checkstack(L, 13))
        return fail(e, 0, "out of Lua stack");
    e->regs = lua_gettop(L) + 1;
    lua_settop(L, e->regs + AGW_JSON_NKEYS - 1); /* the slots, nil until reg() fills them */
    return 0;
}

static void enc_end(enc_t *e, int top)
{
    lua_settop(e->L, top);
    if (e->keys != e->inline_keys)
        free(e->keys);
}

int agw_json_encode_max(lua_State *L, int idx, agw_buf_t *out, size_t max_bytes, char *err, size_t errlen)
{
    if (idx < 0 && idx > LUA_REGISTRYINDEX)
        idx = lua_gettop(L) + idx + 1;
    int top = lua_gettop(L);
    enc_t enc, *e = &enc;
    int rc = enc_begin(e, L, out, err, errlen);
    if (max_bytes < e->max_bytes)
        e->max_bytes = max_bytes;
    if (rc == 0)
        rc = encode_value(e, idx, 0);
    enc_end(e, top);
    return rc;
}

int agw_json_encode(lua_State *L, int idx, agw_buf_t *out, char *err, size_t errlen)
{
    return agw_json_encode_max(L, idx, out, AGW_JSON_ENCODE_MAX_BYTES, err, errlen);
}

/* ---- rows ---- */

/* A row of agw_json_encode_rows: its key (held by the rows table) and its 0-based place. */
typedef struct {
    skey k;
    int at;
} row_t;

int agw_json_encode_rows(lua_State *L, int idx, const char *const *members, int nmembers, agw_buf_t *out, char *err,
                         size_t errlen)
{
    if (idx < 0 && idx > LUA_REGISTRYINDEX)
        idx = lua_gettop(L) + idx + 1;
    int top = lua_gettop(L);
    enc_t enc, *e = &enc;
    row_t small[32], *rows = small;
    size_t n = 0, cap = sizeof(small) / sizeof(small[0]);
    int width = 1 + nmembers, rc = enc_begin(e, L, out, err, errlen);
    size_t mlen[AGW_JSON_ROW_MEMBERS];
    if (rc == 0 && (nmembers < 0 || nmembers > AGW_JSON_ROW_MEMBERS || !lua_checkstack(L, nmembers + 2)))
        rc = fail(e, 0, "too many members");
    for (int m = 0; rc == 0 && m < nmembers; m++) { /* written as they are: names that need no escape */
        mlen[m] = strlen(members[m]);
        for (size_t j = 0; j < mlen[m]; j++)
            if (NOT_PLAIN[(unsigned char)members[m][j]])
                rc = fail(e, 0, "a member name needs an escape");
    }
    /* the keys, sorted bytewise as a plain table's (insertion: a page's rows come sorted) */
    while (rc == 0) {
        lua_rawgeti(L, idx, (int)n * width + 1);
        int kt = lua_type(L, -1);
        if (kt == LUA_TNIL) {
            lua_pop(L, 1);
            break;
        }
        if (kt != LUA_TSTRING) {
            e->path[1] = (step_t){NULL, n * (size_t)width};
            rc = fail(e, 1, "row key not a string");
            break;
        }
        if (n == cap) {
            cap *= 2;
            row_t *r = rows == small ? agw_malloc(cap * sizeof(*r)) : agw_realloc(rows, cap * sizeof(*r));
            if (rows == small)
                memcpy(r, small, sizeof(small));
            rows = r;
        }
        row_t x = {.at = (int)n};
        x.k.s = lua_tolstring(L, -1, &x.k.len); /* the rows table keeps the string alive */
        lua_pop(L, 1);
        size_t j = n++;
        for (; j > 0 && key_cmp(&x.k, &rows[j - 1].k) < 0; j--)
            rows[j] = rows[j - 1];
        rows[j] = x;
        if (j > 0 && key_cmp(&x.k, &rows[j - 1].k) == 0) {
            e->path[1] = (step_t){x.k.s, x.k.len};
            rc = fail(e, 1, "duplicate key");
        }
    }
    if (rc == 0)
        agw_buf_putc(out, '{');
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const row_t *r = &rows[i];
        e->path[1] = (step_t){r->k.s, r->k.len};
        if (i)
            agw_buf_putc(out, ',');
        if (agw_json_encode_string(out, r->k.s, r->k.len) != 0) {
            rc = fail(e, 1, "invalid UTF-8 in key");
            break;
        }
        agw_buf_putc(out, ':');
        agw_buf_putc(out, '{');
        int row = lua_gettop(L), written = 0;
        for (int m = 0; m < nmembers; m++)
            lua_rawgeti(L, idx, r->at * width + 2 + m);
        for (int m = 0; rc == 0 && m < nmembers; m++) {
            int type = lua_type(L, row + 1 + m);
            if (type == LUA_TNIL)
                continue;
            e->path[2] = (step_t){members[m], mlen[m]};
            agw_buf_reserve(out, mlen[m] + 4); /* [,]"name": */
            char *o = out->base + out->len;
            if (written++)
                *o++ = ',';
            *o++ = '"';
            memcpy(o, members[m], mlen[m]);
            o += mlen[m];
            *o++ = '"';
            *o++ = ':';
            *o = '\0';
            out->len = (size_t)(o - out->base);
            rc = encode_typed(e, row + 1 + m, type, 2);
        }
        lua_settop(L, row);
        agw_buf_putc(out, '}');
    }
    if (rc == 0)
        agw_buf_putc(out, '}');
    if (rows != small)
        free(rows);
    enc_end(e, top);
    return rc;
}
