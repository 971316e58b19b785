/* test_mem_pool.c: h2o's memory pools with a 2 KB first chunk (front/mem_pool.h): the chunks'
 * sizes, the alignment and rounding, large blocks, shared references, clearing, and that libh2o's
 * own calls (h2o_strdup, h2o_mem_alloc_shared) come here. Every allocation is written in full and
 * read back, so the ASan/UBSan build reports any overlap or overflow. */
#include "../check.h"
#include "front/mem_pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void interposed(void)
{
    CHECK(agw_mem_pool_active() == 1);
}

static void the_first_two_chunks_are_2_kb_and_the_next_ones_h2os(void)
{
    h2o_mem_pool_t pool;
    h2o_mem_init_pool(&pool); /* (libh2o's) */
    CHECK(agw_mem_pool_chunk_bytes(&pool) == 0);
    char *first = h2o_mem_alloc_pool(&pool, 100);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    memset(first, 'a', 100);
    /* 2,032 bytes in all fit the first chunk: 100 (112 rounded) + 15 x 128 = 2,032 */
    for (int i = 0; i < 15; i++)
        memset(h2o_mem_alloc_pool(&pool, 128), 'b', 128);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    CHECK(pool.chunk_offset == AGW_MEM_POOL_FIRST_BLOCK - 16);
    memset(h2o_mem_alloc_pool(&pool, 1), 'c', 1); /* the next byte takes a second small chunk */
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    CHECK(pool.chunk_offset == 16);
    for (int i = 0; i < 15; i++) /* 16 + 15 x 128 + 96 = 2,032: that one full */
        memset(h2o_mem_alloc_pool(&pool, 128), 'd', 128);
    memset(h2o_mem_alloc_pool(&pool, 96), 'e', 96);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    memset(h2o_mem_alloc_pool(&pool, 1), 'f', 1); /* the third: h2o's size, as every later one */
    CHECK(agw_mem_pool_chunk_bytes(&pool) == 4096 - 16);
    CHECK(pool.chunk_offset == 16);
    for (int i = 0; i < 40; i++)
        memset(h2o_mem_alloc_pool(&pool, 128), 'g', 128);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == 4096 - 16);
    CHECK(first[0] == 'a' && first[99] == 'a');
    h2o_mem_clear_pool(&pool);
}

static void allocations_are_16_byte_aligned_rounded_and_apart(void)
{
    h2o_mem_pool_t pool;
    h2o_mem_init_pool(&pool);
    enum { N = 400 };
    unsigned char *p[N];
    size_t len[N];
    for (int i = 0; i < N; i++) {
        len[i] = (size_t)(i * 37) % 1019; /* 0 to 1,018: every one from a chunk */
        p[i] = h2o_mem_alloc_pool(&pool, len[i]);
        CHECK(((uintptr_t)p[i] & 15) == 0);
        memset(p[i], i & 0xff, len[i]);
    }
    for (int i = 0; i < N; i++) {
        for (size_t k = 0; k < len[i]; k++)
            if (p[i][k] != (i & 0xff)) {
                CHECK(!"an allocation was overwritten");
                break;
            }
        for (int j = 0; j < i; j++) /* (0 bytes still get 16 of their own) */
            CHECK(p[i] != p[j]);
    }
    h2o_mem_clear_pool(&pool);
}

static void a_large_allocation_is_a_block_of_its_own(void)
{
    h2o_mem_pool_t pool;
    h2o_mem_init_pool(&pool);
    memset(h2o_mem_alloc_pool(&pool, 10), 'x', 10);
    size_t used = pool.chunk_offset;
    char *big = h2o_mem_alloc_pool(&pool, 1020); /* a quarter of h2o's chunk's 4,080 bytes */
    char *bigger = h2o_mem_alloc_pool(&pool, 100000);
    memset(big, 'y', 1020);
    memset(bigger, 'z', 100000);
    CHECK(pool.chunk_offset == used && pool.directs != NULL);
    CHECK(((uintptr_t)big & 15) == 0 && ((uintptr_t)bigger & 15) == 0);
    char *small = h2o_mem_alloc_pool(&pool, 1019); /* one byte less: from the chunk */
    memset(small, 'w', 1019);
    CHECK(pool.chunk_offset == used + 1024);
    h2o_mem_clear_pool(&pool); /* (the ASan build reports the blocks if they are not freed: its
                                  leak check is on for this test, CMakeLists.txt) */
}

static int disposed;

static void on_dispose(void *p)
{
    CHECK(memcmp(p, "shared", 6) == 0);
    disposed++;
}

/* libh2o's own functions allocate through the process's h2o_mem_alloc_pool: from this file's
 * chunks, which this file's clear frees with the shared references libh2o linked. */
static void libh2os_calls_come_here_and_clear_releases_what_they_made(void)
{
    h2o_mem_pool_t pool;
    h2o_mem_init_pool(&pool);
    h2o_iovec_t s = h2o_strdup(&pool, "a request's path", SIZE_MAX);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    CHECK(s.len == 16 && memcmp(s.base, "a request's path", 16) == 0);
    char *shared = h2o_mem_alloc_shared(&pool, 6, on_dispose); /* linked to the pool (its reference
                                                                  record from the pool's chunk) */
    memcpy(shared, "shared", 6);
    CHECK(pool.shared_refs != NULL);
    h2o_mem_pool_t other;
    h2o_mem_init_pool(&other);
    h2o_mem_link_shared(&other, shared); /* a second reference, from another pool */
    disposed = 0;
    h2o_mem_clear_pool(&pool);
    CHECK(disposed == 0); /* the other pool still holds it */
    CHECK(pool.chunks == NULL && pool.directs == NULL && pool.shared_refs == NULL);
    h2o_mem_clear_pool(&other);
    CHECK(disposed == 1);
}

static void a_cleared_pool_is_as_a_new_one_and_serves_again(void)
{
    h2o_mem_pool_t pool, fresh;
    h2o_mem_init_pool(&pool);
    h2o_mem_init_pool(&fresh);
    for (int i = 0; i < 100; i++)
        memset(h2o_mem_alloc_pool(&pool, 200), 'q', 200); /* several chunks */
    h2o_mem_alloc_pool(&pool, 5000);
    h2o_mem_clear_pool(&pool);
    CHECK(memcmp(&pool, &fresh, sizeof(pool)) == 0);
    memset(h2o_mem_alloc_pool(&pool, 64), 'r', 64);
    CHECK(agw_mem_pool_chunk_bytes(&pool) == AGW_MEM_POOL_FIRST_BLOCK - 16);
    h2o_mem_clear_pool(&pool);
    h2o_mem_clear_pool(&pool); /* (twice: nothing to free) */
    CHECK(memcmp(&pool, &fresh, sizeof(pool)) == 0);
}

int main(void)
{
    RUN(interposed);
    RUN(the_first_two_chunks_are_2_kb_and_the_next_ones_h2os);
    RUN(allocations_are_16_byte_aligned_rounded_and_apart);
    RUN(a_large_allocation_is_a_block_of_its_own);
    RUN(libh2os_calls_come_here_and_clear_releases_what_they_made);
    RUN(a_cleared_pool_is_as_a_new_one_and_serves_again);
    return CHECK_DONE();
}
