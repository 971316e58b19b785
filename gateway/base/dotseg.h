/* dotseg.h: dot segments (RFC 3986 §3.3, §5.2.4) as an upstream may read them. A route parameter
 * that is one is refused (route/route_param.c: "/users/" .. id .. "/orders" must not reach
 * "/orders"), and so is an upstream request path that holds one (upstream/http1.c), whatever built
 * it (a query value, agg.escape, which leaves dots as they are).
 */
#ifndef AGW_BASE_DOTSEG_H
#define AGW_BASE_DOTSEG_H

#include <stddef.h>

/* Whether the path segment s (len bytes, percent-encoded as sent, no '/') is a dot segment as an
 * upstream may read it: one or two dots, each '.' or its escape %2E in either case (RFC 3986 §2.3:
 * the same character, which servers decode before they remove dot segments), making up the whole
 * segment or followed by ';' or its escape %3B (a path parameter, which servlet containers strip
 * before they resolve the dots: "..;jsessionid=1"; some decode the escape first). "...", ".a" and
 * "a.." are not. */
static inline int agw_dot_segment(const char *s, size_t len)
{
    size_t i = 0, dots = 0;
    while (i < len && dots < 3) {
        if (s[i] == '.') {
            i++;
        } else if (s[i] == '%' && i + 2 < len && s[i + 1] == '2' && (s[i + 2] == 'e' || s[i + 2] == 'E')) {
            i += 3;
        } else {
            break;
        }
        dots++;
    }
    return (dots == 1 || dots == 2) &&
           (i == len || s[i] == ';' ||
            (s[i] == '%' && i + 2 < len && s[i + 1] == '3' && (s[i + 2] == 'b' || s[i + 2] == 'B')));
}

#endif
