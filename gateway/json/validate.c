/* json/validate.c: a single-pass, allocation-free JSON validator (agw_json_validate, json.h). It
 * accepts exactly what agw_json_parse accepts (jansson with JSON_DECODE_ANY | JSON_ALLOW_NUL plus
 * the depth limit), so a validated text later parses without error.
 *
 * The hot loop is the string scan: eight bytes at a time (SWAR) until a word holds a special byte
 * ('"', '\\', a control character or non-ASCII), which a count of trailing zeros finds; the last
 * few bytes of the input go one at a time. A 256-entry class table then dispatches the special
 * byte. The grammar is a goto state machine over a bit stack of open containers (1 = object,
 * 0 = array); nothing is called per byte. */
#include "json/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jansson refuses anything deeper than this (JSON_PARSER_MAX_DEPTH), whatever max_depth says. */
#define JANSSON_MAX_DEPTH 2048

/* Classes of bytes inside a string (RFC 3629 §4 for the UTF-8 lead bytes). */
enum {
    C_PLAIN = 0, /* ASCII 0x20..0x7F except '"' and '\\' */
    C_QUOTE,
    C_ESC,
    C_CTRL,  /* 0x00..0x1F: must be escaped */
    C_U2,    /* C2..DF: 2-byte sequence */
    C_U3_E0, /* E0: 3-byte, second byte A0..BF (no overlongs) */
    C_U3,    /* E1..EC, EE, EF: 3-byte, second byte 80..BF */
    C_U3_ED, /* ED: 3-byte, second byte 80..9F (no UTF-16 surrogates) */
    C_U4_F0, /* F0: 4-byte, second byte 90..BF (no overlongs) */
    C_U4,    /* F1..F3: 4-byte, second byte 80..BF */
    C_U4_F4, /* F4: 4-byte, second byte 80..8F (nothing beyond U+10FFFF) */
    C_BAD,   /* 80..BF (a stray continuation byte), C0, C1 (overlong), F5..FF */
};

static const unsigned char str_class[256] = {
    [0x00 ... 0x1F] = C_CTRL,
    [0x20 ... 0x21] = C_PLAIN,
    ['"'] = C_QUOTE,
    [0x23 ... 0x5B] = C_PLAIN,
    ['\\'] = C_ESC,
    [0x5D ... 0x7F] = C_PLAIN,
    [0x80 ... 0xC1] = C_BAD,
    [0xC2 ... 0xDF] = C_U2,
    [0xE0] = C_U3_E0,
    [0xE1 ... 0xEC] = C_U3,
    [0xED] = C_U3_ED,
    [0xEE ... 0xEF] = C_U3,
    [0xF0] = C_U4_F0,
    [0xF1 ... 0xF3] = C_U4,
    [0xF4] = C_U4_F4,
    [0xF5 ... 0xFF] = C_BAD,
};

/* 0x10 | value for hex digits, 0 for anything else. */
static const unsigned char hex_val[256] = {
    ['0'] = 0x10, ['1'] = 0x11, ['2'] = 0x12, ['3'] = 0x13, ['4'] = 0x14, ['5'] = 0x15, ['6'] = 0x16,
    ['7'] = 0x17, ['8'] = 0x18, ['9'] = 0x19, ['a'] = 0x1A, ['b'] = 0x1B, ['c'] = 0x1C, ['d'] = 0x1D,
    ['e'] = 0x1E, ['f'] = 0x1F, ['A'] = 0x1A, ['B'] = 0x1B, ['C'] = 0x1C, ['D'] = 0x1D, ['E'] = 0x1E,
    ['F'] = 0x1F,
};

#define IS_DIGIT(c) ((unsigned)((c) - '0') <= 9)

/* Reads the 4 hex digits of a \u escape at p (end bounds the input) into *cp; 0 if malformed. */
static inline int hex4(const unsigned char *p, const unsigned char *end, unsigned *cp)
{
    if (end - p < 4)
        return 0;
    unsigned a = hex_val[p[0]], b = hex_val[p[1]], c = hex_val[p[2]], d = hex_val[p[3]];
    *cp = (a & 15) << 12 | (b & 15) << 8 | (c & 15) << 4 | (d & 15);
    return (a & b & c & d & 0x10) != 0;
}

