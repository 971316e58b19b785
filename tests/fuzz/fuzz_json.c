/* fuzz_json.c: JSON from an upstream to the page (gateway/json/json.h, DESIGN §2.3), differential
 * against jansson.
 *
 * The input is an upstream body. agw_json_validate must accept exactly what jansson's json_loadb
 * accepts with the settings agw_json_parse uses (JSON_DECODE_ANY | JSON_ALLOW_NUL: any top-level
 * value, "\u0000" in strings), with two deliberate differences: nesting deeper than
 * AGW_JSON_MAX_DEPTH (256) is refused, where jansson goes to 2048; and a NUL byte is refused
 * anywhere, where jansson stops reading at one after a value ("[1\0]" loads as [1]; RFC 8259 has
 * no NUL outside a string's \u escape). agw_json_parse must agree with the validator. For an accepted text, each path the gateway has to the page must give JSON that
 * jansson reads back equal to the input (json_equal: same types, integers exact, reals the same
 * double, same members, same elements):
 *   Lua values   agw_json_push_text (what a script sees) then agw_json_encode;
 *   raw ref      agw_json_push_raw_ref with the validator's compact flag, then agw_json_encode
 *                (a compact text is copied verbatim, so the flag must be right);
 *   tree ref     jansson's tree through agw_json_encode_value;
 *   page rows    the raw ref and the Lua values as two sections of a page (agw_json_encode_rows),
 *                each giving the bytes it gave on its own;
 * and the Lua path and the tree path must give the same bytes (same key order, same number forms),
 * so a section reads the same whether or not its script touched it. */
#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"

static lua_State *L;
static agw_buf_t text, lua_out, raw_out, tree_out;

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_json: %s%s%s\ninput: %.*s\n", what, detail ? ": " : "", detail ? detail : "",
            (int)(text.len > 2000 ? 2000 : text.len), text.base);
    abort();
}

/* Depth of v's nesting (a scalar is 0). */
static unsigned depth_of(json_t *v)
{
    unsigned d = 0;
    if (json_is_object(v)) {
        const char *k;
        json_t *m;
        json_object_foreach(v, k, m) {
            unsigned x = depth_of(m);
            if (x > d)
                d = x;
        }
        return d + 1;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *m;
        json_array_foreach(v, i, m) {
            unsigned x = depth_of(m);
            if (x > d)
                d = x;
        }
        return d + 1;
    }
    return 0;
}

/* 1 when the text has whitespace outside strings. */
static int has_outer_space(const char *s, size_t n)
{
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in = 0;
        } else if (c == '"') {
            in = 1;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            return 1;
        }
    }
    return 0;
}

/* json_equal, and object members in the same order; with lua_numbers, an integer equals a real
 * of the same value when it is within ±2^53 (a Lua number). */
static int same_tree(json_t *a, json_t *b, int lua_numbers)
{
    if (lua_numbers && json_is_number(a) && json_is_number(b) && (json_is_real(a) || json_is_real(b))) {
        json_t *i = json_is_integer(a) ? a : json_is_integer(b) ? b : NULL, *r = i == a ? b : a;
        if (i == NULL)
            return json_real_value(a) == json_real_value(b);
        /* exactly the real's value (14590901234567889.0 is the double 14590901234567888) */
        double d = json_real_value(r);
        return d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (json_int_t)d == json_integer_value(i);
    }
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b))
            return 0;
        void *ia = json_object_iter(a), *ib = json_object_iter(b);
        for (; ia && ib; ia = json_object_iter_next(a, ia), ib = json_object_iter_next(b, ib))
            if (strcmp(json_object_iter_key(ia), json_object_iter_key(ib)) != 0 ||
                !same_tree(json_object_iter_value(ia), json_object_iter_value(ib), lua_numbers))
                return 0;
        return ia == NULL && ib == NULL;
    }
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_tree(json_array_get(a, i), json_array_get(b, i), lua_numbers))
                return 0;
        return 1;
    }
    return json_equal(a, b);
}

