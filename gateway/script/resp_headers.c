/* resp_headers.c: the rules a script's response headers pass (resp_headers.h). */
#include "script/resp_headers.h"

#include "base/header.h"

#include <lauxlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Writes into out (size outsz) a printable copy of the first bytes of s for a log line: control
 * characters and non-ASCII bytes as \xNN, so that no header name can split or forge a log line. */
static const char *printable(const char *s, size_t n, char *out, size_t outsz)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < outsz; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'')
            o += (size_t)snprintf(out + o, outsz - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o] = '\0';
    return out;
}

static void warnf(agw_resp_headers_warn_cb warn, void *data, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void warnf(agw_resp_headers_warn_cb warn, void *data, const char *fmt, ...)
{
    if (warn == NULL)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    warn(data, msg);
}

/* The headers a script may not set. Framing and hop-by-hop headers belong to the gateway (RFC 9110
 * §7.6.1; forbidden in HTTP/2). With their lengths: most names are compared by length only. */
static const struct {
    const char *name;
    size_t len;
} owned[] = {{"content-length", 14}, {"transfer-encoding", 17}, {"connection", 10}, {"keep-alive", 10},
             {"upgrade", 7},         {"proxy-connection", 16},  {"te", 2},          {"trailer", 7},
             {NULL, 0}};

/* A header read from the table, before spellings of one name are settled: offsets into the set's
 * bytes (which may move while the table is read). */
typedef struct candidate {
    size_t orig, name, value; /* the name as the script spelt it, lowercased, the value */
    size_t name_len, value_len;
} candidate_t;

/* Checks one entry and appends it to set->bytes as a candidate; returns 0 when it was dropped. */
static int take(agw_resp_headers_t *set, candidate_t *c, const char *name, size_t nl, const char *value, size_t vl,
                agw_resp_headers_warn_cb warn, void *data)
{
    char lower[AGW_RESP_HEADER_NAME_MAX], shown[80];
    while (vl > 0 && (value[0] == ' ' || value[0] == '\t'))
        value++, vl--;
    while (vl > 0 && (value[vl - 1] == ' ' || value[vl - 1] == '\t'))
        vl--;
    if (vl > AGW_RESP_HEADER_VALUE_MAX) {
        warnf(warn, data, "dropped response header '%s': its value is longer than %d bytes",
              printable(name, nl, shown, sizeof(shown)), AGW_RESP_HEADER_VALUE_MAX);
        return 0;
    }
    if (nl > sizeof(lower) || agw_header_has_control(value, vl) || !agw_header_token_lower(name, nl, lower)) {
        warnf(warn, data, "dropped invalid response header '%s' (a name must be a token, a value must have no "
              "control characters)", printable(name, nl, shown, sizeof(shown)));
        return 0;
    }
    for (size_t o = 0; owned[o].name; o++) {
        if (owned[o].len == nl && memcmp(owned[o].name, lower, nl) == 0) {
            warnf(warn, data, "dropped response header '%s' set by a script: the gateway frames responses",
                  owned[o].name);
            return 0;
        }
    }
    if (nl == 4 && memcmp(lower, "date", 4) == 0) {
        warnf(warn, data, "dropped response header 'date' set by a script: the gateway's HTTP server (h2o 2.2.5) "
              "writes its own Date on every response and cannot leave it out");
        return 0;
    }
    agw_buf_t *b = &set->bytes; /* the three parts in one reservation */
    agw_buf_reserve(b, 2 * nl + vl);
    char *at = b->base + b->len;
    c->orig = b->len, c->name = b->len + nl, c->value = b->len + 2 * nl;
    memcpy(at, name, nl);
    memcpy(at + nl, lower, nl);
    if (vl > 0)
        memcpy(at + 2 * nl, value, vl);
    b->len += 2 * nl + vl;
    b->base[b->len] = '\0';
    c->name_len = nl, c->value_len = vl;
    return 1;
}

/* Orders candidates by lowercased name, then by spelling (bytewise): the first of a name wins. */
static int before(const char *base, const candidate_t *a, const candidate_t *b)
{
    if (a->name_len != b->name_len) {
        size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
        int d = memcmp(base + a->name, base + b->name, n);
        return d != 0 ? d < 0 : a->name_len < b->name_len;
    }
    int d = memcmp(base + a->name, base + b->name, a->name_len);
    if (d != 0)
        return d < 0;
    return memcmp(base + a->orig, base + b->orig, a->name_len) < 0;
}

/* Counts one more field; 1 while the count is within AGW_RESP_HEADERS_MAX, else 0 (warning once,
 * at the first field over it). */
static int within_cap(size_t *count, agw_resp_headers_warn_cb warn, void *data)
{
    if (++*count <= AGW_RESP_HEADERS_MAX)
        return 1;
    if (*count == AGW_RESP_HEADERS_MAX + 1)
        warnf(warn, data, "a script gave more than %d response headers; the rest are dropped", AGW_RESP_HEADERS_MAX);
    return 0;
}

/* Whether a name is one the rules drop or change: not a lowercase token, owned, or date. */
static int not_as_given(const char *name, size_t nl)
{
    char lower[AGW_RESP_HEADER_NAME_MAX];
    if (nl > sizeof(lower) || !agw_header_token_lower(name, nl, lower) || memcmp(lower, name, nl) != 0)
        return 1;
    for (size_t o = 0; owned[o].name; o++)
        if (owned[o].len == nl && memcmp(owned[o].name, name, nl) == 0)
            return 1;
    return nl == 4 && memcmp(name, "date", 4) == 0;
}

int agw_resp_known_init(agw_resp_known_t *known, lua_State *L, const char *const *names)
{
    known->n = 0;
    known->ref = LUA_NOREF;
    size_t n = 0;
    for (; names[n]; n++) {
        size_t len = strlen(names[n]);
        if (n == AGW_RESP_KNOWN_MAX || not_as_given(names[n], len) ||
            (n > 0 && strcmp(names[n - 1], names[n]) >= 0))
            return -1;
    }
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        known->name[i] = lua_tolstring(L, -1, &known->len[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    known->ref = luaL_ref(L, LUA_REGISTRYINDEX);
    known->n = n;
    return 0;
}

/* agw_resp_headers_read's lane for a table of known names only (agw_resp_known_t): fills set and
 * returns 1, or returns 0 (set untouched, the stack as it was) at the first entry that is not
 * one, for the rules to read the table again. */
static int read_known(agw_resp_headers_t *set, lua_State *L, int idx, const agw_resp_known_t *known)
{
    const char *value[AGW_RESP_KNOWN_MAX];
    size_t vlen[AGW_RESP_KNOWN_MAX];
    unsigned seen = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING) {
            lua_pop(L, 2);
            return 0;
        }
        const char *name = lua_tolstring(L, -2, NULL); /* (a string key: not converted) */
        size_t i = 0;
        while (i < known->n && known->name[i] != name)
            i++;
        size_t vl;
        const char *v = lua_tolstring(L, -1, &vl);
        /* (what take would trim, drop or warn about goes to the rules) */
        if (i == known->n || vl == 0 || vl > AGW_RESP_HEADER_VALUE_MAX || v[0] == ' ' || v[0] == '\t' ||
            v[vl - 1] == ' ' || v[vl - 1] == '\t' || agw_header_has_control(v, vl)) {
            lua_pop(L, 2);
            return 0;
        }
        value[i] = v, vlen[i] = vl; /* (the table holds the string until the caller is done) */
        seen |= 1u << i;
        lua_pop(L, 1);
    }
    /* sorted by name as the rules sort them: the known names are in that order, one entry each */
    size_t bytes = 0;
    for (size_t i = 0; i < known->n; i++)
        if (seen & (1u << i))
            bytes += known->len[i] + vlen[i];
    agw_buf_t *b = &set->bytes;
    agw_buf_reserve(b, bytes);
    size_t at[AGW_RESP_KNOWN_MAX];
    for (size_t i = 0; i < known->n; i++) {
        if (!(seen & (1u << i)))
            continue;
        at[i] = b->len;
        memcpy(b->base + b->len, known->name[i], known->len[i]);
        memcpy(b->base + b->len + known->len[i], value[i], vlen[i]);
        b->len += known->len[i] + vlen[i];
    }
    b->base[b->len] = '\0';
    for (size_t i = 0; i < known->n; i++) { /* (pointers once the bytes have stopped moving) */
        if (!(seen & (1u << i)))
            continue;
        agw_resp_header_t *h = &set->h[set->n++];
        h->name = b->base + at[i], h->name_len = known->len[i];
        h->value = b->base + at[i] + known->len[i], h->value_len = vlen[i];
    }
    return 1;
}

void agw_resp_headers_read(agw_resp_headers_t *set, lua_State *L, int idx, const agw_resp_known_t *known,
                           agw_resp_headers_warn_cb warn, void *data)
{
    candidate_t cand[AGW_RESP_HEADERS_MAX + 1];
    size_t nc = 0, count = 0;
    int extra_cc = 0; /* the one cache-control taken past the cap (see resp_headers.h) */
    if (idx < 0)
        idx = lua_gettop(L) + idx + 1;
    set->n = 0;
    agw_buf_reset(&set->bytes);
    if (known && known->n > 0 && read_known(set, L, idx, known))
        return;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        size_t nl = 0, vl = 0;
        int vt = lua_type(L, -1);
        /* (the key is tested by type, never converted: lua_next needs it as it is) */
        const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &nl) : NULL;
        const char *value = vt == LUA_TSTRING || vt == LUA_TNUMBER ? lua_tolstring(L, -1, &vl) : NULL;
        if (name != NULL && vt == LUA_TTABLE) {
            /* a list of values: one field each, in the list's order (Set-Cookie, RFC 6265 §3) */
            size_t len = lua_objlen(L, -1);
            char shown[80];
            if (len == 0)
                warnf(warn, data, "dropped response header '%s': its value is an empty list",
                      printable(name, nl, shown, sizeof(shown)));
            for (size_t i = 1; i <= len; i++) {
                lua_rawgeti(L, -1, (int)i);
                int et = lua_type(L, -1);
                if (et != LUA_TSTRING && et != LUA_TNUMBER) {
                    warnf(warn, data, "dropped value %zu of response header '%s': it is a %s (a value must be a "
                          "string or a number)", i, printable(name, nl, shown, sizeof(shown)), lua_typename(L, et));
                } else if (!within_cap(&count, warn, data)) {
                    lua_pop(L, 1);
                    break;
                } else {
                    const char *v = lua_tolstring(L, -1, &vl); /* a copy on the stack: converting it is safe */
                    nc += (size_t)take(set, &cand[nc], name, nl, v, vl, warn, data);
                }
                lua_pop(L, 1);
            }
        } else if (name == NULL || value == NULL) {
            char shown[80];
            if (name)
                warnf(warn, data, "dropped response header '%s': its value is a %s (a value must be a string or a "
                      "number)", printable(name, nl, shown, sizeof(shown)), lua_typename(L, vt));
            else
                warnf(warn, data, "dropped a response header whose name is a %s (a name must be a string)",
                      lua_typename(L, lua_type(L, -2)));
        } else if (count >= AGW_RESP_HEADERS_MAX && !extra_cc && nl == 13 && strncasecmp(name, "cache-control", 13) == 0) {
            extra_cc = 1;
            nc += (size_t)take(set, &cand[nc], name, nl, value, vl, warn, data);
        } else if (within_cap(&count, warn, data)) {
            nc += (size_t)take(set, &cand[nc], name, nl, value, vl, warn, data);
        }
        lua_pop(L, 1);
    }
    const char *base = set->bytes.base;
    for (size_t i = 1; i < nc; i++) { /* insertion sort: a response has a few headers */
        candidate_t c = cand[i];
        size_t j = i;
        for (; j > 0 && before(base, &c, &cand[j - 1]); j--)
            cand[j] = cand[j - 1];
        cand[j] = c;
    }
    char shown[80], kept[80];
    for (size_t i = 0, first = 0; i < nc; i++) {
        const candidate_t *c = &cand[i];
        const candidate_t *f = &cand[first];
        /* another value of the same list keeps the same spelling (a table has each key once) */
        if (i > 0 && c->name_len == f->name_len && memcmp(base + c->name, base + f->name, c->name_len) == 0 &&
            memcmp(base + c->orig, base + f->orig, c->name_len) != 0) {
            warnf(warn, data, "dropped response header '%s': the script also set '%s', whose value is kept (names "
                  "are case-insensitive: of several spellings, the one that sorts first bytewise wins)",
                  printable(base + c->orig, c->name_len, shown, sizeof(shown)),
                  printable(base + f->orig, f->name_len, kept, sizeof(kept)));
            continue;
        }
        first = i;
        agw_resp_header_t *h = &set->h[set->n++];
        h->name = base + c->name, h->name_len = c->name_len;
        h->value = base + c->value, h->value_len = c->value_len;
    }
}

