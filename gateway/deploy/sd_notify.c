/* sd_notify.c: the sd_notify(3) datagram (see sd_notify.h). */
#include "deploy/sd_notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"

int agw_sd_notify(const char *state)
{
    const char *name = getenv("NOTIFY_SOCKET");
    if (name == NULL || *name == '\0')
        return 0;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(name);
    if (name[0] != '/' && name[0] != '@') {
        agw_log(AGW_LOG_WARN, "NOTIFY_SOCKET=%s is not a socket path or @abstract name: the service manager "
                "is not told the gateway's state", name);
        return -1;
    }
    if (len >= sizeof(addr.sun_path)) {
        agw_log(AGW_LOG_WARN, "NOTIFY_SOCKET=%.40s… is longer than a socket address holds (%zu bytes): the "
                "service manager is not told the gateway's state", name, sizeof(addr.sun_path) - 1);
        return -1;
    }
    memcpy(addr.sun_path, name, len);
    if (name[0] == '@')
        addr.sun_path[0] = '\0'; /* the abstract namespace: the name is the bytes after the NUL */
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (name[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        agw_log(AGW_LOG_WARN, "sd_notify: socket: %s", strerror(errno));
        return -1;
    }
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr, alen);
    int err = errno;
    close(fd);
    if (n < 0) {
        agw_log(AGW_LOG_WARN, "sd_notify: cannot tell the service manager (%s) \"%.40s\": %s", name, state,
                strerror(err));
        return -1;
    }
    return 1;
}

int agw_sd_notifyf(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return agw_sd_notify(msg);
}
