/* test_json.c: JSON fidelity between upstreams, Lua and the page (DESIGN §2.3). */
#include <lauxlib.h>
#include <lualib.h>
#include <math.h>
#include <stdlib.h>

#include "tests/check.h"
#include "json/json.h"

/* A fresh VM with the module opened as the global `json`. */
static lua_State *new_state(void)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    agw_json_open(L);
    lua_setglobal(L, "json");
    return L;
}

static agw_buf_t out = AGW_BUF_INIT;
static char err[256];

/* Parses in, pushes it as Lua values and encodes those; returns the bytes or NULL (err set). */
static const char *via_lua(lua_State *L, const char *in)
{
    json_t *v;
    agw_buf_reset(&out);
    if (agw_json_parse(in, strlen(in), AGW_JSON_MAX_DEPTH, &v, err, sizeof(err)) != 0)
        return NULL;
    int top = lua_gettop(L);
    agw_json_push(L, v);
    json_decref(v);
    int rc = agw_json_encode(L, -1, &out, err, sizeof(err));
    lua_settop(L, top);
    return rc == 0 ? out.base : NULL;
}

/* Parses in and encodes the json_t directly (the json ref path). */
static const char *via_ref(const char *in)
{
    json_t *v;
    agw_buf_reset(&out);
    if (agw_json_parse(in, strlen(in), AGW_JSON_MAX_DEPTH, &v, err, sizeof(err)) != 0)
        return NULL;
    agw_json_encode_value(v, &out);
    json_decref(v);
    return out.base;
}

/* Runs `return <expr>` and encodes the result; NULL with err set when encoding fails. */
static const char *lua_encode(lua_State *L, const char *expr)
{
    char code[1024];
    snprintf(code, sizeof(code), "return %s", expr);
    agw_buf_reset(&out);
    int top = lua_gettop(L);
    if (luaL_dostring(L, code) != 0) {
        snprintf(err, sizeof(err), "lua: %s", lua_tostring(L, -1));
        lua_settop(L, top);
        return NULL;
    }
    int rc = agw_json_encode(L, -1, &out, err, sizeof(err));
    CHECK(lua_gettop(L) == top + 1); /* the encoder leaves the stack as it found it */
    lua_settop(L, top);
    return rc == 0 ? out.base : NULL;
}

/* Runs a Lua chunk that must return true. */
static void check_lua(lua_State *L, const char *code)
{
    if (luaL_dostring(L, code) != 0) {
        fprintf(stderr, "lua error: %s\n", lua_tostring(L, -1));
        check_failures++;
    } else if (!lua_toboolean(L, -1)) {
        fprintf(stderr, "lua check returned false: %s\n", code);
        check_failures++;
    }
    lua_settop(L, 0);
}

/* Runs a Lua chunk that must not fail. */
static void run_lua(lua_State *L, const char *code)
{
    if (luaL_dostring(L, code) != 0) {
        fprintf(stderr, "lua error: %s\n", lua_tostring(L, -1));
        check_failures++;
    }
    lua_settop(L, 0);
}

static const char *number(double d)
{
    agw_buf_reset(&out);
    agw_json_encode_number(&out, d);
    return out.base;
}

static void empty_array_and_empty_object_round_trip(void)
{
    lua_State *L = new_state();
    CHECK_STR(via_lua(L, "{\"a\":[],\"b\":{}}"), "{\"a\":[],\"b\":{}}");
    CHECK_STR(via_lua(L, "[]"), "[]");
    CHECK_STR(via_lua(L, "{}"), "{}");
    CHECK_STR(via_lua(L, "[[],{},[{}]]"), "[[],{},[{}]]");
    CHECK_STR(via_ref("{\"a\":[],\"b\":{}}"), "{\"a\":[],\"b\":{}}");
    lua_close(L);
}

static void null_stays_a_null_key(void)
{
    lua_State *L = new_state();
    CHECK_STR(via_lua(L, "{\"a\":null,\"b\":1}"), "{\"a\":null,\"b\":1}");
    CHECK_STR(via_lua(L, "[null,null]"), "[null,null]");
    CHECK_STR(lua_encode(L, "{a = json.null}"), "{\"a\":null}");
    lua_close(L);
}

