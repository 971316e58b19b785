/* log.c: the error log (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

void agw_log(agw_log_level_t level, const char *fmt, ...)
{
    static const char *names[] = {"info", "warn", "error"};
    char line[8192];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000), names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof(line) - (size_t)n - 1 ? (size_t)m : sizeof(line) - (size_t)n - 2));
    line[len++] = '\n';
    ssize_t wr = write(2, line, len);
    (void)wr;
}
