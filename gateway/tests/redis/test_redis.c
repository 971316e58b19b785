/* test_redis.c: the Redis client (redis/redis.h) against a real redis-server started on a free
 * loopback port, and against fake servers in a thread of this process that hang, answer garbage,
 * refuse the handshake or answer with the wrong types. "Given a Redis that does this, a command
 * ends like that, within its timeout, and the client recovers when Redis does." Every wait is
 * bounded; every process and thread started here is stopped here. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ev.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"
#include "tests/free_port.h"
#include "tests/loop_gap.h"
#include "redis/redis.h"
#include "cache/purge.h"

static struct ev_loop *loop;

/* The fake servers' thread stops when the process does (a loaded CI host, a sanitized build), and
 * a reply read only after a stall races the command's timer; so a command that expects a reply gets
 * ANSWER_MS, which no such stall reaches, and a wait for what will come is bounded by WAIT_S (both
 * end as soon as it comes). A test of a timeout sets its short timeout itself. */
#define ANSWER_MS 20000
#define WAIT_S 25.0

/* The value of the longest bulk string a reply may hold (7 digits of length) */
#define LONG_BULK_BYTES (AGW_REDIS_MAX_REPLY_BYTES - 12)

/* ---- helpers -------------------------------------------------------------------------------- */

typedef struct rec {
    int done;
    int type;            /* reply type, -1 for an error */
    long long integer;
    char str[256];
    size_t len;
    char err[256];
    double at;           /* ev_time() of the callback */
} rec_t;

static void on_rec(void *data, const struct redisReply *reply, const char *err)
{
    rec_t *r = data;
    r->done++;
    r->at = ev_time();
    if (err) {
        r->type = -1;
        snprintf(r->err, sizeof(r->err), "%s", err);
        return;
    }
    r->type = reply->type;
    r->integer = reply->integer;
    r->len = reply->str ? reply->len : 0;
    if (reply->str)
        memcpy(r->str, reply->str, reply->len < sizeof(r->str) ? reply->len : sizeof(r->str) - 1);
}

static int wait_until(int (*cond)(void *), void *arg, double max_s)
{
    double end = ev_time() + max_s;
    while (!cond(arg) && ev_time() < end)
        ev_run(loop, EVRUN_ONCE);
    return cond(arg);
}

static int rec_done(void *a)
{
    return ((rec_t *)a)->done > 0;
}

static int is_ready(void *a)
{
    return agw_redis_ready(a);
}

static void run_for(double s)
{
    double end = ev_time() + s;
    while (ev_time() < end)
        ev_run(loop, EVRUN_ONCE);
}

static int can_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* redis-server on 127.0.0.1:port, no persistence, requiring password when not NULL; waits
 * (bounded) until it accepts. */
