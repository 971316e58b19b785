"""DESIGN §2.2 (the page contract) and §2.3 (JSON fidelity), end to end through the gateway."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, demo_services, endpoint, repo_scripts, route, main  # noqa: E402

# Three optional sections: the page is whatever of them answers.
ALL_OPTIONAL = endpoint("GET /all-optional/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product   = { "product", "/products/" .. id },
      reviews   = { "reviews", "/reviews/" .. id },
      inventory = { "inventory", "/stock/" .. id },
    })""", deadline_ms=1000)

# One section passed through untouched, for JSON fidelity.
PASS_THROUGH = endpoint("GET /raw/{id}", """
    return agg.page(agg.fetch_all { doc = { "product", "/doc/" .. req.params.id, required = true } })""")

# One section the script reads and changes (so the JSON goes through Lua tables and back).
TOUCHED = endpoint("GET /touched/{id}", """
    local res = agg.fetch_all { doc = { "product", "/doc/" .. req.params.id, required = true } }
    res.doc.data.zeta = res.doc.data.zeta + 1
    return agg.page(res)""")

# A page of a section spliced as bytes, one pretty-printed, one failed and a plain value: UNREAD
# returns it as agg.page made it (the transport writes it from its rows), READ after reading its
# body (written from the body's tables). Both must give the same bytes.
PAGE_OF_ALL_KINDS = """
    local res = agg.fetch_all { doc = { "product", "/doc/" .. req.params.id, required = true },
                                pretty = { "product", "/pretty" }, gone = { "product", "/gone" } }
    res.plain = { 1, "two", { three = 3 } }
    local p = agg.page(res)"""
UNREAD = endpoint("GET /unread/{id}", PAGE_OF_ALL_KINDS + """
    return p""")
READ = endpoint("GET /read/{id}", PAGE_OF_ALL_KINDS + """
    local _ = p.json.doc
    return p""")
PRETTY_DOC = b' {\n  "b" : [ 1 , 2.50 ] ,\n  "a" : "x, y : z"\n} '

# JSON the gateway must not bend, written in the compact form a JSON encoder gives: empty array
# and object, null, an integer beyond 2^53, int64 extremes, a real whose naive printing is
# 4.5999999999999996, keys out of alphabetical order, a NUL in a string, UTF-8 text, nesting.
FIDELITY_DOC = ('{"zeta":1,"alpha":[],"mid":{},"nothing":null,"big":9007199254740993,'
                '"neg":-9223372036854775807,"real":4.6,"tiny":1e-07,"third":0.1,"half":-0.5,'
                '"nul":"a\\u0000b","uni":"\u00e9\u4e2d\U0001F600","esc":"q\\"\\\\\\n\\t",'
                '"list":[[],{},null,true,false,0,-1,[[[1]]]],"obj":{"b":{"a":{}},"a":[null]}}').encode()

# The same kind of document with escapes a JSON encoder may write differently (\u00e9 may come out
# as the UTF-8 bytes, \/ as /): the value must be the same, not necessarily the bytes.
ESCAPED_DOC = b'{"uni":"\\u00e9\\u4e2d\\ud83d\\ude00","slash":"a\\/b","nul":"\\u0000","ctl":"\\u001f"}'


def mock_body(doc):
    return route("/doc/{id}", body=doc.decode(), content_type="application/json")


class CompletePage(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=5, reviews_ms=10, inventory_ms=1))

    def test_complete_page_says_x_aggregation_completed_true(self):
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("x-aggregation-completed"), "true", r)
        # its sections are fetched uncached: the page is no fresher than they are (RFC 9111, docs/operations.md "Caching")
        self.assertEqual(r.headers.get("cache-control"), "no-store", r)
        self.assertTrue(r.headers["content-type"].startswith("application/json"), r)

    def test_complete_page_server_timing_lists_each_call_with_a_duration(self):
        r = self.get("/product-page/42")
        entries = {}
        for part in r.headers.get("server-timing", "").split(","):
            name, _, dur = part.strip().partition(";dur=")
            entries[name] = float(dur)
        self.assertEqual(sorted(entries), ["inventory", "product", "reviews"], r)
        self.assertGreaterEqual(entries["reviews"], 10, r)
        self.assertGreaterEqual(entries["product"], 5, r)

    def test_complete_page_sections_are_status_then_data_in_sorted_order(self):
        r = self.get("/product-page/42")
        self.assertTrue(r.body.startswith(b'{"inventory":{"status":"ok","data":{'), r)
        self.assertLess(r.body.index(b'"product"'), r.body.index(b'"reviews"'))

    def test_same_upstream_answers_give_byte_identical_pages(self):
        bodies = {self.get("/product-page/42").body for _ in range(5)}
        bodies |= {self.get_h2c("/product-page/42").body for _ in range(2)}
        self.assertEqual(len(bodies), 1, bodies)


