/* route_param.c: route parameter rules and patterns (see route_param.h). */
#include "route/route_param.h"

#include "base/dotseg.h"
#include "base/hex.h"
#include "base/mem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"

/* What a byte may be in a parameter, as it is read raw: U an unreserved character (RFC 3986 §2.3),
 * P another §3.3 pchar (the sub-delims but ';', ':' and '@'), 0 any other byte: '%' (read on its
 * own, as %XX), ';' (a path parameter, which servlet containers strip) and what is no path
 * character. One load per byte, the common path's only cost. */
enum { P = 1, U = 2 };
static const unsigned char PARAM_CHAR[256] = {
    ['A'] = U, ['B'] = U, ['C'] = U, ['D'] = U, ['E'] = U, ['F'] = U, ['G'] = U, ['H'] = U, ['I'] = U,
    ['J'] = U, ['K'] = U, ['L'] = U, ['M'] = U, ['N'] = U, ['O'] = U, ['P'] = U, ['Q'] = U, ['R'] = U,
    ['S'] = U, ['T'] = U, ['U'] = U, ['V'] = U, ['W'] = U, ['X'] = U, ['Y'] = U, ['Z'] = U, ['a'] = U,
    ['b'] = U, ['c'] = U, ['d'] = U, ['e'] = U, ['f'] = U, ['g'] = U, ['h'] = U, ['i'] = U, ['j'] = U,
    ['k'] = U, ['l'] = U, ['m'] = U, ['n'] = U, ['o'] = U, ['p'] = U, ['q'] = U, ['r'] = U, ['s'] = U,
    ['t'] = U, ['u'] = U, ['v'] = U, ['w'] = U, ['x'] = U, ['y'] = U, ['z'] = U, ['0'] = U, ['1'] = U,
    ['2'] = U, ['3'] = U, ['4'] = U, ['5'] = U, ['6'] = U, ['7'] = U, ['8'] = U, ['9'] = U, ['-'] = U,
    ['.'] = U, ['_'] = U, ['~'] = U, ['!'] = P, ['$'] = P, ['&'] = P, ['\''] = P, ['('] = P, [')'] = P,
    ['*'] = P, ['+'] = P, [','] = P, ['='] = P, [':'] = P, ['@'] = P,
};

int agw_route_param_valid(const char *value, size_t len)
{
    const unsigned char *s = (const unsigned char *)value;
    if (agw_dot_segment(value, len))
        return 0; /* "/users/" .. id .. "/orders" must not walk up the upstream's paths */
    /* the decoded bytes of a run of %XX escapes, checked as UTF-8 once the run ends: a character
     * is one run (a literal character between its bytes would break it anyway) */
    unsigned char run[64];
    size_t rn = 0;
    for (size_t i = 0; i <= len; i++) {
        int escaped = i < len && s[i] == '%';
        if (!escaped && rn) { /* a run of escapes ended: its bytes must be whole UTF-8 characters */
            for (size_t k = 0; k < rn;) {
                size_t n = agw_utf8_seq(run + k, rn - k);
                if (n == 0)
                    return 0;
                k += n;
            }
            rn = 0;
        }
        if (i == len)
            break;
        if (!escaped) {
            if (!PARAM_CHAR[s[i]])
                return 0;
            continue;
        }
        int h = i + 2 < len ? agw_hex_digit(s[i + 1]) : -1, l = i + 2 < len ? agw_hex_digit(s[i + 2]) : -1;
        if (h < 0 || l < 0)
            return 0; /* a '%' that does not start %XX */
        unsigned char c = (unsigned char)(h * 16 + l);
        if (c < 0x20 || c == 0x7f || c == '/' || c == '?' || c == '#')
            return 0;
        if (PARAM_CHAR[c] == U || c == ';')
            return 0; /* "%61dmin" is "admin" to an upstream (§6.2.2.2), "%3B" a path parameter */
        if (rn == sizeof(run)) { /* a long run: check what is whole so far, keep the tail */
            size_t k = 0;
            while (k < rn) {
                size_t n = agw_utf8_seq(run + k, rn - k);
                if (n == 0)
                    break;
                k += n;
            }
            if (rn - k >= 4)
                return 0; /* no character is longer than 4 bytes */
            memmove(run, run + k, rn - k);
            rn -= k;
        }
        run[rn++] = c;
        i += 2;
    }
    return 1;
}

/* ---- patterns ------------------------------------------------------------------------------- */

typedef struct atom {
    uint8_t set[32];  /* bit c: byte c matches */
    uint16_t min, max; /* repetitions; max UINT16_MAX: no upper bound */
} atom_t;

struct agw_route_pattern {
    size_t num_atoms;
    atom_t atoms[AGW_ROUTE_PATTERN_MAX_ATOMS];
};

