/* Unit test of the header block handed to Lua (agw_header_block, base/header.h): each
 * name once, lowercased, a repeated name's values joined with ", " in their order. And the
 * pairs block kept as the fields came (agw_header_pairs), made a header block when read
 * (agw_header_block_of_pairs). And a field name checked as a token (agw_header_is_token) and
 * lowercased in the same pass (agw_header_token_lower), against RFC 9110's list. */
#include "base/header.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    agw_header_block(&b, h, 5);
    CHECK_STR(show(&b), "accept=*/*;host=h;x-r=a, b, c;");
    agw_header_block(&b, h, 0);
    CHECK(b.len == 0);
    agw_buf_free(&b);
}

/* Up to 16 fields are sorted by insertion, more by qsort: both give the same block (the same
 * fields in another order and spelling, once 16 and once 17 of them). */
static void both_sorts_give_the_same_block(void)
{
    agw_header_t h[17] = {
        {"X-B", 3, "1", 1}, {"a-z", 3, "2", 1}, {"x-b", 3, "3", 1}, {"Accept", 6, "4", 1}, {"zz", 2, "5", 1},
        {"X-A", 3, "6", 1}, {"k", 1, "7", 1},   {"K", 1, "8", 1},   {"b", 1, "9", 1},      {"c", 1, "10", 2},
        {"d", 1, "11", 2},  {"e", 1, "12", 2},  {"f", 1, "13", 2},  {"g", 1, "14", 2},     {"h", 1, "15", 2},
        {"i", 1, "16", 2},  {"X-b", 3, "17", 2},
    };
    agw_buf_t b = AGW_BUF_INIT;
    agw_header_block(&b, h, 16);
    CHECK_STR(show(&b), "a-z=2;accept=4;b=9;c=10;d=11;e=12;f=13;g=14;h=15;i=16;k=7, 8;x-a=6;x-b=1, 3;zz=5;");
    agw_header_block(&b, h, 17);
    CHECK_STR(show(&b), "a-z=2;accept=4;b=9;c=10;d=11;e=12;f=13;g=14;h=15;i=16;k=7, 8;x-a=6;x-b=1, 3, 17;zz=5;");
    agw_buf_free(&b);
}

static void many_repeats_make_one_field(void)
{
    enum { N = 20000 };
    agw_header_t *h = malloc(N * sizeof(*h));
    for (int i = 0; i < N; i++)
        h[i] = (agw_header_t){"x-many", 6, i % 2 ? "1" : "0", 1};
    agw_buf_t b = AGW_BUF_INIT;
    agw_header_block(&b, h, N);
    /* "x-many\0" + N values of 1 byte joined by ", " + "\0" */
    CHECK(b.len == 7 + N + 2 * (N - 1) + 1);
    CHECK(strncmp(b.base + 7, "0, 1, 0, 1", 10) == 0);
    free(h);
    agw_buf_free(&b);
}

/* The pairs block keeps the fields as they came; the block made of it is the one made of the
 * fields; a block made of a block is itself; bytes after the last whole pair are left out. */
static void pairs_become_the_same_block(void)
{
    agw_header_t h[] = {
        {"X-R", 3, "a", 1}, {"host", 4, "h", 1}, {"x-r", 3, "b", 1}, {"Accept", 6, "*/*", 3}, {"E", 1, "", 0},
    };
    agw_buf_t pairs = AGW_BUF_INIT, b = AGW_BUF_INIT, again = AGW_BUF_INIT;
    agw_buf_puts(&pairs, "junk"); /* appended to, not emptied */
    agw_header_pairs(&pairs, h, 5);
    static const char want[] = "X-R\0a\0host\0h\0x-r\0b\0Accept\0*/*\0E\0"; /* and the literal's NUL: E's value */
    CHECK(pairs.len == 4 + sizeof(want));
    CHECK(memcmp(pairs.base + 4, want, sizeof(want)) == 0);
    agw_header_block_of_pairs(&b, pairs.base + 4, pairs.len - 4);
    CHECK_STR(show(&b), "accept=*/*;e=;host=h;x-r=a, b;");
    agw_header_block_of_pairs(&again, b.base, b.len);
    CHECK(again.len == b.len && memcmp(again.base, b.base, b.len) == 0);
    agw_header_block_of_pairs(&again, pairs.base + 4, pairs.len - 4 - 2); /* "E\0" cut: no value */
    CHECK_STR(show(&again), "accept=*/*;host=h;x-r=a, b;");
    agw_header_block_of_pairs(&again, "", 0);
    CHECK(again.len == 0);
    agw_header_pairs(&pairs, h, 0);
    agw_buf_free(&pairs);
    agw_buf_free(&b);
    agw_buf_free(&again);
}

/* More fields than the stack's array of 64: the same block as made from the fields. */
static void many_pairs(void)
{
    enum { N = 300 };
    agw_header_t h[N];
    char names[N][8];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "N%d", i % 100);
        h[i] = (agw_header_t){names[i], strlen(names[i]), i % 2 ? "odd" : "even", i % 2 ? 3 : 4};
    }
    agw_buf_t pairs = AGW_BUF_INIT, a = AGW_BUF_INIT, b = AGW_BUF_INIT;
    agw_header_pairs(&pairs, h, N);
    agw_header_block_of_pairs(&a, pairs.base, pairs.len);
    agw_header_block(&b, h, N);
    CHECK(a.len == b.len && memcmp(a.base, b.base, a.len) == 0);
    agw_buf_free(&pairs);
    agw_buf_free(&a);
    agw_buf_free(&b);
}

/* Every byte inside a name: a token character exactly when RFC 9110 §5.6.2 says so (its list,
 * written out here), with the same verdict from agw_header_is_token and agw_header_token_lower,
 * and a token's letters lowercased (the one pass a script's response header names take). */
static void a_name_is_lowercased_as_a_token(void)
{
    static const char tchars[] = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    char out[16];
    for (int c = 0; c < 256; c++) {
        char name[3] = {'X', (char)c, 'y'};
        int is_tchar = c != 0 && memchr(tchars, c, sizeof(tchars) - 1) != NULL;
        CHECK(agw_header_is_token(name, 3) == is_tchar);
        CHECK(agw_header_token_lower(name, 3, out) == is_tchar);
        if (is_tchar) {
            CHECK(out[0] == 'x' && out[2] == 'y');
            CHECK(out[1] == (c >= 'A' && c <= 'Z' ? c | 0x20 : c));
        }
    }
    CHECK(agw_header_token_lower("Cache-Control", 13, out) == 1);
    CHECK(memcmp(out, "cache-control", 13) == 0);
    CHECK(agw_header_token_lower("", 0, out) == 0);              /* empty: not a token */
    CHECK(agw_header_token_lower("X-A b", 5, out) == 0);         /* a space */
    CHECK(agw_header_token_lower("X-\xc3\xa9", 4, out) == 0);   /* non-ASCII */
    CHECK(agw_header_token_lower("a\0b", 3, out) == 0);          /* NUL inside */
}

int main(void)
{
    RUN(a_name_is_lowercased_as_a_token);
    RUN(repeated_names_are_joined_in_order_once_per_name);
    RUN(both_sorts_give_the_same_block);
    RUN(many_repeats_make_one_field);
    RUN(pairs_become_the_same_block);
    RUN(many_pairs);
    return CHECK_DONE();
}