static pid_t redis_start_auth(int port, const char *password)
{
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        if (password)
            execlp("redis-server", "redis-server", "--port", ports, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--requirepass", password, (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", ports, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--databases", "16", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && !can_connect(port); i++)
        usleep(10000);
    return pid;
}

static pid_t redis_start(int port)
{
    return redis_start_auth(port, NULL);
}

static void redis_stop(pid_t pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static agw_redis_conf_t conf_for(int port, int db, uint64_t timeout_ms)
{
    char url[64], err[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/%d", port, db);
    agw_redis_conf_t c;
    if (agw_redis_parse_url(url, timeout_ms, &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    return c;
}

static int cmd(agw_redis_t *r, rec_t *rec, const char *a0, const char *a1, const char *a2)
{
    memset(rec, 0, sizeof(*rec));
    const char *argv[3] = {a0, a1, a2};
    return agw_redis_command(r, on_rec, rec, a2 ? 3 : (a1 ? 2 : 1), argv, NULL);
}

/* ---- fake servers --------------------------------------------------------------------------- */

typedef enum fake_mode {
    FAKE_SILENT,        /* accepts, reads, never answers */
    FAKE_GARBAGE,       /* answers anything with bytes that are not RESP */
    FAKE_REFUSE_SELECT, /* answers SELECT with an error */
    FAKE_WRONG_TYPES,   /* +OK to SELECT, then :42 to every command */
    FAKE_CLOSE_AFTER,   /* +OK to SELECT, then closes on the next command */
    FAKE_TWICE,         /* answers every command twice (+OK +OK) */
    FAKE_EXTRA_AFTER,   /* +OK to SELECT, then :42 and an extra :43 to every command */
    FAKE_HUGE_ARRAY,    /* +OK to SELECT, then an array header claiming 2^31 - 1 elements */
    FAKE_NESTED_ARRAY,  /* +OK to SELECT, then an array of 2 arrays of 1,000 (2,002 elements in all) */
    FAKE_LONG_ARRAY,    /* +OK to SELECT, then an array of AGW_REDIS_MAX_ELEMENTS integers */
    FAKE_SCAN_HUGE,     /* +OK to SELECT, then SCAN's keys claim 2^31 - 1 elements */
    FAKE_SCAN_FOREVER,  /* +OK to SELECT, then SCAN never ends (cursor 7, no keys) */
    FAKE_SCAN_NESTED,   /* +OK to SELECT, then SCAN's keys are arrays of 40,000 elements each */
    FAKE_SCAN_DRIP,     /* +OK to SELECT, then SCAN's reply a byte every 50 ms, never whole */
    FAKE_SCAN_BIG_KEY,  /* +OK to SELECT, then SCAN's one key claims 400 MB, sent as fast as read */
    FAKE_BIG_BULK,      /* +OK to SELECT, then a bulk string claiming 400 MB, sent as fast as read */
    FAKE_LONG_BULK,     /* +OK to SELECT, then a bulk string of the most bytes a reply takes */
    FAKE_MANY_BULKS,    /* +OK to SELECT, then an array of 600 bulk strings of 8 KB (4.9 MB in all) */
    FAKE_SCAN_MANY_BIG, /* +OK to SELECT, then SCAN's keys are 20 of 1 MB each (20 MB in all) */
    FAKE_IDLE_LINE,     /* +OK to SELECT and, no command asked, "+" and 1 MB without CRLF, then a byte a ms */
    FAKE_LONG_LINE,     /* +OK to SELECT, then "+" and 100 KB without CRLF to a command, then nothing */
    FAKE_SELECT_INT,    /* :0 to SELECT (not +OK), then :42 */
    FAKE_SCAN_FOREIGN,  /* +OK to SELECT, SCAN's keys one under the prefix and two others, then each
                           UNLINK answered with the number of keys it names */
    FAKE_SCAN_LONG_LINE, /* +OK to SELECT, then SCAN answered "+" and 100 KB without CRLF */
} fake_mode_t;

typedef struct fake {
    fake_mode_t mode;
    int lfd, port;
    pthread_t thread;
    int stop;
    int accepted; /* connections accepted (atomic) */
    double accepted_at[8]; /* ev_time() of the first 8 (written before accepted counts them) */
} fake_t;

/* Complete RESP commands at the start of buf (n bytes); *used: the bytes they take. */
static int count_commands(const char *buf, size_t n, size_t *used)
{
    int cmds = 0;
    size_t i = 0;
    *used = 0;
    while (i < n && buf[i] == '*') {
        long argc = strtol(buf + i + 1, NULL, 10);
        const char *nl = memchr(buf + i, '\n', n - i);
        if (!nl)
            break;
        i = (size_t)(nl - buf) + 1;
        for (long a = 0; a < argc; a++) {
            if (i >= n || buf[i] != '$')
                return cmds;
            long len = strtol(buf + i + 1, NULL, 10);
            nl = memchr(buf + i, '\n', n - i);
            if (!nl)
                return cmds;
            i = (size_t)(nl - buf) + 1 + (size_t)len + 2;
            if (i > n)
                return cmds;
        }
        cmds++;
        *used = i;
    }
    return cmds;
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
        struct timeval tv = {0, 20000};
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(f->lfd, &rs);
        if (select(f->lfd + 1, &rs, NULL, NULL, &tv) <= 0)
            continue;
        int c = accept(f->lfd, NULL, NULL);
        if (c < 0)
            continue;
        int nth_conn = __atomic_load_n(&f->accepted, __ATOMIC_RELAXED);
        if (nth_conn < 8)
            f->accepted_at[nth_conn] = ev_time();
        __atomic_add_fetch(&f->accepted, 1, __ATOMIC_RELEASE);
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        char buf[4096];
        size_t have = 0;
        int answered = 0, before = 0; /* commands answered in buf, and before buf started over */
        while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
            ssize_t n = read(c, buf + have, sizeof(buf) - have);
            if (n == 0)
                break;
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                break;
            }
            have += (size_t)n;
            size_t used;
            int cmds = count_commands(buf, have, &used);
            for (; answered < cmds; answered++) {
                const char *out = NULL;
                int nth = before + answered; /* this command's number on the connection, from 0 */
                switch (f->mode) {
                case FAKE_SILENT: break;
                case FAKE_GARBAGE: out = "HTTP/1.1 400 Bad Request\r\n\r\n"; break;
                case FAKE_REFUSE_SELECT: out = "-ERR DB index is out of range\r\n"; break;
                case FAKE_WRONG_TYPES: out = nth == 0 ? "+OK\r\n" : ":42\r\n"; break;
                case FAKE_CLOSE_AFTER:
                    if (nth > 0)
                        goto close_conn;
                    out = "+OK\r\n";
                    break;
                case FAKE_TWICE: out = "+OK\r\n+OK\r\n"; break;
                case FAKE_EXTRA_AFTER: out = nth == 0 ? "+OK\r\n" : ":42\r\n:43\r\n"; break;
                case FAKE_HUGE_ARRAY: out = nth == 0 ? "+OK\r\n" : "*2147483647\r\n"; break;
                case FAKE_NESTED_ARRAY:
                    if (nth > 0) {
                        static char two[32 + 2 * (8 + 4 * 1000)];
                        int at = snprintf(two, sizeof(two), "*2\r\n");
                        for (int k = 0; k < 2; k++) {
                            at += snprintf(two + at, sizeof(two) - (size_t)at, "*1000\r\n");
                            for (int i = 0; i < 1000; i++, at += 4)
                                memcpy(two + at, ":7\r\n", 4);
                        }
                        two[at] = '\0';
                        out = two;
                    } else {
                        out = "+OK\r\n";
                    }
                    break;
                case FAKE_SCAN_HUGE: out = nth == 0 ? "+OK\r\n" : "*2\r\n$1\r\n0\r\n*2147483647\r\n"; break;
                case FAKE_SCAN_FOREVER: out = nth == 0 ? "+OK\r\n" : "*2\r\n$1\r\n7\r\n*0\r\n"; break;
                case FAKE_SCAN_NESTED:
                    if (nth > 0) {
                        static char nested[64 + 4 * 40000 + 16];
                        int at = snprintf(nested, sizeof(nested), "*2\r\n$1\r\n0\r\n*2\r\n*40000\r\n");
                        for (int i = 0; i < 40000; i++)
                            memcpy(nested + at + 4 * i, ":0\r\n", 4);
                        snprintf(nested + at + 4 * 40000, 16, "*40000\r\n");
                        out = nested;
                    } else {
                        out = "+OK\r\n";
                    }
                    break;
                case FAKE_SCAN_BIG_KEY:
                case FAKE_BIG_BULK:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    static const char head[] = "*2\r\n$1\r\n0\r\n*1\r\n$400000000\r\n";
                    static const char bulk[] = "$400000000\r\n";
                    if (f->mode == FAKE_BIG_BULK ? write(c, bulk, sizeof(bulk) - 1) < 0
                                                 : write(c, head, sizeof(head) - 1) < 0)
                        goto close_conn;
                    for (int k = 0; k < 400000000 / 65536 && !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); k++) {
                        static char chunk[65536];
                        memset(chunk, 'k', sizeof(chunk));
                        if (write(c, chunk, sizeof(chunk)) < 0)
                            goto close_conn; /* (the client went: the test's point) */
                    }
                    break;
                case FAKE_SCAN_DRIP:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    if (write(c, "*2\r\n$30\r\n", 9) < 0)
                        goto close_conn;
                    while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) { /* (until the client goes or the test ends) */
                        usleep(50000);
                        if (write(c, "x", 1) < 0)
                            goto close_conn;
                    }
                    break;
                case FAKE_LONG_BULK:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    {
                        /* "$" 7 digits CRLF, n bytes, CRLF: AGW_REDIS_MAX_REPLY_BYTES in all */
                        static char longest[AGW_REDIS_MAX_REPLY_BYTES + 1];
                        size_t n = LONG_BULK_BYTES;
                        int at = snprintf(longest, sizeof(longest), "$%zu\r\n", n);
                        memset(longest + at, 'v', n);
                        memcpy(longest + at + n, "\r\n", 3);
                        out = longest;
                    }
                    break;
                case FAKE_MANY_BULKS:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    if (write(c, "*600\r\n", 6) < 0)
                        goto close_conn;
                    for (int k = 0; k < 600; k++) {
                        static char item[8 + 8192 + 2];
                        memcpy(item, "$8192\r\n", 7);
                        memset(item + 7, 'm', 8192);
                        memcpy(item + 7 + 8192, "\r\n", 2);
                        if (write(c, item, 7 + 8192 + 2) < 0)
                            goto close_conn; /* (the client went: the test's point) */
                    }
                    break;
                case FAKE_SCAN_MANY_BIG:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    if (write(c, "*2\r\n$1\r\n0\r\n*20\r\n", 16) < 0)
                        goto close_conn;
                    for (int k = 0; k < 20 && !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); k++) {
                        static char key[16 + (1 << 20) + 2];
                        int at = snprintf(key, 16, "$%d\r\n", 1 << 20);
                        memset(key + at, 'k', 1 << 20);
                        memcpy(key + at + (1 << 20), "\r\n", 2);
                        if (write(c, key, (size_t)at + (1 << 20) + 2) < 0)
                            goto close_conn; /* (the client went: the test's point) */
                    }
                    break;
                case FAKE_IDLE_LINE:
                    if (nth > 0)
                        break;
                    if (write(c, "+OK\r\n+", 6) < 0)
                        goto close_conn;
                    {
                        static char chunk[65536];
                        memset(chunk, 'a', sizeof(chunk));
                        for (int k = 0; k < 16; k++)
                            if (write(c, chunk, sizeof(chunk)) < 0)
                                goto close_conn; /* (the client went: the test's point) */
                        for (int k = 0; k < 3000 && !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); k++) {
                            usleep(1000);
                            if (write(c, "a", 1) < 0)
                                goto close_conn;
                        }
                    }
                    break;
                case FAKE_LONG_LINE:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    if (write(c, "+", 1) < 0)
                        goto close_conn;
                    {
                        static char chunk[100 * 1024];
                        memset(chunk, 'a', sizeof(chunk));
                        if (write(c, chunk, sizeof(chunk)) < 0)
                            goto close_conn;
                    }
                    break;
                case FAKE_SELECT_INT: out = nth == 0 ? ":0\r\n" : ":42\r\n"; break;
                case FAKE_SCAN_FOREIGN:
                    if (nth == 0) {
                        out = "+OK\r\n";
                    } else if (nth == 1) {
                        out = "*2\r\n$1\r\n0\r\n*3\r\n$9\r\nagw:{p}:a\r\n$16\r\nagw:rl:{x}:1.2.3\r\n$13\r\nsession:alice\r\n";
                    } else {
                        static char n_keys[32]; /* the command's argument count, less UNLINK itself */
                        snprintf(n_keys, sizeof(n_keys), ":%ld\r\n", strtol(buf + 1, NULL, 10) - 1);
                        out = n_keys; /* (one command in buf: the purge waits for each reply) */
                    }
                    break;
                case FAKE_SCAN_LONG_LINE:
                    if (nth == 0) {
                        out = "+OK\r\n";
                        break;
                    }
                    if (write(c, "+", 1) < 0)
                        goto close_conn;
                    {
                        static char chunk[100 * 1024];
                        memset(chunk, 'a', sizeof(chunk));
                        if (write(c, chunk, sizeof(chunk)) < 0)
                            goto close_conn;
                    }
                    break;
                case FAKE_LONG_ARRAY:
                    if (nth > 0) {
                        static char longest[16 + 4 * AGW_REDIS_MAX_ELEMENTS];
                        int at = snprintf(longest, sizeof(longest), "*%d\r\n", AGW_REDIS_MAX_ELEMENTS);
                        for (int i = 0; i < AGW_REDIS_MAX_ELEMENTS; i++)
                            memcpy(longest + at + 4 * i, ":7\r\n", 4);
                        longest[at + 4 * AGW_REDIS_MAX_ELEMENTS] = '\0';
                        out = longest;
                    } else {
                        out = "+OK\r\n";
                    }
                    break;
                }
                if (out && write(c, out, strlen(out)) < 0)
                    goto close_conn;
            }
            if (used == have && answered == cmds) { /* every command read was answered: start over */
                before += answered;
                have = 0;
                answered = 0;
            }
            if (have == sizeof(buf))
                have = 0;
        }
    close_conn:
        close(c);
    }
    return NULL;
}

