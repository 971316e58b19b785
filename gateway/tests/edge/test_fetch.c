/* test_fetch.c: edge/fetch.h, the JWKS fetcher's blocking GET, against a one-answer server on
 * loopback: the body and Cache-Control's max-age of a 200 (sized and chunked), and a clear
 * reason, never a body, for another status, a malformed answer, one over the size limit, a
 * close before the end and no answer at all; a host name whose lookup does not answer ends at the
 * fetch's deadline too. */
#include "tests/check.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "edge/fetch.h"

typedef struct server {
    int fd;
    int port;
    const char *answer; /* sent whole once the request's header section is in; NULL: none */
    int drip_ms;        /* > 0: the answer is sent a byte at a time, one every drip_ms */
    pthread_t thread;
} server_t;

static void *serve(void *arg)
{
    server_t *s = arg;
    int c = accept(s->fd, NULL, NULL);
    if (c < 0)
        return NULL;
    char req[4096];
    size_t got = 0;
    ssize_t n;
    while (got < sizeof(req) - 1 && (n = read(c, req + got, sizeof(req) - 1 - got)) > 0) {
        got += (size_t)n;
        req[got] = '\0';
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    if (s->answer && s->drip_ms > 0) {
        /* until the client leaves (the send fails) or the answer is out */
        for (const char *p = s->answer; *p && send(c, p, 1, MSG_NOSIGNAL) == 1; p++)
            usleep((useconds_t)s->drip_ms * 1000);
        close(c);
    } else if (s->answer) {
        ssize_t w = write(c, s->answer, strlen(s->answer));
        (void)w;
        close(c);
    } else {
        sleep(1); /* no answer: the client's read timeout ends it first */
        close(c);
    }
    return NULL;
}

static void server_start(server_t *s, const char *answer, int drip_ms)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    s->answer = answer;
    s->drip_ms = drip_ms;
    if (bind(s->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s->fd, 1) != 0 ||
        getsockname(s->fd, (struct sockaddr *)&a, &len) != 0) {
        perror("test server");
        exit(1);
    }
    s->port = ntohs(a.sin_port);
    pthread_create(&s->thread, NULL, serve, s);
}

static void server_stop(server_t *s)
{
    pthread_join(s->thread, NULL);
    close(s->fd);
}

/* The server's thread stops when the process does (a loaded CI host, a sanitized build) while the
 * fetch's clock runs on: a fetch that expects an answer gets ANSWER_MS, which no such stall reaches
 * (it ends as soon as the answer comes); the test of the timeout sets its own. */
#define ANSWER_MS 20000

/* GETs /jwks from a server that answers `answer`: returns agw_fetch_get's result; body, max_age
 * and why are the caller's. */
static int fetch(const char *answer, size_t max_bytes, uint64_t timeout_ms, agw_buf_t *body, uint64_t *max_age,
                 char *why, size_t whylen)
{
    server_t s;
    server_start(&s, answer, 0);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/jwks", s.port);
    agw_fetch_url_t u;
    char perr[128];
    CHECK(agw_fetch_url_parse(url, &u, perr, sizeof(perr)) == 0);
    int rc = agw_fetch_get(&u, timeout_ms, max_bytes, body, max_age, why, whylen);
    agw_fetch_url_free(&u);
    server_stop(&s);
    return rc;
}

/* The answer is fetched whole: the body {"keys":[]} and want_max_age (0: no freshness given). */
static void fetches_the_keys(const char *answer, uint64_t want_max_age)
{
    agw_buf_t body = AGW_BUF_INIT;
    uint64_t max_age = 7;
    char why[256] = "";
    int rc = fetch(answer, 1024, ANSWER_MS, &body, &max_age, why, sizeof(why));
    CHECK(rc == 0);
    CHECK(body.len == 11 && memcmp(body.base, "{\"keys\":[]}", 11) == 0);
    CHECK(max_age == want_max_age);
    agw_buf_free(&body);
}

static void a_sized_200_gives_its_body_and_max_age(void)
{
    fetches_the_keys("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: public, Max-Age=120\r\n"
                     "Content-Length: 11\r\n\r\n{\"keys\":[]}",
                     120);
}

static void a_chunked_200_without_cache_control_gives_max_age_0(void)
{
    fetches_the_keys("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"key\r\n6\r\ns\":[]}\r\n0\r\n\r\n", 0);
}

static void a_close_delimited_200_ends_at_the_close(void)
{
    fetches_the_keys("HTTP/1.0 200 OK\r\n\r\n{\"keys\":[]}", 0);
}

/* each: the answer, and the start of the reason agw_fetch_get must give */
static void other_answers_fail_with_their_reason(void)
{
    static const struct {
        const char *answer, *why;
    } cases[] = {
        {"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno", "status 404"},
        {"SSH-2.0-OpenSSH_9.2\r\n", "malformed answer: "},
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "malformed answer: "},
        {"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n", "the answer is larger than 1024 bytes"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{\"keys\"", "the connection closed before the answer"},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed answer: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        agw_buf_t body = AGW_BUF_INIT;
        uint64_t max_age = 0;
        char why[256] = "";
        int rc = fetch(cases[i].answer, 1024, ANSWER_MS, &body, &max_age, why, sizeof(why));
        CHECK(rc == -1);
        if (strncmp(why, cases[i].why, strlen(cases[i].why)) != 0) {
            fprintf(stderr, "case %zu: expected \"%s...\", got \"%s\"\n", i, cases[i].why, why);
            check_failures++;
        }
        agw_buf_free(&body);
    }
}

