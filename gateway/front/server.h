/* server.h: the serving process: h2o's global configuration, listening sockets (one per worker
 * per listener, SO_REUSEPORT), the worker threads, and the signals: SIGTERM/SIGINT drain and stop,
 * SIGHUP reloads the scripts folder (generation.h), and with it the TLS listeners' certificates
 * and keys (listen_tls.h), SIGUSR1 reopens the access log. */
#ifndef AGW_SERVER_H
#define AGW_SERVER_H

#include "script/config.h"

/* Opens a non-blocking listening socket on host:port (host an IP literal), with SO_REUSEPORT when
 * reuse (one socket per worker), listen(2) backlog as given. Returns the fd, or -1 with a log line
 * that starts with `what` ("listen", "admin") and says why. */
int agw_listen_socket(const char *what, const char *host, int port, int reuse, int backlog);

/* Loads the scripts folder dir as generation 1 and serves it until SIGTERM or SIGINT, reloading it
 * on SIGHUP. Returns the process exit status: 0 after a signal, 1 when start-up failed (the
 * reason is logged, and "file:line: message" lines for a folder that does not load are written
 * to stderr: a port in use, an unreadable certificate, a script error, …). */
int agw_server_run(const char *dir);

#endif
