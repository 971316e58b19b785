"""Every aggway-mock fault on an optional section (tools/mock/README.md, "Faults").

Given a page with a required Product and an optional Reviews section whose call may take up to
2500 ms, a fault on Reviews gives a 200 page with Product ok and Reviews `unavailable` with a
problem that says what went wrong. Faults that the gateway can see in the bytes (reset, short
body, garbage, not JSON, invalid UTF-8, body too large) fail the call at once, long before the
timeout; only silence (hang, slow drip) waits for it."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, endpoint, route, main  # noqa: E402

REVIEWS_TIMEOUT_MS = 2500
# "Fails fast": before the timeout. A call that waited for its timeout takes at least
# REVIEWS_TIMEOUT_MS - 5 ms; anything sooner failed without waiting, however slow the machine.
PROMPT_MS = REVIEWS_TIMEOUT_MS - 5
# A call with a 300 ms timeout (hang, drip) ends at it, plus a busy or sanitized machine's delay;
# without the timeout the page would wait for its deadline (PAGE_DEADLINE_MS), well above this.
TIMEOUT_SLACK_MS = 2000
PAGE_DEADLINE_MS = 5000

PAGE = endpoint("GET /page/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. id, required = true },
      reviews = { "reviews", "/reviews/" .. id },
    })""", deadline_ms=PAGE_DEADLINE_MS)

REVIEWS = {"sku": "SNK-{id}", "rating": 4.6, "top": [{"user": "a", "stars": 5, "text": "Great"}] * 40}


class ReviewsFault(GatewayTestCase):
    """Base: self.page_with_reviews(route fields) -> (response, reviews section)."""

    def start_with_reviews(self, upstream_options=None, **fields):
        opts = {"reviews": {"timeout_ms": REVIEWS_TIMEOUT_MS}, "product": {"timeout_ms": 2000}}
        for k, v in (upstream_options or {}).items():
            opts.setdefault(k, {}).update(v)
        self.start(services={
            "product": [route("/products/{id}", json={"id": "{id}", "name": "Sneaker"})],
            "reviews": [route("/reviews/{id}", json=REVIEWS, **fields)],
        }, scripts={"page.lua": PAGE}, upstream_options=opts)

    def page(self):
        r = self.get("/page/42")
        self.assertEqual(r.status, 200, r)
        page = r.json()
        self.assertEqual(page["product"]["status"], "ok", r)
        return r, page["reviews"]

    def assertUnavailable(self, section, kinds, status=502):
        self.assertEqual(section["status"], "unavailable", section)
        err = section["error"]
        kind = err["type"].rsplit(":", 1)[-1]
        self.assertIn(kind, kinds, err)
        self.assertEqual(err["status"], status, err)
        self.assertIsInstance(err.get("title"), str)

    def assertPrompt(self, r):
        self.assertLess(r.ms, PROMPT_MS, "the fault is visible in the bytes: the call must fail at once, "
                                         "not at its %d ms timeout" % REVIEWS_TIMEOUT_MS)


class ErrorStatus(ReviewsFault):
    def test_reviews_503_gives_unavailable_upstream_error_502(self):
        self.start_with_reviews(status=503, headers={"Retry-After": "1"})
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-error"])
        self.assertIn("503", s["error"]["title"] + s["error"].get("detail", ""))
        self.assertPrompt(r)


class Refused(ReviewsFault):
    def test_reviews_refusing_connections_gives_unavailable_unreachable(self):
        self.start_with_reviews()
        self.mock.refuse("reviews")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-unreachable"])
        self.assertPrompt(r)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false")


class Hang(ReviewsFault):
    def test_reviews_hang_gives_unavailable_timeout_at_the_call_timeout(self):
        self.start_with_reviews(fault="hang", upstream_options={"reviews": {"timeout_ms": 300}})
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-timeout"], status=504)
        self.assertGreaterEqual(r.ms, 300, r)
        self.assertLess(r.ms, 300 + TIMEOUT_SLACK_MS, r)


class ResetMidBody(ReviewsFault):
    def test_reviews_reset_mid_body_gives_unavailable_bad_response_fast(self):
        self.start_with_reviews(fault="reset")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-bad-response"])
        self.assertPrompt(r)


