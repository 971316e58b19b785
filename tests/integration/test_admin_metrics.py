"""The admin listener (issue 4, "Metrics" and "Logs and admin"): /healthz, /readyz, /routes,
/metrics in the Prometheus text format with counters that move as the traffic says, the JSON access
log (and its reopening on SIGUSR1), and an admin port that answers while the workers are busy.
"""
import json
import math
import os
import urllib.parse
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

from harness import (AGGWAY_BIN, SOURCE_DIR, START_TIMEOUT, Gateway, GatewayTestCase, endpoint, free_port, main,
                     read_all, route, run_aggway, wait_until, write_scripts, gateway_lua)


# ---------------------------------------------------------------------------------------------
# a small parser for the Prometheus text exposition format 0.0.4

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
SAMPLE = re.compile(r"^(%s)(\{.*\})? (\S+)( -?\d+)?$" % NAME)


class PromError(Exception):
    pass


def parse_labels(text):
    """'{a="x",b="y\\"z"}' -> {"a": "x", "b": 'y"z'} (escapes: \\\\, \\", \\n)."""
    labels, i, n = {}, 1, len(text)
    while i < n - 1:
        m = re.compile(LABEL_NAME).match(text, i)
        if not m or text[m.end():m.end() + 2] != '="':
            raise PromError("bad label at %r" % text[i:])
        name, i, value = m.group(0), m.end() + 2, []
        while True:
            if i >= n:
                raise PromError("unterminated label value in %r" % text)
            c = text[i]
            if c == "\\":
                nxt = text[i + 1]
                if nxt not in '\\"n':
                    raise PromError("bad escape \\%s in %r" % (nxt, text))
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise PromError("raw newline in a label value")
            else:
                value.append(c)
                i += 1
        if name in labels:
            raise PromError("label %s twice in %r" % (name, text))
        labels[name] = "".join(value)
        if text[i] == ",":
            i += 1
        elif text[i] != "}":
            raise PromError("expected , or } in %r" % text)
    if text[-1] != "}":
        raise PromError("labels must end with }: %r" % text)
    return labels


def parse_value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    return float(s)


def parse_prometheus(text):
    """Returns (types: family -> type, samples: list of (name, labels, value)). Raises PromError when a
    line breaks the format: every sample must belong to a family whose # TYPE came first (histogram
    samples end in _bucket, _sum or _count; _bucket has le), HELP/TYPE at most once per family."""
    if not text.endswith("\n"):
        raise PromError("the exposition must end with a line feed")
    types, helps, samples = {}, set(), []
    current = None
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            if name in helps:
                raise PromError("HELP twice for " + name)
            helps.add(name)
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[3] not in ("counter", "gauge", "histogram", "summary", "untyped"):
                raise PromError("bad TYPE line: " + line)
            if parts[2] in types:
                raise PromError("TYPE twice for " + parts[2])
            if not re.fullmatch(NAME, parts[2]):
                raise PromError("bad metric name " + parts[2])
            types[parts[2]] = parts[3]
            current = parts[2]
        elif line.startswith("#") or line == "":
            continue
        else:
            m = SAMPLE.match(line)
            if not m:
                raise PromError("bad sample line: %r" % line)
            name, labels = m.group(1), parse_labels(m.group(2)) if m.group(2) else {}
            value = parse_value(m.group(3))
            family = current
            if family is None:
                raise PromError("sample before any TYPE: " + line)
            if types[family] == "histogram":
                if name not in (family + "_bucket", family + "_sum", family + "_count"):
                    raise PromError("%s is not a sample of histogram %s" % (name, family))
                if name.endswith("_bucket") and "le" not in labels:
                    raise PromError("bucket without le: " + line)
            elif name != family:
                raise PromError("%s is not a sample of family %s" % (name, family))
            samples.append((name, labels, value))
    return types, samples


class Metrics:
    def __init__(self, text):
        self.text = text
        self.types, self.samples = parse_prometheus(text)

    def get(self, name, **labels):
        """The value of the one sample of name whose labels include these (None when there is none)."""
        found = [v for n, l, v in self.samples if n == name and all(l.get(k) == w for k, w in labels.items())]
        if len(found) > 1:
            raise AssertionError("%d samples of %s match %s" % (len(found), name, labels))
        return found[0] if found else None

    def value(self, name, **labels):
        v = self.get(name, **labels)
        return 0 if v is None else v


# ---------------------------------------------------------------------------------------------

def http(url, method="GET", timeout=5):
    """(status, headers, body bytes, seconds) of one request; HTTP errors are answers too."""
    t0 = time.monotonic()
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict((k.lower(), v) for k, v in r.headers.items()), r.read(), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, dict((k.lower(), v) for k, v in e.headers.items()), e.read(), time.monotonic() - t0


PAGE = endpoint("GET /mp/{id}", """
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, required = true },
      reviews   = { "reviews", "/reviews/" .. id, timeout_ms = 100 },
      inventory = { "inventory", "/stock/" .. id },
    }
    return agg.page(res)""", deadline_ms=1000)

