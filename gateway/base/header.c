/* header.c: header fields into the header block a script sees (header.h). */
#include "base/header.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

/* A field and its place, for sorting by name (then place: repeated values keep their order). */
typedef struct field_ref {
    const agw_header_t *h;
    size_t at;
} field_ref_t;

/* ASCII lowercase: field names are tokens (RFC 9110 §5.1), and tolower() is a call through the
 * locale's table for every byte */
static inline int fold(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? c | 0x20 : c;
}

static int field_cmp(const void *pa, const void *pb)
{
    const field_ref_t *a = pa, *b = pb;
    size_t n = a->h->name_len < b->h->name_len ? a->h->name_len : b->h->name_len;
    for (size_t k = 0; k < n; k++) {
        int d = fold((unsigned char)a->h->name[k]) - fold((unsigned char)b->h->name[k]);
        if (d)
            return d;
    }
    if (a->h->name_len != b->h->name_len)
        return a->h->name_len < b->h->name_len ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* The bytes of the n fields as pairs, each name and value followed by a NUL: what
 * agw_header_pairs writes, and the most a header block of them takes. */
static size_t pairs_len(const agw_header_t *h, size_t n)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += h[i].name_len + h[i].value_len + 2;
    return need;
}

void agw_header_block(agw_buf_t *b, const agw_header_t *h, size_t n)
{
    field_ref_t small[64], *f = n <= 64 ? small : agw_malloc(n * sizeof(*f));
    for (size_t i = 0; i < n; i++)
        f[i] = (field_ref_t){&h[i], i};
    if (n <= 16) { /* an upstream's few fields: insertion sort, no call per comparison */
        for (size_t i = 1; i < n; i++) {
            field_ref_t x = f[i];
            size_t j = i;
            for (; j > 0 && field_cmp(&x, &f[j - 1]) < 0; j--)
                f[j] = f[j - 1];
            f[j] = x;
        }
    } else {
        qsort(f, n, sizeof(*f), field_cmp);
    }
    agw_buf_reset(b);
    agw_buf_reserve(b, pairs_len(h, n)); /* joining repeated names only shortens it */
    for (size_t i = 0; i < n; i++) {
        const agw_header_t *x = f[i].h;
        int same = i > 0 && x->name_len == f[i - 1].h->name_len &&
                   field_cmp(&(field_ref_t){x, 0}, &(field_ref_t){f[i - 1].h, 0}) == 0;
        if (same) { /* b ends with the previous value's NUL: ", value" goes before it */
            b->len--;
            b->base[b->len++] = ',';
            b->base[b->len++] = ' ';
        } else {
            for (size_t j = 0; j < x->name_len; j++)
                b->base[b->len++] = (char)fold((unsigned char)x->name[j]);
            b->base[b->len++] = '\0';
        }
        memcpy(b->base + b->len, x->value, x->value_len);
        b->len += x->value_len;
        b->base[b->len++] = '\0';
    }
    if (f != small)
        free(f);
}

void agw_header_pairs(agw_buf_t *b, const agw_header_t *h, size_t n)
{
    size_t need = pairs_len(h, n);
    agw_buf_reserve(b, need);
    char *p = b->base + b->len;
    for (size_t i = 0; i < n; i++) {
        memcpy(p, h[i].name, h[i].name_len);
        p += h[i].name_len;
        *p++ = '\0';
        memcpy(p, h[i].value, h[i].value_len);
        p += h[i].value_len;
        *p++ = '\0';
    }
    b->len += need;
    b->base[b->len] = '\0';
}

/* Reads the pairs of p (len bytes) into h (room for max); returns how many there are, which is
 * more than max when they did not all fit (h then holds the first max). */
static size_t read_pairs(const char *p, size_t len, agw_header_t *h, size_t max)
{
    size_t k = 0;
    const char *end = p + len;
    while (p < end) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        if (nul == NULL || nul + 1 >= end)
            break; /* a name without its value: the pairs end here */
        const char *value = nul + 1, *vnul = memchr(value, '\0', (size_t)(end - value));
        if (vnul == NULL)
            break;
        if (k < max)
            h[k] = (agw_header_t){p, (size_t)(nul - p), value, (size_t)(vnul - value)};
        k++;
        p = vnul + 1;
    }
    return k;
}

