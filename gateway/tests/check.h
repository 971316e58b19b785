/* check.h: the few macros the C unit tests use. A test file defines test functions, lists them in
 * main() with RUN(), and exits non-zero when any CHECK failed. */
#ifndef AGW_CHECK_H
#define AGW_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);            \
            check_failures++;                                                                   \
        }                                                                                       \
    } while (0)

#define CHECK_STR(got, want)                                                                    \
    do {                                                                                        \
        const char *g_ = (got), *w_ = (want);                                                   \
        if (g_ == NULL || strcmp(g_, w_) != 0) {                                                \
            fprintf(stderr, "%s:%d: expected \"%s\", got \"%s\"\n", __FILE__, __LINE__, w_,      \
                    g_ ? g_ : "(null)");                                                         \
            check_failures++;                                                                   \
        }                                                                                       \
    } while (0)

#define RUN(fn)                                                                                 \
    do {                                                                                        \
        int before_ = check_failures;                                                           \
        fn();                                                                                   \
        fprintf(stderr, "%s %s\n", check_failures == before_ ? "ok  " : "FAIL", #fn);            \
    } while (0)

#define CHECK_DONE() (check_failures ? 1 : 0)

#endif
