/* test_pattern.c: "agg.pattern" (script/pattern.h) gives what LuaJIT's string library gives (fixed
 * cases for every part of the pattern language and every error, then a seeded random run), and a
 * hook set on the VM stops a match that would run for hours, at the caller's line. */
#include "tests/check.h"
#include "tests/script/pattern_diff.h"

#include <stdlib.h>
#include <time.h>

static lua_State *L;

/* One case: fn 0 find, 1 match, 2 gmatch, 3 gsub; flags as pattern_diff.h's fn / 4. */
static void diff_case(unsigned fn, unsigned flags, int init, const char *p, size_t plen, const char *s, size_t slen)
{
    uint8_t buf[600];
    if (plen > 255 || 3 + plen + slen > sizeof(buf))
        return;
    buf[0] = (uint8_t)(fn + 4 * flags);
    buf[1] = (uint8_t)(int8_t)init;
    buf[2] = (uint8_t)plen;
    memcpy(buf + 3, p, plen);
    memcpy(buf + 3 + plen, s, slen);
    const char *why = pattern_diff(L, buf, 3 + plen + slen);
    if (why != NULL) {
        fprintf(stderr, "  %s\n", why);
        check_failures++;
    }
}

#define CASE(fn, flags, init, p, s) diff_case((fn), (flags), (init), (p), sizeof(p) - 1, (s), sizeof(s) - 1)

static const char *const PATTERNS[] = {
    "a", "a*", "a+", "a-", "a?", ".", ".-b", "^a", "a$", "^$", "%a+", "%A", "%d%d", "%D", "%l%u",
    "%s*", "%S+", "%w", "%W", "%x+", "%X", "%p", "%P", "%c", "%C", "%g", "%G", "%z", "%Z", "%%",
    "%.", "[abc]", "[^abc]", "[a-c]+", "[%a_]", "[]]", "[^]]", "[a-]", "[-a]", "[%]]", "[a%-z]",
    "(a)", "(a*)(b)", "()a()", "(a(b))", "%b()", "%b<>", "%bxx", "%f[%w]%w+", "%f[%W]", "(a)%1",
    "(%w+)%s*=%s*(%w+)", "^(%d+)%.(%d+)$", "$a", "a$b", "x*$", "[a-c-e]", "%f[a]", "((a)b)%2",
    /* errors */
    "%", "[a", "[^", "(a", "a)", "%b", "%ba", "%f", "%fa", "%1", "(a)%2", "%0", "(()", "[%",
    "((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))",
};
#define S(lit) {(lit), sizeof(lit) - 1}
static const struct {
    const char *s;
    size_t n; /* (a NUL inside counts) */
} SUBJECTS[] = {
    S(""), S("a"), S("aaa"), S("abc"), S("aabbcc"), S("hello world"), S("key = value"), S("12.34"),
    S("(a(b)c)d"), S("<x<y>>"), S("THE (quick) fox"), S("a\0b"), S("\t \n"), S("]]]"), S("a-b-c"),
    S("xax"), S("abab"), S("%a%"), S("ü€"),
};

static void test_fixed_cases(void)
{
    for (size_t i = 0; i < sizeof(PATTERNS) / sizeof(PATTERNS[0]); i++)
        for (size_t j = 0; j < sizeof(SUBJECTS) / sizeof(SUBJECTS[0]); j++) {
            for (unsigned fn = 0; fn < 4; fn++)
                for (unsigned flags = 0; flags < 48; flags += (fn == 3 ? 4 : 1)) {
                    int init = (int)(flags % 7) - 3;
                    diff_case(fn, flags, init, PATTERNS[i], strlen(PATTERNS[i]), SUBJECTS[j].s, SUBJECTS[j].n);
                }
        }
    /* a pattern with a NUL: its end (the pattern is a C string) */
    CASE(0, 0, 1, "a\0b", "xa");
    CASE(0, 2, 1, "a\0b", "xa\0b");
    /* find's plain search: specials as they are, positions past the end */
    CASE(0, 3, 1, "a.", "xa.b");
    CASE(0, 3, 9, "", "abc");
    CASE(0, 1, -9, "b", "abc");
    CASE(1, 1, 100, "$", "abc");
    /* gsub: anchored, counts, empty matches, each replacement kind */
    for (unsigned r = 0; r < 12; r++) {
        CASE(3, r * 4, 0, "", "abc");
        CASE(3, r * 4 + 1, 2, "(%w)", "abc");
        CASE(3, r * 4, 0, "^(a)", "aaa");
        CASE(3, r * 4, 0, "()", "ab");
        CASE(3, r * 4, 0, "(a)(b)", "abab");
        CASE(3, r * 4, 0, "%w+", "one two");
    }
    /* nesting: up to 200 attempts in a row, then "pattern too complex" */
    char deep[256], subj[300];
    memset(subj, 'a', sizeof(subj));
    for (size_t n = 190; n <= 205; n += 3) {
        for (size_t k = 0; k < n && 2 * k + 1 < sizeof(deep); k++)
            memcpy(deep + 2 * k, "a?", 2);
        size_t plen = 2 * n < 255 ? 2 * n : 254;
        diff_case(0, 0, 1, deep, plen, subj, n);
    }
}

