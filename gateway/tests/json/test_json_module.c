/* test_json_module.c: the agg.json module as scripts use it (json/json.h): json.int64 boxes,
 * json.setorder and json.ordered, json.decode and json.encode from Lua, and opening the module
 * twice in one VM. */
#include "tests/json/json_fixture.h"

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

int main(void)
{
    RUN(int64_box_compares_and_prints);
    RUN(setorder_is_honoured);
    RUN(ordered_metatable_is_honoured);
    RUN(decode_and_encode_from_lua);
    RUN(opening_twice_reuses_metatables);
    agw_buf_free(&out);
    return CHECK_DONE();
}
