#!/usr/bin/env python3
"""Cache figures (issue 16): starts redis-server, the mock and the gateway with the product section
cached (ttl_s 60), loads it with h2load and prints what the cache saved, from /metrics and the
mock's hit counts:
  1. pages over 1,000 product ids in a Zipf-like mix (s = 1): hit ratio, upstream calls per page;
  2. 100,000 pages for 1,000 ids that do not exist (404) after one warm-up pass: the share that
     reached the upstream.
Run from the source tree after a build: python3 tools/bench/cache.py [pages] (default 50000)."""
import os
import random
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "integration"))
import harness  # noqa: E402
from harness import curl, free_port, h2load, route  # noqa: E402
from test_cache import PAGE, Redis  # noqa: E402


MISSING = """
local agg = require "agg"
return {
  route = "GET /m/{id}",
  handler = function(req)
    return agg.page(agg.fetch_all { product = { "product", "/gone/" .. req.params.id } })
  end,
}
"""


def metric(port, name):
    body = curl("http://127.0.0.1:%d/metrics" % port).body.decode()
    m = re.search(r"^" + re.escape(name) + r" (\d+)", body, re.M)
    return int(m.group(1)) if m else 0


class Bench(harness.GatewayTestCase):
    pages = 50000

    def runTest(self):
        redis = Redis(self.workdir).start()
        self.addCleanup(redis.stop)
        admin = free_port()
        self.start(services={"product": [route("/products/{id}", latency_ms=2, json={"id": "{id}", "name": "Sneaker"}),
                                         route("/gone/{id}", status=404, json={"error": "none"})],
                             "inventory": [route("/stock/{id}", json={"inStock": 1})]},
                   scripts={"p.lua": PAGE, "m.lua": MISSING}, workers=2,
                   upstream_options={"product": {"cache": {"ttl_s": 60, "negative_ttl_s": 60}}},
                   gateway_extra={"redis": {"url": "redis://127.0.0.1:%d/0" % redis.port, "timeout_ms": 5},
                                  "cache": {"memory_bytes": 64 * 1024 * 1024}, "admin": {"port": admin}})
        rnd = random.Random(7)
        weights = [1.0 / (i + 1) for i in range(1000)]
        ids = rnd.choices(range(1000), weights, k=self.pages)
        uris = os.path.join(self.workdir, "uris")
        with open(uris, "w") as f:
            for i in ids:
                f.write(self.url("/p/%d\n" % i))
        res = h2load(self.url("/"), "-n", str(self.pages), "-c", "16", "-i", uris, timeout=600)
        calls = self.mock.hits()["product"].get("GET /products/{id}", 0)
        hits = metric(admin, 'aggway_cache_lookups_total{outcome="hit"}')
        misses = metric(admin, 'aggway_cache_lookups_total{outcome="miss"}')
        print("zipf mix: %d pages (%d 2xx), %d distinct ids, %d upstream calls for product "
              "(%.4f per page, %d saved), cache hits %d misses %d, hit ratio %.2f %%"
              % (self.pages, res.get("2xx", 0), len(set(ids)), calls, calls / self.pages, self.pages - calls,
                 hits, misses, 100.0 * hits / max(1, hits + misses)))
        with open(uris, "w") as f:
            for i in range(1000):
                f.write(self.url("/m/%d\n" % i))
        h2load(self.url("/"), "-n", "1000", "-c", "1", "-i", uris, timeout=600)  # warm-up: every id once
        before = self.mock.hits()["product"].get("GET /gone/{id}", 0)
        with open(uris, "w") as f:
            for _ in range(100):
                for i in range(1000):
                    f.write(self.url("/m/%d\n" % rnd.randrange(1000)))
        res = h2load(self.url("/"), "-n", "100000", "-c", "16", "-i", uris, timeout=900)
        after = self.mock.hits()["product"].get("GET /gone/{id}", 0)
        print("missing keys: 100000 pages after warm-up (%d 2xx), %d reached the upstream (%.3f %%); warm-up %d calls"
              % (res.get("2xx", 0), after - before, 100.0 * (after - before) / 100000, before))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        Bench.pages = int(sys.argv[1])
    tempfile.tempdir = None
    r = unittest.TextTestRunner(verbosity=0).run(Bench())
    sys.exit(0 if r.wasSuccessful() else 1)
