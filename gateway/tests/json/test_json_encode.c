/* test_json_encode.c: JSON fidelity from upstreams through Lua to the page (DESIGN §2.3): what
 * agw_json_encode writes for Lua values and for upstream data pushed into Lua (empty arrays and
 * objects, null, integers beyond 2^53, reals in shortest round-trip form, key order, escapes), and
 * the errors it gives for what JSON cannot hold (sparse or mixed tables, cycles, functions,
 * invalid UTF-8), each naming its path. */
#include "tests/json/json_fixture.h"

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

/* A value of shared references doubles at each level: t = { t, t } 23 times is 2^24 - 1 tables to
 * visit (and 2^22 levels give 8 M), past AGW_JSON_ENCODE_MAX_TABLES; 21 times is 4,194,303 and
 * encodes. */
static void shared_references_past_the_table_limit_are_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "(function() local t = {} for _ = 1, 23 do t = { t, t } end return t end)()") == NULL);
    static const char what[] = "more than 4194304 tables (one reached through several references counts each time) at $";
    CHECK(strncmp(err, what, sizeof(what) - 1) == 0);
    CHECK(lua_encode(L, "(function() local t = {} for _ = 1, 21 do t = { t, t } end return t end)()") != NULL);
    lua_close(L);
}

/* A megabyte string repeated: 256 times is 256 MiB and some quotes and commas past the text limit
 * only at the last element; 300 times is refused there. */
static void text_past_the_byte_limit_is_an_error(void)
{
    lua_State *L = new_state();
    CHECK(lua_encode(L, "(function() local s, t = ('x'):rep(2^20), {} for i = 1, 300 do t[i] = s end return t end)()") == NULL);
    static const char what[] = "more than 268435456 bytes of JSON text at $[";
    CHECK(strncmp(err, what, sizeof(what) - 1) == 0);
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
    RUN(shared_references_past_the_table_limit_are_an_error);
    RUN(text_past_the_byte_limit_is_an_error);
    RUN(upstream_real_stays_real_via_ref);
    RUN(key_order_kept_after_delete_and_add);
    RUN(plain_table_keys_sorted_bytewise);
    RUN(many_keys_outgrow_the_scratch_array);
    RUN(nul_in_strings_round_trips);
    RUN(strings_escape_only_what_json_requires);
    RUN(top_level_scalars_are_valid_sections);
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
    RUN(encoder_works_before_module_is_opened);
    agw_buf_free(&out);
    return CHECK_DONE();
}
