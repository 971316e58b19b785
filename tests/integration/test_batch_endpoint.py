"""The batch endpoint (issue 19) with the real gateway and aggway-mock: a client posts several
requests in one envelope; each runs through the gateway's own request path (router, limits,
authentication, metrics, access log) as if it had come alone, all in parallel under the batch's
deadline, and one JSON answer carries an entry per request."""
import hashlib
import http.client
import json
import os
import socket
import struct
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, access_log_lines, endpoint, free_port, route, wait_until, main  # noqa: E402
from h2_client import H2Client, _literal  # noqa: E402
from test_admin_metrics import Metrics  # noqa: E402

SERVICES = {
    "product": [route("/products/{id}", latency_ms=20, json={"id": "{id}", "name": "Sneaker"}),
                route("/hang", fault="hang"), route("/hang/{id}", fault="hang")],
}

SCRIPTS = {
    "product.lua": endpoint("GET /p/{id}", """
    return agg.page(agg.fetch_all { product = { "product", "/products/" .. req.params.id, required = true } })
"""),
    "slow.lua": endpoint("GET /slow", """
    return agg.page(agg.fetch_all { h = { "product", "/hang", timeout_ms = 5000, required = true } })
""", deadline_ms=5000),
    "slow_id.lua": endpoint("GET /slow/{id}", """
    return agg.page(agg.fetch_all { h = { "product", "/hang/" .. req.params.id, timeout_ms = 5000, required = true } })
""", deadline_ms=5000),
    "echo.lua": endpoint("POST /echo", """
    return { status = 201, json = { got = req.json, ct = req.headers["content-type"], who = req.headers["x-who"] } }
"""),
    "raw.lua": endpoint("POST /raw", """
    return { status = 200, json = { body = req.body } }
"""),
    "text.lua": endpoint("GET /text", """
    return { status = 200, body = "plain words" }
"""),
}


class BatchCase(GatewayTestCase):
    def start_batch(self, batch=None, **extra):
        gw_extra = {"batch": batch or {"route": "POST /batch", "max_requests": 20, "deadline_ms": 1500}}
        gw_extra.update(extra)
        self.start(services=SERVICES, scripts=SCRIPTS, gateway_extra=gw_extra,
                   upstream_options={"product": {"timeout_ms": 5000, "connect_timeout_ms": 2000}})

    def post(self, doc, path="/batch", raw=None, timeout=20.0):
        body = raw if raw is not None else json.dumps(doc).encode()
        t = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=body, headers={"content-type": "application/json"})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data), (time.monotonic() - t) * 1000
        finally:
            c.close()


