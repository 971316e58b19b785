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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GatewayTestCase, demo_services, gateway_lua, main, repo_scripts, route,  # noqa: E402
                     run_aggway, write_scripts)

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
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=SCRIPTS,
                   deadline_ms=20000, gateway_extra=dict({"script_time_limit_ms": 10000}, **extra))

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
