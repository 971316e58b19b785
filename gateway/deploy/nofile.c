/* nofile.c: raising RLIMIT_NOFILE (see nofile.h). */
#include "deploy/nofile.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "base/log.h"

#define AGW_NOFILE_CLIENT_MIN 1024 /* descriptors left for clients, listeners and files, at least */

uint64_t agw_nofile_raise(uint64_t upstream_fds)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        agw_log(AGW_LOG_WARN, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return 0;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
        else
            agw_log(AGW_LOG_WARN, "cannot raise the open-file limit from %llu to %llu: %s",
                    (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, strerror(errno));
    }
    uint64_t cur = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    if (upstream_fds > 0 && (cur < upstream_fds || cur - upstream_fds < AGW_NOFILE_CLIENT_MIN))
        agw_log(AGW_LOG_WARN, "the open-file limit is %llu, and the upstream pools alone may open %llu "
                "connections (workers x max_connections): raise it (LimitNOFILE= in the systemd unit, "
                "ulimit -n) or lower max_connections, or calls will fail with 'overload' and clients "
                "will be refused", (unsigned long long)cur, (unsigned long long)upstream_fds);
    return cur;
}
