"""The product page over every protocol the gateway speaks: HTTP/1.1, h2c with prior knowledge
(curl and nghttp), h2 over TLS negotiated with ALPN, and HTTP/1.1 over TLS. The page is the same
bytes whichever way it is asked for."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (UNHURRIED_DEADLINE_MS, UNHURRIED_PAGE, UNHURRIED_UPSTREAMS, GatewayTestCase,  # noqa: E402
                     demo_services, nghttp, main)


class Protocols(GatewayTestCase):

    def setUp(self):
        super().setUp()
        # the page with time to spare (harness.py): what is compared is the bytes over each protocol
        self.start(services=demo_services(product_ms=5, reviews_ms=10, inventory_ms=2), scripts=UNHURRIED_PAGE,
                   upstream_options=UNHURRIED_UPSTREAMS, deadline_ms=UNHURRIED_DEADLINE_MS, tls=True)
        self.reference = self.get("/product-page/42")
        self.assertEqual(self.reference.status, 200, self.reference)

    def assertSamePage(self, r):
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, self.reference.body)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "true", r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/json"), r)
        self.assertServerTiming(r.headers.get("server-timing", ""), r)

    def assertServerTiming(self, value, context):
        # each section and its duration, over every protocol (over HTTP/2 the field goes as a literal
        # without indexing: front/h2_head.h)
        self.assertRegex(value, r"^[a-z]+;dur=[0-9.]+(, [a-z]+;dur=[0-9.]+)*$", context)
        self.assertEqual(sorted(e.split(";")[0] for e in value.split(", ")), ["inventory", "product", "reviews"],
                         context)

    def test_product_page_over_http1_1(self):
        r = self.get("/product-page/42", "--http1.1")
        self.assertEqual(r.http_version, "1.1")
        self.assertSamePage(r)

    def test_product_page_over_h2c_prior_knowledge_with_curl(self):
        r = self.get_h2c("/product-page/42")
        self.assertEqual(r.http_version, "2", r)
        self.assertSamePage(r)

    def test_product_page_over_h2c_prior_knowledge_with_nghttp(self):
        status, headers, out = nghttp(self.url("/product-page/42"))
        self.assertEqual(status, 200, out)
        self.assertEqual(headers.get("x-aggregation-completed"), "true", out)
        self.assertIn(self.reference.body.decode(), out)

    def test_product_page_over_h2_with_tls_alpn(self):
        r = self.get_tls("/product-page/42", h2=True)
        self.assertEqual(r.http_version, "2", r)
        self.assertSamePage(r)

    def test_product_page_over_http1_1_with_tls(self):
        r = self.get_tls("/product-page/42", h2=False)
        self.assertEqual(r.http_version, "1.1", r)
        self.assertSamePage(r)

    def test_errors_are_problems_over_tls_too(self):
        r = self.get_tls("/nope", h2=True)
        self.assertEqual(r.status, 404, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/problem+json"), r)

    def test_several_requests_on_one_h2_connection_with_nghttp(self):
        # nghttp sends every URI given on one connection, as concurrent streams
        _status, _headers, out = nghttp(self.url("/product-page/1"), self.url("/product-page/2"),
                                        self.url("/product-page/3"), self.url("/nope"))
        statuses = re.findall(r"recv \(stream_id=\d+\) :status: (\d+)", out)
        self.assertEqual(sorted(statuses), ["200", "200", "200", "404"], out)
        # each page's Server-Timing, decoded by nghttp from one connection's HPACK state
        timings = re.findall(r"recv \(stream_id=\d+\) server-timing: (.*)", out)
        self.assertEqual(len(timings), 3, out)
        for t in timings:
            self.assertServerTiming(t.strip(), out)

    def test_the_front_runs_with_its_interpositions(self):
        # the executable defines libuv's uv_read_stop, uv_read_start, uv_write and uv_close,
        # glibc's __sprintf_chk and libh2o's h2o_hpack_flatten_response, h2o_mem_alloc_pool,
        # h2o_mem_clear_pool and h2o_http2_handle_upgrade for libh2o (front/read_pause.h,
        # inline_write.h, head_format.h, h2_head.h, mem_pool.h, h2c_upgrade.h), and a worker learns h2o's
        # read callback of a plain connection at its first one (front/inbuf.h);
        # a build that stopped exporting them would serve the same pages, slower or with bigger
        # buffers, and say so only in its log
        self.assertSamePage(self.get("/product-page/42", "--http1.1"))
        log = self.gw.log()
        self.assertNotIn("not interposed", log)
        syms = subprocess.run(["nm", "-D", "--defined-only", harness.AGGWAY_BIN], capture_output=True, text=True,
                              timeout=30)
        self.assertEqual(syms.returncode, 0, syms.stderr)
        for name in ("uv_read_stop", "uv_read_start", "uv_write", "uv_close", "__sprintf_chk",
                     "h2o_hpack_flatten_response", "h2o_mem_alloc_pool", "h2o_mem_clear_pool",
                     "h2o_http2_handle_upgrade"):
            self.assertRegex(syms.stdout, r"\bT %s\b" % name)

    def test_http1_keep_alive_serves_several_requests_on_one_connection(self):
        url = self.url("/product-page/42")
        from harness import curl
        r = curl(url, "--http1.1", "-o", "/dev/null", url, workdir=self.workdir)  # two URLs, one connection
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.mock.stats()["product"]["requests"], 3)


if __name__ == "__main__":
    main()