BUSY = endpoint("GET /busy", """
    -- holds the worker's thread 2 to 3 s of wall time (os.time: whole seconds), under the
    -- script time limit of 5 s whatever share of a core the worker gets (CPU time, os.clock,
    -- took over 5 s of wall time beside two busy loops: the script was stopped)
    local t = os.time() + 3
    while os.time() < t do end
    return { status = 200, body = "done" }""")

PLAIN = endpoint("GET /plain/{id}", """
    local res = agg.fetch_all { product = { "product", "/products/" .. req.params.id }, ["odd name"] = { "product", "/products/1" } }
    return { status = 200, json = { name = res.product.data.name } }""", deadline_ms=1000)

FLAKY = endpoint("GET /flaky", """
    return agg.page(agg.fetch_all { flaky = { "flaky", "/x", required = true } })""")


def services(reviews_fault="hang", inventory_refuses=True):
    return {
        "product": [route("/products/{id}", json={"id": "{id}", "name": "Sneaker"})],
        "reviews": [route("/reviews/{id}", fault=reviews_fault)] if reviews_fault else
                   [route("/reviews/{id}", json={"rating": 4.6})],
        "inventory": {"refuse": True, "routes": []} if inventory_refuses else
                     [route("/stock/{id}", json={"inStock": 12})],
        "flaky": [route("/x", status=503, json={"error": "busy"})],
    }


