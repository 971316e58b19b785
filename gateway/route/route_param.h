/* route_param.h: what a route parameter may hold, and the patterns that narrow it.
 *
 * A parameter ({id} in "GET /product-page/{id}") is one path segment, handed to the script still
 * percent-encoded as the client sent it (router.h), so "/stock/" .. req.params.id can never gain a
 * '/', a '?' or a '#'. Before a script sees it, the segment must be made of RFC 3986 path
 * characters only (§3.3 pchar: unreserved, pct-encoded, sub-delims, ':' and '@'), and what it
 * decodes to must not hold '/', '?', '#', a control character (C0 or DEL) or bytes that are not
 * UTF-8, nor be a dot segment an upstream would resolve: "." or ".." in any spelling of the dots
 * ("%2e%2E", ".%2e"), alone or followed by ';' ("..;", a servlet container's path parameter).
 * Nor may it spell one value two ways, which would let "/users/%61dmin" reach through an open
 * "/users/{id}" the upstream path that a protected "/users/admin" guards, and make a cache key and
 * an upstream call per spelling of one resource:
 *   - no escaped unreserved character ("%61", "%2D", "%7e", either hex case): RFC 3986 §2.3 says
 *     producers should not make them and §6.2.2.2 that they are the character itself, which
 *     upstreams decode;
 *   - no ';', raw or as "%3B": a path parameter ("admin;x"), which servlet containers strip.
 * Other escapes ("%20", "%C3%A9", "%2B", "%25") are other characters and stay. A request whose
 * parameter breaks a rule is answered 400 (router.h; the router itself never matches a literal "."
 * or ".." to a parameter).
 *
 * A route may narrow a parameter with a pattern: "GET /product-page/{id:[0-9]+}". The pattern is
 * matched against the whole segment as sent (still percent-encoded; it is anchored at both ends),
 * in time linear in the segment's length whatever the pattern. The subset:
 *   [abc] [a-z0-9_] [^/]   a character class (ranges, ^ to negate; \ escapes ] - ^ \)
 *   x                      a literal character (a path character; \ escapes a special one)
 *   .                      any path character
 *   followed by one of     + (1 or more)  * (0 or more)  ? (0 or 1)  {n}  {n,}  {n,m} (n, m <= 255)
 * No groups, alternation, anchors or back-references. A request whose segment does not match is
 * not this route's (404 when no other route matches). */
#ifndef AGW_ROUTE_PARAM_H
#define AGW_ROUTE_PARAM_H

#include <stddef.h>

#define AGW_ROUTE_PATTERN_MAX_ATOMS 32 /* atoms (class or character, with its quantifier) per pattern */

/* Returns 1 when value (len bytes, percent-encoded as sent) may reach a script as a parameter
 * (the rules above: path characters but ';', whole UTF-8 escapes, no escaped unreserved character
 * or ';', no dot segment), 0 when the request must be refused with 400 (problem type
 * bad-route-parameter). Reads each byte once: a value without '%' costs a table look-up per byte. */
int agw_route_param_valid(const char *value, size_t len);

typedef struct agw_route_pattern agw_route_pattern_t;

/* Compiles pattern src (len bytes). Returns the pattern (free with agw_route_pattern_free), or
 * NULL with a message in err (errlen bytes, NUL-terminated) saying what is wrong and where, e.g.
 * "'[0-9+': a '[' is not closed". Aborts on allocation failure. */
agw_route_pattern_t *agw_route_pattern_compile(const char *src, size_t len, char *err, size_t errlen);

/* Returns 1 when the whole of value (len bytes) matches p, 0 when not. Linear in len. */
int agw_route_pattern_match(const agw_route_pattern_t *p, const char *value, size_t len);

/* Frees p (NULL is fine). */
void agw_route_pattern_free(agw_route_pattern_t *p);

#endif
