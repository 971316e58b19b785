"""max_sections_per_request (gateway.lua, default 1000): every section of a request's fan-outs
(calls, chains, nested fan-outs) counts, and the one that would pass the limit is refused at the
script's line before any of its calls is made. One client request cannot make an unbounded number
of upstream calls, nor hold its worker in the runtime's own code (which the script time limit does
not stop) with a fan-out of hundreds of thousands of sections. Chains of thousands of continuations
settle without a recursion (about 1,400 overflowed the stack) and a dependency cycle is found in
time linear in the fan-out (the check was cubic: 1,500 chained continuations held the worker for
seconds).

Assertions are on statuses, the log and the mock's counts, never on time: a worker held by the
runtime shows as the next request's answer not coming (curl's timeout)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (UNHURRIED_UPSTREAMS, GatewayTestCase, demo_services, endpoint, gateway_lua, main, repo_scripts, route,  # noqa: E402
                     run_aggway, wait_until, write_scripts)

SCRIPTS = dict(repo_scripts(), **{
    "fan.lua": """local agg = require "agg"
return {
  -- n sections, each a call of its own
  { route = "GET /wide/{n}", handler = function(req)
      local t = {}
      for i = 1, tonumber(req.params.n) do t["s" .. i] = { "product", "/products/" .. i } end
      local res = agg.fetch_all(t)
      local n = 0
      for _ in pairs(res) do n = n + 1 end
      return { status = 200, json = { sections = n } }
    end },
  -- a chain of n continuations after one call
  { route = "GET /chain/{n}", handler = function(req)
      local n = tonumber(req.params.n)
      local t = { s0 = { "product", "/products/1" } }
      t.s1 = agg.fetch_then("s0", function(r) return 1 end)
      for i = 2, n do t["s" .. i] = agg.fetch_then("s" .. (i - 1), function(v) return v.data + 1 end) end
      local res = agg.fetch_all(t)
      return { status = 200, json = { last = res["s" .. n].data } }
    end },
  -- n continuations in a ring
  { route = "GET /ring/{n}", handler = function(req)
      local n = tonumber(req.params.n)
      local t = {}
      for i = 1, n do t["s" .. i] = agg.fetch_then("s" .. (i % n + 1), function() end) end
      return agg.page(agg.fetch_all(t))
    end },
}
"""})


class MaxSections(GatewayTestCase):

    def start_with(self, **extra):
        # the calls' timeouts as long as the deadline: the chain's one call is answered while the
        # worker settles 15,000 continuations, which took more than the harness's 150 ms on a
        # loaded machine (its section then failed, and so did the chain's last)
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=SCRIPTS,
                   deadline_ms=20000, upstream_options=UNHURRIED_UPSTREAMS,
                   gateway_extra=dict({"script_time_limit_ms": 10000}, **extra))

    def test_default_limit_refuses_the_fan_out_past_1000_before_any_call(self):
        self.start_with()
        ok = self.get("/wide/1000")
        self.assertEqual(ok.status, 200, ok)
        self.assertEqual(ok.json()["sections"], 1000)  # (those past the upstream's queue fail: 503)
        self.mock.reset()
        r = self.get("/wide/1001")
        p = self.assertProblem(r, 500)
        self.assertNotIn("max_sections", r.body.decode())  # the client is not told the internals
        self.assertNotIn("sections", p.get("detail", ""))
        self.assertEqual(self.mock.requests("product")["total"], 0)
        self.assertIn("fan.lua:7: too many sections: this request's fan-outs would have more than 1000 in all "
                      "(max_sections_per_request in gateway.lua)", self.gw.log())
        self.assertEqual(self.get("/product-page/42").status, 200)  # the worker serves on

    def test_a_huge_fan_out_is_refused_and_the_worker_serves_on(self):
        self.start_with()
        r = self.get("/wide/300000", timeout=60)
        self.assertProblem(r, 500)
        self.assertEqual(self.mock.requests("product")["total"], 0)
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_long_chain_and_long_ring_under_a_raised_limit(self):
        self.start_with(max_sections_per_request=20000)
        r = self.get("/chain/15000", timeout=60)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["last"], 15000)
        self.assertNotIn("stack overflow", self.gw.log())
        ring = self.get("/ring/15000", timeout=60)
        self.assertProblem(ring, 500)
        self.assertIn("fetch_then dependency cycle: 's1' -> 's2' -> ", self.gw.log())
        self.assertEqual(self.get("/product-page/42").status, 200)


STUCK_SCRIPTS = dict(repo_scripts(), **{
    "stuck.lua": """local agg = require "agg"
