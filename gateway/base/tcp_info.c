/* tcp_info.c: see tcp_info.h. Includes <linux/tcp.h>, never <netinet/tcp.h>. */
#include "base/tcp_info.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

uint64_t agw_tcp_bytes_acked(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
        return 0;
    return ti.tcpi_bytes_acked;
}
