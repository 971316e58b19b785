"""Resilience (issue 5) with the real gateway and aggway-mock: circuit breaker (DESIGN §1 row 5),
retries with a budget, hedging, single-flight (row 6), bulkheads and fallbacks.

The virtual-clock specs (spec/resilience_spec.lua) prove the rules exactly; these tests prove that
the C transport, the shared breaker, the timers and the pools do the same with real sockets.

Timing claims hold on a loaded 2-core machine and under ASan: lower bounds are what the gateway
cannot beat (a timeout, a hedge delay), upper bounds sit far below the slow alternative (the
timeout, the page deadline, the slow answer), and counts come from the mock's /hits, not clocks.
Every test runs one worker unless it says otherwise."""
import http.client
import json
import os
import re
import sys
import threading
import time
import unittest
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2_client import H2Client  # noqa: E402
from harness import GatewayTestCase, SLOW, endpoint, free_port, h2load, route, wait_until, main  # noqa: E402
from test_admin_metrics import Metrics  # noqa: E402

# Slack for "about the timeout": a loaded machine or ASan may add this much to a wait.
SLACK_MS = 700 if SLOW else 400


def kind(section):
    """The problem kind of a section ("upstream-timeout"), or None."""
    err = section.get("error") or {}
    return err.get("type", "").rsplit(":", 1)[-1] or None


def raw_get(port, path, timeout=10.0):
    """GET with http.client (cheap enough to start 50 at once from threads): (status, headers,
    json body or None, ms)."""
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        ms = (time.monotonic() - t) * 1000.0
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        return r.status, {k.lower(): v for k, v in r.getheaders()}, doc, ms
    finally:
        c.close()


