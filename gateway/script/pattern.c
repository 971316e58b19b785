/* pattern.c: Lua's string patterns for scripts, stoppable while they run (pattern.h).
 *
 * A backtracking matcher over the pattern text, as the Lua 5.1 reference manual §5.4.1 defines
 * the language and LuaJIT 2.1 implements it: an item is a single character class followed by an
 * optional repetition (*, +, -, ?); %bxy, %f[set], %1-%9, captures and position captures; '^'
 * anchors find, match and gsub (gmatch takes it as a character), '$' anchors at the end. Every
 * function's results and errors are LuaJIT's; the additions are the poll, the count of steps that
 * paces it (bounded work per step: an item of the pattern, a set counted by its length, a byte a
 * repetition, %b or a back reference scans), and a bound on gsub's nesting through replacement
 * functions (the C stack). */
#include "script/pattern.h"

#include "base/heap.h"
#include "script/script.h"

#include <lauxlib.h>
#include <luajit.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define PAT_ESC '%'
#define PAT_MAX_CAPTURES 32 /* LUA_MAXCAPTURES */
#define PAT_MAX_DEPTH 200   /* nested attempts: LuaJIT's LJ_MAX_XLEVEL, "pattern too complex" */
#define PAT_POLL_STEPS (1L << 14)

/* gsub looks at the scripts' heap each time its result grows by this much (base/heap.h
 * AGW_LUA_HUGE_BLOCK: what agw_heap_lua_take looks at). */
#define GSUB_CHECK_BYTES ((size_t)4 << 20)
#define CAP_OPEN (-1)     /* a capture begun, not closed yet */
#define CAP_POSITION (-2) /* () */

/* The poll function's chunk name, and how LuaJIT shows it in an error ("(pattern):1: …"). */
#define POLL_CHUNK "=(pattern)"
#define POLL_SHORT "(pattern):"

typedef struct pat_state {
    lua_State *L;
    int poll_index;          /* the poll function's upvalue index */
    const char *subj, *end;  /* the subject (NUL-terminated past end: a Lua string) */
    int level;               /* captures begun */
    int depth;               /* nested match() calls */
    long credit;             /* steps until the next poll */
    struct {
        const char *at;
        ptrdiff_t len; /* or CAP_OPEN, CAP_POSITION */
    } cap[PAT_MAX_CAPTURES];
} pat_state_t;

static void state_init(pat_state_t *ps, lua_State *L, int poll_index, const char *s, size_t len)
{
    ps->L = L;
    ps->poll_index = poll_index;
    ps->subj = s;
    ps->end = s + len;
    ps->level = 0;
    ps->depth = 0;
    ps->credit = PAT_POLL_STEPS;
}

/* Runs the poll function when a hook is set: the hook runs in it as at the script's next
 * instruction. What the hook raises is raised again at the caller's line, or without a place when
 * the caller is the runtime's code (a script's function that tail-called the pattern function is
 * gone from the stack; the runtime's own code never calls these: tools/check-runtime-patterns). */
static void poll(pat_state_t *ps)
{
    lua_State *L = ps->L;
    ps->credit = PAT_POLL_STEPS;
    if (lua_gethook(L) == NULL)
        return;
    lua_pushvalue(L, lua_upvalueindex(ps->poll_index));
    if (lua_pcall(L, 0, 0, 0) == 0)
        return;
    const char *msg = lua_tostring(L, -1);
    size_t n = sizeof(POLL_SHORT) - 1;
    if (msg != NULL && strncmp(msg, POLL_SHORT, n) == 0) {
        /* "(pattern):1: stopped: …" -> "scripts/x.lua:7: stopped: …" */
        const char *rest = strstr(msg + n, ": ");
        lua_Debug ar;
        if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "S", &ar) && agw_lua_source_is_runtime(ar.source))
            lua_pushliteral(L, "");
        else
            luaL_where(L, 1);
        lua_pushstring(L, rest ? rest + 2 : msg);
        lua_concat(L, 2);
    }
    lua_error(L);
}

/* n more steps of work. */
static inline void charge(pat_state_t *ps, long n)
{
    ps->credit -= n;
    if (ps->credit <= 0)
        poll(ps);
}

