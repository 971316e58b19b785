"""Hot reload (issue 4, "Reload"; DESIGN §3 "Hot reload"): SIGHUP loads gateway.lua and every
script as one new generation, checked in fresh VMs before anything changes.

- Requests in flight finish on the generation they started on, new requests get the new one; none
  is dropped, none is answered by a mix of the two.
- A folder that does not load (a syntax error, an error at load, an unknown upstream, a typo in
  gateway.lua, a route conflict, a missing folder, a setting only a restart can change) leaves the
  running generation serving; the reason is logged with file:line, counted in
  aggway_reload_failures_total and shown on the admin /reload page.
- A reload storm (SIGHUP 20 times a second for 10 s under load) loses no request and leaks
  nothing: every old generation is freed once its requests are done, and RSS stays bounded.
- Keep-alive pools of upstreams that did not change survive a reload.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (SLOW, GatewayTestCase, demo_services, endpoint, free_port, read_all, route,  # noqa: E402
                     wait_until, main)
from test_admin_metrics import Metrics  # noqa: E402

# ASan keeps freed memory in a quarantine (256 MB by default) before reusing it: the RSS claim of
# the storm needs a small one (as the soak does). After the harness import, which turns exit-time
# leak reports off.
if "quarantine_size_mb" not in os.environ.get("ASAN_OPTIONS", ""):
    os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=16").lstrip(":")

WAIT = 30.0 if SLOW else 15.0          # bound on anything the gateway does on its own (a reload, a drain)
# timeouts far from anything a loaded 2-core machine can reach: these tests are about reloading
RELAXED = {"timeout_ms": 4000, "connect_timeout_ms": 2000}


def shape_script(version):
    """GET /shape/{id}: the product section plus a computed `version` section saying which
    generation answered."""
    return endpoint("GET /shape/{id}", """
    local res = agg.fetch_all {
      product = { "product", "/products/" .. req.params.id, required = true, timeout_ms = 4000 },
    }
    res.version = %s
    return agg.page(res)""" % json.dumps(version), deadline_ms=5000)


def product_services(latency_ms):
    return demo_services(product_ms=[route("/products/{id}", latency_ms=latency_ms,
                                           json={"id": "{id}", "name": "Sneaker"})])


class Client:
    """Plain HTTP/1.1 requests from threads (cheaper than a curl process each)."""

    def __init__(self, port):
        self.port = port

    def get(self, path, timeout=15):
        """(status, decoded JSON body or None, error text or None)."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            c.close()
            try:
                return r.status, json.loads(body), None
            except ValueError:
                return r.status, None, "not JSON: %r" % body[:200]
        except (OSError, http.client.HTTPException) as e:
            return 0, None, repr(e)


def version_of(status, body):
    if status != 200 or not isinstance(body, dict):
        return None
    v = body.get("version") or {}
    if v.get("status") != "ok" or (body.get("product") or {}).get("status") != "ok":
        return None
    return v.get("data")


class Load:
    """Threads sending GET /shape/N back to back until stopped; every answer is kept."""

    def __init__(self, client, threads=2):
        self.client = client
        self.results = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, i):
        n = 0
        while not self.stopping.is_set():
            n += 1
            status, body, err = self.client.get("/shape/%d" % (i * 100000 + n))
            with self.lock:
                self.results.append((status, version_of(status, body), err))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def summary(self):
        with self.lock:
            res = list(self.results)
        bad = [r for r in res if r[0] != 200 or r[1] is None]
        return res, bad


