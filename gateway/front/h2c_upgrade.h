/* h2c_upgrade.h: the cleartext upgrade to HTTP/2 (Upgrade: h2c) is not taken.
 *
 * h2o 2.2.5 upgrades an HTTP/1.1 request carrying "Connection: Upgrade, HTTP2-Settings" and
 * "Upgrade: h2c" to stream 1 of an HTTP/2 connection before any handler sees it
 * (lib/http1.c process_request calls h2o_http2_handle_upgrade). The request then reaches the
 * gateway as HTTP/2, so the checks made on an HTTP/1.1 request's raw head (guard.h: Host missing or
 * twice, Content-Length with Transfer-Encoding …) never run on it, and a proxy in front that passes
 * Upgrade on would tunnel whatever follows past its own rules ("h2c smuggling"). RFC 9113 §3.1
 * deprecates the h2c upgrade, and a server may ignore Upgrade (RFC 9110 §7.8).
 *
 * h2c_upgrade.c defines h2o_http2_handle_upgrade in the executable: libh2o calls it through its PLT
 * (Debian's build), so every call reaches this one, which declines (returns -1): h2o then serves
 * the request as the HTTP/1.1 request it is, with every check, on a connection kept unless the
 * request's Connection field says close. HTTP/2 with prior knowledge
 * ("PRI * HTTP/2.0", h2c) and over TLS (ALPN) are unchanged. Should a build not route the call
 * here (agw_h2c_upgrade_declined says so at start, and the log warns), a request upgraded anyway
 * still carries its HTTP/1.1 connection fields (Connection, HTTP2-Settings), which make an HTTP/2
 * request malformed (RFC 9113 §8.2.2): the worker answers it 400 (worker/request.c bad_framing). */
#ifndef AGW_FRONT_H2C_UPGRADE_H
#define AGW_FRONT_H2C_UPGRADE_H

/* 1 when libh2o's calls of h2o_http2_handle_upgrade reach the executable's (which declines every
 * upgrade), 0 otherwise (interpose.h). Thread-safe. */
int agw_h2c_upgrade_declined(void);

#endif