/* Random cases over the pattern language's pieces (seeded: the same run every time). */
static void test_random_cases(void)
{
    static const char *const PIECES[] = {
        "a", "b", "x", ".", "%", "%a", "%d", "%s", "%w", "%W", "%p", "%z", "%b()", "%bab", "%f[%w]",
        "%f[^a]", "%1", "%2", "%0", "(", ")", "()", "[", "]", "[ab]", "[^a]", "[a-c]", "[%d%s]", "^",
        "$", "*", "+", "-", "?", "%%", "%.", "%-", "\n", "(a", "b)", "%x", "%X", "%g", "%c", "%u",
        "%l", "%A", "%S", "%P", "%G", "%C", "[%x_]", "[^%l]", "%]", "[f-h]", "[%]-]",
    };
    static const char SUBJ_CHARS[] = "aabbx()[]%.- 1fFgG_~\x7f\x80\xff\x01\t\0";
    unsigned seed = 20261203;
    int n = getenv("AGW_PATTERN_CASES") ? atoi(getenv("AGW_PATTERN_CASES")) : 100000;
    for (int c = 0; c < n; c++) {
        char p[128], s[64];
        size_t pl = 0, sl = (size_t)(rand_r(&seed) % 24);
        int pieces = rand_r(&seed) % 7;
        for (int k = 0; k < pieces; k++) {
            const char *piece = PIECES[rand_r(&seed) % (int)(sizeof(PIECES) / sizeof(PIECES[0]))];
            size_t l = strlen(piece);
            if (pl + l >= sizeof(p))
                break;
            memcpy(p + pl, piece, l);
            pl += l;
        }
        for (size_t k = 0; k < sl; k++)
            s[k] = SUBJ_CHARS[rand_r(&seed) % (int)(sizeof(SUBJ_CHARS) - 1)];
        unsigned fn = (unsigned)rand_r(&seed) % 4, flags = (unsigned)rand_r(&seed) % 48;
        int init = rand_r(&seed) % 9 - 4;
        int before = check_failures;
        diff_case(fn, flags, init, p, pl, s, sl);
        if (check_failures - before && check_failures > 20)
            return; /* enough to read */
    }
}

/* A hook set on the VM (as the script time limit's stop, or a clock) runs while a match
 * backtracks, and what it raises is raised at the line that called the pattern function. Without
 * the poll this case runs for hours (about 4.5e12 steps) and the test times out. */
static void test_a_hook_stops_a_match(void)
{
    static const char SRC[] =
        "local P = require 'agg.pattern'\n"
        "local calls = 0\n"
        "debug.sethook(function() calls = calls + 1 if calls > 5 then\n"
        "  local at = debug.getinfo(2, 'Sl') error(at.short_src .. ':' .. at.currentline .. ': stopped: too long', 0)\n"
        "end end, '', 1000)\n"
        "local s = ('a'):rep(30000)\n"
        "local ok, err = pcall(function()\n"
        "  local r = P.find(s, '.-.-.-b') -- (not a tail call: this line is the caller's place)\n"
        "  return r\n"
        "end)\n"
        "debug.sethook()\n"
        "return ok, err\n";
    for (int fn = 0; fn < 7; fn++) {
        /* backtracking; then a long literal sequence and a long set, each tried at every byte of
         * the subject (their work per step is counted by the pattern's length) */
        static const char *const CALLS[] = {"P.find(s, '.-.-.-b')", "P.match(s, '.-.-.-b')",
                                            "P.gmatch(s, '.-.-.-b')()", "P.gsub(s, '.-.-.-b', 'x')",
                                            "P.find(s:rep(10), '.' .. s .. 'b')",
                                            "P.find(s:rep(10), '[' .. ('b'):rep(60000) .. ']')",
                                            "P.find(s:rep(10), '.-' .. ('[b]'):rep(20000))"};
        char src[sizeof(SRC) + 128];
        const char *at = strstr(SRC, "P.find(s, '.-.-.-b')");
        snprintf(src, sizeof(src), "%.*s%s%s", (int)(at - SRC), SRC, CALLS[fn], at + strlen("P.find(s, '.-.-.-b')"));
        time_t t0 = time(NULL);
        CHECK(luaL_loadbuffer(L, src, strlen(src), "=hooked") == 0);
        CHECK(lua_pcall(L, 0, 2, 0) == 0);
        CHECK(!lua_toboolean(L, -2));
        CHECK_STR(lua_tostring(L, -1), "hooked:8: stopped: too long");
        CHECK(time(NULL) - t0 < 50); /* (the bound of a hung case is ctest's timeout) */
        lua_settop(L, 0);
    }
}

