/* runtime_dir.h: where the Lua half of the runtime (the agg/ modules) is read from.
 *
 * The binary and its Lua runtime travel together: an installed aggway reads the runtime that was
 * installed beside it, a binary in its build tree reads the source tree's lua/ (so that tests run
 * what they build), and nothing else is guessed. The folder is looked up once, in this order:
 *
 *   1. $AGGWAY_LUA_DIR, when set and not empty: the configured path, used as given. A folder that
 *      does not hold agg/loader.lua is an error (never a silent fall-through to another copy).
 *   2. AGW_LUA_RELDIR relative to the folder of the running binary (/proc/self/exe), as laid out
 *      by `cmake --install`: ../share/aggway/lua beside bin/aggway (any prefix, DESTDIR staging or
 *      a copied tree: the path is relative).
 *   3. AGW_BUILD_LUA_DIR (the source tree's lua/), only when the running binary sits in
 *      AGW_BUILD_DIR, the build tree it was compiled in.
 *
 * The folder found is made absolute (realpath), so that a chunk's source name ("@folder/agg/x.lua")
 * starts with exactly this string (script/script.c's agw_lua_source_is_runtime relies on that). */
#ifndef AGW_RUNTIME_DIR_H
#define AGW_RUNTIME_DIR_H

/* The runtime folder, found on the first call (thread-safe; later calls return the same string,
 * which lives as long as the process). NULL when none of the places above holds the runtime: then
 * agw_runtime_dir_problem() says where it looked. */
const char *agw_runtime_dir(void);

/* When agw_runtime_dir() is NULL: one line (no newline) naming every place looked at and what to
 * do, e.g. "cannot find the Lua runtime (agg/loader.lua): not in /opt/aggway/share/aggway/lua
 * (beside /opt/aggway/bin/aggway); install it there or set AGGWAY_LUA_DIR". Otherwise "". */
const char *agw_runtime_dir_problem(void);

/* How the folder was found, for `aggway version`: "AGGWAY_LUA_DIR", "installed" (beside the
 * binary) or "build tree"; "" when it was not found. */
const char *agw_runtime_dir_source(void);

#endif
