/* mem.c: allocation that never returns NULL (see mem.h). */
#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void agw_oom(size_t size)
{
    char line[80];
    int n = snprintf(line, sizeof(line), "aggway: out of memory allocating %zu bytes\n", size);
    if (n > 0 && write(2, line, (size_t)n) < 0) {
        /* nothing more can be said */
    }
    abort();
}

void *agw_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        agw_oom(size);
    return p;
}

void *agw_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        agw_oom(n * size);
    return p;
}

void *agw_realloc(void *p, size_t size)
{
    void *q = realloc(p, size ? size : 1);
    if (q == NULL)
        agw_oom(size);
    return q;
}

char *agw_strdup_opt(const char *s)
{
    return s ? agw_strdup(s) : NULL;
}

char *agw_strndup(const char *s, size_t n)
{
    char *d = agw_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *agw_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = agw_malloc(n);
    memcpy(d, s, n);
    return d;
}
