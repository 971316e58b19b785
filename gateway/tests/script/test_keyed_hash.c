/* Unit tests: agg.sys keyed_hash (script/script.c): SipHash-2-4 under a key drawn per process, so
 * that a client cannot compute where a key's bits fall in agg.cache's filter of keys known missing. */
#include <lauxlib.h>
#include <lualib.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"
#include "script/script.h"

/* keyed_hash(s) in a fresh VM: h1 and h2 as one 64-bit number; 0 on failure. */
static uint64_t keyed(const char *s, size_t len)
{
    lua_State *L = luaL_newstate();
    agw_sys_open(L);
    lua_getfield(L, -1, "keyed_hash");
    lua_pushlstring(L, s, len);
    uint64_t v = 0;
    if (lua_pcall(L, 1, 2, 0) == 0)
        v = (uint64_t)lua_tonumber(L, -2) << 32 | (uint64_t)lua_tonumber(L, -1);
    else
        fprintf(stderr, "keyed_hash: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return v;
}

/* keyed_hash("x") computed in a child process (a process of its own: its own key). */
static uint64_t keyed_in_child(void)
{
    int p[2];
    if (pipe(p) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t v = keyed("x", 1);
        ssize_t n = write(p[1], &v, sizeof(v));
        _exit(n == (ssize_t)sizeof(v) ? 0 : 1);
    }
    close(p[1]);
    uint64_t v = 0;
    if (read(p[0], &v, sizeof(v)) != (ssize_t)sizeof(v))
        v = 0;
    close(p[0]);
    waitpid(pid, NULL, 0);
    return v;
}

static void test_the_key_is_drawn_per_process(void)
{
    /* the children run before this process draws its own key (pthread_once after fork) */
    uint64_t a = keyed_in_child(), b = keyed_in_child();
    CHECK(a != 0 && b != 0);
    CHECK(a != b);
    uint64_t here = keyed("x", 1);
    CHECK(here != a && here != b);
    CHECK(keyed("x", 1) == here); /* one key for the process: every VM agrees */
}

static void test_values(void)
{
    char big[70000];
    memset(big, 'k', sizeof(big));
    uint64_t v1 = keyed("agw:{product}:1:GET /products/7", 31), v2 = keyed("agw:{product}:1:GET /products/8", 31);
    CHECK(v1 != 0 && v2 != 0 && v1 != v2);
    CHECK((v1 & 1) == 1 && (v2 & 1) == 1); /* h2 odd */
    CHECK(keyed("", 0) != 0);
    CHECK(keyed(big, sizeof(big)) != keyed(big, sizeof(big) - 1));
}

/* keyed_hash of "agw:a" and "agw:b" taken one after the other 1,000 times on the calling thread
 * (its one context, keyed again at every call), into out[0] and out[1]; 0s when they ever differ. */
static void *alternate(void *arg)
{
    uint64_t *out = arg, first[2] = {0, 0};
    lua_State *L = luaL_newstate();
    agw_sys_open(L);
    for (int i = 0; i < 2000; i++) {
        lua_getfield(L, -1, "keyed_hash");
        lua_pushstring(L, i % 2 ? "agw:b" : "agw:a");
        if (lua_pcall(L, 1, 2, 0) != 0) {
            first[0] = first[1] = 0;
            break;
        }
        uint64_t v = (uint64_t)lua_tonumber(L, -2) << 32 | (uint64_t)lua_tonumber(L, -1);
        lua_pop(L, 2);
        if (i < 2)
            first[i] = v;
        else if (v != first[i % 2]) {
            first[0] = first[1] = 0;
            break;
        }
    }
    lua_close(L);
    out[0] = first[0], out[1] = first[1];
    return NULL;
}

static void test_each_thread_keys_its_context_again(void)
{
    /* a context used again gives each string its own value every time, and a thread's context
     * gives the values of another's (one key per process) */
    uint64_t here[2], there[2];
    alternate(here);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, alternate, there) == 0);
    pthread_join(t, NULL);
    CHECK(here[0] != 0 && here[1] != 0 && here[0] != here[1]);
    CHECK(there[0] == here[0] && there[1] == here[1]);
    CHECK(keyed("agw:a", 5) == here[0]);
}

int main(void)
{
    RUN(test_the_key_is_drawn_per_process);
    RUN(test_values);
    RUN(test_each_thread_keys_its_context_again);
    return CHECK_DONE();
}