static void fake_start(fake_t *f, fake_mode_t mode)
{
    memset(f, 0, sizeof(*f));
    f->mode = mode;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(f->lfd, (struct sockaddr *)&a, sizeof(a));
    listen(f->lfd, 16);
    socklen_t al = sizeof(a);
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    pthread_create(&f->thread, NULL, fake_main, f);
}

static void fake_stop(fake_t *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELAXED);
    pthread_join(f->thread, NULL);
    close(f->lfd);
}

/* ---- tests: configuration ------------------------------------------------------------------- */

static void url_parts_are_parsed(void)
{
    agw_redis_conf_t c;
    char err[160];
    CHECK(agw_redis_parse_url("redis://127.0.0.1:6380/3", 5, &c, err, sizeof(err)) == 0);
    CHECK_STR(c.host, "127.0.0.1");
    CHECK(c.port == 6380 && c.db == 3 && c.timeout_ms == 5 && c.connect_timeout_ms == 100);
    CHECK(c.user == NULL && c.password == NULL);
    agw_redis_conf_clear(&c);
    CHECK(agw_redis_parse_url("redis://localhost", 50, &c, err, sizeof(err)) == 0);
    CHECK(c.port == 6379 && c.db == 0 && c.connect_timeout_ms == 1000);
    CHECK(strcmp(c.host, "127.0.0.1") == 0 || strcmp(c.host, "::1") == 0); /* resolved at load */
    agw_redis_conf_clear(&c);
    CHECK(agw_redis_parse_url("redis://app:s%40cret@[::1]:7000/0", 5, &c, err, sizeof(err)) == 0);
    CHECK_STR(c.host, "::1");
    CHECK_STR(c.user, "app");
    CHECK_STR(c.password, "s@cret");
    CHECK(c.port == 7000);
    agw_redis_conf_clear(&c);
    CHECK(agw_redis_parse_url("redis://:pw@h.invalid.:1/0", 5, &c, err, sizeof(err)) == -1);
    CHECK(strstr(err, "cannot resolve") != NULL);
    CHECK(agw_redis_parse_url("http://127.0.0.1", 5, &c, err, sizeof(err)) == -1);
    CHECK(strstr(err, "redis://") != NULL);
    CHECK(agw_redis_parse_url("redis://127.0.0.1:0", 5, &c, err, sizeof(err)) == -1);
    CHECK(strstr(err, "port") != NULL);
    CHECK(agw_redis_parse_url("redis://127.0.0.1:6379/x", 5, &c, err, sizeof(err)) == -1);
    CHECK(strstr(err, "database") != NULL);
    CHECK(agw_redis_parse_url("redis:///0", 5, &c, err, sizeof(err)) == -1);
    CHECK(strstr(err, "host") != NULL);
    CHECK(agw_redis_parse_url("redis://u@127.0.0.1", 5, &c, err, sizeof(err)) == -1);
    CHECK(agw_redis_parse_url("redis://:%zz@127.0.0.1", 5, &c, err, sizeof(err)) == -1);
}

