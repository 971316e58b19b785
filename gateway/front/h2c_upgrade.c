/* h2c_upgrade.c: the cleartext upgrade to HTTP/2 declined (h2c_upgrade.h). */
#include "front/h2c_upgrade.h"
#include "front/interpose.h"

#include <h2o.h>
#include <h2o/http2.h>

/* The definition libh2o's call reaches (h2c_upgrade.h), exported whatever the build's default
 * visibility (the interposition needs it in the dynamic symbol table). h2o's own returns 0 once it
 * has sent 101 and taken the connection, -1 when it declines (no valid HTTP2-Settings): the
 * request is then processed as HTTP/1.1. */
__attribute__((visibility("default"))) int h2o_http2_handle_upgrade(h2o_req_t *req, struct timeval connected_at)
{
    (void)req, (void)connected_at;
    return -1;
}

int agw_h2c_upgrade_declined(void)
{
    return agw_interposed("h2o_http2_handle_upgrade", (void *)h2o_http2_handle_upgrade);
}
