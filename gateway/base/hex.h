/* hex.h: hexadecimal digits (RFC 3986 §2.1 HEXDIG, either case): percent-decoding route
 * parameters (route/route_param.c), API key digests (edge/apikeys.c). W3C Trace Context ids
 * allow lowercase only and keep their own reader (ops/trace.c).
 */
#ifndef AGW_BASE_HEX_H
#define AGW_BASE_HEX_H

/* The value of hex digit c (0-9, a-f, A-F), or -1 when c is not one. */
static inline int agw_hex_digit(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
