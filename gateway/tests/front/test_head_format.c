/* test_head_format.c: the HTTP/1.1 response head's first lines written without printf
 * (front/head_format.h) are vsprintf's bytes, and the process's __sprintf_chk is the one that
 * writes them, glibc's for every other format and for an output that does not fit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT, RTLD_DEFAULT */
#endif
#include "../check.h"
#include "front/head_format.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*sprintf_chk_fn)(char *, int, size_t, const char *, ...);

/* agw_head_format with its arguments written out. */
static int fmt_head(char *s, size_t size, int kind, ...)
{
    va_list ap;
    va_start(ap, kind);
    int n = agw_head_format(s, size, kind, ap);
    va_end(ap);
    return n;
}

/* A copy of fmt in memory of its own: a pointer the memo has not seen. */
static char *fresh(const char *fmt)
{
    char *p = strdup(fmt);
    return p;
}

static void interposed(void)
{
    CHECK(agw_head_format_active());
}

static void the_two_formats_are_told_from_others(void)
{
    char *with = fresh(AGW_HEAD_FORMAT_LENGTH), *without = fresh(AGW_HEAD_FORMAT_NO_LENGTH);
    CHECK(agw_head_format_kind(with) == 2);
    CHECK(agw_head_format_kind(with) == 2);
    CHECK(agw_head_format_kind(without) == 1);
    char *other = fresh(AGW_HEAD_FORMAT_LENGTH); /* the same text at another address */
    CHECK(agw_head_format_kind(other) == 2);
    CHECK(agw_head_format_kind(with) == 2);
    CHECK(agw_head_format_kind(NULL) == 0);
    CHECK(agw_head_format_kind("") == 0);
    CHECK(agw_head_format_kind("%d") == 0);
    CHECK(agw_head_format_kind("HTTP/1.1 %d %s\r\n") == 0);
    CHECK(agw_head_format_kind(AGW_HEAD_FORMAT_NO_LENGTH "X") == 0);
    CHECK(agw_head_format_kind(AGW_HEAD_FORMAT_LENGTH "X") == 0);
    CHECK(agw_head_format_kind("HTTP/1.0 %d %s\r\nDate: %s\r\nConnection: %s\r\n") == 0);
    CHECK(agw_head_format_kind("Server: %s\r\n") == 0);
    free(with), free(without), free(other);
}

/* A format is told by its text on every call: memory that held one of the two, freed and taken by
 * another format, is that other format (libh2o's are literals, but every fortified sprintf of the
 * process comes here). */
static void freed_memory_holding_another_format_is_that_format(void)
{
    sprintf_chk_fn ours = (sprintf_chk_fn)dlsym(RTLD_DEFAULT, "__sprintf_chk");
    CHECK(ours != NULL);
    if (ours == NULL)
        return;
    size_t size = sizeof(AGW_HEAD_FORMAT_LENGTH);
    char *fmt = malloc(size);
    memcpy(fmt, AGW_HEAD_FORMAT_LENGTH, size);
    char out[256];
    CHECK(ours(out, 1, sizeof(out), fmt, 200, "OK", "d", "close", (size_t)3) > 0);
    CHECK(agw_head_format_kind(fmt) == 2);
    free(fmt);
    char *other = malloc(size); /* (the allocator commonly gives the same block back) */
    snprintf(other, size, "value=%%d name=%%s");
    CHECK(agw_head_format_kind(other) == 0);
    CHECK(ours(out, 1, sizeof(out), other, 7, "x") == 14);
    CHECK_STR(out, "value=7 name=x");
    free(other);
}

/* Every combination below, both formats, against vsnprintf's bytes and count. */
static void the_bytes_are_vsprintfs(void)
{
    static char long_reason[3000];
    memset(long_reason, 'r', sizeof(long_reason) - 1);
    const int statuses[] = {0, 1, 9, 10, 99, 100, 200, 204, 404, 999, 1000, -1, -200, INT_MIN, INT_MAX};
    const char *volatile nul = NULL; /* (a null %s, which the compiler would warn of as a constant) */
    const char *reasons[] = {"OK", "", nul, "Not Found", long_reason, "caf\xc3\xa9"};
    const char *conns[] = {"keep-alive", "close", "upgrade"};
    const size_t lengths[] = {0, 1, 9, 10, 199, 1000000, (size_t)UINT32_MAX + 1, SIZE_MAX - 1, SIZE_MAX};
    const char *date = "Sun, 06 Dec 2026 16:36:11 GMT";
    static char got[4096], want[4096];
    int cases = 0;
    for (size_t a = 0; a < sizeof(statuses) / sizeof(*statuses); a++)
        for (size_t b = 0; b < sizeof(reasons) / sizeof(*reasons); b++)
            for (size_t c = 0; c < sizeof(conns) / sizeof(*conns); c++)
                for (size_t d = 0; d < sizeof(lengths) / sizeof(*lengths); d++) {
                    int w = snprintf(want, sizeof(want), AGW_HEAD_FORMAT_LENGTH, statuses[a], reasons[b], date,
                                     conns[c], lengths[d]);
                    int g = fmt_head(got, sizeof(got), 2, statuses[a], reasons[b], date, conns[c], lengths[d]);
                    CHECK(g == w && memcmp(got, want, (size_t)w + 1) == 0);
                    w = snprintf(want, sizeof(want), AGW_HEAD_FORMAT_NO_LENGTH, statuses[a], reasons[b], date,
                                 conns[c]);
                    g = fmt_head(got, sizeof(got), 1, statuses[a], reasons[b], date, conns[c]);
                    CHECK(g == w && memcmp(got, want, (size_t)w + 1) == 0);
                    cases += 2;
                }
    CHECK(cases == 15 * 6 * 3 * 9 * 2);
    /* a null date and connection too */
    int w = snprintf(want, sizeof(want), AGW_HEAD_FORMAT_LENGTH, 200, "OK", nul, nul, (size_t)5);
    int g = fmt_head(got, sizeof(got), 2, 200, "OK", nul, nul, (size_t)5);
    CHECK(g == w && strcmp(got, want) == 0);
}