static void integers_beyond_2_53_keep_every_digit(void)
{
    lua_State *L = new_state();
    const char *in = "[9007199254740993,-9223372036854775808,9223372036854775807,-9007199254740993]";
    CHECK_STR(via_lua(L, in), in);
    CHECK_STR(via_ref(in), in);
    /* 2^53 itself is exact as a double and stays a plain number */
    json_t *v;
    CHECK(agw_json_parse("[9007199254740992,9007199254740993]", 35, 8, &v, err, sizeof(err)) == 0);
    agw_json_push(L, v);
    json_decref(v);
    lua_rawgeti(L, -1, 1);
    CHECK(lua_type(L, -1) == LUA_TNUMBER);
    lua_rawgeti(L, -2, 2);
    int64_t n = 0;
    CHECK(agw_json_check_int64(L, -1, &n) && n == 9007199254740993LL);
    lua_settop(L, 0);
    lua_close(L);
}

static void reals_print_in_shortest_round_trip_form(void)
{
    CHECK_STR(number(4.6), "4.6");
    CHECK_STR(number(0.1), "0.1");
    CHECK_STR(number(1e300), "1e+300");
    CHECK_STR(number(5e-324), "5e-324");
    CHECK_STR(number(89), "89");
    CHECK_STR(number(-42), "-42");
    CHECK_STR(number(0.30000000000000004), "0.30000000000000004");
    CHECK_STR(number(1.7976931348623157e308), "1.7976931348623157e+308");
    CHECK_STR(number(9007199254740992.0), "9007199254740992");
    CHECK_STR(number(1e21), "1e+21");
    CHECK_STR(number(-1.5e-7), "-1.5e-07");
    CHECK_STR(number(2.2250738585072014e-308), "2.2250738585072014e-308");
    lua_State *L = new_state();
    CHECK_STR(via_lua(L, "[4.6,0.1,1e300,5e-324]"), "[4.6,0.1,1e+300,5e-324]");
    lua_close(L);
}

static void negative_zero_keeps_its_sign(void)
{
    CHECK_STR(number(-0.0), "-0.0");
    CHECK_STR(number(0.0), "0");
    CHECK_STR(via_ref("[-0.0,0.0,-0]"), "[-0.0,0.0,0]");
}

static void upstream_real_stays_real_via_ref(void)
{
    CHECK_STR(via_ref("[1.0,100.0,4.6,1e300,-2.5,1E2]"), "[1.0,100.0,4.6,1e+300,-2.5,100.0]");
    CHECK_STR(via_ref("{\"price\":89,\"rate\":1.0}"), "{\"price\":89,\"rate\":1.0}");
}

static void key_order_kept_after_delete_and_add(void)
{
    lua_State *L = new_state();
    json_t *v;
    const char *in = "{\"z\":1,\"a\":2,\"m\":3}";
    CHECK(agw_json_parse(in, strlen(in), 8, &v, err, sizeof(err)) == 0);
    agw_json_push(L, v);
    json_decref(v);
    lua_setglobal(L, "t");
    CHECK_STR(lua_encode(L, "t"), "{\"z\":1,\"a\":2,\"m\":3}");
    run_lua(L, "t.a = nil; t.y = 4; t.b = 5");
    CHECK_STR(lua_encode(L, "t"), "{\"z\":1,\"m\":3,\"b\":5,\"y\":4}");
    run_lua(L, "t.a = 6");
    CHECK_STR(lua_encode(L, "t"), "{\"z\":1,\"a\":6,\"m\":3,\"b\":5,\"y\":4}");
    lua_close(L);
}

static void plain_table_keys_sorted_bytewise(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "{b = 1, a = 2, B = 3, aa = 4, [\"\"] = 5}"),
              "{\"\":5,\"B\":3,\"a\":2,\"aa\":4,\"b\":1}");
    lua_close(L);
}

static void many_keys_outgrow_the_scratch_array(void)
{
    lua_State *L = new_state();
    /* 100 keys per object, nested inside an object whose own keys are still being walked */
    run_lua(L, "local function obj() local t = {} for i = 100, 1, -1 do t['k' .. (1000 + i)] = i end return t end\n"
                     "big = obj(); big.k1050 = obj(); big.k1050.k1001 = obj()\n"
                     "ord = json.decode('{\"z\":0,\"y\":1}'); for i = 1, 100 do ord['x' .. (1000 + i)] = i end");
    CHECK(lua_encode(L, "big") != NULL);
    CHECK(out.base && strncmp(out.base, "{\"k1001\":1,\"k1002\":2,", 21) == 0);
    CHECK(out.base && strstr(out.base, "\"k1050\":{\"k1001\":{\"k1001\":1,") != NULL);
    CHECK(out.base && strstr(out.base, "\"k1100\":100}") != NULL);
    CHECK(lua_encode(L, "ord") != NULL);
    CHECK(out.base && strncmp(out.base, "{\"z\":0,\"y\":1,\"x1001\":1,\"x1002\":2,", 33) == 0);
    lua_close(L);
}

