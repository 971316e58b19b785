/* test_admin_loop.c: the admin listener's loop after a burst (front/admin.h). A scrape that came
 * in on a high descriptor (the descriptors below it held, as a burst holds them) makes the loop
 * anew once the thread is idle, the listener answers on the new loop, the memory libev's arrays
 * took for that descriptor is given back, a connection on a low descriptor leaves the loop as it
 * is, a connection accepted in the same loop pass as the last one closes keeps the loop (its
 * watchers are on it), and a stop is never lost. Real sockets over loopback, the admin thread as
 * the gateway runs it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../check.h"
#include "../free_port.h"
#include "base/heap.h"
#include "front/admin.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if AGW_HEAP_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

/* The descriptor the burst case's scrape gets: libev's per-descriptor array for it is 16 bytes a
 * descriptor, grown by doubling to about 19,700 (about 315 KB), well above what the rest of a
 * request leaves. */
#define HIGH_FD 10000

static int port;

static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/* A connection to the admin (blocking, reads time out after 10 s), or -1. */
static int dial(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 10};
    if (s < 0)
        return -1;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(s);
        return -1;
    }
    return s;
}

/* Sends GET /healthz on s unless sent, reads the answer to its end and closes s; the status code,
 * or -1. The admin closes after answering. */
static int finish(int s, int sent)
{
    if (s < 0)
        return -1;
    if (!sent && send(s, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1) {
        close(s);
        return -1;
    }
    char buf[512];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof(buf) - 1 && (n = recv(s, buf + got, sizeof(buf) - 1 - got, 0)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    close(s);
    int status = -1;
    if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
        return -1;
    return strstr(buf, "\r\n\r\nok\n") ? status : -1;
}

/* GET /healthz on a new connection; the status code, or -1. */
static int healthz(void)
{
    return finish(dial(), 0);
}

/* Holds every free descriptor below below (duplicates of /dev/null), as a burst's connections
 * hold them; returns how many, their numbers in *held (free with release). */
static int hold_below(int below, int **held)
{
    int hold = open("/dev/null", O_RDONLY | O_CLOEXEC), n = 0;
    *held = calloc((size_t)below, sizeof(int));
    CHECK(hold >= 0 && *held != NULL);
    for (int fd; n < below && (fd = fcntl(hold, F_DUPFD_CLOEXEC, 0)) >= 0;) {
        if (fd >= below) {
            close(fd);
            break;
        }
        (*held)[n++] = fd;
    }
    close(hold);
    return n;
}

static void release(int *held, int n)
{
    for (int i = 0; i < n; i++)
        close(held[i]);
    free(held);
}

/* Raises the soft descriptor limit to want, or exits 77 (skipped) when the hard limit is lower. */
static void raise_limit(rlim_t want)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur >= want)
        return;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        fprintf(stderr, "skipped: the descriptor limit (%llu) is below %llu\n", (unsigned long long)rl.rlim_max,
                (unsigned long long)want);
        exit(77);
    }
    rl.rlim_cur = want;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
}

/* Waits (bounded: 10 s of 1 ms naps) until the admin's last connection has closed spells times:
 * the thread has freed it and flushed its cache, so the heap's figures are settled. */
