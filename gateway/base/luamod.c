/* luamod.c: the metatables of the gateway's C Lua modules (luamod.h). */
#include "base/luamod.h"

#include <limits.h>

#include "base/mem.h"

int agw_luamod_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc)
{
    if (!luaL_newmetatable(L, name))
        return 0;
    int n = 0;
    while (methods[n].name)
        n++;
    lua_createtable(L, 0, n);
    for (const luaL_Reg *m = methods; m->name; m++) {
        lua_pushvalue(L, -2); /* the metatable: upvalue 1 */
        lua_pushcclosure(L, m->func, 1);
        lua_setfield(L, -2, m->name);
    }
    lua_setfield(L, -2, "__index");
    if (gc) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__metatable");
    return 1;
}

char *agw_luamod_field_str(lua_State *L, int idx, const char *name)
{
    lua_getfield(L, idx, name);
    char *s = lua_isstring(L, -1) ? agw_strdup(lua_tostring(L, -1)) : NULL;
    lua_pop(L, 1);
    return s;
}

double agw_luamod_field_num(lua_State *L, int idx, const char *name, double dflt)
{
    lua_getfield(L, idx, name);
    double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : dflt;
    lua_pop(L, 1);
    return v;
}

uint64_t agw_luamod_to_u64(double v)
{
    const double top = 9007199254740992.0; /* 2^53 */
    if (!(v > 0)) /* NaN too */
        return 0;
    return v >= top ? (uint64_t)top : (uint64_t)v;
}

int agw_luamod_to_int(double v)
{
    if (v != v)
        return 0;
    if (v <= (double)INT_MIN)
        return INT_MIN;
    if (v >= (double)INT_MAX)
        return INT_MAX;
    return (int)v;
}

uint64_t agw_luamod_field_u64(lua_State *L, int idx, const char *name, uint64_t dflt)
{
    lua_getfield(L, idx, name);
    uint64_t v = lua_isnumber(L, -1) ? agw_luamod_to_u64(lua_tonumber(L, -1)) : dflt;
    lua_pop(L, 1);
    return v;
}

int agw_luamod_field_int(lua_State *L, int idx, const char *name, int dflt)
{
    lua_getfield(L, idx, name);
    int v = lua_isnumber(L, -1) ? agw_luamod_to_int(lua_tonumber(L, -1)) : dflt;
    lua_pop(L, 1);
    return v;
}
