/* json/push.c: validated JSON text -> Lua values in one pass, without an intermediate tree.
 *
 * Only text that agw_json_validate accepted comes here (a raw ref's), so the grammar, UTF-8,
 * integer range and depth are known to be right and this code does not check them again; it only
 * stops at the terminating NUL, so text that broke that contract gives a partial value, never a
 * read past the end or a loop. The
 * values are the same as agw_json_push gives for the jansson tree of the same text: objects with
 * their key order remembered, arrays with the array metatable, null as agg.null, integers beyond
 * 2^53 as int64 boxes. jansson stays the reference: test_json checks that both agree.
 *
 * Measured on the benchmark's product body (150 bytes): ~4,000 instructions here against ~21,000
 * for jansson's parse, the tree walk and the frees.
 *
 * Objects of the same shape (the same keys in the same order: every product an upstream sends)
 * share one key-order list: a VM keeps the lists of the last shapes it met (shape_list), so an
 * object costs its table and its entry in the order side table, not a list of its own. The lists
 * are never handed to scripts and nothing changes them (json.setorder copies a list it is given,
 * the encoder only reads them), so sharing one is safe.
 */
#include <lauxlib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json/json_internal.h"

#define EXACT_INT_MAX 9007199254740992LL /* 2^53 */

/* Shapes a VM remembers (direct-mapped by hash), and the key bytes one may hold: each key as a
 * length byte and its bytes. An object whose keys take more is given a list of its own. */
#define SHAPES 64
#define SHAPE_KEY_BYTES 248

typedef struct {
    uint32_t hash;
    uint16_t nkeys, bytes; /* nkeys 0: the slot is empty */
    char keys[SHAPE_KEY_BYTES];
} shape_t;

/* A VM's shapes: a full userdata in the registry (under &shapes_key), its environment table
 * holding the list of shape i at [i + 1]. Made on the first push in a VM, gone with the VM. */
typedef struct {
    shape_t slot[SHAPES];
} shapes_t;
static const char shapes_key;

/* Where a member's key was in the text: the bytes between its quotes, as parsed. */
typedef struct {
    const char *s;
    size_t len;
} key_at_t;

typedef struct {
    lua_State *L;
    const char *p;
    const char *end;  /* the text's NUL: no read goes past it */
    int order;        /* absolute index of the order side table */
    int array;        /* absolute index of the array metatable */
    int lists;        /* absolute index of the shapes' list table */
    shapes_t *shapes; /* this VM's shapes */
    agw_buf_t *sbuf;  /* scratch for strings with escapes */
    key_at_t last;    /* the last string's bytes in the text; s is NULL when it had escapes */
} tp_t;

static void tp_value(tp_t *t);

static inline void skip_ws(tp_t *t)
{
    while (*t->p == ' ' || *t->p == '\t' || *t->p == '\n' || *t->p == '\r')
        t->p++;
}

static unsigned hex4(const char *s)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static void put_utf8(agw_buf_t *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)), u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    agw_buf_append(b, u, n);
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The first '"', '\\' or NUL at or after q (the text's NUL at end stops it). Eight bytes at a time
 * while eight are left before end (SWAR: a byte equal to c makes a zero byte of x ^ c * ONES, and
 * the lowest set high bit of (v - ONES) & ~v & HIGHS marks the first zero byte exactly), then
 * byte by byte (tp_string, self: 1,305 -> 839 instructions a bench page, tools/bench/callgrind). */
static inline const char *string_stop(const char *q, const char *end)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (end - q >= 8) {
        uint64_t x, a, b;
        memcpy(&x, q, 8);
        a = x ^ (ONES * '"');
        b = x ^ (ONES * '\\');
        uint64_t m = (((a - ONES) & ~a) | ((b - ONES) & ~b) | ((x - ONES) & ~x)) & HIGHS;
        if (m)
            return q + (__builtin_ctzll(m) >> 3);
        q += 8;
    }
#else
    (void)end;
#endif
    while (*q != '"' && *q != '\\' && *q)
        q++;
    return q;
}

/* Pushes the string starting at the opening quote; leaves p after the closing quote. */
static void tp_string(tp_t *t)
{
    const char *s = ++t->p, *q = string_stop(s, t->end);
    if (*q != '\\') { /* the common case: no escapes */
        lua_pushlstring(t->L, s, (size_t)(q - s));
        t->last.s = s, t->last.len = (size_t)(q - s);
        t->p = *q ? q + 1 : q;
        return;
    }
    t->last.s = NULL;
    agw_buf_t *b = t->sbuf;
    agw_buf_reset(b);
    agw_buf_append(b, s, (size_t)(q - s));
    while (*q != '"' && *q) {
        if (*q != '\\') {
            const char *r = string_stop(q, t->end);
            agw_buf_append(b, q, (size_t)(r - q));
            q = r;
            continue;
        }
        char c = q[1];
        if (c == '\0')
            break;
        q += 2;
        switch (c) {
        case 'b': agw_buf_putc(b, '\b'); break;
        case 'f': agw_buf_putc(b, '\f'); break;
        case 'n': agw_buf_putc(b, '\n'); break;
        case 'r': agw_buf_putc(b, '\r'); break;
        case 't': agw_buf_putc(b, '\t'); break;
        case 'u': {
            unsigned cp = hex4(q);
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* validated: a low surrogate escape follows */
                unsigned lo = hex4(q + 2);
                q += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(b, cp);
            break;
        }
        default: agw_buf_putc(b, c); break; /* " \ / */
        }
    }
    lua_pushlstring(t->L, b->base, b->len);
    t->p = *q ? q + 1 : q;
}

