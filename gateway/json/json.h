/* json.h: JSON between upstreams, Lua scripts and the page, with the fidelity rules of
 * DESIGN §2.3.
 *
 * Which parser does what. On a request's path no JSON is parsed by jansson: an upstream body (and
 * a batch entry's) is checked by agw_json_validate (validate.c, one pass, no allocation) and kept
 * as a raw ref; when a script reads it, or calls json.decode, agw_json_push_text (push.c) turns the
 * validated text into Lua values in one pass, without a tree. The page is encoded by our encoder
 * (encode.c; jansson's real formatting is not the shortest round-trip form). jansson parses only
 * what is not on that path: the batch endpoint's request envelope (multi/), JWKS documents, token
 * claims (edge/jwt.c; claims reach Lua as a tree ref) and the API key file (edge/apikeys.c); and it
 * is the reference: agw_json_parse is what agw_json_validate must accept and agw_json_push_text must
 * equal (test_json checks both).
 *
 * How JSON looks in Lua (the "agg.json" module, also re-exported by agg):
 *   null      agg.null, a light userdata (NULL); `v == agg.null` tests it
 *   array     a table whose metatable is the array metatable (agg.array() makes one); decoded
 *             arrays always carry it, so [] stays [] and {} stays {}
 *   object    a plain table; the key order of a decoded object is remembered (a weak side table)
 *             and the encoder writes remembered keys first, in that order, skipping removed ones,
 *             then any other string keys sorted bytewise: the same input gives the same bytes
 *   integer   a Lua number when |n| <= 2^53; beyond that an int64 box (agg.int64("…")) that keeps
 *             every digit and compares/prints like the number; integers beyond int64 fail to parse
 *   real      a Lua number, encoded in the shortest form that reads back to the same double
 *   string    a Lua string; may hold "\0"; must be valid UTF-8 to be encoded
 *
 * Encoding a Lua value: a table without the array metatable is an array when its keys are exactly
 * 1..n (n >= 1), an object when all keys are strings, `{}` when empty; any other table (sparse,
 * mixed keys) is an error naming the path. NaN and ±Inf encode as null. Functions, threads, other
 * userdata, invalid UTF-8 and nesting deeper than AGW_JSON_ENCODE_MAX_DEPTH (this also catches
 * cycles) are errors naming the path ("$.product.data.tags[3]"). Paths use JSON conventions: "$" is the
 * encoded value, ".name" an object member (["name"] when the name is not identifier-like), "[i]"
 * an array element counted from 0 (Lua index i+1).
 *
 * A "json ref" holds JSON that has not been turned into Lua tables, so sections a script never
 * touches cost no Lua work. It comes in two kinds:
 *   tree ref  a userdata holding a parsed json_t (a counted reference, released by __gc); the
 *             encoder writes it straight from the json_t.
 *   raw ref   a C closure of one C function (never called: it raises) whose upvalues hold a Lua
 *             string of JSON text that agw_json_validate accepted, its compact flag and, when
 *             there is one, the extra string kept with it. Nothing in Lua can change a C
 *             closure's upvalues (the sandbox keeps debug.setupvalue from scripts), and no script
 *             can make a closure of that function, so the text stays what was validated. Not a
 *             userdata on purpose: LuaJIT's collector walks every userdata, live or dead, in the
 *             indivisible atomic step that ends each cycle, and a page made one per section
 *             (docs/performance.md, "A fifteenth pass": 70 % of that step at half load). The
 *             encoder copies a compact text verbatim and any other with the whitespace outside
 *             strings left out; materialize makes Lua values of it with agw_json_push_text when
 *             (if ever) a script reads it. type() says "function": where the runtime wants a
 *             function it refuses a raw ref (agg.callable), and where a function or a value will
 *             do (a call's fallback) it takes one as a value.
 * materialize and the encoder accept both kinds; agw_json_check_ref returns a tree ref's json_t
 * and agw_json_check_raw_ref a raw ref's text.
 */
#ifndef AGW_JSON_H
#define AGW_JSON_H

#include <jansson.h>
#include <lua.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* Deepest nesting accepted when parsing an upstream body (or a request body, or json.decode). */
#define AGW_JSON_MAX_DEPTH 256

/* Deepest nesting the encoder accepts: room for data parsed at AGW_JSON_MAX_DEPTH inside what a
 * script builds around it (a page puts a section's data two levels down), so what was accepted
 * from an upstream can always be sent on; deeper is an error (this also catches cycles). */
