/* header.h: header fields and the header block a script sees.
 *
 * A header block is every field of a message as "name\0value\0…": each name once, lowercased
 * (field names are case-insensitive, RFC 9110 §5.1), sorted, the values of a repeated name joined
 * with ", " in their order (§5.3). agg.result's parse_headers, the cache's entries and the
 * script's req.headers read it (lua/agg/result.lua).
 *
 * A pairs block is the same fields as they came, "name\0value\0…" in arrival order and spelling:
 * one copy, no sorting. An upstream's JSON answer keeps its headers so (in the body's raw ref,
 * json/json.h), and the block is made from them only when something reads them (most pages never
 * do: agw_header_block costs about 800 instructions per answer, tools/bench/callgrind).
 *
 * Neither form can hold a NUL in a name or value: the HTTP parsers refuse control characters in
 * fields (upstream/http1.c, h2o). */
#ifndef AGW_BASE_HEADER_H
#define AGW_BASE_HEADER_H

#include <stddef.h>

#include "base/buf.h"

/* Leaves out the whitespace (SP, HTAB) before and after the field value *v (*len bytes): a field
 * value does not include it (RFC 9110 §5.5), which HTTP/1.1's parser in h2o 2.2.5 keeps at the end
 * of a value. For values compared as a whole: an API key, a bearer token, a rate limit's key. */
static inline void agw_header_trim_ows(const char **v, size_t *len)
{
    const char *s = *v;
    size_t n = *len;
    while (n > 0 && (s[0] == ' ' || s[0] == '\t'))
        s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    *v = s;
    *len = n;
}

/* Whether s (len bytes) is a token (RFC 9110 §5.6.2): not empty, every byte a tchar. What a
 * field name and a method must be: an upstream call's (upstream/http1.c), a batch entry's
 * (multi/multi.c). */
int agw_header_is_token(const char *s, size_t len);

/* Copies the field name s (len bytes) into out (room for len bytes) in lowercase, checking in the
 * same pass that it is a token (as agw_header_is_token; ASCII letters only are folded: a token
 * has no others). Returns 1, or 0 when it is not a token (out then holds a part of it). A script's
 * response header names (script/resp_headers.c), one pass per name. */
int agw_header_token_lower(const char *s, size_t len, char *out);

/* Whether the field value v (len bytes) holds a control character other than HTAB (a C0 byte or
 * DEL; RFC 9110 §5.5): CR, LF and NUL would split or cut a message, and h2o refuses the others on
 * the wire. An upstream call's values, a batch entry's, a script's response headers. */
int agw_header_has_control(const char *v, size_t len);

/* One header: name and value, not NUL-terminated. */
typedef struct agw_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} agw_header_t;

/* The header block of the n fields h (n may be 0) into b, which is emptied first. One pass over
 * the fields sorted by name (O(n log n): a client or upstream repeating a name many times cannot
 * make the join quadratic, as concatenating in Lua would); up to 16 fields, the common case, are
 * sorted by insertion, more with qsort, stable by place either way. Names are lowercased in ASCII
 * whatever the locale. The runtime makes a table of a block only when a script reads
 * req.headers or result.headers. */
void agw_header_block(agw_buf_t *b, const agw_header_t *h, size_t n);

/* The pairs block of the n fields h appended to b (b is not emptied). */
void agw_header_pairs(agw_buf_t *b, const agw_header_t *h, size_t n);

/* The header block of the pairs block p (len bytes; a header block is a pairs block too, and
 * gives itself back) into b, which is emptied first. Bytes after the last complete pair are
 * ignored. */
void agw_header_block_of_pairs(agw_buf_t *b, const char *p, size_t len);

#endif
