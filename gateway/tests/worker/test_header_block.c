/* Unit test of the header block handed to Lua (agw_worker_header_block, worker_internal.h): each
 * name once, lowercased, a repeated name's values joined with ", " in their order. */
#include "worker/worker_internal.h"

#include <stdlib.h>

#include "tests/check.h"

/* The block "name\0value\0…" as "name=value;…", for comparing. */
static const char *show(const agw_buf_t *b)
{
    static char out[4096];
    size_t o = 0;
    for (size_t i = 0; i < b->len;) {
        const char *name = b->base + i, *value = name + strlen(name) + 1;
        o += (size_t)snprintf(out + o, sizeof(out) - o, "%s=%s;", name, value);
        i = (size_t)(value - b->base) + strlen(value) + 1;
    }
    out[o] = '\0';
    return out;
}

static void repeated_names_are_joined_in_order_once_per_name(void)
{
    agw_header_t h[] = {
        {"X-R", 3, "a", 1}, {"host", 4, "h", 1}, {"x-r", 3, "b", 1}, {"Accept", 6, "*/*", 3}, {"X-r", 3, "c", 1},
    };
    agw_buf_t b = AGW_BUF_INIT;
    agw_worker_header_block(&b, h, 5);
    CHECK_STR(show(&b), "accept=*/*;host=h;x-r=a, b, c;");
    agw_worker_header_block(&b, h, 0);
    CHECK(b.len == 0);
    agw_buf_free(&b);
}

static void many_repeats_make_one_field(void)
{
    enum { N = 20000 };
    agw_header_t *h = malloc(N * sizeof(*h));
    for (int i = 0; i < N; i++)
        h[i] = (agw_header_t){"x-many", 6, i % 2 ? "1" : "0", 1};
    agw_buf_t b = AGW_BUF_INIT;
    agw_worker_header_block(&b, h, N);
    /* "x-many\0" + N values of 1 byte joined by ", " + "\0" */
    CHECK(b.len == 7 + N + 2 * (N - 1) + 1);
    CHECK(strncmp(b.base + 7, "0, 1, 0, 1", 10) == 0);
    free(h);
    agw_buf_free(&b);
}

int main(void)
{
    RUN(repeated_names_are_joined_in_order_once_per_name);
    RUN(many_repeats_make_one_field);
    return CHECK_DONE();
}