/* Whether the real number s..e (valid JSON number syntax with a fraction or an exponent) is too
 * large for a double, as jansson's strtod check decides ("real number overflow"). Underflow is
 * not an error there, so it is not one here. Called only for reals with an exponent or more than
 * 308 integer digits. */
static int real_overflows(const unsigned char *s, const unsigned char *e)
{
    const unsigned char *p = s + (*s == '-'), *ip = p, *fp = NULL;
    while (p < e && IS_DIGIT(*p))
        p++;
    size_t nint = (size_t)(p - ip), nfrac = 0;
    if (p < e && *p == '.') {
        fp = ++p;
        while (p < e && IS_DIGIT(*p))
            p++;
        nfrac = (size_t)(p - fp);
    }
    long long ex = 0;
    if (p < e) { /* 'e' or 'E' */
        int neg = *++p == '-';
        if (*p == '+' || *p == '-')
            p++;
        for (; p < e; p++)
            if (ex < 1000000000LL)
                ex = ex * 10 + (*p - '0');
        if (neg)
            ex = -ex;
    }
    /* m: the decimal exponent of the first significant digit, the value is in [10^m, 10^(m+1)) */
    long long m;
    size_t skip = 0; /* leading zero digits of the fraction when the integer part is 0 */
    if (!(nint == 1 && *ip == '0')) {
        if (nint > 400)
            return 1;
        m = (long long)nint - 1 + ex;
    } else {
        while (skip < nfrac && fp[skip] == '0')
            skip++;
        if (skip == nfrac)
            return 0; /* zero */
        m = ex - (long long)skip - 1;
    }
    if (m != 308)
        return m > 308;
    /* Near DBL_MAX: ask strtod about 0.<significant digits>e309, cut to 400 digits with a sticky
     * '1' when nonzero digits were cut (the overflow threshold has 309 digits, so it stays exact). */
    char tmp[420];
    size_t n = 0;
    int sticky = 0;
    tmp[n++] = '0';
    tmp[n++] = '.';
    const unsigned char *runs[2][2] = {{ip, ip + nint}, {fp ? fp + skip : NULL, fp ? fp + nfrac : NULL}};
    int started = 0;
    for (int r = 0; r < 2; r++) {
        for (const unsigned char *q = runs[r][0]; q && q < runs[r][1]; q++) {
            if (!started && *q == '0')
                continue;
            started = 1;
            if (n < 402)
                tmp[n++] = (char)*q;
            else if (*q != '0')
                sticky = 1;
        }
    }
    if (sticky)
        tmp[n++] = '1';
    memcpy(tmp + n, "e309", 5);
    return isinf(strtod(tmp, NULL));
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Skips JSON whitespace, noting that there was some. Every byte that can start a token is above
 * ' ', so the common no-whitespace case costs one compare. */
#define SKIP_WS()                                                                                   \
    do {                                                                                            \
        if (p < end && *p <= ' ') {                                                                 \
            while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))                \
                p++, ws = 1;                                                                        \
        }                                                                                           \
    } while (0)

#define SYNTAX(where, msg)                                                                          \
    do {                                                                                            \
        at = (where);                                                                               \
        what = (msg);                                                                               \
        goto syntax;                                                                                \
    } while (0)

