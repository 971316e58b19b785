/* json.h: JSON between upstreams, Lua scripts and the page, with the fidelity rules of
 * DESIGN §2.3. Parsing is jansson's; encoding is ours (jansson's real formatting is not the
 * shortest round-trip form).
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
 * userdata, invalid UTF-8 and nesting deeper than AGW_JSON_MAX_DEPTH (this also catches cycles)
 * are errors naming the path ("$.product.data.tags[3]").
 *
 * A "json ref" is a userdata holding a parsed json_t that has not been turned into Lua tables; the
 * encoder writes it straight from the json_t, so sections a script never touches cost no Lua work.
 */
#ifndef AGW_JSON_H
#define AGW_JSON_H

#include <jansson.h>
#include <lua.h>
#include <stddef.h>

#include "buf.h"

/* Deepest nesting accepted when parsing an upstream body and when encoding. */
#define AGW_JSON_MAX_DEPTH 256

/* Parses len bytes of JSON (any top-level value, "\u0000" allowed in strings). On success stores a
 * new reference in *out (caller json_decref()s it) and returns 0. On failure returns -1 and writes
 * a one-line reason to err: invalid JSON (with line/column), invalid UTF-8, nesting deeper than
 * max_depth, integer beyond int64. */
int agw_json_parse(const char *buf, size_t len, unsigned max_depth, json_t **out, char *err, size_t errlen);

/* Pushes v as Lua values (tables, numbers, strings, agg.null, int64 boxes), recording object key
 * order. Does not steal the reference. */
void agw_json_push(lua_State *L, json_t *v);

/* Pushes a json ref userdata for v; takes its own reference (released by __gc). */
void agw_json_push_ref(lua_State *L, json_t *v);

/* If the value at idx is a json ref, returns its json_t (borrowed), else NULL. */
json_t *agw_json_check_ref(lua_State *L, int idx);

/* Appends the compact JSON encoding of the Lua value at idx (json refs included) to out. Returns 0,
 * or -1 with a message naming the path of the offending value in err; out may then hold a
 * partial encoding that the caller discards. Uses the Lua stack; does not raise Lua errors. */
int agw_json_encode(lua_State *L, int idx, agw_buf_t *out, char *err, size_t errlen);

/* Appends the compact JSON encoding of v (shortest reals, escaped "\u0000"). */
void agw_json_encode_value(const json_t *v, agw_buf_t *out);

/* Appends s (len bytes) as a JSON string literal with quotes. Returns -1 (having appended
 * nothing useful) if s is not valid UTF-8. */
int agw_json_encode_string(agw_buf_t *out, const char *s, size_t len);

/* Appends the shortest decimal form of d that reads back to d ("4.6", "1e+300", "0.1"). Integral
 * values below 2^53 print without a fraction ("89"). NaN and infinities append "null". */
void agw_json_encode_number(agw_buf_t *out, double d);

/* Opens the "agg.json" Lua module and leaves its table on the stack:
 *   null, array([t]), is_array(t), int64(string|number), is_int64(v), setorder(t, keys) -> t,
 *   decode(s) -> value | nil, err, encode(v) -> string | nil, err, materialize(ref) -> value.
 * Usable as a lua_CFunction for package.preload. */
int agw_json_open(lua_State *L);

#endif
