/* file.h: opening files the gateway reads at load time (certificates, keys, CA bundles) without
 * ever waiting on them. */
#ifndef AGW_FILE_H
#define AGW_FILE_H

/* Opens path (symlinks followed) for reading, without blocking, and returns the descriptor (the
 * caller closes it) when it is a regular file. Otherwise returns -1 with *why set to a static
 * text: strerror's, "a directory", or "not a regular file (a FIFO, a socket or a device)". A FIFO
 * (whose open would wait for a writer) or a device (whose reads may never end) is refused at once. */
int agw_file_open_regular(const char *path, const char **why);

#endif
