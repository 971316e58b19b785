/* loopback.h: what the front's libuv tests share: a loopback TCP connection's two ends, and a
 * count of epoll_ctl calls. Included by one file of each test program: it defines epoll_ctl,
 * which libuv then calls through its PLT (as libh2o calls the gateway's libuv functions), and
 * which passes each call on to libc's. */
#ifndef AGW_TESTS_FRONT_LOOPBACK_H
#define AGW_TESTS_FRONT_LOOPBACK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

/* epoll_ctl calls made in the process so far */
static int ctl_calls;

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *event)
{
    static int (*libc_ctl)(int, int, int, struct epoll_event *);
    if (libc_ctl == NULL)
        *(void **)&libc_ctl = dlsym(RTLD_NEXT, "epoll_ctl");
    ctl_calls++;
    return libc_ctl(epfd, op, fd, event);
}

/* A loopback TCP connection: returns the accepted end's descriptor (for uv_tcp_open) and sets
 * *peer to the client's (blocking); -1 when the kernel refuses a step. */
static int loopback_pair(int *peer)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) != 0)
        return -1;
    *peer = socket(AF_INET, SOCK_STREAM, 0);
    if (*peer < 0 || connect(*peer, (struct sockaddr *)&a, sizeof(a)) != 0)
        return -1;
    int fd = accept(l, NULL, NULL);
    close(l);
    return fd;
}

/* A loopback TCP connection whose accepted end is tcp on loop (initialised and opened, its data
 * set to data) and whose client end is *peer (blocking). Returns 0, or -1 when a step failed. */
static int loopback_uv_tcp(uv_loop_t *loop, uv_tcp_t *tcp, void *data, int *peer)
{
    int fd = loopback_pair(peer);
    if (fd < 0)
        return -1;
    uv_tcp_init(loop, tcp);
    tcp->data = data;
    return uv_tcp_open(tcp, fd);
}

/* Waits until fd has events (POLLIN: bytes, POLLRDHUP: the peer's FIN), at most 10 s, so that a
 * test's next turn of the loop finds what the peer sent even when the kernel delivers loopback
 * traffic late (a loaded machine). Returns 1 when they came. */
static int wait_for(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    return poll(&p, 1, 10000) == 1 && (p.revents & events) != 0;
}

#endif
