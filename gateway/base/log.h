/* log.h: the error log: one line per event on stderr, "2026-11-29T22:57:21.123Z level message".
 * Thread-safe (one write(2) per line). */
#ifndef AGW_LOG_H
#define AGW_LOG_H

typedef enum agw_log_level { AGW_LOG_INFO, AGW_LOG_WARN, AGW_LOG_ERROR } agw_log_level_t;

/* Writes one line; the message is truncated at 8 KiB. */
void agw_log(agw_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
