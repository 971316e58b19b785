"""DESIGN §1 rows 1-4: the seed's worked examples, reproduced with the mock upstream and the
repository's own scripts (scripts/product-page.lua and scripts/product-detail.lua).

Timing claims hold on a loaded 2-core machine and under ASan: the lower bound is the slowest
call (the gateway cannot answer before it), the upper bound sits well below the sequential sum,
and the fastest of a few runs is taken (load can only make a run slower)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, demo_services, route, main  # noqa: E402


def server_timing(r):
    """Server-Timing "a;dur=1.0, b;dur=2.0" -> {"a": 1.0, "b": 2.0}."""
    out = {}
    for part in r.headers.get("server-timing", "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, rest = part.partition(";")
        dur = [p for p in rest.split(";") if p.strip().startswith("dur=")]
        out[name.strip()] = float(dur[0].strip()[4:]) if dur else None
    return out


class ParallelFanOut(GatewayTestCase):
    """Row 1: Product 40 ms, Reviews 80 ms, Inventory 30 ms in parallel."""

    def test_fan_out_40_80_30_answers_in_about_80ms_not_150(self):
        self.start(services=demo_services(product_ms=40, reviews_ms=80, inventory_ms=30))
        self.get("/product-page/42")                       # warm the upstream pools
        # the fastest complete page of a few: the demo gives Reviews (80 ms) 100 ms, which a busy
        # machine now and then runs out (a degraded page, the section's own behaviour); the timing
        # claim is about a page whose three calls answered
        runs = [self.get("/product-page/42") for _ in range(5)]
        complete = [x for x in runs if x.status == 200 and x.headers.get("x-aggregation-completed") == "true"]
        self.assertTrue(complete, runs)
        r = min(complete, key=lambda x: x.time_total)
        self.assertEqual(r.status, 200, r)
        self.assertGreaterEqual(r.ms, 80, "the page cannot come before the slowest call (Reviews, 80 ms)")
        # sequential calls would take at least the sum of what each took in this run (150 ms on a
        # quiet machine; each call's own time, from Server-Timing, grows as a busy machine slows it)
        took = server_timing(r)
        self.assertLess(r.ms, sum(took.values()), "the calls must run in parallel: %r" % r)
        page = r.json()
        self.assertEqual([page[k]["status"] for k in ("product", "reviews", "inventory")], ["ok"] * 3)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "true")

    def test_fan_out_page_drops_the_description_as_the_script_says(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0))
        page = self.get("/product-page/42").json()
        self.assertEqual(page["product"]["data"], {"id": 42, "name": "Sneaker", "price": 89, "sku": "SNK-42"})
        self.assertEqual(page["inventory"]["data"], {"productId": 42, "inStock": 12, "warehouse": "BKK-1"})


class DependentChain(GatewayTestCase):
    """Row 2: Reviews needs Product's SKU (Product 45, Reviews 85); Inventory runs beside the chain."""

    def test_chain_45_then_85_answers_in_about_130ms(self):
        self.start(services=demo_services(product_ms=45, reviews_ms=85, inventory_ms=30))
        self.get("/product-detail/42")
        r = self.fastest_of(3, "/product-detail/42")
        self.assertEqual(r.status, 200, r)
        self.assertGreaterEqual(r.ms, 130, "Reviews cannot start before Product answered (45 + 85 ms)")
        # about the chain's time: Inventory (30 ms) adds nothing, so the page comes before the
        # three calls' own times in this run (Server-Timing) would end one after the other
        took = server_timing(r)
        self.assertLess(r.ms, sum(took.values()), r)
        page = r.json()
        self.assertEqual(page["reviews"]["status"], "ok", r)
        self.assertEqual(page["reviews"]["data"]["sku"], "SNK-42", "Reviews was called with Product's SKU")
        self.assertEqual(page["inventory"]["status"], "ok", r)
        timing = server_timing(r)
        self.assertEqual(sorted(timing), ["inventory", "product", "reviews"], r)

    def test_chain_reviews_are_asked_for_the_sku_product_returned(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0))
        self.mock.reset()
        self.assertEqual(self.get("/product-detail/7").status, 200)
        hits = self.mock.hits()
        self.assertEqual(hits["reviews"].get("GET /reviews"), 1, hits)
        self.assertEqual(hits["reviews"].get("GET /reviews/{id}", 0), 0, hits)

    def test_chain_inventory_runs_beside_the_chain_not_after_product(self):
        # Inventory 130 ms: started with Product it ends with the chain (≈ 130 ms); started after
        # Product it would end at 175 ms; after the chain, at 260 ms.
        self.start(services=demo_services(product_ms=45, reviews_ms=85, inventory_ms=130),
                   upstream_options={"inventory": {"timeout_ms": 1000}})
        self.get("/product-detail/42")
        r = self.fastest_of(3, "/product-detail/42")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["inventory"]["status"], "ok", r)
        self.assertGreaterEqual(r.ms, 130, r)
        # started after Product, Inventory would end at Product's time plus its own, as each took
        # in this run (Server-Timing; 175 ms on a quiet machine, more on a busy one)
        took = server_timing(r)
        self.assertLess(r.ms, took["product"] + took["inventory"], "Inventory must start at once, beside Product, not after it: %r" % r)

    def test_chain_with_product_failing_gives_dependency_failed_reviews_and_no_reviews_call(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", status=500, json={"e": 1})],
                                          reviews_ms=0, inventory_ms=0))
        self.mock.reset()
        r = self.get("/product-detail/42")
        p = self.assertProblem(r, 502)
        self.assertEqual(p["sections"]["product"]["status"], "unavailable", p)
        self.assertEqual(p["sections"]["reviews"]["status"], "unavailable", p)
        self.assertTrue(p["sections"]["reviews"]["error"]["type"].endswith("dependency-failed"), p)
        self.assertEqual(self.mock.hits()["reviews"].get("GET /reviews", 0), 0)


