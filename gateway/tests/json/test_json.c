/* test_json.c: what JSON the gateway accepts (DESIGN §2.3): agw_json_validate, the one-pass check
 * of an upstream body, and agw_json_parse (jansson), with jansson as the reference: the validator
 * accepts exactly what jansson parses (less jansson's NUL quirks), and the one-pass push
 * (json/push.c) gives the same Lua values as jansson's tree. Errors name the byte, nesting and
 * integer range have their limits. The encoder: test_json_encode.c; refs: test_json_ref.c. */
#include "tests/json/json_fixture.h"

static void invalid_utf8_fails_parse(void)
{
    json_t *v = (json_t *)1;
    CHECK(agw_json_parse("[\"\xff\"]", 5, 8, &v, err, sizeof(err)) == -1);
    CHECK(v == NULL);
    CHECK(strstr(err, "invalid UTF-8") != NULL);
    CHECK(strchr(err, '\n') == NULL);
}

static void nesting_beyond_limit_fails_parse(void)
{
    char deep[600];
    int n = 257;
    memset(deep, '[', (size_t)n);
    memset(deep + n, ']', (size_t)n);
    json_t *v;
    CHECK(agw_json_parse(deep, 2 * (size_t)n, AGW_JSON_MAX_DEPTH, &v, err, sizeof(err)) == -1);
    CHECK_STR(err, "nesting deeper than 256 levels");
    CHECK(agw_json_parse(deep + 1, 2 * (size_t)n - 2, AGW_JSON_MAX_DEPTH, &v, err, sizeof(err)) == 0);
    json_decref(v);
    /* brackets inside strings, escaped quotes included, do not count */
    const char *s = "[\"[[[[\\\"{{{{\",{\"k[\":1}]";
    CHECK(agw_json_parse(s, strlen(s), 2, &v, err, sizeof(err)) == 0);
    json_decref(v);
    CHECK(agw_json_parse("[[[1]]]", 7, 2, &v, err, sizeof(err)) == -1);
}

static void integer_beyond_int64_fails_parse(void)
{
    json_t *v;
    CHECK(agw_json_parse("[9223372036854775808]", 21, 8, &v, err, sizeof(err)) == -1);
    CHECK(strstr(err, "integer beyond int64") != NULL);
    CHECK(agw_json_parse("-9223372036854775809", 20, 8, &v, err, sizeof(err)) == -1);
    CHECK(strstr(err, "integer beyond int64") != NULL);
}

static void invalid_json_fails_with_position(void)
{
    json_t *v;
    CHECK(agw_json_parse("{\"a\":}", 6, 8, &v, err, sizeof(err)) == -1);
    CHECK(strncmp(err, "invalid JSON: ", 14) == 0 && strstr(err, "line 1 column") != NULL);
    CHECK(agw_json_parse("", 0, 8, &v, err, sizeof(err)) == -1);
    CHECK(agw_json_parse("[1] x", 5, 8, &v, err, sizeof(err)) == -1);
}

typedef struct {
    const char *s;
    size_t len;
} text_t;

#define T(lit) {lit, sizeof(lit) - 1}

/* Valid JSON texts, each accepted by jansson too. */
static const text_t valid_texts[] = {
    T("{}"), T("[]"), T("{\"a\":[1,{\"b\":null}],\"c\":{}}"), T("[[[[[]]]]]"), T("[{},[],{\"\":\"\"}]"),
    T("0"), T("-0"), T("1e5"), T("1E+5"), T("1e-5"), T("0.5"), T("-0.5e-3"), T("123.456E78"), T("-1.5e-400"),
    T("9223372036854775807"), T("-9223372036854775808"), T("[9223372036854775807,-9223372036854775808]"),
    T("9223372036854775808.0"), T("1e308"), T("1.7976931348623157e308"), T("17976931348623157e292"),
    T("true"), T("false"), T("null"), T("\"\""), T(" \t\r\n 42 \n"), T("\n\"s\"\t"), T("  null  "),
    T("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\""), T("\"\\u0000\""), T("\"a\\u0000b\""), T("\"\\u00e9\\u20AC\""),
    T("\"\\ud83d\\ude00\""), T("\"\\uDBFF\\uDFFF\""), T("\"\\uFFFF\""), T("\"\xc2\x80\xdf\xbf\""),
    T("\"\xe0\xa0\x80\xed\x9f\xbf\xef\xbf\xbf\""), T("\"\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\""), T("\"é😀ไทย\""),
    T("\"\x7f\""), T("{\"a\":1,\"a\":2}"), T("[ 1 , 2 , { \"k\" : [ ] } ]"),
    T("\"a long ascii string that spans several eight byte words, with / and ~ and DEL \x7f in it\""),
};

