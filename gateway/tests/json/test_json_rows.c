/* test_json_rows.c: agw_json_encode_rows (json/json.h), the encoder of a page whose sections
 * travel as rows (worker/respond.c): its bytes must be those agw_json_encode gives for the tables
 * the rows stand for, and its errors the same messages with the same paths. */
#include <lauxlib.h>
#include <lualib.h>
#include <stdlib.h>

#include "tests/check.h"
#include "json/json.h"

/* A fresh VM with the module as the global `json`, and two helpers: tables(rows, members) makes
 * the tables the rows stand for ({ key = setmetatable({ member = v, … }, json.ordered(members)) }),
 * same(rows, members) returns true when both encodings agree (bytes, or the error message), else
 * false and what each gave. */
static lua_State *new_state(void)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    agw_json_open(L);
    lua_setglobal(L, "json");
    if (luaL_dostring(L, "function tables(rows, members)\n"
                         "  local mt, t, w, i = json.ordered(members), {}, #members + 1, 1\n"
                         "  while rows[i] ~= nil do\n"
                         "    local s = {}\n"
                         "    for m = 1, #members do s[members[m]] = rows[i + m] end\n"
                         "    t[rows[i]] = setmetatable(s, mt)\n"
                         "    i = i + w\n"
                         "  end\n"
                         "  return t\n"
                         "end\n"
                         "function same(rows, members)\n"
                         "  local a, ea = json.encode_rows(rows, members)\n"
                         "  local b, eb = json.encode(tables(rows, members))\n"
                         "  if a == b and ea == eb then return true end\n"
                         "  return false, tostring(a) .. ' / ' .. tostring(ea) .. ' against ' .. tostring(b) .. ' / ' .. tostring(eb)\n"
                         "end") != 0) {
        fprintf(stderr, "lua error: %s\n", lua_tostring(L, -1));
        check_failures++;
    }
    return L;
}

/* Runs a Lua chunk that must return true (a second value says why not). */
static void check_lua(lua_State *L, const char *code)
{
    if (luaL_dostring(L, code) != 0) {
        fprintf(stderr, "lua error: %s\n", lua_tostring(L, -1));
        check_failures++;
    } else if (!lua_toboolean(L, 1)) {
        fprintf(stderr, "lua check returned false (%s): %s\n", lua_tostring(L, 2) ? lua_tostring(L, 2) : "", code);
        check_failures++;
    }
    lua_settop(L, 0);
}

static const char *const SECTION[] = {"status", "data", "error"};

/* The page's own shapes: raw refs (compact or not), data read into Lua, null data, no data, an
 * error problem with its own member order, plain values a script put in. */
static void page_rows_encode_as_their_tables(void)
{
    lua_State *L = new_state();
    check_lua(L, "local p = json.parse('{\"id\":42,\"name\":\"Sneaker\",\"tags\":[\"a\",\"b\"],\"price\":1E2}')\n"
                 "local r = json.parse(' { \"stars\" : [ 4.5 , 3 ] , \"s\" : \"a b\" } ')\n"
                 "local problem = setmetatable({ type = 'urn:aggway:problem:timeout', title = 'Gateway Timeout',\n"
                 "  status = 504, detail = 'section inventory, upstream inventory' },\n"
                 "  json.ordered({ 'type', 'title', 'status', 'detail' }))\n"
                 "local rows = { 'inventory', 'unavailable', nil, problem, 'product', 'ok', p, nil,\n"
                 "  'reviews', 'stale', r, problem, 'extra', 'ok', { n = 1, list = json.array() }, nil,\n"
                 "  'nothing', 'ok', json.null, nil, 'flag', 'ok', false, nil, 'big', 'ok', json.int64('9007199254740993'), nil }\n"
                 "local ok, why = same(rows, { 'status', 'data', 'error' })\n"
                 "if not ok then return false, why end\n"
                 "return json.encode_rows(rows, { 'status', 'data', 'error' }) ==\n"
                 "  '{\"big\":{\"status\":\"ok\",\"data\":9007199254740993},\"extra\":{\"status\":\"ok\",\"data\":{\"list\":[],\"n\":1}},'\n"
                 "  .. '\"flag\":{\"status\":\"ok\",\"data\":false},\"inventory\":{\"status\":\"unavailable\",\"error\":'\n"
                 "  .. '{\"type\":\"urn:aggway:problem:timeout\",\"title\":\"Gateway Timeout\",\"status\":504,'\n"
                 "  .. '\"detail\":\"section inventory, upstream inventory\"}},\"nothing\":{\"status\":\"ok\",\"data\":null},'\n"
                 "  .. '\"product\":{\"status\":\"ok\",\"data\":{\"id\":42,\"name\":\"Sneaker\",\"tags\":[\"a\",\"b\"],\"price\":1E2}},'\n"
                 "  .. '\"reviews\":{\"status\":\"stale\",\"data\":{\"stars\":[4.5,3],\"s\":\"a b\"},\"error\":'\n"
                 "  .. '{\"type\":\"urn:aggway:problem:timeout\",\"title\":\"Gateway Timeout\",\"status\":504,'\n"
                 "  .. '\"detail\":\"section inventory, upstream inventory\"}}}', 'bytes'");
    /* no rows: an empty object, as an empty page body */
    check_lua(L, "return json.encode_rows({}, { 'status', 'data', 'error' }) == '{}' and same({}, { 'status' })");
    lua_close(L);
}

