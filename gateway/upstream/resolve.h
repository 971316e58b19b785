/* resolve.h: a host name into the addresses an upstream's endpoints use (script/config.c at load,
 * group/directory.c when re-resolving).
 *
 * getaddrinfo (SOCK_STREAM): the IPv4 addresses when there are any, else the IPv6 ones, sorted
 * bytewise, without duplicates, at most max (so the same answer in another order is the same set).
 *
 * Test seam: when the environment variable AGGWAY_HOSTS_FILE names a file in hosts(5) form
 * ("127.0.0.2 product.test", '#' comments), a name listed there resolves to its addresses in that
 * file, read at each resolution, and never reaches DNS; a name it does not list goes to
 * getaddrinfo; while the file cannot be read, every name fails to resolve (the DNS is down). The
 * integration tests rewrite it to move a name's addresses. Not a production option (it is not in
 * gateway.lua nor in docs/operations.md).
 */
#ifndef AGW_UPSTREAM_RESOLVE_H
#define AGW_UPSTREAM_RESOLVE_H

#include <stddef.h>
#include <sys/socket.h>

#define AGW_RESOLVE_COLLECT 64 /* addresses collected from the resolver before sorting and cutting to max */

/* Resolves host (port: the URL's) into out[0..n) and len[0..n). Returns n (>= 1), or -1 with why
 * in err (NUL-terminated, errlen bytes at most). Blocks while the resolver works: never call it on
 * a worker's loop. */
int agw_resolve_host(const char *host, int port, struct sockaddr_storage *out, socklen_t *len, size_t max, char *err,
                     size_t errlen);

/* 1 when host is an IPv4 or IPv6 address literal (a URL host that needs no resolving). */
int agw_host_is_address(const char *host);

/* "10.0.0.1:9001" or "[::1]:9001" for addr into out (64 bytes are enough); "-" when len is 0. */
void agw_endpoint_address(const struct sockaddr_storage *addr, socklen_t len, char *out, size_t outlen);

#endif
