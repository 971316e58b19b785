/* test_json_ref.c: JSON refs, upstream data a script holds without turning it into tables
 * (json/json.h): a tree ref (a jansson json_t) and a raw ref (validated text, the request path's
 * validate-then-lazy), each encoded as it came, materialized into the same tables, json.parse
 * giving a raw ref, and a raw ref nothing can change or forge. */
#include "tests/json/json_fixture.h"

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

/* ---- raw refs (validate-then-lazy): text agw_json_validate accepted ---- */

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
    agw_json_raw_t r;
    int top = lua_gettop(L);
    CHECK(agw_json_check_raw_ref(L, -1, &r) && r.compact == 1 && r.len == strlen(in) && r.text[r.len] == '\0');
    CHECK(r.extra == NULL && r.extra_len == 0 && lua_gettop(L) == top);
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
    agw_json_raw_t r;
    CHECK(agw_json_check_raw_ref(L, -1, &r) && r.compact == 0);
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
    agw_json_raw_t r;
    CHECK(agw_json_check_raw_ref(L, -1, &r) && r.len == strlen(in) && r.text[r.len] == '\0');
    CHECK(r.extra_len == sizeof(hdrs) - 1 && memcmp(r.extra, hdrs, r.extra_len) == 0);
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

/* json.raw_extra makes each block in a buffer its thread keeps: a block of 20 KB (past what the
 * buffer keeps between calls), then a small one, then the large one again, each whole and right. */
static void raw_extra_blocks_of_any_size_one_after_another(void)
{
    lua_State *L = new_state();
    const char *in = "[1]";
    agw_buf_t big = AGW_BUF_INIT;
    agw_buf_append(&big, "x-big\0", 6);
    for (int i = 0; i < 20000; i++)
        agw_buf_putc(&big, (char)('a' + i % 26));
    agw_buf_append(&big, "\0", 1);
    agw_json_push_raw_ref(L, in, strlen(in), 1, big.base, big.len);
    lua_setglobal(L, "big");
    static const char small[] = "x-id\0" "7\0";
    agw_json_push_raw_ref(L, in, strlen(in), 1, small, sizeof(small) - 1);
    lua_setglobal(L, "small");
    check_lua(L, "local a = json.raw_extra(big)\n"
                 "local b = json.raw_extra(small)\n"
                 "local c = json.raw_extra(big)\n"
                 "return #a == 20007 and a:sub(1, 8) == 'x-big\\0ab' and a:sub(-2) == 'f\\0' and\n"
                 "  b == 'x-id\\0' .. '7\\0' and c == a and json.raw_extra(small) == b");
    agw_buf_free(&big);
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
                 "  and json.materialize(r).a[2] == 2\n"
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

/* A raw ref is no userdata (LuaJIT's collector walks every userdata in its indivisible atomic step,
 * json.h), needs no finalizer, and is what it was made: calling one raises, Lua cannot swap its
 * text, and nothing but agw_json_push_raw_ref makes one (a Lua function, a C function of the
 * module's, a table or a userdata that pretend are refused by the encoder and by json.raw). */
static void raw_refs_are_closures_nothing_can_change_or_forge(void)
{
    lua_State *L = new_state();
    check_lua(L, "local r = json.parse('[1]'); return type(r) == 'function' and getmetatable(r) == nil");
    check_lua(L, "local r = json.parse('[1]'); local ok, e = pcall(r)\n"
                 "return not ok and e:find('raw ref is JSON text, not a function to call', 1, true) ~= nil");
    /* what Lua could do to a closure is refused: a new environment (a C function's), a metatable */
    check_lua(L, "local r = json.parse('[1]')\n"
                 "return not pcall(setfenv, r, {}) and not pcall(setmetatable, r, {}) and json.encode({r}) == '[[1]]'");
    check_lua(L, "local f = function() return '[1]' end\n"
                 "return not json.is_ref(f) and not pcall(json.raw, f) and json.encode({f}) == nil\n"
                 "  and not json.is_ref(json.raw) and json.encode({json.raw}) == nil\n"
                 "  and not json.is_ref(newproxy(true)) and json.materialize(f) == f");
    /* and a ref's strings live as long as it does, whatever collects meanwhile */
    run_lua(L, "keep = json.parse(string.rep(' ', 64) .. '{\"k\":\"' .. string.rep('v', 4096) .. '\"}'); collectgarbage()");
    lua_getglobal(L, "keep");
    agw_json_raw_t r;
    CHECK(agw_json_check_raw_ref(L, -1, &r) && r.len == 64 + 4096 + 8 && r.compact == 0);
    run_lua(L, "for i = 1, 200 do local _ = {i, tostring(i)} end collectgarbage(); collectgarbage()");
    CHECK(r.text[64] == '{' && r.text[r.len - 1] == '}' && r.text[r.len] == '\0');
    lua_pop(L, 1);
    lua_close(L);
}

static void raw_refs_need_no_finalizer(void)
{
    lua_State *L = new_state();
    /* many raw refs, some materialized, collected with the state: ASan sees no leak */
    run_lua(L, "for i = 1, 1000 do local r = json.parse('{\"i\":' .. i .. '}'); if i % 3 == 0 then json.materialize(r) end end\n"
               "collectgarbage()");
    lua_close(L);
}

int main(void)
{
    RUN(json_ref_encodes_its_json_t);
    RUN(raw_ref_encodes_verbatim_when_compact);
    RUN(raw_ref_with_whitespace_encodes_without_it);
    RUN(raw_ref_that_does_not_parse_is_an_error_not_a_crash);
    RUN(raw_ref_materializes_like_a_tree_ref);
    RUN(raw_ref_keeps_extra_bytes_after_its_text);
    RUN(raw_extra_blocks_of_any_size_one_after_another);
    RUN(raw_ref_inside_a_lua_table_encodes);
    RUN(json_parse_returns_a_raw_ref);
    RUN(raw_refs_are_closures_nothing_can_change_or_forge);
    RUN(raw_refs_need_no_finalizer);
    agw_buf_free(&out);
    return CHECK_DONE();
}
