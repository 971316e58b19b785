/* scratch.h: a worker's scratch buffers (part of agw_worker): reused by every response and
 * upstream answer so that the hot path does not allocate. Only the worker's thread uses them, and
 * each only between its reset and its copy out (never across a return to the loop). Zeroed memory
 * is empty scratch; the worker is never freed (agw_worker_stop), so neither is it.
 */
#ifndef AGW_WORKER_SCRATCH_H
#define AGW_WORKER_SCRATCH_H

#include "base/buf.h"
#include "script/resp_headers.h"

typedef struct agw_worker_scratch {
    agw_buf_t out;                   /* a response's body as it is encoded (core.c, request_log.c) */
    agw_buf_t hdrs;                  /* an upstream answer's headers for Lua (core.c) */
    agw_resp_headers_t resp_headers; /* a script's response headers (core.respond) */
} agw_worker_scratch_t;

#endif
