"""A script that makes a lot of garbage within one entry into Lua is collected as it goes
(worker/gc.h: LuaJIT's automatic collector stays on): the request succeeds and the gateway's
memory does not grow with the garbage. With the collector stopped during entries, the same
request raised the peak RSS by more than 120 MB and ran into the script time limit.

No timing bound: the script time limit is raised so that a slow (sanitized, loaded) build has
all the time it needs; the assertions are on the status and on the peak RSS (VmHWM)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, endpoint, main  # noqa: E402

# three million small tables and strings, about 300 MB allocated in one entry, none of it kept
CHURN = endpoint("GET /churn", """
    local n = 0
    for i = 1, 3e6 do local t = { i, i + 1, tostring(i) } n = n + #t end
    return { status = 200, json = { n = n } }""", deadline_ms=60000)


def vm_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


class GarbageInOneEntry(GatewayTestCase):

    def test_garbage_made_in_one_entry_is_collected_as_it_goes(self):
        self.start(services={}, scripts={"churn.lua": CHURN}, deadline_ms=60000,
                   gateway_extra={"script_time_limit_ms": 60000})
        pid = self.gw.proc.pid
        r = self.get("/churn", timeout=120)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["n"], 9000000, r)
        before = vm_kb(pid, "VmRSS")
        r = self.get("/churn", timeout=120)
        self.assertEqual(r.status, 200, r)
        grown = vm_kb(pid, "VmHWM") - before
        # the garbage is about 300 MB; collected as it goes, the heap stays within a few cycles' worth
        self.assertLess(grown, 64 * 1024, "peak RSS grew by %d KB during one request" % grown)


if __name__ == "__main__":
    main()