static void set_add(atom_t *a, unsigned char c)
{
    a->set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static int set_has(const atom_t *a, unsigned char c)
{
    return (a->set[c >> 3] >> (c & 7)) & 1;
}

static agw_route_pattern_t *fail(agw_route_pattern_t *p, char *err, size_t errlen, const char *src, size_t len,
                                 const char *what)
{
    snprintf(err, errlen, "'%.*s': %s", (int)(len > 200 ? 200 : len), src, what);
    free(p);
    return NULL;
}

/* Reads a number (at most 255) at src[*i]; returns it, or -1. */
static int read_count(const char *src, size_t len, size_t *i)
{
    int v = -1;
    while (*i < len && src[*i] >= '0' && src[*i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (src[*i] - '0');
        if (v > 255)
            return -2;
        (*i)++;
    }
    return v;
}

agw_route_pattern_t *agw_route_pattern_compile(const char *src, size_t len, char *err, size_t errlen)
{
    agw_route_pattern_t *p = agw_calloc(1, sizeof(*p));
    if (len == 0)
        return fail(p, err, errlen, src, len, "the pattern is empty (write {name} for any segment)");
    size_t i = 0;
    while (i < len) {
        if (p->num_atoms == AGW_ROUTE_PATTERN_MAX_ATOMS)
            return fail(p, err, errlen, src, len, "more than 32 parts; write a shorter pattern");
        atom_t *a = &p->atoms[p->num_atoms++];
        unsigned char c = (unsigned char)src[i];
        if (c == '[') {
            i++;
            int negate = i < len && src[i] == '^';
            if (negate)
                i++;
            int items = 0;
            atom_t listed = {.min = 0}; /* the bytes the class lists; a's set is them or the rest */
            while (i < len && src[i] != ']') {
                unsigned char lo = (unsigned char)src[i];
                if (lo == '\\') {
                    if (++i == len)
                        break;
                    lo = (unsigned char)src[i];
                }
                i++;
                unsigned char hi = lo;
                if (i + 1 < len && src[i] == '-' && src[i + 1] != ']') {
                    i++;
                    hi = (unsigned char)src[i];
                    if (hi == '\\' && i + 1 < len)
                        hi = (unsigned char)src[++i];
                    i++;
                    if (hi < lo)
                        return fail(p, err, errlen, src, len, "a range in [...] goes backwards (write [a-z], not [z-a])");
                }
                for (unsigned k = lo; k <= hi; k++)
                    set_add(&listed, (unsigned char)k);
                items++;
            }
            if (i == len)
                return fail(p, err, errlen, src, len, "a '[' is not closed with ']'");
            if (items == 0)
                return fail(p, err, errlen, src, len, "an empty class []");
            i++; /* ']' */
            for (unsigned k = 0; k < 256; k++)
                if (set_has(&listed, (unsigned char)k) != negate)
                    set_add(a, (unsigned char)k);
        } else if (c == '.') {
            i++;
            for (unsigned k = 0; k < 256; k++)
                set_add(a, (unsigned char)k);
        } else if (c == '\\') {
            if (i + 1 == len)
                return fail(p, err, errlen, src, len, "a '\\' ends the pattern");
            set_add(a, (unsigned char)src[i + 1]);
            i += 2;
        } else if (strchr("+*?{}()|^$]", c) != NULL) {
            char what[96];
            snprintf(what, sizeof(what), "'%c' at position %zu is not supported here (see docs/guide.md, route patterns)", c,
                     i + 1);
            return fail(p, err, errlen, src, len, what);
        } else if (c < 0x21 || c >= 0x7f) {
            return fail(p, err, errlen, src, len, "a pattern is written in printable ASCII");
        } else {
            set_add(a, c);
            i++;
        }
        a->min = a->max = 1;
        if (i < len) {
            char q = src[i];
            if (q == '+' || q == '*' || q == '?') {
                a->min = q == '+' ? 1 : 0;
                a->max = q == '?' ? 1 : UINT16_MAX;
                i++;
            } else if (q == '{') {
                i++;
                int n = read_count(src, len, &i), m = n;
                if (n >= 0 && i < len && src[i] == ',') {
                    i++;
                    m = read_count(src, len, &i);
                    if (m == -1)
                        m = UINT16_MAX;
                }
                if (n < 0 || m < 0 || i == len || src[i] != '}')
                    return fail(p, err, errlen, src, len, "a count must be {n}, {n,} or {n,m} with n and m up to 255");
                if (m < n)
                    return fail(p, err, errlen, src, len, "a count {n,m} needs n <= m");
                i++;
                a->min = (uint16_t)n;
                a->max = (uint16_t)m;
            }
        }
    }
    return p;
}

/* Reachable positions: reach[q] says the atoms so far can match value[0..q). For the next atom,
 * q is reachable when some reachable p has q - max <= p <= q - min and every byte of value[p..q)
 * in the atom's set: with the run of set bytes ending at q and a prefix count of reachable
 * positions, each q is decided in O(1), so the whole match is O(atoms x len). */
int agw_route_pattern_match(const agw_route_pattern_t *p, const char *value, size_t len)
{
    unsigned char small[2 * 257];
    unsigned char *reach = len < 257 ? small : agw_malloc(2 * (len + 1));
    size_t *count = agw_malloc((len + 2) * sizeof(size_t));
    unsigned char *next = reach + len + 1;
    memset(reach, 0, len + 1);
    reach[0] = 1;
    for (size_t k = 0; k < p->num_atoms; k++) {
        const atom_t *a = &p->atoms[k];
        count[0] = 0; /* count[i]: reachable positions among 0..i-1 */
        for (size_t i = 0; i <= len; i++)
            count[i + 1] = count[i] + reach[i];
        size_t run_start = 0; /* value[run_start..q) are all in the set */
        int any = 0;
        for (size_t q = 0; q <= len; q++) {
            if (q > 0 && !set_has(a, (unsigned char)value[q - 1]))
                run_start = q;
            next[q] = 0;
            if (q < a->min)
                continue;
            size_t hi = q - a->min;
            size_t lo = a->max == UINT16_MAX || q < a->max ? 0 : q - a->max;
            if (lo < run_start)
                lo = run_start;
            if (lo <= hi && count[hi + 1] - count[lo] > 0) {
                next[q] = 1;
                any = 1;
            }
        }
        memcpy(reach, next, len + 1);
        if (!any)
            break;
    }
    int ok = reach[len];
    free(count);
    if (reach != small)
        free(reach);
    return ok;
}

void agw_route_pattern_free(agw_route_pattern_t *p)
{
    free(p);
}
