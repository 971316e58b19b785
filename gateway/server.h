/* server.h: the serving process: h2o's global configuration, listening sockets (one per worker
 * per listener, SO_REUSEPORT), TLS contexts with ALPN (h2, http/1.1), the worker threads and the
 * signals that stop them. */
#ifndef AGW_SERVER_H
#define AGW_SERVER_H

#include "config.h"

/* Serves conf until SIGTERM or SIGINT. Returns the process exit status: 0 after a signal, 1 when
 * start-up failed (the reason is logged: a port in use, an unreadable certificate, …). */
int agw_server_run(agw_config_t *conf);

#endif
