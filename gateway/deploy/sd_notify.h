/* sd_notify.h: telling a service manager (systemd) how the gateway is doing, without libsystemd.
 *
 * The protocol is sd_notify(3)'s: when the manager started us with Type=notify it sets
 * $NOTIFY_SOCKET to an AF_UNIX datagram socket (a path, or "@name" for the abstract namespace),
 * and each state change is one datagram of "KEY=value" lines. The gateway sends
 *   READY=1         once the first generation serves (every worker took it; /readyz says 200), and
 *                   again after each reload, whether it succeeded or not (the gateway serves);
 *   RELOADING=1     when a SIGHUP reload starts (with MONOTONIC_USEC, as systemd 253 asks);
 *   STOPPING=1      when SIGTERM/SIGINT starts the drain;
 *   STATUS=…        a line for `systemctl status`, with each of the above.
 * Without $NOTIFY_SOCKET (not under systemd, or another Type) nothing is sent. */
#ifndef AGW_SD_NOTIFY_H
#define AGW_SD_NOTIFY_H

/* Sends state ("READY=1\nSTATUS=serving", newline-separated assignments) to $NOTIFY_SOCKET.
 * Returns 1 when a datagram was sent, 0 when $NOTIFY_SOCKET is unset or empty, -1 when it could
 * not be sent (a name too long for sockaddr_un, a socket that is gone: logged as a warning, the
 * gateway goes on). Blocking is not a concern: a datagram to the manager is never held up. */
int agw_sd_notify(const char *state);

/* agw_sd_notify with a printf-style message. */
int agw_sd_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
