/* pattern_diff.h: runs one string-pattern case through LuaJIT's string library and through
 * "agg.pattern" (script/pattern.h) and compares what the two give: every result (type and value),
 * or the error message (the same text at the same place). Shared by the unit test
 * (test_pattern.c: fixed cases and a seeded random run) and the fuzz harness
 * (tests/fuzz/fuzz_pattern.c).
 *
 * A case is bytes: [fn] [init] [plen] pattern[plen] subject…, where fn % 4 picks find, match,
 * gmatch or gsub; fn / 4 picks find's plain flag, whether init is given, and gsub's replacement
 * and count (PATTERN_DIFF_LUA's REPLS); init is a signed byte. */
#ifndef AGW_TEST_PATTERN_DIFF_H
#define AGW_TEST_PATTERN_DIFF_H

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "script/pattern.h"

/* Returns compare(fn, init_given, init, plain, repl, maxn, pattern, subject) -> nil | why */
static const char PATTERN_DIFF_LUA[] =
    "local P = require 'agg.pattern'\n"
    "local REPLS = {\n"
    "  '%1-%0', '<%2>', 'x%%y', 'end%', '%a%', 7,\n"
    "  { a = 'A', b = false, ['1'] = 'one', c = 42 }, { x = {} },\n"
    "  function(a, b) return a and (tostring(a) .. '|' .. tostring(b)) end,\n"
    "  function() return false end, function(a) return #tostring(a) end, function() return {} end,\n"
    "}\n"
    "local function show(ok, ...)\n"
    "  local out = { ok and 'ok' or 'error' }\n"
    "  for i = 1, select('#', ...) do\n"
    "    local v = select(i, ...)\n"
    "    out[#out + 1] = type(v) .. ':' .. tostring(v)\n"
    "  end\n"
    "  return table.concat(out, ' ')\n"
    "end\n"
    "local function collect(it)\n"
    "  local all = {}\n"
    "  for _ = 1, 40 do\n"
    "    local r = { it() }\n"
    "    if r[1] == nil then break end\n"
    "    for i = 1, #r do all[#all + 1] = type(r[i]) .. ':' .. tostring(r[i]) end\n"
    "    all[#all + 1] = ';'\n"
    "  end\n"
    "  return table.concat(all, ' ')\n"
    "end\n"
    "local function run(lib, fn, init_given, init, plain, repl, maxn, p, s)\n"
    "  if fn == 'gmatch' then\n"
    "    return show(pcall(function() local it = lib.gmatch(s, p) local r = collect(it) return r end))\n"
    "  elseif fn == 'gsub' then\n"
    "    return show(pcall(function() local a, b = lib.gsub(s, p, REPLS[repl], maxn) return a, b end))\n"
    "  elseif init_given then\n"
    "    return show(pcall(function() local r = { lib[fn](s, p, init, plain) } return unpack(r) end))\n"
    "  else\n"
    "    return show(pcall(function() local r = { lib[fn](s, p) } return unpack(r) end))\n"
    "  end\n"
    "end\n"
    "return function(fn, init_given, init, plain, repl, maxn, p, s)\n"
    "  local want = run(string, fn, init_given, init, plain, repl, maxn, p, s)\n"
    "  local got = run(P, fn, init_given, init, plain, repl, maxn, p, s)\n"
    "  if want ~= got then\n"
    "    return ('%s(%q, %q): LuaJIT gives %s, agg.pattern %s'):format(fn, s, p, want, got)\n"
    "  end\n"
    "end\n";

/* A VM with the standard libraries, "agg.pattern" and the comparison function in the registry
 * (key "pattern_diff"). NULL when it cannot be made. */
static lua_State *pattern_diff_vm(void)
{
    lua_State *L = luaL_newstate();
    if (L == NULL)
        return NULL;
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, agw_pattern_open);
    lua_setfield(L, -2, "agg.pattern");
    lua_pop(L, 2);
    if (luaL_loadbuffer(L, PATTERN_DIFF_LUA, sizeof(PATTERN_DIFF_LUA) - 1, "=pattern_diff") != 0 ||
        lua_pcall(L, 0, 1, 0) != 0) {
        fprintf(stderr, "pattern_diff: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return NULL;
    }
    lua_setfield(L, LUA_REGISTRYINDEX, "pattern_diff");
    return L;
}

/* Compares one case (the layout above). Returns NULL when the two agree, else why (a string in
 * the VM, valid until the next call). */
static const char *pattern_diff(lua_State *L, const uint8_t *data, size_t size)
{
    static const char *const FNS[] = {"find", "match", "gmatch", "gsub"};
    if (size < 3)
        return NULL;
    unsigned sel = data[0];
    int init = (int8_t)data[1];
    size_t plen = data[2];
    data += 3;
    size -= 3;
    if (plen > size)
        plen = size;
    lua_settop(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, "pattern_diff");
    lua_pushstring(L, FNS[sel % 4]);
    lua_pushboolean(L, (sel / 4) & 1);
    lua_pushinteger(L, init);
    lua_pushboolean(L, (sel / 8) & 1);
    lua_pushinteger(L, (lua_Integer)(sel / 16 % 12) + 1);
    if ((sel / 4) & 1)
        lua_pushinteger(L, init);
    else
        lua_pushnil(L);
    lua_pushlstring(L, (const char *)data, plen);
    lua_pushlstring(L, (const char *)data + plen, size - plen);
    if (lua_pcall(L, 8, 1, 0) != 0)
        return lua_tostring(L, -1);
    return lua_isnil(L, -1) ? NULL : lua_tostring(L, -1);
}

#endif
