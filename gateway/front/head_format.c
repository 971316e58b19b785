/* head_format.c: the first lines of an HTTP/1.1 response head written without printf
 * (head_format.h). */
#include "front/head_format.h"
#include "front/interpose.h"

#include <stdint.h>
#include <string.h>

/* glibc's checked vsprintf (the function its own __sprintf_chk calls, exported since 2.3.4):
 * declared here, <stdio.h> declares it only for fortified builds. */
extern int __vsprintf_chk(char *s, int flag, size_t slen, const char *fmt, va_list ap);

/* The definition libh2o's calls reach (head_format.h). Declared here: defined in this file only;
 * exported whatever the build's default visibility (the interposition needs it in the dynamic
 * symbol table). */
__attribute__((visibility("default"))) int __sprintf_chk(char *s, int flag, size_t slen, const char *fmt, ...);

static const char with_length[] = AGW_HEAD_FORMAT_LENGTH;
static const char no_length[] = AGW_HEAD_FORMAT_NO_LENGTH;

int agw_head_format_kind(const char *fmt)
{
    /* compared by content on every call: a pointer remembered from an earlier call could name
     * freed memory that another format has taken since. Both formats begin with the no-length
     * one; the first byte tells most other formats apart. */
    if (fmt == NULL || fmt[0] != 'H' || strncmp(fmt, no_length, sizeof(no_length) - 1) != 0)
        return 0;
    if (fmt[sizeof(no_length) - 1] == '\0')
        return 1;
    return strcmp(fmt + sizeof(no_length) - 1, with_length + sizeof(no_length) - 1) == 0 ? 2 : 0;
}

/* Writes v in decimal at the end of the 24-byte buffer ending at end; returns where it begins. */
static char *decimal(char *end, uintmax_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

/* Appends n bytes of src at p and moves p past them (the room was counted before). */
#define PUT(src, n)                                                                                 \
    do {                                                                                            \
        memcpy(p, (src), (n));                                                                      \
        p += (n);                                                                                   \
    } while (0)
#define PUT_LIT(lit) PUT(lit, sizeof(lit) - 1)

int agw_head_format(char *s, size_t size, int kind, va_list ap)
{
    int status = va_arg(ap, int);
    const char *str[3];
    size_t len[3];
    for (int i = 0; i < 3; i++) { /* reason, date, connection */
        str[i] = va_arg(ap, const char *);
        if (str[i] == NULL)
            str[i] = "(null)"; /* glibc's vsprintf prints a null %s so */
        len[i] = strlen(str[i]);
    }
    char nbuf[24], lbuf[24], *num, *lnum = NULL;
    /* (the magnitude as unsigned: INT_MIN has none as an int) */
    num = decimal(nbuf + sizeof(nbuf), status < 0 ? (uintmax_t)(0u - (unsigned)status) : (uintmax_t)status);
    if (status < 0)
        *--num = '-';
    size_t nlen = (size_t)(nbuf + sizeof(nbuf) - num), llen = 0;
    if (kind == 2) {
        lnum = decimal(lbuf + sizeof(lbuf), va_arg(ap, size_t));
        llen = (size_t)(lbuf + sizeof(lbuf) - lnum);
    }
    size_t total = sizeof("HTTP/1.1 ") - 1 + nlen + 1 + len[0] + sizeof("\r\nDate: ") - 1 + len[1] +
                   sizeof("\r\nConnection: ") - 1 + len[2] + 2;
    if (kind == 2)
        total += sizeof("Content-Length: ") - 1 + llen + 2;
    if (total >= size || total > INT32_MAX)
        return -1;
    char *p = s;
    PUT_LIT("HTTP/1.1 ");
    PUT(num, nlen);
    *p++ = ' ';
    PUT(str[0], len[0]);
    PUT_LIT("\r\nDate: ");
    PUT(str[1], len[1]);
    PUT_LIT("\r\nConnection: ");
    PUT(str[2], len[2]);
    PUT_LIT("\r\n");
    if (kind == 2) {
        PUT_LIT("Content-Length: ");
        PUT(lnum, llen);
        PUT_LIT("\r\n");
    }
    *p = '\0';
    return (int)total;
}

int __sprintf_chk(char *s, int flag, size_t slen, const char *fmt, ...)
{
    va_list ap;
    int n = -1, kind = agw_head_format_kind(fmt);
    va_start(ap, fmt);
    if (kind != 0) {
        va_list copy;
        va_copy(copy, ap);
        n = agw_head_format(s, slen, kind, copy);
        va_end(copy);
    }
    if (n < 0) /* another format, or one that does not fit: glibc's (whose check then fails) */
        n = __vsprintf_chk(s, flag, slen, fmt, ap);
    va_end(ap);
    return n;
}

int agw_head_format_active(void)
{
    return agw_interposed("__sprintf_chk", (void *)__sprintf_chk);
}
