/* json_fixture.h: the Lua VM and helpers the JSON unit tests share (test_json*.c): a fresh VM with
 * the agg.json module, the paths a value takes to JSON text (through Lua values, through a tree
 * ref, from a Lua expression, a single number), and Lua chunks run as checks. Results land in the
 * shared buffer `out` (valid until the next call), errors in `err`. Test-only: static definitions,
 * included once per test program. */
#ifndef AGW_TESTS_JSON_FIXTURE_H
#define AGW_TESTS_JSON_FIXTURE_H

#include <lauxlib.h>
#include <lualib.h>
#include <math.h>
#include <stdlib.h>

#include "tests/check.h"
#include "json/json.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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

#pragma GCC diagnostic pop

#endif