class ReloadCase(GatewayTestCase):

    def start_gateway(self, latency_ms=20, workers=2, scripts=None, upstream_options=None, services=None, tls=False,
                      extra=None):
        self.admin_port = free_port()
        self.start(services=services or product_services(latency_ms),
                   scripts=scripts or {"shape.lua": shape_script("v1")},
                   upstream_options=upstream_options or {"product": RELAXED},
                   gateway_extra=dict({"admin": {"port": self.admin_port, "host": "127.0.0.1"}}, **(extra or {})),
                   workers=workers, tls=tls)
        self.client = Client(self.port)
        self.assertTrue(wait_until(lambda: self.admin_get("/readyz")[0] == 200, WAIT), self.gw.log())

    # admin -----------------------------------------------------------------------------------
    def admin_get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin_port, path), timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return None, None

    def admin_json(self, path):
        status, body = self.admin_get(path)
        return json.loads(body) if status == 200 else None

    def metrics(self):
        return Metrics(self.admin_get("/metrics")[1])

    def reload_record(self):
        return self.admin_json("/reload")

    # the scripts folder ----------------------------------------------------------------------
    def write(self, rel, text):
        """Replaces a file of the scripts folder at once (a reload never sees half of it)."""
        path = os.path.join(self.scripts_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp~"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def read(self, rel):
        with open(os.path.join(self.scripts_dir, rel)) as f:
            return f.read()

    def remove(self, rel):
        os.remove(os.path.join(self.scripts_dir, rel))

    def sighup(self):
        self.gw.proc.send_signal(signal.SIGHUP)

    def reload_ok(self, generation):
        """SIGHUP, then wait until the admin says generation serves (every worker switched)."""
        self.sighup()
        ok = wait_until(lambda: (self.reload_record() or {}).get("generation") == generation, WAIT)
        self.assertTrue(ok, "generation %d did not start serving: %s\n%s" % (generation, self.reload_record(),
                                                                           self.gw.log()[-3000:]))

    def reload_fails(self, failures):
        """SIGHUP, then wait until the admin counts `failures` failed reloads; returns the record."""
        self.sighup()
        ok = wait_until(lambda: (self.reload_record() or {}).get("failures") == failures, WAIT)
        rec = self.reload_record()
        self.assertTrue(ok, "the reload did not fail: %s\n%s" % (rec, self.gw.log()[-3000:]))
        return rec

    def rss_kb(self):
        with open("/proc/%d/status" % self.gw.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def assertShape(self, version, n=1):
        for i in range(n):
            status, body, err = self.client.get("/shape/%d" % (9000 + i))
            self.assertEqual((status, version_of(status, body)), (200, version), (body, err))


class InFlight(ReloadCase):

    def test_requests_in_flight_finish_on_the_old_generation_and_new_ones_get_the_new_shape(self):
        self.start_gateway(latency_ms=2000)
        self.assertShape("v1")
        results = [None] * 50

        def one(i):
            status, body, err = self.client.get("/shape/%d" % i, timeout=30)
            results[i] = (status, version_of(status, body), err)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        started = time.monotonic()
        for t in threads:
            t.start()
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= 50, WAIT),
                        "the 50 requests did not reach the upstream")
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        # the old generation lives on while its requests are in flight (read before in_flight: if
        # some are still in flight after, they were before)
        live = self.reload_record()["generations_live"]
        if self.mock.stats()["product"]["in_flight"] > 0:
            self.assertGreaterEqual(live, 2)
        fresh = [None] * 4

        def new_one(i):
            status, body, err = self.client.get("/shape/%d" % (100 + i), timeout=30)
            fresh[i] = (status, version_of(status, body), err)
        later = [threading.Thread(target=new_one, args=(i,)) for i in range(4)]
        for t in later:
            t.start()
        for t in threads + later:
            t.join(60)
        self.assertEqual(results, [(200, "v1", None)] * 50)
        self.assertEqual(fresh, [(200, "v2", None)] * 4)
        # the old generation's VMs are freed once its last request is done
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT),
                        self.reload_record())
        m = self.metrics()
        self.assertEqual(m.get("aggway_generation"), 2)
        self.assertEqual(m.get("aggway_reloads_total"), 1)
        self.assertEqual(m.get("aggway_reload_failures_total"), 0)
        self.assertEqual(m.get("aggway_reload_last_success"), 1)
        # the route's counters go on across the generations: 1 + 50 + 4 pages
        self.assertEqual(m.get("aggway_requests_total", route="GET /shape/{id}", code="200"), 55)
        self.assertLogClean()

    def test_routes_list_each_route_with_its_script_and_generation(self):
        self.start_gateway()
        routes = self.admin_json("/routes")
        self.assertEqual([(r["route"], r["generation"]) for r in routes], [("GET /shape/{id}", 1)])
        self.write("extra/ping.lua", endpoint("GET /ping", "    return { status = 200, json = { pong = true } }"))
        self.reload_ok(2)
        routes = {r["route"]: r for r in self.admin_json("/routes")}
        self.assertEqual(set(routes), {"GET /shape/{id}", "GET /ping"})
        self.assertEqual(routes["GET /ping"]["generation"], 2)
        self.assertTrue(routes["GET /ping"]["script"].endswith("extra/ping.lua"), routes)
        self.assertEqual(self.client.get("/ping")[:2], (200, {"pong": True}))
        # a route removed by a reload answers 404 from then on
        self.remove("extra/ping.lua")
        self.reload_ok(3)
        self.assertEqual(self.client.get("/ping")[0], 404)
        self.assertEqual([r["route"] for r in self.admin_json("/routes")], ["GET /shape/{id}"])
        self.assertLogClean()


