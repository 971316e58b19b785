/* main.c: the aggway command line.
 *
 *   aggway serve [-c DIR]            serve the scripts folder DIR (default: scripts)
 *   aggway check [-c DIR]            load and check DIR like serve would, and run each endpoint
 *                                    once against generated stubs, then exit: 0 when it is valid,
 *                                    1 with "file:line: message" lines on stderr when not
 *   aggway test  [-c DIR] [ARGS…]    run busted specs inside the aggway runtime; ARGS are --watch,
 *                                    --help or busted's own (paths, --filter, -o TAP, …), default: the
 *                                    spec folder beside DIR
 *   aggway version                   the version and where the Lua runtime is read from
 *   aggway help | --help | -h        every command, option, signal and environment variable
 */
#include <lauxlib.h>
#include <malloc.h>
#include <lualib.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "script/config.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/log.h"
#include "deploy/runtime_dir.h"
#include "script/script.h"
#include "script/listen_tls.h"
#include "front/admin.h"
#include "front/server.h"

#ifndef AGW_VERSION
#define AGW_VERSION "0.0.0"
#endif

/* The whole command line, for `aggway help` (stdout, exit 0) and after a mistake (stderr, exit 2).
 * The README's "Command line" section and the man page say the same. */
static const char help_text[] =
    "usage: aggway COMMAND [-c DIR] [ARGS...]\n"
    "\n"
    "commands:\n"
    "  serve [-c DIR]          serve the scripts folder DIR until SIGTERM/SIGINT\n"
    "  check [-c DIR]          load and check DIR's gateway.lua and every script as serve would\n"
    "                          (like nginx -t), call specs included (each endpoint runs once\n"
    "                          against generated stubs): exit 0 when valid, 1 with file:line messages\n"
    "  test [-c DIR] [ARGS...] run busted specs inside the aggway runtime; ARGS: --watch (rerun on\n"
    "                          changes), --help (the harness's options) or busted's own (spec paths,\n"
    "                          --filter=PATTERN, -o TAP, ...), default: the spec folder beside DIR\n"
    "  version                 print the version and where the Lua runtime is read from\n"
    "  help                    print this text (also --help, -h)\n"
    "\n"
    "options:\n"
    "  -c DIR                  the scripts folder: gateway.lua, endpoint scripts, lib/ (default: scripts)\n"
    "\n"
    "signals (serve):\n"
    "  SIGHUP                  reload the scripts folder as a new generation (the old one keeps\n"
    "                          serving when the new one does not load)\n"
    "  SIGTERM, SIGINT         stop accepting, let requests in flight finish (shutdown_grace_ms);\n"
    "                          a second one stops at once\n"
    "  SIGUSR1                 reopen the access log (log rotation)\n"
    "\n"
    "environment:\n"
    "  AGGWAY_LUA_DIR          the folder of the Lua runtime (agg/); default: ../share/aggway/lua\n"
    "                          beside the binary, or the source tree's lua/ for a binary in its build tree\n"
    "  AGGWAY_IO_URING=off     upstream I/O with one system call per operation instead of io_uring batches\n"
    "  AGGWAY_HOSTS_FILE       for tests: a hosts(5)-format file answers for upstream host names instead\n"
    "                          of DNS (upstream/resolve.h); unreadable: resolution fails\n"
    "  NOTIFY_SOCKET           set by systemd (Type=notify): READY=1 once the first generation serves,\n"
    "                          RELOADING=1/READY=1 around reloads, STOPPING=1 on SIGTERM\n"
    "\n"
    "admin listener (gateway.lua admin = { port = 9090 }; HEAD works as GET; a Host that is not an IP\n"
    "address, localhost or one of admin.allowed_hosts gets 421; docs/operations.md):\n";

/* help_text, then every admin endpoint from the admin router's own table (front/admin.h), so the
 * help lists exactly what the listener serves. */
static void print_help(FILE *f)
{
    fputs(help_text, f);
    for (const agw_admin_endpoint_t *e = agw_admin_endpoints; e->path; e++)
        fprintf(f, "  %-4s %-16s %s\n", e->method, e->path, e->what);
}

