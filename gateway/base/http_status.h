/* http_status.h: the reason phrases of HTTP status codes (RFC 9110 §15), for status lines the
 * gateway writes (h2o's HTTP/1.1 responses) and the mock upstream (tools/mock) writes. */
#ifndef AGW_HTTP_STATUS_H
#define AGW_HTTP_STATUS_H

/* The reason phrase of status ("OK", "Service Unavailable", …); "Status" for a code without one
 * here (a client must not depend on the phrase, RFC 9112 §4). A static string. */
const char *agw_http_reason(int status);

#endif
