/* script.c: LuaJIT states and generation loading (see script.h). */
#include "script/script.h"

#include "base/heap.h"
#include "base/mem.h"

#include <dirent.h>
#include <errno.h>
#include <lauxlib.h>
#include <lualib.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "upstream/breaker.h"
#include "limits/gate.h"
#include "upstream/http1.h"
#include "base/file.h"
#include "deploy/runtime_dir.h"
#include "json/json.h"
#include "script/resp_headers.h"
#include "script/pattern.h"
#include "script/router.h"

const char *agw_lua_dir(void)
{
    return agw_runtime_dir();
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Collects *.lua below base/rel into list (relative paths). */
static void collect(const char *base, const char *rel, char ***list, size_t *n, size_t *cap, int depth)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s%s%s", base, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (d == NULL || depth > 16) {
        if (d)
            closedir(d);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4096];
        snprintf(sub, sizeof(sub), "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        char full[8192];
        snprintf(full, sizeof(full), "%s/%s", base, sub);
        struct stat st;
        if (stat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            if (depth == 0 && strcmp(e->d_name, "lib") == 0)
                continue;
            collect(base, sub, list, n, cap, depth + 1);
        } else if (S_ISREG(st.st_mode)) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 4, ".lua") != 0)
                continue;
            if (depth == 0 && strcmp(e->d_name, "gateway.lua") == 0)
                continue;
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 16;
                *list = agw_realloc(*list, *cap * sizeof(char *));
            }
            (*list)[(*n)++] = agw_strdup(sub);
        }
    }
    closedir(d);
}

static int l_listdir(lua_State *L)
{
    const char *dir = luaL_checkstring(L, 1);
    char **list = NULL;
    size_t n = 0, cap = 0;
    collect(dir, "", &list, &n, &cap, 0);
    if (n)
        qsort(list, n, sizeof(char *), cmp_str);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, list[i]);
        lua_rawseti(L, -2, (int)i + 1);
        free(list[i]);
    }
    free(list);
    return 1;
}

/* monotonic_s() -> seconds on CLOCK_MONOTONIC (a float; for measuring spans, e.g. how long a
 * script's top level has been running). */
static int l_monotonic_s(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

/* cpu_s() -> seconds of CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID; a float).
 * The spec harness times a script's work with it (lua/agg/testing_clock.lua): unlike real time it
 * does not grow while a busy machine deschedules the runner. */
static int l_cpu_s(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec / 1e9);
    return 1;
}

/* read_file(path, max) -> the first max bytes of the regular file at path ("" when it is empty),
 * or nil, why. The file must be a regular file (agw_file_open_regular): a FIFO, a device or a
 * directory is refused at once, never waited on or read without end. */