/* ---- tests: a real Redis -------------------------------------------------------------------- */

static void set_then_get_in_the_selected_database(void)
{
    int port = free_port();
    pid_t pid = redis_start(port);
    agw_redis_conf_t c3 = conf_for(port, 3, ANSWER_MS), c0 = conf_for(port, 0, ANSWER_MS);
    agw_redis_stats_t st = {0};
    agw_redis_t *r3 = agw_redis_new(loop, &c3, &st), *r0 = agw_redis_new(loop, &c0, NULL);
    CHECK(wait_until(is_ready, r3, WAIT_S));
    CHECK(wait_until(is_ready, r0, WAIT_S));
    rec_t a, b;
    /* binary-safe values */
    const char *argv[3] = {"SET", "k", "v\0x"};
    size_t lens[3] = {3, 1, 3};
    memset(&a, 0, sizeof(a));
    CHECK(agw_redis_command(r3, on_rec, &a, 3, argv, lens) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S));
    CHECK(a.type == REDIS_REPLY_STATUS);
    CHECK(cmd(r3, &a, "GET", "k", NULL) == 0);
    CHECK(cmd(r0, &b, "GET", "k", NULL) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S) && wait_until(rec_done, &b, WAIT_S));
    CHECK(a.type == REDIS_REPLY_STRING && a.len == 3 && memcmp(a.str, "v\0x", 3) == 0);
    CHECK(b.type == REDIS_REPLY_NIL); /* db 0 does not see db 3's key: SELECT happened */
    CHECK(a.done == 1 && b.done == 1);
    /* an error reply is an error */
    CHECK(cmd(r3, &a, "INCR", "k", NULL) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S));
    CHECK(a.type == -1 && strstr(a.err, "not an integer") != NULL);
    CHECK(st.commands == 3 && st.errors == 1 && st.replies == 2 && st.connects == 1 && st.up == 1);
    agw_redis_free(r3);
    agw_redis_free(r0);
    CHECK(st.up == 0);
    agw_redis_conf_clear(&c3);
    agw_redis_conf_clear(&c0);
    redis_stop(pid);
}

/* A redis-server on a free port and a client of its db 0, ready: what the cases of one server and
 * one client begin with (served_start) and end with (served_stop). */
typedef struct served {
    int port;
    pid_t pid;
    agw_redis_conf_t c;
    agw_redis_stats_t st;
    agw_redis_t *r;
} served_t;

static void served_start(served_t *sv, uint64_t timeout_ms)
{
    memset(sv, 0, sizeof(*sv));
    sv->port = free_port();
    sv->pid = redis_start(sv->port);
    sv->c = conf_for(sv->port, 0, timeout_ms);
    sv->r = agw_redis_new(loop, &sv->c, &sv->st);
    CHECK(wait_until(is_ready, sv->r, WAIT_S));
}

static void served_stop(served_t *sv)
{
    agw_redis_free(sv->r);
    agw_redis_conf_clear(&sv->c);
    redis_stop(sv->pid);
}

static void redis_stopped_mid_run_fails_fast_and_client_reconnects(void)
{
    served_t sv;
    served_start(&sv, ANSWER_MS); /* the close, not a timeout, ends the GET */
    agw_redis_t *r = sv.r;
    rec_t a;
    CHECK(cmd(r, &a, "SET", "k", "1") == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S) && a.type == REDIS_REPLY_STATUS);
    redis_stop(sv.pid);
    /* the close is seen by the loop: the command in flight or the next one fails, never hangs */
    double t0 = ev_time();
    loop_gap_reset();
    int sent = cmd(r, &a, "GET", "k", NULL);
    if (sent == 0) {
        CHECK(wait_until(rec_done, &a, WAIT_S));
        CHECK(a.type == -1);
        CHECK(a.at - t0 < 2.0 + loop_gap_s()); /* late by no more than a stall */
    }
    run_for(0.05);
    CHECK(!agw_redis_ready(r));
    CHECK(cmd(r, &a, "GET", "k", NULL) == -1); /* not ready: refused at once, no callback */
    run_for(0.05);
    CHECK(a.done == 0);
    CHECK(sv.st.disconnects == 1 && sv.st.up == 0);
    sv.pid = redis_start(sv.port);
    CHECK(wait_until(is_ready, r, WAIT_S)); /* backoff is at most 5 s */
    CHECK(cmd(r, &a, "PING", NULL, NULL) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S) && a.type == REDIS_REPLY_STATUS);
    CHECK(sv.st.connects == 2 && sv.st.up == 1);
    served_stop(&sv);
}

/* The reply and the command's timeout come due in the same loop iteration (the loop was busy past
 * the timeout, and the reply came meanwhile): the reply is the answer, not a timeout, and the
 * connection stays (the commands' timeouts run at the lowest priority, after the replies). */
static int socket_to_port(int port)
{
    for (int fd = 3; fd < 4096; fd++) {
        struct sockaddr_in sa;
        socklen_t len = sizeof(sa);
        if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sin_family == AF_INET &&
            ntohs(sa.sin_port) == port)
            return fd;
    }
    return -1;
}