class Names(ReloadCase):

    def test_the_waterfall_names_routes_and_upstreams_of_an_old_generation_after_a_reload(self):
        # generation 2 puts a route before the old one and an upstream before product: indexes
        # shift, names must not
        self.start_gateway(workers=1)
        self.assertShape("v1")
        self.write("a/first.lua", endpoint("GET /shape/featured", """
    return agg.page(agg.fetch_all { x = { "inventory", "/stock/1" } })"""))
        gw = self.read("gateway.lua").replace("upstreams = {", "upstreams = {\n    aaa = { url = \"http://127.0.0.1:9\" },", 1)
        self.write("gateway.lua", gw)
        self.reload_ok(2)
        self.assertEqual(self.client.get("/shape/featured")[0], 200)
        reqs = self.admin_json("/waterfall.json")["requests"]
        by_path = {r["request"].split(" ", 1)[1]: r for r in reqs}
        old, new = by_path["/shape/9000"], by_path["/shape/featured"]
        self.assertEqual(old["route"], "GET /shape/{id}")
        self.assertEqual([c["upstream"] for c in old["calls"]], ["product"])
        self.assertEqual(new["route"], "GET /shape/featured")
        self.assertEqual([c["upstream"] for c in new["calls"]], ["inventory"])


BROKEN_GATEWAY_TYPO = """
return {
  listen = { { port = %(port)d } },
  workers = 2,
  admin = { port = %(admin)d, host = "127.0.0.1" },
  upstreams = {
    product = { url = "%(url)s", timeout_ms = 4000, timeout_sm = 5 },
  },
}
"""


