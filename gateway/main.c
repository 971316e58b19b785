/* main.c: the aggway command line.
 *
 *   aggway serve [-c DIR]            serve the scripts folder DIR (default: scripts)
 *   aggway check [-c DIR]            load and check DIR like serve would, then exit: 0 when it is
 *                                    valid, 1 with "file:line: message" lines on stderr when not
 *   aggway test  [-c DIR] [ARGS…]    run busted specs inside the aggway runtime; ARGS are busted's
 *                                    own (paths, --filter, -o TAP, …), default: spec
 */
#include <lauxlib.h>
#include <malloc.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "script/config.h"
#include "base/log.h"
#include "script/script.h"
#include "front/server.h"

static int usage(void)
{
    fputs("usage: aggway serve [-c DIR]     serve the scripts folder (default: scripts)\n"
          "       aggway check [-c DIR]     check gateway.lua and every script, like nginx -t\n"
          "       aggway test [-c DIR] [busted options and spec paths…]\n",
          stderr);
    return 2;
}

static int cmd_check(const char *dir, int quiet)
{
    agw_config_t conf;
    agw_buf_t errors = AGW_BUF_INIT;
    if (agw_config_load(dir, &conf, &errors) != 0) {
        fprintf(stderr, "%s", errors.base ? errors.base : "configuration failed to load\n");
        fprintf(stderr, "aggway: %s is not valid (see the errors above)\n", dir);
        agw_buf_free(&errors);
        return 1;
    }
    if (!quiet)
        printf("aggway: %s is valid: %zu route%s, %zu upstream%s\n", dir, conf.router.num_routes,
               conf.router.num_routes == 1 ? "" : "s", conf.num_upstreams, conf.num_upstreams == 1 ? "" : "s");
    agw_config_free(&conf);
    agw_buf_free(&errors);
    return 0;
}

static int cmd_serve(const char *dir)
{
    return agw_server_run(dir);
}

/* Runs busted inside a runtime VM (DESIGN §3 "Specs"); the scripts folder is in package.path and
 * available to the specs as AGGWAY_SCRIPTS. */
static int cmd_test(const char *dir, int argc, char **argv)
{
    lua_State *L = agw_vm_new(dir);
    if (L == NULL)
        return 1;
    lua_pushstring(L, dir);
    lua_setglobal(L, "AGGWAY_SCRIPTS");
    lua_createtable(L, argc, 1);
    lua_pushliteral(L, "aggway test");
    lua_rawseti(L, -2, 0);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, ++n);
    }
    if (argc == 0) {
        lua_pushliteral(L, "spec");
        lua_rawseti(L, -2, ++n);
    }
    lua_setglobal(L, "arg");
    int rc = luaL_dostring(L, "require 'busted.runner'({ standalone = false })");
    if (rc != 0) {
        fprintf(stderr, "aggway test: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }
    lua_close(L);
    return 0; /* busted exits with the failure count itself when specs fail */
}

int main(int argc, char **argv)
{
    /* A worker's heap (Lua tables, h2o pools, upstream buffers) grows and shrinks by megabytes
     * between garbage collections; letting the C allocator give that back to the kernel and take it
     * again costs page faults on every page (measured: ~2 faults per page served). Keep it. */
    mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
    mallopt(M_TOP_PAD, 16 * 1024 * 1024);
    mallopt(M_MMAP_THRESHOLD, 4 * 1024 * 1024);
    if (argc < 2)
        return usage();
    const char *cmd = argv[1];
    const char *dir = "scripts";
    int i = 2;
    if (i + 1 < argc + 1 && i < argc && strcmp(argv[i], "-c") == 0) {
        if (i + 1 >= argc)
            return usage();
        dir = argv[i + 1];
        i += 2;
    }
    if (strcmp(cmd, "serve") == 0 && i == argc)
        return cmd_serve(dir);
    if (strcmp(cmd, "check") == 0 && i == argc)
        return cmd_check(dir, 0);
    if (strcmp(cmd, "test") == 0)
        return cmd_test(dir, argc - i, argv + i);
    return usage();
}