static void wait_idle(agw_admin_t *a, unsigned spells)
{
    for (int i = 0; i < 10000 && agw_admin_idle_spells(a) < spells; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    CHECK(agw_admin_idle_spells(a) >= spells);
}

/* Waits (bounded: 10 s of 10 ms naps) until the admin has made its loop anew want times. */
static unsigned wait_loops(agw_admin_t *a, unsigned want)
{
    for (int i = 0; i < 1000 && agw_admin_loops_made(a) < want; i++)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    return agw_admin_loops_made(a);
}

static agw_admin_t *start_admin(void)
{
    agw_config_t conf;
    memset(&conf, 0, sizeof(conf));
    conf.admin_host = "127.0.0.1";
    port = free_port();
    conf.admin_port = port;
    agw_admin_t *a = port > 0 ? agw_admin_start(&conf, NULL, NULL, NULL, 0) : NULL;
    CHECK(a != NULL);
    return a;
}

/* Connections on low descriptors (as at any time but a burst) keep the loop. */
static void a_low_descriptor_keeps_the_loop(void)
{
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    for (unsigned i = 1; i <= 3; i++) {
        CHECK(healthz() == 200);
        wait_idle(a, i);
    }
    /* a remake is decided when the last connection closes (the idle spell counted above) and made
     * before the loop accepts again: once the next scrape is answered, any remake the three spells
     * asked for is done and counted */
    CHECK(healthz() == 200);
    CHECK(agw_admin_loops_made(a) == 0);
    agw_admin_stop(a);
}

/* When its last connection closes, the admin thread's cache of freed blocks goes back to the heap:
 * after scrapes (a connection record of 8 KB and more each, which the cache keeps), with this
 * thread's own cache flushed, no thread's cache holds a block. jemalloc's figures: the default
 * build only. */
static void an_idle_admin_keeps_no_cached_blocks(void)
{
#if AGW_HEAP_JEMALLOC
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    for (unsigned i = 1; i <= 5; i++) {
        CHECK(healthz() == 200);
        wait_idle(a, i);
    }
    agw_heap_thread_flush();
    uint64_t epoch = 1;
    size_t cached = 1, sz = sizeof(epoch);
    CHECK(mallctl("epoch", &epoch, &sz, &epoch, sz) == 0);
    sz = sizeof(cached);
    CHECK(mallctl("stats.arenas.4096.tcache_bytes", &cached, &sz, NULL, 0) == 0); /* MALLCTL_ARENAS_ALL */
    CHECK(cached == 0);
    if (cached != 0)
        fprintf(stderr, "the threads' caches hold %zu bytes\n", cached);
    agw_admin_stop(a);
#endif
}

/* The burst: every descriptor below HIGH_FD is held, a scrape comes in above it; once it is
 * answered and closed, the loop is made anew, its memory given back, and the next scrape (low
 * descriptor again) is answered by the new loop. */
static void a_burst_descriptor_makes_the_loop_anew(void)
{
    raise_limit(HIGH_FD + 64);
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    CHECK(healthz() == 200); /* the thread's first allocations, before the figure below */
    wait_idle(a, 1);
    agw_heap_stats_t before, after;
    agw_heap_thread_flush(); /* (this thread's cache counts as allocated too) */
    int figures = agw_heap_stats(&before) == 0;

    int *held, nheld = hold_below(HIGH_FD, &held);
    CHECK(healthz() == 200); /* the client's socket and the accepted one are at HIGH_FD or above */
    release(held, nheld);
    CHECK(wait_loops(a, 1) == 1);
    CHECK(healthz() == 200); /* answered by the new loop */
    wait_idle(a, 3);
    CHECK(agw_admin_loops_made(a) == 1);

    if (figures) {
        agw_heap_thread_flush();
        CHECK(agw_heap_stats(&after) == 0);
        /* the old loop's array for HIGH_FD descriptors (about 315 KB) is gone: what the scrapes
         * left is a few KB */
        CHECK(after.allocated < before.allocated + 48 * 1024);
        if (after.allocated >= before.allocated + 48 * 1024)
            fprintf(stderr, "allocated %zu before, %zu after\n", before.allocated, after.allocated);
    }
    agw_admin_stop(a);
}

/* The number of descriptors process pid has open, or -1. */
static int count_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Whether every thread of process pid is stopped (state T in /proc/PID/task/TID/stat), waiting up
 * to 10 s. */
static int wait_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    for (int i = 0; i < 10000; i++) {
        DIR *d = opendir(path);
        if (d == NULL)
            return 0;
        int running = 0, seen = 0;
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (e->d_name[0] == '.')
                continue;
            char stat[384], buf[512];
            snprintf(stat, sizeof(stat), "%s/%s/stat", path, e->d_name);
            FILE *f = fopen(stat, "r");
            if (f == NULL)
                continue;
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *st = strrchr(buf, ')'); /* "tid (comm) S ...": the state after the name */
            seen++;
            running += st == NULL || st[1] != ' ' || (st[2] != 'T' && st[2] != 't');
        }
        closedir(d);
        if (seen > 0 && running == 0)
            return 1;
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    }
    return 0;
}

