"""The scripts' memory limit (script_memory_limit_mb, base/heap.h): a script that asks its worker's
Lua heap for more than the limit (a string doubled in a loop, many large strings kept, string.rep)
gets LuaJIT's "not enough memory" where it asked; the request gets a 500 problem, a continuation's
section fails, the log says which limit refused how much, aggway_lua_memory_refused_total counts
it, the process's memory stays near the limit, and the worker serves the next request. Without
the limit each of these pages takes gigabytes (the doubling one, 2^34 bytes) before anything
stops it.

Assertions are on statuses, bodies, the log, /metrics and the process's peak RSS (VmHWM), never
on time."""
import os
import re
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GatewayTestCase, demo_services, endpoint, free_port, gateway_lua, main, repo_scripts,  # noqa: E402
                     route, run_aggway, wait_until, write_scripts)

LIMIT_MB = 64

SCRIPTS = dict(repo_scripts(), **{
    # 16 GB if nothing stops it (line 6: the concatenation)
    "double.lua": endpoint("GET /double", """
    local s = "x"
    for _ = 1, 34 do s = s .. s end
    return { status = 200, json = { n = #s } }"""),
    # 100 strings of 16 MB kept in a table: 1.6 GB
    "keep.lua": endpoint("GET /keep", """
    local t = {}
    for i = 1, 100 do t[i] = string.rep(string.char(64 + i % 26), 2^24) end
    return { status = 200, json = { n = #t } }"""),
    # a continuation that runs out: its section fails, the rest of the page is served
    "then.lua": endpoint("GET /then/{id}", """
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. req.params.id },
      big = agg.fetch_then("product", function(p)
        local s = "y"
        for _ = 1, 34 do s = s .. s end
        return { n = #s }
      end),
    })"""),
    # 54 MB kept in the module (30 KB blocks), shared by every request of the worker, until /release
    "hold.lua": """local agg = require "agg"
local kept = {}
return {
  { route = "GET /hold", handler = function(req)
      for i = 1, 1800 do kept[i] = string.rep(("%05d"):format(i), 6000) end
      return { status = 200, json = { kept = #kept } }
    end },
  { route = "GET /release", handler = function(req)
      kept = {}
      collectgarbage()
      return { status = 200, json = { kept = #kept } }
    end },
  { route = "GET /big", handler = function(req)
      return { status = 200, json = { n = #string.rep("z", 16 * 2^20) } }
    end },
  { route = "POST /body-length", handler = function(req)
      return { status = 200, json = { n = #req.body } }
    end },
  { route = "GET /blob-length", handler = function(req)
      local res = agg.fetch { "blob", "/blob" }
      return { status = 200, json = { n = res.body and #res.body or -1 } }
    end },
}
""",
    # tables of 4,000 numbers (32 KB blocks, under the huge-block size) kept in the module, until
    # the limit stops the script; /fill again takes one more megabyte at most
    "fill.lua": """local agg = require "agg"
local kept = {}
return {
  { route = "GET /fill", handler = function(req)
      for i = 1, 10000 do
        local t = {}
        for k = 1, 4000 do t[k] = k end
        kept[#kept + 1] = t
      end
      return { status = 200, json = { kept = #kept } }
    end },
  { route = "GET /unfill", handler = function(req)
      kept = {}
      collectgarbage()
      return { status = 200, json = { kept = #kept } }
    end },
}
""",
    # an xpcall whose handler would loop: not run for the memory stop (LuaJIT runs a handler of a
    # hook's error with hooks off: nothing could stop it)
    "xpcall.lua": endpoint("GET /xpcall", """
    local function hog() local head for i = 1, 1e7 do head = { head, i } end end
    xpcall(hog, function(e) while true do end end)
    return { status = 200, json = { done = true } }"""),
    # 40 MB live for a moment: within the limit
    "live40.lua": endpoint("GET /live40", """
    local t = {}
    for i = 1, 1250 do t[i] = string.rep(string.char(65 + i % 26), 32000) .. i end
    return { status = 200, json = { n = #t } }"""),
    # one new 200 KB string kept in the module per request
    "grow.lua": """local kept = {}
return { route = "GET /grow/{n}", handler = function(req)
  kept[#kept + 1] = string.rep("g", 200 * 1024) .. req.params.n
  return { status = 200, json = { n = #kept } }
end }
""",
    # one C call that makes hundreds of MB from a 4 MB string (just under string.rep's own check):
    # no hook runs inside it, so each is checked before it is made (an attack review: one
    # table.concat took 4 GB and 11 s; every later page was stopped until the worker idled)
    "bombs.lua": """local agg = require "agg"
local function b() return ("y"):rep(4 * 1024 * 1024 - 64) end
local function many(n) local s, t = b(), {} for i = 1, n do t[i] = s end return t end
return {
  { route = "GET /bomb/concat", handler = function(req)
      return { status = 200, json = { n = #table.concat(many(100)) } }
    end },
  { route = "GET /bomb/gsub", handler = function(req)
      return { status = 200, json = { n = #(("x"):rep(100):gsub("x", b())) } }
    end },
  { route = "GET /bomb/format", handler = function(req)
      return { status = 200, json = { n = #string.format(("%s"):rep(60), unpack(many(60))) } }
    end },
  { route = "GET /bomb/json", handler = function(req)
      local text, err = agg.json.encode(many(60))
      return { status = 200, json = { text = text ~= nil, err = err } }
    end },
  -- what the first checks missed (the review of them): arguments with a __tostring, a
  -- replacement of many %0, control characters (6 bytes each in JSON)
  { route = "GET /bomb/tostring", handler = function(req)
      local big = ("x"):rep(30 * 1024 * 1024)
      local o = setmetatable({}, { __tostring = function() return big end })
      return { status = 200, json = { n = #string.format(("%s"):rep(20), o, o, o, o, o, o, o, o, o, o,
                                                         o, o, o, o, o, o, o, o, o, o) } }
    end },
  { route = "GET /bomb/percent0", handler = function(req)
      local s = ("z"):rep(1024 * 1024)
      return { status = 200, json = { n = #(s:gsub("^.*$", ("%0"):rep(400))) } }
    end },
  { route = "GET /bomb/controls", handler = function(req)
      local text, err = agg.json.encode({ ("\1"):rep(12 * 1024 * 1024) })  -- 72 MB once escaped
      return { status = 200, json = { text = text ~= nil, err = err } }
    end },
  -- and what the second review found: a __tostring that returns a number first (LuaJIT calls it
  -- once: what it returned is what is formatted), and a key of control characters
  { route = "GET /bomb/tostring-number", handler = function(req)
      local big = ("x"):rep(8 * 1024 * 1024)
      local calls = 0
      local o = setmetatable({}, { __tostring = function()
        calls = calls + 1
        if calls <= 20 then return 0 end
        return big
      end })
      local args = {}
      for i = 1, 20 do args[i] = o end
      return { status = 200, json = { n = #string.format(("%s"):rep(20), unpack(args)), calls = calls } }
    end },
  { route = "GET /bomb/json-key", handler = function(req)
      local text, err = agg.json.encode({ [("\1"):rep(12 * 1024 * 1024)] = 1 })  -- 72 MB once escaped
      return { status = 200, json = { text = text ~= nil, err = err } }
    end },
  -- within the limit: 16 bytes of a 20 MB string, a 5 MB page of small pieces
  { route = "GET /fits/format", handler = function(req)
      local big = ("q"):rep(20 * 1024 * 1024)
      local t = {}
      for i = 1, 500000 do t[i] = "abcdefghij" end
      return { status = 200, json = { head = string.format("%.16s", big), n = #table.concat(t) } }
    end },
  -- a chain of 60 concatenations (one instruction, no call to check): 240 MB before the hook
  -- can stop the script; the page after it must not pay for it
  { route = "GET /bomb/chain", handler = function(req)
      local x = b()
      local s = x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..
                x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x..x
      return { status = 200, json = { n = #s } }
    end },
}
""",
    # within the limit: 8 MB
    "fits.lua": endpoint("GET /fits", """
    local s = string.rep("z", 8 * 2^20)
    return { status = 200, json = { n = #s } }"""),
})


