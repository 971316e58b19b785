/*
 * mock_buf.c -- growable byte buffer and allocation helpers for aggway-mock.
 *
 * The mock is a test tool: running out of memory is not a condition it tries to survive, so
 * the helpers abort with a message instead of making every caller check.
 */
#include "mock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "aggway-mock: out of memory (%zu bytes)\n", n);
    abort();
}

void *mock_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *mock_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *mock_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(mock_xmalloc(n), s, n);
}

void mock_buf_reserve(mock_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->data = mock_xrealloc(b->data, cap);
    b->cap = cap;
}

void mock_buf_append(mock_buf *b, const void *p, size_t n)
{
    mock_buf_reserve(b, n);
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void mock_buf_puts(mock_buf *b, const char *s)
{
    mock_buf_append(b, s, strlen(s));
}

void mock_buf_printf(mock_buf *b, const char *fmt, ...)
{
    va_list ap;
    mock_buf_reserve(b, 128); /* most calls fit: one pass */
    size_t room = b->cap - b->len;
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= room) {
        mock_buf_reserve(b, (size_t)n);
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void mock_buf_free(mock_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