static void no_answer_times_out(void)
{
    agw_buf_t body = AGW_BUF_INIT;
    uint64_t max_age = 0;
    char why[256] = "";
    int rc = fetch(NULL, 1024, 100, &body, &max_age, why, sizeof(why));
    CHECK(rc == -1);
    CHECK(strstr(why, "timed out") != NULL);
    agw_buf_free(&body);
}

/* A server that sends its answer a byte every 20 ms (about 2 s for this one) while each byte
 * comes well within the timeout: the fetch ends at its one deadline, 300 ms, with no answer. A
 * timeout per read (SO_RCVTIMEO) let the fetch go on for as long as the server liked. */
static void a_dripping_answer_times_out_at_the_deadline(void)
{
    static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 "Content-Length: 11\r\n\r\n{\"keys\":[]}";
    server_t s;
    server_start(&s, answer, 20);
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/jwks", s.port);
    agw_fetch_url_t u;
    char perr[128], why[256] = "";
    CHECK(agw_fetch_url_parse(url, &u, perr, sizeof(perr)) == 0);
    agw_buf_t body = AGW_BUF_INIT;
    uint64_t max_age = 0;
    int rc = agw_fetch_get(&u, 300, 1024, &body, &max_age, why, sizeof(why));
    CHECK(rc == -1);
    CHECK(strstr(why, "timed out") != NULL);
    CHECK(body.len == 0);
    agw_buf_free(&body);
    agw_fetch_url_free(&u);
    server_stop(&s);
}

/* A resolver that does not answer until released (at most 10 s): a fetch that waited for its lookup
 * would take those 10 s. */
static pthread_mutex_t slow_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slow_cv = PTHREAD_COND_INITIALIZER;
static int slow_released, slow_calls;

static int slow_resolver(const char *host, const char *port, const struct addrinfo *hints, struct addrinfo **res)
{
    (void)host, (void)port, (void)hints, (void)res;
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += 10;
    pthread_mutex_lock(&slow_mu);
    slow_calls++;
    while (!slow_released && pthread_cond_timedwait(&slow_cv, &slow_mu, &at) == 0) {
    }
    pthread_mutex_unlock(&slow_mu);
    return EAI_AGAIN;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The lookup is bounded by the fetch's deadline (200 ms here, against the resolver's 10 s); while
 * AGW_FETCH_MAX_LOOKUPS lookups given up on still run, a fetch fails at once without another; once
 * they end, fetches resolve again. */
static void a_lookup_that_does_not_answer_ends_at_the_deadline(void)
{
    agw_fetch_url_t u;
    char perr[128];
    CHECK(agw_fetch_url_parse("http://jwks.invalid:8080/jwks", &u, perr, sizeof(perr)) == 0);
    agw_fetch_resolver = slow_resolver;
    for (int i = 0; i < AGW_FETCH_MAX_LOOKUPS; i++) {
        agw_buf_t body = AGW_BUF_INIT;
        uint64_t max_age = 0;
        char why[256] = "";
        double t0 = now_s();
        int rc = agw_fetch_get(&u, 200, 1024, &body, &max_age, why, sizeof(why));
        double took = now_s() - t0;
        CHECK(rc == -1);
        CHECK_STR(why, "cannot resolve jwks.invalid: the resolver did not answer in time");
        CHECK(took < 5.0); /* 0.2 s with the deadline; 10 s if the fetch waited for the resolver */
        CHECK(agw_fetch_abandoned_lookups() == i + 1);
    }
    char why[256] = "";
    agw_buf_t body = AGW_BUF_INIT;
    uint64_t max_age = 0;
    CHECK(agw_fetch_get(&u, 200, 1024, &body, &max_age, why, sizeof(why)) == -1);
    CHECK(strstr(why, "earlier lookups still wait for the resolver") != NULL);
    pthread_mutex_lock(&slow_mu);
    CHECK(slow_calls == AGW_FETCH_MAX_LOOKUPS); /* none for the fetch refused at once */
    slow_released = 1;
    pthread_cond_broadcast(&slow_cv);
    pthread_mutex_unlock(&slow_mu);
    for (int i = 0; i < 1000 && agw_fetch_abandoned_lookups() > 0; i++)
        usleep(10 * 1000);
    CHECK(agw_fetch_abandoned_lookups() == 0);
    agw_fetch_resolver = getaddrinfo;
    agw_fetch_url_free(&u);
    fetches_the_keys("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"keys\":[]}", 0);
}

/* A URL with user info is refused, and the message does not show it (it goes to the log and the
 * admin listener's reload page). */
static void user_info_is_refused_unshown(void)
{
    agw_fetch_url_t u;
    char why[256];
    CHECK(agw_fetch_url_parse("http://ops:S3CRET@127.0.0.1:9500/jwks", &u, why, sizeof(why)) == -1);
    CHECK(strstr(why, "S3CRET") == NULL && strstr(why, "ops") == NULL);
    CHECK(strstr(why, "'http://…@127.0.0.1:9500/jwks': user info") == why);
}

int main(void)
{
    RUN(user_info_is_refused_unshown);
    RUN(a_sized_200_gives_its_body_and_max_age);
    RUN(a_chunked_200_without_cache_control_gives_max_age_0);
    RUN(a_close_delimited_200_ends_at_the_close);
    RUN(other_answers_fail_with_their_reason);
    RUN(no_answer_times_out);
    RUN(a_dripping_answer_times_out_at_the_deadline);
    RUN(a_lookup_that_does_not_answer_ends_at_the_deadline);
    return CHECK_DONE();
}