def concurrent_gets(port, paths, timeout=10.0):
    """GETs every path at once (one thread and connection each, released together by a
    barrier); returns the raw_get tuples in the order of paths."""
    out = [None] * len(paths)
    barrier = threading.Barrier(len(paths))

    def one(i):
        barrier.wait()
        try:
            out[i] = raw_get(port, paths[i], timeout)
        except Exception as e:  # noqa: BLE001 - reported by the caller's assertions
            out[i] = (0, {}, None, repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return out


def batched_gets(port, paths, connections=1, timeout=10.0):
    """GETs every path as streams of h2c connections (paths dealt round-robin over them), each
    connection's streams sent in one write (all writes before any answer is read): the worker
    that reads a connection's streams runs all their handlers in the same read, before any
    upstream can answer. Returns [(status, json body or None)] in
    the order of paths."""
    clients = [H2Client(port, timeout=timeout).start_plain() for _ in range(connections)]
    try:
        shares = [paths[i::connections] for i in range(connections)]
        sids = [c.send_gets(share) for c, share in zip(clients, shares)]
        answers = [c.read_answers(ids) for c, ids in zip(clients, sids)]
    finally:
        for c in clients:
            c.close()
    out = [None] * len(paths)
    for i in range(connections):
        for j, (status, body) in enumerate(answers[i]):
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            out[i + j * connections] = (status, doc)
    return out


# ---------------------------------------------------------------------------------------------
# the circuit breaker (DESIGN §1 row 5)

CONCERT = endpoint("GET /concert/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      event = { "events", "/events/" .. id, required = true },
      recs  = { "recs", "/recs/" .. id },
    })""", deadline_ms=3000)

MUST_RECS = endpoint("GET /must-recs/{id}", """
    return agg.page(agg.fetch_all { recs = { "recs", "/recs/" .. req.params.id, required = true } })""",
                     deadline_ms=3000)

# The half-open probe below answers in 250 ms (long enough for 50 pages to meet the breaker
# while it is out); the timeout leaves it 350 ms of a loaded machine's scheduling delay (with
# 300 ms, beside two busy loops, the probe itself timed out and the breaker never closed).
RECS_TIMEOUT_MS = 600
OPEN_S = 2
HEALTHY_MS = 20
# A page that waited for recs' timeout takes at least RECS_TIMEOUT_MS - 5 (the seed test's own
# lower bound); a page answered without waiting for it (the breaker open) is anything sooner,
# however late a loaded machine ran it.
NOT_THE_TIMEOUT_MS = RECS_TIMEOUT_MS - 5


def breaker_services(recs_ms=HEALTHY_MS):
    return {
        "events": [route("/events/{id}", latency_ms=HEALTHY_MS, json={"id": "{id}", "name": "Concert"})],
        "recs": [route("/recs/{id}", latency_ms=recs_ms, json={"items": [1, 2, 3]})],
    }


BREAKER_OPTIONS = {
    "events": {"timeout_ms": 2000, "breaker": False},
    "recs": {"timeout_ms": RECS_TIMEOUT_MS, "breaker": {"failures": 5, "open_s": OPEN_S, "half_open_probes": 1}},
}


class CircuitBreaker(GatewayTestCase):
    """Seed: Recommendations hangs; the breaker opens after 5 consecutive failures for open_s (2 s
    here instead of 30), then lets one half-open probe through."""

    def start_concert(self, workers=1, upstream_options=BREAKER_OPTIONS):
        self.start(services=breaker_services(), scripts={"concert.lua": CONCERT, "must.lua": MUST_RECS},
                   upstream_options=upstream_options, workers=workers)

    def test_seed_requests_2_to_6_wait_the_timeout_request_7_is_fast_and_one_probe_closes_it(self):
        self.start_concert()
        r1 = self.get("/concert/1")
        self.assertEqual(r1.status, 200, r1)
        self.assertEqual(r1.json()["recs"]["status"], "ok", r1)

        self.mock.set_routes("recs", [route("/recs/{id}", fault="hang")])
        for i in range(2, 7):
            r = self.get("/concert/%d" % i)
            self.assertEqual(r.status, 200, r)
            recs = r.json()["recs"]
            self.assertEqual((recs["status"], kind(recs)), ("unavailable", "upstream-timeout"), r)
            self.assertGreaterEqual(r.ms, RECS_TIMEOUT_MS - 5, "request %d: recs hangs until its timeout" % i)
            self.assertLess(r.ms, RECS_TIMEOUT_MS + SLACK_MS, r)
        opened_at = time.monotonic()
        self.assertEqual(self.mock.hits()["recs"]["GET /recs/{id}"], 6, "requests 1-6 each called recs")

        r7 = self.get("/concert/7")
        self.assertEqual(r7.status, 200, r7)
        recs = r7.json()["recs"]
        self.assertEqual((recs["status"], kind(recs)), ("unavailable", "circuit-open"), r7)
        self.assertEqual(recs["error"]["status"], 503, r7)
        self.assertLess(r7.ms, NOT_THE_TIMEOUT_MS,
                        "request 7 answers at the speed of the healthy calls (%d ms), not the timeout" % HEALTHY_MS)
        self.assertEqual(r7.headers.get("x-aggregation-completed"), "false", r7)
        self.assertEqual(self.mock.hits()["recs"]["GET /recs/{id}"], 6, "request 7 never reached recs")
        self.assertIn("circuit breaker of upstream recs is now open", self.gw.log())

        # Recs recovers; its answers take 250 ms. The 50 requests below are streams of one h2c
        # connection sent in one write: the worker runs their 50 handlers in the same read, so
        # every call meets the breaker while the first one's probe is out, however loaded the
        # machine (they use 50 different paths: identical calls would share the probe's flight
        # instead of meeting the breaker). A breaker that let more than one call through, or
        # none, still shows in the counts and the mock's hits.
        self.mock.set_routes("recs", [route("/recs/{id}", latency_ms=250, json={"items": [1, 2, 3]})])
        self.mock.reset()
        time.sleep(max(0.0, opened_at + OPEN_S + 0.3 - time.monotonic()))
        results = batched_gets(self.port, ["/concert/%d" % (100 + i) for i in range(50)])
        statuses = [r[0] for r in results]
        self.assertEqual(statuses, [200] * 50, results)
        recs_kinds = sorted(r[1]["recs"]["status"] + "/" + str(kind(r[1]["recs"])) for r in results)
        self.assertEqual(recs_kinds.count("ok/None"), 1, recs_kinds)
        self.assertEqual(recs_kinds.count("unavailable/circuit-open"), 49, recs_kinds)
        self.assertEqual(self.mock.hits()["recs"].get("GET /recs/{id}", 0), 1,
                         "exactly one half-open probe reaches the upstream")

        # the probe succeeded: the breaker is closed again
        self.assertTrue(wait_until(lambda: "circuit breaker of upstream recs is now closed" in self.gw.log(), 5),
                        self.gw.log()[-2000:])
        r = self.get("/concert/200")
        self.assertEqual(r.json()["recs"]["status"], "ok", r)
        self.assertEqual(self.mock.hits()["recs"]["GET /recs/{id}"], 2)

    def test_one_probe_only_even_with_two_workers(self):
        # the breaker is shared by all workers: 50 requests spread over two workers still make
        # one probe. They are 5 h2c connections of 10 streams (the kernel deals connections to
        # the workers), each connection's streams in one write and all 5 written before anything
        # is read; the probe answers after 1.5 s (its timeout here is 2.5 s), so every call
        # meets the breaker while the probe is out unless a worker reads its connection more
        # than 1.5 s late. A second probe from the other worker shows as a second "ok" and hit.
        probe_ms = 1500
        self.start_concert(workers=2, upstream_options=dict(BREAKER_OPTIONS, recs=dict(
            BREAKER_OPTIONS["recs"], timeout_ms=probe_ms + 1000)))
        self.mock.refuse("recs")
        for i in range(5):
            self.get("/concert/%d" % i)
        opened_at = time.monotonic()
        self.assertIn("circuit breaker of upstream recs is now open", self.gw.log())
        self.mock.set_routes("recs", [route("/recs/{id}", latency_ms=probe_ms, json={"items": []})])
        self.mock.accept("recs")
        self.mock.reset()
        time.sleep(max(0.0, opened_at + OPEN_S + 0.3 - time.monotonic()))
        results = batched_gets(self.port, ["/concert/%d" % (100 + i) for i in range(50)], connections=5)
        self.assertEqual([r[0] for r in results], [200] * 50, results)
        self.assertEqual(sum(1 for r in results if r[1]["recs"]["status"] == "ok"), 1, results)
        self.assertEqual(self.mock.hits()["recs"].get("GET /recs/{id}", 0), 1)

    def test_failed_probe_opens_the_breaker_again(self):
        self.start_concert()
        self.mock.refuse("recs")
        for i in range(5):
            self.get("/concert/%d" % i)
        time.sleep(OPEN_S + 0.3)
        r = self.get("/concert/6")      # the probe: refused
        self.assertEqual(kind(r.json()["recs"]), "upstream-unreachable", r)
        r = self.get("/concert/7")
        self.assertEqual(kind(r.json()["recs"]), "circuit-open", r)
        self.assertEqual(self.gw.log().count("circuit breaker of upstream recs is now open"), 2, self.gw.log())

    def test_required_section_with_the_breaker_open_is_503_with_retry_after(self):
        self.start_concert()
        self.mock.refuse("recs")
        for i in range(5):
            self.assertEqual(self.get("/must-recs/%d" % i).status, 502)
        r = self.get("/must-recs/9")
        p = self.assertProblem(r, 503)
        self.assertEqual(p["type"], "urn:aggway:problem:required-section-failed", p)
        self.assertEqual(kind(p["sections"]["recs"]), "circuit-open", p)
        self.assertRegex(r.headers.get("retry-after", ""), r"^[1-9][0-9]*$", r)
        self.assertLess(r.ms, NOT_THE_TIMEOUT_MS, r)

    def test_retry_after_says_when_the_breaker_lets_a_probe_through(self):
        # RFC 9110 §10.2.3: Retry-After is when the client may try again. The breaker half-opens
        # after open_s (2 s here); the problem's own detail says "retry in 2 s".
        self.start_concert()
        self.mock.refuse("recs")
        for i in range(5):
            self.get("/must-recs/%d" % i)
        r = self.get("/must-recs/9")
        self.assertEqual(r.status, 503, r)
        detail = r.json()["sections"]["recs"]["error"].get("detail", "")
        self.assertLessEqual(int(r.headers.get("retry-after", "0")), OPEN_S,
                             "Retry-After: %s, but the breaker half-opens within %d s (%s)"
                             % (r.headers.get("retry-after"), OPEN_S, detail))


# ---------------------------------------------------------------------------------------------
# retries

class AlternatingUpstream:
    """A tiny HTTP/1.1 keep-alive upstream that answers 503 and 200 in turn (the 1st, 3rd, …
    request get 503). aggway-mock's fault_every applies to faults, not to statuses, so this is a
    thread in the test. hits counts requests."""

    def __init__(self):
        outer = self
        self.hits = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                with outer.lock:
                    outer.hits += 1
                    n = outer.hits
                if n % 2 == 1:
                    body, status = b'{"title":"Service Unavailable","status":503}', 503
                else:
                    body, status = b'{"n":%d}' % n, 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


FLAKY_PAGE = endpoint("GET /flaky/{id}", """
    return agg.page(agg.fetch_all { f = { "flaky", "/f/" .. req.params.id, collapse = false } })""",
                      deadline_ms=3000)
FLAKY_POST = endpoint("POST /flaky/{id}", """
    return agg.page(agg.fetch_all { f = { "flaky", "/f/" .. req.params.id, method = "POST", json = { a = 1 } } })""",
                      deadline_ms=3000)


class Retries(GatewayTestCase):

    def test_every_other_answer_503_pages_succeed_and_the_upstream_saw_the_retries(self):
        up = AlternatingUpstream()
        self.addCleanup(up.stop)
        self.start(services={"other": [route("/x", json={})]}, scripts={"flaky.lua": FLAKY_PAGE},
                   upstream_options={"flaky": {"url": "http://127.0.0.1:%d" % up.port, "timeout_ms": 1000,
                                               "breaker": False,
                                               # every page retries once: retries are 100 % of the
                                               # requests, above the default budget (20 % plus 10
                                               # a second), which the budget's own test covers; here
                                               # the budget admits them all, however fast the pages
                                               "retry": {"attempts": 2, "backoff_ms": 10,
                                                         "budget": {"percent": 100, "interval_s": 10},
                                                         "min_retry_rate": {"count": 40, "interval_s": 1}}}})
        for i in range(20):
            r = self.get("/flaky/%d" % i)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["f"]["status"], "ok", r)
        self.assertEqual(up.hits, 40, "each page: a 503, then the retry's 200")

    def test_post_is_never_retried_get_is(self):
        self.start(services={"flaky": [route("/f/{id}", method="*", status=503, json={"status": 503})]},
                   scripts={"flaky.lua": FLAKY_PAGE, "post.lua": FLAKY_POST},
                   upstream_options={"flaky": {"timeout_ms": 1000, "breaker": False,
                                               "retry": {"attempts": 3, "backoff_ms": 5}}})
        for i in range(4):
            r = self.get("/flaky/%d" % i, "-X", "POST")
            self.assertEqual(r.status, 502, r)
            self.assertEqual(kind(r.json()["sections"]["f"]), "upstream-error", r)
        self.assertEqual(self.mock.hits()["flaky"]["* /f/{id}"], 4, "one call per POST page, never retried")
        self.mock.reset()
        r = self.get("/flaky/9")
        self.assertEqual(r.status, 502, r)
        self.assertEqual(self.mock.hits()["flaky"]["* /f/{id}"], 3, "a GET is tried 3 times (attempts = 3)")

    def test_refused_connection_is_retried(self):
        # Flaky refuses connections when the page starts; 150 ms later it listens again. The
        # first retry comes after a jittered backoff of 250-500 ms (backoff_ms = 500), so it
        # finds the port open. Without the retry the page would answer in a few ms, unavailable.
        self.start(services={"flaky": {"refuse": True, "routes": [route("/f/{id}", json={"v": 1})]},
                             "other": [route("/x", json={})]},
                   scripts={"flaky.lua": FLAKY_PAGE},
                   upstream_options={"flaky": {"timeout_ms": 2000, "breaker": False,
                                               "retry": {"attempts": 3, "backoff_ms": 500}}})
        self.assertEqual(self.get("/__warm__").status, 404)
        # the 150 ms count from when the request is on the gateway's socket: started before curl,
        # the timer raced curl's start, which took longer than 150 ms beside two busy loops (the
        # port was open before the first attempt, and the page came in 78 ms without a retry)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.addCleanup(c.close)
        t = time.monotonic()
        c.request("GET", "/flaky/1")
        timer = threading.Timer(0.15, self.mock.accept, args=("flaky",))
        timer.start()
        self.addCleanup(timer.cancel)
        r = c.getresponse()
        body = r.read()
        ms = (time.monotonic() - t) * 1000.0
        timer.join()
        self.assertEqual(r.status, 200, body)
        self.assertEqual(json.loads(body)["f"]["status"], "ok", body)
        self.assertGreaterEqual(ms, 250 - 5, "the answer came from a retry after the backoff")
        self.assertEqual(self.mock.hits()["flaky"]["GET /f/{id}"], 1)

    def test_retry_budget_bounds_the_extra_load_when_every_call_fails(self):
        # 800 pages, 100 at a time, on an upstream that answers 503 to everything. The budget is
        # the Gateway API's (retryConstraint): retries at most 20 % of the upstream's requests over
        # 10 s, or min_retry_rate = 3 a second whatever the share. So the upstream sees at most
        # 1.2 x the calls plus 3 per second of the run, not 2 x; the retries beyond it are not
        # sent (their sections fail with 503 retry-budget-exhausted).
        self.start(services={"flaky": [route("/f/{id}", status=503, latency_ms=50, json={"status": 503})]},
                   scripts={"flaky.lua": FLAKY_PAGE},
                   upstream_options={"flaky": {"timeout_ms": 2000, "breaker": False, "max_pending": 4096,
                                               "retry": {"attempts": 2, "backoff_ms": 10,
                                                         "budget": {"percent": 20, "interval_s": 10},
                                                         "min_retry_rate": {"count": 3, "interval_s": 1}}}})
        pages = 800
        started = time.monotonic()
        res = h2load(self.url("/flaky/1"), "-n", str(pages), "-c", "100", "-m", "1", timeout=120)
        elapsed = time.monotonic() - started
        self.assertEqual(res.get("done"), pages, res["output"])
        self.assertEqual(res.get("5xx"), pages, res["output"])
        hits = self.mock.hits()["flaky"]["GET /f/{id}"]
        self.assertGreater(hits, pages, "some calls were retried")
        self.assertLessEqual(hits, pages * 1.2 + 3 * (int(elapsed) + 1),
                             "retries stay within the 20 %% budget (%d hits in %.1f s)" % (hits, elapsed))


# ---------------------------------------------------------------------------------------------
# hedging

HEDGED = endpoint("GET /hedged/{id}", """
    return agg.page(agg.fetch_all { s = { "slow", "/s/" .. req.params.id, hedge = true, collapse = false } })""",
                  deadline_ms=5000)
# the same upstream call without a hedge: pages that bring the mock to its slow answer without
# spending the hedge budget (on a loaded machine a plain 10 ms call may exceed the hedge delay)
UNHEDGED = endpoint("GET /unhedged/{id}", """
    return agg.page(agg.fetch_all { s = { "slow", "/s/" .. req.params.id, hedge = false, collapse = false } })""",
                    deadline_ms=5000)


class Hedging(GatewayTestCase):

    def start_slow(self, slow_every, slow_ms, after, max_percent=5, admin_port=None):
        self.start(services={"slow": [route("/s/{id}", latency_ms=10, slow_every=slow_every, slow_ms=slow_ms,
                                            json={"id": "{id}"})]},
                   scripts={"hedged.lua": HEDGED, "unhedged.lua": UNHEDGED},
                   upstream_options={"slow": {"timeout_ms": 4000, "breaker": False, "max_pending": 4096,
                                              "hedge": {"after": after, "max_percent": max_percent}}},
                   gateway_extra={"admin": {"port": admin_port, "host": "127.0.0.1"}} if admin_port else None)

    def upstream_counter(self, admin_port, name):
        """The value of aggway_upstream_<name>_total{upstream="slow"} on the admin listener."""
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin_port, timeout=5) as r:
            text = r.read().decode("utf-8")
        v = Metrics(text).get("aggway_upstream_%s_total" % name, upstream="slow")
        self.assertIsNotNone(v, text)
        return int(v)

    def test_slow_call_is_hedged_and_the_page_answers_at_hedge_delay_plus_fast_latency(self):
        # The 10th call takes 2000 ms; its hedge (after 60 ms) takes 10 ms. The first 9 pages
        # call without a hedge: beside two busy loops a 10 ms call may take longer than 60 ms,
        # and a hedge of one of them would spend the budget's one token (5 % of 10 calls is
        # less) and move the slow answer to another attempt; then page 10 rightly waited 2 s.
        self.start_slow(slow_every=10, slow_ms=2000, after=60)
        for i in range(1, 10):
            self.assertEqual(self.get("/unhedged/%d" % i).status, 200)
        self.assertEqual(self.mock.hits()["slow"]["GET /s/{id}"], 9)
        r = self.get("/hedged/10")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["s"]["status"], "ok", r)
        self.assertEqual(self.mock.hits()["slow"]["GET /s/{id}"], 11, "the slow 10th call and its hedge")
        self.assertGreaterEqual(r.ms, 60 + 10 - 5, "the hedge starts after 60 ms and takes 10 ms")
        # a page that waited for the slow answer cannot come before it: anything sooner is the
        # hedge's answer, however late the loaded machine ran the hedge timer
        self.assertLess(r.ms, 2000, "the hedge's answer, not the slow call's (2000 ms)")
        self.assertEqual(self.mock.hits()["slow"]["GET /s/{id}"], 11, "10 calls and one hedge")

    def test_hedge_after_the_observed_p95(self):
        # The 50th call to the upstream takes 2000 ms, the others ~10 ms. From the 20th answer on,
        # a call still out after the observed p95 is hedged, so no page waits for the slow call.
        # On a loaded machine ordinary calls slower than the p95 are hedged too (about 5 % of them,
        # by definition of the p95): the budget here is generous so that they cannot use up the
        # tokens first (the 5 % cap has its own test below), and the mock's hits are checked
        # against the hedges the gateway reports rather than against a guess.
        admin_port = free_port()
        self.start_slow(slow_every=50, slow_ms=2000, after="p95", max_percent=50, admin_port=admin_port)
        slowest = None
        for i in range(1, 51):
            r = self.get("/hedged/%d" % i)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["s"]["status"], "ok", r)
            if slowest is None or r.ms > slowest.ms:
                slowest = r
        # A page that waited for the slow answer cannot come before its 2000 ms: anything sooner
        # is another attempt's answer (as in the test above), however late a loaded machine ran
        # the pages; the hedge counter below says that attempt was a hedge.
        self.assertLess(slowest.ms, 2000, "the slow call was hedged at the p95 of ~10 ms, "
                        "no page waited 2000 ms for it: %r" % slowest)
        # The slow call was abandoned and its page answered by another attempt: at least one hit
        # more than pages. Every extra hit is a hedge; a hedge may also be counted without
        # reaching the mock (its first attempt answered while it was connecting, and it was
        # cancelled). Counters are published once a second.
        hits = self.mock.hits()["slow"]["GET /s/{id}"]
        self.assertGreaterEqual(hits, 51, "the slow call and its page's other attempt")
        wait_until(lambda: self.upstream_counter(admin_port, "hedges") >= hits - 50, 5)
        hedges = self.upstream_counter(admin_port, "hedges")
        self.assertGreaterEqual(hedges, hits - 50, "one upstream call per page plus the hedges")
        self.assertLessEqual(hedges, 1 + 50 // 2, "hedges stay within the budget")

    def test_hedges_add_at_most_about_5_percent_load(self):
        # 1 call in 10 is slow (300 ms) and every one would deserve a hedge after 30 ms; the cap
        # allows about 5 % of the calls (plus the one token a fresh upstream starts with).
        self.start_slow(slow_every=10, slow_ms=300, after=30)
        pages = 2000
        res = h2load(self.url("/hedged/1"), "-n", str(pages), "-c", "20", "-m", "1", timeout=180)
        self.assertEqual(res.get("2xx"), pages, res["output"])
        extra = self.mock.hits()["slow"]["GET /s/{id}"] - pages
        self.assertGreater(extra, pages * 0.02, "slow calls were hedged")
        self.assertLessEqual(extra, pages * 0.05 + 2, "hedges are capped at about 5 %% of the calls")


# ---------------------------------------------------------------------------------------------
# single-flight (DESIGN §1 row 6)

CATALOG = endpoint("GET /catalog", """
    return agg.page(agg.fetch_all { catalog = { "shared", "/catalog" } })""", deadline_ms=5000)


class SingleFlight(GatewayTestCase):
    """Seed: 10,000 identical requests spread evenly over 1 s to a 30 ms upstream make about 34
    upstream calls (one per 30 ms flight, 1000 / 30 + 1), and every request gets the page.

    The load: h2load over h2c with a timing script (--timing-script-file): 50 clients, each
    sending 200 requests 5 ms apart; the clients connect 1 ms apart (-r 1 --rate-period 1ms) and
    each follows the script from its own start, so together they send 10 requests every 1 ms for
    1 s. (Plain -c/-n is closed-loop, and --rps or an unstaggered script sends all clients'
    requests at the same instants, which quantizes the flights.) HTTP/2 because one worker
    cannot parse 10,000 HTTP/1.1 requests a second on 400 connections while the machine runs
    h2load and the mock too.

    Under a sanitizer build the gateway cannot serve 10,000 requests a second on one worker;
    there the same 1 s carries 2,000 requests (10 clients): the number of flights depends on the
    span and the upstream latency, not on the rate, as long as every 30 ms has requests.

    One run is a measurement of a busy machine: if the gateway falls behind (the machine is
    shared), requests bunch up and fewer, longer flights result. The count must land in 30-40 in
    one of up to 5 runs; every run must answer every request with the page and never make more
    than 45 calls (collapsing broken would make thousands)."""

    def test_seed_10000_requests_over_1s_make_about_34_upstream_calls(self):
        self.start(services={"shared": [route("/catalog", latency_ms=30, json={"items": [1, 2]})]},
                   scripts={"catalog.lua": CATALOG},
                   upstream_options={"shared": {"timeout_ms": 2000, "breaker": False}})
        self.assertEqual(self.get("/catalog").status, 200)
        total = 2000 if SLOW else 10000
        clients = 10 if SLOW else 50
        per_client = total // clients
        step_ms = 1000.0 * clients / total
        script = os.path.join(self.workdir, "timing.txt")
        with open(script, "w") as f:
            for i in range(per_client):
                f.write("%.3f\t%s\n" % (i * step_ms, self.url("/catalog")))
        runs = []
        for _ in range(5):
            self.mock.reset()
            res = h2load(self.url("/catalog"), "-c", str(clients), "-m", "100", "-n", str(per_client),
                         "-r", "1", "--rate-period", "1ms", "--timing-script-file", script, timeout=120)
            self.assertEqual((res.get("done"), res.get("2xx")), (total, total), res["output"])
            calls = self.mock.hits()["shared"]["GET /catalog"]
            m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", res["output"])
            runs.append((calls, m.groups() if m else None))
            self.assertLessEqual(calls, 45, "identical calls in flight must share one upstream call: %r" % runs)
            if 30 <= calls <= 40:
                break
        print("\nsingle-flight: %d requests, upstream calls per run (request ms min/max/mean): %r"
              % (total, runs), file=sys.stderr)
        self.assertTrue(30 <= runs[-1][0] <= 40,
                        "upstream calls per run (request time min/max/mean): %r" % runs)


# ---------------------------------------------------------------------------------------------
# bulkheads

BULK = endpoint("GET /bulk/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      stuck = { "stuck", "/h/" .. id, timeout_ms = tonumber(req.query.t) },
      fast  = { "fast", "/f/" .. id },
    })""", deadline_ms=4000)
