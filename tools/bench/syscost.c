/* syscost: what a system call costs on this machine, for reading the CPU-per-page figures of
 * tools/bench/peers. Prints the mean wall time of
 *   - a trivial system call (getppid), N times;
 *   - the pair of epoll_ctl calls an event loop makes to watch a socket again after it stopped
 *     watching it (ADD answered by EEXIST, then MOD: what libuv does each time h2o resumes
 *     reading an HTTP/1 connection after a response).
 * Usage: syscost [N]   (N default 200000). Exit status 1 when a call fails. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    if (n <= 0)
        n = 200000;
    double t0 = now_us();
    for (long i = 0; i < n; i++)
        syscall(SYS_getppid);
    double t1 = now_us();
    printf("system call (getppid): %.2f us\n", (t1 - t0) / n);

    int ep = epoll_create1(0), sv[2];
    if (ep < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("syscost");
        return 1;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev) != 0) {
        perror("syscost: epoll_ctl");
        return 1;
    }
    t0 = now_us();
    for (long i = 0; i < n; i++) {
        epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev); /* EEXIST */
        epoll_ctl(ep, EPOLL_CTL_MOD, sv[0], &ev);
    }
    t1 = now_us();
    printf("epoll_ctl ADD (EEXIST) + MOD: %.2f us\n", (t1 - t0) / n);
    return 0;
}