int agw_json_validate(const char *buf, size_t len, unsigned max_depth, int *compact, char *err, size_t errlen)
{
    const unsigned char *const start = (const unsigned char *)buf, *const end = start + len;
    const unsigned char *p = start, *at, *num;
    const char *what;
    unsigned limit = max_depth < JANSSON_MAX_DEPTH ? max_depth : JANSSON_MAX_DEPTH;
    uint64_t stack[JANSSON_MAX_DEPTH / 64];
    unsigned depth = 0;
    int ws = 0, is_key = 0;

    if (compact)
        *compact = 0;

value:
    SKIP_WS();
    if (p == end)
        SYNTAX(p, "expected a value");
    switch (*p) {
    case '"':
        p++;
        is_key = 0;
        goto string;
    case '{':
        if (depth >= limit)
            goto too_deep;
        stack[depth >> 6] |= 1ULL << (depth & 63);
        depth++;
        p++;
        SKIP_WS();
        if (p < end && *p == '}') {
            p++;
            depth--;
            goto after_value;
        }
        goto key;
    case '[':
        if (depth >= limit)
            goto too_deep;
        stack[depth >> 6] &= ~(1ULL << (depth & 63));
        depth++;
        p++;
        SKIP_WS();
        if (p < end && *p == ']') {
            p++;
            depth--;
            goto after_value;
        }
        goto value;
    case '-':
    case '0' ... '9':
        goto number;
    case 't':
        if (end - p >= 4 && memcmp(p, "true", 4) == 0) {
            p += 4;
            goto after_value;
        }
        break;
    case 'f':
        if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
            p += 5;
            goto after_value;
        }
        break;
    case 'n':
        if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
            p += 4;
            goto after_value;
        }
        break;
    }
    SYNTAX(p, "expected a value");

key:
    SKIP_WS();
    if (p == end || *p != '"')
        SYNTAX(p, "expected a string key");
    p++;
    is_key = 1;
    goto string;

after_key:
    SKIP_WS();
    if (p == end || *p != ':')
        SYNTAX(p, "expected ':'");
    p++;
    goto value;

after_value:
    SKIP_WS();
    if (depth == 0) {
        if (p != end)
            SYNTAX(p, "expected end of input");
        if (compact)
            *compact = !ws;
        return 0;
    }
    if ((stack[(depth - 1) >> 6] >> ((depth - 1) & 63)) & 1) {
        if (p < end && *p == ',') {
            p++;
            goto key;
        }
        if (p < end && *p == '}') {
            p++;
            depth--;
            goto after_value;
        }
        SYNTAX(p, "expected ',' or '}'");
    }
    if (p < end && *p == ',') {
        p++;
        goto value;
    }
    if (p < end && *p == ']') {
        p++;
        depth--;
        goto after_value;
    }
    SYNTAX(p, "expected ',' or ']'");

string: /* p is just past the opening quote */
    for (;;) {
        while (end - p >= 8) {
            uint64_t x, q, b;
            memcpy(&x, p, 8);
            q = x ^ (ONES * '"');
            b = x ^ (ONES * '\\');
            /* a byte is special when it is '"' or '\\' (q or b has a zero byte), below 0x20 or
             * above 0x7F; borrows only run upward from a byte that is special itself, so the
             * lowest flagged byte is a special one */
            uint64_t m = ((q - ONES) | (b - ONES) | (x - ONES * 0x20) | x) & HIGHS;
            if (m) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                p += __builtin_ctzll(m) >> 3;
                goto special;
#else
                break;
#endif
            }
            p += 8;
        }
        while (p < end && str_class[*p] == C_PLAIN)
            p++;
        if (p == end)
            SYNTAX(p, "unterminated string");
    special:; /* p < end, at a byte that is not C_PLAIN */
        unsigned lo = 0x80, hi = 0xBF, cp;
        switch (str_class[*p]) {
        case C_QUOTE:
            p++;
            if (is_key)
                goto after_key;
            goto after_value;
        case C_ESC:
            if (end - p < 2)
                SYNTAX(end, "unterminated string");
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                continue;
            case 'u':
                if (!hex4(p + 2, end, &cp))
                    SYNTAX(p, "invalid \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned cp2;
                    if (end - p < 8 || p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, end, &cp2) || cp2 < 0xDC00 ||
                        cp2 > 0xDFFF)
                        SYNTAX(p, "lone surrogate in \\u escape");
                    p += 12;
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    SYNTAX(p, "lone surrogate in \\u escape");
                } else if (cp == 0 && is_key) {
                    /* a value may hold "\u0000" (JSON_ALLOW_NUL), a key not: jansson refuses it */
                    SYNTAX(p, "\\u0000 in an object key");
                } else {
                    p += 6;
                }
                continue;
            default:
                SYNTAX(p, "invalid escape");
            }
        case C_CTRL:
            SYNTAX(p, "control character in string");
        case C_U2:
            if (end - p < 2 || (p[1] & 0xC0) != 0x80)
                goto bad_utf8;
            p += 2;
            goto next;
        case C_U3_E0:
            lo = 0xA0;
            goto u3;
        case C_U3_ED:
            hi = 0x9F;
            /* fallthrough */
        case C_U3:
        u3:
            if (end - p < 3 || p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80)
                goto bad_utf8;
            p += 3;
            goto next;
        case C_U4_F0:
            lo = 0x90;
            goto u4;
        case C_U4_F4:
            hi = 0x8F;
            /* fallthrough */
        case C_U4:
        u4:
            if (end - p < 4 || p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
                goto bad_utf8;
            p += 4;
            goto next;
        default: /* C_BAD */
            goto bad_utf8;
        }
    next: /* after a multi-byte character, more non-ASCII text is likely: skip the ASCII scans */
        if (p < end && *p >= 0x80)
            goto special;
    }