/* ASCII classes, as LuaJIT's (no locale): bytes >= 128 are in none. */
static int is_lower(int c) { return c >= 'a' && c <= 'z'; }
static int is_upper(int c) { return c >= 'A' && c <= 'Z'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_alpha(int c) { return is_lower(c) || is_upper(c); }
static int is_alnum(int c) { return is_alpha(c) || is_digit(c); }
static int is_graph(int c) { return c > 32 && c < 127; }

/* Whether byte c is in class %cl (a letter names a class, its upper case the complement; any other
 * character stands for itself). */
static int class_match(int c, int cl)
{
    int in;
    switch (cl | 0x20) {
    case 'a': in = is_alpha(c); break;
    case 'c': in = c < 32 || c == 127; break;
    case 'd': in = is_digit(c); break;
    case 'g': in = is_graph(c); break;
    case 'l': in = is_lower(c); break;
    case 'p': in = is_graph(c) && !is_alnum(c); break;
    case 's': in = c == ' ' || (c >= '\t' && c <= '\r'); break;
    case 'u': in = is_upper(c); break;
    case 'w': in = is_alnum(c); break;
    case 'x': in = is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); break;
    case 'z': in = c == 0; break;
    default: return cl == c; /* (only letters become letters with 0x20) */
    }
    return is_lower(cl) ? in : !in;
}

/* Whether byte c is in the set p .. close ('[' .. ']'). */
static int set_match(int c, const char *p, const char *close)
{
    int yes = 1;
    if (p[1] == '^') {
        yes = 0;
        p++;
    }
    while (++p < close) {
        if (*p == PAT_ESC) {
            p++;
            if (class_match(c, (unsigned char)*p))
                return yes;
        } else if (p[1] == '-' && p + 2 < close) {
            p += 2;
            if ((unsigned char)p[-2] <= c && c <= (unsigned char)*p)
                return yes;
        } else if ((unsigned char)*p == c) {
            return yes;
        }
    }
    return !yes;
}

/* The end of the single-character class that starts at p. */
static const char *item_end(pat_state_t *ps, const char *p)
{
    char c = *p++;
    if (c == PAT_ESC) {
        if (*p == '\0')
            luaL_error(ps->L, "malformed pattern (ends with '%%')");
        return p + 1;
    }
    if (c == '[') {
        if (*p == '^')
            p++;
        do { /* the first character is in the set even when it is ']' */
            if (*p == '\0')
                luaL_error(ps->L, "malformed pattern (missing ']')");
            if (*p++ == PAT_ESC && *p != '\0')
                p++;
        } while (*p != ']');
        return p + 1;
    }
    return p;
}

static int single_match(int c, const char *p, const char *ep)
{
    switch (*p) {
    case '.': return 1;
    case PAT_ESC: return class_match(c, (unsigned char)p[1]);
    case '[': return set_match(c, p, ep - 1);
    default: return (unsigned char)*p == c;
    }
}

static const char *match(pat_state_t *ps, const char *s, const char *p);

/* %bxy at s (p: "xy…"). */
static const char *balance(pat_state_t *ps, const char *s, const char *p)
{
    if (p[0] == '\0' || p[1] == '\0')
        luaL_error(ps->L, "unbalanced pattern");
    if (s >= ps->end || *s != p[0])
        return NULL;
    int open = 0;
    const char *q = s;
    while (++q < ps->end) {
        if (*q == p[1]) {
            if (open-- == 0) {
                charge(ps, q - s);
                return q + 1;
            }
        } else if (*q == p[0]) {
            open++;
        }
    }
    charge(ps, q - s);
    return NULL;
}

/* The longest run of the item p .. ep at s, then shorter ones, each followed by the rest. */
static const char *max_expand(pat_state_t *ps, const char *s, const char *p, const char *ep)
{
    ptrdiff_t i = 0;
    while (s + i < ps->end && single_match((unsigned char)s[i], p, ep)) {
        i++;
        charge(ps, ep - p);
    }
    for (; i >= 0; i--) {
        const char *r = match(ps, s + i, ep + 1);
        if (r != NULL)
            return r;
    }
    return NULL;
}