static void a_reply_in_hand_when_the_timeout_is_due_is_the_answer(void)
{
    served_t sv;
    served_start(&sv, 30);
    agw_redis_t *r = sv.r;
    rec_t a, b;
    CHECK(cmd(r, &a, "SET", "k1", "one") == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S));
    for (int i = 0; i < 3; i++) {
        CHECK(cmd(r, &a, "GET", "k1", NULL) == 0);
        ev_run(loop, EVRUN_NOWAIT); /* (hiredis writes the command) */
        /* busy past the 30 ms timeout, and until the reply is in (bounded: a loaded machine) */
        usleep(40000);
        struct pollfd pfd = {.fd = socket_to_port(sv.port), .events = POLLIN};
        CHECK(pfd.fd >= 0 && poll(&pfd, 1, 5000) == 1);
        CHECK(wait_until(rec_done, &a, WAIT_S));
        CHECK(a.type == REDIS_REPLY_STRING && a.len == 3 && memcmp(a.str, "one", 3) == 0);
    }
    CHECK(sv.st.timeouts == 0 && agw_redis_ready(r));
    CHECK(cmd(r, &b, "GET", "k1", NULL) == 0);
    CHECK(wait_until(rec_done, &b, WAIT_S) && b.type == REDIS_REPLY_STRING);
    served_stop(&sv);
}

static void hanging_redis_times_out_and_a_late_reply_answers_nothing(void)
{
    served_t sv;
    served_start(&sv, 50);
    agw_redis_t *r = sv.r;
    rec_t a, b;
    CHECK(cmd(r, &a, "SET", "k1", "one") == 0);
    CHECK(cmd(r, &b, "SET", "k2", "two") == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S) && wait_until(rec_done, &b, WAIT_S));
    kill(sv.pid, SIGSTOP);
    double t0 = ev_time();
    loop_gap_reset();
    CHECK(cmd(r, &a, "GET", "k1", NULL) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S));
    CHECK(a.type == -1 && strstr(a.err, "timeout") != NULL);
    CHECK(a.at - t0 >= 0.045); /* not before its timeout */
    CHECK(a.at - t0 < 2.0 + loop_gap_s()); /* and soon after it, though the server never answers */
    CHECK(sv.st.timeouts == 1);
    CHECK(!agw_redis_ready(r)); /* the connection was dropped */
    kill(sv.pid, SIGCONT);
    CHECK(wait_until(is_ready, r, WAIT_S));
    /* the stopped server now answers the old GET k1 on the old connection: nobody reads it as
     * the answer of GET k2 on the new one */
    CHECK(cmd(r, &b, "GET", "k2", NULL) == 0);
    CHECK(wait_until(rec_done, &b, WAIT_S));
    CHECK(b.type == REDIS_REPLY_STRING && b.len == 3 && memcmp(b.str, "two", 3) == 0);
    CHECK(a.done == 1 && b.done == 1);
    served_stop(&sv);
}

static void password_in_the_url_is_sent_with_auth(void)
{
    int port = free_port();
    pid_t pid = redis_start_auth(port, "s3cret");
    char url[96], err[128];
    agw_redis_conf_t good, bad;
    snprintf(url, sizeof(url), "redis://:s3cret@127.0.0.1:%d/0", port);
    CHECK(agw_redis_parse_url(url, ANSWER_MS, &good, err, sizeof(err)) == 0);
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d/0", port);
    CHECK(agw_redis_parse_url(url, ANSWER_MS, &bad, err, sizeof(err)) == 0);
    agw_redis_t *r = agw_redis_new(loop, &good, NULL), *rb = agw_redis_new(loop, &bad, NULL);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    CHECK(cmd(r, &a, "PING", NULL, NULL) == 0);
    CHECK(wait_until(rec_done, &a, WAIT_S) && a.type == REDIS_REPLY_STATUS);
    run_for(0.2);
    CHECK(!agw_redis_ready(rb)); /* AUTH refused: never ready, callers refused at once */
    CHECK(cmd(rb, &a, "PING", NULL, NULL) == -1);
    agw_redis_free(r);
    agw_redis_free(rb);
    agw_redis_conf_clear(&good);
    agw_redis_conf_clear(&bad);
    redis_stop(pid);
}

static void commands_in_flight_get_client_closed_on_free(void)
{
    int port = free_port();
    pid_t pid = redis_start(port);
    agw_redis_conf_t c = conf_for(port, 0, 1000);
    agw_redis_t *r = agw_redis_new(loop, &c, NULL);
    CHECK(wait_until(is_ready, r, WAIT_S));
    kill(pid, SIGSTOP);
    rec_t a;
    CHECK(cmd(r, &a, "GET", "k", NULL) == 0);
    agw_redis_free(r);
    CHECK(a.done == 1 && a.type == -1);
    CHECK_STR(a.err, "client closed");
    run_for(0.05); /* nothing of the freed client runs afterwards (ASan would say) */
    agw_redis_conf_clear(&c);
    redis_stop(pid);
}

/* ---- tests: fake servers -------------------------------------------------------------------- */

/* A fake server and a client of it: what each test below starts and stops. */
typedef struct fake_client {
    fake_t f;
    agw_redis_conf_t c;
    agw_redis_stats_t st;
    agw_redis_t *r;
} fake_client_t;

/* wait_until's condition: fake f (a fake_t) accepted a second connection. */
static int fake_accepted_two(void *f)
{
    return __atomic_load_n(&((fake_t *)f)->accepted, __ATOMIC_RELAXED) >= 2;
}

/* Starts a fake answering as mode and a client of it (database db, commands limited to
 * timeout_ms); the client connects on the loop as the tests run it. */
static agw_redis_t *fake_client_start(fake_client_t *fc, fake_mode_t mode, int db, uint64_t timeout_ms)
{
    memset(fc, 0, sizeof(*fc));
    fake_start(&fc->f, mode);
    fc->c = conf_for(fc->f.port, db, timeout_ms);
    fc->r = agw_redis_new(loop, &fc->c, &fc->st);
    return fc->r;
}

static void fake_client_stop(fake_client_t *fc)
{
    agw_redis_free(fc->r);
    agw_redis_conf_clear(&fc->c);
    fake_stop(&fc->f);
}

/* GET k on r, waited for: 1 when it was sent and answered (a holds the answer). */
static int get_k(agw_redis_t *r, rec_t *a)
{
    return cmd(r, a, "GET", "k", NULL) == 0 && wait_until(rec_done, a, WAIT_S);
}

