/* Unit tests of gateway/deploy/: the sd_notify datagram, the open-file limit, the runtime's lookup
 * for a binary in its build tree. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/check.h"
#include "base/log.h"
#include "deploy/nofile.h"
#include "deploy/runtime_dir.h"
#include "deploy/sd_notify.h"

/* A datagram socket bound at name ("/path" or "@abstract"); returns its descriptor. */
static int bind_notify(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t len = strlen(name);
    memcpy(a.sun_path, name, len);
    if (name[0] == '@')
        a.sun_path[0] = '\0';
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (name[0] == '/'));
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, alen) != 0) {
        perror("bind");
        exit(2);
    }
    return fd;
}

static void received(int fd, const char *want)
{
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
    CHECK(n >= 0);
    buf[n < 0 ? 0 : n] = '\0';
    CHECK_STR(buf, want);
}

static void notify_without_socket_sends_nothing(void)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK(agw_sd_notify("READY=1") == 0);
    setenv("NOTIFY_SOCKET", "", 1);
    CHECK(agw_sd_notify("READY=1") == 0);
}

static void notify_sends_one_datagram_to_a_path(void)
{
    char path[] = "/tmp/agw-notify-XXXXXX";
    int tmp = mkstemp(path);
    close(tmp);
    unlink(path);
    int fd = bind_notify(path);
    setenv("NOTIFY_SOCKET", path, 1);
    CHECK(agw_sd_notify("READY=1\nSTATUS=serving") == 1);
    received(fd, "READY=1\nSTATUS=serving");
    CHECK(agw_sd_notifyf("STATUS=generation %d", 7) == 1);
    received(fd, "STATUS=generation 7");
    close(fd);
    unlink(path);
    /* the socket is gone: an error, logged, not fatal */
    CHECK(agw_sd_notify("READY=1") == -1);
}

static void notify_reaches_an_abstract_socket(void)
{
    char name[64];
    snprintf(name, sizeof(name), "@agw-notify-test-%d", (int)getpid());
    int fd = bind_notify(name);
    setenv("NOTIFY_SOCKET", name, 1);
    CHECK(agw_sd_notify("STOPPING=1") == 1);
    received(fd, "STOPPING=1");
    close(fd);
}

static void notify_refuses_a_relative_or_too_long_name(void)
{
    setenv("NOTIFY_SOCKET", "run/notify", 1);
    CHECK(agw_sd_notify("READY=1") == -1);
    char longname[200];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[0] = '/';
    longname[sizeof(longname) - 1] = '\0';
    setenv("NOTIFY_SOCKET", longname, 1);
    CHECK(agw_sd_notify("READY=1") == -1);
    unsetenv("NOTIFY_SOCKET");
}

static void nofile_raises_the_soft_limit_to_the_hard_one(void)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_max < 512)
        return;
    struct rlimit low = {.rlim_cur = 256, .rlim_max = rl.rlim_max};
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    uint64_t now = agw_nofile_raise(0);
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    CHECK(rl.rlim_cur == rl.rlim_max);
    CHECK(now == (rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur));
    /* pools that need more than the limit: still the same limit (the warning is logged) */
    CHECK(agw_nofile_raise(now) == now);
}

static void a_build_tree_binary_reads_the_source_tree_runtime(void)
{
    /* this test runs from the build folder, as the gateway's build-tree binary does */
    unsetenv("AGGWAY_LUA_DIR");
    const char *dir = agw_runtime_dir();
    CHECK(dir != NULL);
    CHECK_STR(agw_runtime_dir_source(), "build tree");
    char real[4096];
    CHECK(realpath(AGW_BUILD_LUA_DIR, real) != NULL);
    CHECK_STR(dir, real);
    CHECK_STR(agw_runtime_dir_problem(), "");
    CHECK(agw_runtime_dir() == dir); /* looked up once */
}

/* Runs agw_log once for each level in a child whose stderr is a pipe, with JOURNAL_STREAM set to
 * that pipe's device:inode (journal) or to another (journal 0); returns what the child wrote. */
static void log_in_child(int journal, char *out, size_t size)
{
    int p[2];
    if (pipe(p) != 0)
        exit(2);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        struct stat st;
        fstat(2, &st);
        char js[64];
        snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino + (journal ? 0 : 1));
        setenv("JOURNAL_STREAM", js, 1);
        agw_log(AGW_LOG_INFO, "one");
        agw_log(AGW_LOG_WARN, "two");
        agw_log(AGW_LOG_ERROR, "three");
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n < size - 1 && (r = read(p[0], out + n, size - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    waitpid(pid, NULL, 0);
}

static void log_lines_carry_their_priority_only_into_the_journal(void)
{
    char out[1024];
    log_in_child(1, out, sizeof(out));
    CHECK(strncmp(out, "<6>", 3) == 0 && strstr(out, " info one\n") != NULL);
    CHECK(strstr(out, "\n<4>") != NULL && strstr(out, " warn two\n") != NULL);
    CHECK(strstr(out, "\n<3>") != NULL && strstr(out, " error three\n") != NULL);
    log_in_child(0, out, sizeof(out));
    CHECK(strchr(out, '<') == NULL);
    CHECK(strstr(out, " warn two\n") != NULL);
}

int main(void)
{
    /* first: the log looks at JOURNAL_STREAM once per process, and the children inherit that */
    RUN(log_lines_carry_their_priority_only_into_the_journal);
    RUN(notify_without_socket_sends_nothing);
    RUN(notify_sends_one_datagram_to_a_path);
    RUN(notify_reaches_an_abstract_socket);
    RUN(notify_refuses_a_relative_or_too_long_name);
    RUN(nofile_raises_the_soft_limit_to_the_hard_one);
    RUN(a_build_tree_binary_reads_the_source_tree_runtime);
    return CHECK_DONE();
}