/* The shortest run of the item p .. ep at s followed by the rest, then longer ones. */
static const char *min_expand(pat_state_t *ps, const char *s, const char *p, const char *ep)
{
    for (;;) {
        const char *r = match(ps, s, ep + 1);
        if (r != NULL)
            return r;
        charge(ps, ep - p);
        if (s < ps->end && single_match((unsigned char)*s, p, ep))
            s++;
        else
            return NULL;
    }
}

static const char *open_capture(pat_state_t *ps, const char *s, const char *p, ptrdiff_t what)
{
    if (ps->level >= PAT_MAX_CAPTURES)
        luaL_error(ps->L, "too many captures");
    ps->cap[ps->level].at = s;
    ps->cap[ps->level].len = what;
    ps->level++;
    const char *r = match(ps, s, p);
    if (r == NULL)
        ps->level--;
    return r;
}

static const char *close_capture(pat_state_t *ps, const char *s, const char *p)
{
    int l = ps->level - 1;
    while (l >= 0 && ps->cap[l].len != CAP_OPEN)
        l--;
    if (l < 0)
        luaL_error(ps->L, "invalid pattern capture");
    ps->cap[l].len = s - ps->cap[l].at;
    const char *r = match(ps, s, p);
    if (r == NULL)
        ps->cap[l].len = CAP_OPEN;
    return r;
}

/* %1-%9 at s: the text of a closed capture again. */
static const char *back_reference(pat_state_t *ps, const char *s, int digit)
{
    int i = digit - '1';
    if (i < 0 || i >= ps->level || ps->cap[i].len == CAP_OPEN)
        luaL_error(ps->L, "invalid capture index");
    size_t len = (size_t)ps->cap[i].len; /* a position capture: never fits */
    if ((size_t)(ps->end - s) < len)
        return NULL;
    charge(ps, (long)len);
    return memcmp(ps->cap[i].at, s, len) == 0 ? s + len : NULL;
}

/* Matches the pattern p at s: the end of the match, or NULL. */
static const char *match(pat_state_t *ps, const char *s, const char *p)
{
    if (++ps->depth > PAT_MAX_DEPTH)
        luaL_error(ps->L, "pattern too complex");
again:
    charge(ps, 1); /* (each item of a sequence, not only each attempt) */
    switch (*p) {
    case '(':
        s = p[1] == ')' ? open_capture(ps, s, p + 2, CAP_POSITION) : open_capture(ps, s, p + 1, CAP_OPEN);
        break;
    case ')':
        s = close_capture(ps, s, p + 1);
        break;
    case '\0':
        break;
    case '$':
        if (p[1] != '\0')
            goto item; /* a '$' inside the pattern is itself */
        if (s != ps->end)
            s = NULL;
        break;
    case PAT_ESC:
        if (p[1] == 'b') {
            s = balance(ps, s, p + 2);
            if (s == NULL)
                break;
            p += 4;
            goto again;
        }
        if (p[1] == 'f') {
            p += 2;
            if (*p != '[')
                luaL_error(ps->L, "missing '[' after '%%f' in pattern");
            const char *ep = item_end(ps, p);
            charge(ps, ep - p);
            int before = s == ps->subj ? '\0' : (unsigned char)s[-1];
            if (set_match(before, p, ep - 1) || !set_match((unsigned char)*s, p, ep - 1)) {
                s = NULL;
                break;
            }
            p = ep;
            goto again;
        }
        if (is_digit((unsigned char)p[1])) {
            s = back_reference(ps, s, (unsigned char)p[1]);
            if (s == NULL)
                break;
            p += 2;
            goto again;
        }
        goto item;
    default:
    item: {
        const char *ep = item_end(ps, p);
        charge(ps, ep - p); /* (a set costs its length for each byte it is tried on) */
        int m = s < ps->end && single_match((unsigned char)*s, p, ep);
        switch (*ep) {
        case '?': {
            const char *r;
            if (m && (r = match(ps, s + 1, ep + 1)) != NULL) {
                s = r;
                break;
            }
            p = ep + 1;
            goto again;
        }
        case '*':
            s = max_expand(ps, s, p, ep);
            break;
        case '+':
            s = m ? max_expand(ps, s + 1, p, ep) : NULL;
            break;
        case '-':
            s = min_expand(ps, s, p, ep);
            break;
        default:
            if (!m) {
                s = NULL;
                break;
            }
            s++;
            p = ep;
            goto again;
        }
    }
    }
    ps->depth--;
    return s;
}

