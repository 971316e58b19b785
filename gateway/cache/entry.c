/* entry.c: see entry.h. */
#include "cache/entry.h"

#include <string.h>

/* The whole number at *p up to the byte stop (1 to 15 digits only); advances *p past stop. */
static int field(const char **p, const char *end, char stop, uint64_t *out)
{
    const char *s = *p;
    uint64_t n = 0;
    size_t digits = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (++digits > 15)
            return -1;
        n = n * 10 + (uint64_t)(*s - '0');
        s++;
    }
    if (digits == 0 || s >= end || *s != stop)
        return -1;
    *out = n;
    *p = s + 1;
    return 0;
}

int agw_cache_entry_parse(const char *v, size_t len, agw_cache_entry_t *e)
{
    if (len > AGW_CACHE_ENTRY_MAX || len < 6 || memcmp(v, "AGWC1 ", 6) != 0)
        return -1;
    const char *p = v + 6, *end = v + len;
    uint64_t hlen, blen;
    if (field(&p, end, ' ', &e->fresh_ms) || field(&p, end, ' ', &e->stale_ms) ||
        field(&p, end, ' ', &e->error_until_ms) || field(&p, end, ' ', &e->status) || field(&p, end, ' ', &hlen) ||
        field(&p, end, '\n', &blen))
        return -1;
    size_t left = (size_t)(end - p);
    if (hlen > left || blen != left - hlen)
        return -1;
    e->headers = p;
    e->hlen = (size_t)hlen;
    e->body = p + hlen;
    e->blen = (size_t)blen;
    return 0;
}

uint64_t agw_cache_entry_ms(double v)
{
    if (!(v >= 1.0)) /* (NaN too) */
        return 0;
    return v < (double)AGW_CACHE_ENTRY_MS_MAX ? (uint64_t)v : AGW_CACHE_ENTRY_MS_MAX;
}

/* Two decimal digits of 0..99, for put_u64. */
static const char digits2[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                 "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                 "8081828384858687888990919293949596979899";

/* Writes n in decimal at p; returns the end. Two digits per division (an entry's times have 13
 * digits); snprintf's formatting cost about 3,300 instructions for an entry's six numbers
 * (tools/bench/callgrind CACHE=miss). */
static char *put_u64(char *p, uint64_t n)
{
    char tmp[20];
    size_t k = sizeof(tmp);
    while (n >= 100) {
        size_t d = (size_t)(n % 100) * 2;
        n /= 100;
        tmp[--k] = digits2[d + 1];
        tmp[--k] = digits2[d];
    }
    if (n >= 10) {
        tmp[--k] = digits2[n * 2 + 1];
        tmp[--k] = digits2[n * 2];
    } else {
        tmp[--k] = (char)('0' + n);
    }
    memcpy(p, tmp + k, sizeof(tmp) - k);
    return p + (sizeof(tmp) - k);
}

size_t agw_cache_entry_head(char *line, const agw_cache_entry_t *e)
{
    char *p = line;
    memcpy(p, "AGWC1 ", 6);
    p = put_u64(p + 6, e->fresh_ms);
    *p++ = ' ';
    p = put_u64(p, e->stale_ms);
    *p++ = ' ';
    p = put_u64(p, e->error_until_ms);
    *p++ = ' ';
    p = put_u64(p, e->status);
    *p++ = ' ';
    p = put_u64(p, e->hlen);
    *p++ = ' ';
    p = put_u64(p, e->blen);
    *p++ = '\n';
    return (size_t)(p - line);
}
