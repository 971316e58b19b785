/* test_luamod_num: the numbers C reads from the tables Lua hands it (base/luamod.h) convert with
 * defined behaviour whatever the double: NaN, infinities, negatives and values past the integer
 * types clamp instead of reaching a cast (C11 6.3.1.4), and the field readers keep the stack. */
#include "base/luamod.h"
#include "tests/check.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <lualib.h>

static void doubles_clamp_to_whole_numbers(void)
{
    const uint64_t top = (uint64_t)1 << 53;
    CHECK(agw_luamod_to_u64(NAN) == 0);
    CHECK(agw_luamod_to_u64(-1.0) == 0);
    CHECK(agw_luamod_to_u64(-INFINITY) == 0);
    CHECK(agw_luamod_to_u64(0.9) == 0);
    CHECK(agw_luamod_to_u64(1000.7) == 1000);
    CHECK(agw_luamod_to_u64(1e46) == top); /* the fuzz input's deadline_ms */
    CHECK(agw_luamod_to_u64(INFINITY) == top);
    CHECK(agw_luamod_to_u64(9007199254740991.0) == top - 1);
    CHECK(agw_luamod_to_int(NAN) == 0);
    CHECK(agw_luamod_to_int(1e300) == INT_MAX);
    CHECK(agw_luamod_to_int(-1e300) == INT_MIN);
    CHECK(agw_luamod_to_int(-7.9) == -7);
    CHECK(agw_luamod_to_int(65535.0) == 65535);
}

static void fields_read_numbers_or_their_default(void)
{
    lua_State *L = luaL_newstate();
    CHECK(luaL_dostring(L, "return { big = 1e46, neg = -5, port = 8080, str = '12', word = 'x', nan = 0/0 }") == 0);
    int t = lua_gettop(L);
    CHECK(agw_luamod_field_u64(L, t, "big", 7) == (uint64_t)1 << 53);
    CHECK(agw_luamod_field_u64(L, t, "neg", 7) == 0);
    CHECK(agw_luamod_field_u64(L, t, "str", 7) == 12); /* a numeric string counts, as lua_isnumber says */
    CHECK(agw_luamod_field_u64(L, t, "word", 7) == 7);
    CHECK(agw_luamod_field_u64(L, t, "missing", 7) == 7);
    CHECK(agw_luamod_field_u64(L, t, "nan", 7) == 0);
    CHECK(agw_luamod_field_int(L, t, "port", 80) == 8080);
    CHECK(agw_luamod_field_int(L, t, "big", 80) == INT_MAX);
    CHECK(agw_luamod_field_int(L, t, "missing", 80) == 80);
    CHECK(lua_gettop(L) == t);
    lua_close(L);
}

int main(void)
{
    RUN(doubles_clamp_to_whole_numbers);
    RUN(fields_read_numbers_or_their_default);
    return CHECK_DONE();
}