/* Pushes capture i (the whole match s .. e when the pattern has none and i is 0). */
static void push_capture(pat_state_t *ps, int i, const char *s, const char *e)
{
    lua_State *L = ps->L;
    if (i >= ps->level) {
        if (i != 0)
            luaL_error(L, "invalid capture index");
        lua_pushlstring(L, s, (size_t)(e - s));
        return;
    }
    ptrdiff_t len = ps->cap[i].len;
    if (len == CAP_OPEN)
        luaL_error(L, "unfinished capture");
    if (len == CAP_POSITION)
        lua_pushinteger(L, ps->cap[i].at - ps->subj + 1);
    else
        lua_pushlstring(L, ps->cap[i].at, (size_t)len);
}

/* Pushes every capture (or the whole match when there is none and s is not NULL); returns how
 * many. */
static int push_captures(pat_state_t *ps, const char *s, const char *e)
{
    int n = ps->level == 0 && s != NULL ? 1 : ps->level;
    luaL_checkstack(ps->L, n, "too many captures");
    for (int i = 0; i < n; i++)
        push_capture(ps, i, s, e);
    return n;
}

/* Argument i as LuaJIT's lj_lib_optint reads it: a number (or numeric string) converted to a
 * 32-bit integer by truncation, INT32_MIN when it does not fit (the x86-64 conversion's answer). */
static int32_t opt_int32(lua_State *L, int i, int32_t dflt)
{
    if (lua_isnoneornil(L, i))
        return dflt;
    lua_Number n = luaL_checknumber(L, i);
    if (n >= -2147483648.0 && n < 2147483648.0)
        return (int32_t)n;
    return INT32_MIN;
}

/* The characters that make a pattern of a string (else string.find searches for it as it is). */
static int has_specials(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != '\0' && strchr("^$*+?.([%-", p[i]) != NULL)
            return 1;
    return 0;
}

static int find_or_match(lua_State *L, int find)
{
    size_t len, plen;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *p = luaL_checklstring(L, 2, &plen);
    int32_t start = opt_int32(L, 3, 1);
    if (start < 0)
        start += (int32_t)len;
    else
        start--;
    if (start < 0)
        start = 0;
    size_t st = (size_t)start > len ? len : (size_t)start;
    if (find && (lua_toboolean(L, 4) || !has_specials(p, plen))) {
        const char *q = memmem(s + st, len - st, p, plen);
        if (q == NULL) {
            lua_pushnil(L);
            return 1;
        }
        lua_pushinteger(L, q - s + 1);
        lua_pushinteger(L, q - s + (ptrdiff_t)plen);
        return 2;
    }
    pat_state_t ps;
    state_init(&ps, L, 1, s, len);
    int anchor = *p == '^';
    if (anchor)
        p++;
    const char *at = s + st;
    do {
        ps.level = ps.depth = 0;
        const char *e = match(&ps, at, p);
        if (e != NULL) {
            if (!find)
                return push_captures(&ps, at, e);
            lua_pushinteger(L, at - s + 1);
            lua_pushinteger(L, e - s);
            return push_captures(&ps, NULL, NULL) + 2;
        }
    } while (at++ < ps.end && !anchor);
    lua_pushnil(L);
    return 1;
}

/* string.find(s, pattern [, init [, plain]]) -> start, end, captures… | nil */
static int l_find(lua_State *L)
{
    return find_or_match(L, 1);
}

/* string.match(s, pattern [, init]) -> captures… (or the whole match) | nil */
static int l_match(lua_State *L)
{
    return find_or_match(L, 0);
}

/* The iterator string.gmatch gives; upvalues: the poll function, the subject, the pattern, the
 * position to go on from. */