static void nul_in_strings_round_trips(void)
{
    lua_State *L = new_state();
    CHECK_STR(via_lua(L, "[\"a\\u0000b\"]"), "[\"a\\u0000b\"]");
    CHECK_STR(via_ref("[\"a\\u0000b\"]"), "[\"a\\u0000b\"]");
    check_lua(L, "return #json.decode('\"a\\\\u0000b\"') == 3");
    CHECK_STR(lua_encode(L, "'x\\0y'"), "\"x\\u0000y\"");
    lua_close(L);
}

static void strings_escape_only_what_json_requires(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "'q\"b\\\\n\\nr\\rt\\tb\\bf\\f\\1\\31/\\127é😀'"),
              "\"q\\\"b\\\\n\\nr\\rt\\tb\\bf\\f\\u0001\\u001f/\x7f" "é😀\"");
    CHECK_STR(via_lua(L, "\"\\u00e9\\/\""), "\"é/\"");
    lua_close(L);
}

static void top_level_scalars_are_valid_sections(void)
{
    lua_State *L = new_state();
    CHECK_STR(via_lua(L, "[1,\"x\"]"), "[1,\"x\"]");
    CHECK_STR(via_lua(L, "42"), "42");
    CHECK_STR(via_lua(L, "\"s\""), "\"s\"");
    CHECK_STR(via_lua(L, "null"), "null");
    CHECK_STR(via_lua(L, "true"), "true");
    CHECK_STR(via_ref("2.5"), "2.5");
    CHECK_STR(lua_encode(L, "nil"), "null");
    lua_close(L);
}

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

static void nan_and_infinity_from_lua_encode_as_null(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "{0/0, 1/0, -1/0, 1}"), "[null,null,null,1]");
    CHECK_STR(number(NAN), "null");
    lua_close(L);
}

static void sparse_table_is_an_error_naming_its_path(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "{product = {data = {tags = {[1] = 'a', [3] = 'c'}}}}") == NULL);
    CHECK_STR(err, "sparse or mixed table at $.product.data.tags");
    CHECK(lua_encode(L, "{items = {{}, {x = {[2] = 1}}}}") == NULL);
    CHECK_STR(err, "sparse or mixed table at $.items[1].x");
    CHECK(lua_encode(L, "{[0] = 1}") == NULL);
    CHECK(lua_encode(L, "{[1.5] = 1}") == NULL);
    lua_close(L);
}

static void mixed_table_is_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "{1, 2, x = 3}") == NULL);
    CHECK_STR(err, "sparse or mixed table at $");
    CHECK(lua_encode(L, "{a = {[true] = 1}}") == NULL);
    CHECK_STR(err, "sparse or mixed table at $.a");
    /* a number key added to a decoded object */
    CHECK(lua_encode(L, "(function() local t = json.decode('{\"a\":1}'); t[1] = 2; return {x = t} end)()") == NULL);
    CHECK_STR(err, "sparse or mixed table at $.x");
    lua_close(L);
}

static void cycle_is_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "(function() local t = {}; t.a = t; return t end)()") == NULL);
    CHECK(strncmp(err, "nesting deeper than 320 levels (a cycle?) at $.a.a.a", 52) == 0);
    CHECK(lua_encode(L, "(function() local t = json.array(); t[1] = t; return t end)()") == NULL);
    CHECK(strncmp(err, "nesting deeper than 320 levels (a cycle?) at $[0][0]", 52) == 0);
    lua_close(L);
}

