/* json_internal.h: what the files of the JSON module share (json.c, encode.c, push.c; not for
 * use outside gateway/json/): the registry entries of a lua_State that hold the module's
 * metatables and its key-order table. json.c makes them (the module's first use in a state);
 * encode.c and push.c read them. Being here, not in json.h, they close the json <-> encode <->
 * push cycle inside the folder.
 */
#ifndef AGW_JSON_INTERNAL_H
#define AGW_JSON_INTERNAL_H

#include "json/json.h"

/* Registry fields (one set per lua_State, created by agw_json_open or the first agw_json_push and
 * reused afterwards): the metatables of arrays, int64 boxes and tree refs, and the weak-keyed side
 * table order[tbl] = {k1, k2, ...} of remembered object key orders. An int64 box is a full userdata
 * holding one int64_t; a tree ref is a full userdata holding one json_t * (a counted reference). A
 * raw ref needs no registry entry: the C function of its closure is what marks it (json.h). */
#define AGW_JSON_ARRAY_MT "agw.json.array"
#define AGW_JSON_INT64_MT "agw.json.int64"
#define AGW_JSON_REF_MT "agw.json.ref"
#define AGW_JSON_ORDER "agw.json.order"

/* The same registry entries are also stored under light userdata keys, which are faster to look
 * up (no string hashing): agw_json_regget(L, AGW_JSON_K_REF) pushes
 * registry[AGW_JSON_REF_MT] (nil before the module's first use in L). */
enum { AGW_JSON_K_ORDER, AGW_JSON_K_ARRAY, AGW_JSON_K_INT64, AGW_JSON_K_REF, AGW_JSON_NKEYS };
extern const char agw_json_regkey[AGW_JSON_NKEYS];
/* Key (light userdata) of an ordered metatable's key list (json.ordered): a table whose metatable
 * holds a list under it encodes its members in that order. */
extern const char agw_json_order_mark;
static inline void agw_json_regget(lua_State *L, int k)
{
    lua_pushlightuserdata(L, (void *)&agw_json_regkey[k]);
    lua_rawget(L, LUA_REGISTRYINDEX);
}

#endif