class AdminCase(GatewayTestCase):
    def start_admin(self, services_=None, scripts=None, workers=1, access_log=None, upstream_options=None):
        self.admin_port = free_port()
        # /busy computes for 2 to 3 s on purpose: above the default script time limit (1000 ms)
        extra = {"admin": {"port": self.admin_port, "host": "127.0.0.1",
                           "allowed_hosts": ["gw-1.internal", "metrics.example"]},
                 "script_time_limit_ms": 5000}
        if access_log:
            extra["access_log"] = access_log
        opts = {"reviews": {"timeout_ms": 100}, "flaky": {"retry": {"attempts": 2, "backoff_ms": 1}}}
        opts.update(upstream_options or {})
        self.start(services=services_ or services(), scripts=scripts or {"mp.lua": PAGE, "busy.lua": BUSY,
                                                                         "flaky.lua": FLAKY},
                   workers=workers, gateway_extra=extra, upstream_options=opts)
        self.assertTrue(wait_until(lambda: self.admin("/healthz")[0] == 200, START_TIMEOUT), self.gw.log())
        # the workers' generation is loaded (the upstreams' gauges exist from then on): on a busy
        # machine /metrics was read before, without the breaker gauges
        self.assertTrue(wait_until(lambda: self.admin("/readyz")[0] == 200, START_TIMEOUT), self.gw.log())

    def admin(self, path, method="GET", timeout=5):
        try:
            return http("http://127.0.0.1:%d%s" % (self.admin_port, path), method=method, timeout=timeout)
        except OSError as e:
            return 0, {}, str(e).encode(), 0

    def metrics(self):
        status, headers, body, _ = self.admin("/metrics")
        self.assertEqual(status, 200, body)
        self.assertEqual(headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8")
        return Metrics(body.decode("utf-8"))


class HealthReadyRoutes(AdminCase):
    def test_health_ready_routes_and_errors(self):
        self.start_admin()
        self.assertEqual(self.admin("/healthz")[:3:2], (200, b"ok\n"))
        self.assertEqual(self.admin("/readyz")[:3:2], (200, b"ready\n"))
        status, headers, body, _ = self.admin("/routes")
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "application/json")
        routes = {r["route"]: r for r in json.loads(body)}
        self.assertEqual(set(routes), {"GET /mp/{id}", "GET /busy", "GET /flaky"})
        mp = routes["GET /mp/{id}"]
        self.assertEqual(mp["method"], "GET")
        self.assertEqual(mp["generation"], 1)
        self.assertTrue(mp["script"].endswith("/mp.lua"), mp)
        self.assertTrue(os.path.exists(mp["script"]), mp)
        self.assertEqual(self.admin("/nope")[0], 404)
        self.assertEqual(self.admin("/metrics/")[0], 404)
        self.assertEqual(self.admin("/metrics", method="POST")[0], 405)
        status, headers, body, _ = self.admin("/healthz", method="HEAD")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(self.admin("/healthz?verbose=1")[0], 200)
        # a request that is not HTTP gets 400, and the listener carries on
        import socket
        with socket.create_connection(("127.0.0.1", self.admin_port), timeout=5) as s:
            s.sendall(b"hello\r\n\r\n")
            self.assertTrue(s.recv(100).startswith(b"HTTP/1.1 400"))
        self.assertEqual(self.admin("/healthz")[0], 200)
        # a POST a web page makes (a browser marks it with Origin; text/plain needs no preflight)
        # is refused: a page the operator visits must not purge the cache (an attack review). The
        # operators' tools send none, with header fields or none at all, bare LF too
        def raw(request):
            with socket.create_connection(("127.0.0.1", self.admin_port), timeout=5) as s:
                s.sendall(request)
                return read_all(s, 5)
        for origin in (b"Origin: http://evil.example", b"origin: null", b"ORIGIN:http://127.0.0.1:9090"):
            got = raw(b"POST /cache/purge?prefix=agw: HTTP/1.1\r\nHost: 127.0.0.1\r\n" + origin +
                      b"\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
            self.assertTrue(got.startswith(b"HTTP/1.1 403"), (origin, got))
        for request in (b"POST /cache/purge?prefix=agw: HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
                        b"POST /cache/purge?prefix=agw: HTTP/1.0\r\n\r\n",
                        b"POST /cache/purge?prefix=agw: HTTP/1.1\nHost: localhost\n\n",
                        b"POST /cache/purge?prefix=agw: HTTP/1.1\r\nHost: [::1]\r\nX-Origin: a\r\n\r\n"):
            got = raw(request)
            self.assertTrue(got.startswith(b"HTTP/1.1 "), (request, got))
            self.assertFalse(got.startswith(b"HTTP/1.1 403"), (request, got))
        # (a GET with Origin is a read the same-origin policy keeps from other sites' pages)
        self.assertTrue(raw(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n\r\n")
                        .startswith(b"HTTP/1.1 200"))
        # Host: a name an attacker made resolve to 127.0.0.1 (DNS rebinding) is 421, on every
        # endpoint; none on HTTP/1.1, or two, is 400 (RFC 9112 §3.2); an IP address, localhost and
        # admin.allowed_hosts' names (any case, any port) are answered
        for path in (b"/healthz", b"/metrics", b"/waterfall.json", b"/routes"):
            for host in (b"evil.example", b"evil.example:%d" % self.admin_port, b"127.0.0.1.evil.example",
                         b"localhost.evil.example", b"gw-1.internal.evil.example", b"[::1", b"127.0.0.1:x", b"",
                         b"127.0.0.1\x00evil.example", b"localhost\x00.evil.example", b"127.0.0.1 x"):
                got = raw(b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
                self.assertTrue(got.startswith(b"HTTP/1.1 421"), (path, host, got))
                self.assertNotIn(b"aggway_", got)
        for request in (b"GET /metrics HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.1\nAccept: */*\n\n",
                        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n",
                        # the head ends at its first empty line: a Host after it is not the head's
                        b"GET /metrics HTTP/1.1\nX: y\n\nHost: localhost\r\n\r\n",
                        # a version that is not HTTP/1.0 or HTTP/1.1 exactly
                        b"GET /metrics HTTP/1.0x\r\n\r\n", b"GET /metrics HTTP/1.0 HTTP/1.1\r\n\r\n",
                        # whitespace before the colon, a folded line, a line without a colon (RFC 9112
                        # §5.1, §5.2): "Host :" was read as no Host
                        b"GET /metrics HTTP/1.0\r\nHost : evil.example\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\r\n c\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nnocolon\r\n\r\n"):
            got = raw(request)
            self.assertTrue(got.startswith(b"HTTP/1.1 400"), (request, got))
        for host in (b"127.0.0.1:%d" % self.admin_port, b"10.1.2.3", b"LOCALHOST:1", b"[::1]:9090", b"GW-1.Internal",
                     b"localhost.", b"gw-1.internal.:%d" % self.admin_port,
                     b"gw-1.internal:%d" % self.admin_port, b"metrics.example"):
            got = raw(b"GET /healthz HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            self.assertTrue(got.startswith(b"HTTP/1.1 200"), (host, got))
        # a head of LF lines closed by a CRLF empty line ends there (it waited for the timeout)
        self.assertTrue(raw(b"GET /healthz HTTP/1.1\nHost: 127.0.0.1\n\r\n").startswith(b"HTTP/1.1 200"))
        # 80 connections held open without a request (the listener keeps at most 64) do not keep a
        # probe out: the oldest waiting for its request is closed to make room, the newest stay
        held = [socket.create_connection(("127.0.0.1", self.admin_port), timeout=10) for _ in range(80)]
        try:
            status, _, body, _ = self.admin("/readyz", timeout=10)
            self.assertEqual((status, body), (200, b"ready\n"))
            self.assertEqual(held[0].recv(100), b"")  # closed, unanswered
            evicted = re.search(rb"^aggway_admin_connections_evicted_total (\d+)$", self.admin("/metrics")[2], re.M)
            self.assertTrue(evicted and int(evicted.group(1)) >= 17, evicted)  # 81 connections, 64 kept
            held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            self.assertTrue(read_all(held[-1], 10).startswith(b"HTTP/1.1 200"))
        finally:
            for h in held:
                h.close()
        # the main port does not serve the admin paths
        self.assertEqual(self.get("/metrics").status, 404)

    def test_help_lists_every_admin_endpoint_the_listener_serves_and_the_docs_too(self):
        """`aggway help`, the listener's 404 body and docs/operations.md's admin table list the same
        endpoints, and every one of them is served (not 404) with the method help gives."""
        self.start_admin()
        out = subprocess.run([AGGWAY_BIN, "help"], capture_output=True, text=True, timeout=30).stdout
        section = out.split("\nadmin listener")[1]
        listed = re.findall(r"^  (GET|POST) +(/\S+)", section, re.M)
        # the pages a reader missed in an earlier help are there, and the rest of the set
        self.assertEqual(sorted(p for _, p in listed),
                         sorted(["/healthz", "/readyz", "/metrics", "/routes", "/reload", "/upstreams",
                                 "/limits", "/waterfall", "/waterfall.json", "/cache/purge"]), section)
        for method, path in listed:
            status, _, body, _ = self.admin(path, method=method)
            self.assertNotIn(status, (0, 404, 405, 500), (method, path, status, body))
            if method == "GET":
                self.assertNotIn(self.admin(path, method="HEAD")[0], (0, 404, 405, 500), path)
        status, _, body, _ = self.admin("/nope")
        self.assertEqual(status, 404)
        self.assertEqual(re.findall(r"(GET|POST) (/[^\s,]+)", body.decode()), listed, body)
        with open(os.path.join(SOURCE_DIR, "docs", "operations.md")) as f:
            ops = f.read()
        documented = re.findall(r"^\| `(GET|POST) (/[^?` ]+)", ops, re.M)
        self.assertEqual(sorted(documented), sorted(listed), "docs/operations.md's admin table")

    def test_readyz_is_503_while_the_workers_load(self):
        # a script that takes a while to load: the admin listener answers "not ready" meanwhile.
        # 1 to 2 s of wall time (os.time: whole seconds): the load budget is 5 s of wall time, and
        # CPU time (os.clock) took over 5 s of wall time beside two busy loops
        slow = "local t = os.time() + 2 while os.time() < t do end\n" + PAGE
        self.start_mock(services())
        sdir = os.path.join(self.workdir, "slow")
        port, self.admin_port = free_port(), free_port()
        ups = {n: {"url": self.mock.url(n)} for n in self.mock.ports}
        write_scripts(sdir, {"mp.lua": slow}, gateway_lua(port, ups, workers=1,
                                                         admin={"port": self.admin_port}))
        self.gw = Gateway(sdir, port)
        log = open(self.gw.log_path, "ab")
        self.gw.proc = subprocess.Popen([AGGWAY_BIN, "serve", "-c", sdir], stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL)
        log.close()
        self.assertTrue(wait_until(lambda: self.admin("/healthz")[0] == 200, 4 * START_TIMEOUT), self.gw.log())
        status, _, body, _ = self.admin("/readyz")
        self.assertEqual((status, body), (503, b"not ready\n"))
        self.assertEqual(Metrics(self.admin("/metrics")[2].decode()).get("aggway_ready"), 0)
        self.assertTrue(wait_until(lambda: self.admin("/readyz")[0] == 200, 4 * START_TIMEOUT), self.gw.log())
        self.assertEqual(Metrics(self.admin("/metrics")[2].decode()).get("aggway_ready"), 1)


class MetricsMove(AdminCase):
    def test_counters_after_known_traffic(self):
        self.start_admin()
        m0 = self.metrics()
        for fam, typ in [("aggway_requests_total", "counter"), ("aggway_upstream_calls_total", "counter"),
                         ("aggway_upstream_call_duration_seconds", "histogram"),
                         ("aggway_request_duration_seconds", "histogram"),
                         ("aggway_response_size_bytes", "histogram"), ("aggway_partial_pages_total", "counter"),
                         ("aggway_upstream_breaker_state", "gauge"), ("aggway_upstream_calls_in_flight", "gauge"),
                         ("aggway_upstream_pool_connections", "gauge"), ("aggway_upstream_retries_total", "counter")]:
            self.assertEqual(m0.types.get(fam), typ, fam)
        self.assertEqual(m0.get("aggway_upstream_breaker_state", upstream="inventory"), 0)
        self.assertIsNone(m0.get("aggway_requests_total", route="GET /mp/{id}", code="200"))

        # three pages: product ok, reviews times out (100 ms), inventory refuses connections
        for _ in range(3):
            r = self.get("/mp/42")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers["x-aggregation-completed"], "false")
        self.assertEqual(self.get("/nothing-here").status, 404)
        m = self.metrics()
        self.assertEqual(m.get("aggway_requests_total", route="GET /mp/{id}", code="200"), 3)
        # (the harness's start-up probe is one more 404)
        self.assertEqual(m.get("aggway_requests_total", route="unmatched", code="404"),
                         m0.value("aggway_requests_total", route="unmatched", code="404") + 1)
        self.assertEqual(m.get("aggway_partial_pages_total", route="GET /mp/{id}", section="reviews"), 3)
        self.assertEqual(m.get("aggway_partial_pages_total", route="GET /mp/{id}", section="inventory"), 3)
        self.assertIsNone(m.get("aggway_partial_pages_total", route="GET /mp/{id}", section="product"))
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="product", outcome="ok"), 3)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="reviews", outcome="timeout"), 3)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="inventory", outcome="refused"), 3)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="inventory", outcome="circuit_open"), 0)
        self.assertEqual(m.get("aggway_upstream_call_duration_seconds_count", upstream="reviews"), 3)
        # the timeouts took about 100 ms each: none in the buckets up to 50 ms, all by 250 ms
        self.assertEqual(m.get("aggway_upstream_call_duration_seconds_bucket", upstream="reviews", le="0.05"), 0)
        self.assertEqual(m.get("aggway_upstream_call_duration_seconds_bucket", upstream="reviews", le="+Inf"), 3)
        self.assertGreaterEqual(m.get("aggway_upstream_call_duration_seconds_sum", upstream="reviews"), 0.29)
        self.assertEqual(m.get("aggway_request_duration_seconds_count", route="GET /mp/{id}"), 3)
        self.assertEqual(m.get("aggway_response_size_bytes_count", route="GET /mp/{id}"), 3)
        self.assertGreater(m.get("aggway_response_size_bytes_sum", route="GET /mp/{id}"), 3 * 100)
        self.assertEqual(m.get("aggway_upstream_calls_in_flight", upstream="product"), 0)
        self.assertEqual(m.get("aggway_requests_in_flight"), 0)
        # the pool gauges are published by each worker's once-a-second tick: about a second after
        # the calls they show the kept-alive connection (polled for up to 5 s, as a loaded machine
        # runs the tick late; a gauge never published stays at 0 and fails this)
        pools = wait_until(lambda: (lambda p: p if p.get("aggway_upstream_pool_connections", upstream="product") == 1
                                    else None)(self.metrics()), 5)
        self.assertIsNotNone(pools, "the pool gauges never showed the kept-alive connection")
        self.assertEqual(pools.get("aggway_upstream_pool_connections", upstream="product"), 1)   # kept alive
        self.assertEqual(pools.get("aggway_upstream_pool_idle_connections", upstream="product"), 1)
        self.assertEqual(pools.get("aggway_upstream_pool_waiting_calls", upstream="product"), 0)
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="inventory"), 0)

        # two more failures open the breakers (5 consecutive failures); the next call is not sent
        for _ in range(3):
            self.assertEqual(self.get("/mp/42").status, 200)
        m = self.metrics()
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="inventory", outcome="refused"), 5)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="inventory", outcome="circuit_open"), 1)
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="inventory"), 1)
        self.assertEqual(m.get("aggway_upstream_breaker_transitions_total", upstream="inventory", to="open"), 1)
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="reviews"), 1)
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="product"), 0)
        self.assertEqual(m.get("aggway_partial_pages_total", route="GET /mp/{id}", section="inventory"), 6)
        self.assertEqual(m.get("aggway_requests_total", route="GET /mp/{id}", code="200"), 6)

    def test_lua_collector_is_measured_and_an_idle_worker_collects(self):
        self.start_admin()
        m0 = self.metrics()
        for fam, typ in [("aggway_lua_gc_idle_collections_total", "counter"),
                         ("aggway_lua_gc_idle_collection_max_seconds", "gauge"), ("aggway_lua_heap_bytes", "gauge")]:
            self.assertEqual(m0.types.get(fam), typ, fam)
        before = self.get("/mp/42")
        self.assertEqual(before.status, 200)
        idle0 = self.metrics().value("aggway_lua_gc_idle_collections_total")
        # no request for 2 s: the worker collects its VMs in full (and trims the C heap) once, and the
        # heap gauge (once a second) shows the VM's heap; a busy machine may delay the ticks, not skip them
        self.assertTrue(wait_until(lambda: self.metrics().value("aggway_lua_gc_idle_collections_total") > idle0, 30),
                        self.gw.log())
        m = self.metrics()
        self.assertGreater(m.get("aggway_lua_heap_bytes"), 100 * 1024)
        # the heap beside it (jemalloc's figures, base/heap.h): allocated within the pages holding
        # it, within the allocator's resident pages. Not in the sanitized build (build-debug),
        # whose malloc is the sanitizer's
        if os.path.basename(os.path.dirname(AGGWAY_BIN)).startswith("build-debug"):
            self.assertIsNone(m.types.get("aggway_heap_bytes"))
        else:
            self.assertEqual(m.types.get("aggway_heap_bytes"), "gauge")
            allocated = m.get("aggway_heap_bytes", state="allocated")
            self.assertGreater(allocated, m.get("aggway_lua_heap_bytes"))  # the Lua VMs are on it
            self.assertLessEqual(allocated, m.get("aggway_heap_bytes", state="active"))
            self.assertLessEqual(m.get("aggway_heap_bytes", state="active"), m.get("aggway_heap_bytes", state="resident"))
            self.assertGreaterEqual(m.get("aggway_heap_bytes", state="retained"), 0)
            metadata = m.get("aggway_heap_bytes", state="metadata")  # jemalloc's own records
            self.assertGreater(metadata, 0)
            self.assertLess(metadata, m.get("aggway_heap_bytes", state="resident"))
        self.assertGreaterEqual(m.get("aggway_lua_gc_idle_collection_max_seconds"), 0)
        n = m.get("aggway_lua_gc_idle_collections_total")
        time.sleep(3.5)  # still idle: no second collection in the same idle spell
        self.assertEqual(self.metrics().get("aggway_lua_gc_idle_collections_total"), n)
        # the idle collection made the runtime's per-request tables again (agg.runtime.compact):
        # the same page, the same answer
        after = self.get("/mp/42")
        self.assertEqual(after.status, 200, after.body)
        self.assertEqual(json.loads(after.body), json.loads(before.body))

    def test_entries_into_lua_are_timed(self):
        # every entry of the worker into Lua (a handler, an upstream answer's continuation) is timed:
        # the worker's pauses in Lua, the collector's steps included (docs/performance.md)
        self.start_admin()
        m0 = self.metrics()
        self.assertEqual(m0.types.get("aggway_lua_entry_duration_seconds"), "histogram")
        self.assertEqual(m0.types.get("aggway_lua_entry_max_seconds"), "gauge")
        n0 = m0.get("aggway_lua_entry_duration_seconds_count")
        for _ in range(3):
            self.assertEqual(self.get("/mp/42").status, 200)
        m = self.metrics()
        # a page is at least its handler's entry and one for its calls' answers
        self.assertGreaterEqual(m.get("aggway_lua_entry_duration_seconds_count") - n0, 6)
        self.assertEqual(m.get("aggway_lua_entry_duration_seconds_bucket", le="+Inf"),
                         m.get("aggway_lua_entry_duration_seconds_count"))
        over_50ms = m.get("aggway_lua_entry_duration_seconds_count") - m.get("aggway_lua_entry_duration_seconds_bucket", le="0.05")
        # /busy holds the worker 2 to 3 s in one entry: it is the longest, in the top bucket (at
        # least one more entry over 50 ms; a busy machine may stretch another entry past 50 ms
        # too, so not exactly one: the max below says the long one was counted as such)
        self.assertEqual(self.get("/busy").status, 200)
        m = self.metrics()
        self.assertGreaterEqual(m.get("aggway_lua_entry_duration_seconds_count") -
                                m.get("aggway_lua_entry_duration_seconds_bucket", le="0.05"), over_50ms + 1)
        self.assertGreaterEqual(m.get("aggway_lua_entry_max_seconds"), 1.9)
        self.assertLess(m.get("aggway_lua_entry_max_seconds"), 60)
        self.assertGreaterEqual(m.get("aggway_lua_entry_duration_seconds_sum"), 1.9)

    def test_retries_and_5xx_across_workers(self):
        # two workers: the counters of both are summed; the runtime's retry counter is published
        # by each worker once a second
        self.start_admin(workers=2)
        # 502 while the upstream answers 503; 503 (circuit open) from the third page's retry on
        self.assertEqual([self.get("/flaky").status for _ in range(4)], [502, 502, 503, 503])
        m = self.metrics()
        self.assertEqual(m.get("aggway_workers"), 2)
        self.assertEqual(m.get("aggway_requests_total", route="GET /flaky", code="502"), 2)
        self.assertEqual(m.get("aggway_requests_total", route="GET /flaky", code="503"), 2)
        # 2 attempts per page until the shared breaker opened after 5 failed attempts (the third
        # page's retry); the fourth page's call is not sent
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="flaky", outcome="5xx"), 5)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="flaky", outcome="circuit_open"), 2)
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="flaky"), 1)
        self.assertTrue(wait_until(lambda: self.metrics().value("aggway_upstream_retries_total", upstream="flaky")
                                   >= 3, 5), self.metrics().text)


