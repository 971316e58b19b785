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

void agw_log(agw_log_level_t level, const char *fmt, ...)
{
    static const char *names[] = {"info", "warn", "error"};
    static const char *priorities[] = {"<6>", "<4>", "<3>"}; /* LOG_INFO, LOG_WARNING, LOG_ERR */
    pthread_once(&journal_once, detect_journal);
    char line[8192];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%s%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s ", to_journal ? priorities[level] : "",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof(line) - (size_t)n - 1 ? (size_t)m : sizeof(line) - (size_t)n - 2));
    line[len++] = '\n';
    ssize_t wr = write(2, line, len);
    (void)wr;
}
