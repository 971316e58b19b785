"""Batched upstream system calls (io_uring, upstream/batch.h "Batched system calls").

The gateway batches each loop iteration's upstream writes and reads through io_uring when the
kernel allows it, and says so at start-up; AGGWAY_IO_URING=off makes one system call per
operation. Both ways serve the same pages byte for byte, under load as for one request; a value
other than on/off stops the start with a message that says what to write. (The whole integration
suite runs with the default; ctest runs the upstream fault and seed scenario suites again with
AGGWAY_IO_URING=off, see CMakeLists.txt.) On a kernel without io_uring the gateway says so and the
tests that need it are skipped, saying why."""
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGGWAY_BIN, UNHURRIED_DEADLINE_MS, UNHURRIED_PAGE, UNHURRIED_UPSTREAMS, GatewayTestCase,  # noqa: E402
                     curl, free_port, h2load, main)

HERE = os.path.dirname(os.path.abspath(__file__))


BATCHED = "upstream I/O: batched per loop iteration (io_uring)"
UNAVAILABLE = "upstream I/O: one system call per operation: "


class IoUring(GatewayTestCase):

    def start_with(self, value):
        saved = os.environ.get("AGGWAY_IO_URING")
        if value is None:
            os.environ.pop("AGGWAY_IO_URING", None)
        else:
            os.environ["AGGWAY_IO_URING"] = value
        try:
            self.start(scripts=UNHURRIED_PAGE, upstream_options=UNHURRIED_UPSTREAMS, deadline_ms=UNHURRIED_DEADLINE_MS,
                       workers=2)
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

    def test_a_value_other_than_on_or_off_stops_the_start(self):
        sdir = os.path.join(self.workdir, "scripts")
        os.makedirs(sdir)
        with open(os.path.join(sdir, "gateway.lua"), "w") as f:
            f.write("return { listen = { { host = \"127.0.0.1\", port = %d } }, workers = 1 }\n" % free_port())
        env = dict(os.environ, AGGWAY_IO_URING="yes")
        out = subprocess.run([AGGWAY_BIN, "serve", "-c", sdir], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=30, env=env)
        self.assertNotEqual(out.returncode, 0, out.stdout)
        self.assertIn(b"AGGWAY_IO_URING=yes: must be on or off (unset: on)", out.stdout)

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
