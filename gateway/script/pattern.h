/* pattern.h: Lua's string patterns for scripts, stoppable while they run.
 *
 * LuaJIT's string.find, string.match, string.gmatch and string.gsub match patterns by
 * backtracking inside one C call. A pattern with several backtracking items that fails on a long
 * subject (`("a"):rep(1e5):find(".-.-.-b")`) takes time polynomial in the subject's length, and no
 * hook runs in C: the script time limit (worker/watchdog.h), the load budget (agg.loader) and
 * the spec harness's limit (agg.testing_clock) could not stop it, and the worker was held for as
 * long. The module "agg.pattern" gives the four functions again, with LuaJIT 2.1's semantics
 * (the same results, captures, positions and error messages: a differential test,
 * tests/fuzz/fuzz_pattern.c, compares the two), and the sandbox (agg.sandbox) gives them to
 * scripts as string.* and as the strings' methods.
 *
 * What changes: while the VM has a hook set (the stop the watchdog asks for, the load budget's and
 * the spec harness's clock), a match that has done about 2^14 steps of work (a step: an item of
 * the pattern tried, a set counted by its length, or a byte a repetition, a %b or a back
 * reference scanned)
 * calls a small Lua function in the interpreter, so that the hook runs as it would at the
 * script's next instruction. An error the hook raises there ("stopped: …", "loading the scripts
 * took longer …") is raised by the pattern function at its caller's line (without a place when a
 * script tail-called it: its frame is gone). The runtime's own code (lua/agg) never calls these:
 * it holds LuaJIT's functions as locals (str_find …; tools/check-runtime-patterns, a ctest, keeps
 * it so), so a hook never stops the runtime half way. Without a hook, the cost is a counter per
 * step. A gsub nested through replacement functions until the thread's C stack runs low raises
 * "C stack overflow" (LuaJIT's own overflowed the stack and ended the process).
 *
 * Also as LuaJIT: a pattern nests at most 200 items that backtrack ("pattern too complex"), and
 * at most 32 captures. Source of the pattern language: the Lua 5.1 reference manual §5.4.1.
 */
#ifndef AGW_PATTERN_H
#define AGW_PATTERN_H

#include <lua.h>

/* Opens "agg.pattern": a table { find, match, gmatch, gsub, rep, format, table_concat } (the
 * signatures of string.find, string.match, string.gmatch, string.gsub, string.rep, string.format
 * and table.concat). Errors: those of LuaJIT's functions, raised at the caller's line; what a hook
 * raises while a match polls (see above); "not enough memory: …" when what one call would make
 * (rep, gsub's result as it grows, format's and concat's from their arguments) would take the
 * scripts' heap past script_memory_limit_mb (base/heap.h agw_heap_lua_take; no hook runs inside
 * one C call). */
int agw_pattern_open(lua_State *L);

#endif