class Failures(ReloadCase):
    """Every way a reload can fail: the old generation keeps serving every request."""

    def broken_cases(self):
        port, admin, url = self.port, self.admin_port, self.mock.url("product")
        gw_ok = self.read("gateway.lua")
        return [
            ("a syntax error", {"shape.lua": shape_script("v2").replace("return agg.page(res)", "return agg.page(res")},
             r"shape\.lua:\d+: .*'\)' expected"),
            ("an error at load", {"shape.lua": 'error("the catalogue is not configured")\n' + shape_script("v2")},
             r"shape\.lua:1: the catalogue is not configured"),
            ("an endless loop at load (stopped after 5 s)", {"shape.lua": "while true do end\n" + shape_script("v2")},
             r"shape\.lua:1: loading the scripts took longer than 5 s"),
            ("a call to an unknown upstream",
             {"shape.lua": shape_script("v2").replace('{ "product", ', '{ "prodcut", ')},
             r"shape\.lua:\d+: call to unknown upstream 'prodcut'"),
            ("a typo in gateway.lua", {"gateway.lua": BROKEN_GATEWAY_TYPO % dict(port=port, admin=admin, url=url)},
             r"gateway\.lua:7: .*timeout_sm"),
            ("a route conflict", {"other.lua": endpoint("GET /shape/{sku}", "    return { status = 200 }")},
             r"(shape|other)\.lua:\d+: route 'GET /shape/\{\w+\}' conflicts with"),
            ("a listener change (needs a restart)", {"gateway.lua": gw_ok.replace("port = %d" % port,
                                                                                  "port = %d" % free_port(), 1)},
             r"gateway\.lua:\d+: listen: .*needs a restart"),
            ("a workers change (needs a restart)", {"gateway.lua": gw_ok.replace("workers = 2", "workers = 3")},
             r"gateway\.lua:\d+: workers: .*needs a restart"),
        ]

    def test_a_folder_that_does_not_load_leaves_the_running_generation_serving(self):
        self.start_gateway()
        originals = {"shape.lua": self.read("shape.lua"), "gateway.lua": self.read("gateway.lua")}
        failures = 0
        with Load(self.client) as load:
            for what, files, pattern in self.broken_cases():
                with self.subTest(what):
                    for rel, text in files.items():
                        self.write(rel, text)
                    failures += 1
                    rec = self.reload_fails(failures)
                    self.assertEqual(rec["generation"], 1)
                    self.assertFalse(rec["last_reload"]["ok"])
                    errors = "\n".join(rec["last_reload"]["errors"])
                    self.assertRegex(errors, pattern)
                    self.assertRegex(self.gw.log(), r"error reload failed, generation 1 keeps serving: .*" + pattern)
                    self.assertShape("v1")
                    for rel in files:
                        if rel in originals:
                            self.write(rel, originals[rel])
                        else:
                            self.remove(rel)
            # the folder itself gone (a deploy that moved it away)
            moved = self.scripts_dir + ".away"
            os.rename(self.scripts_dir, moved)
            try:
                failures += 1
                rec = self.reload_fails(failures)
                self.assertRegex("\n".join(rec["last_reload"]["errors"]), r"gateway\.lua:1: cannot read")
                self.assertShape("v1")
            finally:
                os.rename(moved, self.scripts_dir)
            time.sleep(0.2)
        results, bad = load.summary()
        self.assertGreater(len(results), 20)
        self.assertEqual(bad, [], "requests failed while reloads failed")
        self.assertEqual({v for _, v, _ in results}, {"v1"})
        m = self.metrics()
        self.assertEqual(m.get("aggway_reload_failures_total"), failures)
        self.assertEqual(m.get("aggway_reload_last_success"), 0)
        self.assertEqual(m.get("aggway_reloads_total"), 0)
        self.assertEqual(m.get("aggway_generation"), 1)
        self.assertEqual(m.get("aggway_generations_live"), 1, "a failed load must free what it loaded")
        # fixed: the next reload goes through
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        self.assertShape("v2", n=3)
        rec = self.reload_record()
        self.assertTrue(rec["last_reload"]["ok"])
        self.assertEqual(rec["last_reload"]["errors"], [])

    def test_sighup_while_draining_is_logged_and_the_requests_in_flight_finish(self):
        self.start_gateway(latency_ms=1500)
        box = {}
        t = threading.Thread(target=lambda: box.update(r=self.client.get("/shape/1", timeout=30)))
        t.start()
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= 1, WAIT))
        self.write("shape.lua", shape_script("v2"))
        self.gw.proc.send_signal(signal.SIGTERM)
        # the drain has begun (its first line) before the SIGHUP: a SIGHUP that came earlier would
        # rightly be a reload, which is not what this test is about
        self.assertTrue(wait_until(lambda: "stopping: no new connections" in self.gw.log(), WAIT), self.gw.log())
        self.sighup()
        t.join(30)
        status, body, err = box["r"]
        self.assertEqual((status, version_of(status, body)), (200, "v1"), err)
        self.assertEqual(self.gw.proc.wait(timeout=WAIT), 0)
        self.assertIn("SIGHUP while stopping: not reloaded", self.gw.log())


HANGING = endpoint("GET /shape/{id}", """
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. req.params.id, required = true, timeout_ms = 60000 },
    })""", deadline_ms=60000)