number: { /* p is at '-' or a digit */
    num = p;
    if (*p == '-')
        p++;
    const unsigned char *digits = p;
    if (p == end || !IS_DIGIT(*p))
        SYNTAX(p, "expected a digit");
    if (*p == '0') {
        if (++p < end && IS_DIGIT(*p))
            SYNTAX(p - 1, "leading zero in a number");
    } else {
        while (p < end && IS_DIGIT(*p))
            p++;
    }
    size_t ndig = (size_t)(p - digits);
    int real = 0, exp = 0;
    if (p < end && *p == '.') {
        if (++p == end || !IS_DIGIT(*p))
            SYNTAX(p, "expected a digit after '.'");
        while (p < end && IS_DIGIT(*p))
            p++;
        real = 1;
    }
    if (p < end && (*p | 0x20) == 'e') {
        if (++p < end && (*p == '+' || *p == '-'))
            p++;
        if (p == end || !IS_DIGIT(*p))
            SYNTAX(p, "expected a digit in the exponent");
        while (p < end && IS_DIGIT(*p))
            p++;
        real = exp = 1;
    }
    if (!real) {
        if (ndig >= 19 && (ndig > 19 || memcmp(digits, *num == '-' ? "9223372036854775808" : "9223372036854775807", 19) > 0)) {
            if (err && errlen)
                snprintf(err, errlen, "integer beyond int64 at byte %zu", (size_t)(num - start));
            return -1;
        }
    } else if ((exp || ndig > 308) && real_overflows(num, p)) {
        if (err && errlen)
            snprintf(err, errlen, "number out of range at byte %zu", (size_t)(num - start));
        return -1;
    }
    goto after_value;
}

bad_utf8:
    if (err && errlen)
        snprintf(err, errlen, "invalid UTF-8 at byte %zu", (size_t)(p - start));
    return -1;

too_deep:
    if (err && errlen)
        snprintf(err, errlen, "nesting deeper than %u levels", limit);
    return -1;

syntax:
    if (err && errlen)
        snprintf(err, errlen, "invalid JSON at byte %zu: %s", (size_t)(at - start), what);
    return -1;
}

size_t agw_json_count_nodes(const char *buf, size_t len, size_t stop)
{
    /* every value but the first follows a '[', ',' or ':', every member name a '{' or ','; an
     * empty container's '[' or '{' is followed by neither (counted all the same) */
    size_t n = 1;
    const char *p = buf, *end = buf + len;
    while (p < end) {
        char c = *p++;
        if (c == '"') { /* a string: its bytes are none of those marks ('\' escapes the next) */
            while (p < end && *p != '"')
                p += *p == '\\' ? 2 : 1;
            p++;
        } else if (c == '[' || c == '{' || c == ',' || c == ':') {
            if (++n > stop)
                return stop + 1;
        }
    }
    return n;
}