/* Writes s to f with its control characters as \xNN (a newline would split a message's line, an
 * escape sequence reach the terminal), at most max bytes of it, then "…" when it was longer. */
static void print_escaped(FILE *f, const char *s, size_t max)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n < max; p++, n++) {
        if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    if (strlen(s) > max)
        fputs("…", f);
}

/* The line under a command-line mistake (usage_error): the command line's shape and where the
 * rest is; the whole help would push the mistake off the screen. */
#define USAGE_LINE "usage: aggway COMMAND [-c DIR] [ARGS...]  ('aggway help' lists the commands and options)\n"

/* A command line aggway does not take: what is wrong with it (one line, "aggway: WHAT 'ARG'
 * HINT", ARG and HINT when not NULL), then USAGE_LINE, on stderr (as git and curl do); exit
 * status 2. */
static int usage_error(const char *what, const char *arg, const char *hint)
{
    fprintf(stderr, "aggway: %s", what);
    if (arg) {
        fputs(" '", stderr);
        print_escaped(stderr, arg, 200);
        fputc('\'', stderr);
    }
    fprintf(stderr, "%s%s\n" USAGE_LINE, hint ? " " : "", hint ? hint : "");
    return 2;
}

static int cmd_version(void)
{
    const char *dir = agw_runtime_dir();
    printf("aggway %s\nlua runtime: %s (%s)\n", AGW_VERSION, dir ? dir : agw_runtime_dir_problem(),
           dir ? agw_runtime_dir_source() : "not found");
    return dir ? 0 : 1;
}

/* Runs every endpoint of dir once on the spec harness against generated stubs (lua/agg/dryrun.lua)
 * and prints the call spec mistakes it finds, "file:line: message" each. Returns their number, or
 * 1 when the runtime cannot be started (said on stderr). */