static void tp_number(tp_t *t)
{
    const char *s = t->p, *q = s;
    int real = 0;
    if (*q == '-')
        q++;
    while ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-') {
        if (*q == '.' || *q == 'e' || *q == 'E')
            real = 1;
        q++;
    }
    if (!real) {
        int neg = *s == '-';
        uint64_t v = 0;
        for (const char *d = s + neg; d < q; d++)
            v = v * 10 + (uint64_t)(*d - '0');
        /* validated: fits in int64 (9223372036854775808 only when negative) */
        int64_t n = neg ? (int64_t)(0 - v) : (int64_t)v;
        if (n >= -EXACT_INT_MAX && n <= EXACT_INT_MAX)
            lua_pushnumber(t->L, (lua_Number)n);
        else
            agw_json_push_int64(t->L, n);
    } else {
        lua_pushnumber(t->L, strtod(s, NULL));
    }
    t->p = q;
}

/* Sets member key (at stack index key, its value at key + 1) of the table at tb, and appends the
 * key to the order list at ord (whose length is *n) unless tb has it already: a repeated key
 * keeps its first place and its last value, as in jansson. */
static void set_member(lua_State *L, int tb, int ord, int *n, int key)
{
    lua_pushvalue(L, key);
    lua_rawget(L, tb);
    int seen = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (!seen) {
        lua_pushvalue(L, key);
        lua_rawseti(L, ord, ++*n);
    }
    lua_pushvalue(L, key);
    lua_pushvalue(L, key + 1);
    lua_rawset(L, tb);
}

/* Pushes a new key-order list of the n keys at stack index first, first + 2, … */
static void push_key_list(lua_State *L, int n, int first)
{
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushvalue(L, first + 2 * i);
        lua_rawseti(L, -2, i + 1);
    }
}

/* Pushes the key-order list for the n keys (at stack index first, first + 2, …; their bytes in
 * the text at keys) from the VM's shapes, making it and remembering it when the shape is new
 * there. Returns 0, pushing nothing, when the keys take more bytes than a shape holds. */
static int shape_list(tp_t *t, const key_at_t *keys, int n, int first)
{
    lua_State *L = t->L;
    uint32_t h = 2166136261u; /* FNV-1a over each key's length byte and bytes */
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (keys[i].len > 255 || (bytes += 1 + keys[i].len) > SHAPE_KEY_BYTES)
            return 0;
        h = (h ^ (uint32_t)keys[i].len) * 16777619u;
        for (size_t j = 0; j < keys[i].len; j++)
            h = (h ^ (unsigned char)keys[i].s[j]) * 16777619u;
    }
    unsigned at = (h ^ h >> 16) % SHAPES;
    shape_t *sh = &t->shapes->slot[at];
    if (sh->hash == h && sh->nkeys == n && sh->bytes == bytes) {
        const char *k = sh->keys;
        int i = 0;
        while (i < n && (unsigned char)k[0] == keys[i].len && memcmp(k + 1, keys[i].s, keys[i].len) == 0)
            k += 1 + keys[i++].len;
        if (i == n) {
            lua_rawgeti(L, t->lists, (int)at + 1);
            return 1;
        }
    }
    push_key_list(L, n, first);
    char *k = sh->keys;
    for (int i = 0; i < n; i++) {
        *k++ = (char)keys[i].len;
        memcpy(k, keys[i].s, keys[i].len);
        k += keys[i].len;
    }
    sh->hash = h, sh->nkeys = (uint16_t)n, sh->bytes = (uint16_t)bytes;
    lua_pushvalue(L, -1);
    lua_rawseti(L, t->lists, (int)at + 1);
    return 1;
}

/* Members parsed onto the stack before the object's table is made at their count (a Lua table
 * that grows is rehashed: that was a rehash for every object of more than four members). An
 * object with more goes on into the table made for the first OBJECT_PENDING_MAX. */
#define OBJECT_PENDING_MAX 32

