/*
 * mock_conn.c -- one HTTP/1.1 connection of aggway-mock.
 *
 * Requests are parsed with http_parser straight from each read, so a request split across
 * reads and several pipelined requests in one read both work. Every request produces exactly
 * one reply, and replies leave in request order: a reply that must wait (latency, fault) goes
 * into a FIFO queue, and the ones behind it wait their turn. A reply that can go at once while
 * nothing is queued is rendered straight into the output buffer (the hot path: no allocation,
 * one write for everything a read produced).
 *
 * Fault behaviour lives here: hang (the reply never leaves the queue), reset/short (send the
 * first `cut` bytes, then RST or FIN), drip (one byte per timer tick), huge (body generated as
 * the socket drains), close_idle (FIN some time after the reply), garbage (FIN after it).
 *
 * Memory is bounded: a request over MOCK_MAX_REQUEST_BYTES closes the connection, and reading
 * pauses while too many replies are queued or too many bytes wait to be written.
 */
#include "mock.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK (64 * 1024)
#define MAX_QUEUED 1024                 /* pause reading above this many queued replies */
#define MAX_PENDING_OUT (4 * 1024 * 1024) /* pause reading above this many unwritten bytes */
#define HUGE_STEP (64 * 1024)           /* huge body bytes generated at a time */
#define HUGE_LOW_WATER (256 * 1024)     /* generate more huge body below this many unwritten */
#define EPSILON_S 1e-4                  /* timers may fire a hair early in ev_now terms */

/* A reply that could not be written at once. */
typedef struct mock_resp {
    struct mock_resp *next;
    mock_reply rp;
    ev_tstamp ready_at;  /* earliest time the first byte may leave */
    agw_buf_t data;       /* wire bytes (for huge: the head only) */
    size_t cut;          /* > 0: send only this many bytes, then close */
    size_t sent;         /* drip: bytes handed out so far */
    uint64_t huge_off;   /* huge: body bytes generated so far */
    bool started;        /* huge: head appended */
} mock_resp;

struct mock_conn {
    ev_io rw, ww;
    ev_timer timer;        /* latency, drip pace or idle close: only one is due at a time */
    int fd;
    mock_service *svc;
    mock_conn *prev, *next; /* in svc->conns */
    http_parser parser;
    agw_buf_t url, body;     /* current request (body only kept on the admin port) */
    agw_buf_t headers;       /* its header fields, "name\0value\n" each (service ports only) */
    bool in_value;           /* the last header callback was a value */
    size_t req_bytes;       /* bytes of the current request so far */
    bool too_big;           /* the current request passed MOCK_MAX_REQUEST_BYTES */
    bool read_done;         /* no more requests will be read (close requested, EOF, error) */
    bool eof;               /* the peer half-closed: close once all replies are out */
    bool closing;           /* close once the output buffer is flushed */
    bool rst;               /* ... with SO_LINGER 0, so the peer gets RST */
    bool idle_close;        /* close once idle for idle_close_s (close_idle fault) */
    bool used;              /* a request began on it (svc->conns_unused counts the others) */
    ev_tstamp idle_close_s;
    agw_buf_t out;           /* bytes to write, from out_off on */
    size_t out_off;
    uint64_t unflushed;     /* replies whose last byte is in out but not yet written */
    mock_resp *head, *tail; /* queued replies, in request order */
    unsigned queued;
};

static void run(mock_conn *c);

mock_service *mock_conn_service(const mock_conn *c)
{
    return c->svc;
}

static struct ev_loop *loop_of(const mock_conn *c)
{
    return c->svc->srv->loop;
}

static void arm_timer(mock_conn *c, ev_tstamp after_s)
{
    ev_timer_stop(loop_of(c), &c->timer);
    ev_timer_set(&c->timer, after_s > 0 ? after_s : 0, 0);
    ev_timer_start(loop_of(c), &c->timer);
}

/* Removes the head reply: it has been fully handed to the output buffer. */
static void finish_head(mock_conn *c)
{
    mock_resp *r = c->head;
    c->head = r->next;
    if (!c->head)
        c->tail = NULL;
    c->queued--;
    c->unflushed++;
    ev_timer_stop(loop_of(c), &c->timer); /* whatever it waited for is over */
    agw_buf_free(&r->data);
    free(r);
}

void mock_conn_close(mock_conn *c)
{
    struct ev_loop *loop = loop_of(c);
    mock_service *svc = c->svc;
    ev_io_stop(loop, &c->rw);
    ev_io_stop(loop, &c->ww);
    ev_timer_stop(loop, &c->timer);
    if (c->rst) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(c->fd);
    while (c->head) {
        mock_resp *r = c->head;
        c->head = r->next;
        agw_buf_free(&r->data);
        free(r);
    }
    svc->in_flight -= c->queued + c->unflushed;
    svc->conns_open--;
    if (!c->used)
        svc->conns_unused--;
    if (c->prev)
        c->prev->next = c->next;
    else
        svc->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    agw_buf_free(&c->url);
    agw_buf_free(&c->body);
    agw_buf_free(&c->headers);
    agw_buf_free(&c->out);
    free(c);
}

