/* tcp_info.h: what the kernel knows of a TCP connection's progress (Linux TCP_INFO).
 *
 * In a file of its own: glibc's <netinet/tcp.h> (which h2o's headers bring in) declares an old
 * struct tcp_info without tcpi_bytes_acked, and it cannot be included with <linux/tcp.h>.
 */
#ifndef AGW_BASE_TCP_INFO_H
#define AGW_BASE_TCP_INFO_H

#include <stdint.h>

/* The bytes of fd's connection that its peer has acknowledged so far (TCP_INFO tcpi_bytes_acked,
 * RFC 4898's tcpEStatsAppHCThruOctetsAcked; Linux 4.1 and later), or 0 when the kernel cannot
 * tell (not a TCP socket, an older kernel). It only grows while the connection lives. */
uint64_t agw_tcp_bytes_acked(int fd);

#endif