# a page whose sections are keyed by the client's query (a list page fanning out per item), base
# always ok: a page with a missing item is a partial 200; and another route whose reviews fail
PARTIAL_ITEMS = endpoint("GET /items", """
    local spec = { base = { "svc", "/ok/base" } }
    for id in (req.query.ids or "a"):gmatch("[^,]+") do spec[id] = { "svc", "/nf/" .. agg.escape(id) } end
    return agg.page(agg.fetch_all(spec))""")
PARTIAL_TWO = endpoint("GET /two", """
    return agg.page(agg.fetch_all { a = { "svc", "/ok/two" }, reviews = { "svc", "/nf/two" } })""")


class PartialPagesCap(AdminCase):
    def test_sections_past_the_table_count_as_their_routes_other(self):
        # (an attack review: a client that made 300 failing sections of its own filled the worker's
        # table of 256, and then no route's partial pages were counted, not even as "_other")
        svc = {"svc": [route("/ok/{id}", json={"ok": True}), route("/nf/{id}", status=404, json={"error": "nf"})]}
        self.start_admin(services_=svc, scripts={"items.lua": PARTIAL_ITEMS, "two.lua": PARTIAL_TWO}, workers=1)
        for i in range(0, 300, 10):
            self.assertEqual(self.get("/items?ids=" + ",".join("junk%d" % k for k in range(i, i + 10))).status, 200)
        for _ in range(5):
            r = self.get("/two")
            self.assertEqual((r.status, r.headers["x-aggregation-completed"]), (200, "false"))
        m = self.metrics()
        self.assertEqual(m.value("aggway_partial_pages_total", route="GET /two", section="_other"), 5)
        self.assertEqual(m.value("aggway_partial_pages_total", route="GET /items", section="_other"), 300 - 256)
        self.assertEqual(m.value("aggway_partial_pages_total", route="GET /items", section="junk0"), 1)


