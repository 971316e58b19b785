/* log.c: the error log (see log.h). */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 8192

static pthread_once_t journal_once = PTHREAD_ONCE_INIT;
static int to_journal; /* stderr is systemd's journal stream: lines start with a <N> priority */

/* systemd sets JOURNAL_STREAM to "device:inode" of the stream it connects stderr to
 * (systemd.exec(5)); when stderr is still that stream, journald reads a leading "<N>" as the
 * line's syslog priority (sd-daemon(3)), so `journalctl -p warning` finds the warnings. */
static void detect_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0)
        to_journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

size_t agw_log_escape(char *out, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc = c == '\n' ? 'n' : c == '\r' ? 'r' : 0;
        size_t need = esc ? 2 : (c < 0x20 && c != '\t') || c == 0x7f ? 4 : 1;
        if (n + need >= cap)
            break;
        if (esc) {
            out[n++] = '\\';
            out[n++] = esc;
        } else if (need == 4) {
            out[n++] = '\\';
            out[n++] = 'x';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        } else {
            out[n++] = (char)c;
        }
    }
    if (cap)
        out[n] = '\0';
    return n;
}

/* Writes "time level " + prefix + text (len bytes, escaped) + "\n" in one write(2). */
static void write_line(agw_log_level_t level, const char *prefix, size_t plen, const char *text, size_t len)
{
    static const char *names[] = {"info", "warn", "error"};
    static const char *priorities[] = {"<6>", "<4>", "<3>"}; /* LOG_INFO, LOG_WARNING, LOG_ERR */
    pthread_once(&journal_once, detect_journal);
    char line[LINE_MAX_BYTES + 16];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int h = snprintf(line, sizeof(line), "%s%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s ", to_journal ? priorities[level] : "",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), names[level]);
    size_t n = h < 0 ? 0 : (size_t)h;
    n += agw_log_escape(line + n, LINE_MAX_BYTES - n, prefix, plen);
    n += agw_log_escape(line + n, LINE_MAX_BYTES - n, text, len);
    line[n++] = '\n';
    ssize_t wr = write(2, line, n);
    (void)wr;
}

void agw_log(agw_log_level_t level, const char *fmt, ...)
{
    char msg[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t len = m < 0 ? 0 : (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
    write_line(level, "", 0, msg, len);
}

void agw_log_text(agw_log_level_t level, const char *prefix, const char *text, size_t len)
{
    size_t plen = 0;
    while (prefix[plen])
        plen++;
    write_line(level, prefix, plen, text, len);
}

/* ---- stdio's stderr ------------------------------------------------------------------------- */

/* What was written to the captured stderr since its last newline, and the lines of the current
 * second. stdio calls the stream's write function with the stream locked, so one writer at a time
 * touches them. */
static char pending[LINE_MAX_BYTES];
static size_t pending_len;
static time_t window_s;        /* the second (CLOCK_MONOTONIC) the count is of */
static unsigned window_lines;  /* lines logged in it */
static unsigned long dropped;  /* lines left out since the last one logged */

/* One line of the libraries, unless more than AGW_LOG_LIBRARY_LINES_PER_S came this second: libh2o
 * writes a line for each HTTP/2 frame of an unknown type ("skipping frame (type:32)"), so a client
 * could otherwise write the log at the rate it sends 9-byte frames. */
static void library_line(const char *text, size_t len)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec != window_s) {
        window_s = now.tv_sec;
        window_lines = 0;
    }
    if (window_lines >= AGW_LOG_LIBRARY_LINES_PER_S) {
        dropped++;
        return;
    }
    window_lines++;
    if (dropped) {
        agw_log(AGW_LOG_WARN, "library: %lu lines left out (more than %d a second)", dropped,
                AGW_LOG_LIBRARY_LINES_PER_S);
        dropped = 0;
    }
    agw_log_text(AGW_LOG_WARN, "library: ", text, len);
}

static ssize_t on_stderr_write(void *cookie, const char *buf, size_t size)
{
    (void)cookie;
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == '\n' || pending_len == sizeof(pending)) {
            library_line(pending, pending_len);
            pending_len = 0;
            if (buf[i] == '\n')
                continue;
        }
        pending[pending_len++] = buf[i];
    }
    return (ssize_t)size;
}

int agw_log_capture_stdio_stderr(void)
{
    cookie_io_functions_t io = {.write = on_stderr_write};
    FILE *f = fopencookie(NULL, "w", io);
    if (f == NULL)
        return -1;
    setvbuf(f, NULL, _IOLBF, 0); /* a line at a time, as it is written */
    fflush(stderr);
    stderr = f;
    return 0;
}