/* Invalid texts, each rejected by jansson too. */
static const text_t invalid_texts[] = {
    T(""), T("   "), T("[1,]"), T("{\"a\":1,}"), T("[1 2]"), T("{\"a\" 1}"), T("{\"a\":}"), T("{a:1}"),
    T("{1:1}"), T("01"), T("-01"), T("1."), T(".5"), T("+1"), T("-"), T("1e"), T("1e+"), T("1.e5"), T("NaN"),
    T("Infinity"), T("-Infinity"), T("0x10"), T("'a'"), T("['a']"), T("\"abc"), T("\"abc\\\""), T("\"\\"),
    T("\"a\x01\""), T("\"a\nb\""), T("\"a\tb\""), T("\"a\0b\""), T("\"\\x41\""), T("\"\\u12\""), T("\"\\u12G4\""),
    T("\"\\ud800\""), T("\"\\ud800x\""), T("\"\\ud800\\u0041\""), T("\"\\udc00\""), T("\"\\udc00\\ud800\""),
    T("\"\xff\""), T("\"\x80\""), T("\"\xc0\xaf\""), T("\"\xc1\xbf\""), T("\"\xe0\x80\xaf\""), T("\"\xed\xa0\x80\""),
    T("\"\xf4\x90\x80\x80\""), T("\"\xf5\x80\x80\x80\""), T("\"\xe2\x82\""), T("\"\xc3\""), T("\"\xf0\x9f\x98\""),
    T("\"\xc3\x28\""), T("\xef\xbb\xbf{}"), T("[1] [2]"), T("1 2"), T("{}{}"), T("[1] x"), T("truex"), T("tru"),
    T("nul"), T("True"), T("[1,,2]"), T("[,1]"), T("]"), T("[}"), T("{]"), T("[[]"), T("{\"a\":1"), T("\0"),
    T("9223372036854775808"), T("-9223372036854775809"), T("12345678901234567890"), T("1e309"), T("-1e309"),
    T("1.8e308"), T("17976931348623159e292"), T("0.1e310"), T("[1e400]"), T("é"), T("[\"a\"\x80]"),
};

static int validate(const text_t *t, unsigned depth, int *compact)
{
    return agw_json_validate(t->s, t->len, depth, compact, err, sizeof(err));
}

static void validator_accepts_valid_json(void)
{
    for (size_t i = 0; i < sizeof(valid_texts) / sizeof(valid_texts[0]); i++) {
        int compact = -1;
        if (validate(&valid_texts[i], AGW_JSON_MAX_DEPTH, &compact) != 0) {
            fprintf(stderr, "rejected valid #%zu %.*s: %s\n", i, (int)valid_texts[i].len, valid_texts[i].s, err);
            check_failures++;
        }
        CHECK(compact == 0 || compact == 1);
    }
    /* a length, not a NUL, ends the text */
    CHECK(agw_json_validate("[1]xyz", 3, 8, NULL, NULL, 0) == 0);
    CHECK(agw_json_validate("\"a\"\"", 3, 8, NULL, NULL, 0) == 0);
}

