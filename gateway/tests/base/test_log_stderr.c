/* test_log_stderr: what the libraries write to stdio's stderr reaches the error log as escaped,
 * rate-limited lines (base/log.h, agw_log_capture_stdio_stderr). */
#include "base/log.h"
#include "tests/check.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int saved_fd2 = -1;
static char captured_path[] = "/tmp/agw-test-log-stderr-XXXXXX";

/* Points descriptor 2 at a fresh file (what the log writes to); restore() puts it back. */
static void capture(void)
{
    int fd = mkstemp(captured_path);
    saved_fd2 = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Restores descriptor 2 and returns what was written to it (malloc'd, NUL-terminated). */
static char *restore(void)
{
    fflush(stderr);
    dup2(saved_fd2, 2);
    close(saved_fd2);
    FILE *f = fopen(captured_path, "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    unlink(captured_path);
    strcpy(captured_path, "/tmp/agw-test-log-stderr-XXXXXX");
    return strdup(buf);
}

static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* h2o's own words, with a client's bytes in them (as in "failed to normalize path: `…`"), cannot
 * forge a line: each line the library writes is a log line of its own, with the log's time and
 * level first and its control characters escaped (a newline in the client's bytes ends the
 * library's line: what follows is another "library:" line, never one that looks like the
 * gateway's own) */
static void test_a_library_line_with_control_characters_is_one_escaped_log_line(void)
{
    sleep(1); /* a fresh second of the rate limit */
    capture();
    fprintf(stderr, "failed to normalize path: `/x\r\x1b[31m\n2026-12-01T00:00:00.000Z error forged` => `/`\n");
    fprintf(stderr, "skipping frame ");    /* one line written in two calls */
    fprintf(stderr, "(type:%d)\n", 32);
    char *out = restore();
    CHECK(strstr(out, " warn library: failed to normalize path: `/x\\r\\x1b[31m\n") != NULL);
    CHECK(strstr(out, " warn library: 2026-12-01T00:00:00.000Z error forged` => `/`\n") != NULL);
    CHECK(strstr(out, " warn library: skipping frame (type:32)\n") != NULL);
    CHECK(count(out, "\n") == 3);
    CHECK(strstr(out, "\n2026-12-01T00:00:00.000Z error forged") == NULL && strncmp(out, "2026-12-01T00:00:00.000Z", 24) != 0);
    if (check_failures)
        fprintf(stderr, "got: %s\n", out);
    free(out);
}

/* a client that sends thousands of unknown frames does not write thousands of log lines */
static void test_library_lines_are_limited_per_second_and_the_rest_counted(void)
{
    sleep(1);
    capture();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 5000; i++)
        fprintf(stderr, "skipping frame (type:%d)\n", 32);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    sleep(1); /* the next second: the next line says how many were left out */
    fprintf(stderr, "after\n");
    char *out = restore();
    /* the 5,000 lines take milliseconds, but a busy machine may stretch them over seconds: each
     * second they touched allows its lines */
    size_t seconds = (size_t)(t1.tv_sec - t0.tv_sec) + 1, frames = count(out, "skipping frame");
    CHECK(frames >= AGW_LOG_LIBRARY_LINES_PER_S && frames <= seconds * AGW_LOG_LIBRARY_LINES_PER_S);
    CHECK(strstr(out, " lines left out (more than 10 a second)\n") != NULL);
    CHECK(strstr(out, " warn library: after\n") != NULL);
    if (check_failures)
        fprintf(stderr, "got %zu lines: %.2000s\n", frames, out);
    free(out);
}

int main(void)
{
    if (agw_log_capture_stdio_stderr() != 0) {
        fprintf(stderr, "cannot capture stderr\n");
        return 1;
    }
    RUN(test_a_library_line_with_control_characters_is_one_escaped_log_line);
    RUN(test_library_lines_are_limited_per_second_and_the_rest_counted);
    return CHECK_DONE();
}
