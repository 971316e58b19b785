"""The gateway with libev linked in statically (build/aggway-static-libev, CMakeLists.txt) starts and
serves pages.

Linked that way, libev's symbols are not exported: nothing may look them up by name at run time.
The runtime reads the loop's clock on every page through the FFI; when it looked `ev_now` up by
name (`ffi.C.ev_now`), this build failed to start. It now calls it through a pointer C hands over
(`core.ev_now`). The test checks that the binary has no libev.so to find a name in, then serves the
demo page and the endpoint's deadline (both read that clock)."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import GatewayTestCase, demo_services, main, repo_scripts  # noqa: E402

STATIC_BIN = os.environ.get("AGGWAY_STATIC_LIBEV_BIN") or os.path.join(
    os.path.dirname(harness.AGGWAY_BIN), "aggway-static-libev")


class StaticLibev(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(STATIC_BIN, os.X_OK),
                        "%s was not built (CMakeLists.txt builds it when libev-dev's libev.a is there)" % STATIC_BIN)
        # the servers the harness starts run this binary for this test only
        saved = harness.AGGWAY_BIN
        harness.AGGWAY_BIN = STATIC_BIN
        self.addCleanup(setattr, harness, "AGGWAY_BIN", saved)

    def test_links_no_shared_libev(self):
        out = subprocess.run(["ldd", STATIC_BIN], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("libluajit", out.stdout)  # (ldd did list the shared libraries)
        self.assertNotIn("libev.so", out.stdout)
        syms = subprocess.run(["nm", "-D", STATIC_BIN], capture_output=True, text=True, timeout=30)
        self.assertNotRegex(syms.stdout, r"\bT ev_now\b")

    def test_serves_the_demo_page_and_its_deadline(self):
        self.start(services=demo_services(product_ms=20, reviews_ms=30, inventory_ms=10),
                   scripts=repo_scripts())
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r.body)
        page = r.json()
        for name in ("product", "reviews", "inventory"):
            self.assertEqual(page[name]["status"], "ok", r.body)
        # an upstream slower than the deadline: the page is answered at its deadline, by the clock
        # the runtime reads through the FFI
        self.mock.patch_route("reviews", {"path": "/reviews/{id}", "latency_ms": 3000})
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r.body)
        self.assertNotEqual(r.json()["reviews"]["status"], "ok", r.body)
        self.assertLess(r.time_total, 2.5, r.time_total)
        self.assertNotIn("runtime error", self.gw.log())


if __name__ == "__main__":
    main()
