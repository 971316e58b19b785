/* file.c: see file.h. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int agw_file_open_regular(const char *path, const char **why)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    if (fstat(fd, &st) != 0)
        *why = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        *why = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file (a FIFO, a socket or a device)";
    else
        return fd;
    close(fd);
    return -1;
}