static void data_at_the_parse_limit_encodes_inside_a_page(void)
{
    lua_State *L = new_state();
    /* upstream data as deep as parsing allows, two levels down in a page (section, data) and a
     * few more in a script's own tables: what was accepted can be sent on */
    run_lua(L, "deep = json.decode(string.rep('[', 256) .. string.rep(']', 256))\n"
               "obj = json.decode(string.rep('{\"a\":', 256) .. '1' .. string.rep('}', 256))");
    CHECK(lua_encode(L, "{reviews = {status = 'ok', data = deep}}") != NULL);
    CHECK(strncmp(out.base, "{\"reviews\":{\"data\":[[[", 22) == 0);
    CHECK(lua_encode(L, "{page = {sections = {{s = {status = 'ok', data = obj}}}}}") != NULL);
    lua_close(L);
}

static void function_value_is_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "{handler = print}") == NULL);
    CHECK_STR(err, "cannot encode function at $.handler");
    CHECK(lua_encode(L, "{['my key'] = {coroutine.create(print)}}") == NULL);
    CHECK_STR(err, "cannot encode thread at $[\"my key\"][0]");
    CHECK(lua_encode(L, "{f = io.stdout}") == NULL);
    CHECK_STR(err, "cannot encode userdata at $.f");
    lua_close(L);
}

static void invalid_utf8_in_lua_string_is_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "{s = '\\255'}") == NULL);
    CHECK_STR(err, "invalid UTF-8 in string at $.s");
    CHECK(lua_encode(L, "{['\\192\\175'] = 1}") == NULL);
    CHECK_STR(err, "invalid UTF-8 in key at $[\"\xc0\xaf\"]");
    static const char *bad[] = {"\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80", "\xf8\x88\x80\x80\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        agw_buf_reset(&out);
        agw_buf_puts(&out, "x");
        CHECK(agw_json_encode_string(&out, bad[i], strlen(bad[i])) == -1);
        CHECK_STR(out.base, "x");
    }
    static const char *good[] = {"\xc2\x80", "\xe0\xa0\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        agw_buf_reset(&out);
        CHECK(agw_json_encode_string(&out, good[i], strlen(good[i])) == 0);
    }
    lua_close(L);
}

/* Text the gateway did not make goes into its JSON documents as a string, or as the fallback the
 * caller names when it is not UTF-8: the document stays valid JSON either way. */
static void a_string_or_its_fallback(void)
{
    agw_buf_reset(&out);
    agw_buf_puts(&out, "[");
    agw_json_encode_string_or(&out, "a\"b", 3, "null");
    agw_buf_puts(&out, ",");
    agw_json_encode_string_or(&out, "\xc0\xaf", 2, "null");
    agw_buf_puts(&out, "]");
    CHECK_STR(out.base, "[\"a\\\"b\",null]");
}

static void agg_array_empty_encodes_as_array(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "json.array()"), "[]");
    CHECK_STR(lua_encode(L, "json.array({1, 'a', json.null})"), "[1,\"a\",null]");
    CHECK_STR(lua_encode(L, "{items = json.array()}"), "{\"items\":[]}");
    check_lua(L, "return json.is_array(json.array()) and json.is_array(json.decode('[]')) and not json.is_array({})");
    lua_close(L);
}

static void empty_plain_table_encodes_as_object(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "{}"), "{}");
    CHECK_STR(lua_encode(L, "{a = {}}"), "{\"a\":{}}");
    CHECK_STR(lua_encode(L, "{'a', 'b'}"), "[\"a\",\"b\"]");
    lua_close(L);
}

static void int64_box_compares_and_prints(void)
{
    lua_State *L = new_state();
    check_lua(L, "local a = json.int64('9223372036854775807'); local b = json.int64('9007199254740993')\n"
                 "return tostring(a) == '9223372036854775807' and a == json.int64('9223372036854775807')\n"
                 "  and b < a and b <= a and a > b and not (a < b) and a ~= b and b == json.int64(b)\n"
                 "  and json.is_int64(a) and not json.is_int64(5) and json.int64(-5) < json.int64(0)\n"
                 "  and tostring(json.int64('-9223372036854775808')) == '-9223372036854775808'");
    check_lua(L, "return not pcall(json.int64, '12x') and not pcall(json.int64, '') and not pcall(json.int64, '-')\n"
                 "  and not pcall(json.int64, ' 1') and not pcall(json.int64, '9223372036854775808')\n"
                 "  and not pcall(json.int64, 2^63) and not pcall(json.int64, 1.5) and not pcall(json.int64, {})");
    CHECK_STR(lua_encode(L, "{id = json.int64('9007199254740993'), n = json.int64(7)}"),
              "{\"id\":9007199254740993,\"n\":7}");
    lua_close(L);
}