class AccessLog(AdminCase):
    FIELDS = {"time", "method", "path", "route", "status", "duration_ms", "bytes", "sections", "trace_id"}

    def read_lines(self, path, n):
        def lines():
            if not os.path.exists(path):
                return None
            with open(path) as f:
                got = f.read().splitlines()
            return got if len(got) >= n else None
        got = wait_until(lines, 5)
        self.assertIsNotNone(got, "fewer than %d access log lines in %s" % (n, path))
        return [json.loads(l) for l in got]

    def test_json_lines_and_reopen(self):
        path = os.path.join(self.workdir, "access.log")
        self.start_admin(services_=services(reviews_fault=None, inventory_refuses=True), access_log=path)
        self.assertEqual(self.get("/mp/7?x=1").status, 200)
        self.assertEqual(self.get("/nothing").status, 404)
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        self.assertEqual(self.get("/nothing", "-H", "traceparent: " + tp).status, 404)
        self.assertEqual(self.get("/nothing", "-H", "traceparent: 00-zz-00f067aa0ba902b7-01").status, 404)
        self.assertEqual(self.get("/nothing", "-H", "traceparent: " + tp,  # two: none valid (as a page's)
                                  "-H", "traceparent: 00-cccccccccccccccccccccccccccccccc-00f067aa0ba902b7-01").status, 404)
        lines = [l for l in self.read_lines(path, 6) if l["path"] != "/__harness_probe__"]
        self.assertEqual(len(lines), 5, lines)
        page, missing, traced, bad, two = lines
        self.assertIsNone(two["trace_id"])
        self.assertRegex(page["trace_id"], r"^[0-9a-f]{32}$", "a routed request has its trace id")
        self.assertIsNone(missing["trace_id"], "no route matched, no traceparent: no trace")
        # an answer made in C (no span) names the client's trace when it sent a valid traceparent
        self.assertEqual(traced["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        self.assertIsNone(bad["trace_id"])
        for l in lines:
            self.assertEqual(set(l), self.FIELDS, l)
            self.assertRegex(l["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual((page["method"], page["path"], page["route"], page["status"]),
                         ("GET", "/mp/7?x=1", "GET /mp/{id}", 200))
        self.assertGreater(page["bytes"], 50)
        self.assertGreaterEqual(page["duration_ms"], 0)
        secs = {s["name"]: s for s in page["sections"]}
        self.assertEqual(set(secs), {"product", "reviews", "inventory"})
        self.assertEqual(secs["product"]["status"], "ok")
        self.assertEqual(secs["inventory"]["status"], "unavailable")
        for s in secs.values():
            self.assertIsInstance(s["ms"], float)
        self.assertEqual((missing["route"], missing["status"], missing["sections"]), (None, 404, []))

        # log rotation: move the file away, SIGUSR1, the next lines go to a new file at the path
        os.rename(path, path + ".1")
        self.gw.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_until(lambda: "reopened the access log" in self.gw.log(), 5), self.gw.log())
        self.assertEqual(self.get("/mp/8").status, 200)
        lines = self.read_lines(path, 1)
        self.assertEqual([l["path"] for l in lines], ["/mp/8"])
        with open(path + ".1") as f:
            self.assertEqual(len(f.read().splitlines()), 6)

    def test_a_plain_response_lists_its_calls_from_server_timing(self):
        # not a page: no section statuses, the calls' names and durations (Server-Timing's)
        path = os.path.join(self.workdir, "access.log")
        self.start_admin(services_=services(reviews_fault=None, inventory_refuses=False), access_log=path,
                         scripts={"plain.lua": PLAIN})
        r = self.get("/plain/7")
        self.assertEqual(r.status, 200, r)
        lines = [l for l in self.read_lines(path, 2) if l["path"] == "/plain/7"]
        self.assertEqual(len(lines), 1, lines)
        secs = lines[0]["sections"]
        # (in the order the calls ended)
        self.assertEqual(sorted((s["name"], s["status"]) for s in secs), [("odd_name", None), ("product", None)], secs)
        for s in secs:
            self.assertIsInstance(s["ms"], float)

    def test_a_long_path_is_logged_cut(self):
        # (an attack review: over h2c a 4,000-byte path sent once into the HPACK table and named in
        # 4 bytes a request wrote 4 KB of log a request, 300 bytes for a byte sent)
        path = os.path.join(self.workdir, "access.log")
        self.start_admin(access_log=path)
        long_path = "/nothing/" + "\u00e9" * 1000 + "x" * 2000
        r = self.get(urllib.parse.quote(long_path, safe="/"), "--http2-prior-knowledge")
        self.assertEqual(r.status, 404)
        self.assertEqual(self.get("/nothing?q=" + "y" * 3000).status, 404)
        lines = [l for l in self.read_lines(path, 2) if l["path"] != "/__harness_probe__"]
        self.assertEqual(len(lines), 2, lines)
        for l in lines:
            self.assertTrue(l["path"].startswith("/nothing"), l["path"][:40])
            self.assertLessEqual(len(l["path"].encode()), 1024 + 16, l["path"][-40:])
            self.assertRegex(l["path"], "\u2026\\+\\d+$")
        escaped, query = lines
        sent = urllib.parse.quote(long_path, safe="/")
        self.assertEqual(escaped["path"], sent[:1024] + "\u2026+%d" % (len(sent) - 1024))
        self.assertEqual(query["path"], "/nothing?q=" + "y" * (1024 - 11) + "\u2026+%d" % (3000 - (1024 - 11)))

    def test_off_by_default(self):
        self.start_admin()
        self.assertEqual(self.get("/nothing").status, 404)
        time.sleep(0.3)
        self.assertNotIn('"trace_id"', self.gw.log())


class AdminConfig(GatewayTestCase):
    def check(self, source):
        sdir = os.path.join(self.workdir, "c%d" % len(os.listdir(self.workdir)))
        write_scripts(sdir, {"mp.lua": PAGE}, source)
        p = run_aggway("check", "-c", sdir)
        return p.returncode, p.stderr.decode()

    def test_admin_and_access_log_are_checked_with_file_and_line(self):
        rc, err = self.check('return {\n  listen = { { port = 8080 } },\n  admin = { port = 8080, hots = "x" },\n'
                             '  access_log = 42,\n  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 1)
        self.assertIn("gateway.lua:3: admin.hots: unknown option (did you mean 'host'?) (port, host, allowed_hosts)", err)
        self.assertIn("gateway.lua:3: admin.port: port 8080 is also a listen port", err)
        self.assertIn('gateway.lua:4: access_log: must be a file path, "stderr", or false, got 42', err)
        # a listen entry's port misspelt: the missing port on the listen line, not on the next
        # "port" text (the admin's, line 3: a fresh user's trial), and the spelling it meant
        rc, err = self.check('return {\n  listen = { { prot = 8085 } },\n  admin = { port = 8095 },\n'
                             '  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 1)
        self.assertIn("gateway.lua:2: listen[1].prot: unknown option (did you mean 'port'?) (port, host, tls, reuse_port)", err)
        self.assertIn("gateway.lua:2: listen[1].port: must be a positive whole number up to 65535, got nil", err)
        # admin.allowed_hosts: host names only (IP addresses and localhost are always answered)
        rc, err = self.check('return {\n  admin = { port = 8095,\n    allowed_hosts = { "gw-1.internal", "gw-2:9090", 7 } },\n'
                             '  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 1)
        self.assertIn('gateway.lua:3: admin.allowed_hosts[2]: must be a host name like "gw-1.internal" (no port, no '
                      'scheme; IP addresses and localhost are always allowed), got string "gw-2:9090"', err)
        self.assertIn("gateway.lua:3: admin.allowed_hosts[3]: must be a host name", err)
        rc, err = self.check('return {\n  admin = { port = 8095, allowed_hosts = "gw-1.internal" },\n'
                             '  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 1)
        self.assertIn('gateway.lua:2: admin.allowed_hosts: must be a list of host names like { "gw-1.internal" }, '
                      'got string "gw-1.internal"', err)
        rc, err = self.check('return {\n  admin = { port = 70000 },\n  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 1)
        self.assertIn("gateway.lua:2: admin.port: must be a positive whole number up to 65535, got 70000", err)
        rc, err = self.check('return {\n  admin = { port = 9999, host = "127.0.0.1" }, access_log = "stderr",\n'
                             '  upstreams = { product = { url = "http://127.0.0.1:1" },\n'
                             '    reviews = { url = "http://127.0.0.1:1" }, inventory = { url = "http://127.0.0.1:1" } },\n}\n')
        self.assertEqual(rc, 0, err)


class AdminUnderLoad(AdminCase):
    def test_admin_answers_while_the_worker_is_busy(self):
        self.start_admin(workers=1)
        result = {}

        def busy():
            result["r"] = self.get("/busy", timeout=20)
        t = threading.Thread(target=busy)
        t.start()
        # the only worker is spinning in the script once the request is in flight (curl took
        # longer than a fixed 0.5 s to start beside two busy loops)
        self.assertTrue(wait_until(lambda: self.metrics().get("aggway_requests_in_flight") == 1, 10))
        try:
            for path in ("/healthz", "/readyz", "/metrics", "/routes"):
                status, _, _, secs = self.admin(path)
                self.assertEqual(status, 200, path)
            # an admin answer that waited for the worker would come after /busy's answer: all came
            # while it was still computing
            self.assertTrue(t.is_alive(), "the admin answers waited for the busy worker")
            self.assertEqual(self.metrics().get("aggway_requests_in_flight"), 1)
        finally:
            t.join(30)
        self.assertEqual(result["r"].status, 200)
        self.assertEqual(self.metrics().get("aggway_requests_total", route="GET /busy", code="200"), 1)


if __name__ == "__main__":
    main()