static int gmatch_next(lua_State *L)
{
    size_t len;
    const char *s = lua_tolstring(L, lua_upvalueindex(2), &len);
    const char *p = lua_tostring(L, lua_upvalueindex(3));
    size_t pos = (size_t)lua_tointeger(L, lua_upvalueindex(4));
    pat_state_t ps;
    state_init(&ps, L, 1, s, len);
    for (const char *at = s + pos; at <= ps.end; at++) {
        ps.level = ps.depth = 0;
        const char *e = match(&ps, at, p);
        if (e != NULL) {
            lua_pushinteger(L, (e - s) + (e == at)); /* an empty match: go on one further */
            lua_replace(L, lua_upvalueindex(4));
            return push_captures(&ps, at, e);
        }
    }
    return 0;
}

/* string.gmatch(s, pattern) -> iterator of the captures (or whole matches) */
static int l_gmatch(lua_State *L)
{
    luaL_checkstring(L, 1);
    luaL_checkstring(L, 2);
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_pushinteger(L, 0);
    lua_pushcclosure(L, gmatch_next, 4);
    return 1;
}

/* gsub's result so far: its bytes, and when they are next checked against the scripts' heap. */
typedef struct gsub_out {
    size_t bytes, next_check;
} gsub_out_t;

static void take_or_refuse(lua_State *L, double bytes, const char *what);

/* n more bytes of gsub's result: each GSUB_CHECK_BYTES, the pieces so far (and the result they
 * are joined into) are checked against the scripts' heap, and the hooks may run (copying is work). */
static void gsub_grow(pat_state_t *ps, gsub_out_t *o, size_t n)
{
    o->bytes += n;
    if (n >= 16)
        charge(ps, (long)(n / 16));
    if (o->bytes >= o->next_check) {
        take_or_refuse(ps->L, (double)o->bytes, "string.gsub's result");
        o->next_check = o->bytes + GSUB_CHECK_BYTES;
    }
}

/* The replacement string (argument 3) for the match s .. e: %0-%9 are captures, % before any
 * other character is that character. Counts what it adds in o, piece by piece (a replacement of
 * four hundred %0 makes four hundred times the match). */
static void add_replacement_text(pat_state_t *ps, luaL_Buffer *b, const char *s, const char *e, gsub_out_t *o)
{
    size_t n;
    const char *r = lua_tolstring(ps->L, 3, &n);
    for (size_t i = 0; i < n; i++) {
        if (r[i] != PAT_ESC) {
            luaL_addchar(b, r[i]);
            gsub_grow(ps, o, 1);
            continue;
        }
        i++; /* (at n: the string's terminating NUL, added as LuaJIT does) */
        if (!is_digit((unsigned char)r[i])) {
            luaL_addchar(b, r[i]);
            gsub_grow(ps, o, 1);
        } else if (r[i] == '0') {
            gsub_grow(ps, o, (size_t)(e - s)); /* (before the copy: checked, then made) */
            luaL_addlstring(b, s, (size_t)(e - s));
        } else {
            push_capture(ps, r[i] - '1', s, e);
            gsub_grow(ps, o, lua_objlen(ps->L, -1));
            luaL_addvalue(b);
        }
    }
}

/* Adds the replacement of the match s .. e, counted in o. */
static void add_replacement(pat_state_t *ps, luaL_Buffer *b, const char *s, const char *e, gsub_out_t *o)
{
    lua_State *L = ps->L;
    switch (lua_type(L, 3)) {
    case LUA_TFUNCTION: {
        lua_pushvalue(L, 3);
        int n = push_captures(ps, s, e);
        lua_call(L, n, 1);
        break;
    }
    case LUA_TTABLE:
        push_capture(ps, 0, s, e);
        lua_gettable(L, 3);
        break;
    default: /* a string or a number */
        add_replacement_text(ps, b, s, e, o);
        return;
    }
    if (!lua_toboolean(L, -1)) { /* nil or false: the match stays */
        lua_pop(L, 1);
        lua_pushlstring(L, s, (size_t)(e - s));
    } else if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    }
    gsub_grow(ps, o, lua_objlen(L, -1));
    luaL_addvalue(b);
}

