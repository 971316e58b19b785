/* resp_headers.h: the rules a script's response headers pass before they reach a client. One
 * reader serves the gateway (core.respond, worker/core.c) and the spec harness (the
 * "agg.resp_headers" module, lua/agg/testing_transport.lua), so a spec sees the headers a client gets.
 *
 * A script gives headers as a Lua table, name -> value, names in any case. The reader
 *   - lowercases names (HTTP/2 needs it) and trims spaces and tabs around values (RFC 9110 §5.5);
 *   - drops, with a warning, a name that is not a token, a value with control characters or over
 *     AGW_RESP_HEADER_VALUE_MAX bytes, the framing and hop-by-hop headers the gateway owns
 *     (content-length, transfer-encoding, connection, keep-alive, upgrade, proxy-connection, te,
 *     trailer; RFC 9110 §7.6.1), and `date`: h2o 2.2.5 writes its own Date on every response over
 *     HTTP/1.1 and HTTP/2 and cannot be told not to, so a script's would be a second one;
 *   - keeps one table entry per name: names are case-insensitive (RFC 9110 §5.1), so when a table holds
 *     several spellings of one name (`Content-Type` and `content-type`), the value of the spelling
 *     that sorts first bytewise is kept (upper case sorts before lower case, so `Content-Type` wins
 *     over `content-type`) and each other spelling is dropped with a warning. Lua's table order
 *     is not deterministic; this rule is, whatever order the table gives;
 *   - reads at most AGW_RESP_HEADERS_MAX entries (which ones, of a table with more, is up to Lua's
 *     table order); the rest are dropped with one warning, but for one `cache-control` (any
 *     spelling) past the cap, which is kept: the runtime adds `private` to a copy of the script's
 *     table (agg.runtime: an authenticated or personal response, a group's session), and a shared
 *     cache in front must see it whatever else the table held.
 * A `server` header is kept like any other: the gateway's own Server is added only to responses
 * without one (server.c), so a script's replaces it.
 * The headers come out sorted by name, so the same table gives the same bytes on the wire.
 * Warning texts quote names escaped (control characters and non-ASCII bytes as \xNN), so that no
 * name can split or forge a log line.
 */
#ifndef AGW_RESP_HEADERS_H
#define AGW_RESP_HEADERS_H

#include <lua.h>
#include <stddef.h>

#include "base/buf.h"

/* At most this many entries of a script's headers table are read per response. */
#define AGW_RESP_HEADERS_MAX 64
/* A longer value is dropped (bytes): clients refuse header blocks far smaller than what a script
 * can build (nghttp2 by default: 64 KiB in all). */
#define AGW_RESP_HEADER_VALUE_MAX 8192
/* A longer name is dropped (bytes). */
#define AGW_RESP_HEADER_NAME_MAX 128

/* One header that passed the rules. The strings point into the set's bytes (not NUL-terminated). */
typedef struct agw_resp_header {
    const char *name;   /* lowercased */
    size_t name_len;
    const char *value;  /* without surrounding spaces and tabs */
    size_t value_len;
} agw_resp_header_t;

/* The headers of one response. The caller owns it and may reuse it for the next response (its
 * bytes keep their allocation); agw_resp_headers_free releases the bytes. */
typedef struct agw_resp_headers {
    agw_resp_header_t h[AGW_RESP_HEADERS_MAX + 1]; /* sorted by name; one name per table entry (several
                                                  fields of a list value, in its order) */
    size_t n;                                  /* entries in h */
    agw_buf_t bytes;                           /* names and values h points into */
} agw_resp_headers_t;

#define AGW_RESP_HEADERS_INIT {.n = 0, .bytes = AGW_BUF_INIT}

/* Receives one warning (a NUL-terminated line without a trailing newline) about a dropped header. */
typedef void (*agw_resp_headers_warn_cb)(void *data, const char *msg);

/* At most this many names in an agw_resp_known_t. */
#define AGW_RESP_KNOWN_MAX 8

/* Header names one VM knows by address: the interned Lua strings of names that no rule above
 * drops or changes (lowercase tokens, not owned by the gateway, not date), sorted bytewise. A
 * table whose every entry is one of them with a plain string value is read without the rules'
 * work (agw_resp_headers_read): the headers agg.page writes itself (x-aggregation-completed,
 * cache-control) cost about 750 instructions a page less (docs/performance.md, "A nineteenth
 * pass"). LuaJIT interns every string and never moves one, so while the VM holds these (a table
 * in its registry, ref), a key equal to a name has the name's address. */
typedef struct agw_resp_known {
    const char *name[AGW_RESP_KNOWN_MAX]; /* in L's memory, NUL-terminated */
    size_t len[AGW_RESP_KNOWN_MAX];
    size_t n;
    int ref; /* the registry's reference to the table that keeps them */
} agw_resp_known_t;

/* Fills known with the interned copies in L of names (a NULL-terminated list of at most
 * AGW_RESP_KNOWN_MAX lowercase tokens, none of them owned by the gateway or date, sorted bytewise:
 * a list that breaks this is refused), kept by a table in L's registry. Returns 0, or -1 (known
 * left empty) for a list that breaks the rules. Raises Lua's memory error as lua_createtable does. */
int agw_resp_known_init(agw_resp_known_t *known, lua_State *L, const char *const *names);

/* Reads the headers table at index idx of L into set (replacing what it held), by the rules
 * above. known (may be NULL): names L holds by address (agw_resp_known_t); a table whose entries
 * are all among them, each with a string value of at most AGW_RESP_HEADER_VALUE_MAX bytes, neither
 * empty nor with spaces or tabs around it nor a control character in it, is taken as it is (the
 * rules would keep every entry unchanged): the same set, without their work. A value is a string, a number, or a list of them: a list gives one field per element, in
 * its order (several Set-Cookie fields, RFC 6265 §3; each element counts towards
 * AGW_RESP_HEADERS_MAX). An entry whose name is not a string or whose value is none of these, and
 * a list element that is not a string or number, are dropped with a warning. Each dropped header is reported to warn(data, msg) (warn may be
 * NULL). Does not raise Lua errors and leaves the Lua stack as it found it. Aborts the process on
 * allocation failure (as agw_buf does). */
void agw_resp_headers_read(agw_resp_headers_t *set, lua_State *L, int idx, const agw_resp_known_t *known,
                           agw_resp_headers_warn_cb warn, void *data);

/* The (first) header named name (lowercase, len bytes) in set, or NULL. */
const agw_resp_header_t *agw_resp_headers_find(const agw_resp_headers_t *set, const char *name, size_t len);

/* Releases the bytes of set; set is empty afterwards (and may be used again). */
void agw_resp_headers_free(agw_resp_headers_t *set);

/* Opens the "agg.resp_headers" module, the reader for the spec harness:
 *   apply(headers | nil) -> table (lowercased name -> value, or a list of values for a name sent
 *   as several fields), list of warning strings
 *   local h, warnings = require("agg.resp_headers").apply { ["Content-Type"] = "text/csv",
 *                                                           ["content-type"] = "text/plain" }
 *   -- h = { ["content-type"] = "text/csv" }, warnings[1] names the dropped 'content-type'
 * A headers argument that is neither a table nor nil is a Lua error. */
int agw_resp_headers_open(lua_State *L);

#endif