class BatchEndpoint(BatchCase):
    def test_entries_of_mixed_routes_each_get_their_own_answer(self):
        self.start_batch()
        reqs = []
        for i in range(16):
            reqs.append({"method": "GET", "path": "/p/%d" % i})
        reqs.append({"method": "POST", "path": "/echo", "headers": {"X-Who": "ann"}, "body": {"n": [1, 2]}})
        reqs.append({"path": "/slow"})
        reqs.append({"path": "/nowhere"})
        reqs.append({"path": "/text"})
        status, headers, doc, ms = self.post({"requests": reqs})
        self.assertEqual(status, 200, doc)
        self.assertEqual(headers["content-type"], "application/json")
        out = doc["responses"]
        self.assertEqual(len(out), 20)
        for i in range(16):
            self.assertEqual(out[i]["status"], 200, out[i])
            self.assertEqual(out[i]["body"]["product"]["data"], {"id": i, "name": "Sneaker"})
            self.assertEqual(out[i]["headers"]["x-aggregation-completed"], "true")
        self.assertEqual(out[16]["status"], 201)
        self.assertEqual(out[16]["body"], {"got": {"n": [1, 2]}, "ct": "application/json", "who": "ann"})
        # the entry that hangs is answered at the batch's deadline; the others did not wait for it
        self.assertEqual(out[17]["status"], 504)
        self.assertTrue(out[17]["body"]["type"].endswith("deadline-exceeded"), out[17])
        self.assertGreaterEqual(ms, 1500)
        self.assertLess(ms, 4500)  # far below the entry's own 5 s
        self.assertEqual(out[18]["status"], 404)
        self.assertTrue(out[18]["body"]["type"].endswith("route-not-found"))
        self.assertEqual(out[19], {"status": 200, "headers": {"content-type": "text/plain; charset=utf-8"},
                                   "body": "plain words"})
        # the hanging call was cancelled with its entry: the gateway serves on
        status, _, doc, _ = self.post({"requests": [{"path": "/p/1"}]})
        self.assertEqual(doc["responses"][0]["status"], 200)

    def test_twenty_entries_of_mixed_routes_one_timing_out_one_unauthorized_each_answered(self):
        keys = os.path.join(self.workdir, "api-keys.json")
        with open(keys, "w") as f:
            json.dump([{"sha256": hashlib.sha256(b"k-good-123").hexdigest(), "app": "mobile", "plan": "gold"}], f)
        self.start_batch(auth={"api_keys": {"file": keys, "header": "X-Client-Key"}})
        key = {"X-Client-Key": "k-good-123"}
        reqs = [{"path": "/p/%d" % i, "headers": key} for i in range(15)]
        reqs.append({"method": "POST", "path": "/echo", "headers": dict(key, **{"X-Who": "bo"}), "body": {"a": 1}})
        reqs.append({"path": "/slow", "headers": key})                          # times out
        reqs.append({"path": "/p/99"})                                          # no key: unauthorized
        reqs.append({"path": "/p/98", "headers": {"X-Client-Key": "k-forged"}})  # unknown key
        reqs.append({"path": "/text", "headers": key})
        status, _, doc, ms = self.post({"requests": reqs})
        self.assertEqual(status, 200, doc)
        out = doc["responses"]
        self.assertEqual(len(out), 20)
        for i in range(15):
            self.assertEqual(out[i]["status"], 200, out[i])
            self.assertEqual(out[i]["body"]["product"]["data"]["id"], i)
        self.assertEqual(out[15]["status"], 201)
        self.assertEqual(out[15]["body"]["who"], "bo")
        self.assertEqual(out[16]["status"], 504)
        self.assertTrue(out[16]["body"]["type"].endswith("deadline-exceeded"), out[16])
        for e in (out[17], out[18]):
            self.assertEqual(e["status"], 401, e)
            self.assertTrue(e["headers"]["www-authenticate"].startswith("APIKey"), e)
            self.assertEqual(e["headers"]["content-type"], "application/problem+json")
        self.assertEqual(out[19]["body"], "plain words")
        # the unauthorized entries never reached a script or an upstream
        hits = self.mock.hits()["product"]
        self.assertEqual(hits.get("GET /products/{id}"), 15)
        self.assertLess(ms, 4500)

    def test_limits_count_each_entry_as_a_request_of_the_batchs_client(self):
        # 3 requests a minute per client address: the first three entries pass, the rest get 429
        limited = endpoint("GET /lim/{id}", "    return { status = 200, json = { id = req.params.id } }") \
            .replace("return {\n", 'return {\n  limits = { "per-ip" },\n', 1)
        scripts = dict(SCRIPTS, **{"lim.lua": limited})
        self.start(services=SERVICES, scripts=scripts, gateway_extra={
            "batch": {"route": "POST /batch", "max_requests": 20},
            "limits": {"rules": [{"name": "per-ip", "key": "ip", "rate": 1, "per_s": 60, "burst": 3}],
                       "headers": True}})
        status, _, doc, _ = self.post({"requests": [{"path": "/lim/%d" % i} for i in range(5)] + [{"path": "/text"}]})
        self.assertEqual(status, 200, doc)
        out = doc["responses"]
        self.assertEqual(sorted(e["status"] for e in out[:5]), [200, 200, 200, 429, 429], out)
        for e in out[:5]:
            self.assertIn("ratelimit-policy", e["headers"], e)
            if e["status"] == 429:
                self.assertIn("retry-after", e["headers"], e)
        self.assertEqual(out[5]["status"], 200)  # a route without limits is not counted
        # the same client alone afterwards: its bucket is spent by the batch's entries
        r = self.get("/lim/9")
        self.assertEqual(r.status, 429, r)

    def test_entries_run_in_parallel(self):
        self.start_batch()
        best = min(self.post({"requests": [{"path": "/p/%d" % i} for i in range(10)]})[3] for _ in range(3))
        self.assertLess(best, 10 * 20)  # ten 20 ms pages one after the other would take 200 ms

    def test_an_entry_body_reaches_its_script_compact(self):
        # a JSON body is handed over as compact JSON, as long as what was sent: no indentation
        # that grows with depth and elements (8 KB of nesting once made a body of 128 MB)
        self.start_batch()
        nested = [[[0, 0]], {}, {"a": [1, {"b": None}]}]
        deep = json.loads("[" * 200 + ",".join(["0"] * 50) + "]" * 200)
        status, _, doc, _ = self.post({"requests": [{"method": "POST", "path": "/raw", "body": nested},
                                                    {"method": "POST", "path": "/raw", "body": deep}]})
        self.assertEqual(status, 200)
        self.assertEqual(doc["responses"][0]["body"]["body"], '[[[0,0]],{},{"a":[1,{"b":null}]}]')
        self.assertEqual(doc["responses"][1]["body"]["body"], json.dumps(deep, separators=(",", ":")))

    def test_nested_batches_are_refused(self):
        self.start_batch()
        status, _, doc, _ = self.post({"requests": [{"path": "/p/1"}, {"method": "POST", "path": "/batch",
                                                                      "body": {"requests": [{"path": "/p/2"}]}}]})
        self.assertEqual(status, 200)
        self.assertEqual(doc["responses"][0]["status"], 200)
        self.assertEqual(doc["responses"][1]["status"], 400)
        self.assertTrue(doc["responses"][1]["body"]["type"].endswith("nested-batch"))
        self.assertEqual(self.mock.hits()["product"].get("GET /products/{id}"), 1)

    def test_a_malformed_envelope_is_a_400_problem_naming_the_entry(self):
        self.start_batch()
        cases = [
            (b"not json", "must be JSON"),
            (json.dumps({"requests": []}).encode(), "non-empty"),
            (json.dumps({"requests": [{"path": "/p/1"}] * 21}).encode(), "more than max_requests (20)"),
            (json.dumps({"requests": [{"path": "/p/1"}, {"path": "p/2"}]}).encode(), "requests[1].path"),
            (json.dumps({"requests": [{"path": "/p/1", "methd": "GET"}]}).encode(), "requests[0].methd"),
            (json.dumps({"requests": [{"path": "/p/1", "headers": {"Host": "x"}}]}).encode(), "requests[0].headers.Host"),
            (json.dumps({"requests": [{"path": "/p/1", "headers": {"a": "b\r\nc: d"}}]}).encode(), "requests[0].headers.a"),
            # what h2o refuses of a request on the wire: a control character, a name not a token
            (json.dumps({"requests": [{"path": "/p/1", "headers": {"x-t": "a\u0001b"}}]}).encode(),
             "requests[0].headers.x-t"),
            (json.dumps({"requests": [{"path": "/p/1", "headers": {"x-t": "a\u007fb"}}]}).encode(),
             "requests[0].headers.x-t"),
            (json.dumps({"requests": [{"path": "/p/1", "headers": {"x(t)": "a"}}]}).encode(),
             "requests[0].headers.x(t)"),
            # a request body: at most max_request_json_values (10,000) values in its entries' bodies
            # (1 MiB of [{},{},…] made a tree of 76 MB before it was refused)
            (json.dumps({"requests": [{"method": "POST", "path": "/raw", "body": [{}] * 10500}]}).encode(),
             "more than 10320 values and member names"),
            (json.dumps({"requests": [{"method": "get", "path": "/p/1"}]}).encode(), "requests[0].method"),
            (json.dumps({"requests": [7]}).encode(), "requests[0]: must be an object"),
        ]
        for raw, detail in cases:
            status, headers, doc, _ = self.post(None, raw=raw)
            self.assertEqual(status, 400, (raw, doc))
            self.assertEqual(headers["content-type"], "application/problem+json")
            self.assertTrue(doc["type"].endswith("bad-batch"), doc)
            self.assertIn(detail, doc["detail"], raw)
        self.assertEqual(self.mock.hits()["product"].get("GET /products/{id}", 0), 0)

    def test_metrics_and_access_log_count_each_entry(self):
        log = os.path.join(self.workdir, "access.log")
        self.start_batch(access_log=log)
        status, _, doc, _ = self.post({"requests": [{"path": "/p/1"}, {"path": "/p/2"}, {"path": "/nowhere"}]})
        self.assertEqual(status, 200)
        got = access_log_lines(log, 4)
        self.assertIsNotNone(got)
        paths = sorted((l["method"], l["path"], l["status"]) for l in got)
        self.assertEqual(paths, [("GET", "/nowhere", 404), ("GET", "/p/1", 200), ("GET", "/p/2", 200),
                                 ("POST", "/batch", 200)])

    def test_a_client_that_leaves_cancels_its_entries(self):
        # over HTTP/1.1 h2o reads nothing of the client while the batch runs: the gateway watches
        # its socket, and a client that closed has every entry cancelled at once, not when the
        # batch's deadline (20 s) or the calls' timeout (5 s) comes
        log = os.path.join(self.workdir, "access.log")
        self.start_batch(batch={"route": "POST /batch", "max_requests": 5, "deadline_ms": 20000}, access_log=log)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("POST", "/batch", body=json.dumps({"requests": [{"path": "/slow/%d" % i} for i in range(3)]}).encode(),
                  headers={"content-type": "application/json"})
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] == 3, 5), self.mock.stats())
        t0 = time.monotonic()
        c.close()
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] == 0, 4), self.mock.stats())
        self.assertLess(time.monotonic() - t0, 4.5)  # the calls' 5 s timeout did not end them
        got = access_log_lines(log, 4)
        self.assertIsNotNone(got)
        self.assertEqual(sorted((l["path"], l["status"]) for l in got),
                         [("/batch", 499), ("/slow/0", 499), ("/slow/1", 499), ("/slow/2", 499)])
        envelope = [l for l in got if l["path"] == "/batch"][0]
        self.assertGreater(envelope["duration_ms"], 0)  # how long it ran until its client left
        # the gateway goes on serving, and answers a new batch
        status, _, doc, _ = self.post({"requests": [{"path": "/p/3"}]})
        self.assertEqual(doc["responses"][0]["status"], 200)
        self.assertLogClean()

    def test_a_batch_answered_is_logged_with_its_duration(self):
        log = os.path.join(self.workdir, "access.log")
        self.start_batch(access_log=log)
        status, _, doc, ms = self.post({"requests": [{"path": "/p/1"}]})  # Product answers in 20 ms
        self.assertEqual(status, 200)
        got = access_log_lines(log, 2)
        envelope = [l for l in got if l["path"] == "/batch"][0]
        self.assertEqual(envelope["status"], 200)
        self.assertGreaterEqual(envelope["duration_ms"], 20)
        self.assertLessEqual(envelope["duration_ms"], ms + 1)

    def test_the_envelope_is_counted_and_logged_under_its_own_route(self):
        # the envelope is no script's route, but it is a route of the gateway's: "POST /batch" in
        # the metrics and the access log (a nested batch included), not "unmatched" and null
        log = os.path.join(self.workdir, "access.log")
        admin = free_port()
        self.start_batch(access_log=log, admin={"port": admin})
        status, _, doc, _ = self.post({"requests": [{"path": "/p/1"}, {"method": "POST", "path": "/batch"}]})
        self.assertEqual(status, 200)
        self.assertEqual([r["status"] for r in doc["responses"]], [200, 400])
        got = access_log_lines(log, 3)
        self.assertIsNotNone(got)
        self.assertEqual(sorted((l["path"], l["route"], l["status"]) for l in got),
                         [("/batch", "POST /batch", 200), ("/batch", "POST /batch", 400), ("/p/1", "GET /p/{id}", 200)])
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5) as r:
            text = r.read().decode()
        m = Metrics(text)
        self.assertEqual(m.get("aggway_requests_total", route="POST /batch", code="200"), 1, text)
        self.assertEqual(m.get("aggway_requests_total", route="POST /batch", code="400"), 1, text)
        self.assertEqual(m.get("aggway_requests_total", route="GET /p/{id}", code="200"), 1, text)
        self.assertIsNone(m.get("aggway_requests_total", route="unmatched", code="200"), text)
        # and /routes lists it beside the scripts' routes
        with urllib.request.urlopen("http://127.0.0.1:%d/routes" % admin, timeout=5) as r:
            routes = json.loads(r.read())
        self.assertIn({"route": "POST /batch", "method": "POST", "script": None, "batch": True, "generation": 1}, routes)
        self.assertIn("GET /p/{id}", [e["route"] for e in routes])

    def test_h2_batches_reset_count_as_cancelled_streams(self):
        # each batch's stream reset before its answer counts as one cancelled stream per entry
        # still running: past max_cancelled_streams the connection gets GOAWAY (a batch would
        # otherwise start max_requests pages per reset, without limit)
        self.start_batch(batch={"route": "POST /batch", "max_requests": 5, "deadline_ms": 20000},
                         clients={"max_cancelled_streams": 20, "cancel_window_s": 60})
        c = H2Client(self.port, timeout=10).start_plain()
        block = (_literal(":method", "POST") + _literal(":scheme", "http") + _literal(":path", "/batch") +
                 _literal(":authority", "localhost") + _literal("content-type", "application/json"))
        goaway, before, buf = [], self.mock.stats()["product"]["requests"], b""

        def requests():
            return self.mock.stats()["product"]["requests"] - before
        for i in range(30):
            sid = 1 + 2 * i
            body = json.dumps({"requests": [{"path": "/slow/%d" % (5 * i + k)} for k in range(5)]}).encode()
            try:
                c.raw.sendall(c._frame(1, 0x4, sid, block) + c._frame(0, 0x1, sid, body))
                # reset once its entries run (their calls made): a stream reset before its request
                # was handled is h2o's alone
                if not wait_until(lambda: requests() >= 5 * (i + 1), 5):
                    break
                c.raw.sendall(c._frame(3, 0, sid, struct.pack(">I", 8)))
            except OSError:
                break
            # the frames the gateway sent meanwhile: a GOAWAY?
            end_at = time.monotonic() + 0.2
            while time.monotonic() < end_at and not goaway:
                c.raw.settimeout(0.05)
                try:
                    data = c.raw.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    data = b""
                if not data:
                    break
                buf += data
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    n, ftype = int.from_bytes(buf[:3], "big"), buf[3]
                    if ftype == 7:
                        goaway.append(i)
                    buf = buf[9 + n:]
            if goaway:
                break
        c.close()
        self.assertTrue(goaway, "no GOAWAY after 30 reset batches of 5 running entries")
        self.assertLessEqual(goaway[0], 8, goaway)  # 20 cancelled entries are 4 batches (and one more in flight)
        self.assertLessEqual(requests(), 5 * 9)
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] == 0, 5), self.mock.stats())
        r = self.get("/p/1")  # and the gateway serves on
        self.assertEqual(r.status, 200, r)


if __name__ == "__main__":
    main()