class DegradedPages(GatewayTestCase):

    def test_all_optional_sections_failing_gives_502(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0),
                   scripts={"all.lua": ALL_OPTIONAL})
        for svc in ("product", "reviews", "inventory"):
            self.mock.refuse(svc)
        r = self.get("/all-optional/1")
        p = self.assertProblem(r, 502)
        self.assertEqual({k: v["status"] for k, v in p["sections"].items()},
                         {"product": "unavailable", "reviews": "unavailable", "inventory": "unavailable"}, p)

    def test_all_optional_sections_timing_out_gives_504(self):
        hang = lambda path: [route(path, fault="hang")]  # noqa: E731
        self.start(services=demo_services(product_ms=hang("/products/{id}"), reviews_ms=hang("/reviews/{id}"),
                                          inventory_ms=hang("/stock/{id}")),
                   scripts={"all.lua": ALL_OPTIONAL},
                   upstream_options={"product": {"timeout_ms": 100}})
        r = self.get("/all-optional/1")
        p = self.assertProblem(r, 504)
        self.assertEqual(set(p["sections"]), {"product", "reviews", "inventory"}, p)

    def test_some_sections_failed_some_timed_out_none_answered_gives_502(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", fault="hang")],
                                          reviews_ms=0, inventory_ms=0),
                   scripts={"all.lua": ALL_OPTIONAL}, upstream_options={"product": {"timeout_ms": 100}})
        self.mock.refuse("reviews")
        self.mock.refuse("inventory")
        self.assertProblem(self.get("/all-optional/1"), 502)

    def test_one_optional_section_failing_gives_200_incomplete(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0),
                   scripts={"all.lua": ALL_OPTIONAL})
        self.mock.refuse("inventory")
        r = self.get("/all-optional/1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["inventory"]["status"], "unavailable")
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false")
        self.assertEqual(r.headers.get("cache-control"), "no-store")

    def test_required_section_upstream_404_is_passed_through_as_404(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", status=404, json={"error": "no such"})],
                                          reviews_ms=0, inventory_ms=0))
        p = self.assertProblem(self.get("/product-page/999"), 404)
        self.assertEqual(p["sections"]["product"]["error"]["status"], 404, p)
        self.assertIn("sections", p)

    def test_required_section_upstream_410_is_passed_through_as_410(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", status=410, json={"error": "gone"})],
                                          reviews_ms=0, inventory_ms=0))
        p = self.assertProblem(self.get("/product-page/999"), 410)
        self.assertEqual(p["sections"]["product"]["error"]["status"], 410, p)

    def test_required_section_upstream_500_gives_502(self):
        self.start(services=demo_services(product_ms=[route("/products/{id}", status=500, json={})],
                                          reviews_ms=0, inventory_ms=0))
        p = self.assertProblem(self.get("/product-page/1"), 502)
        self.assertTrue(p["sections"]["product"]["error"]["type"].endswith("upstream-error"), p)


# The upstream's response headers as a script reads them (result.headers): for a 2xx JSON body
# the gateway keeps them beside the body's text until a script asks; for anything else they come
# as they are. Names are lowercased; a repeated name is joined with ", " (RFC 9110 §5.3).
HEADERS_SEEN = endpoint("GET /headers/{kind}", """
    local r = agg.fetch_all { s = { "product", "/h/" .. req.params.kind } }.s
    local h = r.headers or {}
    return { status = 200, json = { ok = r.ok, ct = h["content-type"] or agg.null, tag = h["x-tag"] or agg.null,
                                    status = r.http_status or agg.null, data = r.ok and r.data or agg.null } }""")