return {
  -- a section that fails at once (the deadline has passed) and a continuation on it whose fallback
  -- yields, in the handler's coroutine, while the runtime runs the ready continuations
  { route = "GET /stuck", deadline_ms = 50, handler = function()
      agg.fetch { "product", "/products/slow" }
      return agg.page(agg.fetch_all {
        s = { "product", "/products/1" },
        c = agg.fetch_then("s", function() return 1 end, { fallback = function() coroutine.yield() end }),
      })
    end },
  { route = "GET /chain", handler = function()
      return agg.page(agg.fetch_all {
        p = { "product", "/products/1" },
        c = agg.fetch_then("p", function(r) return r.data.id end),
      })
    end },
  -- 65 request headers while the upstream's breaker is half-open
  { route = "GET /many-headers", handler = function()
      local h = {}
      for i = 1, 65 do h["x-h" .. i] = "v" end
      return agg.page(agg.fetch_all { b = { "reviews", "/reviews/1", headers = h } })
    end },
  { route = "GET /reviews", handler = function()
      return agg.page(agg.fetch_all { b = { "reviews", "/reviews/1" } })
    end },
}
"""})

# A trusted folder's continuations that yield the gateway's coroutine: by themselves, and as a
# fetch_all waiting for its calls would, with none (what a mistake of the runtime's that lost a
# call's answer would leave: nothing resumes it).
YIELD_SCRIPTS = dict(repo_scripts(), **{
    "yields.lua": endpoint("GET /then-yields", """
    return agg.page(agg.fetch_all {
      p = { "product", "/products/1" },
      c = agg.fetch_then("p", function() coroutine.yield() return 1 end),
    })""", deadline_ms=10000),
    "waits.lua": endpoint("GET /then-waits", """
    local WAIT = require("agg.fanout").WAIT
    return agg.page(agg.fetch_all {
      p = { "product", "/products/1" },
      c = agg.fetch_then("p", function() coroutine.yield(WAIT) return 1 end),
    })""", deadline_ms=300)})


class RuntimeNeverStuck(GatewayTestCase):

    def test_fallback_that_yields_leaves_later_continuations_running(self):
        """A fallback that yielded inside the runtime's queue of ready continuations left it marked
        as being drained: every later page with a continuation on the worker went unanswered."""
        self.start(services=demo_services(product_ms=[route("/products/slow", latency_ms=300, json={"id": 0}),
                                                      route("/products/{id}", json={"id": "{id}"})],
                                          reviews_ms=0, inventory_ms=0), scripts=STUCK_SCRIPTS)
        r = self.get("/stuck")
        self.assertIn(r.status, (500, 504), r)
        self.assertIn("stuck.lua:9: coroutine.yield: this code runs in the gateway's coroutine", self.gw.log())
        for _ in range(3):
            c = self.get("/chain", timeout=10)
            self.assertEqual(c.status, 200, c)
            self.assertEqual(c.json()["c"]["data"], 1)

    def test_too_many_headers_leave_a_half_open_breaker_usable(self):
        """The transport refused a call of 65 headers after the exchange had taken the half-open
        breaker's probe slot: the breaker stayed half-open with no probe for good."""
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=STUCK_SCRIPTS,
                   upstream_options={"reviews": {"breaker": {"failures": 2, "open_s": 1}}})
        self.mock.refuse("reviews")
        for _ in range(3):
            self.get("/reviews")
        self.assertTrue(wait_until(lambda: "circuit breaker of upstream reviews is now open" in self.gw.log(), 10))
        self.mock.accept("reviews")
        time.sleep(1.3)  # the breaker half-opens
        r = self.get("/many-headers")
        self.assertProblem(r, 500)
        self.assertIn("call to 'reviews': at most 64 request headers", self.gw.log())
        ok = wait_until(lambda: self.get("/reviews").json().get("b", {}).get("status") == "ok", 10, interval=0.2)
        self.assertTrue(ok, self.get("/reviews").body)

    def test_page_left_unanswered_is_answered_a_second_past_its_deadline(self):
        """A trusted folder's continuation that waits with nothing to answer it: nothing resumes
        it. The page stayed in flight until its client left; the worker's tick answers it. One
        that yields by itself fails its section at once (it was left the same way)."""
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=YIELD_SCRIPTS,
                   gateway_extra={"scripts": {"trusted": True}})
        r = self.get("/then-yields", timeout=15)
        # (its deadline is 10 s: failed at once, it is not left for the overdue guard, 11 s)
        self.assertLess(r.time_total, 9.0, r)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["c"]["error"]["type"], "urn:aggway:problem:script-error", r)
        self.assertEqual(r.json()["p"]["status"], "ok", r)
        self.assertIn("a continuation must not call coroutine.yield", self.gw.log())
        r = self.get("/then-waits", timeout=15)
        self.assertProblem(r, 500)
        self.assertGreaterEqual(r.time_total, 1.3)  # 300 ms deadline + a second, at the next tick
        self.assertIn("still unanswered", self.gw.log())
        self.assertEqual(self.get("/product-page/42").status, 200)


class MaxSectionsConfig(GatewayTestCase):

    def check(self, value):
        sdir = os.path.join(self.workdir, "cfg")
        write_scripts(sdir, repo_scripts(), gateway_lua(8080, {"product": {"url": "http://127.0.0.1:1"},
                                                               "reviews": {"url": "http://127.0.0.1:1"},
                                                               "inventory": {"url": "http://127.0.0.1:1"}},
                                                        max_sections_per_request=value))
        return run_aggway("check", "-c", sdir)

    def test_bad_values_are_reported_with_file_and_line(self):
        for v in (0, -1, 1.5, 100001, "1000"):
            r = self.check(v)
            self.assertNotEqual(r.returncode, 0, v)
            err = r.stderr.decode() + r.stdout.decode()
            self.assertIn("gateway.lua:", err)
            self.assertIn("max_sections_per_request: must be a whole number of sections from 1 to 100000", err)

    def test_good_value_is_accepted(self):
        r = self.check(50)
        self.assertEqual(r.returncode, 0, r.stderr.decode())


if __name__ == "__main__":
    main()
