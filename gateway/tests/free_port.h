/* free_port.h: a free loopback TCP port for a unit test's server (the admin listener, a
 * redis-server), the kernel's pick. Another process may take it before the test binds it; on
 * loopback within one test run that does not happen in practice. */
#ifndef AGW_TESTS_FREE_PORT_H
#define AGW_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* A port no socket was bound to a moment ago (bound to 0, read back, closed), or -1 when the kernel
 * refused a step. */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (s < 0)
        return -1;
    if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) != 0 || getsockname(s, (struct sockaddr *)&sa, &len) != 0) {
        close(s);
        return -1;
    }
    close(s);
    return ntohs(sa.sin_port);
}

#endif