/* Reads out back with jansson and compares it with want. */
static void same_json(const char *path, const agw_buf_t *out, json_t *want, int lua_numbers)
{
    json_error_t je;
    json_t *back = json_loadb(out->base, out->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (back == NULL) {
        fprintf(stderr, "output: %.*s\n", (int)out->len, out->base);
        fail(path, je.text);
    }
    if (!same_tree(back, want, lua_numbers)) {
        fprintf(stderr, "output: %.*s\n", (int)out->len, out->base);
        fail(path, "reads back different from the input");
    }
    json_decref(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL) {
        L = luaL_newstate();
        luaL_openlibs(L);
        agw_json_open(L);
        lua_pop(L, 1);
    }
    agw_buf_reset(&text);
    agw_buf_append(&text, data, size);
    agw_buf_putc(&text, '\0');
    text.len = size;

    char err[256];
    int compact = -1;
    int ok = agw_json_validate(text.base, size, AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) == 0;
    json_error_t je;
    json_t *j = json_loadb(text.base, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    json_t *parsed = NULL;
    char perr[256];
    int pok = agw_json_parse(text.base, size, AGW_JSON_MAX_DEPTH, &parsed, perr, sizeof(perr)) == 0;
    json_decref(parsed);
    if (pok != ok)
        fail(ok ? "agw_json_parse refuses what the validator accepts" : "agw_json_parse accepts what the validator refuses",
             ok ? perr : err);
    if (!ok && compact != 0)
        fail("a refused text must report compact = 0", NULL);

    if (j == NULL) {
        if (ok)
            fail("validator accepts what jansson refuses", je.text);
        return 0;
    }
    if (!ok) {
        /* the deliberate differences: deeper than AGW_JSON_MAX_DEPTH, or a NUL byte */
        if (depth_of(j) <= AGW_JSON_MAX_DEPTH && memchr(text.base, '\0', size) == NULL)
            fail("validator refuses what jansson accepts", err);
        json_decref(j);
        return 0;
    }
    if (depth_of(j) > AGW_JSON_MAX_DEPTH)
        fail("validator accepts nesting over its limit", NULL);
    if (compact != !has_outer_space(text.base, size))
        fail("wrong compact flag", NULL);

    int top = lua_gettop(L);
    agw_buf_reset(&lua_out);
    agw_json_push_text(L, text.base, text.len);
    if (agw_json_encode(L, -1, &lua_out, err, sizeof(err)) != 0)
        fail("encoding the Lua values fails", err);
    lua_settop(L, top);
    same_json("Lua values", &lua_out, j, 1);

    agw_buf_reset(&raw_out);
    agw_json_push_raw_ref(L, text.base, size, compact, NULL, 0);
    if (agw_json_encode(L, -1, &raw_out, err, sizeof(err)) != 0)
        fail("encoding the raw ref fails", err);
    lua_settop(L, top);
    same_json("raw ref", &raw_out, j, 0);

    /* a page of two sections as rows (worker/respond.c): the raw ref spliced, the Lua values
     * walked, each the bytes it gave on its own */
    static const char *const members[] = {"status", "data", "error"};
    lua_createtable(L, 8, 0);
    const char *cells[] = {"t", "ok", NULL, NULL, "s", "ok"};
    for (int i = 0; i < 6; i++)
        if (cells[i]) {
            lua_pushstring(L, cells[i]);
            lua_rawseti(L, -2, i + 1);
        }
    agw_json_push_text(L, text.base, text.len);
    lua_rawseti(L, -2, 3);
    agw_json_push_raw_ref(L, text.base, size, compact, NULL, 0);
    lua_rawseti(L, -2, 7);
    agw_buf_reset(&tree_out);
    if (agw_json_encode_rows(L, -1, members, 3, &tree_out, err, sizeof(err)) != 0)
        fail("encoding a page's rows fails", err);
    lua_settop(L, top);
    agw_buf_t want = AGW_BUF_INIT;
    agw_buf_printf(&want, "{\"s\":{\"status\":\"ok\",\"data\":%s},\"t\":{\"status\":\"ok\",\"data\":%s}}",
                   raw_out.base, lua_out.base);
    if (want.len != tree_out.len || memcmp(want.base, tree_out.base, want.len) != 0)
        fail("a page's rows differ from their sections' encodings", tree_out.base);
    agw_buf_free(&want);

    agw_buf_reset(&tree_out);
    agw_json_encode_value(j, &tree_out);
    same_json("tree ref", &tree_out, j, 0);
    json_decref(j);
    if (lua_gc(L, LUA_GCCOUNT, 0) > 64 * 1024)
        lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}