class Bounded(ReloadCase):

    def start_hanging(self, workers=2):
        self.start_gateway(services=demo_services(product_ms=[route("/products/{id}", fault="hang")]),
                           scripts={"shape.lua": HANGING}, workers=workers,
                           upstream_options={"product": {"timeout_ms": 60000, "connect_timeout_ms": 2000}})

    def hang_one(self, n):
        """A request that waits on the hanging upstream; returns its socket (close it to leave)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /shape/%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
        self.addCleanup(s.close)
        return s

    def test_a_client_that_leaves_after_a_reload_cancels_its_calls_on_the_old_generation(self):
        self.start_hanging()
        s = self.hang_one(1)
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= 1, WAIT))
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        self.assertEqual(self.reload_record()["generations_live"], 2)
        s.close()
        # the old generation cancels the call (the upstream sees the connection close) and is freed,
        # long before the call's 60 s
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["connections_open"] == 0, WAIT),
                        self.mock.stats())
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT), self.reload_record())
        m = self.metrics()
        self.assertEqual(m.get("aggway_requests_total", route="GET /shape/{id}", code="499"), 1)
        self.assertEqual(m.get("aggway_upstream_calls_total", upstream="product", outcome="cancelled"), 1)
        self.assertLogClean()

    def test_a_client_that_half_closes_reads_no_made_up_status_line(self):
        # shutdown(SHUT_WR) after the request: its EOF cannot be told from a close, so the page is
        # abandoned as for a client gone (499 in the metrics), but the client, still reading, gets
        # the connection's end with nothing before it, never "HTTP/1.1 499"
        self.start_hanging()
        s = self.hang_one(1)
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= 1, WAIT))
        s.shutdown(socket.SHUT_WR)
        self.assertEqual(read_all(s, WAIT), b"")
        self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["connections_open"] == 0, WAIT),
                        self.mock.stats())
        m = self.metrics()
        self.assertEqual(m.get("aggway_requests_total", route="GET /shape/{id}", code="499"), 1)
        self.assertLogClean()

    def test_a_reload_waits_while_16_generations_are_still_finishing_requests(self):
        self.start_hanging(workers=1)
        socks = []
        for gen in range(2, 17):     # one request left hanging on each of generations 1 to 15
            socks.append(self.hang_one(gen))
            self.assertTrue(wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= len(socks), WAIT))
            self.reload_ok(gen)
        self.assertEqual(self.reload_record()["generations_live"], 16)
        self.sighup()
        self.assertTrue(wait_until(lambda: "the reload waits until one is done" in self.gw.log(), WAIT),
                        self.gw.log()[-2000:])
        time.sleep(0.3)
        self.assertEqual(self.reload_record()["generation"], 16, "the 17th generation must wait")
        # one old generation finishes (its client leaves): the waiting reload goes through
        socks.pop(0).close()
        self.assertTrue(wait_until(lambda: self.reload_record()["generation"] == 17, WAIT), self.reload_record())
        for s in socks:
            s.close()
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT), self.reload_record())
        self.assertEqual(self.reload_record()["failures"], 0)


class Storm(ReloadCase):

    def test_a_reload_storm_under_load_loses_no_request_and_frees_every_old_generation(self):
        self.start_gateway(latency_ms=20)
        # warm up: the allocator's arenas and the VMs' first collections, and a few reloads
        with Load(self.client, threads=4):
            for i in range(5):
                self.write("shape.lua", shape_script("v%d" % (i % 2 + 1)))
                self.sighup()
                time.sleep(0.3)
            time.sleep(1.0)
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT))
        time.sleep(0.5)
        rss_before = self.rss_kb()
        rec0 = self.reload_record()
        sent = 0
        with Load(self.client, threads=4) as load:
            # how long one reload takes here, under this load (a busy machine: over 1 s)
            t = time.monotonic()
            self.reload_ok(rec0["generation"] + 1)
            one_reload_s = time.monotonic() - t
            rec0 = self.reload_record()
            end = time.monotonic() + 10.0
            while time.monotonic() < end:
                sent += 1
                self.write("shape.lua", shape_script("v%d" % (sent % 2 + 1)))
                self.sighup()
                time.sleep(0.05)
        results, bad = load.summary()
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT),
                        "old generations were not freed: %s" % self.reload_record())
        time.sleep(0.5)
        rss_after = self.rss_kb()
        rec = self.reload_record()
        reloads = rec["reloads"] - rec0["reloads"]
        sys.stderr.write("\nstorm: %d SIGHUPs, %d reloads, %d requests; RSS %d kB before, %d kB after (%+d kB)\n"
                         % (sent, reloads, len(results), rss_before, rss_after, rss_after - rss_before))
        self.assertEqual(bad[:5], [], "%d of %d requests failed during the storm" % (len(bad), len(results)))
        self.assertGreater(len(results), 100)
        self.assertEqual({v for _, v, _ in results} - {"v1", "v2"}, set())
        self.assertEqual(rec["failures"], 0, rec)
        # signals that arrive while a reload runs merge into one: no more reloads than SIGHUPs, but
        # reloads run back to back (SIGHUPs come every 50 ms): more than 20 on a quiet machine. A
        # storm that starved them (each signal restarting the reload that runs) would make one, at
        # its end. How many fit in 10 s is not bounded from the one reload timed above: under the
        # sanitizers beside two busy loops, one took 0.06 s there and the storm's took 1.1 s on
        # average (9 in 10 s), with its old generations still finishing
        self.assertGreaterEqual(reloads, 3, "one reload took %.2f s before the storm" % one_reload_s)
        self.assertLessEqual(reloads, sent)
        # and the last SIGHUP is never lost in a merge: the folder's last version comes to serve
        last = "v%d" % (sent % 2 + 1)
        self.assertTrue(wait_until(lambda: version_of(*self.client.get("/shape/9000")[:2]) == last, WAIT),
                        "the last version written (%s) does not serve: %s" % (last, self.reload_record()))
        # bounded: what a few generations' VMs and the allocator's slack take, not one per reload
        self.assertLess(rss_after - rss_before, (96 if SLOW else 48) * 1024)
        self.assertLogClean()


class Pools(ReloadCase):

    def test_keep_alive_connections_survive_a_reload_when_the_upstream_did_not_change(self):
        self.start_gateway(latency_ms=0, workers=1)
        self.assertShape("v1", n=5)
        conns = self.mock.stats()["product"]["connections_total"]
        self.assertEqual(conns, 1, "one keep-alive connection serves sequential calls")
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        self.assertShape("v2", n=5)
        self.assertEqual(self.mock.stats()["product"]["connections_total"], 1, "the pool survived the reload")
        # an upstream whose pool settings change gets a new pool (and a new connection)
        self.write("gateway.lua", self.read("gateway.lua").replace("timeout_ms = 4000",
                                                                   "timeout_ms = 4000,\n    max_connections = 8", 1))
        self.reload_ok(3)
        self.assertShape("v2", n=5)
        self.assertEqual(self.mock.stats()["product"]["connections_total"], 2)
        self.assertLogClean()

    def test_a_reload_does_not_fail_when_the_access_log_s_folder_moved(self):
        # found by an attack review: the check of the access log's path ran on reloads too, which
        # keep the log open (it is a restart-only setting) and must not fail on it
        top = tempfile.mkdtemp(prefix="aggway-alog-")
        self.addCleanup(shutil.rmtree, top, True)
        logs = os.path.join(top, "alog")
        os.makedirs(logs)
        self.start_gateway(latency_ms=0, workers=1, extra={"access_log": os.path.join(logs, "access.log")})
        self.assertShape("v1")
        os.rename(logs, logs + ".old")
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        self.assertShape("v2")
        # the lines go on to the file opened at start, in its new place
        self.assertTrue(wait_until(lambda: os.path.getsize(os.path.join(logs + ".old", "access.log")) > 0, WAIT))

    def test_the_pool_gauges_of_an_upstream_a_reload_removed_read_0(self):
        # found by an attack review: they kept the last values of the pool it had, for good
        self.start_gateway(latency_ms=0, workers=1)
        self.assertShape("v1", n=3)

        def pool(name):
            return self.metrics().get("aggway_upstream_pool_connections", upstream=name)
        self.assertTrue(wait_until(lambda: pool("product") == 1, WAIT), self.metrics().text)
        src = self.read("gateway.lua")
        self.assertIn("product = {", src)
        self.write("gateway.lua", src.replace("product = {", "catalog = {", 1))
        self.write("shape.lua", shape_script("v2").replace('{ "product",', '{ "catalog",', 1))
        self.reload_ok(2)
        self.assertShape("v2", n=3)
        self.assertTrue(wait_until(lambda: pool("product") == 0 and pool("catalog") == 1, WAIT), self.metrics().text)
        self.assertLogClean()

    def test_an_open_breaker_stays_open_across_a_reload(self):
        self.start_gateway(workers=1, upstream_options={"product": {
            "timeout_ms": 4000, "connect_timeout_ms": 2000, "breaker": {"failures": 2, "open_s": 60}}})
        self.mock.refuse("product")
        for i in range(3):
            self.client.get("/shape/%d" % i)
        self.assertEqual(self.metrics().get("aggway_upstream_breaker_state", upstream="product"), 1)
        self.write("shape.lua", shape_script("v2"))
        self.reload_ok(2)
        m = self.metrics()
        self.assertEqual(m.get("aggway_upstream_breaker_state", upstream="product"), 1)
        self.assertEqual(m.get("aggway_upstream_breaker_transitions_total", upstream="product", to="open"), 1)
        status, body, _ = self.client.get("/shape/9")
        self.assertEqual(status, 503, body)


if __name__ == "__main__":
    main()