static int dry_run(const char *dir)
{
    lua_State *L = agw_vm_new(dir);
    if (L == NULL)
        return 1;
    lua_pushstring(L, dir);
    lua_setglobal(L, "AGGWAY_SCRIPTS");
    int found = 0;
    if (luaL_loadstring(L, "return require 'agg.dryrun'.run(AGGWAY_SCRIPTS)") != 0 ||
        agw_heap_lua_pcall(L, 0, LUA_MULTRET, 0) != 0) {
        const char *msg = lua_tostring(L, -1);
        fprintf(stderr, "aggway: the dry run of %s failed: %s\n", dir, msg ? msg : "(no message)");
        found = 1;
    } else if (lua_istable(L, -1)) {
        size_t n = lua_objlen(L, -1);
        for (size_t i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, (int)i);
            const char *msg = lua_tostring(L, -1);
            fprintf(stderr, "%s\n", msg ? msg : "?");
            lua_pop(L, 1);
        }
        found = (int)n;
    }
    agw_heap_close_lua_state(L);
    return found;
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
    /* the access log serve would open for appending at start (not the config loader's: a reload,
     * which keeps the log open, must not fail when its folder moved) */
    char why[256];
    if (conf.access_log && strcmp(conf.access_log, "stderr") != 0 &&
        agw_file_appendable(conf.access_log, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s/gateway.lua:%d: access_log: cannot open ", dir, conf.access_log_line);
        print_escaped(stderr, conf.access_log, 400);
        fprintf(stderr, " for appending: %s\n", why);
        fprintf(stderr, "aggway: %s is not valid (see the errors above)\n", dir);
        agw_config_free(&conf);
        agw_buf_free(&errors);
        return 1;
    }
    if (dry_run(dir) != 0) {
        fprintf(stderr, "aggway: %s is not valid (see the errors above)\n", dir);
        agw_config_free(&conf);
        agw_buf_free(&errors);
        return 1;
    }
    for (size_t i = 0; i < conf.num_listen; i++) { /* valid all the same: serve would serve it */
        const agw_listen_conf_t *l = &conf.listen[i];
        const char *state = l->ssl_ctx ? agw_listen_tls_validity(l->ssl_ctx) : "";
        if (*state) {
            char desc[512];
            agw_listen_tls_describe(l->ssl_ctx, desc, sizeof(desc));
            fprintf(stderr, "%s/gateway.lua: warning: listen %s:%d: the certificate %s (%s)%s\n", dir, l->host, l->port,
                    l->cert_file, desc, state);
        }
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

/* Runs the specs (lua/agg/test_cli.lua: busted) inside a runtime VM (DESIGN §3 "Specs"); the scripts folder is in package.path and
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
    lua_setglobal(L, "arg"); /* (no spec named: agg.test_cli runs the spec folder beside dir) */
    /* agg.test_cli: --help, --watch, then busted with script errors beside failed assertions */
    int rc = luaL_loadstring(L, "require 'agg.test_cli'.main()") || agw_heap_lua_pcall(L, 0, LUA_MULTRET, 0);
    if (rc != 0) {
        /* busted's own exit after failed specs raises no message: nothing to add then */
        if (lua_isstring(L, -1))
            fprintf(stderr, "aggway test: %s\n", lua_tostring(L, -1));
        agw_heap_close_lua_state(L);
        return 1;
    }
    agw_heap_close_lua_state(L);
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
        return usage_error("a command is needed", NULL, "(serve, check, test, version, help)");
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        print_help(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0)
        return cmd_version();

    int serve = strcmp(cmd, "serve") == 0, check = strcmp(cmd, "check") == 0, test = strcmp(cmd, "test") == 0;
    if (!serve && !check && !test)
        return usage_error("unknown command", cmd, "(serve, check, test, version, help)");
    const char *dir = "scripts";
    int i = 2, given = 0;
    if (i < argc && strcmp(argv[i], "-c") == 0) {
        if (i + 1 >= argc || argv[i + 1][0] == '\0')
            return usage_error("-c needs the scripts folder after it", NULL, NULL);
        dir = argv[i + 1];
        i += 2;
        given = 1;
    }
    if (test) {
        /* `aggway test spec -c scripts`: -c is the scripts folder wherever it comes (busted's own
         * -c, its coverage, is spelt --coverage here), taken out of what busted gets */
        for (int j = i; j < argc; j++) {
            if (strcmp(argv[j], "--") == 0)
                break;
            if (strcmp(argv[j], "-c") != 0)
                continue;
            if (j + 1 >= argc || argv[j + 1][0] == '\0')
                return usage_error("-c needs the scripts folder after it", NULL, NULL);
            if (given++)
                return usage_error("-c given twice", NULL, NULL);
            dir = argv[j + 1];
            for (int k = j; k + 2 <= argc; k++)
                argv[k] = argv[k + 2];
            argc -= 2;
            j--;
        }
    } else if (i < argc) {
        if (strcmp(argv[i], "-c") == 0)
            return usage_error("-c given twice", NULL, NULL);
        if (argv[i][0] == '-')
            return usage_error("unknown option", argv[i], NULL);
        return usage_error("unexpected argument", argv[i], "(the scripts folder is given as -c DIR)");
    }
    if (agw_runtime_dir() == NULL) {
        fprintf(stderr, "aggway: %s\n", agw_runtime_dir_problem());
        return 1;
    }
    /* a folder that is not there, or a file given as one, said as such (not as a gateway.lua to
     * create inside it); exit 1 as for a folder that is not valid. (aggway test runs without one
     * unless -c names it: specs may load fixture folders of their own, and --help needs none.) */
    struct stat st;
    int found = stat(dir, &st) == 0, err = errno;
    if ((!test || given) && (!found || !S_ISDIR(st.st_mode))) {
        char cwd[512];
        const char *what = found ? "is not a folder" : err == ENOENT ? "does not exist" : strerror(err);
        fprintf(stderr, "aggway: %s", found ? "'" : "the scripts folder '");
        print_escaped(stderr, dir, 400);
        fprintf(stderr, "' %s%s: -c takes the scripts folder (gateway.lua, endpoint scripts, lib/)%s%s%s\n",
                found || err == ENOENT ? "" : "cannot be looked at: ", what,
                given ? "" : "; without -c it is ./scripts (here ",
                given ? "" : (getcwd(cwd, sizeof(cwd)) ? cwd : "the current folder"), given ? "" : "/scripts)");
        return 1;
    }
    if (serve)
        return cmd_serve(dir);
    if (check)
        return cmd_check(dir, 0);
    return cmd_test(dir, argc - i, argv + i);
}
