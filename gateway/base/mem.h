/* mem.h: allocation, with the one out-of-memory rule of the whole program (docs/ARCHITECTURE.md
 * "Allocation failure"): these never return NULL. When the system cannot give the memory, the
 * process writes one line to stderr ("aggway: out of memory allocating N bytes") and aborts, as
 * Redis's zmalloc does; no caller checks for NULL or handles it in a way of its own. Memory is
 * freed with free(). Libraries that allocate for us (LuaJIT, jansson, OpenSSL, h2o) keep their own
 * behaviour. */
#ifndef AGW_MEM_H
#define AGW_MEM_H

#include <stddef.h>

/* Writes "aggway: out of memory allocating <size> bytes" and aborts. */
void agw_oom(size_t size) __attribute__((noreturn, cold));

/* malloc(size), never NULL (a size of 0 gives a valid pointer to free). */
void *agw_malloc(size_t size) __attribute__((malloc, returns_nonnull));

/* calloc(n, size), never NULL; n * size overflowing is out of memory too. */
void *agw_calloc(size_t n, size_t size) __attribute__((malloc, returns_nonnull));

/* realloc(p, size), never NULL (p stays valid until it returns). */
void *agw_realloc(void *p, size_t size) __attribute__((returns_nonnull));

/* strdup(s), never NULL. */
char *agw_strdup(const char *s) __attribute__((malloc, returns_nonnull));

/* The n bytes at s as a new NUL-terminated string (s need not be terminated), never NULL. */
char *agw_strndup(const char *s, size_t n) __attribute__((malloc, returns_nonnull));

/* agw_strdup(s), or NULL when s is NULL (an optional setting). */
char *agw_strdup_opt(const char *s);

#endif