class ShortBody(ReviewsFault):
    def test_reviews_short_content_length_gives_unavailable_bad_response_fast(self):
        self.start_with_reviews(fault="short")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-bad-response"])
        self.assertPrompt(r)


class ChunkedWithTrailers(ReviewsFault):
    def test_reviews_chunked_with_trailers_is_ok_and_data_intact(self):
        self.start_with_reviews(fault="chunked")
        r, s = self.page()
        self.assertEqual(s["status"], "ok", s)
        self.assertEqual(s["data"]["sku"], "SNK-42")
        self.assertEqual(s["data"]["rating"], 4.6)
        self.assertEqual(len(s["data"]["top"]), 40)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "true")

    def test_reviews_chunked_connection_is_reused_afterwards(self):
        self.start_with_reviews(fault="chunked")
        for _ in range(5):
            _r, s = self.page()
            self.assertEqual(s["status"], "ok", s)
        self.assertEqual(self.mock.stats()["reviews"]["connections_total"], 1,
                         "a chunked answer with trailers ends cleanly: the connection stays in the pool")


class NonJson(ReviewsFault):
    def test_reviews_html_error_page_as_json_gives_unavailable_bad_json(self):
        self.start_with_reviews(fault="non_json")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-bad-json"])
        self.assertPrompt(r)


class InvalidUtf8(ReviewsFault):
    def test_reviews_invalid_utf8_gives_unavailable_bad_json_or_bad_response(self):
        self.start_with_reviews(fault="invalid_utf8")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-bad-json", "upstream-bad-response"])
        self.assertPrompt(r)


class HugeBody(ReviewsFault):
    def test_reviews_body_over_max_body_bytes_gives_unavailable_too_large_fast(self):
        self.start_with_reviews(fault="huge", huge_bytes=4 * 1024 * 1024,
                                upstream_options={"reviews": {"max_body_bytes": 64 * 1024}})
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-too-large"])
        self.assertPrompt(r)

    def test_reviews_body_under_max_body_bytes_is_ok(self):
        self.start_with_reviews(fault="huge", huge_bytes=32 * 1024,
                                upstream_options={"reviews": {"max_body_bytes": 64 * 1024}})
        _r, s = self.page()
        self.assertEqual(s["status"], "ok", s)
        self.assertEqual(len(s["data"]["items"]), (32 * 1024 - len('{"items":[]}') + 1) // 2)


class Garbage(ReviewsFault):
    def test_reviews_garbage_bytes_give_unavailable_bad_response_fast(self):
        self.start_with_reviews(fault="garbage")
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-bad-response"])
        self.assertPrompt(r)


class SlowDrip(ReviewsFault):
    def test_reviews_slow_drip_gives_unavailable_timeout(self):
        # one byte every 50 ms: the answer would take many seconds; the 300 ms timeout covers the
        # whole call, not the gap between bytes
        self.start_with_reviews(fault="drip", upstream_options={"reviews": {"timeout_ms": 300}})
        r, s = self.page()
        self.assertUnavailable(s, ["upstream-timeout"], status=504)
        self.assertGreaterEqual(r.ms, 300, r)
        self.assertLess(r.ms, 300 + TIMEOUT_SLACK_MS, r)


class IdleKeepAliveClose(ReviewsFault):
    """The mock closes each keep-alive connection 20 ms after answering; the gateway's pooled
    connection may be dead when it is reused. A reused connection that dies before the first
    response byte is retried once on a fresh one (DESIGN §3): clients never see it."""

    def test_reviews_closing_idle_connections_the_next_requests_still_succeed(self):
        self.start_with_reviews(fault="close_idle", idle_close_ms=20)
        for pause_ms in (0, 5, 15, 19, 20, 21, 25, 40, 100, 0, 20, 20, 22, 30):
            time.sleep(pause_ms / 1000.0)
            _r, s = self.page()
            self.assertEqual(s["status"], "ok", "after a %d ms pause: %s" % (pause_ms, s))
        self.assertEqual(self.log_errors(), [])

    def test_reviews_connection_closed_by_upstream_is_not_reused(self):
        self.start_with_reviews(fault="close_idle", idle_close_ms=1)
        for _ in range(5):
            time.sleep(0.05)
            r, s = self.page()
            self.assertEqual(s["status"], "ok", s)
            self.assertPrompt(r)


if __name__ == "__main__":
    main()
