/* head_format.h: the first lines of an HTTP/1.1 response head written without printf.
 *
 * h2o 2.2.5 writes the start of every HTTP/1.1 response head (lib/http1.c, flatten_headers) with
 * one sprintf of a fixed format:
 *     "HTTP/1.1 %d %s\r\nDate: %s\r\nConnection: %s\r\nContent-Length: %zu\r\n"
 * or the same without the Content-Length line. Built with _FORTIFY_SOURCE, libh2o calls glibc's
 * __sprintf_chk for it, which goes through the whole of vfprintf: about 2,200 instructions a page,
 * three percent of a page's instructions (docs/performance.md, "A twenty-third pass").
 *
 * head_format.c defines __sprintf_chk in the executable, as read_pause.h does for libuv's
 * functions: libh2o calls it through its PLT, so the dynamic linker binds those calls here. A call
 * whose format is one of the two above (its text compared on every call, so every caller with that
 * format gets the same bytes) is written by agw_head_format; every other call goes to glibc's __vsprintf_chk
 * unchanged, as does one whose output would not fit the size the caller gave (glibc's check then
 * stops the process, as it would have). The bytes are vsprintf's, byte for byte: a %d in decimal
 * with its sign, a %s copied up to its NUL ("(null)" for a null pointer, as glibc prints it), a %zu
 * in decimal; the result ends with a NUL and the return is the count of bytes before it.
 * test_head_format compares both with vsnprintf. */
#ifndef AGW_FRONT_HEAD_FORMAT_H
#define AGW_FRONT_HEAD_FORMAT_H

#include <stdarg.h>
#include <stddef.h>

/* The formats written here: AGW_HEAD_FORMAT_LENGTH (status, reason, date, connection, content
 * length) and AGW_HEAD_FORMAT_NO_LENGTH (the same without the length). */
#define AGW_HEAD_FORMAT_LENGTH "HTTP/1.1 %d %s\r\nDate: %s\r\nConnection: %s\r\nContent-Length: %zu\r\n"
#define AGW_HEAD_FORMAT_NO_LENGTH "HTTP/1.1 %d %s\r\nDate: %s\r\nConnection: %s\r\n"

/* Which of the two formats fmt is: 2 (with the length), 1 (without), 0 (neither, or NULL). A
 * comparison of the text, at most the format's length, on every call (no pointer is remembered: the
 * memory of a format seen once may be freed and hold another later). Thread-safe. */
int agw_head_format_kind(const char *fmt);

/* Writes the format of kind (1 or 2, agw_head_format_kind) with ap's arguments into s, which has
 * room for size bytes. Returns the count of bytes written before the NUL, or -1 when they and the
 * NUL would not fit (nothing is then written; ap's arguments have been read). */
int agw_head_format(char *s, size_t size, int kind, va_list ap);

/* 1 when libh2o's calls of __sprintf_chk come here (the executable exports it), 0 when they go to
 * glibc's (every response head is then vsprintf's). main calls it once at start, which also makes
 * the linker take this file from the core library. */
int agw_head_format_active(void);

#endif
