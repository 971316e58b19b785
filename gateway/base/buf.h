/* buf.h: a growable byte buffer, the one type every module uses to build output.
 *
 * A buffer owns its bytes (malloc'd). The bytes are always followed by a NUL that is not
 * counted in len, so base can be handed to C string functions when the content has no NUL.
 */
#ifndef AGW_BUF_H
#define AGW_BUF_H

#include <stddef.h>

typedef struct agw_buf {
    char *base;   /* bytes, NUL-terminated; NULL until the first append */
    size_t len;   /* bytes in use, not counting the terminating NUL */
    size_t cap;   /* bytes allocated */
} agw_buf_t;

#define AGW_BUF_INIT {NULL, 0, 0}

/* Makes room for at least extra more bytes. Aborts the process on allocation failure
 * (out of memory is not a condition the gateway can degrade from). */
void agw_buf_reserve(agw_buf_t *b, size_t extra);
/* Appends len bytes. */
void agw_buf_append(agw_buf_t *b, const void *p, size_t len);
/* Appends a NUL-terminated string. */
void agw_buf_puts(agw_buf_t *b, const char *s);
/* Appends printf-formatted text. */
void agw_buf_printf(agw_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Empties the buffer, keeping its allocation. */
void agw_buf_reset(agw_buf_t *b);
/* Frees the bytes; the buffer is AGW_BUF_INIT afterwards. */
void agw_buf_free(agw_buf_t *b);

static inline void agw_buf_putc(agw_buf_t *b, char c)
{
    if (b->len + 2 > b->cap)
        agw_buf_reserve(b, 1);
    b->base[b->len++] = c;
    b->base[b->len] = '\0';
}

#endif