class UpstreamResponseHeaders(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services={"product": [
            route("/h/json", json={"a": 1}, headers={"X-Tag": "blue"}),
            route("/h/text", body="plain words", content_type="text/plain", headers={"X-Tag": "green"}),
            route("/h/error", status=404, json={"missing": True}, headers={"X-Tag": "red"})]},
            scripts={"headers.lua": HEADERS_SEEN})

    def test_headers_of_a_json_answer_are_there_when_read(self):
        for get in (self.get, self.get_h2c):
            r = get("/headers/json")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json(), {"ok": True, "ct": "application/json", "tag": "blue", "status": 200,
                                        "data": {"a": 1}}, r)

    def test_headers_of_other_answers_are_there_too(self):
        r = self.get("/headers/text")
        self.assertEqual(r.json()["tag"], "green", r)
        self.assertEqual(r.json()["ct"], "text/plain", r)
        r = self.get("/headers/error")
        self.assertEqual(r.json()["tag"], "red", r)
        self.assertEqual(r.json()["status"], 404, r)
        self.assertFalse(r.json()["ok"], r)


class JsonFidelity(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services={"product": [mock_body(FIDELITY_DOC),
                                         route("/escaped", body=ESCAPED_DOC.decode(), content_type="application/json"),
                                         route("/scalar/{v}", body="{v}", content_type="application/json"),
                                         route("/pretty", body=PRETTY_DOC.decode(), content_type="application/json"),
                                         route("/gone", status=500, json={})]},
                   scripts={"raw.lua": PASS_THROUGH, "scalar.lua": endpoint("GET /scalar/{v}", """
    -- the mock puts the path segment into the body as it arrives: send it decoded
    return agg.page(agg.fetch_all { v = { "product", "/scalar/" .. agg.unescape(req.params.v) } })"""),
                            "touched.lua": TOUCHED, "unread.lua": UNREAD, "read.lua": READ,
                            "escaped.lua": endpoint("GET /escaped", """
    return agg.page(agg.fetch_all { doc = { "product", "/escaped" } })""")})

    def test_upstream_json_comes_out_of_the_page_byte_for_byte(self):
        r = self.get("/raw/1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, b'{"doc":{"status":"ok","data":' + FIDELITY_DOC + b'}}')

    def test_upstream_json_fidelity_over_h2_too(self):
        r = self.get_h2c("/raw/1")
        self.assertEqual(r.body, b'{"doc":{"status":"ok","data":' + FIDELITY_DOC + b'}}')

    def test_json_read_and_changed_by_the_script_keeps_everything_else(self):
        r = self.get("/touched/1")
        self.assertEqual(r.status, 200, r)
        expected = FIDELITY_DOC.replace(b'"zeta":1,', b'"zeta":2,')
        self.assertEqual(r.body, b'{"doc":{"status":"ok","data":' + expected + b'}}')

    def test_a_page_read_by_its_script_or_not_gives_the_same_bytes(self):
        unread, read = self.get("/unread/1"), self.get("/read/1")
        self.assertEqual((unread.status, read.status), (200, 200), (unread, read))
        self.assertEqual(unread.body, read.body)
        self.assertEqual(unread.headers.get("x-aggregation-completed"), "false", unread)
        self.assertEqual(read.headers.get("x-aggregation-completed"), "false", read)
        self.assertTrue(unread.body.startswith(b'{"doc":{"status":"ok","data":' + FIDELITY_DOC + b'},'
                                               b'"gone":{"status":"unavailable","error":{'), unread)
        self.assertTrue(unread.body.endswith(b'"plain":{"status":"ok","data":[1,"two",{"three":3}]},'
                                             b'"pretty":{"status":"ok","data":{"b":[1,2.50],"a":"x, y : z"}}}'),
                        unread)

    def test_escaped_strings_keep_their_value(self):
        r = self.get("/escaped")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["doc"]["data"], json.loads(ESCAPED_DOC), r)

    def test_top_level_scalars_and_arrays_are_valid_sections(self):
        for v in ("null", "true", "42", "-0.5", "%5B%5D", "%7B%7D", "%22s%22"):
            r = self.get("/scalar/" + v)
            self.assertEqual(r.status, 200, (v, r))
            expected = {"null": "null", "true": "true", "42": "42", "-0.5": "-0.5", "%5B%5D": "[]",
                        "%7B%7D": "{}", "%22s%22": '"s"'}[v]
            self.assertEqual(r.body, b'{"v":{"status":"ok","data":' + expected.encode() + b'}}', v)


if __name__ == "__main__":
    main()