class DeadlineWithHangingReviews(GatewayTestCase):
    """Row 3: deadline 200 ms, Product required (150 ms cap), Reviews and Inventory optional
    (100 ms caps), Reviews hangs: 200 with reviews unavailable at ≈ 100 ms, not after 200 ms."""

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(
            product_ms=40, inventory_ms=30,
            reviews_ms=[route("/reviews/{id}", fault="hang")]))

    def test_reviews_hang_page_still_200_at_about_100ms(self):
        r = self.fastest_of(3, "/product-page/42")
        self.assertEqual(r.status, 200, r)
        self.assertGreaterEqual(r.ms, 100, "Reviews' 100 ms cap must be waited out")
        self.assertLess(r.ms, 190, "the page must not wait for the 200 ms deadline")

    def test_reviews_hang_section_is_unavailable_with_a_504_timeout_problem(self):
        r = self.get("/product-page/42")
        page = r.json()
        self.assertEqual(page["product"]["status"], "ok", r)
        self.assertEqual(page["inventory"]["status"], "ok", r)
        self.assertEqual(page["reviews"]["status"], "unavailable", r)
        err = page["reviews"]["error"]
        self.assertEqual(err["status"], 504, err)
        self.assertTrue(err["type"].endswith("upstream-timeout"), err)
        self.assertIn("title", err)
        self.assertNotIn("data", page["reviews"])

    def test_reviews_hang_page_is_marked_incomplete_and_not_cacheable(self):
        r = self.get("/product-page/42")
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false", r)
        self.assertEqual(r.headers.get("cache-control"), "no-store", r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/json"), r)


class RequiredSectionFails(GatewayTestCase):
    """Row 4: Product refuses connections / times out -> 502 / 504 problem+json."""

    def test_product_refusing_connections_gives_502_problem_with_sections(self):
        # fail fast: Reviews and Inventory are cancelled when Product refuses, and the 502 comes at
        # once (the issue measured 82 ms before, after the demo's Reviews). They answer after 1 s
        # here, past their 100 ms timeouts (scripts/product-page.lua), so a page that waited for
        # either would take 100 ms at least and show it timed out, not cancelled: the bound below
        # is that, not a guess at how fast a loaded machine is
        self.start(services=demo_services(product_ms=0, reviews_ms=1000, inventory_ms=1000))
        self.mock.refuse("product")
        r = self.fastest_of(3, "/product-page/42")
        p = self.assertProblem(r, 502)
        self.assertIn("sections", p)
        self.assertEqual(p["sections"]["product"]["status"], "unavailable", p)
        self.assertTrue(p["sections"]["product"]["error"]["type"].endswith("upstream-unreachable"), p)
        for s in ("reviews", "inventory"):
            self.assertEqual(p["sections"][s]["status"], "unavailable", p)
            self.assertTrue(p["sections"][s]["error"]["type"].endswith("call-cancelled"), p)
        self.assertEqual(r.headers.get("cache-control"), "no-store", r)
        self.assertLess(r.ms, 100, "a refused connection fails the page at once, before the other calls end")

    def test_product_refusing_then_accepting_recovers(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0))
        self.assertEqual(self.get("/product-page/42").status, 200)
        self.mock.refuse("product")
        self.assertEqual(self.get("/product-page/42").status, 502)
        self.mock.accept("product")
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_product_timing_out_gives_504_problem_at_about_150ms(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", fault="hang")],
                                          reviews_ms=0, inventory_ms=0))
        r = self.fastest_of(3, "/product-page/42")
        p = self.assertProblem(r, 504)
        self.assertTrue(p["sections"]["product"]["error"]["type"].endswith("upstream-timeout"), p)
        self.assertEqual(p["sections"]["product"]["error"]["status"], 504, p)
        self.assertGreaterEqual(r.ms, 150, r)
        self.assertLess(r.ms, 190, "Product's 150 ms cap, not the 200 ms deadline")


if __name__ == "__main__":
    main()