/* A replacement function that calls gsub again, without end: "C stack overflow" once the thread's
 * stack runs low, never a crash (LuaJIT's own gsub overflows the stack at about 900 levels). */
static void test_nested_gsub_is_bounded(void)
{
    static const char SRC[] =
        "local P = require 'agg.pattern'\n"
        "local function r(s) return (P.gsub(s, '.', r)) end\n"
        "return pcall(r, 'x')\n";
    CHECK(luaL_loadbuffer(L, SRC, sizeof(SRC) - 1, "=nested") == 0);
    CHECK(lua_pcall(L, 0, 2, 0) == 0);
    CHECK(!lua_toboolean(L, -2));
    CHECK(lua_tostring(L, -1) != NULL && strstr(lua_tostring(L, -1), "C stack overflow") != NULL);
    lua_settop(L, 0);
}

/* Without a hook nothing polls, and a long but finite match finishes with LuaJIT's answer. */
static void test_no_hook_no_stop(void)
{
    static const char SRC[] =
        "local P = require 'agg.pattern'\n"
        "local s = ('a'):rep(2000) .. 'b'\n"
        "return select(2, P.find(s, '.-.-b')) == #s and select(2, string.find(s, '.-.-b')) == #s\n";
    CHECK(luaL_loadbuffer(L, SRC, sizeof(SRC) - 1, "=nohook") == 0);
    CHECK(lua_pcall(L, 0, 1, 0) == 0);
    CHECK(lua_toboolean(L, -1));
    lua_settop(L, 0);
}

/* `test_pattern bench`: microseconds per call of LuaJIT's functions and agg.pattern's on patterns
 * scripts use (interpreted, as scripts run), printed; not a test. */
static int bench(void)
{
    static const char SRC[] =
        "jit.off() local P = require 'agg.pattern'\n"
        "local text = ('lorem ipsum  dolor, sit amet=42; key=value, '):rep(25)\n"
        "local cases = {\n"
        " {'gsub %s+ (1 KB)', function(lib) return lib.gsub(text, '%s+', ' ') end},\n"
        " {'find (%w+)=(%w+)', function(lib) return lib.find(text, '(%w+)=(%w+)') end},\n"
        " {'gmatch [^,]+ (1 KB)', function(lib) local n = 0 for w in lib.gmatch(text, '[^,]+') do n = n + 1 end return n end},\n"
        " {'match ^%s*(.-)%s*$', function(lib) return lib.match('   trimmed text   ', '^%s*(.-)%s*$') end},\n"
        " {'find plain', function(lib) return lib.find(text, 'value, l', 1, true) end},\n"
        "}\n"
        "for _, c in ipairs(cases) do\n"
        "  local r = {}\n"
        "  for _, lib in ipairs { string, P, string, P } do\n"
        "    local t = os.clock() for i = 1, 20000 do c[2](lib) end r[#r + 1] = (os.clock() - t) / 20000 * 1e6\n"
        "  end\n"
        "  print(('%-22s LuaJIT %.2f us, agg.pattern %.2f us (%.2f x)'):format(c[1], r[3], r[4], r[4] / r[3]))\n"
        "end\n";
    if (luaL_loadbuffer(L, SRC, sizeof(SRC) - 1, "=bench") != 0 || lua_pcall(L, 0, 0, 0) != 0) {
        fprintf(stderr, "bench: %s\n", lua_tostring(L, -1));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    L = pattern_diff_vm();
    if (L == NULL)
        return 1;
    if (argc > 1 && strcmp(argv[1], "bench") == 0)
        return bench();
    RUN(test_fixed_cases);
    RUN(test_random_cases);
    RUN(test_a_hook_stops_a_match);
    RUN(test_nested_gsub_is_bounded);
    RUN(test_no_hook_no_stop);
    lua_close(L);
    return CHECK_DONE();
}
