/* log.h: the error log: one line per event on stderr, "2026-11-29T22:57:21.123Z level message".
 * Thread-safe (one write(2) per line). Under systemd, when stderr is the journal ($JOURNAL_STREAM
 * names it), each line starts with its syslog priority, "<6>" info, "<4>" warn, "<3>" error, which
 * journald takes off and keeps as the entry's priority.
 *
 * One event is one line, whatever its text carries: a message may hold a client's path, a script's
 * error (with a decoded %0A from a query) or an upstream's words, so every control character in it
 * is escaped (LF as \n, CR as \r, other C0 bytes, NUL and DEL as \xHH; TAB is kept). A line can
 * then never be forged by what the gateway was sent. */
#ifndef AGW_LOG_H
#define AGW_LOG_H

#include <stddef.h>

typedef enum agw_log_level { AGW_LOG_INFO, AGW_LOG_WARN, AGW_LOG_ERROR } agw_log_level_t;

/* Writes one line; the message is escaped as above and cut at 8 KiB. */
void agw_log(agw_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes one line of prefix (a NUL-terminated string) and text (len bytes, NULs included, e.g. a
 * Lua string), escaped as above and cut at 8 KiB. */
void agw_log_text(agw_log_level_t level, const char *prefix, const char *text, size_t len);

/* Copies s (len bytes) into out (cap bytes, NUL-terminated when cap > 0) with control characters
 * escaped as above, stopping before an escape that does not fit. Returns the bytes written. */
size_t agw_log_escape(char *out, size_t cap, const char *s, size_t len);

/* Lines of the libraries' stderr logged per second at most (agw_log_capture_stdio_stderr). */
#define AGW_LOG_LIBRARY_LINES_PER_S 10

/* Sends what the libraries the gateway links write to stdio's stderr (libh2o 2.2.5 prints some
 * events there itself: "skipping frame (type:N)" for each HTTP/2 frame of an unknown type a
 * client sends, "failed to normalize path: `<the client's path>` …") through the error log: from
 * now on each line written to stderr becomes one warn line "library: <text>", escaped as above (a
 * client's bytes in it can no longer forge a line), cut at 8 KiB; past
 * AGW_LOG_LIBRARY_LINES_PER_S lines in a second the rest of that second's are counted, not
 * logged, and the next line logged says how many were left out. Replaces the
 * process's stderr FILE (glibc's fopencookie); the descriptor 2 itself is unchanged, so the
 * sanitizers' reports and the gateway's own lines still go straight to it. Call once, before the
 * threads start. Returns 0, or -1 when the stream cannot be made (stderr is left as it was). */
int agw_log_capture_stdio_stderr(void);

#endif