agw_buf_t *mock_conn_reply_begin(mock_conn *c, const mock_reply *rp)
{
    c->svc->in_flight++;
    if (!c->head && !c->closing && rp->fault == MOCK_FAULT_NONE && rp->delay_s <= 0) {
        if (rp->close)
            c->closing = true;
        return &c->out; /* hot path: straight into the output buffer */
    }
    mock_resp *r = agw_malloc(sizeof *r);
    memset(r, 0, sizeof *r);
    r->rp = *rp;
    r->ready_at = ev_now(loop_of(c)) + rp->delay_s;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    c->queued++;
    return &r->data;
}

void mock_conn_reply_end(mock_conn *c, size_t cut)
{
    if (!c->head) { /* hot path reply: already in out */
        c->unflushed++;
        return;
    }
    c->tail->cut = cut;
}

/* Moves ready replies into the output buffer. Returns true if it should be called again as
 * soon as the buffer is written (a huge body with more to generate). */
static bool fill(mock_conn *c)
{
    ev_tstamp now = ev_now(loop_of(c));
    size_t pending = c->out.len - c->out_off;
    while (c->head && !c->closing) {
        mock_resp *r = c->head;
        if (r->rp.fault == MOCK_FAULT_HANG)
            return false; /* never answered; the connection stays open */
        if (r->ready_at > now + EPSILON_S) {
            arm_timer(c, r->ready_at - now);
            return false;
        }
        switch (r->rp.fault) {
        case MOCK_FAULT_DRIP:
            if (pending > 0)
                return true; /* let earlier bytes go first so the pace is real */
            if (r->sent < r->data.len) {
                agw_buf_append(&c->out, r->data.base + r->sent++, 1);
                r->ready_at = now + r->rp.drip_s;
                if (r->sent < r->data.len) {
                    arm_timer(c, r->rp.drip_s);
                    return false;
                }
            }
            break;
        case MOCK_FAULT_HUGE:
            if (!r->started) {
                agw_buf_append(&c->out, r->data.base, r->data.len);
                r->started = true;
            }
            while (r->huge_off < r->rp.huge_bytes && c->out.len - c->out_off < HUGE_LOW_WATER) {
                uint64_t left = r->rp.huge_bytes - r->huge_off;
                size_t n = left < HUGE_STEP ? (size_t)left : HUGE_STEP;
                mock_response_huge_fill(&c->out, r->rp.huge_bytes, r->huge_off, n);
                r->huge_off += n;
            }
            if (r->huge_off < r->rp.huge_bytes)
                return true;
            break;
        default:
            agw_buf_append(&c->out, r->data.base, r->cut ? r->cut : r->data.len);
            if (r->rp.fault == MOCK_FAULT_RESET)
                c->rst = true;
            if (r->cut)
                c->closing = true;
            break;
        }
        if (r->rp.close)
            c->closing = true;
        c->idle_close = r->rp.fault == MOCK_FAULT_CLOSE_IDLE;
        c->idle_close_s = r->rp.idle_close_s; /* armed once the reply is written */
        finish_head(c);
        pending = c->out.len - c->out_off;
    }
    return false;
}

/* Starts or stops reading according to the bounds on queued replies and unwritten bytes. */
static void update_reading(mock_conn *c)
{
    bool want = !c->read_done && !c->closing && c->queued < MAX_QUEUED &&
                c->out.len - c->out_off < MAX_PENDING_OUT;
    if (want && !ev_is_active(&c->rw))
        ev_io_start(loop_of(c), &c->rw);
    else if (!want && ev_is_active(&c->rw))
        ev_io_stop(loop_of(c), &c->rw);
}

/* Moves replies out: fill the buffer, write it, repeat while progress is possible. Closes the
 * connection when it is done; c must not be used after it returns. */
static void run(mock_conn *c)
{
    for (;;) {
        bool again = fill(c);
        if (c->out_off < c->out.len) {
            ssize_t n = write(c->fd, c->out.base + c->out_off, c->out.len - c->out_off);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                mock_conn_close(c);
                return;
            }
            if (n > 0)
                c->out_off += (size_t)n;
            if (c->out_off < c->out.len) {
                ev_io_start(loop_of(c), &c->ww);
                update_reading(c);
                return;
            }
        }
        /* Everything written. */
        ev_io_stop(loop_of(c), &c->ww);
        c->out.len = c->out_off = 0;
        c->svc->in_flight -= c->unflushed;
        c->unflushed = 0;
        if (c->closing || (c->eof && !c->head)) {
            mock_conn_close(c);
            return;
        }
        if (!again)
            break;
    }
    if (c->idle_close && !c->head && !ev_is_active(&c->timer))
        arm_timer(c, c->idle_close_s);
    update_reading(c);
}

