/* redis.h: the gateway's Redis client, one per worker, on the worker's libev loop (DESIGN §3, §9.1).
 *
 * Every Redis user of the gateway (the cache's second tier, cluster-wide rate limits) goes through
 * this client. It wraps hiredis 0.14's asynchronous API with its libev adapter and adds what that
 * version lacks:
 *  - a command timeout: each command gets its own ev_timer of conf.timeout_ms. A command that
 *    times out fails (err "timeout", counted as an error and a timeout) and the connection is
 *    dropped: every other command on it fails too, and a reply that comes late can never be read
 *    as the answer to a later command (Redis answers in order on one connection);
 *  - reconnection with backoff: after a refused, reset, closed, timed out or lying connection the
 *    client waits 50 ms, doubling up to 5 s (each wait jittered between 75 % and 100 %), then
 *    connects again; a connection that does not complete within connect_timeout_ms is dropped;
 *  - SELECT db (and AUTH when the URL carries a password) before any caller's command: until both
 *    succeeded the client is not ready and agw_redis_command fails at once.
 *
 * Nothing blocks and nothing here is thread-safe: one client belongs to one loop. A Redis that is
 * down, hangs, resets or answers garbage costs a caller at most timeout_ms (then an error), never a
 * crash or a hang. hiredis parses replies; a protocol error (bytes that are not RESP) drops the
 * connection like a reset. Reply types are the caller's to check: a Redis that answers a GET with
 * an integer is answered as such.
 *
 * Logging: an outage is two lines, whatever its length: its start (warn: the address and the
 * reason: connection lost, cannot connect, a command timed out) and its end (info: "connected
 * again after S s down; N commands failed meanwhile", N counting the callers' commands that
 * failed from the start line on). Never a line per failed attempt, command or interval.
 */
#ifndef AGW_REDIS_H
#define AGW_REDIS_H

#include <stddef.h>
#include <stdint.h>

struct ev_loop;
struct redisReply; /* <hiredis/hiredis.h>: type (REDIS_REPLY_*), str/len, integer, element[] */

/* Where the client connects and how long it waits (gateway.lua `redis = { url, timeout_ms }`). */
typedef struct agw_redis_conf {
    char *host;                     /* IPv4/IPv6 literal or name ("127.0.0.1"); owned (malloc) */
    int port;                       /* TCP port (default 6379) */
    int db;                         /* database number for SELECT (default 0, 0..1,000,000) */
    char *user;                     /* ACL user for AUTH user pass, or NULL; owned */
    char *password;                 /* password for AUTH, or NULL (no AUTH); owned */
    uint64_t timeout_ms;            /* each command's timeout, ms (default 5) */
    uint64_t connect_timeout_ms;    /* a connection attempt's limit, ms (default max(100, 20 x timeout_ms)) */
} agw_redis_conf_t;

/* Parses url, "redis://[[user]:password@]host[:port][/db]" (host may be a [v6] literal), into
 * *out with timeout_ms as given (connect_timeout_ms derived). Returns 0, or -1 with a message
 * naming the part that is wrong in err (errlen bytes, NUL-terminated) and *out untouched. Free the
 * result with agw_redis_conf_clear. */
int agw_redis_parse_url(const char *url, uint64_t timeout_ms, agw_redis_conf_t *out, char *err, size_t errlen);

/* Frees the strings of c and zeroes it (the struct belongs to the caller). */
void agw_redis_conf_clear(agw_redis_conf_t *c);

/* 1 when a and b name the same server, database, credentials and timeouts. */
int agw_redis_conf_same(const agw_redis_conf_t *a, const agw_redis_conf_t *b);

/* Counters of one client, written by its loop's thread only (relaxed atomic stores, metrics.h's
 * AGW_M_* rule) and read by the admin thread at a scrape. */
typedef struct agw_redis_stats {
    uint64_t commands;              /* commands sent */
    uint64_t errors;                /* commands that failed: error reply, timeout, connection lost,
                                       not ready (timeouts included) */
    uint64_t timeouts;              /* commands that failed by their timeout */
    uint64_t replies;               /* commands answered (any reply but an error reply) */
    uint64_t latency_us_sum;        /* sum of the answered commands' latencies, microseconds */
    uint64_t latency[8];            /* answered commands by latency, us: <=100 250 500 1000 2500 5000 10000 +Inf */
    uint64_t connects;              /* connections that became ready */
    uint64_t disconnects;           /* ready connections lost or dropped */
    uint64_t up;                    /* gauge: 1 while a connection is ready */
} agw_redis_stats_t;

/* Latency bucket bounds of agw_redis_stats_t.latency, microseconds (the last is +Inf). */
#define AGW_REDIS_LATENCY_BOUNDS {100, 250, 500, 1000, 2500, 5000, 10000}

/* The most elements a reply's arrays may claim in all (nested ones counted): more drops the
 * connection as a protocol error (the client's commands fail, it connects again). The gateway's
 * longest reply is the limits script's, 2 + 3 per rule of a request (limits/limit_redis.h). */
#define AGW_REDIS_MAX_ELEMENTS 1024

