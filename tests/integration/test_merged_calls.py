"""Merged calls (issue 19) with the real gateway and aggway-mock: items a script asks for one by
one (call option batch) reach the upstream as one call per batch, from one page and from
concurrent pages of a worker; each page gets its own items; a missing item fails only its caller.

The virtual-clock specs (spec/merge_spec.lua) prove the rules exactly; these prove the C
transport, the timers and the pools do the same with real sockets. Counts come from the mock's
/hits, never from clocks."""
import json
import os
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, endpoint, route, main  # noqa: E402
from test_resilience import concurrent_gets, raw_get  # noqa: E402

# /products?ids=1,2,3 answers [{"id":1,"name":"p1"},…]; ids in `missing` are left out
def catalog(missing=(), latency_ms=20):
    return {"catalog": [route("/products", latency_ms=latency_ms, each="ids", each_missing=list(missing),
                              json={"id": "{each}", "name": "p{each}"})]}


# GET /cart/{first}/{n}: items first .. first+n-1, each its own call with batch
CART = endpoint("GET /cart/{first}/{n}", """
    local calls = {}
    local first = tonumber(req.params.first)
    for i = first, first + tonumber(req.params.n) - 1 do
      calls["item" .. i] = { "catalog", "/products", batch = { key = i, param = "ids", max = MAX, window_ms = WINDOW } }
    end
    return agg.page(agg.fetch_all(calls))
""")


def cart_scripts(max_ids=50, window_ms=5):
    return {"cart.lua": CART.replace("MAX", str(max_ids)).replace("WINDOW", str(window_ms))}