/* The one-pass push (json/push.c) gives the same values as jansson's tree for every valid text. */
static void text_push_agrees_with_jansson_tree(void)
{
    lua_State *L = new_state();
    for (size_t i = 0; i < sizeof(valid_texts) / sizeof(valid_texts[0]); i++) {
        char text[512];
        const text_t *v = &valid_texts[i];
        if (v->len >= sizeof(text) || memchr(v->s, '\0', v->len))
            continue;
        memcpy(text, v->s, v->len);
        text[v->len] = '\0';
        json_t *tree = NULL;
        if (agw_json_parse(text, v->len, AGW_JSON_MAX_DEPTH, &tree, err, sizeof(err)) != 0)
            continue; /* texts jansson refuses are covered by validator_agrees_with_jansson */
        agw_json_push(L, tree);
        json_decref(tree);
        agw_buf_t a = AGW_BUF_INIT, b = AGW_BUF_INIT;
        CHECK(agw_json_encode(L, -1, &a, err, sizeof(err)) == 0);
        agw_json_push_text(L, text, v->len);
        CHECK(agw_json_encode(L, -1, &b, err, sizeof(err)) == 0);
        if (a.base == NULL || b.base == NULL || strcmp(a.base, b.base) != 0) {
            fprintf(stderr, "text #%zu %s: tree gives %s, one-pass push gives %s\n", i, text, a.base, b.base);
            check_failures++;
        }
        agw_buf_free(&a);
        agw_buf_free(&b);
        lua_settop(L, 0);
    }
    lua_close(L);
}

/* Objects of more members than the push parser keeps on the stack before making the table
 * (json/push.c OBJECT_PENDING_MAX), with repeated keys on both sides of that mark and nested
 * objects: the same values, key order and stack as jansson's tree. */
static void text_push_of_big_objects_agrees_with_jansson_tree(void)
{
    lua_State *L = new_state();
    static const int sizes[] = {5, 31, 32, 33, 40, 1000};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        agw_buf_t text = AGW_BUF_INIT;
        agw_buf_putc(&text, '{');
        for (int i = 0; i < sizes[s]; i++) {
            /* every 7th member repeats an earlier key (first place kept, last value wins) */
            int k = (i % 7 == 6) ? i / 2 : i;
            agw_buf_printf(&text, "%s\"k%d\":%s%d%s", i ? "," : "", k, i % 5 == 0 ? "{\"in\":" : "", i,
                           i % 5 == 0 ? "}" : "");
        }
        agw_buf_putc(&text, '}');
        json_t *tree = NULL;
        CHECK(agw_json_parse(text.base, text.len, AGW_JSON_MAX_DEPTH, &tree, err, sizeof(err)) == 0);
        if (tree == NULL) {
            agw_buf_free(&text);
            continue;
        }
        agw_json_push(L, tree);
        json_decref(tree);
        agw_buf_t a = AGW_BUF_INIT, b = AGW_BUF_INIT;
        CHECK(agw_json_encode(L, -1, &a, err, sizeof(err)) == 0);
        agw_json_push_text(L, text.base, text.len);
        CHECK(lua_gettop(L) == 2);
        CHECK(agw_json_encode(L, -1, &b, err, sizeof(err)) == 0);
        if (a.base == NULL || b.base == NULL || strcmp(a.base, b.base) != 0) {
            fprintf(stderr, "object of %d members: tree gives %.200s…, one-pass push gives %.200s…\n", sizes[s],
                    a.base, b.base);
            check_failures++;
        }
        agw_buf_free(&a);
        agw_buf_free(&b);
        agw_buf_free(&text);
        lua_settop(L, 0);
    }
    lua_close(L);
}

/* Strings of every length from 0 to 40 bytes, with an escape, a two-byte UTF-8 character or
 * nothing special at every place, as the whole text (its closing quote the text's last byte) and
 * inside an array: the one-pass push (which scans eight bytes at a time while eight are left
 * before the text's end) gives the string's exact bytes. Each text is in a block of its own size,
 * so the ASan build catches a read past its NUL. */
