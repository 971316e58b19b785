"""Batched upstream system calls (io_uring, upstream/batch.h "Batched system calls").

The gateway batches each loop iteration's upstream writes and reads through io_uring when the
kernel allows it, and says so at start-up; AGGWAY_IO_URING=off makes one system call per
operation. Both ways serve the same pages byte for byte, under load as for one request; a value
other than on/off stops the start with a message that says what to write. (The whole integration
suite runs with the default; ctest runs the upstream fault and seed scenario suites again with
AGGWAY_IO_URING=off, see CMakeLists.txt.) On a kernel without io_uring the gateway says so and the
tests that need it are skipped, saying why."""
import json
import os
import re
import shutil
import subprocess
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2_client import H2Client  # noqa: E402
from harness import (AGGWAY_BIN, UNHURRIED_DEADLINE_MS, UNHURRIED_PAGE, UNHURRIED_UPSTREAMS, GatewayTestCase,  # noqa: E402
                     curl, free_port, h2load, main)

HERE = os.path.dirname(os.path.abspath(__file__))


BATCHED = "upstream I/O: batched per loop iteration (io_uring)"
UNAVAILABLE = "upstream I/O: one system call per operation: "


class IoUring(GatewayTestCase):

    def start_with(self, value, workers=2, gateway_extra=None):
        saved = os.environ.get("AGGWAY_IO_URING")
        if value is None:
            os.environ.pop("AGGWAY_IO_URING", None)
        else:
            os.environ["AGGWAY_IO_URING"] = value
        try:
            self.start(scripts=UNHURRIED_PAGE, upstream_options=UNHURRIED_UPSTREAMS, deadline_ms=UNHURRIED_DEADLINE_MS,
                       workers=workers, gateway_extra=gateway_extra)
            if value != "off" and UNAVAILABLE in self.gw.log():
                self.skipTest("the kernel gives no io_uring here: " + self.gw.log().split(UNAVAILABLE)[1].split("\n")[0])
        finally:
            if saved is None:
                os.environ.pop("AGGWAY_IO_URING", None)
            else:
                os.environ["AGGWAY_IO_URING"] = saved

    def pages_under_load(self):
        """The demo page once, then 2,000 of them over 16 connections (HTTP/1.1) and 8 h2c
        connections; returns the single page's body."""
        one = curl(self.url("/product-page/42"), workdir=self.workdir)
        self.assertEqual(one.status, 200, one)
        for section in ("product", "reviews", "inventory"):
            self.assertEqual(one.json()[section]["status"], "ok", one)
        for args in (["--h1", "-n", "2000", "-c", "16"], ["-n", "2000", "-c", "8", "-m", "10"]):
            r = h2load(self.url("/product-page/42"), *args)
            self.assertEqual(r.get("2xx"), 2000, r["output"])
            self.assertEqual(r.get("failed"), 0, r["output"])
        again = curl(self.url("/product-page/42"), workdir=self.workdir)
        self.assertEqual(again.body, one.body)
        return one.body

    def test_batched_by_default_and_says_so(self):
        self.start_with(None)
        self.assertIn(BATCHED, self.gw.log())
        self.pages_under_load()

    def test_off_gives_the_same_pages_with_one_system_call_each(self):
        self.start_with("off")
        self.assertNotIn(BATCHED, self.gw.log())
        self.assertEqual(self.gw.log().count("upstream I/O: one system call per operation (AGGWAY_IO_URING=off)"), 1)
        off = self.pages_under_load()
        self.gw.stop()
        self.gw = None
        top = self.workdir  # the second gateway's scripts and log go in a folder of their own
        self.workdir = os.path.join(top, "second")
        os.makedirs(self.workdir)
        try:
            self.start_with("on")
        finally:
            self.workdir = top
        self.assertIn(BATCHED, self.gw.log())
        self.assertEqual(self.pages_under_load(), off)

    def early_requests_of_a_burst(self, value):
        """20 pages (three calls each) on one h2c connection, every HEADERS frame in one write, so
        the worker starts them in one iteration of its loop, twice: the first burst leaves the
        upstreams' kept-alive connections the second one's calls take (a call on a new connection
        is written when its connect completes, never queued). Every page is answered 200 with its
        three sections. Returns how much aggway_upstream_early_requests_total (/metrics) rose over
        the second burst."""
        admin = free_port()
        self.start_with(value, workers=1, gateway_extra={"admin": {"port": admin}})

        def early():
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5) as r:
                text = r.read().decode()
            m = re.search(r"(?m)^aggway_upstream_early_requests_total (\d+)$", text)
            self.assertIsNotNone(m, text)
            return int(m.group(1))

        def burst():
            with H2Client(self.port) as c:
                c.start_plain()
                answers = c.get_many(["/product-page/%d" % (40 + i) for i in range(20)])
            for status, body in answers:
                self.assertEqual(status, 200, body)
                page = json.loads(body)
                for section in ("product", "reviews", "inventory"):
                    self.assertEqual(page[section]["status"], "ok", page)

        burst()
        before = early()
        burst()
        return early() - before

    def test_a_burst_of_pages_writes_its_calls_before_its_iteration_ends(self):
        """The 60 calls of 20 pages read together go out once 6 are queued, then 12 more, 24 more
        (upstream/batch.h agw_batch_send_early), not all at the iteration's end: at least the first
        early write happened (h2o may read the frames in more than one piece; each piece of two
        pages or more writes early). The pages are answered as without it."""
        early = self.early_requests_of_a_burst(None)
        self.assertGreaterEqual(early, 6)
        self.assertLessEqual(early, 60)

    def test_without_io_uring_no_request_is_written_early(self):
        """Without a ring a write may run a callback where the worker would call it: the burst's
        calls wait for the iteration's end, as before."""
        self.assertEqual(self.early_requests_of_a_burst("off"), 0)

    def test_a_value_other_than_on_or_off_stops_the_start(self):
        sdir = os.path.join(self.workdir, "scripts")
        os.makedirs(sdir)
        with open(os.path.join(sdir, "gateway.lua"), "w") as f:
            f.write("return { listen = { { host = \"127.0.0.1\", port = %d } }, workers = 1 }\n" % free_port())
        env = dict(os.environ, AGGWAY_IO_URING="yes")
        out = subprocess.run([AGGWAY_BIN, "serve", "-c", sdir], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=30, env=env)
        self.assertNotEqual(out.returncode, 0, out.stdout)
        self.assertIn(b"AGGWAY_IO_URING=yes: must be on or off (unset: on)\n", out.stdout)
        self.assertNotIn(b"(unset: on)\\n", out.stdout)  # one line, without a newline escaped in it

    @unittest.skipUnless(shutil.which("cc"), "needs a C compiler for the LD_PRELOAD shim")
    def test_a_ring_that_cannot_send_or_recv_falls_back_to_one_system_call_each(self):
        """io_uring_queue_init succeeds but the ring cannot run IORING_OP_SEND/RECV (Linux 5.1-5.5,
        where they do not exist yet, or a sandbox that filters io_uring operations; emulated by
        ring_without_send_recv.c): the gateway must not claim batching and fail every answer
        ("read failed (...)"), it must warn and serve as with AGGWAY_IO_URING=off (docs/operations.md,
        "Upstream client behaviour": older than 5.6 -> one system call per operation)."""
        shim = os.path.join(self.workdir, "ring_without_send_recv.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", shim, os.path.join(HERE, "ring_without_send_recv.c"),
                        "-ldl", "-luring"], check=True, timeout=120)
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "ASAN_OPTIONS", "AGGWAY_IO_URING")}
        os.environ["LD_PRELOAD"] = shim
        # the ASan build: the shim comes before the sanitizer runtime in the library list
        os.environ["ASAN_OPTIONS"] = (saved["ASAN_OPTIONS"] or "detect_leaks=0") + ":verify_asan_link_order=0"
        os.environ.pop("AGGWAY_IO_URING", None)
        try:
            self.start(scripts=UNHURRIED_PAGE, upstream_options=UNHURRIED_UPSTREAMS, deadline_ms=UNHURRIED_DEADLINE_MS, workers=1)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        r = curl(self.url("/product-page/42"), workdir=self.workdir)
        self.assertEqual(r.status, 200, r)
        page = r.json()
        for section in ("product", "reviews", "inventory"):
            self.assertEqual(page[section]["status"], "ok", r)
        self.assertNotIn(BATCHED, self.gw.log())
        self.assertIn("upstream I/O: one system call per operation", self.gw.log())


if __name__ == "__main__":
    main()
