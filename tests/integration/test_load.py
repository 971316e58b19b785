"""Load: 1,000 concurrent requests on one HTTP/2 connection, and an HTTP/1.1 burst on 32
connections, against the product page with small mock latencies. Every request gets a 2xx page.

The upstream pools are made wide enough (max_pending) that the only limit under test is the
front end's: how many streams one HTTP/2 connection may carry at once."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, SLOW, demo_services, endpoint, h2load, nghttp, main  # noqa: E402

WIDE_POOLS = {name: {"max_pending": 4096, "timeout_ms": 3000, "connect_timeout_ms": 1000}
              for name in ("product", "reviews", "inventory")}

# The product page's shape, with timeouts that a loaded 2-core machine (a sanitizer build, other
# tests running) cannot hit: these tests are about the front end and the pools, not about the
# seed's tight 100 ms caps (a CPU stall of 100 ms under contention would fail a page there).
LOAD_PAGE = endpoint("GET /load-page/{id}", """
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, required = true },
      reviews   = { "reviews", "/reviews/" .. id },
      inventory = { "inventory", "/stock/" .. id },
    }
    res.product.data.description = nil
    return agg.page(res)""", deadline_ms=5000)


def advertised_max_concurrent_streams(out):
    """SETTINGS_MAX_CONCURRENT_STREAMS from the server's SETTINGS frame in `nghttp -v` output
    (None when the server does not send it: no limit)."""
    m = re.search(r"recv SETTINGS frame <[^>]*>\s*\(niv=\d+\)((?:\s*\[[^\]]*\])*)", out)
    if not m:
        return None
    for name, value in re.findall(r"\[(SETTINGS_\w+)\(0x[0-9a-f]+\):(\d+)\]", m.group(1)):
        if name == "SETTINGS_MAX_CONCURRENT_STREAMS":
            return int(value)
    return None


class Http2Concurrency(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=2, reviews_ms=3, inventory_ms=1), upstream_options=WIDE_POOLS,
                   scripts={"load-page.lua": LOAD_PAGE})

    def test_gateway_advertises_the_h2o_stream_limit_and_serves_past_it(self):
        # libh2o 2.2.5 (Debian 12) sends a fixed SETTINGS frame: 100 concurrent streams per
        # connection. A client with 1000 requests queues the rest; all of them are answered
        # (next test). This pins the figure so a change of the library shows up here.
        _status, _headers, out = nghttp(self.url("/load-page/1"))
        self.assertEqual(advertised_max_concurrent_streams(out), 100, out)

    def test_1000_concurrent_requests_on_one_h2_connection_all_succeed(self):
        res = h2load(self.url("/load-page/42"), "-n", "1000", "-c", "1", "-m", "1000", timeout=120)
        self.assertEqual(res.get("succeeded"), 1000, res["output"])
        self.assertEqual(res.get("failed"), 0, res["output"])
        self.assertEqual(res.get("errored"), 0, res["output"])
        self.assertEqual(res.get("2xx"), 1000, res["output"])
        self.assertIn("h2c", res["output"])
        self.assertEqual(self.log_errors(), [])


class Http1Burst(GatewayTestCase):

    def test_5000_requests_on_32_http1_connections_are_all_2xx(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), upstream_options=WIDE_POOLS,
                   scripts={"load-page.lua": LOAD_PAGE}, workers=2)
        res = h2load(self.url("/load-page/42"), "--h1", "-c", "32", "-n", "5000", timeout=180)
        self.assertEqual(res.get("succeeded"), 5000, res["output"])
        self.assertEqual(res.get("2xx"), 5000, res["output"])
        self.assertEqual(res.get("failed"), 0, res["output"])
        self.assertEqual(self.log_errors(), [])


if __name__ == "__main__":
    main()
