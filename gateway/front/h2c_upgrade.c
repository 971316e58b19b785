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
    (void)connected_at;
    /* h2o keeps an HTTP/1.1 connection whose Connection field has no keep-alive only without that
     * field, and an upgrade request has one ("Upgrade, HTTP2-Settings"): every declined upgrade
     * closed its connection (curl --http2 to an http:// URL reconnected for each request, and a
     * request pipelined behind was dropped). HTTP/1.1 is persistent unless "close" (RFC 9112 §9.3),
     * and a draining server closes (as h2o's fixup_request does). */
    if (req->version >= 0x101 && !req->conn->ctx->shutdown_requested) {
        ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_CONNECTION, -1);
        if (i < 0 || !h2o_contains_token(req->headers.entries[i].value.base, req->headers.entries[i].value.len,
                                         H2O_STRLIT("close"), ','))
            req->http1_is_persistent = 1;
    }
    return -1;
}

int agw_h2c_upgrade_declined(void)
{
    return agw_interposed("h2o_http2_handle_upgrade", (void *)h2o_http2_handle_upgrade);
}