/* Keys in any order come out sorted bytewise as a plain table's (upper case, non-ASCII, a NUL, a
 * prefix), also beyond the 32 rows that fit on the C stack; other widths of row work the same. */
static void keys_sort_bytewise_in_any_order(void)
{
    lua_State *L = new_state();
    check_lua(L, "return same({ 'b', 1, 'a', 2, 'aa', 3, 'A', 4, '\\195\\169', 5, 'a\\0b', 6, '', 7 }, { 'v' })");
    check_lua(L, "local rows, w = {}, 0\n"
                 "for i = 50, 1, -1 do rows[w + 1], rows[w + 2], rows[w + 3] = 'k' .. i, i, (i % 2 == 0) and 'x' or nil w = w + 3 end\n"
                 "return same(rows, { 'n', 'odd' })");
    check_lua(L, "return same({ 'z', 'ok', 1, 'y', 'ok', 2 }, { 'status', 'data', 'error' }) and\n"
                 "  json.encode_rows({ 'z', 1, 'y', 2 }, { 'data' }) == '{\"y\":{\"data\":2},\"z\":{\"data\":1}}'");
    lua_close(L);
}

/* Errors name the path the tables' encoding names, and the rows' own mistakes say what they are. */
static void errors_name_their_path(void)
{
    lua_State *L = new_state();
    check_lua(L, "return same({ 'sec', 'ok', { tags = { 1, print } } }, { 'status', 'data', 'error' })");
    check_lua(L, "local a, e = json.encode_rows({ 'sec', 'ok', { tags = { 1, print } } }, { 'status', 'data' })\n"
                 "return a == nil and e == 'cannot encode function at $.sec.data.tags[1]', e");
    check_lua(L, "return same({ 'ok', 'x', 'bad', '\\255' }, { 'status' }) and\n"
                 "  select(2, json.encode_rows({ 'ok', 'x', 'bad', '\\255' }, { 'status' })) == 'invalid UTF-8 in string at $.bad.status'");
    check_lua(L, "local a, e = json.encode_rows({ 'a\\255', 1 }, { 'v' })\n"
                 "return a == nil and e:find('invalid UTF-8 in key at ', 1, true) == 1, e");
    check_lua(L, "local a, e = json.encode_rows({ 'a', 1, 'b', 2, 7, 3 }, { 'v' })\n"
                 "return a == nil and e == 'row key not a string at $[4]', e");
    check_lua(L, "local a, e = json.encode_rows({ 'a', 1, 'b', 2, 'a', 3 }, { 'v' })\n"
                 "return a == nil and e == 'duplicate key at $.a', e");
    check_lua(L, "local t = {} t.t = t\n"
                 "local a, e = json.encode_rows({ 's', t }, { 'v' })\n"
                 "return a == nil and e:find('nesting deeper than', 1, true) == 1, e");
    check_lua(L, "local a, e = json.encode_rows({ 's', 1 }, { 'we\"ird' })\n"
                 "return a == nil and e == 'a member name needs an escape at $', e");
    check_lua(L, "return not pcall(json.encode_rows, {}, { 1 }) and not pcall(json.encode_rows, 'x', {})\n"
                 "  and not pcall(json.encode_rows, {}, { 'a','b','c','d','e','f','g','h','i','j','k','l','m','n','o','p','q' })");
    lua_close(L);
}

/* From C: the stack is left as found, members come from a C array, the output is appended. */
static void c_call_leaves_the_stack_and_appends(void)
{
    lua_State *L = new_state();
    if (luaL_dostring(L, "return { 'b', 'ok', json.parse('[1, 2]'), nil, 'a', 'unavailable', nil, { status = 502 } }") != 0) {
        fprintf(stderr, "lua error: %s\n", lua_tostring(L, -1));
        check_failures++;
        lua_close(L);
        return;
    }
    lua_pushinteger(L, 7); /* something above the rows: a negative index still finds them */
    agw_buf_t out = AGW_BUF_INIT;
    char err[128];
    agw_buf_append(&out, "x", 1);
    int top = lua_gettop(L);
    CHECK(agw_json_encode_rows(L, -2, SECTION, 3, &out, err, sizeof(err)) == 0);
    CHECK(lua_gettop(L) == top && lua_tointeger(L, -1) == 7);
    CHECK_STR(out.base, "x{\"a\":{\"status\":\"unavailable\",\"error\":{\"status\":502}},\"b\":{\"status\":\"ok\",\"data\":[1,2]}}");
    agw_buf_free(&out);
    lua_close(L);
}

int main(void)
{
    RUN(page_rows_encode_as_their_tables);
    RUN(keys_sort_bytewise_in_any_order);
    RUN(errors_name_their_path);
    RUN(c_call_leaves_the_stack_and_appends);
    return CHECK_DONE();
}