static void silent_server_never_becomes_ready(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_SILENT, 0, 5);
    run_for(0.3); /* the handshake's limit is 100 ms; it reconnects with backoff */
    CHECK(!agw_redis_ready(r));
    rec_t a;
    CHECK(cmd(r, &a, "GET", "k", NULL) == -1);
    fake_client_stop(&fc);
}

static void garbage_answers_drop_the_connection(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_GARBAGE, 0, 5);
    run_for(0.3);
    CHECK(!agw_redis_ready(r));
    CHECK(fc.st.connects == 0);
    fake_client_stop(&fc);
}

static void refused_select_keeps_the_client_down(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_REFUSE_SELECT, 99, 5);
    run_for(0.3);
    CHECK(!agw_redis_ready(r));
    fake_client_stop(&fc);
}

static void wrong_reply_types_reach_the_caller_as_they_are(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_WRONG_TYPES, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    CHECK(get_k(r, &a));
    CHECK(a.type == REDIS_REPLY_INTEGER && a.integer == 42);
    fake_client_stop(&fc);
}

static void server_closing_mid_command_is_an_error(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_CLOSE_AFTER, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    double t0 = ev_time();
    loop_gap_reset();
    CHECK(get_k(r, &a));
    /* the close, not the command's timeout, ended it */
    CHECK(a.type == -1 && strstr(a.err, "connection lost") != NULL);
    CHECK(a.at - t0 < 4.0 + loop_gap_s());
    fake_client_stop(&fc);
}

/* hiredis aborts the process on a reply no command waits for (an assert); the client drops the
 * connection instead: at the handshake (SELECT answered twice) it never becomes ready */
static void a_reply_to_no_command_drops_the_connection_at_the_handshake(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_TWICE, 0, 5);
    run_for(0.3); /* several attempts with backoff, each dropped */
    CHECK(!agw_redis_ready(r));
    rec_t a;
    CHECK(cmd(r, &a, "GET", "k", NULL) == -1);
    fake_client_stop(&fc);
}

/* ... and after it: the command gets its own reply, the extra one drops the connection (a later
 * command fails at once or on a new connection, never with the stray :43) */
static void a_reply_to_no_command_drops_the_connection_after_an_answer(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_EXTRA_AFTER, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    CHECK(get_k(r, &a));
    CHECK(a.type == REDIS_REPLY_INTEGER && a.integer == 42);
    run_for(0.05);
    CHECK(fc.st.disconnects == 1);
    /* a second command: on the next connection (the fake answers :42 again) */
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t b;
    CHECK(get_k(r, &b));
    CHECK(b.type == REDIS_REPLY_INTEGER && b.integer == 42);
    fake_client_stop(&fc);
}

/* A GET on a client of a fake server in mode: 1 when it failed with an error holding says (printed
 * otherwise) and the connection was dropped. */
static int a_get_fails_saying(fake_mode_t mode, const char *says)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, mode, 0, ANSWER_MS);
    int ok = wait_until(is_ready, r, WAIT_S);
    rec_t a;
    ok = ok && get_k(r, &a);
    if (ok && !(a.type == -1 && strstr(a.err, says) != NULL)) {
        if (a.type == -1)
            fprintf(stderr, "  the GET failed with: %s\n", a.err);
        else
            fprintf(stderr, "  the GET was answered (a reply of hiredis type %d)\n", a.type);
        ok = 0;
    }
    run_for(0.05);
    ok = ok && fc.st.disconnects == 1;
    fake_client_stop(&fc);
    return ok;
}

#define TOO_LONG_SAYS "array reply longer than any command"
#define TOO_BIG_SAYS "reply larger than any command"

/* hiredis 0.14's reader allocates an array's claimed pointers at once: a reply claiming 2^31 - 1
 * elements took a worker 16 GB and a minute and a half. It is refused: the command fails at once
 * with the reason, and the connection is dropped (an attack review found it) */
static void an_array_reply_longer_than_any_command_takes_drops_the_connection(void)
{
    CHECK(a_get_fails_saying(FAKE_HUGE_ARRAY, TOO_LONG_SAYS));
}

/* ... as are arrays nested in one reply that claim more in all (the third review) ... */
static void nested_arrays_longer_in_all_than_any_command_takes_drop_the_connection(void)
{
    CHECK(a_get_fails_saying(FAKE_NESTED_ARRAY, TOO_LONG_SAYS));
}

/* ... and an array of the longest length taken reaches the caller */
static void an_array_reply_of_the_longest_length_taken_is_answered(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_LONG_ARRAY, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    CHECK(get_k(r, &a));
    CHECK(a.type == REDIS_REPLY_ARRAY);
    CHECK(fc.st.disconnects == 0);
    fake_client_stop(&fc);
}

/* hiredis 0.14 buffers a bulk string until it is whole, whatever it claims: a server that claims
 * 400 MB and sends it as fast as read had the worker buffer it until the command's timeout (here
 * 20 s: gigabytes). The reply is refused once its bytes pass the most a reply takes: the command
 * fails with the reason long before its timeout, and the connection is dropped (an attack review) */
static void a_reply_larger_than_any_command_takes_drops_the_connection(void)
{
    CHECK(a_get_fails_saying(FAKE_BIG_BULK, TOO_BIG_SAYS));
}

/* ... counted over its strings in all: each string of an array leaves the reader's buffer once
 * parsed, so 600 strings of 8 KB passed a bound on the unparsed bytes alone (a review of it) ... */
static void an_array_of_strings_larger_in_all_than_any_command_takes_drops_the_connection(void)
{
    CHECK(a_get_fails_saying(FAKE_MANY_BULKS, TOO_BIG_SAYS));
}

/* hiredis keeps an unfinished reply no command asked for for as long as it stays unfinished, and
 * looks for a line's end from its start again at every read: a line that never ended, sent a byte
 * a ms on an idle connection, kept a worker's core busy (an attack review). Bytes that come while
 * no command waits drop the connection at once */
static void bytes_no_command_waits_for_drop_the_connection_at_once(void)
{
    fake_client_t fc;
    fake_client_start(&fc, FAKE_IDLE_LINE, 0, ANSWER_MS);
    /* each connection: ready, then dropped at the stray bytes; the client connects again */
    CHECK(wait_until(fake_accepted_two, &fc.f, WAIT_S));
    CHECK(fc.st.connects >= 1 && fc.st.disconnects >= 1);
    fake_client_stop(&fc);
}

/* ... and a line longer than any reply has, while a command waits, fails the command with the
 * reason at once, not at its timeout (20 s here) */