static void text_push_reads_strings_of_every_length_exactly(void)
{
    lua_State *L = new_state();
    static const struct {
        const char *in, *out; /* as written in JSON, as decoded */
    } specials[] = {{"", ""}, {"\\n", "\n"}, {"\\\"", "\""}, {"\\\\", "\\"}, {"\\u00e9", "\xc3\xa9"}, {"\xc3\xa9", "\xc3\xa9"}};
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) {
        for (size_t n = 0; n <= 40; n++) {
            for (size_t at = 0; at <= n; at++) {
                if (k == 0 && at > 0)
                    break; /* nothing special: one text per length */
                for (int in_array = 0; in_array < 2; in_array++) {
                    char json[128], want[64];
                    size_t j = 0, w = 0;
                    if (in_array)
                        json[j++] = '[';
                    json[j++] = '"';
                    for (size_t i = 0; i <= n; i++) {
                        if (i == at) {
                            size_t li = strlen(specials[k].in), lo = strlen(specials[k].out);
                            memcpy(json + j, specials[k].in, li), j += li;
                            memcpy(want + w, specials[k].out, lo), w += lo;
                        }
                        if (i < n)
                            json[j++] = want[w++] = (char)('a' + i % 26);
                    }
                    json[j++] = '"';
                    if (in_array)
                        json[j++] = ',', json[j++] = '1', json[j++] = ']';
                    char *text = malloc(j + 1);
                    CHECK(text != NULL);
                    if (text == NULL)
                        continue;
                    memcpy(text, json, j);
                    text[j] = '\0';
                    CHECK(agw_json_validate(text, j, AGW_JSON_MAX_DEPTH, NULL, err, sizeof(err)) == 0);
                    agw_json_push_text(L, text, j);
                    if (in_array)
                        lua_rawgeti(L, -1, 1);
                    size_t got_len = 0;
                    const char *got = lua_tolstring(L, -1, &got_len);
                    if (got == NULL || got_len != w || memcmp(got, want, w) != 0) {
                        fprintf(stderr, "text %s: pushed %.*s (%zu bytes), want %zu bytes\n", text, (int)got_len,
                                got ? got : "", got_len, w);
                        check_failures++;
                    }
                    lua_settop(L, 0);
                    free(text);
                }
            }
        }
    }
    lua_close(L);
}

/* Encodes the value on top of the stack (popped) into the fixture's `out`. */
static const char *encode_top(lua_State *L)
{
    agw_buf_reset(&out);
    int rc = agw_json_encode(L, -1, &out, err, sizeof(err));
    lua_pop(L, 1);
    return rc == 0 ? out.base : err;
}

/* Encodes text pushed by the one-pass push; the bytes stay in *b (freed by the caller). */
static int pushed_encoding(lua_State *L, const char *text, agw_buf_t *b)
{
    agw_json_push_text(L, text, strlen(text));
    int rc = agw_json_encode(L, -1, b, err, sizeof(err));
    return rc;
}

/* Objects of one shape (the same keys in the same order) share one key-order list (json/push.c
 * shape_list): what a script does to one object never changes how another encodes; shapes that
 * differ only in length, in a key's bytes, by an escaped key, a repeated key or keys too long to
 * remember each keep their own order; and more shapes than a VM remembers, kept alive together,
 * each still encode in their order. */