/* What a C call of a script makes in one piece, checked against script_memory_limit_mb before it
 * is made (base/heap.h agw_heap_lua_take: only a block of 4 MB or more past the limit is refused):
 * raises "not enough memory: <what> of N MB would take the scripts' heap past
 * script_memory_limit_mb" at the script's line. No hook runs inside one C call, so the stop hook
 * alone let one table.concat take 60 times the limit (an attack review). */
static void take_or_refuse(lua_State *L, double bytes, const char *what)
{
    if (!agw_heap_lua_take(L, agw_heap_lua_of(L), bytes))
        luaL_error(L, "not enough memory: %s of %d MB would take the scripts' heap past script_memory_limit_mb", what,
                   (int)(bytes / 1048576.0));
}

/* Whether the calling thread has less than 256 KB (or a quarter of its stack) of C stack left. A gsub whose replacement
 * function calls gsub again takes about 9 KB of C stack per level (its buffer), and LuaJIT bounds
 * no such nesting: a thread's 8 MB went at about 900 levels, and the process with it. */
static int c_stack_low(void)
{
    static __thread uintptr_t floor; /* the lowest address this thread may reach, with the margin */
    char here;
    if (floor == 0) {
        pthread_attr_t a;
        void *lo;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &a) != 0)
            return 0;
        int ok = pthread_attr_getstack(&a, &lo, &size) == 0;
        pthread_attr_destroy(&a);
        if (!ok)
            return 0;
        floor = (uintptr_t)lo + (size / 4 < 256 * 1024 ? size / 4 : 256 * 1024);
    }
    return (uintptr_t)&here < floor;
}

/* string.gsub(s, pattern, repl [, n]) -> the new string, the number of matches replaced. Error
 * "C stack overflow" when replacement functions nest it past what the thread's stack holds. */
static int l_gsub(lua_State *L)
{
    if (c_stack_low())
        luaL_error(L, "C stack overflow");
    size_t len;
    const char *src = luaL_checklstring(L, 1, &len);
    const char *p = luaL_checkstring(L, 2);
    int t = lua_type(L, 3);
    int max = luaL_optint(L, 4, (int)(len + 1));
    if (!(t == LUA_TNUMBER || t == LUA_TSTRING || t == LUA_TFUNCTION || t == LUA_TTABLE))
        luaL_argerror(L, 3, "string/function/table expected");
    int anchor = *p == '^';
    if (anchor)
        p++;
    pat_state_t ps;
    state_init(&ps, L, 1, src, len);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int n = 0;
    gsub_out_t out = {0, GSUB_CHECK_BYTES};
    while (n < max) {
        ps.level = ps.depth = 0;
        const char *e = match(&ps, src, p);
        if (e != NULL) {
            n++;
            add_replacement(&ps, &b, src, e, &out);
        }
        if (e != NULL && e > src) {
            src = e;
        } else if (src < ps.end) {
            luaL_addchar(&b, *src++);
            gsub_grow(&ps, &out, 1);
        } else {
            break;
        }
        if (anchor)
            break;
    }
    gsub_grow(&ps, &out, (size_t)(ps.end - src));
    luaL_addlstring(&b, src, (size_t)(ps.end - src));
    luaL_pushresult(&b);
    lua_pushinteger(L, n);
    return 2;
}

/* string.rep(s, n [, sep]) -> s repeated n times, sep between (LuaJIT's semantics: n truncated to
 * a 32-bit integer, "" for n < 1, "string length overflow" past 2^31 - 256 bytes). A result of
 * 4 MB or more that would take the VM's heap past script_memory_limit_mb is refused first
 * (base/heap.h agw_heap_lua_take): "not enough memory: …". Made in a userdata, then interned. */