static void setorder_is_honoured(void)
{
    lua_State *L = new_state();
    CHECK_STR(lua_encode(L, "json.setorder({b = 1, a = 2, c = 3}, {'c', 'a', 'b'})"), "{\"c\":3,\"a\":2,\"b\":1}");
    CHECK_STR(lua_encode(L, "json.setorder({b = 1, a = 2, z = 3, y = 4}, {'z', 'q', 'z'})"),
              "{\"z\":3,\"a\":2,\"b\":1,\"y\":4}");
    CHECK_STR(lua_encode(L, "json.setorder(json.setorder({b = 1, a = 2}, {'b', 'a'}), nil)"), "{\"a\":2,\"b\":1}");
    check_lua(L, "return not pcall(json.setorder, {}, {1})");
    lua_close(L);
}

static void ordered_metatable_is_honoured(void)
{
    lua_State *L = new_state();
    check_lua(L, "M = json.ordered {'status', 'data', 'error', 'status'}; return true");
    CHECK_STR(lua_encode(L, "setmetatable({data = 1, error = 2, status = 3}, M)"), "{\"status\":3,\"data\":1,\"error\":2}");
    /* missing members are skipped, added ones follow sorted, values nest */
    CHECK_STR(lua_encode(L, "setmetatable({z = 1, data = {b = 1, a = 2}, a = true}, M)"),
              "{\"data\":{\"a\":2,\"b\":1},\"a\":true,\"z\":1}");
    CHECK_STR(lua_encode(L, "setmetatable({}, M)"), "{}");
    /* a metatable of the script's own is a plain table's */
    CHECK_STR(lua_encode(L, "setmetatable({b = 1, a = 2}, {__index = {}})"), "{\"a\":2,\"b\":1}");
    check_lua(L, "return not pcall(json.ordered, {1})");
    /* shared by every object made with it: no script can reach the list or swap the metatable */
    check_lua(L, "local o = setmetatable({}, M); return getmetatable(o) == 'agg.json.ordered'\n"
                 "  and not pcall(setmetatable, o, {}) and getmetatable(setmetatable({}, json.ordered({'a'}, 'x'))) == 'x'");
    check_lua(L, "local s, e = json.encode(setmetatable({[1] = 1, status = 2}, M)); return s == nil and e ~= nil");
    lua_close(L);
}

static void decode_and_encode_from_lua(void)
{
    lua_State *L = new_state();
    check_lua(L, "local s = '{\"id\":42,\"tags\":[],\"meta\":{},\"price\":4.6,\"big\":9007199254740993,\"n\":null}'\n"
                 "local v = json.decode(s)\n"
                 "if v.id ~= 42 or v.n ~= json.null or not json.is_int64(v.big) then return false end\n"
                 "v.meta.x = 1\n"
                 "return json.encode(v) == '{\"id\":42,\"tags\":[],\"meta\":{\"x\":1},\"price\":4.6,\"big\":9007199254740993,\"n\":null}'");
    check_lua(L, "local v, e = json.decode('[1,'); return v == nil and e:find('invalid JSON') ~= nil");
    check_lua(L, "local v, e = json.decode(string.rep('[', 300) .. string.rep(']', 300))\n"
                 "return v == nil and e == 'nesting deeper than 256 levels'");
    check_lua(L, "local s, e = json.encode({f = print}); return s == nil and e == 'cannot encode function at $.f'");
    lua_close(L);
}

static void json_ref_encodes_its_json_t(void)
{
    lua_State *L = new_state();
    json_t *v;
    const char *in = "{\"rate\":1.0,\"big\":9007199254740993,\"tags\":[]}";
    CHECK(agw_json_parse(in, strlen(in), 8, &v, err, sizeof(err)) == 0);
    agw_json_push_ref(L, v);
    json_decref(v);
    CHECK(agw_json_check_ref(L, -1) == v);
    lua_setglobal(L, "ref");
    CHECK_STR(lua_encode(L, "{product = ref}"), "{\"product\":{\"rate\":1.0,\"big\":9007199254740993,\"tags\":[]}}");
    check_lua(L, "local t = json.materialize(ref); return t.rate == 1 and json.is_int64(t.big) and json.is_array(t.tags)\n"
                 "  and json.materialize(5) == 5");
    lua_pushnumber(L, 1);
    CHECK(agw_json_check_ref(L, -1) == NULL);
    lua_close(L); /* __gc releases the last reference */
}

