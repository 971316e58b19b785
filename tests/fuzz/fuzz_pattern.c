/* fuzz_pattern.c: the scripts' string patterns (gateway/script/pattern.h), differential against
 * LuaJIT's string library.
 *
 * The input is one case of gateway/tests/script/pattern_diff.h: a function (find, match, gmatch,
 * gsub), its flags, init, a pattern and a subject. The two must give the same results (types and
 * values, every capture and position, gsub's string and count) or the same error message at the
 * same place. LuaJIT's matcher cannot be stopped, so inputs whose worst case would run for long
 * are skipped: a subject over 48 bytes, or more than three repetition characters (* + - ?) in the
 * pattern (at most 48^3 attempts per start). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/script/pattern_diff.h"

static lua_State *L;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL && (L = pattern_diff_vm()) == NULL)
        abort();
    if (size < 3)
        return 0;
    size_t plen = data[2] < size - 3 ? data[2] : size - 3;
    if (size - 3 - plen > 48)
        return 0;
    int reps = 0;
    for (size_t i = 0; i < plen; i++)
        reps += data[3 + i] == '*' || data[3 + i] == '+' || data[3 + i] == '-' || data[3 + i] == '?';
    if (reps > 3)
        return 0;
    const char *why = pattern_diff(L, data, size);
    if (why != NULL) {
        fprintf(stderr, "fuzz_pattern: %s\n", why);
        abort();
    }
    lua_settop(L, 0);
    if (lua_gc(L, LUA_GCCOUNT, 0) > 64 * 1024) /* KB: a long run's garbage */
        lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}
