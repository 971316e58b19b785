/* luamod.c: the metatables of the gateway's C Lua modules (luamod.h). */
#include "base/luamod.h"

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
