/* test_json.c: JSON fidelity between upstreams, Lua and the page (DESIGN §2.3). */
#include <lauxlib.h>
#include <lualib.h>
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "json.h"

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
    CHECK(strncmp(err, "nesting deeper than 256 levels (a cycle?) at $.a.a.a", 52) == 0);
    CHECK(lua_encode(L, "(function() local t = json.array(); t[1] = t; return t end)()") == NULL);
    CHECK(strncmp(err, "nesting deeper than 256 levels (a cycle?) at $[0][0]", 52) == 0);
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
    RUN(function_value_is_an_error);
    RUN(invalid_utf8_in_lua_string_is_an_error);
    RUN(agg_array_empty_encodes_as_array);
    RUN(empty_plain_table_encodes_as_object);
    RUN(int64_box_compares_and_prints);
    RUN(setorder_is_honoured);
    RUN(decode_and_encode_from_lua);
    RUN(json_ref_encodes_its_json_t);
    RUN(opening_twice_reuses_metatables);
    RUN(encoder_works_before_module_is_opened);
    agw_buf_free(&out);
    return CHECK_DONE();
}
