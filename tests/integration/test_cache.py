"""Per-section caching with a real Redis (issue 16): the cache's promises as a client and the
upstream see them. Each test starts its own redis-server on a free loopback port (no persistence)
and stops it; the gateways and the mock are the harness's."""
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Gateway, GatewayTestCase, SLOW, curl, free_port, gateway_lua, route, run_aggway,  # noqa: E402
                     tcp_connects, wait_until, write_scripts)

PAGE = """
local agg = require "agg"
return {
  route = "GET /p/{id}",
  handler = function(req)
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. req.params.id },
      stock   = { "inventory", "/stock/" .. req.params.id },
    })
  end,
}
"""

SERVICES = {
    "product": [route("/products/{id}", latency_ms=5, json={"id": "{id}", "name": "Sneaker"})],
    "inventory": [route("/stock/{id}", latency_ms=2, json={"inStock": 12})],
}


def redis_value(key, entry):
    """The value tier 2 holds for key: the key's tag (the first 16 bytes of SHA-256 over
    "aggway-cache-key", its NUL and the key: gateway/worker/cache.c) and the entry."""
    return hashlib.sha256(b"aggway-cache-key\0" + key.encode()).digest()[:16] + entry.encode()


class Redis:
    def __init__(self, workdir):
        self.port = free_port()
        self.workdir = workdir
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.workdir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_until(lambda: tcp_connects(self.port), 10):
            raise AssertionError("redis-server did not start")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