/* ---- validate-then-lazy: agw_json_validate and raw refs ---- */

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
        agw_json_push_text(L, text);
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
        agw_json_push_text(L, text.base);
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

/* Validates in and pushes it as a raw ref. */
static void push_raw(lua_State *L, const char *in)
{
    int compact;
    CHECK(agw_json_validate(in, strlen(in), AGW_JSON_MAX_DEPTH, &compact, err, sizeof(err)) == 0);
    agw_json_push_raw_ref(L, in, strlen(in), compact, NULL, 0);
}

static void raw_ref_encodes_verbatim_when_compact(void)
{
    lua_State *L = new_state();
    /* verbatim: the upstream's own spelling of numbers and escapes survives */
    const char *in = "{\"z\":1E2,\"a\":\"\\u00e9\\/\",\"big\":9223372036854775807,\"n\":null,\"e\":[],\"o\":{}}";
    push_raw(L, in);
    const agw_json_raw_t *r = agw_json_check_raw_ref(L, -1);
    CHECK(r != NULL && r->compact == 1 && r->len == strlen(in) && r->text[r->len] == '\0');
    CHECK(agw_json_check_ref(L, -1) == NULL && agw_json_is_ref(L, -1));
    agw_buf_reset(&out);
    CHECK(agw_json_encode(L, -1, &out, err, sizeof(err)) == 0);
    CHECK_STR(out.base, in);
    lua_settop(L, 0);
    lua_close(L);
}

static void raw_ref_with_whitespace_encodes_without_it(void)
{
    lua_State *L = new_state();
    push_raw(L, " { \"z\" : 1E2 ,\n \"a\" : [ 1.0 , \"\\u00e9\" ] , \"s\" : \"a b\" } ");
    CHECK(agw_json_check_raw_ref(L, -1)->compact == 0);
    agw_buf_reset(&out);
    CHECK(agw_json_encode(L, -1, &out, err, sizeof(err)) == 0);
    /* the same text the upstream sent, less the whitespace between tokens */
    CHECK_STR(out.base, "{\"z\":1E2,\"a\":[1.0,\"\\u00e9\"],\"s\":\"a b\"}");
    /* compact = 0 from a caller that did not know is always safe */
    agw_json_push_raw_ref(L, "[1E2, \"x\\\" y\"]", 14, 0, NULL, 0);
    agw_buf_reset(&out);
    CHECK(agw_json_encode(L, -1, &out, err, sizeof(err)) == 0);
    CHECK_STR(out.base, "[1E2,\"x\\\" y\"]");
    lua_settop(L, 0);
    lua_close(L);
}

static void raw_ref_that_does_not_parse_is_an_error_not_a_crash(void)
{
    lua_State *L = new_state();
    agw_json_push_raw_ref(L, "[1,", 3, 0, NULL, 0); /* breaks the contract on purpose */
    lua_setglobal(L, "bad");
    /* only validated text makes raw refs; text that breaks that gives a partial value, no crash or loop */
    check_lua(L, "local ok, v = pcall(json.materialize, bad); return ok and json.is_array(v) and v[1] == 1");
    lua_close(L);
}

/* An upstream response's header block rides after the body's text (worker/core.c on_call_done): the
 * text, its encoding and json.raw() are unchanged by it, json.raw_extra() gives it back byte for
 * byte (NULs included), and a ref without one gives nil. */
static void raw_ref_keeps_extra_bytes_after_its_text(void)
{
    lua_State *L = new_state();
    const char *in = "{\"a\":1}";
    static const char hdrs[] = "content-type\0application/json\0x-id\0" "007\0";
    agw_json_push_raw_ref(L, in, strlen(in), 1, hdrs, sizeof(hdrs) - 1);
    const agw_json_raw_t *r = agw_json_check_raw_ref(L, -1);
    CHECK(r != NULL && r->len == strlen(in) && r->text[r->len] == '\0' && r->extra_len == sizeof(hdrs) - 1);
    agw_buf_reset(&out);
    CHECK(agw_json_encode(L, -1, &out, err, sizeof(err)) == 0);
    CHECK_STR(out.base, in);
    lua_setglobal(L, "with");
    agw_json_push_raw_ref(L, in, strlen(in), 1, NULL, 0);
    lua_setglobal(L, "without");
    check_lua(L, "local x = json.raw_extra(with)\n"
                 "return json.raw(with) == '{\"a\":1}' and #x == 39 and\n"
                 "  x == 'content-type\\0application/json\\0x-id\\0' .. '007\\0' and\n"
                 "  json.raw_extra(without) == nil and json.materialize(with).a == 1 and\n"
                 "  not pcall(json.raw_extra, {})");
    lua_close(L);
}

