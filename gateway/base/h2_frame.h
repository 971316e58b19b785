/* h2_frame.h: the length field of an HTTP/2 frame header, which the guard (guard/guard.c: the
 * frames a client sent, read ahead of h2o) and front/h2_head.c (the frames h2o wrote) read. */
#ifndef AGW_BASE_H2_FRAME_H
#define AGW_BASE_H2_FRAME_H

#include <stddef.h>
#include <stdint.h>

/* The payload length of the frame whose 9-byte header starts at p: its first 24 bits, big-endian
 * (RFC 9113 §4.1), in bytes. p must have at least 3 readable bytes. */
static inline size_t agw_h2_frame_length(const uint8_t *p)
{
    return (size_t)p[0] << 16 | (size_t)p[1] << 8 | p[2];
}

#endif
