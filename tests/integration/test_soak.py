"""Mixed-fault soak (issue 5): AGGWAY_SOAK_SECONDS (default 300, at most 330) of steady load on a
page with three upstreams while one of them flaps every few seconds between healthy, slow, down,
failing and hanging.

    stable   5 ms (1 call in 50 takes 150 ms), hedged at its p95        section a (optional)
    shared   20 ms, one path for every page: single-flight shares it     section b (optional)
    flappy   the flapping one: retry (2 attempts) and breaker (5 / 2 s)  section c (required on
                                                                         half of the pages)

The load is open-loop and paced (tests/integration/paced_client.py): RATE pages a second, each
sent at its planned moment whatever the answers do, every answer's exact status recorded.

Afterwards: the gateway is alive, every request got an answer and each is 200, 502, 503 or 504;
the mock holds no more connections than the pools allow (no leak); the gateway's RSS grew by
less than 50 MB; the admin /metrics counters add up (requests by code = answers the client
got; for each upstream, the attempts sent = pages + retries + hedges - shared calls; breaker
transitions = the log's state-change lines); and SIGTERM stops the gateway with exit status 0."""
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, SLOW, START_TIMEOUT, endpoint, free_port, route, wait_until, main  # noqa: E402
from paced_client import paced_get  # noqa: E402

SECONDS = max(5, min(330, int(os.environ.get("AGGWAY_SOAK_SECONDS", "300"))))
RATE = 100 if SLOW else 150            # pages per second

# ASan keeps freed memory in a quarantine (256 MB by default) before reusing it, so under a
# sanitizer build RSS grows by the quarantine whatever the gateway does (+55 MB in 5 minutes
# here). A small quarantine keeps the memory claim meaningful there too.
if "quarantine_size_mb" not in os.environ.get("ASAN_OPTIONS", ""):
    os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=16").lstrip(":")
PHASE_S = 3.0                          # flappy changes its behaviour this often
WORKERS = 2
MAX_CONNS = {"stable": 32, "shared": 32, "flappy": 16}