static void raw_ref_materializes_like_a_tree_ref(void)
{
    lua_State *L = new_state();
    const char *in = "{\"z\":1,\"a\":[],\"m\":{},\"big\":9007199254740993,\"r\":4.6,\"s\":\"a\\u0000b\",\"n\":null,"
                     "\"t\":[true,false,{\"q\":[1,2]}]}";
    json_t *v;
    CHECK(agw_json_parse(in, strlen(in), AGW_JSON_MAX_DEPTH, &v, err, sizeof(err)) == 0);
    agw_json_push_ref(L, v);
    json_decref(v);
    lua_setglobal(L, "tree");
    push_raw(L, in);
    lua_setglobal(L, "raw");
    /* the two materializations encode to the same bytes, key order included, even after edits */
    run_lua(L, "a = json.materialize(tree); b = json.materialize(raw)\n"
               "a.z = nil; b.z = nil; a.y = 2; b.y = 2; a.z = 3; b.z = 3");
    const char *ea = lua_encode(L, "a");
    char *copy = ea ? strdup(ea) : NULL;
    CHECK_STR(lua_encode(L, "b"), copy ? copy : "(a failed)");
    CHECK_STR(copy, "{\"z\":3,\"a\":[],\"m\":{},\"big\":9007199254740993,\"r\":4.6,\"s\":\"a\\u0000b\",\"n\":null,"
                    "\"t\":[true,false,{\"q\":[1,2]}],\"y\":2}");
    free(copy);
    check_lua(L, "return json.is_array(b.a) and not json.is_array(b.m) and json.is_int64(b.big) and #b.s == 3\n"
                 "  and b.n == json.null and b.t[3].q[2] == 2 and json.materialize(raw) ~= b");
    /* scalars at the top level */
    check_lua(L, "return json.materialize(json.parse(' 42 ')) == 42 and json.materialize(json.parse('\"x\"')) == 'x'\n"
                 "  and json.materialize(json.parse('null')) == json.null");
    lua_close(L);
}

static void raw_ref_inside_a_lua_table_encodes(void)
{
    lua_State *L = new_state();
    push_raw(L, "{\"id\":42,\"tags\":[]}");
    lua_setglobal(L, "p");
    push_raw(L, "[ 1.0 , 2 ]");
    lua_setglobal(L, "q");
    CHECK_STR(lua_encode(L, "{product = p, nums = q, list = {p, q}, n = json.parse('null')}"),
              "{\"list\":[{\"id\":42,\"tags\":[]},[1.0,2]],\"n\":null,\"nums\":[1.0,2],\"product\":{\"id\":42,\"tags\":[]}}");
    lua_close(L);
}

static void json_parse_returns_a_raw_ref(void)
{
    lua_State *L = new_state();
    check_lua(L, "local r = json.parse('{\"a\":[1,2]}'); return json.is_ref(r) and json.raw(r) == '{\"a\":[1,2]}'\n"
                 "  and json.materialize(r).a[2] == 2 and tostring(r):find('agg.json.raw') == 1\n"
                 "  and json.encode({x = r}) == '{\"x\":{\"a\":[1,2]}}'");
    check_lua(L, "local r = json.parse(' [ \"a\\\\u0000b\" ] '); return json.raw(r) == ' [ \"a\\\\u0000b\" ] '\n"
                 "  and json.encode(r) == '[\"a\\\\u0000b\"]'");
    check_lua(L, "local r, e = json.parse('[1,'); return r == nil and e == 'invalid JSON at byte 3: expected a value'");
    check_lua(L, "local r, e = json.parse(string.rep('[', 257) .. string.rep(']', 257))\n"
                 "return r == nil and e == 'nesting deeper than 256 levels'");
    check_lua(L, "return not pcall(json.raw, {}) and not pcall(json.raw, json.decode('[]')) and not json.is_ref({})\n"
                 "  and not json.is_ref(json.int64(1))");
    lua_close(L);
}