static void objects_of_one_shape_share_a_key_order_that_none_changes(void)
{
    lua_State *L = new_state();
    agw_json_push_text(L, "{\"b\":1,\"a\":2,\"c\":3}", 19);
    lua_setglobal(L, "t1");
    agw_json_push_text(L, "{\"b\":4,\"a\":5,\"c\":6}", 19);
    lua_setglobal(L, "t2");
    CHECK(luaL_dostring(L, "t1.z = 9; t1.b = nil; t1.a = 'x'") == 0);
    lua_getglobal(L, "t1");
    CHECK_STR(encode_top(L), "{\"a\":\"x\",\"c\":3,\"z\":9}");
    lua_getglobal(L, "t2");
    CHECK_STR(encode_top(L), "{\"b\":4,\"a\":5,\"c\":6}");
    lua_settop(L, 0);
    static const char *const texts[] = {
        "{\"b\":1,\"a\":2,\"c\":3}", "{\"b\":1,\"a\":2}", "{\"b\":1,\"a\":2,\"c\":3,\"d\":4}", "{\"bb\":1,\"a\":2,\"c\":3}",
        "{\"c\":1,\"a\":2,\"b\":3}", "{\"\\u0062\":1,\"a\":2,\"c\":3}", "{\"b\":1,\"a\":2,\"b\":3}",
        "{\"a\\\"b\":1,\"a\":2}", "{\"b\":{\"y\":1,\"x\":2},\"a\":[{\"y\":1,\"x\":2},{\"x\":1,\"y\":2}]}",
    };
    for (int round = 0; round < 2; round++) /* the second round finds every shape remembered */
        for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
            agw_buf_t b = AGW_BUF_INIT;
            CHECK(pushed_encoding(L, texts[i], &b) == 0);
            CHECK_STR(b.base, via_lua(L, texts[i]));
            agw_buf_free(&b);
            lua_settop(L, 0);
        }
    /* keys of more bytes than a shape holds, then 300 shapes kept alive at once */
    agw_buf_t text = AGW_BUF_INIT, b = AGW_BUF_INIT;
    agw_buf_putc(&text, '{');
    for (int i = 0; i < 12; i++)
        agw_buf_printf(&text, "%s\"%031d\":%d", i ? "," : "", 12 - i, i);
    agw_buf_putc(&text, '}');
    for (int round = 0; round < 2; round++) {
        agw_buf_reset(&b);
        CHECK(pushed_encoding(L, text.base, &b) == 0);
        CHECK_STR(b.base, via_lua(L, text.base));
        lua_settop(L, 0);
    }
    for (int i = 0; i < 300; i++) {
        agw_buf_reset(&text);
        agw_buf_printf(&text, "{\"k%d\":1,\"x\":2,\"a%d\":3}", i, 300 - i);
        agw_json_push_text(L, text.base, text.len);
    }
    for (int i = 0; i < 300; i++) {
        agw_buf_reset(&b);
        CHECK(agw_json_encode(L, i + 1, &b, err, sizeof(err)) == 0);
        char want[64];
        snprintf(want, sizeof(want), "{\"k%d\":1,\"x\":2,\"a%d\":3}", i, 300 - i);
        CHECK_STR(b.base, want);
    }
    agw_buf_free(&text);
    agw_buf_free(&b);
    lua_close(L);
}

static void validator_rejects_invalid_json(void)
{
    for (size_t i = 0; i < sizeof(invalid_texts) / sizeof(invalid_texts[0]); i++) {
        int compact = -1;
        err[0] = '\0';
        if (validate(&invalid_texts[i], AGW_JSON_MAX_DEPTH, &compact) != -1) {
            fprintf(stderr, "accepted invalid #%zu %.*s\n", i, (int)invalid_texts[i].len, invalid_texts[i].s);
            check_failures++;
        }
        CHECK(compact == 0);
        CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
    }
    /* a string cut anywhere inside a multi-byte sequence or escape is rejected */
    const char *s = "[\"\xf0\x9f\x98\x80\\ud83d\\ude00\"]";
    for (size_t n = 0; n < strlen(s); n++)
        CHECK(agw_json_validate(s, n, 8, NULL, NULL, 0) == -1);
    CHECK(agw_json_validate(s, strlen(s), 8, NULL, NULL, 0) == 0);
}