# eight calls to the stuck upstream started by one page, so they start in the same loop pass
# however slow the machine is (separate client requests would arrive spread out)
BULK8 = endpoint("GET /bulk8", """
    local calls = {}
    for i = 1, 8 do calls["c" .. i] = { "stuck", "/h/b" .. i, timeout_ms = tonumber(req.query.t) } end
    return agg.page(agg.fetch_all(calls))""", deadline_ms=4000)
FAST = endpoint("GET /fast/{id}", """
    return agg.page(agg.fetch_all { fast = { "fast", "/f/" .. req.params.id } })""", deadline_ms=4000)

HOLD_MS = 2500       # the two calls that hold stuck's connections
WAIT_MS = 700        # the calls that wait for one


class Bulkhead(GatewayTestCase):
    """Stuck hangs and may have 2 connections (max_connections = 2). Two pages take both with a
    2500 ms call; more pages' calls (700 ms timeout) wait in the queue and fail as
    `upstream-overloaded` at their own timeout, not at the page deadline (4000 ms)."""

    def start_bulk(self, max_pending=256):
        self.start(services={"stuck": [route("/h/{id}", fault="hang")],
                             "fast": [route("/f/{id}", latency_ms=5, json={"id": "{id}"})]},
                   scripts={"bulk.lua": BULK, "bulk8.lua": BULK8, "fast.lua": FAST},
                   upstream_options={"stuck": {"timeout_ms": 1000, "max_connections": 2,
                                               "max_pending": max_pending, "breaker": False},
                                     "fast": {"timeout_ms": 2000, "breaker": False}})
        self.assertEqual(self.get("/fast/0").status, 200)

    def hold_both_connections(self):
        box = {}
        t = threading.Thread(target=lambda: box.update(
            r=concurrent_gets(self.port, ["/bulk/h%d?t=%d" % (i, HOLD_MS) for i in range(2)])))
        t.start()
        self.assertTrue(wait_until(lambda: self.mock.stats()["stuck"]["in_flight"] >= 2, 5), self.mock.stats())
        return t, box

    def test_calls_beyond_max_connections_fail_overloaded_at_their_own_timeout_others_stay_fast(self):
        self.start_bulk()
        holder, held = self.hold_both_connections()
        box = {}
        waiters = threading.Thread(target=lambda: box.update(
            r=concurrent_gets(self.port, ["/bulk/w%d?t=%d" % (i, WAIT_MS) for i in range(6)])))
        waiters.start()
        # meanwhile the fast upstream answers at full speed
        fast_ms = []
        while waiters.is_alive() and len(fast_ms) < 200:
            r = self.get("/fast/%d" % (len(fast_ms) + 1))
            self.assertEqual(r.status, 200, r)
            fast_ms.append(r.ms)
            self.assertLessEqual(self.mock.stats()["stuck"]["connections_open"], 2, "max_connections = 2")
        waiters.join(15)
        self.assertGreater(len(fast_ms), 0)
        # A fast call held up by stuck's bulkhead would wait as long as the waiters (a 700 ms
        # timeout) or the holders (2500 ms); its own latency is 5 ms, and beside two busy loops
        # a page takes a scheduling delay more (a median of 160 ms was seen), never a waiter's
        # timeout. Half of it separates the two.
        self.assertLess(sorted(fast_ms)[len(fast_ms) // 2], WAIT_MS / 2,
                        "the fast upstream did not wait for stuck's connections: %r" % fast_ms)

        results = box["r"]
        self.assertEqual([r[0] for r in results], [200] * 6, results)
        for _status, _h, page, ms in results:
            self.assertEqual(page["fast"]["status"], "ok", page)
            self.assertEqual(kind(page["stuck"]), "upstream-overloaded", page)
            self.assertEqual(page["stuck"]["error"]["status"], 503, page)
            self.assertGreaterEqual(ms, WAIT_MS - 5, "each call waits its own timeout")
            self.assertLess(ms, WAIT_MS + SLACK_MS, "... not the page deadline (4000 ms)")
        self.assertEqual(self.mock.hits()["stuck"]["GET /h/{id}"], 2, "only the 2 holders got a connection")
        holder.join(15)
        self.assertEqual(sorted(kind(r[2]["stuck"]) for r in held["r"]), ["upstream-timeout"] * 2, held)

    def test_calls_beyond_max_pending_fail_at_once(self):
        self.start_bulk(max_pending=1)
        holder, _held = self.hold_both_connections()
        results = concurrent_gets(self.port, ["/bulk/w%d?t=%d" % (i, WAIT_MS) for i in range(4)])
        self.assertEqual([r[0] for r in results], [200] * 4, results)
        self.assertEqual([kind(r[2]["stuck"]) for r in results], ["upstream-overloaded"] * 4, results)
        ms = sorted(r[3] for r in results)
        # one waited in the queue (max_pending = 1) until its timeout; three were turned away at once
        self.assertLess(ms[2], WAIT_MS / 2, results)
        self.assertGreaterEqual(ms[3], WAIT_MS - 5, results)
        holder.join(15)

    # The race is a matter of one loop pass: an ASan build runs too slowly (connects and timers
    # drift by tens of ms) for the exact 6/2 split to mean anything; the optimized build checks it.
    @unittest.skipIf(SLOW, "timing of one loop pass; checked on the optimized build")
    def test_a_queued_call_whose_timeout_expires_as_a_connection_frees_is_overloaded(self):
        # 8 calls with the same timeout start together: 2 get the connections and hang, 6 wait.
        # When the 2 time out, their connections close and the pool hands new ones to waiting
        # calls whose own timers expire in the same loop iteration: those calls waited their
        # whole timeout for a connection, so they are overloaded (503, not counted by the
        # breaker), not upstream timeouts "while connecting" (and no connection should be opened
        # for a call that has no time left).
        self.start_bulk()
        r = self.get("/bulk8?t=%d" % WAIT_MS)
        sections = r.json()["sections"]
        kinds = sorted(kind(sections["c%d" % i]) for i in range(1, 9))
        details = [sections["c%d" % i]["error"].get("detail") for i in range(1, 9)]
        self.assertEqual(kinds, ["upstream-overloaded"] * 6 + ["upstream-timeout"] * 2, details)


# ---------------------------------------------------------------------------------------------
# fallbacks

FALLBACK = endpoint("GET /fb/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      event = { "events", "/events/" .. id, required = true },
      recs  = { "recs", "/recs/" .. id, fallback = { items = agg.array() } },
      more  = { "recs", "/more/" .. id, fallback = function(problem) return { reason = problem.type } end },
    })""", deadline_ms=3000)


class Fallbacks(GatewayTestCase):

    def test_fallback_sections_have_status_fallback_and_carry_the_problem(self):
        self.start(services={"events": [route("/events/{id}", json={"id": "{id}"})],
                             "recs": [route("/recs/{id}", status=500, json={"error": "boom"}),
                                      route("/more/{id}", fault="hang")]},
                   scripts={"fb.lua": FALLBACK},
                   upstream_options={"events": {"breaker": False},
                                     "recs": {"timeout_ms": 200, "breaker": False}})
        r = self.get("/fb/1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false", r)
        page = r.json()
        self.assertEqual(page["recs"]["status"], "fallback", page)
        self.assertEqual(page["recs"]["data"], {"items": []}, page)
        self.assertEqual(kind(page["recs"]), "upstream-error", page)
        self.assertEqual(page["more"]["status"], "fallback", page)
        self.assertEqual(page["more"]["data"], {"reason": "urn:aggway:problem:upstream-timeout"}, page)
        self.assertEqual(kind(page["more"]), "upstream-timeout", page)
        self.assertEqual(page["event"]["status"], "ok", page)

    def test_breaker_open_section_is_served_from_its_fallback(self):
        self.start(services={"events": [route("/events/{id}", json={"id": "{id}"})],
                             "recs": {"refuse": True, "routes": [route("/recs/{id}", json={})]}},
                   scripts={"fb.lua": FALLBACK},
                   upstream_options={"events": {"breaker": False},
                                     "recs": {"timeout_ms": 200, "breaker": {"failures": 5, "open_s": 30}}})
        for i in range(3):       # two recs calls per page: the breaker opens during page 3
            self.get("/fb/%d" % i)
        page = self.get("/fb/9").json()
        self.assertEqual((page["recs"]["status"], kind(page["recs"])), ("fallback", "circuit-open"), page)
        self.assertEqual(page["more"]["data"], {"reason": "urn:aggway:problem:circuit-open"}, page)


if __name__ == "__main__":
    main()
