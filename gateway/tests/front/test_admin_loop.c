/* test_admin_loop.c: the admin listener's loop after a burst (front/admin.h). A scrape that came
 * in on a high descriptor (the descriptors below it held, as a burst holds them) makes the loop
 * anew once the thread is idle, the listener answers on the new loop, the memory libev's arrays
 * took for that descriptor is given back, and a connection on a low descriptor leaves the loop as
 * it is. Real sockets over loopback, the admin thread as the gateway runs it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../check.h"
#include "base/heap.h"
#include "front/admin.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The descriptor the burst case's scrape gets: libev's per-descriptor array for it is about
 * 16 bytes x HIGH_FD (about 160 KB), well above what the rest of a request leaves. */
#define HIGH_FD 10000

static int port;

/* A free loopback port, the kernel's pick. */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) != 0 || getsockname(s, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    close(s);
    return ntohs(sa.sin_port);
}

/* GET /healthz on a new connection; the status code, or -1. The admin closes after answering. */
static int healthz(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 10};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
    if (send(s, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1) {
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
    for (int i = 0; i < 3; i++)
        CHECK(healthz() == 200);
    nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    CHECK(agw_admin_loops_made(a) == 0);
    agw_admin_stop(a);
}

/* The burst: every descriptor below HIGH_FD is held, a scrape comes in above it; once it is
 * answered and closed, the loop is made anew, its memory given back, and the next scrape (low
 * descriptor again) is answered by the new loop. */
static void a_burst_descriptor_makes_the_loop_anew(void)
{
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < HIGH_FD + 64) {
        rlim_t want = HIGH_FD + 64;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
            fprintf(stderr, "skipped: the descriptor limit (%llu) is below %d\n", (unsigned long long)rl.rlim_max,
                    HIGH_FD + 64);
            exit(77);
        }
        rl.rlim_cur = want;
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    CHECK(healthz() == 200); /* the thread's first allocations, before the figure below */
    agw_heap_stats_t before, after;
    int figures = agw_heap_stats(&before) == 0;

    int hold = open("/dev/null", O_RDONLY | O_CLOEXEC), *held = calloc(HIGH_FD, sizeof(int)), nheld = 0;
    CHECK(hold >= 0 && held != NULL);
    for (int fd; nheld < HIGH_FD && (fd = fcntl(hold, F_DUPFD_CLOEXEC, 0)) >= 0 && fd < HIGH_FD;)
        held[nheld++] = fd;
    CHECK(healthz() == 200); /* the client's socket and the accepted one are at HIGH_FD or above */
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    close(hold);
    free(held);
    CHECK(wait_loops(a, 1) == 1);
    CHECK(healthz() == 200); /* answered by the new loop */
    CHECK(agw_admin_loops_made(a) == 1);

    if (figures) {
        CHECK(agw_heap_stats(&after) == 0);
        /* the old loop's array for HIGH_FD descriptors (about 160 KB) is gone: what the three
         * scrapes left is a few KB */
        CHECK(after.allocated < before.allocated + 48 * 1024);
        if (after.allocated >= before.allocated + 48 * 1024)
            fprintf(stderr, "allocated %zu before, %zu after\n", before.allocated, after.allocated);
    }
    agw_admin_stop(a);
}

/* A stop right after a burst's scrape, while the thread may be making its loop anew: it stops. */
static void a_stop_during_the_remake_stops(void)
{
    agw_admin_t *a = start_admin();
    if (a == NULL)
        return;
    int hold = open("/dev/null", O_RDONLY | O_CLOEXEC), *held = calloc(2048, sizeof(int)), nheld = 0;
    CHECK(hold >= 0 && held != NULL);
    for (int fd; nheld < 2048 && (fd = fcntl(hold, F_DUPFD_CLOEXEC, 0)) >= 0 && fd < 2048;)
        held[nheld++] = fd;
    CHECK(healthz() == 200);
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    close(hold);
    free(held);
    agw_admin_stop(a); /* returns (the test's timeout says otherwise) */
}

int main(void)
{
    RUN(a_low_descriptor_keeps_the_loop);
    RUN(a_burst_descriptor_makes_the_loop_anew);
    RUN(a_stop_during_the_remake_stops);
    return CHECK_DONE();
}
