/* runtime_dir.c: finding the Lua half of the runtime (see runtime_dir.h). */
#include "deploy/runtime_dir.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef AGW_LUA_RELDIR
#define AGW_LUA_RELDIR "../share/aggway/lua"
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char found[PATH_MAX];     /* the folder, absolute; "" when not found */
static char problem[3 * PATH_MAX + 256];
static const char *source = "";

/* Whether dir holds the runtime: its loader is a readable file. */
static int holds_runtime(const char *dir)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/agg/loader.lua", dir);
    return n > 0 && (size_t)n < sizeof(path) && access(path, R_OK) == 0;
}

/* Makes dir absolute into found and returns 1; 0 when it does not resolve. */
static int take(const char *dir, const char *how)
{
    if (realpath(dir, found) == NULL) {
        found[0] = '\0';
        return 0;
    }
    source = how;
    return 1;
}

static void lookup(void)
{
    const char *env = getenv("AGGWAY_LUA_DIR");
    if (env && *env) {
        if (!holds_runtime(env) || !take(env, "AGGWAY_LUA_DIR"))
            snprintf(problem, sizeof(problem), "cannot find the Lua runtime: AGGWAY_LUA_DIR=%s has no "
                     "agg/loader.lua; point it at the folder that holds agg/ (or unset it)", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        snprintf(problem, sizeof(problem), "cannot find the Lua runtime: /proc/self/exe does not name the "
                 "binary (is /proc mounted?); set AGGWAY_LUA_DIR to the folder that holds agg/");
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    char bindir[PATH_MAX];
    snprintf(bindir, sizeof(bindir), "%.*s", slash ? (int)(slash - exe) : 1, slash ? exe : ".");
    char beside[PATH_MAX + sizeof(AGW_LUA_RELDIR) + 1];
    snprintf(beside, sizeof(beside), "%s/%s", bindir, AGW_LUA_RELDIR);
    if (holds_runtime(beside) && take(beside, "installed"))
        return;
#if defined(AGW_BUILD_DIR) && defined(AGW_BUILD_LUA_DIR)
    char build[PATH_MAX];
    if (realpath(AGW_BUILD_DIR, build) != NULL && strcmp(build, bindir) == 0 && holds_runtime(AGW_BUILD_LUA_DIR) &&
        take(AGW_BUILD_LUA_DIR, "build tree"))
        return;
#endif
    snprintf(problem, sizeof(problem), "cannot find the Lua runtime (agg/loader.lua): not in %s (beside %s); "
             "install it there or set AGGWAY_LUA_DIR", beside, exe);
}

const char *agw_runtime_dir(void)
{
    pthread_once(&once, lookup);
    return found[0] ? found : NULL;
}

const char *agw_runtime_dir_problem(void)
{
    pthread_once(&once, lookup);
    return found[0] ? "" : problem;
}

const char *agw_runtime_dir_source(void)
{
    pthread_once(&once, lookup);
    return source;
}