def timing(resp, name):
    m = re.search(name + r';dur=[\d.]+;desc="(\w+)"', resp.headers.get("server-timing", ""))
    return m.group(1) if m else None


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed (tools/bootstrap installs it)")
class CacheWithRedis(GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.redis = Redis(self.workdir).start()
        self.addCleanup(self.redis.stop)

    def extra(self, **over):
        e = {"redis": {"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 20},
             "cache": {"memory_bytes": 4 * 1024 * 1024, "redis": True},
             "admin": {"port": free_port()}}
        e.update(over)
        return e

    def start_cached(self, workers=1, **extra):
        ex = self.extra(**extra)
        self.admin_port = ex["admin"]["port"]
        return self.start(services=SERVICES, scripts={"p.lua": PAGE}, workers=workers, deadline_ms=5000,
                          upstream_options=self.options({"ttl_s": 60, "swr_s": 30, "stale_if_error_s": 300}),
                          gateway_extra=ex)

    def fake_redis(self, answer):
        """A server on a free loopback port that hands each connection to answer(conn) on a thread of
        its own (a Redis that lies); returns the port. Stopped at the test's end."""
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)
        self.addCleanup(lsock.close)

        def serve():
            while True:
                try:
                    c, _ = lsock.accept()
                except OSError:
                    return
                threading.Thread(target=answer, args=(c,), daemon=True).start()
        threading.Thread(target=serve, daemon=True).start()
        return lsock.getsockname()[1]

    @staticmethod
    def options(cache):
        # call timeouts far above the calls' latencies: these tests are about the cache, and must
        # not fail on a machine slow enough for the harness's 100-150 ms defaults
        return {"product": {"timeout_ms": 2000, "cache": cache}, "inventory": {"timeout_ms": 2000}}

    def metric(self, name):
        r = curl("http://127.0.0.1:%d/metrics" % self.admin_port)
        m = re.search(r"^" + re.escape(name) + r" (\d+)", r.body.decode(), re.M)
        return int(m.group(1)) if m else None

    def product_hits(self):
        return self.mock.hits()["product"].get("GET /products/{id}", 0)

    def test_pages_within_the_ttl_make_one_upstream_call(self):
        self.start_cached()
        first = self.get("/p/1")
        self.assertEqual(first.status, 200)
        self.assertEqual(timing(first, "product"), "miss")
        for _ in range(20):
            r = self.get("/p/1")
            self.assertEqual(r.status, 200)
            self.assertEqual(r.json()["product"]["data"]["name"], "Sneaker")
            self.assertEqual(timing(r, "product"), "hit")
        self.assertEqual(self.product_hits(), 1)
        self.assertTrue(wait_until(lambda: self.metric('aggway_cache_lookups_total{outcome="hit"}') == 20, 20))

    def test_the_access_log_says_each_sections_cache_outcome(self):
        log = os.path.join(self.workdir, "access.log")
        self.start_cached(access_log=log)
        self.get("/p/1")
        self.get("/p/1")

        def lines():
            if not os.path.exists(log):
                return []
            with open(log) as f:
                return [e for e in (json.loads(line) for line in f if line.strip()) if e["path"] == "/p/1"]

        self.assertTrue(wait_until(lambda: len(lines()) == 2, 20))
        got = [{s["name"]: s.get("cache") for s in entry["sections"]} for entry in lines()]
        self.assertEqual(got, [{"product": "miss", "stock": None}, {"product": "hit", "stock": None}])

    def test_the_waterfall_shows_a_cached_section_as_such(self):
        self.start_cached()
        self.get("/p/1")
        hit = self.get("/p/1")
        self.assertEqual(timing(hit, "product"), "hit")

        def cached_calls():
            r = curl("http://127.0.0.1:%d/waterfall.json" % self.admin_port)
            reqs = r.json()["requests"]
            return [sorted((c["section"], c["cache"] or "-") for c in q["calls"])
                    for q in reqs if q.get("request", "").endswith("/p/1")]

        self.assertTrue(wait_until(lambda: len(cached_calls()) == 2, 20), cached_calls())
        self.assertEqual(sorted(cached_calls()), [[("product", "-"), ("stock", "-")], [("product", "hit"), ("stock", "-")]])
        html = curl("http://127.0.0.1:%d/waterfall" % self.admin_port).body.decode()
        self.assertIn("cache hit", html)

    def test_a_second_gateway_gets_a_warm_hit_from_redis(self):
        # a GET that times out is a miss: the timeout is far above a busy machine's delays here
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 1000})
        self.get("/p/9")
        self.assertEqual(self.product_hits(), 1)
        # a second process on the same scripts and the same Redis
        sdir = os.path.join(self.workdir, "second")
        port2 = free_port()
        with open(os.path.join(self.scripts_dir, "gateway.lua")) as f:
            src = f.read()
        src = src.replace("port = %d" % self.port, "port = %d" % port2)
        admin2 = free_port()
        src = re.sub(r"admin = \{[^}]*\}", "admin = { port = %d }" % admin2, src)
        write_scripts(sdir, {"p.lua": PAGE}, src)
        gw2 = Gateway(sdir, port2)
        self.addCleanup(gw2.stop)
        self.assertTrue(gw2.start(), gw2.log())
        first_admin, self.admin_port = self.admin_port, admin2
        self.assertTrue(wait_until(lambda: self.metric("aggway_redis_connected") == 1, 10), gw2.log())
        self.admin_port = first_admin
        r = curl("http://127.0.0.1:%d/p/9" % port2)
        self.assertEqual(r.json()["product"]["data"]["name"], "Sneaker")
        self.assertEqual(timing(r, "product"), "hit")
        self.assertEqual(self.product_hits(), 1)  # the second gateway's first page made no call

    def test_redis_killed_under_load_fails_no_page_and_the_client_reconnects(self):
        # a command timeout far above a busy machine's delays: the only outage is the kill
        self.start_cached(workers=2, redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 1000})
        self.assertTrue(wait_until(lambda: self.metric("aggway_redis_connected") == 2, 10))
        done = threading.Event()
        statuses = []

        def load(i):
            n = 0
            while not done.is_set():
                statuses.append(self.get("/p/%d" % (i * 1000 + n % 50)).status)
                n += 1

        # 4 clients in a loop; Redis is killed once 20 pages were served, and the load goes on for
        # 40 pages more (counted, not timed: the machine may be slow)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(load, i) for i in range(4)]
            try:
                self.assertTrue(wait_until(lambda: len(statuses) >= 20, 60))
                self.redis.stop()
                killed_at = len(statuses)
                self.assertTrue(wait_until(lambda: len(statuses) >= killed_at + 40, 120))
            finally:
                done.set()
                for f in futs:
                    f.result()
        self.assertEqual([s for s in statuses if s != 200], [])
        self.assertEqual(self.metric("aggway_redis_connected"), 0)
        # the outage lasted past several reconnection attempts (backoff from 50 ms): still one start
        # line per worker, and nothing per attempt
        failed_attempts = self.metric("aggway_redis_errors_total")
        time.sleep(1.0)
        self.redis.start()  # the same port
        self.assertTrue(wait_until(lambda: self.metric("aggway_redis_connected") == 2, 15))
        log = self.gw.log()
        # one per worker, each naming its worker
        self.assertEqual(sorted(re.findall(r"redis \S+ \(worker (\d+)\): connection lost", log)), ["0", "1"], log)
        self.assertNotIn("cannot connect", log)  # the failed reconnections are not logged one by one
        ends = re.findall(r"redis \S+ \(worker \d+\): connected again after ([\d.]+) s down; (\d+) of its commands "
                          r"failed meanwhile", log)
        self.assertEqual(len(ends), 2, log)
        for secs, failed in ends:
            self.assertGreaterEqual(float(secs), 1.0)  # from the kill to the restart, at least the sleep
        # the cache's lookups and stores during the outage failed at once and were counted
        self.assertEqual(sum(int(f) for _, f in ends), failed_attempts)

    def test_a_hanging_redis_fails_no_page(self):
        self.start_cached()
        self.assertTrue(wait_until(lambda: self.metric("aggway_redis_connected") == 1, 10))
        self.redis.proc.send_signal(signal.SIGSTOP)
        try:
            for i in range(10):
                r = self.get("/p/%d" % (500 + i))
                self.assertEqual(r.status, 200)
                self.assertEqual(r.json()["product"]["status"], "ok")
        finally:
            self.redis.proc.send_signal(signal.SIGCONT)
        self.assertGreaterEqual(self.metric("aggway_redis_timeouts_total"), 1)

    def test_a_reload_keeps_tier1_for_upstreams_whose_cache_settings_did_not_change(self):
        self.start_cached(cache={"memory_bytes": 4 * 1024 * 1024, "redis": False})
        self.get("/p/1")
        path = os.path.join(self.scripts_dir, "gateway.lua")

        def reload(expect_gen):
            self.gw.proc.send_signal(signal.SIGHUP)
            self.assertTrue(wait_until(lambda: self.metric("aggway_generation") == expect_gen, 10), self.gw.log())

        reload(2)
        self.assertEqual(timing(self.get("/p/1"), "product"), "hit")
        with open(path) as f:
            src = f.read()
        with open(path, "w") as f:
            f.write(src.replace("ttl_s = 60", "ttl_s = 120"))
        reload(3)
        self.assertEqual(timing(self.get("/p/1"), "product"), "miss")
        self.assertEqual(self.product_hits(), 2)

    def test_an_entry_whose_body_is_not_json_is_never_served(self):
        # a value in Redis with the right format but a body that is not JSON (a bug elsewhere, or
        # someone writing to the cache's keys): it reaches tier 1, and each hit there refuses it
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 1000})
        self.get("/p/1")

        def redis(*args):
            return subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2"] + list(args),
                                  stdout=subprocess.PIPE, timeout=10, check=True).stdout.decode().strip()
        self.assertTrue(wait_until(lambda: redis("--scan", "--pattern", "agw:{product}*") != "", 10))
        key = redis("--scan", "--pattern", "agw:{product}*").splitlines()[0].replace("/products/1", "/products/77")
        far = int(time.time() * 1000) + 3600 * 1000
        body = "not json {"
        value = redis_value(key, "AGWC1 %d %d %d 200 0 %d\n%s" % (far, far, far, len(body), body))
        subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2", "-x", "SET", key], input=value,
                       stdout=subprocess.DEVNULL, timeout=10, check=True)  # (-x: the value from stdin)
        self.mock.refuse("product")  # the upstream cannot replace the junk
        for _ in range(3):
            r = self.get("/p/77")
            self.assertEqual(r.status, 200, r)
            page = r.json()  # the page is JSON: the junk never went into it
            self.assertEqual(page["product"]["status"], "unavailable", page)
        self.assertNotIn("not json", self.get("/p/77").body.decode())

    def test_redis_holds_no_entry_larger_than_its_timeout_moves(self):
        # (an attack review: 3.9 MB entries overran the 5 ms timeout, and each overrun dropped the
        # worker's Redis connection with the rate limits' commands on it.) At 50 KB a ms, a 10 ms
        # timeout takes entries up to 500 KB: larger ones stay in tier 1, and a larger value found in
        # Redis is read only that far, which no entry parses (a miss).
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 10})
        big = "x" * 600000
        self.mock.set_routes("product", [route("/products/big1", latency_ms=1, json={"name": "Big", "blob": big}),
                                         route("/products/{id}", latency_ms=1, json={"id": "{id}", "name": "Sneaker"})])

        def redis(*args):
            return subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2"] + list(args),
                                  stdout=subprocess.PIPE, timeout=10, check=True).stdout.decode().strip()
        self.assertEqual(self.get("/p/big1").json()["product"]["data"]["name"], "Big")
        self.assertEqual(self.get("/p/5").json()["product"]["data"]["name"], "Sneaker")
        # the small entry reaches Redis (the SET is sent after the page: wait for it) ...
        self.assertTrue(wait_until(lambda: "/products/5" in redis("--scan", "--pattern", "agw:{product}*"), 10))
        # ... the large one never does (its SET is never sent)
        self.assertNotIn("/products/big1", redis("--scan", "--pattern", "agw:{product}*"))
        # a valid entry of 1 MB put in Redis by someone else is not read whole: a miss, the upstream's
        key = redis("--scan", "--pattern", "agw:{product}*").splitlines()[0].replace("/products/5", "/products/6")
        far = int(time.time() * 1000) + 3600 * 1000
        body = json.dumps({"name": "Planted", "blob": "y" * 1000000})
        value = redis_value(key, "AGWC1 %d %d %d 200 0 %d\n%s" % (far, far, far, len(body), body))
        subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2", "-x", "SET", key], input=value,
                       stdout=subprocess.DEVNULL, timeout=10, check=True)  # (-x: the value from stdin)
        self.assertGreater(int(redis("STRLEN", key)), 1000000)
        r = self.get("/p/6")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["product"]["data"]["name"], "Sneaker")

    def test_a_value_redis_gives_for_another_key_is_never_served(self):
        # (an attack review: a Redis or a proxy that answered one command twice while others waited
        # gave each later lookup the value of the one before it, and a page served another key's
        # section, with per-user keys another user's.) A value starts with its own key's tag: the
        # entry of /products/1 found under the key of /products/2 is a miss, and goes upstream.
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 1000})
        self.assertEqual(str(self.get("/p/1").json()["product"]["data"]["id"]), "1")

        def redis(*args):
            return subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2"] + list(args),
                                  stdout=subprocess.PIPE, timeout=10, check=True).stdout.decode().strip()
        self.assertTrue(wait_until(lambda: redis("--scan", "--pattern", "agw:{product}*") != "", 10))
        one = redis("--scan", "--pattern", "agw:{product}*").splitlines()[0]
        two = one.replace("/products/1", "/products/2")
        self.assertNotEqual(one, two)
        self.assertEqual(redis("COPY", one, two), "1")  # (binary-safe, in Redis itself)
        before = self.product_hits()
        r = self.get("/p/2")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(str(r.json()["product"]["data"]["id"]), "2", r.body)
        self.assertEqual(timing(r, "product"), "miss")
        self.assertEqual(self.product_hits(), before + 1)

    def test_a_lookup_answered_with_another_commands_reply_drops_the_connection(self):
        # A lookup's reply is a string or nil; an integer is another command's (a Redis or a proxy
        # that sent one reply twice shifts every later one): a miss, and the connection is dropped and
        # made again (a second attack review: the replies stayed shifted for seconds).
        def answer(c):  # +OK to SELECT, :7 to any other command
            with c:
                while True:
                    data = c.recv(65536)
                    if not data:
                        return
                    c.sendall(b"+OK\r\n" if b"SELECT" in data else b":7\r\n")
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.fake_redis(answer), "timeout_ms": 1000})
        pages = iter(range(1, 1000))

        def a_page_then_the_drop():  # (each page a key of its own: a tier-1 hit would ask Redis nothing)
            r = self.get("/p/%d" % next(pages))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["product"]["status"], "ok", r.body)  # a miss: the upstream's
            return "Redis answered a cache lookup with another command's reply" in self.gw.log()
        self.assertTrue(wait_until(a_page_then_the_drop, 20), self.gw.log())

    def lying_redis(self, values):
        """A Redis that answers a lookup with values[suffix] (an entry, the bytes after the key's tag:
        tagged for the key asked, as a real Redis holding it would give it) for a key ending in
        suffix, and "" (no key) otherwise; +OK to anything else. values may change meanwhile.
        Returns its port."""
        def commands(c):
            buf = b""
            while True:
                data = c.recv(65536)
                if not data:
                    return
                buf += data
                while buf.startswith(b"*") and b"\r\n" in buf:
                    head, rest = buf.split(b"\r\n", 1)
                    args = []
                    for _ in range(int(head[1:])):
                        if b"\r\n" not in rest:
                            break
                        n, rest = rest.split(b"\r\n", 1)
                        if len(rest) < int(n[1:]) + 2:
                            break
                        args.append(rest[:int(n[1:])])
                        rest = rest[int(n[1:]) + 2:]
                    else:
                        buf = rest
                        yield args
                        continue
                    break

        def answer(c):
            with c:
                for args in commands(c):
                    if args[0].upper() != b"GETRANGE":
                        c.sendall(b"+OK\r\n")
                        continue
                    key = args[1].decode()
                    v = next((v for k, v in list(values.items()) if key.endswith(k)), None)
                    v = redis_value(key, v) if v is not None else b""
                    c.sendall(b"$%d\r\n%s\r\n" % (len(v), v))
        return self.fake_redis(answer)

    def test_an_entry_no_gateway_stores_is_never_served_from_redis(self):
        # (an attack review: a Redis that lied had entries of status 0, 302, 500 or 10^15 served as
        # failed sections without the upstream, each kept in tier 1 for its own times, up to 10^15 ms,
        # after Redis was set right; and a copy whose error_until was 10^14 served stale while the
        # upstream failed, under a policy without stale_if_error_s.) Given a Redis that answers
        # with entries the gateway never writes, each is a miss and the upstream is asked; given
        # one whose times pass the policy's, it is served, and kept no longer than the policy gives.
        now = int(time.time() * 1000)
        far = now + 3600 * 1000

        def entry(fresh, stale, err, status, body, headers=""):
            return "AGWC1 %d %d %d %d %d %d\n%s%s" % (fresh, stale, err, status, len(headers), len(body), headers, body)
        values = {"/products/s0": entry(far, far, far, 0, '{"x":1}'),
                  "/products/s302": entry(far, far, far, 302, '{"r":1}'),
                  "/products/s500": entry(far, far, far, 500, "SECRET internal error"),
                  "/products/huge": entry(far, far, far, 999999999999999, '{"r":1}'),
                  "/products/n404": entry(far, far, far, 404, "SECRET body"),
                  # (an older build's, or another writer's: the cookie is its first client's)
                  "/products/cookie": entry(far, far, far, 200, '{"id":"planted"}', "set-cookie\0sid=SECRET\0"),
                  "/products/year": entry(far * 10, far * 10, far * 10, 200, '{"id":"planted"}')}
        ex = self.extra(redis={"url": "redis://127.0.0.1:%d/2" % self.lying_redis(values), "timeout_ms": 1000})
        self.admin_port = ex["admin"]["port"]
        self.start(services={"product": [route("/products/old", status=503, json={"error": "down"}),
                                         route("/products/{id}", json={"id": "{id}"})],
                             "inventory": SERVICES["inventory"]},
                   scripts={"p.lua": PAGE}, upstream_options=self.options({"ttl_s": 1, "swr_s": 0}), deadline_ms=5000,
                   gateway_extra=ex)
        for id in ("s0", "s302", "s500", "huge", "n404", "cookie"):
            r = self.get("/p/" + id)
            self.assertEqual(r.json()["product"]["status"], "ok", (id, r.body))
            self.assertEqual(r.json()["product"]["data"]["id"], id)
            self.assertNotIn(b"SECRET", r.body)
        self.assertEqual(self.mock.hits()["product"].get("GET /products/{id}"), 6)
        self.assertEqual(self.gw.log().count("that no gateway stores"), 1, self.gw.log())
        self.assertNotIn("SECRET", self.gw.log())
        # fresh for ten hours as Redis says, for 1 s as the policy gives: served, then asked again
        # once Redis holds it no more (tier 1 kept it no longer either)
        r = self.get("/p/year")
        self.assertEqual((timing(r, "product"), r.json()["product"]["data"]["id"]), ("hit", "planted"))
        del values["/products/year"]
        time.sleep(1.2)
        r = self.get("/p/year")
        self.assertEqual((timing(r, "product"), r.json()["product"]["data"]["id"]), ("miss", "year"), r.body)
        self.assertIn("whose times pass what its cache policy gives", self.gw.log())
        # a copy past its freshness that says it may be served on error until 10^14: not for a failure
        values["/products/old"] = entry(1, 1, 10 ** 14, 200, '{"id":"ancient"}')
        r = self.get("/p/old")
        self.assertEqual(r.json()["product"]["status"], "unavailable", r.body)
        self.assertNotIn(b"ancient", r.body)

    def test_purge_by_prefix_empties_both_tiers(self):
        self.start_cached()
        self.get("/p/1")
        self.get("/p/2")
        self.assertEqual(self.product_hits(), 2)

        def held():
            out = subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2", "--scan", "--pattern",
                                  "agw:{product}*"], stdout=subprocess.PIPE, timeout=10, check=True)
            return out.stdout.splitlines()
        # tier 2 is written after the page answers (Redis timeout 20 ms here): beside two busy
        # loops a write may still be on its way, or given up at that timeout (the page never waits
        # for it; 1 of 2 was seen). The purge deletes what Redis holds, and leaves none.
        wait_until(lambda: len(held()) == 2, 5)
        before = held()
        self.assertGreater(len(before), 0, "no page was stored in Redis")
        r = curl("http://127.0.0.1:%d/cache/purge?prefix=agw:%%7Bproduct%%7D" % self.admin_port, "-X", "POST")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["redis_deleted"], len(before), before)
        self.assertEqual(held(), [])
        self.assertEqual(r.json()["workers"], 1)
        # tier 1 applies it on the worker's next tick (within about a second)
        self.assertTrue(wait_until(lambda: timing(self.get("/p/1"), "product") == "miss", 20))
        bad = curl("http://127.0.0.1:%d/cache/purge?prefix=user:1" % self.admin_port, "-X", "POST")
        self.assertEqual(bad.status, 400)
        # a rate limit's or a quota's count in the same Redis is no cache entry: "agw:" purges every
        # cache entry and leaves it, and a prefix that names it is refused
        subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2", "set", "agw:rl:{daily}:acme", "7"],
                       stdout=subprocess.PIPE, timeout=10, check=True)
        self.get("/p/3")
        wait_until(lambda: len(held()) == 1, 5)
        r = curl("http://127.0.0.1:%d/cache/purge?prefix=agw:" % self.admin_port, "-X", "POST")
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(held(), [])
        for p in ("agw:rl:", "agw:rl:%7Bdaily%7D"):
            self.assertEqual(curl("http://127.0.0.1:%d/cache/purge?prefix=%s" % (self.admin_port, p), "-X",
                                  "POST").status, 400, p)
        left = subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2", "get", "agw:rl:{daily}:acme"],
                              stdout=subprocess.PIPE, timeout=10, check=True).stdout.strip()
        self.assertEqual(left, b"7")
        self.assertEqual(curl("http://127.0.0.1:%d/cache/purge?prefix=agw:" % self.admin_port).status, 405)

    def test_an_upstreams_lifetimes_past_a_year_are_kept_for_a_year(self):
        # (an attack review: stale-if-error=1e400 sent SET ... PX 0, which Redis refuses, and 10^17
        # s a PX past LLONG_MAX; neither entry was kept in tier 1 either.) An answer's lifetimes
        # are cut to a year, the bound of a policy's own: Redis keeps the entry, tier 1 serves it.
        ex = self.extra(redis={"url": "redis://127.0.0.1:%d/2" % self.redis.port, "timeout_ms": 1000})
        self.admin_port = ex["admin"]["port"]
        said = {"1": "max-age=60, stale-if-error=1e400", "2": "max-age=60, stale-while-revalidate=100000000000000000",
                "3": "max-age=1e400", "4": "s-maxage=99999999999999999999999, stale-if-error=-1e400"}
        self.start(services={"product": [route("/products/%s" % i, json={"id": i}, headers={"cache-control": cc})
                                         for i, cc in said.items()],
                             "inventory": SERVICES["inventory"]},
                   scripts={"p.lua": PAGE}, upstream_options=self.options({}), deadline_ms=5000, gateway_extra=ex)
        year_ms = 31536000 * 1000

        def redis(*args):
            return subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "2"] + list(args),
                                  stdout=subprocess.PIPE, timeout=10, check=True).stdout.decode().strip()

        def key_of(i):
            keys = [k for k in redis("--scan", "--pattern", "agw:{product}*").splitlines() if k.endswith("/" + i)]
            return keys[0] if keys else None
        for i, cc in said.items():
            self.assertEqual(timing(self.get("/p/" + i), "product"), "miss", cc)
            self.assertTrue(wait_until(lambda: key_of(i) is not None, 10), "Redis did not keep the entry of " + cc)
            ttl = int(redis("PTTL", key_of(i)))
            self.assertTrue(0 < ttl <= year_ms + 60 * 1000, (cc, ttl))
            self.assertEqual(timing(self.get("/p/" + i), "product"), "hit", cc)
        for i in said:
            self.assertEqual(self.mock.hits()["product"].get("GET /products/" + i, 0), 1, i)

    def test_a_purge_drops_a_remembered_404_too(self):
        # (an attack review: the purge emptied both tiers, but the filter of keys known missing went
        # on answering the purged 404, desc="hit" and no upstream call, for negative_ttl_s.) Given an
        # upstream that answered 404 and now answers 200, a purge makes the next page ask it again.
        ex = self.extra()
        self.admin_port = ex["admin"]["port"]
        self.start(services={"product": [route("/products/{id}", status=404, json={"error": "no such product"})],
                             "inventory": SERVICES["inventory"]},
                   scripts={"p.lua": PAGE}, upstream_options=self.options({"ttl_s": 60, "negative_ttl_s": 600}),
                   deadline_ms=5000, gateway_extra=ex)
        self.assertEqual(self.get("/p/9").json()["product"]["error"]["status"], 404)
        self.assertEqual(timing(self.get("/p/9"), "product"), "hit")
        self.mock.set_routes("product", [route("/products/{id}", json={"id": "{id}", "name": "Sneaker"})])
        r = curl("http://127.0.0.1:%d/cache/purge?prefix=agw:" % self.admin_port, "-X", "POST")
        self.assertEqual(r.status, 200, r.body)
        # (tier 1 and the filter on the worker's next tick, within about a second; meanwhile a page
        # may still be a tier-1 hit)
        self.assertTrue(wait_until(lambda: timing(self.get("/p/9"), "product") == "miss", 20), self.gw.log())
        r = self.get("/p/9")
        self.assertEqual(r.json()["product"]["status"], "ok", r.body)
        self.assertEqual(r.json()["product"]["data"]["name"], "Sneaker")
        self.assertEqual(self.product_hits(), 2)

    def test_a_purge_whose_scan_does_not_end_leaves_the_admin_answering(self):
        # (an attack review: the purge's SCAN and UNLINK ran on the admin listener's thread, and a
        # Redis whose SCAN never ends, or a large keyspace, held /readyz and /healthz for 30 s, long
        # enough for an orchestrator's liveness probe to restart the process.) The Redis part runs on
        # a thread of its own: the probes are answered meanwhile, a second purge is told to wait
        # (409), and the gateway stops without waiting for the purge's 30 s.
        scans = []

        def answer(c):  # +OK to SELECT, a cursor that never comes back to 0 to SCAN, :0 to the rest
            with c:
                while True:
                    data = c.recv(65536)
                    if not data:
                        return
                    if b"SCAN" in data:
                        scans.append(1)
                        c.sendall(b"*2\r\n$1\r\n7\r\n*0\r\n")
                    else:
                        c.sendall(b"+OK\r\n" if b"SELECT" in data else b":0\r\n")
        self.start_cached(redis={"url": "redis://127.0.0.1:%d/2" % self.fake_redis(answer), "timeout_ms": 1000})
        admin = "http://127.0.0.1:%d" % self.admin_port
        done = {}
        t = threading.Thread(target=lambda: done.update(r=curl(admin + "/cache/purge?prefix=agw:%7Bproduct%7D", "-X",
                                                               "POST", timeout=120)), daemon=True)
        t.start()
        self.assertTrue(wait_until(lambda: len(scans) > 10, 20), "the purge did not start scanning")
        # the purge scans on: the listener answers (a probe's own short wait, however busy the machine:
        # before, it waited for the purge's 30 s)
        for path in ("/healthz", "/readyz", "/metrics"):
            r = curl(admin + path, "--max-time", "10", timeout=15)
            self.assertEqual(r.status, 200, (path, r))
        again = curl(admin + "/cache/purge?prefix=agw:", "-X", "POST", "--max-time", "10", timeout=15)
        self.assertEqual(again.status, 409, again)
        self.assertEqual(again.headers.get("retry-after"), "5")
        self.assertTrue(t.is_alive(), "the purge ended before its budget")
        # a stop while the purge runs: the purge is cancelled (its client's connection closes
        # unanswered) and the gateway exits cleanly (the cleanup checks its exit status)
        t0 = time.monotonic()
        self.gw.stop()
        self.assertLess(time.monotonic() - t0, 25)  # the purge's own budget is 30 s
        t.join(30)
        self.assertFalse(t.is_alive())

    def test_stale_if_error_serves_the_cached_copy_while_the_upstream_is_down(self):
        self.start(services=SERVICES, scripts={"p.lua": PAGE},
                   upstream_options=self.options({"ttl_s": 1, "stale_if_error_s": 300}), deadline_ms=5000,
                   gateway_extra=self.extra())
        self.get("/p/1")
        self.mock.refuse("product")
        time.sleep(1.2)  # past the TTL
        r = self.get("/p/1")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["product"]["status"], "stale")
        self.assertEqual(r.json()["product"]["data"]["name"], "Sneaker")
        self.assertIn("type", r.json()["product"]["error"])
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false")
        self.assertEqual(timing(r, "product"), "stale")

    def test_stale_while_revalidate_refreshes_once(self):
        self.start(services=SERVICES, scripts={"p.lua": PAGE},
                   upstream_options=self.options({"ttl_s": 1, "swr_s": 30, "stale_if_error_s": 300}), deadline_ms=5000,
                   gateway_extra=self.extra())
        self.get("/p/1")
        time.sleep(1.2)  # past the TTL (at most 1 s), within swr_s
        outcomes = [timing(self.get("/p/1"), "product") for _ in range(5)]
        self.assertEqual(outcomes[0], "refresh")
        # every page was served from the cache (none waited for the upstream), and the upstream saw
        # the first call plus one call per page that started a refresh; the next pages are served
        # the old copy while the refresh runs, then the new one (on a machine slow enough for the
        # new copy's 1 s to pass meanwhile, a page may start the next refresh: it says so)
        self.assertTrue(all(o in ("refresh", "stale", "hit") for o in outcomes), outcomes)
        self.assertTrue(wait_until(lambda: self.product_hits() == 1 + outcomes.count("refresh"), 20),
                        (outcomes, self.product_hits()))
        time.sleep(0.3)
        self.assertEqual(self.product_hits(), 1 + outcomes.count("refresh"), outcomes)

    def test_user_a_never_gets_user_b_section(self):
        me = """
local agg = require "agg"
return { route = "GET /me/{id}", handler = function(req)
  return agg.page(agg.fetch_all {
    me = { "product", "/products/" .. req.params.id, headers = { authorization = req.headers.authorization } } })
end }
"""
        self.start(services={"product": [route("/products/{id}", json={"id": "{id}"})],
                             "inventory": SERVICES["inventory"]},
                   scripts={"me.lua": me}, upstream_options=self.options({"ttl_s": 60}), deadline_ms=5000,
                   gateway_extra=self.extra())
        a = self.get("/me/1", "-H", "Authorization: Bearer A")
        b = self.get("/me/1", "-H", "Authorization: Bearer B")
        a2 = self.get("/me/1", "-H", "Authorization: Bearer A")
        b2 = self.get("/me/1", "-H", "Authorization: Bearer B")
        self.assertEqual(timing(a, "me"), "miss")
        self.assertEqual(timing(b, "me"), "miss")
        self.assertEqual(timing(a2, "me"), "hit")
        self.assertEqual(timing(b2, "me"), "hit")
        self.assertEqual(self.product_hits(), 2)
        self.assertIn("cached per user, never shared", self.gw.log())

    def test_missing_keys_reach_the_upstream_once_each(self):
        self.start(
            services={"product": [route("/products/{id}", status=404, json={"error": "no such product"})],
                      "inventory": SERVICES["inventory"]},
            scripts={"p.lua": PAGE}, upstream_options=self.options({"ttl_s": 60, "negative_ttl_s": 600}), deadline_ms=5000,
            gateway_extra=self.extra())
        # 3 rounds of 30 missing keys: one call per key, the rest are negative entries (kept 600 s:
        # longer than any run of this test, however slow the machine)
        for _ in range(3):
            for i in range(30):
                r = self.get("/p/x%d" % i)
                self.assertEqual(r.status, 200)
                self.assertEqual(r.json()["product"]["error"]["status"], 404)
        self.assertEqual(self.product_hits(), 30)