/* An admin in a child process, driven over two pipes: its descriptors below 1,100 are held, so
 * that every connection it accepts is above the remake's threshold. */
typedef struct {
    pid_t pid;
    int cmd, rep; /* the parent's ends: commands to the child, its replies */
} child_t;

/* The child's side: starts the admin, says 'k' once it listens (connections then wait in its
 * backlog), then answers commands until 's' or a closed pipe: 'l' lowers its descriptor limit to
 * 1,050 (below every held descriptor), 'r' restores it ('k' or 'e'), 'f' and 'm' send
 * agw_admin_loops_failed and agw_admin_loops_made as a byte. Stops the admin and exits 0. */
static void child_main(int cmd, int rep)
{
    agw_config_t conf;
    memset(&conf, 0, sizeof(conf));
    conf.admin_host = "127.0.0.1";
    conf.admin_port = port;
    int *held;
    hold_below(1100, &held);
    agw_admin_t *a = agw_admin_start(&conf, NULL, NULL, NULL, 0);
    if (a == NULL || write(rep, "k", 1) != 1)
        _exit(3);
    struct rlimit rl, low;
    getrlimit(RLIMIT_NOFILE, &rl);
    low = rl;
    low.rlim_cur = 1050;
    for (char c; read(cmd, &c, 1) == 1 && c != 's';) {
        unsigned char r = 'k';
        if (c == 'l' || c == 'r')
            r = setrlimit(RLIMIT_NOFILE, c == 'l' ? &low : &rl) == 0 ? 'k' : 'e';
        else if (c == 'f' || c == 'm')
            r = (unsigned char)(c == 'f' ? agw_admin_loops_failed(a) : agw_admin_loops_made(a));
        if (write(rep, &r, 1) != 1)
            break;
    }
    agw_admin_stop(a);
    _exit(0);
}

/* Forks the child and waits for its 'k'; 0, or -1. err_path: a file the child's standard error
 * (its log) goes to, or NULL to share the test's. */
static int child_start(child_t *ch, const char *err_path)
{
    raise_limit(4096);
    port = free_port();
    int cmd[2], rep[2];
    if (port <= 0 || pipe(cmd) != 0 || pipe(rep) != 0)
        return -1;
    ch->pid = fork();
    if (ch->pid == 0) {
        int err = err_path ? open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600) : -1;
        if (err >= 0) { /* (on descriptor 2: the child's count of descriptors is as before) */
            dup2(err, 2);
            close(err);
        }
        close(cmd[1]);
        close(rep[0]);
        child_main(cmd[0], rep[1]);
    }
    close(cmd[0]);
    close(rep[1]);
    ch->cmd = cmd[1];
    ch->rep = rep[0];
    char k = 0;
    return ch->pid > 0 && read(ch->rep, &k, 1) == 1 && k == 'k' ? 0 : -1;
}

/* Sends command c and returns the child's reply byte, or 0xff. */
static unsigned ask(child_t *ch, char c)
{
    unsigned char r;
    return write(ch->cmd, &c, 1) == 1 && read(ch->rep, &r, 1) == 1 ? r : 0xff;
}

/* Opens a connection and waits (bounded) until the child has accepted it: it has one descriptor
 * more. Before any connection has closed no remake runs, so the child's descriptors change only by
 * the connections it accepts. The connection, or -1. */