static void a_line_longer_than_any_reply_has_drops_the_connection(void)
{
    CHECK(a_get_fails_saying(FAKE_LONG_LINE, "line longer than any reply has"));
}

/* AUTH and SELECT succeed with +OK alone: a server that answers SELECT with :0 never makes the
 * client ready (it connects again and again: each attempt refused) */
static void select_answered_with_other_than_ok_keeps_the_client_down(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_SELECT_INT, 0, ANSWER_MS);
    CHECK(wait_until(fake_accepted_two, &fc.f, WAIT_S));
    CHECK(!agw_redis_ready(r) && fc.st.connects == 0);
    fake_client_stop(&fc);
}

/* A caller that got a reply its command cannot have (agw_redis_drop: the cache's lookups and
 * stores, the limits' checks) drops the connection from inside its callback: the commands still
 * waiting fail with the reason, and the client connects again (a second attack review: a reply
 * sent twice left every later reply shifted onto the command after its own for seconds) */
typedef struct drop_rec {
    agw_redis_t *r;
    rec_t first;
} drop_rec_t;

static void drop_on_reply(void *data, const struct redisReply *reply, const char *err)
{
    drop_rec_t *d = data;
    on_rec(&d->first, reply, err);
    if (err == NULL)
        agw_redis_drop(d->r, "the test's reply was another command's");
}

static void a_caller_drops_a_connection_whose_replies_are_shifted(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_WRONG_TYPES, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    drop_rec_t d = {.r = r};
    const char *argv[2] = {"GET", "a"};
    CHECK(agw_redis_command(r, drop_on_reply, &d, 2, argv, NULL) == 0);
    rec_t b;
    CHECK(cmd(r, &b, "GET", "b", NULL) == 0);
    CHECK(wait_until(rec_done, &b, WAIT_S));
    CHECK(d.first.done == 1 && d.first.type == REDIS_REPLY_INTEGER);
    CHECK(b.type == -1 && strstr(b.err, "connection lost: the test's reply was another command's") != NULL);
    CHECK(fc.st.disconnects == 1);
    CHECK(wait_until(is_ready, r, WAIT_S)); /* connected again */
    fake_client_stop(&fc);
}

/* A connection dropped soon after it became ready does not start the backoff again: a server whose
 * every answer the client refuses (a caller's agw_redis_drop, right after the handshake) was
 * reconnected to 20 times a second, with two log lines each (an attack review). The waits between
 * attempts double (50, 100, 200, 400 ms, less a quarter of jitter at most); a timer is never early,
 * so the fifth connection comes 562 ms after the first at the soonest */
static int fake_accepted_five(void *f)
{
    return __atomic_load_n(&((fake_t *)f)->accepted, __ATOMIC_ACQUIRE) >= 5;
}

static void a_connection_dropped_at_once_keeps_backing_off(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_WRONG_TYPES, 0, ANSWER_MS);
    double end = ev_time() + WAIT_S;
    while (!fake_accepted_five(&fc.f) && ev_time() < end) {
        if (!wait_until(is_ready, r, WAIT_S))
            break;
        drop_rec_t d = {.r = r};
        const char *argv[2] = {"GET", "a"};
        if (agw_redis_command(r, drop_on_reply, &d, 2, argv, NULL) == 0 && !wait_until(rec_done, &d.first, WAIT_S))
            break; /* (never: the command's timeout answers it; d must outlive its callback) */
    }
    CHECK(fake_accepted_five(&fc.f));
    double took = fc.f.accepted_at[4] - fc.f.accepted_at[0];
    CHECK(took >= 0.75 * (0.05 + 0.1 + 0.2 + 0.4));
    if (took < 0.75 * (0.05 + 0.1 + 0.2 + 0.4))
        fprintf(stderr, "  five connections in %.3f s\n", took);
    fake_client_stop(&fc);
}

/* ... and a reply of the most bytes taken reaches the caller whole */
static void a_reply_of_the_most_bytes_taken_is_answered(void)
{
    fake_client_t fc;
    agw_redis_t *r = fake_client_start(&fc, FAKE_LONG_BULK, 0, ANSWER_MS);
    CHECK(wait_until(is_ready, r, WAIT_S));
    rec_t a;
    CHECK(get_k(r, &a));
    CHECK(a.type == REDIS_REPLY_STRING && a.len == LONG_BULK_BYTES);
    CHECK(fc.st.disconnects == 0);
    fake_client_stop(&fc);
}

/* The admin's purge (cache/purge.h) of the prefix "agw:{p}" against a fake server in mode, within
 * budget_s: 1 when it failed with a message holding says (printed otherwise), the keys it deleted
 * in *deleted. */
static int purge_fails_saying(fake_mode_t mode, double budget_s, const char *says, uint64_t *deleted)
{
    fake_t f;
    fake_start(&f, mode);
    agw_redis_conf_t c = conf_for(f.port, 0, 1000);
    char err[256] = "";
    *deleted = 1;
    int rc = agw_cache_redis_purge_within(&c, "agw:{p}", 7, budget_s, NULL, deleted, err, sizeof(err));
    agw_redis_conf_clear(&c);
    fake_stop(&f);
    if (rc == -1 && strstr(err, says) != NULL)
        return 1;
    fprintf(stderr, "purge: rc %d, %s\n", rc, err);
    return 0;
}

#define TOO_LONG "redis SCAN failed: the reply is an array of more elements than a purge takes"

/* The purge has a blocking connection of its own: a SCAN reply whose keys claim 2^31 - 1 elements
 * fails it with the reason instead of taking gigabytes (the second attack review) ... */
static void a_purge_refuses_a_scan_reply_longer_than_it_takes(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_HUGE, AGW_CACHE_PURGE_BUDGET_S, TOO_LONG, &deleted));
    CHECK(deleted == 0);
}

/* ... nor arrays nested in one reply that claim more in all (a third review: 250 of 65,536
 * elements each took 1.1 GB) ... */
static void a_purge_refuses_nested_arrays_longer_in_all_than_it_takes(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_NESTED, AGW_CACHE_PURGE_BUDGET_S, TOO_LONG, &deleted));
}

/* ... a reply that drips, each byte within the socket's timeout, stops at the budget (a third
 * review: it held the admin thread for as long as it dripped) ... */