static void tp_object(tp_t *t)
{
    lua_State *L = t->L;
    t->p++;
    skip_ws(t);
    if (*t->p == '}') {
        t->p++;
        lua_createtable(L, 0, 0);
        return; /* nothing to remember; an empty object encodes as {} anyway */
    }
    int base = lua_gettop(L), pending = 0, more = 0;
    key_at_t keys[OBJECT_PENDING_MAX];
    int plain = 1; /* every key is known by its bytes (none had escapes) */
    for (;;) { /* key, value, key, value, … above base */
        skip_ws(t);
        if (*t->p != '"')
            break;
        luaL_checkstack(L, 4, "JSON push");
        tp_string(t);
        keys[pending] = t->last;
        plain &= t->last.s != NULL;
        skip_ws(t);
        t->p++; /* ':' */
        skip_ws(t);
        tp_value(t);
        pending++;
        skip_ws(t);
        if (*t->p == '\0' || *t->p++ == '}')
            break; /* else ',' */
        if (pending == OBJECT_PENDING_MAX) {
            more = 1;
            break;
        }
    }
    /* a repeated key (JSON allows one) takes the general way below */
    int unique = plain && !more;
    for (int i = 1; unique && i < pending; i++)
        for (int j = 0; j < i; j++)
            if (keys[i].len == keys[j].len && memcmp(keys[i].s, keys[j].s, keys[i].len) == 0) {
                unique = 0;
                break;
            }
    lua_createtable(L, 0, pending);
    int tb = base + 2 * pending + 1;
    if (unique) {
        for (int i = 0; i < pending; i++) {
            lua_pushvalue(L, base + 1 + 2 * i);
            lua_pushvalue(L, base + 2 + 2 * i);
            lua_rawset(L, tb);
        }
        if (!shape_list(t, keys, pending, base + 1))
            push_key_list(L, pending, base + 1); /* a list of its own */
        goto remember;
    }
    lua_createtable(L, pending, 0); /* the key order */
    int ord = tb + 1, n = 0;
    for (int i = 0; i < pending; i++)
        set_member(L, tb, ord, &n, base + 1 + 2 * i);
    while (more) { /* members beyond the first OBJECT_PENDING_MAX, one at a time */
        skip_ws(t);
        if (*t->p != '"')
            break;
        tp_string(t);
        skip_ws(t);
        t->p++; /* ':' */
        skip_ws(t);
        tp_value(t);
        set_member(L, tb, ord, &n, lua_gettop(L) - 1);
        lua_pop(L, 2);
        skip_ws(t);
        if (*t->p == '\0' || *t->p++ == '}')
            break; /* else ',' */
    }
remember:
    lua_pushvalue(L, tb); /* order[tbl] = keys (the list is at tb + 1) */
    lua_pushvalue(L, tb + 1);
    lua_rawset(L, t->order);
    lua_pop(L, 1);
    lua_replace(L, base + 1); /* the table where the first key was; the members go */
    lua_settop(L, base + 1);
}

static void tp_array(tp_t *t)
{
    lua_State *L = t->L;
    t->p++;
    skip_ws(t);
    lua_createtable(L, 4, 0);
    if (*t->p == ']') {
        t->p++;
    } else {
        int i = 0;
        for (;;) {
            skip_ws(t);
            tp_value(t);
            lua_rawseti(L, -2, ++i);
            skip_ws(t);
            if (*t->p == '\0' || *t->p++ == ']')
                break;
        }
    }
    lua_pushvalue(L, t->array);
    lua_setmetatable(L, -2);
}

static void tp_value(tp_t *t)
{
    luaL_checkstack(t->L, 6, "JSON nested too deeply");
    switch (*t->p) {
    case '{': tp_object(t); break;
    case '[': tp_array(t); break;
    case '"': tp_string(t); break;
    case 't':
    case 'f':
    case 'n':
        if (*t->p == 'n')
            lua_pushlightuserdata(t->L, NULL);
        else
            lua_pushboolean(t->L, *t->p == 't');
        while (*t->p >= 'a' && *t->p <= 'z')
            t->p++;
        break;
    case '\0': lua_pushlightuserdata(t->L, NULL); break;
    default: tp_number(t); break;
    }
}

/* Pushes this VM's shapes and their list table (made on the first call in the VM). */
static shapes_t *push_shapes(lua_State *L)
{
    lua_pushlightuserdata(L, (void *)&shapes_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        shapes_t *sh = lua_newuserdata(L, sizeof(*sh));
        memset(sh, 0, sizeof(*sh));
        lua_createtable(L, SHAPES, 0);
        lua_setfenv(L, -2);
        lua_pushlightuserdata(L, (void *)&shapes_key);
        lua_pushvalue(L, -2);
        lua_rawset(L, LUA_REGISTRYINDEX);
    }
    shapes_t *sh = lua_touserdata(L, -1);
    lua_getfenv(L, -1);
    return sh;
}

void agw_json_push_text(lua_State *L, const char *text, size_t len)
{
    static __thread agw_buf_t sbuf = AGW_BUF_INIT; /* one per worker thread, kept for reuse */
    luaL_checkstack(L, 10, "JSON push");
    int top = lua_gettop(L);
    agw_json_regget(L, AGW_JSON_K_ORDER);
    agw_json_regget(L, AGW_JSON_K_ARRAY);
    shapes_t *shapes = push_shapes(L);
    tp_t t = {L, text, text + len, top + 1, top + 2, top + 4, shapes, &sbuf, {NULL, 0}};
    skip_ws(&t);
    tp_value(&t);
    lua_replace(L, top + 1); /* move the value down over the four helper slots */
    lua_settop(L, top + 1);
}
