/* resolve.c: host names into endpoint addresses (see resolve.h). */
#include "upstream/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int cmp_addr(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sockaddr_storage));
}

/* Adds addr (port set) to out (room for AGW_RESOLVE_COLLECT) unless it is there; returns the new
 * count. */
static size_t add(struct sockaddr_storage *out, size_t n, const struct sockaddr *addr, socklen_t alen, int port)
{
    if (n >= AGW_RESOLVE_COLLECT || alen > (socklen_t)sizeof(struct sockaddr_storage))
        return n;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    memcpy(&ss, addr, alen);
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    else if (ss.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    else
        return n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&out[i], &ss, sizeof(ss)) == 0)
            return n;
    out[n] = ss;
    return n + 1;
}

/* The addresses AGGWAY_HOSTS_FILE gives host: their count (0: the file does not list it, or there
 * is no such variable); -1 when the variable names a file that cannot be read (the tests' "DNS is
 * down"). */
static int from_hosts_file(const char *host, int port, struct sockaddr_storage *all)
{
    const char *path = getenv("AGGWAY_HOSTS_FILE");
    if (path == NULL || *path == '\0')
        return 0;
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    char line[1024];
    size_t n = 0;
    while (fgets(line, sizeof(line), f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *save = NULL, *addr = strtok_r(line, " \t\r\n", &save);
        if (addr == NULL)
            continue;
        for (char *name = strtok_r(NULL, " \t\r\n", &save); name; name = strtok_r(NULL, " \t\r\n", &save)) {
            if (strcasecmp(name, host) != 0)
                continue;
            struct sockaddr_in v4 = {.sin_family = AF_INET};
            struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
            if (inet_pton(AF_INET, addr, &v4.sin_addr) == 1)
                n = add(all, n, (struct sockaddr *)&v4, sizeof(v4), port);
            else if (inet_pton(AF_INET6, addr, &v6.sin6_addr) == 1)
                n = add(all, n, (struct sockaddr *)&v6, sizeof(v6), port);
        }
    }
    fclose(f);
    return (int)n;
}

int agw_resolve_host(const char *host, int port, struct sockaddr_storage *out, socklen_t *len, size_t max, char *err,
                     size_t errlen)
{
    struct sockaddr_storage all[AGW_RESOLVE_COLLECT];
    int listed = from_hosts_file(host, port, all);
    if (listed < 0) {
        snprintf(err, errlen, "AGGWAY_HOSTS_FILE cannot be read");
        return -1;
    }
    size_t n = (size_t)listed;
    if (n == 0) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_family = AF_UNSPEC;
        char portstr[16];
        snprintf(portstr, sizeof(portstr), "%d", port);
        int rc = getaddrinfo(host, portstr, &hints, &res);
        if (rc != 0 || res == NULL) {
            snprintf(err, errlen, "%s", rc != 0 ? gai_strerror(rc) : "no address");
            if (res)
                freeaddrinfo(res);
            return -1;
        }
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
            n = add(all, n, ai->ai_addr, ai->ai_addrlen, port);
        freeaddrinfo(res);
    }
    /* IPv4 when there is any, else IPv6 */
    int has4 = 0;
    for (size_t i = 0; i < n; i++)
        has4 |= all[i].ss_family == AF_INET;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if ((all[i].ss_family == AF_INET) == has4)
            all[k++] = all[i];
    if (k == 0) {
        snprintf(err, errlen, "no IPv4 or IPv6 address");
        return -1;
    }
    qsort(all, k, sizeof(all[0]), cmp_addr);
    if (k > max)
        k = max;
    for (size_t i = 0; i < k; i++) {
        out[i] = all[i];
        len[i] = all[i].ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    }
    return (int)k;
}

int agw_host_is_address(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    char tmp[64];
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof(tmp)) {
        memcpy(tmp, host + 1, n - 2);
        tmp[n - 2] = '\0';
        host = tmp;
    }
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

void agw_endpoint_address(const struct sockaddr_storage *addr, socklen_t len, char *out, size_t outlen)
{
    char ip[INET6_ADDRSTRLEN];
    if (len == 0 || addr == NULL) {
        snprintf(out, outlen, "-");
    } else if (addr->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        snprintf(out, outlen, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    } else if (addr->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
        snprintf(out, outlen, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, outlen, "?");
    }
}