static void a_purge_stops_a_reply_that_drips(void)
{
    uint64_t deleted;
    double t0 = ev_time();
    CHECK(purge_fails_saying(FAKE_SCAN_DRIP, 0.3, "redis SCAN failed: the purge's time ran out while Redis answered",
                             &deleted));
    /* (bounded from the behaviour: the budget, one byte's read, and a loaded machine's stalls) */
    CHECK(ev_time() - t0 < 0.3 + 1.0 + 10.0);
}

/* ... a reply of more bytes than it takes is refused as they come (a fourth review: one key of
 * 400 MB took 1.5 GB) ... */
static void a_purge_refuses_a_reply_larger_than_it_takes(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_BIG_KEY, AGW_CACHE_PURGE_BUDGET_S,
                             "redis SCAN failed: the reply is larger than a purge takes", &deleted));
}

/* ... as is a reply whose strings are more bytes in all than it takes: each leaves the reader's
 * buffer once made (an attack review: keys of 8 MB each added up to 6 GB) ... */
static void a_purge_refuses_keys_larger_in_all_than_it_takes(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_MANY_BIG, AGW_CACHE_PURGE_BUDGET_S,
                             "redis SCAN failed: the reply is larger than a purge takes", &deleted));
}

/* ... a line longer than any reply has fails it at once (hiredis looks for a line's end from its
 * start at every read: a 16 MB line took the admin thread 7 s of CPU; a second attack review) ... */
static void a_purge_refuses_a_line_longer_than_any_reply_has(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_LONG_LINE, AGW_CACHE_PURGE_BUDGET_S,
                             "redis SCAN failed: the reply has a line longer than any reply has", &deleted));
}

/* ... SELECT answered with other than +OK is no success (the purge went on and deleted) ... */
static void a_purge_refuses_a_select_answered_other_than_ok(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SELECT_INT, AGW_CACHE_PURGE_BUDGET_S, "redis SELECT failed: a reply other than OK",
                             &deleted));
}

/* ... and keys SCAN gives that the prefix does not name are never deleted: a server or proxy that
 * answers with others (the rate limits' counts, another application's) had them all unlinked */
static void a_purge_deletes_only_the_keys_its_prefix_names(void)
{
    fake_t f;
    fake_start(&f, FAKE_SCAN_FOREIGN);
    agw_redis_conf_t c = conf_for(f.port, 0, 1000);
    char err[256] = "";
    uint64_t deleted = 0;
    int rc = agw_cache_redis_purge_within(&c, "agw:{p}", 7, AGW_CACHE_PURGE_BUDGET_S, NULL, &deleted, err, sizeof(err));
    agw_redis_conf_clear(&c);
    fake_stop(&f);
    CHECK(rc == 0 && deleted == 1); /* (the fake answers UNLINK with the number of keys it was given) */
    if (rc != 0 || deleted != 1)
        fprintf(stderr, "  purge: rc %d, %llu deleted, %s\n", rc, (unsigned long long)deleted, err);
}

/* ... and a SCAN that never ends stops at the purge's budget, saying so */
static void a_purge_stops_a_scan_that_never_ends(void)
{
    uint64_t deleted;
    CHECK(purge_fails_saying(FAKE_SCAN_FOREVER, 0.2, "the purge stopped after 0 s with 0 keys deleted: SCAN had not ended",
                             &deleted));
}

static void nothing_listening_refuses_commands_at_once(void)
{
    int port = free_port();
    agw_redis_conf_t c = conf_for(port, 0, 5);
    agw_redis_t *r = agw_redis_new(loop, &c, NULL);
    run_for(0.1);
    CHECK(!agw_redis_ready(r));
    rec_t a;
    CHECK(cmd(r, &a, "GET", "k", NULL) == -1);
    agw_redis_free(r);
    agw_redis_conf_clear(&c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    loop = ev_default_loop(0);
    loop_gap_start(loop); /* a timer is late by at most the loop's gap (tests/loop_gap.h) */
    RUN(url_parts_are_parsed);
    RUN(set_then_get_in_the_selected_database);
    RUN(redis_stopped_mid_run_fails_fast_and_client_reconnects);
    RUN(hanging_redis_times_out_and_a_late_reply_answers_nothing);
    RUN(a_reply_in_hand_when_the_timeout_is_due_is_the_answer);
    RUN(password_in_the_url_is_sent_with_auth);
    RUN(commands_in_flight_get_client_closed_on_free);
    RUN(silent_server_never_becomes_ready);
    RUN(garbage_answers_drop_the_connection);
    RUN(refused_select_keeps_the_client_down);
    RUN(wrong_reply_types_reach_the_caller_as_they_are);
    RUN(server_closing_mid_command_is_an_error);
    RUN(nothing_listening_refuses_commands_at_once);
    RUN(a_reply_to_no_command_drops_the_connection_at_the_handshake);
    RUN(a_reply_to_no_command_drops_the_connection_after_an_answer);
    RUN(an_array_reply_longer_than_any_command_takes_drops_the_connection);
    RUN(an_array_reply_of_the_longest_length_taken_is_answered);
    RUN(nested_arrays_longer_in_all_than_any_command_takes_drop_the_connection);
    RUN(a_reply_larger_than_any_command_takes_drops_the_connection);
    RUN(an_array_of_strings_larger_in_all_than_any_command_takes_drops_the_connection);
    RUN(a_reply_of_the_most_bytes_taken_is_answered);
    RUN(bytes_no_command_waits_for_drop_the_connection_at_once);
    RUN(a_line_longer_than_any_reply_has_drops_the_connection);
    RUN(select_answered_with_other_than_ok_keeps_the_client_down);
    RUN(a_purge_refuses_a_scan_reply_longer_than_it_takes);
    RUN(a_purge_stops_a_scan_that_never_ends);
    RUN(a_purge_refuses_nested_arrays_longer_in_all_than_it_takes);
    RUN(a_purge_stops_a_reply_that_drips);
    RUN(a_purge_refuses_a_reply_larger_than_it_takes);
    RUN(a_purge_refuses_keys_larger_in_all_than_it_takes);
    RUN(a_purge_refuses_a_line_longer_than_any_reply_has);
    RUN(a_purge_refuses_a_select_answered_other_than_ok);
    RUN(a_purge_deletes_only_the_keys_its_prefix_names);
    RUN(a_caller_drops_a_connection_whose_replies_are_shifted);
    RUN(a_connection_dropped_at_once_keeps_backing_off);
    loop_gap_stop(loop);
    return CHECK_DONE();
}