static int l_read_file(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    size_t max = (size_t)luaL_checkinteger(L, 2);
    const char *why = NULL;
    int fd = agw_file_open_regular(path, &why);
    /* max is the caller's limit, not a size the gateway needs: a buffer that cannot be had is an
     * answer to this call (nil, why), the one exception to base/mem.h's rule */
    char *buf = why ? NULL : malloc(max ? max : 1);
    size_t len = 0;
    if (why == NULL && buf == NULL)
        why = "out of memory";
    while (why == NULL && len < max) {
        ssize_t r = read(fd, buf + len, max - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            why = strerror(errno);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    if (why) {
        free(buf);
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushlstring(L, buf, len);
    free(buf);
    return 1;
}

/* call_invalid(method, path, headers) -> nil, or why the upstream client would refuse to send the
 * call (upstream/http1.h); headers is the runtime's flat list { name, value, … } or false. */
static int l_call_invalid(lua_State *L)
{
    const char *method = luaL_checkstring(L, 1);
    size_t path_len;
    const char *path = luaL_checklstring(L, 2, &path_len);
    agw_header_t hdrs[64];
    size_t n = 0;
    if (lua_istable(L, 3)) {
        size_t len = lua_objlen(L, 3);
        for (size_t i = 1; i + 1 <= len && n < sizeof(hdrs) / sizeof(hdrs[0]); i += 2, n++) {
            lua_rawgeti(L, 3, (int)i);
            lua_rawgeti(L, 3, (int)i + 1);
            hdrs[n].name = lua_tolstring(L, -2, &hdrs[n].name_len);
            hdrs[n].value = lua_tolstring(L, -1, &hdrs[n].value_len);
            lua_pop(L, 2); /* the strings stay alive: the table holds them */
            if (hdrs[n].name == NULL || hdrs[n].value == NULL)
                return luaL_error(L, "call_invalid: header names and values must be strings");
        }
    }
    const char *why = agw_h1_request_invalid(method, path, path_len, hdrs, n);
    if (why == NULL)
        return 0;
    lua_pushstring(L, why);
    return 1;
}

/* hash32(s) -> FNV-1a (32 bits) over s's bytes, finished with MurmurHash3's fmix32, as an unsigned
 * 32-bit number. agg.group's hash ring (its points and a call's key) and its endpoint ids, which
 * session tokens carry to clients: the function must never change. In C because a key may be a
 * client's header of 64 KB (hash_key = "header:…"): in Lua that took about 4 ms a request. */
static int l_hash32(lua_State *L)
{
    size_t len;
    const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ s[i]) * 16777619u;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    lua_pushnumber(L, (lua_Number)h);
    return 1;
}

/* The key of keyed_hash: 16 bytes drawn once per process, never shown; and OpenSSL's SipHash,
 * fetched once (NULL when OpenSSL has none). Both live as long as the process. */
static unsigned char keyed_hash_key[16];
static EVP_MAC *keyed_hash_mac;
static pthread_once_t keyed_hash_once = PTHREAD_ONCE_INIT;
/* Each thread's SipHash context, keyed again at every call (EVP_MAC_init): a context made and
 * freed per call cost about 1,800 instructions, three times a page of cache misses
 * (tools/bench/callgrind CACHE=miss). The thread's pointer is thread-local; the key's destructor
 * frees the context when the thread exits, so a worker, the admin thread or a test's thread keeps
 * nothing after it. */
static pthread_key_t keyed_hash_ctx_key;
static int keyed_hash_have_key;
static __thread EVP_MAC_CTX *keyed_hash_ctx;

static void keyed_hash_ctx_free(void *ctx)
{
    EVP_MAC_CTX_free(ctx);
}

static void keyed_hash_init(void)
{
    if (getrandom(keyed_hash_key, sizeof(keyed_hash_key), 0) != (ssize_t)sizeof(keyed_hash_key)) {
        /* (getrandom without flags fails only before the kernel's pool is ready, at boot) */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t a = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
        uint64_t b = a * 0xBF58476D1CE4E5B9ull ^ (uint64_t)(uintptr_t)&ts;
        memcpy(keyed_hash_key, &a, 8);
        memcpy(keyed_hash_key + 8, &b, 8);
    }
    keyed_hash_mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
    keyed_hash_have_key = pthread_key_create(&keyed_hash_ctx_key, keyed_hash_ctx_free) == 0;
}

/* The calling thread's SipHash context with an 8-byte output, made on its first call; NULL when
 * OpenSSL has no SipHash or is out of memory. */
static EVP_MAC_CTX *keyed_hash_thread_ctx(void)
{
    if (keyed_hash_ctx != NULL || keyed_hash_mac == NULL || !keyed_hash_have_key)
        return keyed_hash_ctx;
    size_t size = 8;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size), OSSL_PARAM_construct_end()};
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(keyed_hash_mac);
    if (ctx == NULL || !EVP_MAC_CTX_set_params(ctx, params) || pthread_setspecific(keyed_hash_ctx_key, ctx) != 0) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return keyed_hash_ctx = ctx;
}

/* keyed_hash(s) -> h1, h2: SipHash-2-4 (OpenSSL's EVP_MAC "SIPHASH", 64-bit output) of s's bytes
 * under a key drawn at random once per process, as two unsigned 32-bit numbers, h2 odd (so that
 * h1 + i * h2 walks every bit of a table whose size is a power of two: double hashing). For the
 * structures that clients' input fills and that must not be steerable by a client: agg.cache's
 * filter of keys known missing. With an unkeyed hash a client computed offline a handful of ids
 * whose 404s set every bit of a real item's key, and the item was answered 404 without the
 * upstream. One context per thread, keyed again at every call (nothing is kept per VM: a VM that
 * is never closed holds no OpenSSL memory). Raises when OpenSSL has no SipHash (a provider
 * configuration without it). */
static int l_keyed_hash(lua_State *L)
{
    size_t len, outl = 0;
    const char *s = luaL_checklstring(L, 1, &len);
    pthread_once(&keyed_hash_once, keyed_hash_init);
    unsigned char out[8];
    EVP_MAC_CTX *ctx = keyed_hash_thread_ctx();
    int ok = ctx != NULL && EVP_MAC_init(ctx, keyed_hash_key, sizeof(keyed_hash_key), NULL) &&
             EVP_MAC_update(ctx, (const unsigned char *)s, len) && EVP_MAC_final(ctx, out, &outl, sizeof(out)) &&
             outl == sizeof(out);
    if (!ok)
        return luaL_error(L, "keyed_hash: OpenSSL's SipHash is not available");
    uint32_t h1, h2;
    memcpy(&h1, out, 4);
    memcpy(&h2, out + 4, 4);
    lua_pushnumber(L, (lua_Number)h1);
    lua_pushnumber(L, (lua_Number)(h2 | 1u));
    return 2;
}

