"""Routing (404 / 405 with Allow, as problem+json) and script errors: a failing script gives a
clean 500 problem that hides the Lua message from the client, logs file:line, and leaves the
worker serving."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, demo_services, endpoint, repo_scripts, main  # noqa: E402

SECRET = "secret-lua-error-text-4711"

SCRIPTS = dict(repo_scripts(), **{
    # line 6 of boom.lua raises
    "boom.lua": endpoint("GET /boom", """
    error("%s")""" % SECRET),
    "nil-index.lua": endpoint("GET /nil-index", """
    local t = nil
    return t.field"""),
    # LuaJIT cannot yield across a table.sort comparator: agg.fetch inside one must fail cleanly
    "sort.lua": endpoint("GET /sort-yield", """
    local t = { 3, 1, 2 }
    table.sort(t, function(a, b)
      agg.fetch { "product", "/products/1" }
      return a < b
    end)
    return { status = 200, json = t }"""),
    "gsub.lua": endpoint("GET /gsub-yield", """
    local s = ("abc"):gsub("b", function(c) return agg.fetch({ "product", "/products/1" }).data.name end)
    return { status = 200, body = s }"""),
    # the name is made at run time: aggway check refuses a literal unknown upstream at load
    "unknown-upstream.lua": endpoint("GET /unknown-upstream", """
    local res = agg.fetch_all { x = { ("nosuch" .. "service"), "/x" } }
    return agg.page(res)"""),
    # the error's text is the client's: a decoded %0A in it must not start a log line
    "echo-error.lua": endpoint("GET /echo-error", """
    error("bad word: " .. agg.unescape(req.query.w or ""))"""),
    "bad-return.lua": endpoint("GET /bad-return", """
    return 42"""),
    "continuation.lua": endpoint("GET /continuation-error", """
    return agg.page(agg.fetch_all {
      product = { "product", "/products/1" },
      reviews = agg.fetch_then("product", function(p) error("%s in continuation") end),
    })""" % SECRET),
    "methods.lua": 'local agg = require "agg"\nreturn {\n'
                   '  { route = "PUT /things/{id}", handler = function(req) return { status = 204 } end },\n'
                   '  { route = "DELETE /things/{id}", handler = function(req) return { status = 204 } end },\n'
                   '}\n',
})


class Routing(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=SCRIPTS)

    def test_unknown_path_gives_404_problem(self):
        p = self.assertProblem(self.get("/no/such/page"), 404)
        self.assertIn("title", p)

    def test_route_parameter_must_fill_a_whole_segment(self):
        self.assertProblem(self.get("/product-page/42/extra"), 404)
        self.assertProblem(self.get("/product-page/"), 404)

    def test_wrong_method_gives_405_problem_with_allow(self):
        r = self.get("/product-page/42", "-X", "POST", "-d", "{}")
        self.assertProblem(r, 405)
        self.assertEqual(r.headers.get("allow"), "GET, HEAD", r)  # a GET route answers HEAD too

    def test_405_allow_lists_every_method_of_the_path(self):
        r = self.get("/things/1")
        self.assertProblem(r, 405)
        methods = sorted(m.strip() for m in r.headers.get("allow", "").split(","))
        self.assertEqual(methods, ["DELETE", "PUT"], r)

    def test_404_and_405_over_h2_too(self):
        self.assertProblem(self.get_h2c("/no/such/page"), 404)
        self.assertProblem(self.get_h2c("/product-page/1", "-X", "DELETE"), 405)


class ScriptErrors(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=SCRIPTS)

    def test_script_error_gives_500_problem_without_the_lua_message(self):
        r = self.get("/boom")
        p = self.assertProblem(r, 500)
        self.assertNotIn(SECRET.encode(), r.body)
        self.assertNotIn(b"boom.lua", r.body)
        self.assertNotIn(b"stack traceback", r.body)
        self.assertTrue(p["type"].endswith("script-error"), p)

    def test_script_error_is_logged_with_file_and_line(self):
        self.get("/boom")
        log = self.gw.log()
        self.assertRegex(log, r"boom\.lua:6: " + SECRET, log)
        self.assertTrue(any("GET /boom" in l for l in self.log_errors()), log)

    def test_script_error_traceback_is_one_readable_log_line(self):
        self.get("/boom")
        lines = [l for l in self.log_errors() if "script error in GET /boom" in l]
        self.assertEqual(len(lines), 1, self.gw.log())        # one record per event
        line = lines[0]
        # the frames follow the message on the same line, " | " between them, no literal "\n"
        self.assertRegex(line, SECRET + r" \| stack traceback: \| .*boom\.lua:6: in function", line)
        self.assertNotIn("\\n", line)
        self.assertNotIn("\t", line)

    def test_a_newline_the_client_sent_stays_escaped_in_the_traceback_line(self):
        self.get("/echo-error?w=x%0Aerror%20forged")
        log = self.gw.log()
        self.assertNotRegex(log, r"(?m)^error forged", log)
        lines = [l for l in self.log_errors() if "script error in GET /echo-error" in l]
        self.assertEqual(len(lines), 1, log)
        self.assertIn("bad word: x\\nerror forged | stack traceback: | ", lines[0])

    def test_nil_index_error_gives_500_and_is_logged_with_line(self):
        r = self.get("/nil-index")
        self.assertProblem(r, 500)
        self.assertNotIn(b"attempt to index", r.body)
        self.assertRegex(self.gw.log(), r"nil-index\.lua:7: attempt to index")

    def test_worker_keeps_serving_after_script_errors(self):
        for _ in range(20):
            self.assertEqual(self.get("/boom").status, 500)
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["product"]["status"], "ok")

    def test_fetch_inside_table_sort_comparator_gives_clean_500_not_a_hang(self):
        r = self.get("/sort-yield", timeout=5)
        self.assertNotEqual(r.exit_code, 28, "the request hung")
        self.assertProblem(r, 500)
        self.assertRegex(self.gw.log(), r"sort\.lua:8: agg\.fetch cannot wait here")
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_fetch_inside_gsub_callback_gives_clean_500_not_a_hang(self):
        r = self.get("/gsub-yield", timeout=5)
        self.assertNotEqual(r.exit_code, 28, "the request hung")
        self.assertProblem(r, 500)
        self.assertEqual(self.get("/product-page/42").status, 200)

    def test_call_to_unknown_upstream_gives_500_and_a_log_line_naming_it(self):
        r = self.get("/unknown-upstream")
        self.assertProblem(r, 500)
        self.assertNotIn(b"nosuchservice", r.body)
        lines = [l for l in self.log_errors() if "nosuchservice" in l]
        self.assertTrue(lines, self.gw.log())
        self.assertRegex(self.gw.log(), r"unknown-upstream\.lua:6: unknown upstream 'nosuchservice'")

    def test_handler_returning_a_non_response_gives_500(self):
        self.assertProblem(self.get("/bad-return"), 500)
        self.assertTrue(self.log_errors(), self.gw.log())

    def test_error_in_a_continuation_fails_that_section_only(self):
        r = self.get("/continuation-error")
        self.assertEqual(r.status, 200, r)
        page = r.json()
        self.assertEqual(page["product"]["status"], "ok")
        self.assertEqual(page["reviews"]["status"], "unavailable")
        self.assertTrue(page["reviews"]["error"]["type"].endswith("script-error"), page)
        self.assertNotIn(SECRET.encode(), r.body)
        self.assertRegex(self.gw.log(), r"continuation\.lua:8: " + SECRET)


class ScriptErrorsWithTwoWorkers(GatewayTestCase):

    def test_two_workers_keep_serving_after_script_errors(self):
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=SCRIPTS, workers=2)
        for _ in range(10):
            self.assertEqual(self.get("/boom").status, 500)
            self.assertEqual(self.get("/sort-yield", timeout=5).status, 500)
        for _ in range(10):
            self.assertEqual(self.get("/product-page/42").status, 200)


if __name__ == "__main__":
    main()