def vm_hwm_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 1024.0


class ScriptMemoryLimit(GatewayTestCase):

    def get(self, path, *curl_args, timeout=120):
        """A GET with room for a page that builds and collects hundreds of MB in the sanitized build
        beside busy loops (a bomb's refusal took over curl's usual 10 s there): these tests say
        what a page answers, never how fast."""
        return super().get(path, *curl_args, timeout=timeout)

    def setUp(self):
        super().setUp()
        self.admin_port = free_port()
        services = demo_services(product_ms=0, reviews_ms=0, inventory_ms=0)
        services["blob"] = [route("/blob", body="b" * (12 * 1024 * 1024))]
        self.start(services=services, scripts=SCRIPTS, upstream_options={"blob": {"max_body_bytes": 16 * 1024 * 1024}},
                   gateway_extra={"script_memory_limit_mb": LIMIT_MB,
                                  # the memory limit is what these tests stop the scripts with: the
                                  # time limit must not come first (64 MB of string.rep and a full
                                  # collection took over 1 s in the sanitized build beside two busy
                                  # loops, and the time limit stopped /keep first)
                                  "script_time_limit_ms": 30000,
                                  "admin": {"port": self.admin_port, "host": "127.0.0.1"}})

    def counter(self, name):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.admin_port, timeout=10) as r:
            m = re.search(r"^%s (\d+)$" % name, r.read().decode(), re.M)
        return int(m.group(1)) if m else -1

    def limit_hits(self):
        """Huge blocks refused and scripts stopped by the limit, so far."""
        return self.counter("aggway_lua_memory_refused_total") + self.counter("aggway_lua_memory_stopped_total")

    def assertRefused(self, path):
        before = self.limit_hits()
        r = self.get(path)
        self.assertProblem(r, 500)
        self.assertNotIn(b"memory", r.body, "the client is not told the internals")
        self.assertTrue(wait_until(lambda: self.limit_hits() > before, 15), self.gw.log())
        log = self.gw.log()
        self.assertTrue("not enough memory" in log or "more than script_memory_limit_mb (%d MB" % LIMIT_MB in log, log)
        self.assertIn("script_memory_limit_mb (%d MB" % LIMIT_MB, log)
        # the worker goes on serving, large blocks within the limit included
        self.assertEqual(self.get("/fits").json(), {"n": 8 * 2 ** 20})
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_a_string_doubled_in_a_loop_is_refused_at_the_limit(self):
        self.assertRefused("/double")
        self.assertIn("double.lua", self.gw.log())

    def test_many_large_strings_kept_are_refused_at_the_limit(self):
        self.assertRefused("/keep")
        self.assertIn("keep.lua:7: ", self.gw.log())

    def test_small_blocks_kept_in_the_module_are_stopped_at_the_limit(self):
        # 32 KB blocks are never refused: the script is stopped once the heap, collected, is still
        # over the limit; each later request that takes more is stopped a megabyte further on
        r = self.get("/fill")
        self.assertProblem(r, 500)
        self.assertTrue(wait_until(lambda: self.counter("aggway_lua_memory_stopped_total") >= 1, 15), self.gw.log())
        log = self.gw.log()
        self.assertRegex(log, r"fill\.lua:\d+: stopped: the scripts of this worker hold \d+ MB, more than "
                              r"script_memory_limit_mb \(%d MB in gateway\.lua\)" % LIMIT_MB)
        self.assertIn("script(s) stopped: the scripts' heap, collected, was still over script_memory_limit_mb", log)
        self.assertProblem(self.get("/fill"), 500)
        self.assertLess(vm_hwm_mb(self.gw.proc.pid), 3 * LIMIT_MB + 150, self.gw.log())
        # what the module kept is let go: the worker is whole again
        self.assertEqual(self.get("/unfill").json(), {"kept": 0})
        self.assertEqual(self.get("/fits").json(), {"n": 8 * 2 ** 20})
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_a_continuation_that_runs_out_fails_its_section_only(self):
        r = self.get("/then/7")
        self.assertEqual(r.status, 200, (r.body, self.gw.log()[-2500:]))
        page = r.json()
        self.assertEqual(page["product"]["status"], "ok", page)
        self.assertEqual(page["big"]["status"], "unavailable", page)
        self.assertTrue(wait_until(lambda: self.limit_hits() >= 1, 15), self.gw.log())

    def test_a_full_heap_still_takes_a_large_request_body_and_upstream_answer(self):
        # The request's body and an upstream's answer are handed to the runtime from C, outside
        # any protected call: refused there, LuaJIT's error would end the process. With the heap
        # near the limit, the 12 MB answer (a huge block) would be refused; it never is outside a
        # protected call. What the script does with them next is under the limit.
        self.assertEqual(self.get("/hold").json(), {"kept": 1800}, self.gw.log())
        body = os.path.join(self.workdir, "body.bin")
        with open(body, "wb") as f:
            f.write(b"q" * (900 * 1024))  # (max_request_body_bytes: 1 MB)
        for _ in range(3):
            r = self.get("/body-length", "--data-binary", "@" + body, "-H", "content-type: application/octet-stream")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json(), {"n": 900 * 1024})
        # the 12 MB answer is taken, and the process lives on; with it the heap is over the limit,
        # so the script that reads it is answered, or stopped (a clean 500) if it allocates
        for _ in range(3):
            r = self.get("/blob-length")
            if r.status == 200:
                self.assertEqual(r.json(), {"n": 12 * 1024 * 1024})
            else:
                self.assertProblem(r, 500)
            self.assertIsNone(self.gw.proc.poll(), self.gw.log())
        # the heap is nearly full: a script's own huge block is refused, and taken once released
        self.assertProblem(self.get("/big"), 500)
        self.assertEqual(self.get("/release").json(), {"kept": 0})
        self.assertEqual(self.get("/big").json(), {"n": 16 * 2 ** 20})
        self.assertEqual(self.get("/blob-length").json(), {"n": 12 * 1024 * 1024})
        self.assertIsNone(self.gw.proc.poll(), self.gw.log())

    def test_an_xpcall_handler_does_not_run_for_the_stop(self):
        self.assertProblem(self.get("/xpcall"), 500)
        self.assertIn("stopped: the scripts of this worker hold", self.gw.log())
        self.assertEqual(self.get("/product-page/42").status, 200)  # the worker is not held

    def test_after_a_stop_scripts_within_the_limit_are_not_stopped(self):
        self.assertProblem(self.get("/double"), 500)
        for _ in range(3):
            self.assertEqual(self.get("/live40").json(), {"n": 1250})
        time.sleep(2.5)  # (the figures the stop left are forgotten once the heap is under the limit)
        for _ in range(3):
            self.assertEqual(self.get("/live40").json(), {"n": 1250})

    def test_data_kept_across_requests_stops_near_the_limit(self):
        statuses = [self.get("/grow/%d" % i).status for i in range(400)]
        self.assertIn(200, statuses)
        self.assertIn(500, statuses)
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.admin_port, timeout=10) as r:
            heap = int(re.search(r"^aggway_lua_heap_bytes (\d+)$", r.read().decode(), re.M).group(1))
        # a quarter over the limit, and what one request takes past it (without the check of every
        # block past the limit: 585 MB after 400 requests)
        self.assertLess(heap / 2 ** 20, LIMIT_MB * 1.25 + 16, self.gw.log()[-2000:])

    def test_one_call_that_would_make_hundreds_of_mb_is_refused_before_it_is_made(self):
        for kind in ("concat", "gsub", "format"):
            self.assertRefused("/bomb/" + kind)
            self.assertIn("not enough memory: %s" % {"concat": "table.concat's result", "gsub": "string.gsub's result",
                                                     "format": "string.format's result"}[kind], self.gw.log())
        r = self.get("/bomb/json")
        self.assertEqual(r.json(), {"text": False, "err": "not enough memory: the text would take the "
                                                          "scripts' heap past script_memory_limit_mb"}, r)
        self.assertLess(vm_hwm_mb(self.gw.proc.pid), 3 * LIMIT_MB + 150, self.gw.log())

    def test_what_the_first_checks_missed_is_refused_too(self):
        self.assertRefused("/bomb/tostring")
        self.assertIn("not enough memory: string.format's result", self.gw.log())
        self.assertRefused("/bomb/percent0")
        self.assertIn("not enough memory: string.gsub's result", self.gw.log())
        r = self.get("/bomb/controls")
        self.assertEqual(r.json(), {"text": False, "err": "not enough memory: the text would take the "
                                                          "scripts' heap past script_memory_limit_mb"}, r)
        self.assertLess(vm_hwm_mb(self.gw.proc.pid), 3 * LIMIT_MB + 150, self.gw.log())
        self.assertEqual(self.get("/bomb/tostring-number").json(), {"n": 20, "calls": 20}, self.gw.log()[-1000:])
        r = self.get("/bomb/json-key")
        self.assertEqual(r.json(), {"text": False, "err": "not enough memory: the text would take the "
                                                          "scripts' heap past script_memory_limit_mb"}, r)
        self.assertLess(vm_hwm_mb(self.gw.proc.pid), 3 * LIMIT_MB + 150, self.gw.log())
        # and what fits is not refused: 16 bytes of a 20 MB string, a 5 MB page of small pieces
        self.assertEqual(self.get("/fits/format").json(), {"head": "q" * 16, "n": 5000000}, self.gw.log()[-1500:])

    def test_the_page_after_a_stop_does_not_pay_for_what_the_stopped_script_held(self):
        # the stopped script's 240 MB were held when the hook collected: the next look collects
        # again, and the next pages are served at once (they were stopped until the worker idled)
        self.assertProblem(self.get("/bomb/chain"), 500)
        self.assertIn("stopped: the scripts of this worker hold", self.gw.log())
        for _ in range(5):
            self.assertEqual(self.get("/product-page/42").status, 200, self.gw.log()[-1500:])
            self.assertEqual(self.get("/fits").json(), {"n": 8 * 2 ** 20})
        # two within a second (the hook collects again once a second, unless a stopped script held
        # more than the last look found live: a review of this fix)
        got = []
        for _ in range(2):
            self.assertProblem(self.get("/bomb/chain"), 500)
            got += [self.get("/product-page/42").status for _ in range(3)]
        self.assertEqual(got, [200] * 6, self.gw.log()[-1500:])

    def test_the_process_stays_near_the_limit(self):
        for path in ("/double", "/keep", "/double", "/keep"):
            self.assertProblem(self.get(path), 500)
        # the limit counts the Lua heap; the C side and the runtime add some tens of MB, garbage
        # not collected yet at most the limit again
        self.assertLess(vm_hwm_mb(self.gw.proc.pid), 3 * LIMIT_MB + 150, self.gw.log())