#define AGW_JSON_ENCODE_MAX_DEPTH (AGW_JSON_MAX_DEPTH + 64)

/* Most tables one encoding visits (4,194,304), a table reached through several references counted
 * each time: a value of shared references (t = { t, t } twenty-six times) encodes to 2^26 tables
 * and 268 MB, which held a worker 8 s inside one C call no limit stops. A page that visits more is
 * an error ("more than 4194304 tables"); an upstream's parsed data is far smaller (a body is at most
 * max_body_bytes, and a table takes at least two bytes of it). */
#define AGW_JSON_ENCODE_MAX_TABLES ((size_t)1 << 22)

/* Most bytes of text one encoding writes (256 MiB; the output buffer is C memory, outside
 * script_memory_limit_mb): a megabyte string a script put 3,000 times into a response made a 3 GB
 * page and held the worker 6 s in one C call. Checked before each value, so the text may pass it
 * by one value. */
#define AGW_JSON_ENCODE_MAX_BYTES ((size_t)256 << 20)

/* What a raw ref holds, as agw_json_check_raw_ref reads it: pointers into the ref's Lua strings,
 * valid while the ref is alive (the caller keeps it on the stack or reachable meanwhile). */
typedef struct {
    const char *text;  /* len bytes of validated JSON, then a NUL */
    size_t len;
    const char *extra; /* extra_len bytes the owner keeps with the text (an upstream response's
                          headers, see agw_json_push_raw_ref); NULL and 0 when none */
    size_t extra_len;
    int compact;       /* no whitespace outside strings: the text is its own compact encoding */
} agw_json_raw_t;

/* The reference parser (jansson; not on a request's path, see the top): parses len bytes of JSON
 * (any top-level value, "\u0000" allowed in strings). On success stores a
 * new reference in *out (caller json_decref()s it) and returns 0. On failure returns -1 and writes
 * a one-line reason to err: invalid JSON (with line/column), invalid UTF-8, nesting deeper than
 * max_depth, integer beyond int64, a NUL byte anywhere (jansson alone would stop at one after a
 * value, "[1\0]" read as [1]; the validator's message then). */
int agw_json_parse(const char *buf, size_t len, unsigned max_depth, json_t **out, char *err, size_t errlen);

/* Checks that len bytes are exactly one JSON text that agw_json_parse(buf, len, max_depth, ...)
 * would accept, in one pass over the bytes with no allocation: RFC 8259 grammar, any top-level
 * value with optional surrounding whitespace (space, tab, CR, LF); valid UTF-8 (no overlongs, no
 * UTF-8-encoded surrogates, nothing beyond U+10FFFF); no raw control characters (< 0x20) in
 * strings; \u escapes with 4 hex digits where a high surrogate escape must be followed by a low
 * one and a low one must not stand alone ("\u0000" is allowed in values, not in object keys, as
 * in jansson); integers (no fraction or
 * exponent) within int64; reals that do not overflow a double (underflow is fine, as in jansson);
 * at most max_depth nested arrays/objects (values above 2048, jansson's own limit, act as 2048).
 * Returns 0 and sets *compact (if compact is not NULL) to 1 when there is no whitespace outside
 * strings, so the text is already its compact encoding, else 0. Returns -1 with *compact = 0 and a
 * one-line reason in err (if err is not NULL) on failure; N is the 0-based offset of the offending
 * byte (or of the number's first byte):
 *   "invalid JSON at byte N: expected ..." (or "unterminated string", "leading zero in a number",
 *   "control character in string", "invalid escape", "lone surrogate in \u escape",
 *   "\u0000 in an object key", ...),
 *   "invalid UTF-8 at byte N", "nesting deeper than D levels", "integer beyond int64 at byte N",
 *   "number out of range at byte N". */
int agw_json_validate(const char *buf, size_t len, unsigned max_depth, int *compact, char *err, size_t errlen);

/* How many nodes the JSON text buf (len bytes, valid: agw_json_validate accepted it) holds, as an
 * upper bound: each value and each member name counts one (an empty array or object one more).
 * What turning it into Lua tables costs is about that many slots, tables and strings: a cap on it
 * bounds the Lua memory a client's body can make (1 MiB of "[{},{},…]" is 333,000 tables, about
 * 25 MB). Stops counting once past stop and returns stop + 1. One pass, no allocation. */
size_t agw_json_count_nodes(const char *buf, size_t len, size_t stop);

