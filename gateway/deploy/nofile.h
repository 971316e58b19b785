/* nofile.h: the open-file limit (RLIMIT_NOFILE) a gateway needs.
 *
 * Every client connection, upstream connection, listener and log is a descriptor. The soft limit
 * a process starts with is often 1024, far below what a busy gateway holds, while the hard limit
 * (systemd's LimitNOFILE=, `ulimit -Hn`) is the operator's real choice; so, as nginx's
 * worker_rlimit_nofile and Go's runtime do, the gateway raises its soft limit to the hard one at
 * start-up, and says so when even that is below what its upstream pools alone may open. */
#ifndef AGW_NOFILE_H
#define AGW_NOFILE_H

#include <stdint.h>

/* Raises the soft RLIMIT_NOFILE to the hard limit. upstream_fds is the number of upstream
 * connections the pools may hold at once (workers × Σ max_connections; 0 when some upstream has
 * no limit); when the limit left for client connections, listeners and files (the limit minus
 * upstream_fds) is under 1024, logs a warning naming both numbers and LimitNOFILE/ulimit -n.
 * Returns the soft limit in force afterwards. */
uint64_t agw_nofile_raise(uint64_t upstream_fds);

#endif
