#!/usr/bin/env python3
"""Tier 1 per worker or shared (issue 16: "per worker or shared — decided by measurement"). The
same Zipf mix of product pages (1,000 ids, s = 1, the product section cached ttl_s 60, tier 1 only,
no Redis) is loaded through:
  2 workers x 1 LRU each   what aggway does: each worker's LRU holds memory_bytes / 2
  1 worker  x 1 LRU        one LRU that sees every page and holds memory_bytes: the hit ratio a
                           tier 1 shared by the workers would reach with the same bytes
for a memory_bytes where every entry fits (64 MiB) and one where they do not (64 KiB). Prints per
run: pages, hit ratio, upstream calls per page, and the gateway's CPU per page (user + system of
the whole process over the load, from /proc/PID/stat; the mock and h2load are not counted).
Run from the source tree after a build: python3 tools/bench/cache_tier1.py [pages] (default 50000)."""
import os
import random
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "integration"))
import harness  # noqa: E402
from harness import curl, free_port, h2load, route  # noqa: E402
from test_cache import PAGE  # noqa: E402


def metric(port, name):
    body = curl("http://127.0.0.1:%d/metrics" % port).body.decode()
    m = re.search(r"^" + re.escape(name) + r" (\d+)", body, re.M)
    return int(m.group(1)) if m else 0


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15), every thread


class Run(harness.GatewayTestCase):
    pages = 50000
    workers, memory = 2, 64 * 1024 * 1024

    def runTest(self):
        admin = free_port()
        self.start(services={"product": [route("/products/{id}", latency_ms=0, json={"id": "{id}", "name": "Sneaker"})],
                             "inventory": [route("/stock/{id}", json={"inStock": 1})]},
                   scripts={"p.lua": PAGE}, workers=self.workers,
                   upstream_options={"product": {"cache": {"ttl_s": 60}}},
                   gateway_extra={"cache": {"memory_bytes": self.memory}, "admin": {"port": admin}})
        rnd = random.Random(7)
        weights = [1.0 / (i + 1) for i in range(1000)]
        uris = os.path.join(self.workdir, "uris")
        with open(uris, "w") as f:
            for i in rnd.choices(range(1000), weights, k=self.pages):
                f.write(self.url("/p/%d\n" % i))
        t0 = cpu_ticks(self.gw.proc.pid)
        res = h2load(self.url("/"), "-n", str(self.pages), "-c", "16", "-i", uris, timeout=600)
        t1 = cpu_ticks(self.gw.proc.pid)
        calls = self.mock.hits()["product"].get("GET /products/{id}", 0)
        hits = metric(admin, 'aggway_cache_lookups_total{outcome="hit"}')
        misses = metric(admin, 'aggway_cache_lookups_total{outcome="miss"}')
        evictions = metric(admin, "aggway_cache_evictions_total")
        us = (t1 - t0) * 1e6 / os.sysconf("SC_CLK_TCK") / self.pages
        print("%d worker(s), memory_bytes %8d: %d pages (%d 2xx), hit ratio %.2f %%, %.4f upstream calls per page, "
              "%d evictions, gateway CPU %.1f us per page"
              % (self.workers, self.memory, self.pages, res.get("2xx", 0), 100.0 * hits / max(1, hits + misses),
                 calls / self.pages, evictions, us), flush=True)


if __name__ == "__main__":
    pages = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
    tempfile.tempdir = None
    ok = True
    for memory in (64 * 1024 * 1024, 64 * 1024):
        for workers in (2, 1):
            t = Run()
            t.pages, t.workers, t.memory = pages, workers, memory
            ok = unittest.TextTestRunner(verbosity=0).run(t).wasSuccessful() and ok
    sys.exit(0 if ok else 1)
