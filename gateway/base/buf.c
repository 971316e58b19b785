/* buf.c: growable byte buffer (see buf.h). */
#include "base/buf.h"

#include "base/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void agw_buf_reserve(agw_buf_t *b, size_t extra)
{
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = agw_realloc(b->base, cap);
    b->base = p;
    b->cap = cap;
}

void agw_buf_append(agw_buf_t *b, const void *p, size_t len)
{
    agw_buf_reserve(b, len);
    if (len)
        memcpy(b->base + b->len, p, len);
    b->len += len;
    b->base[b->len] = '\0';
}

void agw_buf_puts(agw_buf_t *b, const char *s)
{
    agw_buf_append(b, s, strlen(s));
}

void agw_buf_printf(agw_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        agw_buf_append(b, tmp, (size_t)n);
        return;
    }
    agw_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->base + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void agw_buf_reset(agw_buf_t *b)
{
    b->len = 0;
    if (b->base)
        b->base[0] = '\0';
}

void agw_buf_free(agw_buf_t *b)
{
    free(b->base);
    b->base = NULL;
    b->len = b->cap = 0;
}