/* ---- http_parser callbacks ---- */

/* Counts request bytes; fails the parse once the request is too big. */
static int count(mock_conn *c, size_t n)
{
    c->req_bytes += n;
    if (c->req_bytes > MOCK_MAX_REQUEST_BYTES) {
        c->too_big = true;
        return -1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    mock_conn *c = p->data;
    if (!c->used) {
        c->used = true;
        c->svc->conns_unused--;
    }
    c->req_bytes = 0;
    c->url.len = 0;
    c->body.len = 0;
    c->headers.len = 0;
    c->in_value = false;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    mock_conn *c = p->data;
    agw_buf_append(&c->url, at, n);
    return count(c, n);
}

/* Header names and values (each may come in pieces) go to c->headers on service ports, for the
 * request log (GET /requests on the admin port). */
static int on_header_field(http_parser *p, const char *at, size_t n)
{
    mock_conn *c = p->data;
    if (!c->svc->is_admin) {
        if (c->in_value)
            agw_buf_append(&c->headers, "\n", 1);
        agw_buf_append(&c->headers, at, n);
        c->in_value = false;
    }
    return count(c, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    mock_conn *c = p->data;
    if (!c->svc->is_admin) {
        if (!c->in_value)
            agw_buf_append(&c->headers, "\0", 1);
        agw_buf_append(&c->headers, at, n);
        c->in_value = true;
    }
    return count(c, n);
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    mock_conn *c = p->data;
    if (c->svc->is_admin)
        agw_buf_append(&c->body, at, n);
    return count(c, n);
}

static int on_message_complete(http_parser *p)
{
    mock_conn *c = p->data;
    mock_request req = {
        .method = http_method_str(p->method),
        .url = c->url.base ? c->url.base : "/",
        .url_len = c->url.base ? c->url.len : 1,
        .headers = c->headers.base ? c->headers.base : "",
        .headers_len = c->headers.len,
        .body = c->body.base ? c->body.base : "",
        .body_len = c->body.len,
        .keep_alive = http_should_keep_alive(p) != 0,
        .http10 = p->http_major == 1 && p->http_minor == 0,
        .head = p->method == HTTP_HEAD,
    };
    if (c->idle_close) { /* a new request: the connection is not idle any more */
        c->idle_close = false;
        ev_timer_stop(loop_of(c), &c->timer);
    }
    if (c->svc->is_admin)
        mock_admin_handle(c, &req);
    else
        mock_service_handle(c, &req);
    if (!req.keep_alive) {
        c->read_done = true;
        http_parser_pause(p, 1); /* ignore anything sent after Connection: close */
    }
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Replies 400 (after any earlier replies) and closes: the bytes were not HTTP. */
static void bad_request(mock_conn *c)
{
    static const char msg[] = "{\"error\":\"bad request\"}";
    mock_request req = {.method = "GET", .url = "/", .url_len = 1, .keep_alive = false};
    mock_response_simple(c, &req, 400, "application/json", msg, sizeof msg - 1);
}

static void on_readable(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    mock_conn *c = w->data;
    char buf[READ_CHUNK];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        mock_conn_close(c);
        return;
    }
    if (n == 0) { /* peer closed its side: finish the replies we owe, unless they hang */
        c->read_done = c->eof = true;
        bool idle = !c->head && c->out_off == c->out.len;
        if (idle || (c->head && c->head->rp.fault == MOCK_FAULT_HANG)) {
            mock_conn_close(c);
            return;
        }
        run(c);
        return;
    }
    size_t used = http_parser_execute(&c->parser, &parser_settings, buf, (size_t)n);
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (c->too_big) {
        mock_conn_close(c);
        return;
    }
    if (e != HPE_OK && e != HPE_PAUSED) {
        c->read_done = true;
        bad_request(c);
    } else if (c->parser.upgrade || (e == HPE_OK && used < (size_t)n)) {
        c->read_done = true; /* upgrade requests are not supported: stop here */
    }
    run(c);
}

static void on_writable(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    run(w->data);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    mock_conn *c = w->data;
    if (c->idle_close && !c->head) {
        mock_conn_close(c); /* close_idle: FIN without warning */
        return;
    }
    run(c);
}

void mock_conn_accept(mock_service *svc, int fd)
{
    mock_conn *c = agw_malloc(sizeof *c);
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->svc = svc;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    ev_io_init(&c->rw, on_readable, fd, EV_READ);
    ev_io_init(&c->ww, on_writable, fd, EV_WRITE);
    ev_init(&c->timer, on_timer);
    c->rw.data = c->ww.data = c->timer.data = c;
    c->next = svc->conns;
    if (c->next)
        c->next->prev = c;
    svc->conns = c;
    svc->conns_open++;
    svc->conns_unused++;
    svc->conns_total++;
    ev_io_start(svc->srv->loop, &c->rw);
}
