/* file.c: see file.h. */
#include "base/file.h"
#include "base/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The folder part of path ("" for none, "/" for the root); the caller frees it. */
static char *folder_of(const char *path)
{
    size_t len = strlen(path);
    while (len > 0 && path[len - 1] != '/')
        len--;
    return agw_strndup(path, len > 1 ? len - 1 : len);
}

static int appendable(const char *path, char *why, size_t whylen, int depth)
{
    struct stat st;
    size_t len = strlen(path);
    if (len > 0 && path[len - 1] == '/') {
        snprintf(why, whylen, "it ends with '/', the name of a folder");
        return -1;
    }
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            snprintf(why, whylen, "it is a folder");
        else if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
            snprintf(why, whylen, "it is a %s (the gateway would wait on it)", S_ISFIFO(st.st_mode) ? "FIFO" : "socket");
        else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
            snprintf(why, whylen, "it is not a regular file");
        else if (access(path, W_OK) != 0)
            snprintf(why, whylen, "%s", strerror(errno));
        else
            return 0;
        return -1;
    }
    if (errno != ENOENT) {
        snprintf(why, whylen, "%s", strerror(errno));
        return -1;
    }
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) { /* a dangling link: open makes its target */
        char target[4096];
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        if (n < 0 || depth > 8) {
            snprintf(why, whylen, "it is a symbolic link that cannot be followed");
            return -1;
        }
        target[n] = '\0';
        if (target[0] == '/')
            return appendable(target, why, whylen, depth + 1);
        char *dir = folder_of(path);
        size_t need = strlen(dir) + 1 + (size_t)n + 1;
        char *joined = agw_malloc(need);
        snprintf(joined, need, "%s%s%s", dir, dir[0] ? "/" : "", target);
        int rc = appendable(joined, why, whylen, depth + 1);
        free(joined);
        free(dir);
        return rc;
    }
    char *dir = folder_of(path);
    const char *d = dir[0] ? dir : ".";
    int rc = -1;
    if (stat(d, &st) != 0)
        snprintf(why, whylen, "%s", errno == ENOENT ? "its folder does not exist" : strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, whylen, "its folder is not a folder");
    else if (access(d, W_OK | X_OK) != 0)
        snprintf(why, whylen, "%s", errno == EACCES ? "no file may be made in its folder (permission denied)"
                                                     : strerror(errno));
    else
        rc = 0;
    free(dir);
    return rc;
}

int agw_file_appendable(const char *path, char *why, size_t whylen)
{
    return appendable(path, why, whylen, 0);
}