static void raw_refs_need_no_finalizer(void)
{
    lua_State *L = new_state();
    check_lua(L, "local r = json.parse('[1]'); return getmetatable(r) ~= nil and getmetatable(r).__gc == nil");
    /* many raw refs, some materialized, collected with the state: ASan sees no leak */
    run_lua(L, "for i = 1, 1000 do local r = json.parse('{\"i\":' .. i .. '}'); if i % 3 == 0 then json.materialize(r) end end\n"
               "collectgarbage()");
    lua_close(L);
}

static void opening_twice_reuses_metatables(void)
{
    lua_State *L = new_state();
    agw_json_open(L);
    lua_setglobal(L, "json2");
    check_lua(L, "return json2.is_array(json.array()) and json.int64(1) == json2.int64(1)\n"
                 "  and getmetatable(json.array()) == getmetatable(json2.array())");
    CHECK_STR(lua_encode(L, "json2.setorder({a = 1, b = 2}, {'b', 'a'})"), "{\"b\":2,\"a\":1}");
    lua_close(L);
}

static void encoder_works_before_module_is_opened(void)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    CHECK_STR(lua_encode(L, "{b = {1, 2}, a = 'x'}"), "{\"a\":\"x\",\"b\":[1,2]}");
    lua_close(L);
}

int main(void)
{
    RUN(empty_array_and_empty_object_round_trip);
    RUN(null_stays_a_null_key);
    RUN(integers_beyond_2_53_keep_every_digit);
    RUN(reals_print_in_shortest_round_trip_form);
    RUN(negative_zero_keeps_its_sign);
    RUN(upstream_real_stays_real_via_ref);
    RUN(key_order_kept_after_delete_and_add);
    RUN(plain_table_keys_sorted_bytewise);
    RUN(many_keys_outgrow_the_scratch_array);
    RUN(nul_in_strings_round_trips);
    RUN(strings_escape_only_what_json_requires);
    RUN(top_level_scalars_are_valid_sections);
    RUN(invalid_utf8_fails_parse);
    RUN(nesting_beyond_limit_fails_parse);
    RUN(integer_beyond_int64_fails_parse);
    RUN(invalid_json_fails_with_position);
    RUN(nan_and_infinity_from_lua_encode_as_null);
    RUN(sparse_table_is_an_error_naming_its_path);
    RUN(mixed_table_is_an_error);
    RUN(cycle_is_an_error);
    RUN(data_at_the_parse_limit_encodes_inside_a_page);
    RUN(function_value_is_an_error);
    RUN(invalid_utf8_in_lua_string_is_an_error);
    RUN(a_string_or_its_fallback);
    RUN(agg_array_empty_encodes_as_array);
    RUN(empty_plain_table_encodes_as_object);
    RUN(int64_box_compares_and_prints);
    RUN(setorder_is_honoured);
    RUN(ordered_metatable_is_honoured);
    RUN(decode_and_encode_from_lua);
    RUN(json_ref_encodes_its_json_t);
    RUN(validator_accepts_valid_json);
    RUN(validator_rejects_invalid_json);
    RUN(validator_errors_name_the_byte);
    RUN(validator_finds_special_bytes_at_every_offset);
    RUN(validator_limits_nesting_depth);
    RUN(validator_agrees_with_jansson);
    RUN(nul_after_a_value_is_rejected_though_jansson_skips_it);
    RUN(nul_escape_in_a_key_is_refused_as_jansson_does);
    RUN(validator_reports_compact_text);
    RUN(raw_ref_encodes_verbatim_when_compact);
    RUN(raw_ref_with_whitespace_encodes_without_it);
    RUN(text_push_agrees_with_jansson_tree);
    RUN(text_push_of_big_objects_agrees_with_jansson_tree);
    RUN(raw_ref_that_does_not_parse_is_an_error_not_a_crash);
    RUN(raw_ref_materializes_like_a_tree_ref);
    RUN(raw_ref_keeps_extra_bytes_after_its_text);
    RUN(raw_ref_inside_a_lua_table_encodes);
    RUN(json_parse_returns_a_raw_ref);
    RUN(raw_refs_need_no_finalizer);
    RUN(opening_twice_reuses_metatables);
    RUN(encoder_works_before_module_is_opened);
    agw_buf_free(&out);
    return CHECK_DONE();
}