static int l_rep(lua_State *L)
{
    size_t len, seplen = 0;
    const char *s = luaL_checklstring(L, 1, &len);
    luaL_checknumber(L, 2);
    int32_t n = opt_int32(L, 2, 0);
    const char *sep = luaL_optlstring(L, 3, "", &seplen);
    if (n <= 0 || (len == 0 && seplen == 0)) {
        lua_pushliteral(L, "");
        return 1;
    }
    double total = (double)len * n + (double)seplen * (n - 1);
    if (total >= (double)0x7fffff00)
        return luaL_error(L, "string length overflow");
    take_or_refuse(L, total, "string.rep");
    size_t size = (size_t)total;
    char *buf = lua_newuserdata(L, size); /* (the VM's: collected whatever happens next) */
    char *w = buf;
    for (int32_t i = 0; i < n; i++) {
        if (i > 0 && seplen > 0) {
            memcpy(w, sep, seplen);
            w += seplen;
        }
        memcpy(w, s, len);
        w += len;
    }
    lua_pushlstring(L, buf, size);
    return 1;
}

/* Calls LuaJIT's function (at stack index 1, nargs arguments after it) for the wrapper named
 * name, which a script called: its results are left on the stack (returns their count). Its error
 * is raised again as LuaJIT raises it when a script calls the function itself: at the script's
 * line (a function called from C has none), and "bad argument #N to 'name'" (from C: '?'). */
static int call_original(lua_State *L, int nargs, const char *name)
{
    if (lua_pcall(L, nargs, LUA_MULTRET, 0) == 0)
        return lua_gettop(L);
    const char *msg = lua_tostring(L, -1);
    if (msg == NULL || lua_type(L, -1) != LUA_TSTRING)
        return lua_error(L);
    const char *c = msg; /* a message with its place already ("file:12: …": a __tostring's own) */
    while (*c && *c != ':' && *c != ' ')
        c++;
    int placed = *c == ':' && c[1] >= '0' && c[1] <= '9';
    const char *q = strncmp(msg, "bad argument #", 14) == 0 ? strstr(msg, " to '?'") : NULL;
    if (placed && q == NULL)
        return lua_error(L);
    luaL_where(L, 1);
    if (q) {
        lua_pushlstring(L, msg, (size_t)(q - msg));
        lua_pushfstring(L, " to '%s'%s", name, q + 7);
    } else {
        lua_pushstring(L, msg);
        lua_pushliteral(L, "");
    }
    lua_concat(L, 3);
    return lua_error(L);
}

/* string.format(fmt, ...): LuaJIT's (upvalue 1), its result checked against the scripts' heap
 * first when it could be 4 MB or more. The format is read as LuaJIT reads it (flags, a width and a
 * precision of up to two digits, the conversion): its own bytes, 100 for each conversion, and
 * for %s the argument's bytes (at most its precision), for %q four times them (an escape a byte).
 * An argument of %s with a __tostring is given its string first (LuaJIT would call it while it
 * copies, where no hook runs, and the same string gives the same result). */
static int l_format(lua_State *L)
{
    size_t flen;
    const char *f = luaL_checklstring(L, 1, &flen);
    int top = lua_gettop(L), arg = 1;
    double bound = (double)flen;
    for (size_t i = 0; i < flen && arg < top; i++) {
        if (f[i] != '%')
            continue;
        if (++i < flen && f[i] == '%')
            continue;
        while (i < flen && (f[i] == '-' || f[i] == '+' || f[i] == ' ' || f[i] == '#' || f[i] == '0'))
            i++;
        size_t digits = 0;
        for (; i < flen && is_digit((unsigned char)f[i]); i++)
            digits++;
        long prec = -1;
        if (i < flen && f[i] == '.') {
            prec = 0;
            size_t pdigits = 0;
            for (i++; i < flen && is_digit((unsigned char)f[i]); i++, pdigits++)
                if (pdigits < 2)
                    prec = prec * 10 + (f[i] - '0');
            digits = pdigits > digits ? pdigits : digits;
        }
        /* what LuaJIT refuses (a width or precision of three digits, another letter, the end)
         * ends the reading: it raises its error before it reaches the arguments after it */
        if (i >= flen || digits > 2 || strchr("diouxXaAeEfFgGcsqp", f[i]) == NULL || f[i] == '\0')
            break;
        arg++;
        bound += 100;
        int t = lua_type(L, arg);
        if (f[i] == 's') {
            if (t != LUA_TSTRING && t != LUA_TNUMBER && luaL_callmeta(L, arg, "__tostring")) {
                int rt = lua_type(L, -1);
                if (rt == LUA_TNIL)
                    lua_pushliteral(L, "nil");
                else if (rt == LUA_TBOOLEAN)
                    lua_pushstring(L, lua_toboolean(L, -1) ? "true" : "false");
                else if (rt != LUA_TSTRING && rt != LUA_TNUMBER)
                    lua_pushfstring(L, "%s: %p", luaL_typename(L, -1), lua_topointer(L, -1));
                else
                    lua_pushvalue(L, -1);
                lua_remove(L, -2);
                lua_replace(L, arg); /* (LuaJIT calls __tostring once, and not that of its result) */
            }
            if (lua_type(L, arg) == LUA_TSTRING) {
                size_t n = lua_objlen(L, arg);
                bound += (double)(prec >= 0 && (size_t)prec < n ? (size_t)prec : n);
            }
        } else if (f[i] == 'q' && t == LUA_TSTRING) {
            bound += 4.0 * (double)lua_objlen(L, arg);
        }
    }
    if (bound >= (double)AGW_LUA_HUGE_BLOCK)
        take_or_refuse(L, bound, "string.format's result");
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    return call_original(L, top, "format");
}

