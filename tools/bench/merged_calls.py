#!/usr/bin/env python3
"""Cost of merged calls (issue 19): the gateway's CPU (user + system, from /proc) per page and per
item for a page of N items asked for one by one, three ways, each loaded with h2load over one
connection (no page shares anything with another):
  merged  - N calls with batch = { … }: one upstream call GET /products?ids=1,…,N
  plain   - N calls GET /products/{id}: N upstream calls
  one     - one call GET /products?ids=1,…,N made by the script itself (the floor: what a hand-
            written merged call costs, with no per-item sections)
Run from the source tree after a build: python3 tools/bench/merged_calls.py [pages] [items]
(default 3000 pages of 10 items). CPU time on a shared machine is noisy; CALLGRIND=1 runs the
gateway under valgrind --tool=callgrind instead and prints instructions per page (a warm-up of
300 pages per kind with instrumentation off, then one dump per kind): the stable figure."""
import glob
import re
import subprocess
import time
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "integration"))
import harness  # noqa: E402
from harness import endpoint, h2load, route  # noqa: E402

PAGES = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
ITEMS = int(sys.argv[2]) if len(sys.argv) > 2 else 10

SCRIPTS = {
    "merged.lua": endpoint("GET /merged/{n}", """
    local calls = {}
    for i = 1, tonumber(req.params.n) do
      calls["item" .. i] = { "catalog", "/products", batch = { key = i, param = "ids", max = 100, window_ms = 0 } }
    end
    return agg.page(agg.fetch_all(calls))
"""),
    "plain.lua": endpoint("GET /plain/{n}", """
    local calls = {}
    for i = 1, tonumber(req.params.n) do calls["item" .. i] = { "catalog", "/products/" .. i } end
    return agg.page(agg.fetch_all(calls))
"""),
    "one.lua": endpoint("GET /one/{n}", """
    local ids = {}
    for i = 1, tonumber(req.params.n) do ids[i] = i end
    return agg.page(agg.fetch_all { items = { "catalog", "/products?ids=" .. table.concat(ids, ",") } })
"""),
}


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench(harness.GatewayTestCase):
    def runTest(self):
        if os.environ.get("CALLGRIND") == "1":
            return self.run_callgrind()
        self.start(services={"catalog": [
            route("/products", each="ids", json={"id": "{each}", "name": "p{each}"}),
            route("/products/{id}", json={"id": "{id}", "name": "p{id}"})]},
            scripts=SCRIPTS, upstream_options={"catalog": {"timeout_ms": 2000}})
        pid = self.gw.proc.pid
        print("%d pages of %d items each, one connection, h2load -c1 (gateway CPU from /proc):" % (PAGES, ITEMS))
        for name in ("merged", "plain", "one"):
            url = self.url("/%s/%d" % (name, ITEMS))
            h2load(url, "-n", "200", "-c", "1")          # warm-up: connections, JIT
            before_calls = sum(v for k, v in self.mock.hits()["catalog"].items() if k != "unmatched")
            c0 = cpu_s(pid)
            res = h2load(url, "-n", str(PAGES), "-c", "1")
            c1 = cpu_s(pid)
            calls = sum(v for k, v in self.mock.hits()["catalog"].items() if k != "unmatched") - before_calls
            if res.get("2xx") != PAGES:
                raise AssertionError(res["output"])
            us = (c1 - c0) * 1e6
            print("  %-6s %7.1f us CPU per page, %6.1f us per item, %5.2f upstream calls per page"
                  % (name, us / PAGES, us / PAGES / ITEMS, calls / PAGES))

    def run_callgrind(self):
        out = os.path.join(self.workdir, "cg")
        os.makedirs(out)
        real = harness.AGGWAY_BIN
        wrapper = os.path.join(self.workdir, "aggway-cg")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file "
                    "--callgrind-out-file=%s/callgrind.out %s \"$@\"\n" % (out, real))
        os.chmod(wrapper, 0o755)
        harness.AGGWAY_BIN = wrapper
        harness.START_TIMEOUT = max(harness.START_TIMEOUT, 60)
        try:
            self.start(services={"catalog": [
                route("/products", each="ids", json={"id": "{each}", "name": "p{each}"}),
                route("/products/{id}", json={"id": "{id}", "name": "p{id}"})]},
                scripts=SCRIPTS, upstream_options={"catalog": {"timeout_ms": 5000, "connect_timeout_ms": 5000}},
                deadline_ms=10000)
        finally:
            harness.AGGWAY_BIN = real
        pid = self.gw.proc.pid

        def ctl(*args):
            subprocess.run(["callgrind_control"] + list(args) + [str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                           check=True)
        print("%d pages of %d items each under callgrind, h2load -c1:" % (PAGES, ITEMS))
        for name in ("merged", "plain", "one"):
            url = self.url("/%s/%d" % (name, ITEMS))
            h2load(url, "-n", "300", "-c", "1", timeout=600)
            ctl("-i", "on")
            ctl("-z")
            res = h2load(url, "-n", str(PAGES), "-c", "1", timeout=1200)
            if res.get("2xx") != PAGES:
                raise AssertionError(res["output"])
            before = set(glob.glob(out + "/callgrind.out*"))
            ctl("-d", name)
            new = None
            for _ in range(100):
                new = set(glob.glob(out + "/callgrind.out*")) - before
                if new:
                    break
                time.sleep(0.1)
            f = sorted(new)[0]
            os.rename(f, os.path.join(out, "dump-" + name))
            with open(os.path.join(out, "dump-" + name)) as fh:
                text = fh.read()
            ir = int((re.search(r"^summary: *(\d+)", text, re.M) or re.search(r"^totals: *(\d+)", text, re.M)).group(1))
            ctl("-i", "off")
            print("  %-6s %9.0f instructions per page, %8.0f per item" % (name, ir / PAGES, ir / PAGES / ITEMS))


if __name__ == "__main__":
    r = unittest.TextTestRunner(verbosity=0).run(Bench())
    sys.exit(0 if r.wasSuccessful() else 1)
