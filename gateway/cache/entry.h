/* entry.h: reading a cache entry in C, so a tier-1 hit costs one Lua->C call and no Lua string of
 * the whole entry (issue 16, "Cost").
 *
 * The format is lua/agg/cache.lua's (M.encode writes it in Lua; agw_cache_entry_head writes its
 * first line in C, byte for byte the same, and the worker stores that line, the headers and the
 * body; for both tiers):
 *   "AGWC1 <fresh_ms> <stale_ms> <error_until_ms> <status> <hlen> <blen>\n" <headers> <body>
 * six whole numbers of 1 to 15 decimal digits, one space between them, a newline after the last;
 * then hlen bytes of header block ("name\0value\0…") and blen bytes of body, and nothing after.
 * agw_cache_entry_parse accepts exactly what M.decode accepts (the same rules, the same bound).
 */
#ifndef AGW_CACHE_ENTRY_H
#define AGW_CACHE_ENTRY_H

#include <stddef.h>
#include <stdint.h>


#define AGW_CACHE_ENTRY_MAX ((size_t)4 * 1024 * 1024) /* bytes; agg.cache's MAX_ENTRY */

/* The fields of an entry; headers and body point into the parsed bytes (borrowed). */
typedef struct agw_cache_entry {
    uint64_t fresh_ms;       /* fresh until (core.now's clock, ms) */
    uint64_t stale_ms;       /* served stale (stale-while-revalidate) until */
    uint64_t error_until_ms; /* served on error (stale-if-error) until */
    uint64_t status;         /* the upstream's HTTP status */
    const char *headers;     /* header block, hlen bytes */
    size_t hlen;
    const char *body;        /* body, blen bytes */
    size_t blen;
} agw_cache_entry_t;

/* Parses the len bytes at v into *e. Returns 0, or -1 when they are not an entry (other format,
 * a field that is not digits only, lengths that disagree with len, more than
 * AGW_CACHE_ENTRY_MAX bytes): the caller counts it as corrupt and misses. */
int agw_cache_entry_parse(const char *v, size_t len, agw_cache_entry_t *e);

/* The largest time an entry's field holds (ms; 15 digits). */
#define AGW_CACHE_ENTRY_MS_MAX 999999999999999ull

/* v (ms, a Lua number) as an entry's time or a lifetime: its whole part, 0 for NaN and for what is
 * not above 0, AGW_CACHE_ENTRY_MS_MAX for what is above it, infinity too. A double's conversion to
 * uint64_t outside its range is undefined (C11 6.3.1.4): an infinite stale-if-error from an
 * upstream (an attack review) became a Redis PX of 0 on x86-64 and its tier-1 entry was lost, and
 * ARM64 saturates instead; whatever the runtime hands over, the worker converts through this. */
uint64_t agw_cache_entry_ms(double v);

/* Room for an entry's first line ("AGWC1 " and six numbers under 10^15, spaces, the newline). */
#define AGW_CACHE_ENTRY_HEAD_MAX (6 + 6 * 16)

/* Writes the first line of the entry of e's fields (numbers under 10^15) into line, which has room
 * for AGW_CACHE_ENTRY_HEAD_MAX bytes; returns its length. The entry is that line, e->headers and
 * e->body: the worker stores the three parts without joining them first (worker/cache.c). */
size_t agw_cache_entry_head(char *line, const agw_cache_entry_t *e);

#endif