/* table.concat(t [, sep [, i [, j]]]): LuaJIT's (upvalue 1), its result checked against the
 * scripts' heap first: the pieces' bytes (a number's: 32 at most) and the separators'. The count
 * stops at the first piece that is neither (LuaJIT's own call then raises its error for it). */
static int l_concat(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t seplen = 0;
    luaL_optlstring(L, 2, "", &seplen);
    lua_Integer i = luaL_optinteger(L, 3, 1);
    lua_Integer j = lua_isnoneornil(L, 4) ? (lua_Integer)lua_objlen(L, 1) : luaL_checkinteger(L, 4);
    double bound = 0;
    for (lua_Integer k = i; k <= j; k++) {
        lua_rawgeti(L, 1, (int)k);
        int t = lua_type(L, -1);
        bound += t == LUA_TSTRING ? (double)lua_objlen(L, -1) : 32.0;
        lua_pop(L, 1);
        if (t != LUA_TSTRING && t != LUA_TNUMBER)
            break;
        if (k > i)
            bound += (double)seplen;
    }
    if (bound >= (double)AGW_LUA_HUGE_BLOCK)
        take_or_refuse(L, bound, "table.concat's result");
    int top = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    return call_original(L, top, "concat");
}

/* The poll function: straight-line code (about 100 instructions, so that a hook that counts
 * instructions, as the load budget's does, comes round within a few hundred polls), never
 * compiled (compiled code runs no hook). */
static void push_poll_function(lua_State *L)
{
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "local n = 0");
    for (int i = 0; i < 100; i++)
        luaL_addstring(&b, " n = n + 1");
    luaL_pushresult(&b);
    size_t n;
    const char *src = lua_tolstring(L, -1, &n);
    if (luaL_loadbuffer(L, src, n, POLL_CHUNK) != 0)
        lua_error(L);
    lua_remove(L, -2);
    luaJIT_setmode(L, -1, LUAJIT_MODE_FUNC | LUAJIT_MODE_OFF);
}

int agw_pattern_open(lua_State *L)
{
    static const luaL_Reg fns[] = {{"find", l_find}, {"match", l_match}, {"gmatch", l_gmatch},
                                   {"gsub", l_gsub}, {"rep", l_rep}, {NULL, NULL}};
    lua_createtable(L, 0, 4);
    push_poll_function(L);
    for (const luaL_Reg *f = fns; f->name != NULL; f++) {
        lua_pushvalue(L, -1);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -3, f->name);
    }
    lua_pop(L, 1);
    /* format and table_concat: LuaJIT's, checked first (the sandbox gives scripts these) */
    lua_getglobal(L, "string");
    lua_getfield(L, -1, "format");
    lua_remove(L, -2);
    lua_pushcclosure(L, l_format, 1);
    lua_setfield(L, -2, "format");
    lua_getglobal(L, "table");
    lua_getfield(L, -1, "concat");
    lua_remove(L, -2);
    lua_pushcclosure(L, l_concat, 1);
    lua_setfield(L, -2, "table_concat");
    return 1;
}