PAGE = endpoint("GET /soak/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      a = { "stable", "/a/" .. id, hedge = true, collapse = false },
      b = { "shared", "/b" },
      c = { "flappy", "/c/" .. id, required = req.query.r == "1" },
    })""", deadline_ms=1000)

FLAPPY_OK = {"path": "/c/{id}", "json": {"id": "{id}", "v": 1}}
# (name, what to do): the phases flappy goes through, in a loop
PHASES = [
    ("healthy", dict(FLAPPY_OK, latency_ms=10)),
    ("slow", dict(FLAPPY_OK, latency_ms=400)),             # beyond its 250 ms timeout
    ("healthy", dict(FLAPPY_OK, latency_ms=10)),
    ("down", None),                                        # connections refused
    ("healthy-slowish", dict(FLAPPY_OK, latency_ms=120)),   # within the timeout
    ("failing", {"path": "/c/{id}", "status": 503, "latency_ms": 5, "json": {"status": 503}}),
    ("healthy", dict(FLAPPY_OK, latency_ms=10)),
    ("hanging", {"path": "/c/{id}", "fault": "hang"}),
    ("half-failing", dict(FLAPPY_OK, latency_ms=10, fault="reset", fault_every=2)),
]


def parse_metrics(text):
    """Prometheus text -> list of (name, {label: value}, float)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def metric_sum(samples, name, **labels):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items()))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Soak(GatewayTestCase):

    def admin_get(self, path):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin_port, path), timeout=10) as r:
            return r.read().decode()

    def flapper(self, stop):
        """Cycles flappy through PHASES until stop is set; returns the phases it went through."""
        i = 0
        down = False
        while not stop.wait(PHASE_S):
            name, r = PHASES[i % len(PHASES)]
            i += 1
            if r is None:
                self.mock.refuse("flappy")
                down = True
            else:
                self.mock.set_routes("flappy", [r])
                if down:
                    self.mock.accept("flappy")
                    down = False
            self.phases.append(name)
        if down:
            self.mock.accept("flappy")

    def test_mixed_fault_soak(self):
        self.admin_port = free_port()
        self.start(services={
            "stable": [route("/a/{id}", latency_ms=5, slow_every=50, slow_ms=150, json={"id": "{id}"})],
            "shared": [route("/b", latency_ms=20, json={"items": [1, 2, 3]})],
            "flappy": [dict(FLAPPY_OK, latency_ms=10)],
        }, scripts={"soak.lua": PAGE}, workers=WORKERS,
            gateway_extra={"admin": {"port": self.admin_port, "host": "127.0.0.1"}},
            upstream_options={
                "stable": {"timeout_ms": 500, "max_connections": MAX_CONNS["stable"], "breaker": False,
                           "hedge": {"after": "p95", "max_percent": 5}},
                "shared": {"timeout_ms": 500, "max_connections": MAX_CONNS["shared"], "breaker": False},
                "flappy": {"timeout_ms": 250, "max_connections": MAX_CONNS["flappy"],
                           "breaker": {"failures": 5, "open_s": 2},
                           "retry": {"attempts": 2, "backoff_ms": 20}},
            })
        self.assertTrue(wait_until(lambda: self._admin_ok(), START_TIMEOUT), self.gw.log())
        pid = self.gw.proc.pid

        # warm-up: 5 s of load with every upstream healthy (pools, LuaJIT traces, p95 samples)
        warm = paced_get(self.port, [(i / RATE, "/soak/w%d" % i) for i in range(5 * RATE)], connections=32)
        self.assertEqual({r.status for r in warm}, {200}, [r for r in warm if r.status != 200][:5])
        rss_before = rss_kb(pid)
        self.mock.reset()
        m0 = self.settled_metrics()

        self.phases = []
        stop = threading.Event()
        flap = threading.Thread(target=self.flapper, args=(stop,))
        flap.start()
        n = SECONDS * RATE
        schedule = [(i / RATE, "/soak/%d%s" % (i, "?r=1" if i % 2 else "")) for i in range(n)]
        try:
            results = paced_get(self.port, schedule, connections=64, max_connections=1000, timeout=15)
        finally:
            stop.set()
            flap.join(30)

        # every request got an answer, and only the statuses the page contract allows
        self.assertIsNotNone(self.gw.proc, "gateway")
        self.assertIsNone(self.gw.proc.poll(), "the gateway is alive:\n" + self.gw.log()[-3000:])
        statuses = {}
        for r in results:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        unanswered = [r for r in results if r.status == 0]
        retried = sum(1 for r in results if r.retried)
        sys.stderr.write("soak: %d requests, statuses %r, %d resent after the keep-alive race\n"
                         % (n, statuses, retried))
        self.assertEqual(unanswered, [], "requests without an answer (statuses %r)" % statuses)
        self.assertLessEqual(set(statuses), {200, 502, 503, 504}, statuses)
        self.assertGreater(statuses.get(200, 0), n // 3, statuses)
        late = [r for r in results if r.ms is not None and r.ms > 1000 + (1500 if SLOW else 700)]
        self.assertLess(len(late), max(5, n // 1000), "answers far past the 1000 ms deadline: %r" % late[:10])
        self.assertGreaterEqual(len(self.phases), min(len(PHASES), SECONDS // PHASE_S - 1), self.phases)

        # no leaked connection: back to at most the pools' sizes once the load stops
        limit = {name: MAX_CONNS[name] * WORKERS for name in MAX_CONNS}
        self.assertTrue(wait_until(lambda: all(self.mock.stats()[s]["connections_open"] <= limit[s] for s in limit)
                                   and all(self.mock.stats()[s]["in_flight"] == 0 for s in limit), 5),
                        self.mock.stats())
        m = self.settled_metrics()
        for s in limit:
            self.assertLessEqual(metric_sum(m, "aggway_upstream_pool_connections", upstream=s), limit[s], s)
            self.assertEqual(metric_sum(m, "aggway_upstream_calls_in_flight", upstream=s), 0, s)
        self.assertEqual(metric_sum(m, "aggway_requests_in_flight"), 0)

        # memory: bounded growth
        rss_after = rss_kb(pid)
        self.assertLess(rss_after - rss_before, 50 * 1024, "RSS %d kB -> %d kB" % (rss_before, rss_after))

        # counters add up
        def delta(name, **labels):
            return metric_sum(m, name, **labels) - metric_sum(m0, name, **labels)
        for code, count in statuses.items():
            self.assertEqual(delta("aggway_requests_total", route="GET /soak/{id}", code=str(code)), count, code)
        pages = n
        report = {}
        for s in ("stable", "shared", "flappy"):
            sent = delta("aggway_upstream_calls_total", upstream=s)        # every outcome, circuit_open too
            retries = delta("aggway_upstream_retries_total", upstream=s)
            hedges = delta("aggway_upstream_hedges_total", upstream=s)
            won = delta("aggway_upstream_hedges_won_total", upstream=s)
            collapsed = delta("aggway_upstream_collapsed_total", upstream=s)
            denied = delta("aggway_upstream_retries_denied_total", upstream=s)
            report[s] = dict(sent=sent, retries=retries, hedges=hedges, won=won, collapsed=collapsed, denied=denied)
            self.assertLessEqual(won, hedges, report)
            # a scheduled retry is not sent when the page ends first (its deadline): <= retries
            self.assertLessEqual(sent, pages + retries + hedges - collapsed, report)
            self.assertGreaterEqual(sent, pages + hedges - collapsed, report)
        self.assertEqual(report["shared"]["sent"], pages - report["shared"]["collapsed"], report)
        self.assertGreater(report["shared"]["collapsed"], 0, report)
        self.assertEqual(report["stable"]["sent"], pages + report["stable"]["hedges"], report)
        self.assertGreater(report["stable"]["hedges"], 0, report)
        # 5 % of the calls, plus what each worker banked during the warm-up (at most 10 tokens)
        self.assertLessEqual(report["stable"]["hedges"], pages * 0.05 + 10 * WORKERS, report)
        self.assertGreater(report["flappy"]["retries"], 0, report)
        self.assertGreater(delta("aggway_upstream_calls_total", upstream="flappy", outcome="circuit_open"), 0)
        # the mock saw what the gateway says it sent and got answers for
        hits = self.mock.hits()
        for s, key in (("stable", "GET /a/{id}"), ("shared", "GET /b")):
            answered = sum(delta("aggway_upstream_calls_total", upstream=s, outcome=o) for o in ("ok", "4xx", "5xx"))
            self.assertLessEqual(answered, hits[s][key], (s, hits, report))
            self.assertLessEqual(hits[s][key], report[s]["sent"], (s, hits, report))
        # breaker transitions: the metric and the log's state-change lines agree
        log = self.gw.log()
        opened = log.count("circuit breaker of upstream flappy is now open")
        closed = log.count("circuit breaker of upstream flappy is now closed")
        self.assertGreater(opened, 0, log[-2000:])
        self.assertEqual(metric_sum(m, "aggway_upstream_breaker_transitions_total", upstream="flappy", to="open"),
                         opened)
        self.assertEqual(metric_sum(m, "aggway_upstream_breaker_transitions_total", upstream="flappy", to="closed"),
                         closed)
        print("\nsoak: %d s, %d pages, statuses %r, phases %d, RSS %d -> %d kB, counters %r"
              % (SECONDS, n, statuses, len(self.phases), rss_before, rss_after, report), file=sys.stderr)

        # SIGTERM: a clean exit
        self.gw.stop()
        self.assertEqual(self.gw.proc.returncode, 0, self.gw.log()[-3000:])

    def settled_metrics(self):
        """The admin's metrics once the figures the breaker and the scheduler publish on each
        worker's once-a-second tick have settled: two scrapes more than a tick apart that agree on
        every upstream and request series. (A fixed sleep read a tick from before the last calls
        when a busy machine delayed a worker's tick.) If they never agree within the bound, the
        last scrape is returned and the test's own checks judge it."""
        def figures(samples):
            return sorted((n, sorted(l.items()), v) for n, l, v in samples
                          if n.startswith("aggway_upstream_") or n.startswith("aggway_requests_"))
        box = {"last": parse_metrics(self.admin_get("/metrics"))}

        def agree():
            time.sleep(1.2)
            now = parse_metrics(self.admin_get("/metrics"))
            same = figures(now) == figures(box["last"])
            box["last"] = now
            return same
        wait_until(agree, 60 if SLOW else 30, interval=0)
        return box["last"]

    def _admin_ok(self):
        try:
            return "aggway_ready 1" in self.admin_get("/metrics")
        except OSError:
            return False


if __name__ == "__main__":
    main()