const agw_resp_header_t *agw_resp_headers_find(const agw_resp_headers_t *set, const char *name, size_t len)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->h[i].name_len == len && memcmp(set->h[i].name, name, len) == 0)
            return &set->h[i];
    return NULL;
}

void agw_resp_headers_free(agw_resp_headers_t *set)
{
    agw_buf_free(&set->bytes);
    set->n = 0;
}

/* ---- the "agg.resp_headers" module ---------------------------------------------------------- */

/* Collects warnings into the table at index 2 of L (l_apply's warnings list). */
static void on_warning(void *data, const char *msg)
{
    lua_State *L = data;
    lua_pushstring(L, msg);
    lua_rawseti(L, 2, (int)lua_objlen(L, 2) + 1);
}

/* apply(headers | nil) -> table (lowercased name -> value), list of warnings */
static int l_apply(lua_State *L)
{
    if (!lua_isnoneornil(L, 1))
        luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    lua_newtable(L); /* 2: warnings */
    agw_resp_headers_t set = AGW_RESP_HEADERS_INIT;
    if (lua_istable(L, 1))
        agw_resp_headers_read(&set, L, 1, NULL, on_warning, L);
    lua_createtable(L, 0, (int)set.n);
    for (size_t i = 0; i < set.n;) {
        size_t j = i + 1; /* set.h[i .. j-1]: the fields of one name (several when its value was a list) */
        while (j < set.n && set.h[j].name_len == set.h[i].name_len &&
               memcmp(set.h[j].name, set.h[i].name, set.h[i].name_len) == 0)
            j++;
        lua_pushlstring(L, set.h[i].name, set.h[i].name_len);
        if (j - i == 1) {
            lua_pushlstring(L, set.h[i].value, set.h[i].value_len);
        } else {
            lua_createtable(L, (int)(j - i), 0);
            for (size_t k = i; k < j; k++) {
                lua_pushlstring(L, set.h[k].value, set.h[k].value_len);
                lua_rawseti(L, -2, (int)(k - i + 1));
            }
        }
        lua_rawset(L, -3);
        i = j;
    }
    agw_resp_headers_free(&set);
    lua_insert(L, 2);
    return 2;
}

int agw_resp_headers_open(lua_State *L)
{
    static const luaL_Reg fns[] = {{"apply", l_apply}, {NULL, NULL}};
    luaL_newlib(L, fns);
    return 1;
}