/* The most bytes a reply may take: more drops the connection as a protocol error, counted as they
 * arrive (its strings in all, and the reader's unparsed bytes after each read). The gateway's
 * largest reply is a cached section's lookup, at most AGW_CACHE_ENTRY_MAX bytes of value and a
 * 16-byte tag (cache/entry.h; worker/cache.c holds them together) and its framing. hiredis 0.14 buffers a bulk string until it is whole, with no
 * limit of its own: a server that claims 400 MB and sends it as fast as read would have a worker
 * buffer it for as long as the command's timeout lets it. */
#define AGW_REDIS_MAX_REPLY_BYTES ((size_t)4 * 1024 * 1024 + 1024)

struct redisReadTask;

/* What the reply being read claims so far, for a hiredis reader's createArray and createString
 * (this client's, and the admin purge's blocking connection, cache/purge.c): its arrays' elements
 * and its strings' bytes, each in all (nested arrays and an array's strings add up). hiredis 0.14
 * has no limit of its own: its reader allocates what an array claims at once ("*2147483647" alone
 * took a worker 16 GB), and each string of an array leaves its buffer once made (600 strings of
 * 8 KB passed a bound on the unparsed bytes alone). */
typedef struct agw_redis_reply_count {
    long long elements;
    size_t bytes;
} agw_redis_reply_count_t;

/* Counts the n elements array task t claims into *c (a reply's top task, no parent, starts both
 * counts again); 1 when the elements pass max in all. */
int agw_redis_count_array(const struct redisReadTask *t, int n, agw_redis_reply_count_t *c, long long max);

/* Counts the n bytes string task t holds into *c (a string at the top is a reply of its own); 1 when
 * the bytes pass max in all. */
int agw_redis_count_string(const struct redisReadTask *t, size_t n, agw_redis_reply_count_t *c, size_t max);

typedef struct agw_redis agw_redis_t;

/* A command's answer. Exactly one of reply and err is non-NULL: reply is the server's answer (any
 * type but an error reply), valid only during the callback (hiredis frees it afterwards: copy what
 * you keep); err is a static or client-owned message ("timeout", "connection lost: …", an error
 * reply's text, "client closed"), also valid only during the callback. data is the caller's. The
 * callback may issue new commands; it must not free the client. */
typedef void (*agw_redis_cb)(void *data, const struct redisReply *reply, const char *err);

/* A client for conf (copied) on loop; it starts connecting at once. stats: where its counters go
 * (the caller's, e.g. the worker's metrics; must outlive the client), or NULL for none. Never
 * NULL (aborts on allocation failure, as the rest of the gateway). */
agw_redis_t *agw_redis_new(struct ev_loop *loop, const agw_redis_conf_t *conf, agw_redis_stats_t *stats);

/* Closes the connection, stops every timer and frees the client. Commands still waiting get their
 * callback with err "client closed" before this returns. Not from inside a callback. */
void agw_redis_free(agw_redis_t *r);

/* 1 when a connection is ready (connected, AUTH and SELECT done). */
int agw_redis_ready(const agw_redis_t *r);

/* Sends the command argv[0..argc-1] (binary-safe: argvlen[i] bytes each, argvlen NULL for
 * NUL-terminated strings). Returns 0: cb will be called exactly once, from the loop, within about
 * timeout_ms; or -1 when no connection is ready (counted as an error): cb is never called. */
int agw_redis_command(agw_redis_t *r, agw_redis_cb cb, void *data, int argc, const char **argv,
                      const size_t *argvlen);

/* 1 when reply is the status +OK (what AUTH, SELECT and SET answer on success; this client's
 * handshake, the cache's stores and the admin purge's connection take nothing else). */
int agw_redis_reply_is_ok(const struct redisReply *reply);

/* Drops r's connection when its replies can no longer be trusted to answer the commands they
 * come for: a caller got a reply that its command cannot have (a limits check's of another shape
 * or without this command's check number, a lookup answered with an integer or an array, a SET
 * answered other than +OK), which a server or a proxy that sent one reply twice makes of every
 * later reply. The commands waiting fail ("connection lost: " and why, a static string), the client
 * connects again with backoff, and the outage is logged. Nothing when r has no connection. May be called from a command's callback. */
void agw_redis_drop(agw_redis_t *r, const char *why);

/* A line of RESP (a status, an error, a number, a string's length) longer than this is refused as
 * it comes, by this client and the admin purge's connection: the gateway's commands get none over a
 * few hundred bytes, and hiredis 0.14 looks for a line's end from its start again at every read, so
 * a line that never ends, sent a byte at a time, cost a core. */
#define AGW_REDIS_MAX_LINE_BYTES ((size_t)64 * 1024)

/* 1 when the reader's unparsed bytes buf[pos..len) hold a line longer than AGW_REDIS_MAX_LINE_BYTES:
 * no CRLF ends one within the first AGW_REDIS_MAX_LINE_BYTES + 2 bytes. The reader's pos is always
 * at the item it is parsing (after its type byte): a line, or a string's length line, which the
 * whole string waits behind. */
int agw_redis_line_too_long(const char *buf, size_t pos, size_t len);

/* Names the client's owner in its log lines ("worker 2": "redis 127.0.0.1:6379/0 (worker 2):
 * connection lost …"), so that the outage lines of several clients, one per worker, say whose
 * they are. owner is copied (cut at 40 bytes). */
void agw_redis_set_owner(agw_redis_t *r, const char *owner);

/* The client's configuration (as given to agw_redis_new). */
const agw_redis_conf_t *agw_redis_conf(const agw_redis_t *r);

#endif