/* Pushes an int64 box holding n (agg.int64). */
void agw_json_push_int64(lua_State *L, int64_t n);

/* If the value at idx is an int64 box, stores its value in *out and returns 1, else returns 0. */
int agw_json_check_int64(lua_State *L, int idx, int64_t *out);

/* Pushes v as Lua values (tables, numbers, strings, agg.null, int64 boxes), recording object key
 * order. Does not steal the reference. Raises a Lua error only when the Lua stack or memory runs
 * out (v from agw_json_parse is at most AGW_JSON_MAX_DEPTH deep). */
void agw_json_push(lua_State *L, json_t *v);

/* Pushes a json ref userdata for v; takes its own reference (released by __gc). */
void agw_json_push_ref(lua_State *L, json_t *v);

/* If the value at idx is a tree ref, returns its json_t (borrowed), else NULL (raw refs included). */
json_t *agw_json_check_ref(lua_State *L, int idx);

/* Pushes a raw ref holding a copy of len bytes of JSON text that agw_json_validate accepted with a
 * max_depth of at most AGW_JSON_MAX_DEPTH; compact is the flag it returned (pass 0 when unsure:
 * the text is then re-encoded rather than copied). extra (extra_len bytes, may be NULL when 0)
 * is kept with the text and read back with json.raw_extra(ref), which makes the header block
 * of it (base/header.h): an upstream response's headers ride as they came (a pairs block, or a
 * header block) with its body, so a call whose headers no script reads costs no header block.
 * Makes the text's Lua string, the extra's when extra_len > 0, and one C closure (the top's
 * comment). Raises a Lua error only when memory runs out. */
void agw_json_push_raw_ref(lua_State *L, const char *buf, size_t len, int compact, const char *extra,
                           size_t extra_len);

/* Pushes the Lua values of text (len bytes, and a NUL at text[len]), which must be JSON that
 * agw_json_validate accepted with max_depth <= AGW_JSON_MAX_DEPTH (nothing is checked again). The
 * values are those agw_json_push gives for jansson's tree of the same text. Reads nothing past
 * text[len]. Needs the module opened in L. */
void agw_json_push_text(lua_State *L, const char *text, size_t len);

/* If the value at idx is a raw ref, fills *out (borrowed pointers: valid while the ref is alive;
 * the text is NUL-terminated) and returns 1; else returns 0 and leaves *out alone. Leaves the
 * stack as it found it; raises nothing. */
int agw_json_check_raw_ref(lua_State *L, int idx, agw_json_raw_t *out);

/* Returns 1 if the value at idx is a json ref of either kind, else 0. */
int agw_json_is_ref(lua_State *L, int idx);

/* Appends the compact JSON encoding of the Lua value at idx (json refs included) to out. Returns 0,
 * or -1 with a message naming the path of the offending value in err; out may then hold a
 * partial encoding that the caller discards. Uses the Lua stack (left as found) and raw table
 * access only, so no metamethod runs and no Lua error is raised. A table with the array metatable
 * encodes elements 1..#t (holes as null, other keys ignored). A raw ref is appended verbatim when
 * compact, else parsed with jansson and encoded like a tree ref (an invalid text, which
 * agw_json_push_raw_ref's contract rules out, is an error naming its path). Allocates nothing but
 * out's growth, plus a key array when one object has more than 64 keys not in a remembered order
 * and the json_t of a raw ref that is not compact. */
int agw_json_encode(lua_State *L, int idx, agw_buf_t *out, char *err, size_t errlen);

/* agw_json_encode with the text bounded by max_bytes (AGW_JSON_ENCODE_MAX_BYTES at most): past it
 * (by at most one value), -1 with "more than N bytes of JSON text" and out->len > max_bytes. */
int agw_json_encode_max(lua_State *L, int idx, agw_buf_t *out, size_t max_bytes, char *err, size_t errlen);