class CacheConfigChecks(unittest.TestCase):
    """aggway check on the redis and cache blocks: every mistake names gateway.lua, its line and the option."""

    def setUp(self):
        import tempfile
        self.workdir = tempfile.mkdtemp(prefix="aggway-cache-check-")
        self.addCleanup(shutil.rmtree, self.workdir, True)

    def check(self, body):
        src = ('return {\n'
               '  listen = { { port = %d } },\n'
               '%s'
               '  upstreams = { product = { url = "http://127.0.0.1:9001" },\n'
               '                inventory = { url = "http://127.0.0.1:9003" } },\n'
               '}\n') % (free_port(), body)
        d = os.path.join(self.workdir, "s%d" % len(os.listdir(self.workdir)))
        write_scripts(d, {"p.lua": PAGE}, src)
        p = run_aggway("check", "-c", d)
        return p.returncode, p.stderr.decode(errors="replace"), d

    def assertInvalid(self, body, line, *words):
        rc, err, d = self.check(body)
        self.assertEqual(rc, 1, err)
        self.assertIn(os.path.join(d, "gateway.lua") + ":%d:" % line, err)
        for w in words:
            self.assertIn(w, err)

    def test_valid_blocks_pass(self):
        rc, err, _ = self.check('  redis = { url = "redis://127.0.0.1:6379/1", timeout_ms = 5 },\n'
                                '  cache = { memory_bytes = 1048576, redis = true },\n')
        self.assertEqual(rc, 0, err)

    def test_misspelt_options_are_named_with_a_suggestion(self):
        self.assertInvalid('  redis = { url = "redis://127.0.0.1:6379/1",\n    timeut_ms = 5 },\n', 4,
                           "redis.timeut_ms", "did you mean 'timeout_ms'")
        self.assertInvalid('  cache = { memory_byte = 1048576 },\n', 3, "cache.memory_byte", "did you mean 'memory_bytes'")

    def test_wrong_types_and_values_are_named(self):
        self.assertInvalid('  redis = { url = "http://127.0.0.1:6379" },\n', 3, "redis.url", "redis://")
        self.assertInvalid('  redis = { url = "redis://127.0.0.1:99999/0" },\n', 3, "redis.url", "port")
        self.assertInvalid('  redis = { url = "redis://127.0.0.1/x" },\n', 3, "redis.url", "database")
        self.assertInvalid('  redis = { url = "redis://127.0.0.1", timeout_ms = 0 },\n', 3, "redis.timeout_ms")
        self.assertInvalid('  cache = { memory_bytes = 10 },\n', 3, "cache.memory_bytes")
        self.assertInvalid('  cache = { redis = "yes" },\n', 3, "cache.redis", "true or false")
        self.assertInvalid('  cache = { redis = true },\n', 3, "cache.redis", "no redis")

    def test_an_upstream_cache_block_is_checked(self):
        bad = ('return {\n  listen = { { port = %d } },\n  upstreams = {\n'
               '    product = { url = "http://127.0.0.1:9001",\n'
               '                cache = { ttl_s = 60, sw_s = 30 } },\n'
               '    inventory = { url = "http://127.0.0.1:9003" },\n  },\n}\n') % free_port()
        d = os.path.join(self.workdir, "up")
        write_scripts(d, {"p.lua": PAGE}, bad)
        p = run_aggway("check", "-c", d)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 1, err)
        self.assertIn(os.path.join(d, "gateway.lua") + ":5:", err)
        self.assertIn("upstreams.product.cache.sw_s", err)
        bad2 = bad.replace("sw_s = 30", 'scope = "everyone"')
        d2 = os.path.join(self.workdir, "up2")
        write_scripts(d2, {"p.lua": PAGE}, bad2)
        p = run_aggway("check", "-c", d2)
        self.assertEqual(p.returncode, 1)
        self.assertIn('upstreams.product.cache.scope: must be "shared" or "user"', p.stderr.decode())


if __name__ == "__main__":
    unittest.main()