class ScriptMemoryLimitReload(GatewayTestCase):

    def test_a_load_that_passes_the_limit_is_not_stopped_by_the_memory_hook(self):
        # The load runs under the loader's own budget hook; the memory stop's hook used to replace
        # it, and a top level that looped once its pcall failed spun the reload for good.
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=repo_scripts(),
                   gateway_extra={"script_memory_limit_mb": 32})
        with open(os.path.join(self.scripts_dir, "bigload.lua"), "w") as f:
            f.write("local ok = pcall(function() local t = {} for i = 1, 1.3e6 do t[i] = { i } end end)\n"
                    "if not ok then while true do end end\n"
                    "return { route = 'GET /bigload', handler = function() return { status = 200, json = { ok = ok } } end }\n")
        self.gw.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_until(lambda: "reload: generation 2 serves new requests" in self.gw.log()
                                   or "reload failed" in self.gw.log(), 30), self.gw.log()[-2000:])
        self.assertEqual(self.get("/product-page/42").status, 200)


class ScriptMemoryLimitConfig(GatewayTestCase):

    def check(self, value):
        sdir = os.path.join(self.workdir, "cfg")
        write_scripts(sdir, repo_scripts(), gateway_lua(8080, {"product": {"url": "http://127.0.0.1:1"},
                                                               "reviews": {"url": "http://127.0.0.1:1"},
                                                               "inventory": {"url": "http://127.0.0.1:1"}},
                                                        script_memory_limit_mb=value))
        return run_aggway("check", "-c", sdir)

    def test_bad_values_are_reported_with_file_and_line(self):
        for v in (0, 15, 1.5, 1048577, "1GB", -64):
            r = self.check(v)
            self.assertNotEqual(r.returncode, 0, v)
            err = r.stderr.decode() + r.stdout.decode()
            self.assertIn("gateway.lua:", err)
            self.assertIn("script_memory_limit_mb: must be a whole number of megabytes from 16 to 1048576", err)

    def test_good_value_is_accepted(self):
        self.assertEqual(self.check(512).returncode, 0)


if __name__ == "__main__":
    main()
