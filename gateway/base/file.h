/* file.h: opening files the gateway reads at load time (certificates, keys, CA bundles) without
 * ever waiting on them. */
#ifndef AGW_FILE_H
#define AGW_FILE_H

#include <stddef.h>

/* Opens path (symlinks followed) for reading, without blocking, and returns the descriptor (the
 * caller closes it) when it is a regular file. Otherwise returns -1 with *why set to a static
 * text: strerror's, "a directory", or "not a regular file (a FIFO, a socket or a device)". A FIFO
 * (whose open would wait for a writer) or a device (whose reads may never end) is refused at once. */
int agw_file_open_regular(const char *path, const char **why);

/* Whether path could be opened for appending as the access log is (O_WRONLY | O_APPEND | O_CREAT,
 * front/server.c), without opening or creating it, with the calling user's rights (access(2)):
 * an existing regular file or character device (/dev/null, /dev/stdout) it may write, or a path
 * that does not exist yet (a dangling symbolic link included, whose target open would make) in a
 * folder it may make files in. A folder, a FIFO (whose open waits for a reader) or a socket is
 * refused. Returns 0, or -1 with why (whylen bytes, NUL-terminated) saying what is wrong. For
 * `aggway check` (main.c), which would otherwise pass a folder serve refuses to start with. */
int agw_file_appendable(const char *path, char *why, size_t whylen);

#endif