int agw_sys_open(lua_State *L)
{
    static const luaL_Reg fns[] = {{"call_invalid", l_call_invalid}, {"read_file", l_read_file},
                                   {"listdir", l_listdir},           {"monotonic_s", l_monotonic_s},
                                   {"hash32", l_hash32},             {"cpu_s", l_cpu_s},
                                   {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_pushcfunction(L, l_keyed_hash);
    lua_setfield(L, -2, "keyed_hash");
    return 1;
}

int agw_lua_source_is_runtime(const char *source)
{
    const char *dir = agw_lua_dir();
    if (dir == NULL || source == NULL)
        return 0;
    size_t n = strlen(dir);
    return source[0] == '@' && strncmp(source + 1, dir, n) == 0 && source[1 + n] == '/';
}

static void preload(lua_State *L, const char *name, lua_CFunction f)
{
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, f);
    lua_setfield(L, -2, name);
    lua_pop(L, 2);
}

lua_State *agw_vm_new(const char *scripts_dir)
{
    lua_State *L = agw_heap_new_lua_state();
    if (L == NULL)
        return NULL;
    agw_heap_lua_set_limit(agw_heap_lua_of(L), (size_t)AGW_SCRIPT_MEMORY_LIMIT_MB << 20);
    luaL_openlibs(L);
    const char *lua_dir = agw_lua_dir();
    const char *sdir = scripts_dir ? scripts_dir : ".";
    lua_getglobal(L, "package");
    if (lua_dir)
        lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s/?.lua;%s/?/init.lua;", lua_dir, lua_dir, sdir, sdir);
    else /* no runtime: require "agg.loader" fails, and agw_vm_load_generation says where it looked */
        lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", sdir, sdir);
    lua_getfield(L, -2, "path");
    lua_concat(L, 2);
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    preload(L, "agg.json", agw_json_open);
    preload(L, "agg.sys", agw_sys_open);
    preload(L, "agg.breaker", agw_breaker_open);
    preload(L, "agg.resp_headers", agw_resp_headers_open);
    preload(L, "agg.router", agw_router_open);
    preload(L, "agg.limiter", agw_limiter_open);
    preload(L, "agg.pattern", agw_pattern_open);
    return L;
}

int agw_vm_load_generation(lua_State *L, const char *dir, agw_buf_t *errors)
{
    int top = lua_gettop(L);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "agg.loader");
    if (agw_lua_dir() == NULL) {
        agw_buf_printf(errors, "%s\n", agw_runtime_dir_problem());
        lua_settop(L, top);
        return -1;
    }
    if (lua_pcall(L, 1, 1, 0) != 0) {
        agw_buf_printf(errors, "%s: cannot load the runtime: %s\n", agw_lua_dir(),
                       lua_isstring(L, -1) ? lua_tostring(L, -1) : lua_typename(L, lua_type(L, -1)));
        lua_settop(L, top);
        return -1;
    }
    if (!lua_istable(L, -1)) { /* a runtime folder whose agg/loader.lua is empty or not ours */
        agw_buf_printf(errors, "%s: cannot load the runtime: agg.loader gave a %s, not its module table\n",
                       agw_lua_dir(), lua_typename(L, lua_type(L, -1)));
        lua_settop(L, top);
        return -1;
    }
    lua_getfield(L, -1, "load");
    lua_pushstring(L, dir);
    if (agw_heap_lua_pcall(L, 1, 2, 0) != 0) { /* (the scripts' top levels under the memory limit) */
        /* (a Lua error value need not be a string: its type, never a NULL to print) */
        agw_buf_printf(errors, "%s: loading failed: %s\n", dir,
                       lua_isstring(L, -1) ? lua_tostring(L, -1) : lua_typename(L, lua_type(L, -1)));
        lua_settop(L, top);
        return -1;
    }
    if (lua_isnil(L, -2)) {
        if (lua_istable(L, -1)) {
            size_t n = lua_objlen(L, -1);
            for (size_t i = 1; i <= n; i++) {
                lua_rawgeti(L, -1, (int)i);
                agw_buf_printf(errors, "%s\n", lua_tostring(L, -1));
                lua_pop(L, 1);
            }
        }
        lua_settop(L, top);
        return -1;
    }
    lua_pop(L, 1);      /* nil second value */
    lua_remove(L, -2);  /* loader module */
    return 0;
}