class MergedCalls(GatewayTestCase):
    def catalog_calls(self):
        return self.mock.hits()["catalog"].get("GET /products", 0)

    def assert_cart(self, status, doc, first, n):
        self.assertEqual(status, 200, doc)
        for i in range(first, first + n):
            self.assertEqual(doc["item%d" % i], {"status": "ok", "data": {"id": i, "name": "p%d" % i}})

    def test_fifty_items_of_one_page_make_one_upstream_call(self):
        self.start(services=catalog(), scripts=cart_scripts())
        status, headers, doc, _ = raw_get(self.port, "/cart/1/50")
        self.assert_cart(status, doc, 1, 50)
        self.assertEqual(headers["x-aggregation-completed"], "true")
        self.assertEqual(self.catalog_calls(), 1)
        self.assertLogClean()

    def test_max_splits_a_page_into_at_most_two_calls(self):
        self.start(services=catalog(), scripts=cart_scripts(max_ids=30))
        status, _, doc, _ = raw_get(self.port, "/cart/1/50")
        self.assert_cart(status, doc, 1, 50)
        self.assertEqual(self.catalog_calls(), 2)

    def test_two_hundred_concurrent_pages_share_far_fewer_calls_than_items(self):
        # 200 pages of 10 ids each from 1..60 (overlapping): 2,000 items
        # a loaded machine may take long to accept 200 clients: the calls' times are not the point
        self.start(services=catalog(latency_ms=50), scripts=cart_scripts(window_ms=20), deadline_ms=10000,
                   upstream_options={"catalog": {"timeout_ms": 8000, "connect_timeout_ms": 5000}})
        paths = ["/cart/%d/10" % (1 + (i * 7) % 51) for i in range(200)]
        out = concurrent_gets(self.port, paths, timeout=20.0)
        for path, (status, _, doc, _ms) in zip(paths, out):
            first = int(path.split("/")[2])
            self.assert_cart(status, doc, first, 10)
        calls = self.catalog_calls()
        # one call per page would be 200; merging across pages and joining ids in flight: far fewer
        sys.stderr.write("200 pages, 2000 items: %d upstream calls\n" % calls)
        self.assertLess(calls, 100, calls)
        self.assertLogClean()

    def test_a_missing_item_fails_only_its_caller(self):
        self.start(services=catalog(missing=["3"]), scripts=cart_scripts())
        status, headers, doc, _ = raw_get(self.port, "/cart/1/5")
        self.assertEqual(status, 200, doc)
        self.assertEqual(doc["item3"]["status"], "unavailable")
        self.assertEqual(doc["item3"]["error"]["status"], 404)
        self.assertTrue(doc["item3"]["error"]["type"].endswith("upstream-not-found"), doc)
        for i in (1, 2, 4, 5):
            self.assertEqual(doc["item%d" % i]["data"], {"id": i, "name": "p%d" % i})
        self.assertEqual(headers["x-aggregation-completed"], "false")
        self.assertEqual(self.catalog_calls(), 1)

    def test_a_failed_merged_call_fails_each_caller_with_its_problem(self):
        self.start(services={"catalog": [route("/products", status=503, json={"title": "down"})]},
                   scripts=cart_scripts())
        status, _, doc, _ = raw_get(self.port, "/cart/1/4")
        self.assertEqual(status, 502, doc)
        for i in range(1, 5):
            self.assertEqual(doc["sections"]["item%d" % i]["status"], "unavailable")
        self.assertEqual(self.catalog_calls(), 1)

    def test_a_caller_with_a_short_deadline_does_not_wait_for_the_batch(self):
        hurry = endpoint("GET /hurry/{id}", """
    return agg.page(agg.fetch_all { item = { "catalog", "/products", timeout_ms = 100,
                                             batch = { key = req.params.id, param = "ids", window_ms = 5 } } })
""")
        scripts = cart_scripts()
        scripts["hurry.lua"] = hurry
        # the cart waits for the 2 s upstream under a 10 s deadline (under the default 1 s
        # deadline, an 800 ms upstream timed out the cart at a load average of 15)
        self.start(services=catalog(latency_ms=2000), scripts=scripts, deadline_ms=10000,
                   upstream_options={"catalog": {"timeout_ms": 8000}})
        out = concurrent_gets(self.port, ["/cart/1/2", "/hurry/1"], timeout=20.0)
        (s1, _, cart, ms1), (s2, _, fast, ms2) = out
        self.assert_cart(s1, cart, 1, 2)
        self.assertGreaterEqual(ms1, 2000)
        self.assertEqual(s2, 504, fast)  # its only section timed out
        self.assertEqual(fast["sections"]["item"]["status"], "unavailable", fast)
        self.assertTrue(fast["sections"]["item"]["error"]["type"].endswith("upstream-timeout"), fast)
        self.assertLess(ms2, 1500)  # its own 100 ms, far below the upstream's 2000

    def test_merged_calls_of_a_group_follow_each_pages_session(self):
        # (found by an attack review: a merged call went where its first caller's session pinned;
        # a caller pinned elsewhere was given that endpoint's items and kept no session)
        names = ("catalog", "catalog_b", "catalog_c")
        self.start_mock({n: [route("/products", each="ids", json={"id": "{each}", "from": n})] for n in names})
        eps = [self.mock.url(n) for n in names]
        self.start(scripts=cart_scripts(window_ms=100), deadline_ms=4000, upstream_options={
            "catalog": {"endpoints": eps, "timeout_ms": 2000, "session": {"type": "cookie", "name": "s"}}})

        def page(path, cookie=None):
            req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                         headers={"cookie": cookie} if cookie else {})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.headers.get("set-cookie"), json.loads(resp.read())
        sessions = {}  # endpoint -> a session pinned to it (pages without one until two endpoints have one)
        for i in range(40):
            cookie, doc = page("/cart/%d/1" % i)
            sessions.setdefault(doc["item%d" % i]["data"]["from"], cookie.split(";")[0])
            if len(sessions) == 2:
                break
        (x, x_session), (y, y_session) = sessions.items()
        out = [None, None]
        barrier = threading.Barrier(2)

        def one(k, path, cookie):
            barrier.wait()
            out[k] = page(path, cookie)
        threads = [threading.Thread(target=one, args=(0, "/cart/100/2", x_session)),
                   threading.Thread(target=one, args=(1, "/cart/101/2", y_session))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        (a_cookie, a), (b_cookie, b) = out
        self.assertEqual([a["item100"]["data"]["from"], a["item101"]["data"]["from"]], [x, x], a)
        self.assertEqual([b["item101"]["data"]["from"], b["item102"]["data"]["from"]], [y, y], b)
        self.assertIsNone(a_cookie)  # each session stays where it is: nothing to set
        self.assertIsNone(b_cookie)


if __name__ == "__main__":
    main()