static int dial_accepted(child_t *ch)
{
    int before = count_fds(ch->pid), now = -1;
    int s = dial();
    for (int i = 0; i < 10000 && (now = count_fds(ch->pid)) <= before; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    CHECK(now > before);
    return s;
}

/* Stops the child ('s') and checks that it ended cleanly: exit status 0, no signal. */
static void child_stop(child_t *ch)
{
    CHECK(write(ch->cmd, "s", 1) == 1);
    close(ch->cmd);
    close(ch->rep);
    int status = 0;
    CHECK(waitpid(ch->pid, &status, 0) == ch->pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "the admin's process ended with status %#x\n", (unsigned)status);
}

/* The last connection closes and a new one is accepted in the same loop pass. Connection A is
 * accepted; the child is stopped; B connects (it waits in the listener's backlog) and A's request
 * arrives; the child goes on, and one poll gives both. libev handles A first (the last event it
 * was given), answers and closes it, which asks for the remake, then accepts B in the same pass.
 * B must be answered (its watchers are on the loop that stays, with its timeout), and the stop
 * must end the child cleanly (a watcher left on a destroyed loop made libev abort there). */
static void a_connection_accepted_as_the_last_closes_keeps_the_loop(void)
{
    child_t ch;
    CHECK(child_start(&ch, NULL) == 0);
    int A = dial_accepted(&ch);
    CHECK(kill(ch.pid, SIGSTOP) == 0);
    /* kill returns before the stop takes hold: wait (bounded) until every thread of the child is
     * stopped, so that B's connection cannot wake the admin's poll on its own */
    CHECK(wait_stopped(ch.pid));
    int B = dial(); /* the handshake completes in the kernel */
    CHECK(send(A, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1);
    CHECK(kill(ch.pid, SIGCONT) == 0);
    CHECK(finish(A, 1) == 200);
    CHECK(finish(B, 0) == 200);
    CHECK(healthz() == 200);
    child_stop(&ch);
}

/* A remake when no descriptor is free (the burst goes on): the old loop stays, the admin goes on
 * answering once descriptors are free again, and the next idle spell makes the loop anew. While
 * connection A is open, the child's descriptor limit is lowered below every descriptor it holds,
 * so that A's close frees none a new loop could take (epoll_create1 fails with EMFILE). */
static void a_remake_without_a_free_descriptor_keeps_the_old_loop(void)
{
    char log[] = "/tmp/aggway-test-admin-log-XXXXXX";
    int lfd = mkstemp(log);
    CHECK(lfd >= 0);
    if (lfd < 0)
        return;
    close(lfd);
    child_t ch;
    CHECK(child_start(&ch, log) == 0);
    int A = dial_accepted(&ch);
    CHECK(ask(&ch, 'm') == 0);
    CHECK(ask(&ch, 'l') == 'k');
    CHECK(finish(A, 0) == 200); /* answered; its close asks for a remake that finds no descriptor */
    for (int i = 0; i < 10000 && ask(&ch, 'f') == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    CHECK(ask(&ch, 'f') == 1);
    CHECK(ask(&ch, 'm') == 0);
    CHECK(ask(&ch, 'r') == 'k');
    CHECK(healthz() == 200); /* the old loop answers; this spell makes the loop anew */
    for (int i = 0; i < 10000 && ask(&ch, 'm') == 0; i++)
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    CHECK(ask(&ch, 'm') == 1);
    CHECK(healthz() == 200);
    child_stop(&ch);
    /* the failed remake is a warning in the log, and the remake that follows says so */
    char text[8192];
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = 0;
    unlink(log);
    const char *warn = strstr(text, "warn admin listener: no descriptor free to make its loop anew");
    CHECK(warn != NULL);
    const char *eol = warn ? strchr(warn, '\n') : NULL;
    CHECK(eol == NULL || strstr(eol, "no descriptor free") == NULL); /* once */
    CHECK(warn == NULL || strstr(warn, "admin listener: its loop is made anew") != NULL);
    if (warn == NULL)
        fprintf(stderr, "the admin's log:\n%s", text);
}

/* A stop right after a burst's scrape, while the thread may be making its loop anew: it stops. */
static void a_stop_during_the_remake_stops(void)
{
    raise_limit(4096);
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    int *held, nheld = hold_below(2048, &held);
    CHECK(healthz() == 200);
    release(held, nheld);
    agw_admin_stop(a); /* returns (the test's timeout says otherwise) */
}

int main(void)
{
    RUN(a_low_descriptor_keeps_the_loop);
    RUN(an_idle_admin_keeps_no_cached_blocks);
    RUN(a_burst_descriptor_makes_the_loop_anew);
    RUN(a_stop_during_the_remake_stops);
    RUN(a_connection_accepted_as_the_last_closes_keeps_the_loop);
    RUN(a_remake_without_a_free_descriptor_keeps_the_old_loop);
    return CHECK_DONE();
}