void agw_header_block_of_pairs(agw_buf_t *b, const char *p, size_t len)
{
    agw_header_t small[64], *h = small;
    size_t n = read_pairs(p, len, small, 64);
    if (n > 64) {
        h = agw_malloc(n * sizeof(*h));
        read_pairs(p, len, h, n);
    }
    if (n == 0) {
        agw_buf_reset(b);
        return;
    }
    agw_header_block(b, h, n);
    if (h != small)
        free(h);
}

/* RFC 9110 §5.6.2 token characters, as a table: a token's byte, its letters lowercased; 0 for any
 * other byte. Every upstream call's header names and every response header of a script are
 * checked with it (agw_header_is_token, agw_header_token_lower). */
static const unsigned char tlower[256] = {
    ['!'] = '!', ['#'] = '#', ['$'] = '$', ['%'] = '%', ['&'] = '&', ['\''] = '\'', ['*'] = '*', ['+'] = '+',
    ['-'] = '-', ['.'] = '.', ['^'] = '^', ['_'] = '_', ['`'] = '`', ['|'] = '|', ['~'] = '~', ['0'] = '0',
    ['1'] = '1', ['2'] = '2', ['3'] = '3', ['4'] = '4', ['5'] = '5', ['6'] = '6', ['7'] = '7', ['8'] = '8',
    ['9'] = '9', ['a'] = 'a', ['b'] = 'b', ['c'] = 'c', ['d'] = 'd', ['e'] = 'e', ['f'] = 'f', ['g'] = 'g',
    ['h'] = 'h', ['i'] = 'i', ['j'] = 'j', ['k'] = 'k', ['l'] = 'l', ['m'] = 'm', ['n'] = 'n', ['o'] = 'o',
    ['p'] = 'p', ['q'] = 'q', ['r'] = 'r', ['s'] = 's', ['t'] = 't', ['u'] = 'u', ['v'] = 'v', ['w'] = 'w',
    ['x'] = 'x', ['y'] = 'y', ['z'] = 'z', ['A'] = 'a', ['B'] = 'b', ['C'] = 'c', ['D'] = 'd', ['E'] = 'e',
    ['F'] = 'f', ['G'] = 'g', ['H'] = 'h', ['I'] = 'i', ['J'] = 'j', ['K'] = 'k', ['L'] = 'l', ['M'] = 'm',
    ['N'] = 'n', ['O'] = 'o', ['P'] = 'p', ['Q'] = 'q', ['R'] = 'r', ['S'] = 's', ['T'] = 't', ['U'] = 'u',
    ['V'] = 'v', ['W'] = 'w', ['X'] = 'x', ['Y'] = 'y', ['Z'] = 'z',
};

int agw_header_is_token(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!tlower[(unsigned char)s[i]])
            return 0;
    return 1;
}

int agw_header_token_lower(const char *s, size_t len, char *out)
{
    unsigned char ok = len > 0;
    for (size_t i = 0; i < len; i++) { /* (no branch per byte: names are short) */
        unsigned char c = tlower[(unsigned char)s[i]];
        out[i] = (char)c;
        ok &= (unsigned char)(c != 0);
    }
    return ok;
}

/* Eight bytes at a time (a word with a byte below 0x20 or equal to 0x7f is looked at byte by
 * byte): a call's header values, traceparent included, are checked on every call. */
int agw_header_has_control(const char *v, size_t len)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x, del;
        memcpy(&x, v + i, 8);
        del = x ^ (ones * 0x7f);
        if ((((x - ones * 0x20) & ~x) | ((del - ones) & ~del)) & highs)
            break;
    }
    for (; i < len; i++) {
        unsigned char ch = (unsigned char)v[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            return 1;
    }
    return 0;
}