/* The output and its NUL must fit: one byte short writes nothing and says so. */
static void an_output_that_does_not_fit_is_refused(void)
{
    char want[256], got[256];
    int w = snprintf(want, sizeof(want), AGW_HEAD_FORMAT_LENGTH, 200, "OK", "d", "close", (size_t)42);
    CHECK(w > 0);
    memset(got, '#', sizeof(got));
    CHECK(fmt_head(got, (size_t)w, 2, 200, "OK", "d", "close", (size_t)42) == -1);
    CHECK(got[0] == '#' && got[w - 1] == '#');
    CHECK(fmt_head(got, (size_t)w + 1, 2, 200, "OK", "d", "close", (size_t)42) == w);
    CHECK(strcmp(got, want) == 0);
    CHECK(fmt_head(got, 0, 1, 200, "OK", "d", "close") == -1);
}

/* The process's __sprintf_chk (what libh2o's calls reach) against glibc's own. */
static void the_process_sprintf_chk_writes_them_and_passes_the_rest(void)
{
    sprintf_chk_fn ours = (sprintf_chk_fn)dlsym(RTLD_DEFAULT, "__sprintf_chk");
    sprintf_chk_fn glibc = (sprintf_chk_fn)dlsym(RTLD_NEXT, "__sprintf_chk");
    CHECK(ours != NULL && glibc != NULL && ours != glibc);
    if (ours == NULL || glibc == NULL)
        return;
    char *fmt = fresh(AGW_HEAD_FORMAT_LENGTH);
    char got[512], want[512];
    int g = ours(got, 1, sizeof(got), fmt, 503, "Service Unavailable", "Sun, 06 Dec 2026 16:36:11 GMT", "close",
                 (size_t)123);
    int w = glibc(want, 1, sizeof(want), fmt, 503, "Service Unavailable", "Sun, 06 Dec 2026 16:36:11 GMT", "close",
                  (size_t)123);
    CHECK(g == w && strcmp(got, want) == 0);
    char *fmt1 = fresh(AGW_HEAD_FORMAT_NO_LENGTH);
    g = ours(got, 1, sizeof(got), fmt1, 101, "Switching Protocols", "Sun, 06 Dec 2026 16:36:11 GMT", "upgrade");
    w = glibc(want, 1, sizeof(want), fmt1, 101, "Switching Protocols", "Sun, 06 Dec 2026 16:36:11 GMT", "upgrade");
    CHECK(g == w && strcmp(got, want) == 0);
    free(fmt1);
    /* any other format is glibc's: h2o's Server line, and others */
    g = ours(got, 1, sizeof(got), "Server: %s\r\n", "aggway");
    CHECK(g == 16);
    CHECK_STR(got, "Server: aggway\r\n");
    g = ours(got, 1, sizeof(got), "%s=%x %5.2f %c%%", "k", 255u, 3.14159, 'z');
    CHECK(g == 13);
    CHECK_STR(got, "k=ff  3.14 z%");
    g = ours(got, 1, (size_t)-1, "%" PRIu64, (uint64_t)18446744073709551615u);
    CHECK_STR(got, "18446744073709551615");
    free(fmt);
}

/* An output longer than the caller's buffer stops the process, as glibc's check does (in a child,
 * whose stderr says why): glibc's "buffer overflow detected" and SIGABRT; in the ASan/UBSan build
 * the sanitizer's __vsprintf_chk, which the fallback reaches there, writes past the buffer and its
 * report stops the child (our own writing of a format that does not fit is refused before any
 * byte: an_output_that_does_not_fit_is_refused). */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static void an_overflow_still_stops_the_process(void)
{
    sprintf_chk_fn ours = (sprintf_chk_fn)dlsym(RTLD_DEFAULT, "__sprintf_chk");
    CHECK(ours != NULL);
    if (ours == NULL)
        return;
    const char *fmts[] = {AGW_HEAD_FORMAT_LENGTH, AGW_HEAD_FORMAT_NO_LENGTH, "%d %s, and the rest"};
    for (int i = 0; i < 3; i++) {
        int pipefd[2];
        CHECK(pipe(pipefd) == 0);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            close(pipefd[0]);
            dup2(pipefd[1], 2);
            char small[16];
            ours(small, 1, sizeof(small), fmts[i], 200, "OK", "Sun, 06 Dec 2026 16:36:11 GMT", "close", (size_t)1);
            _exit(0);
        }
        close(pipefd[1]);
        char said[8192];
        size_t n = 0;
        ssize_t r;
        while (n < sizeof(said) - 1 && (r = read(pipefd[0], said + n, sizeof(said) - 1 - n)) > 0)
            n += (size_t)r;
        said[n] = '\0';
        close(pipefd[0]);
        int st = 0;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
        if (SANITIZED) {
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
            CHECK(strstr(said, "stack-buffer-overflow") != NULL);
        } else {
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
            CHECK(strstr(said, "buffer overflow detected") != NULL);
        }
    }
}

int main(void)
{
    RUN(interposed);
    RUN(the_two_formats_are_told_from_others);
    RUN(freed_memory_holding_another_format_is_that_format);
    RUN(the_bytes_are_vsprintfs);
    RUN(an_output_that_does_not_fit_is_refused);
    RUN(the_process_sprintf_chk_writes_them_and_passes_the_rest);
    RUN(an_overflow_still_stops_the_process);
    return CHECK_DONE();
}
