/* script.h: LuaJIT states for aggway: the runtime modules (lua/agg), the C modules they use, and
 * loading a scripts folder as one generation. */
#ifndef AGW_SCRIPT_H
#define AGW_SCRIPT_H

#include <lua.h>

#include "base/buf.h"

/* Folder of the Lua half of the runtime, absolute: $AGGWAY_LUA_DIR, else the one installed beside
 * the binary, else (a binary in its build tree) the source tree's lua/; NULL when none holds it
 * (deploy/runtime_dir.h gives the order and the message). */
const char *agw_lua_dir(void);

/* Whether a Lua function's source (lua_Debug.source, "@path") is a file of the runtime's Lua half
 * (agw_lua_dir(): lua/agg), not a script of a scripts folder, a module it required or a chunk it
 * loaded. The script time limit and the pattern functions never stop the runtime's own code. */
int agw_lua_source_is_runtime(const char *source);

/* The default of script_memory_limit_mb (gateway.lua), MB: the limit every VM agw_vm_new makes
 * starts with (base/heap.h); a worker's VMs take their generation's. */
#define AGW_SCRIPT_MEMORY_LIMIT_MB 1024

/* Creates a LuaJIT state (base/heap.h: its heap limited to AGW_SCRIPT_MEMORY_LIMIT_MB; close it with
 * agw_heap_close_lua_state) with the standard libraries, package.path covering the runtime folder and
 * scripts_dir (for require "lib.x"), and the C modules "agg.json", "agg.sys", "agg.breaker",
 * "agg.resp_headers", "agg.router", "agg.limiter" and "agg.pattern" (script/pattern.h) preloaded.
 * Returns NULL on allocation failure. */
lua_State *agw_vm_new(const char *scripts_dir);

/* Runs require("agg.loader").load(dir). On success leaves the generation table
 * ({ config, upstreams, endpoints }) on the stack and returns 0. On failure appends each
 * "file:line: message" as a line to errors, leaves the stack as it was and returns -1. */
int agw_vm_load_generation(lua_State *L, const char *dir, agw_buf_t *errors);

/* Opens the "agg.sys" module: listdir(dir) -> sorted list of the endpoint script paths under dir,
 * relative to it (every *.lua but gateway.lua, lib/ and hidden entries); read_file, monotonic_s,
 * cpu_s (the calling thread's CPU time in seconds), call_invalid (the upstream client's check of a call); hash32(s) -> FNV-1a 32 with fmix32, an
 * unsigned 32-bit number (agg.group's ring and endpoint ids; it never changes: session tokens
 * carry its values). */
int agw_sys_open(lua_State *L);

#endif