static void validator_errors_name_the_byte(void)
{
    CHECK(agw_json_validate("[\"ab\xff\"]", 6, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid UTF-8 at byte 4");
    CHECK(agw_json_validate("[1,]", 4, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 3: expected a value");
    CHECK(agw_json_validate("{\"a\" 1}", 7, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 5: expected ':'");
    CHECK(agw_json_validate("[1 2]", 5, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 3: expected ',' or ']'");
    CHECK(agw_json_validate("{\"a\":1 2", 8, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 7: expected ',' or '}'");
    CHECK(agw_json_validate("1 x", 3, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 2: expected end of input");
    CHECK(agw_json_validate("\"abc", 4, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 4: unterminated string");
    CHECK(agw_json_validate("01", 2, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 0: leading zero in a number");
    CHECK(agw_json_validate("\"\\ud800\"", 8, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 1: lone surrogate in \\u escape");
    CHECK(agw_json_validate("[\"a\x01\"]", 5, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 3: control character in string");
    CHECK(agw_json_validate("[1,9223372036854775808]", 23, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "integer beyond int64 at byte 3");
    CHECK(agw_json_validate("[1e309]", 7, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "number out of range at byte 1");
    CHECK(agw_json_validate("", 0, 8, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 0: expected a value");
}

static void validator_finds_special_bytes_at_every_offset(void)
{
    /* a control character, an escape and a 2-byte character at each offset of a 41-byte string,
     * so every lane of the eight-byte scan and the byte-wise tail are exercised */
    char s[64];
    for (size_t i = 0; i < 40; i++) {
        char want[64];
        memset(s, 'a', sizeof(s));
        s[0] = '"';
        s[42] = '"';
        s[1 + i] = '\x01';
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == -1);
        snprintf(want, sizeof(want), "invalid JSON at byte %zu: control character in string", 1 + i);
        CHECK_STR(err, want);
        s[1 + i] = '\xc3'; /* é (2 bytes) in place of two a's */
        s[2 + i] = '\xa9';
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == 0);
        s[2 + i] = 'a'; /* a lead byte without its continuation */
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == -1);
        snprintf(want, sizeof(want), "invalid UTF-8 at byte %zu", 1 + i);
        CHECK_STR(err, want);
        s[1 + i] = '\\';
        s[2 + i] = 'n';
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == 0);
        s[2 + i] = 'q';
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == -1);
        s[1 + i] = '"'; /* an early end leaves trailing bytes */
        CHECK(agw_json_validate(s, 43, 8, NULL, err, sizeof(err)) == -1);
        snprintf(want, sizeof(want), "invalid JSON at byte %zu: expected end of input", 2 + i);
        CHECK_STR(err, want);
    }
}

static void validator_limits_nesting_depth(void)
{
    char deep[2 * 2100];
    for (unsigned n = 1; n <= 300; n++) {
        memset(deep, '[', n);
        memset(deep + n, ']', n);
        CHECK(agw_json_validate(deep, 2 * (size_t)n, AGW_JSON_MAX_DEPTH, NULL, err, sizeof(err)) == (n <= 256 ? 0 : -1));
    }
    CHECK_STR(err, "nesting deeper than 256 levels");
    CHECK(agw_json_validate("{\"a\":{\"b\":[1]}}", 15, 3, NULL, err, sizeof(err)) == 0);
    CHECK(agw_json_validate("{\"a\":{\"b\":[1]}}", 15, 2, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "nesting deeper than 2 levels");
    CHECK(agw_json_validate("1", 1, 0, NULL, err, sizeof(err)) == 0);
    CHECK(agw_json_validate("[]", 2, 0, NULL, err, sizeof(err)) == -1);
    /* brackets inside strings, escaped quotes included, do not count */
    const char *s = "[\"[[[[\\\"{{{{\",{\"k[\":1}]";
    CHECK(agw_json_validate(s, strlen(s), 2, NULL, err, sizeof(err)) == 0);
    /* jansson's own limit, 2048, caps a larger max_depth; crossing a 64-level word is fine */
    memset(deep, '[', 2049);
    memset(deep + 2049, ']', 2049);
    CHECK(agw_json_validate(deep, 2 * 2049, 100000, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "nesting deeper than 2048 levels");
    CHECK(agw_json_validate(deep + 1, 2 * 2048, 100000, NULL, err, sizeof(err)) == 0);
    /* mixed objects and arrays 2048 deep: every level's kind is remembered across 64-bit words */
    static char mixed[2048 * 5];
    size_t n = 0;
    for (int i = 0; i < 2048; i++)
        n += (size_t)(i % 3 ? (mixed[n] = '[', 1) : (memcpy(mixed + n, "{\"\":", 4), 4));
    for (int i = 2047; i >= 0; i--)
        mixed[n++] = i % 3 ? ']' : '}';
    CHECK(agw_json_validate(mixed, n, 2048, NULL, err, sizeof(err)) == 0);
    CHECK(n == 6145);
    mixed[n - 1] = ']'; /* the outermost is an object */
    CHECK(agw_json_validate(mixed, n, 2048, NULL, err, sizeof(err)) == -1);
    CHECK_STR(err, "invalid JSON at byte 6144: expected ',' or '}'");
    CHECK(agw_json_validate("{\"\":[[{\"\":[[]]}]]}", 18, 6, NULL, err, sizeof(err)) == 0);
    CHECK(agw_json_validate("{\"\":[[{\"\":[[]]}]]}", 18, 5, NULL, err, sizeof(err)) == -1);
}

static void validator_agrees_with_jansson(void)
{
    static const text_t extra[] = {
        T("1e-400"), T("-0.0"), T("0e0"), T("0E-0"), T("0.0e99999999999999999999"), T("1e99999999999999999999"),
        T("0.000000000000000000000000000001e338"), T("0.000000000000000000000000000001e339"), T("[-]"),
        T("[\"\\U0041\"]"), T("[\"\\u004\"]"), T("{\"\\ud83d\\ude00\":1}"), T("{\"\xed\xbf\xbf\":1}"), T("[\"\x7f\x1f\"]"),
        T("[true,false,null]"), T("[truefalse]"), T("[1true]"), T("-1.7976931348623158e308"),
        T("1797693134862315807937289714053034150799341327081e260"), T("179769313486231580793728971405303415039934357300e261"),
    };
    const text_t *lists[] = {valid_texts, invalid_texts, extra};
    size_t sizes[] = {sizeof(valid_texts) / sizeof(text_t), sizeof(invalid_texts) / sizeof(text_t), sizeof(extra) / sizeof(text_t)};
    size_t total = 0;
    for (int l = 0; l < 3; l++) {
        for (size_t i = 0; i < sizes[l]; i++, total++) {
            const text_t *t = &lists[l][i];
            json_t *v = NULL;
            char jerr[256];
            int ours = validate(t, AGW_JSON_MAX_DEPTH, NULL);
            int theirs = agw_json_parse(t->s, t->len, AGW_JSON_MAX_DEPTH, &v, jerr, sizeof(jerr));
            if (ours != theirs) {
                fprintf(stderr, "disagree on %.*s: validate %d (%s), jansson %d (%s)\n", (int)t->len, t->s, ours,
                        ours ? err : "", theirs, theirs ? jerr : "");
                check_failures++;
            }
            json_decref(v);
        }
    }
    CHECK(total >= 60);
}

static void nul_after_a_value_is_rejected_though_jansson_skips_it(void)
{
    /* jansson 2.14 drops a NUL byte right after a number or a literal ("[1\0]" loads as [1]); the
     * validator keeps to RFC 8259, and so does agw_json_parse (json.decode, request bodies): the
     * two accept the same texts (found by tests/fuzz/fuzz_json.c: "1\0") */
    json_t *v = NULL;
    json_error_t je;
    v = json_loadb("[1\0]", 4, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    CHECK(v != NULL); /* the quirk this guards against; if jansson drops it, nothing is lost */
    json_decref(v);
    static const struct {
        const char *s;
        size_t len;
    } cases[] = {{"[1\0]", 4}, {"true\0", 5}, {"1\0 ", 3}, {"1\0", 2}, {"{\"a\":1}\0{\"b\":2}", 15}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        v = NULL;
        CHECK(agw_json_validate(cases[i].s, cases[i].len, 8, NULL, err, sizeof(err)) == -1);
        CHECK(agw_json_parse(cases[i].s, cases[i].len, 8, &v, err, sizeof(err)) == -1);
        CHECK(v == NULL);
        CHECK(strncmp(err, "invalid JSON at byte ", 21) == 0);
    }
    CHECK(agw_json_parse("\"a\\u0000b\"", 10, 8, &v, err, sizeof(err)) == 0); /* an escaped NUL is fine */
    json_decref(v);
}

/* jansson refuses "\u0000" in an object key (not in a value): so does the validator, or a body it
 * accepted would fail once a script read it (found by tests/fuzz/fuzz_json.c) */
static void nul_escape_in_a_key_is_refused_as_jansson_does(void)
{
    static const char *refused[] = {"{\"\\u0000b\":3}", "{\"a\":{\"x\\u0000\":1}}", "[{\"\\u0000\":null}]"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        json_t *v = NULL;
        CHECK(agw_json_validate(refused[i], strlen(refused[i]), 8, NULL, err, sizeof(err)) == -1);
        CHECK(strstr(err, "\\u0000 in an object key") != NULL);
        CHECK(agw_json_parse(refused[i], strlen(refused[i]), 8, &v, err, sizeof(err)) == -1);
        CHECK(v == NULL);
    }
    static const char *accepted[] = {"{\"a\":\"\\u0000\"}", "[\"\\u0000\"]", "{\"\\u0001\":\"x\\u0000y\"}"};
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
        json_t *v = NULL;
        CHECK(agw_json_validate(accepted[i], strlen(accepted[i]), 8, NULL, err, sizeof(err)) == 0);
        CHECK(agw_json_parse(accepted[i], strlen(accepted[i]), 8, &v, err, sizeof(err)) == 0);
        json_decref(v);
    }
}

static void validator_reports_compact_text(void)
{
    static const struct {
        const char *s;
        int compact;
    } cases[] = {
        {"{\"a\":[1,2],\"b\":\"x y\\n\"}", 1}, {"\" spaces inside \"", 1}, {"[]", 1}, {"42", 1},
        {"{\"a\": 1}", 0}, {"[1, 2]", 0}, {" 42", 0}, {"42\n", 0}, {"{\n\"a\":1}", 0}, {"[\t]", 0}, {"{ }", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int compact = -1;
        CHECK(agw_json_validate(cases[i].s, strlen(cases[i].s), 8, &compact, err, sizeof(err)) == 0);
        if (compact != cases[i].compact) {
            fprintf(stderr, "compact of %s: got %d\n", cases[i].s, compact);
            check_failures++;
        }
    }
}

/* agw_json_count_nodes: an upper bound of values and member names, strings' bytes not counted,
 * stopping past its cap */
static void node_count_bounds_what_a_text_makes(void)
{
    static const struct {
        const char *text;
        size_t nodes;
    } cases[] = {
        {"1", 1}, {"[]", 2}, {"{}", 2}, {"[1,2,3]", 4}, {"{\"a\":1,\"b\":[true,null]}", 7},
        {"[{},{},{}]", 7}, {"\"[,:{\"", 1}, {"[\"a\\\",b\",\":\"]", 3}, {"  [ 1 , 2 ]  ", 3},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *t = cases[i].text;
        CHECK(agw_json_validate(t, strlen(t), AGW_JSON_MAX_DEPTH, NULL, NULL, 0) == 0);
        CHECK(agw_json_count_nodes(t, strlen(t), 1000) == cases[i].nodes);
    }
    CHECK(agw_json_count_nodes("[1,2,3,4,5]", 11, 3) == 4); /* past the cap: cap + 1 */
    CHECK(agw_json_count_nodes("[1,2,3,4,5]", 11, 6) == 6);
    CHECK(agw_json_count_nodes("\"\\", 2, 10) == 1); /* a text cut inside an escape: no read past it */
}

int main(void)
{
    RUN(invalid_utf8_fails_parse);
    RUN(nesting_beyond_limit_fails_parse);
    RUN(integer_beyond_int64_fails_parse);
    RUN(invalid_json_fails_with_position);
    RUN(validator_accepts_valid_json);
    RUN(validator_rejects_invalid_json);
    RUN(validator_errors_name_the_byte);
    RUN(validator_finds_special_bytes_at_every_offset);
    RUN(validator_limits_nesting_depth);
    RUN(validator_agrees_with_jansson);
    RUN(nul_after_a_value_is_rejected_though_jansson_skips_it);
    RUN(nul_escape_in_a_key_is_refused_as_jansson_does);
    RUN(validator_reports_compact_text);
    RUN(node_count_bounds_what_a_text_makes);
    RUN(text_push_agrees_with_jansson_tree);
    RUN(text_push_reads_strings_of_every_length_exactly);
    RUN(text_push_of_big_objects_agrees_with_jansson_tree);
    RUN(objects_of_one_shape_share_a_key_order_that_none_changes);
    agw_buf_free(&out);
    return CHECK_DONE();
}