/* Appends the compact JSON encoding of an object given as rows, the Lua table at idx: a list
 * { key1, v1_1, …, v1_m, key2, v2_1, … } of rows of 1 + nmembers values (m = nmembers), read up to
 * the first nil key. It encodes as { "key1": { "members[0]": v1_1, …, "members[m-1]": v1_m }, … }:
 * the same bytes agw_json_encode gives for the table { key1 = setmetatable({ [members[0]] = v1_1,
 * … }, json.ordered(members)), … }, that is keys sorted bytewise, members in their order, nil
 * members left out, values encoded as agw_json_encode does (paths "$.key1.member…" in errors).
 * For a page (agg.page): the object is written without the tables of its members, so a section
 * whose data is a raw ref costs a few table reads, not a walk. Returns 0, or -1 with a message in
 * err: a key that is not a string ("row key not a string at $[i]", i the key's 0-based place in
 * the list), a key twice ("duplicate key at $.key"), or any error of agw_json_encode; out may then
 * hold a partial encoding. members: at most AGW_JSON_ROW_MEMBERS names of printable ASCII
 * without '"' or '\\' (written as they are; else the error "too many members" or "a member name
 * needs an escape"). Raw table access only (no Lua error, no metamethod); allocates nothing but
 * out's growth, plus a row array beyond 32 rows. */
#define AGW_JSON_ROW_MEMBERS 16
int agw_json_encode_rows(lua_State *L, int idx, const char *const *members, int nmembers, agw_buf_t *out, char *err,
                         size_t errlen);

/* Appends the compact JSON encoding of v (shortest reals, escaped "\u0000"). Reals always keep a
 * fraction or exponent ("1.0", not "1"), so an upstream real stays a real; integers print all
 * their digits. Strings are assumed valid UTF-8 (jansson checks them on load and in json_string());
 * one that is not (made with a _nocheck constructor) is written as null. */
void agw_json_encode_value(const json_t *v, agw_buf_t *out);

/* Returns the length of the valid UTF-8 sequence starting at s (n >= 1 bytes left), or 0 when it
 * is invalid: overlong, a surrogate, beyond U+10FFFF or truncated (RFC 3629 §4). */
size_t agw_utf8_seq(const unsigned char *s, size_t n);

/* Appends s (len bytes) as a JSON string literal with quotes. Returns -1 (having appended
 * nothing useful) if s is not valid UTF-8. */
int agw_json_encode_string(agw_buf_t *out, const char *s, size_t len);

/* Appends s (len bytes) as a JSON string literal or, when s is not valid UTF-8, the JSON text
 * fallback as it is ("null", "\"\"", "\"(not valid UTF-8)\""): for text the gateway did not make
 * (names, messages, file names) in a document that must stay valid JSON. */
void agw_json_encode_string_or(agw_buf_t *out, const char *s, size_t len, const char *fallback);

/* Appends the shortest decimal form of d that reads back to d ("4.6", "1e+300", "0.1"). Integral
 * values below 2^53 print without a fraction ("89"). Negative zero prints as "-0.0": "-0" would
 * read back as the integer 0 in jansson and many other parsers, losing the sign. NaN and
 * infinities append "null". Assumes the C locale for LC_NUMERIC (the gateway never changes it). */
void agw_json_encode_number(agw_buf_t *out, double d);

/* Opens the "agg.json" Lua module and leaves its table on the stack:
 *   null, array([t]), is_array(t), int64(string|number), is_int64(v), setorder(t, keys) -> t,
 *   decode(s [, max_nodes]) -> value | nil, err (max_nodes: when s holds more nodes,
 *   agw_json_count_nodes, nil and "more than N values and member names"),
 *   encode(v) -> string | nil, err, materialize(ref) -> value,
 *   parse(s) -> raw ref | nil, err (validates with AGW_JSON_MAX_DEPTH, parses nothing),
 *   encode_rows(rows, members) -> string | nil, err (agw_json_encode_rows; members a list of
 *   at most AGW_JSON_ROW_MEMBERS strings),
 *   raw(ref) -> string (the text of a raw ref; raises for anything else), is_ref(v) -> boolean.
 *   array(t) sets the array metatable on t and returns it; array() returns a new empty array.
 *   int64 takes a decimal string ("-42", no spaces or sign '+') or an integral number in int64
 *   range and raises an error otherwise; boxes compare (== < <=) only with other boxes, as Lua 5.1
 *   comparisons between different types do. setorder records a copy of keys (strings; duplicates
 *   dropped; raises on a non-string) as t's key order; setorder(t, nil) forgets it. decode uses
 *   AGW_JSON_MAX_DEPTH. decode validates with agw_json_validate and makes the values with agw_json_push_text (no
 *   jansson). materialize returns any value that is not a json ref unchanged; on a raw ref it
 *   makes new Lua values of the text with agw_json_push_text each time it is called.
 * Opening it again in the same lua_State reuses the state's metatables and order table, so values
 * made through either module table are interchangeable. Usable as a lua_CFunction for
 * package.preload. */
int agw_json_open(lua_State *L);

#endif
