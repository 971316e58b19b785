/* luamod.h: how a C Lua module of the gateway builds its tables (agg.json, agg.sys, agg.router,
 * agg.breaker, agg.resp_headers, agg.limiter): from luaL_Reg lists, never field by field.
 *
 * A module's table is luaL_newlib(L, fns) (LuaJIT 2.1's lauxlib, Lua 5.2's API); a metatable of
 * metamethods alone is luaL_register(L, NULL, mt) into a new table (agg.json's). A module whose
 * userdata own C memory (a router, a breaker, a limits store) gets their metatable from
 * agw_luamod_class, which also guards it: a script that reached such an object could otherwise
 * call its __gc by hand and then use the freed memory, or swap its methods.
 *
 * It also reads the fields of the tables Lua hands to C (the normalized gateway.lua of
 * script/config.c and edge/auth_config.c).
 */
#ifndef AGW_BASE_LUAMOD_H
#define AGW_BASE_LUAMOD_H

#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

/* Pushes the metatable registered as name (luaL_newmetatable), making it the first time in this
 * lua_State: methods ({NULL, NULL}-terminated) in its __index table, each a closure over the
 * metatable (upvalue 1, so that a method can check its argument's metatable with lua_rawequal
 * and no registry lookup); gc (NULL for none) as __gc; and __metatable = name, so getmetatable
 * gives the name and setmetatable raises. Returns 1 when the metatable was made now, 0 when it
 * existed. */
int agw_luamod_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc);

/* Field name of the table at idx as a new string (agw_strdup: the caller frees
 * it), or NULL when it is not a string or a number (lua_isstring). The stack is left as it was. */
char *agw_luamod_field_str(lua_State *L, int idx, const char *name);

/* Field name of the table at idx as a number, or dflt when it is not a number
 * (lua_isnumber: a numeric string counts). The stack is left as it was. */
double agw_luamod_field_num(lua_State *L, int idx, const char *name, double dflt);

/* v as a whole number from 0 to 2^53 (the largest a double counts to exactly): NaN and negatives
 * give 0, larger values and infinity 2^53, fractions are cut. A double outside an integer type's
 * range converted with a cast is undefined behaviour (C11 6.3.1.4); the Lua side (agg.config)
 * already bounds every number a configuration gives, and this keeps C defined whatever it misses. */
uint64_t agw_luamod_to_u64(double v);

/* v as an int: NaN gives 0, values past INT_MIN/INT_MAX those bounds, fractions are cut. */
int agw_luamod_to_int(double v);

/* agw_luamod_to_u64 of field name of the table at idx (dflt when it is not a number). */
uint64_t agw_luamod_field_u64(lua_State *L, int idx, const char *name, uint64_t dflt);

/* agw_luamod_to_int of field name of the table at idx (dflt when it is not a number): the line
 * numbers and ports agg.config hands over. */
int agw_luamod_field_int(lua_State *L, int idx, const char *name, int dflt);

#endif
