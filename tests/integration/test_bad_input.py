"""Bad input of every kind: what a hostile or broken client, upstream or script can send, and the
answers that must stay well-formed HTTP. Each test names the finding it guards.

Found by the robustness pass; at the time of writing these fail on the current build (bugs):
  ScriptResponseFraming.*                        (scripts can break HTTP/1.1 and HTTP/2 framing)
  RouteParamTraversal.test_encoded_slash_*       (%2F in a route param reaches upstreams as '/')
  ClientRequestFraming.test_obs_fold_*           (obs-fold gives a header with an empty name)
  ClientRequestFraming.test_conflicting_*        (two different Content-Length values accepted)
  UpstreamFraming.test_upstream_204_*            (204 with Content-Length waits for a body)
  UpstreamFraming.test_upstream_status_000_*     (status < 100 waits like a 1xx until timeout)
Found by the second pass (upstreams that lie):
  UpstreamFraming.test_interim_response_with_*   (a 1xx with Content-Length eats the final answer)
  UpstreamFraming.test_unasked_101_*             (a 101 is waited past until the timeout)
  UpstreamFraming.test_bytes_after_a_response_*  (stale bytes become a dependent call's answer)
  UpstreamFraming.test_answer_before_a_large_*   (an early 413 is a timeout or a reset)
  UpstreamFraming.test_upstream_json_at_the_*    (JSON at the depth limit fails the page once read)
  ScriptIsolation.test_a_script_that_*           (one script rewriting the agg module breaks all)
  PortInUse.test_second_gateway_*                (SO_REUSEPORT: a second gateway shares the port)
"""
import os
import unittest
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGGWAY_BIN, SLOW, GatewayTestCase, demo_services, endpoint, free_port,  # noqa: E402
                     gateway_lua, h2c_fields, nghttp, repo_scripts, route, stop_process, write_scripts, main)


# ---------------------------------------------------------------------------------------------
# raw HTTP/1.1 helpers

def raw_exchange(port, data, wait=2.0):
    """Sends data on one connection; returns every byte received within wait seconds (until EOF)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    try:
        s.sendall(data)
        out = b""
        end = time.monotonic() + wait
        while time.monotonic() < end:
            s.settimeout(max(0.05, end - time.monotonic()))
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not d:
                break
            out += d
        return out
    finally:
        s.close()


def split_responses(data):
    """Splits HTTP/1.1 responses the way an RFC 9112 client frames them: 1xx, 204 and 304 have no
    body; otherwise Content-Length. Returns a list of (status, [(name, value)], body)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            out.append((None, [], data))      # not a response: framing is broken
            break
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
        if not m:
            out.append((None, [], data))
            break
        status = int(m.group(1))
        headers = [tuple(x.strip() for x in l.split(":", 1)) for l in lines[1:] if ":" in l]
        if 100 <= status < 200 or status in (204, 304):
            n = 0
        else:
            cls = [v for k, v in headers if k.lower() == "content-length"]
            n = int(cls[0]) if cls else len(rest)
        out.append((status, headers, rest[:n]))
        data = rest[n:]
    return out


def get_pipelined(port, *paths, wait=2.0):
    req = b"".join(b"GET " + p.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n" for p in paths)
    return split_responses(raw_exchange(port, req, wait=wait))


# ---------------------------------------------------------------------------------------------
# scripts

SCRIPT_RESPONSES = endpoint("GET /ok", "    return { status = 200, body = \"ok\" }")
BAD_RESPONSES = 'local agg = require "agg"\nreturn {\n' + ",\n".join(
    '  { route = "GET %s", handler = function(req) return %s end }' % (r, v) for r, v in [
        ("/s204", '{ status = 204, body = "x" }'),
        ("/s304", '{ status = 304, body = "x" }'),
        ("/s100", '{ status = 100, body = "x" }'),
        ("/s101", '{ status = 101, body = "x" }'),
        ("/content-length", '{ status = 200, headers = { ["content-length"] = "1000" }, body = "x" }'),
        ("/transfer-encoding", '{ status = 200, headers = { ["transfer-encoding"] = "chunked" }, body = "x" }'),
        ("/connection", '{ status = 200, headers = { ["connection"] = "close", ["keep-alive"] = "timeout=1", '
                        '["upgrade"] = "h2c" }, body = "x" }'),
        ("/bad-names", '{ status = 200, headers = { ["x-a\\0b"] = "1", ["x a"] = "2", ["x:a"] = "3", '
                       '["x-ok"] = "4", ["x\\r\\nforged"] = "5" }, body = "x" }'),
        ("/bad-values", '{ status = 200, headers = { ["x-ctl"] = "a\\1b", ["x-del"] = "a\\127b", '
                        '["x-tab"] = "a\\tb", ["x-pad"] = " \\t padded\\t ", ["x-utf8"] = "caf\\195\\169", '
                        '["x-long"] = string.rep("v", 9000), ["x-fits"] = string.rep("v", 8192) }, body = "x" }'),
        ("/many-headers", '(function() local h = {} for i = 1, 5000 do h["x-h" .. i] = "v" end '
                          'return { status = 200, headers = h, body = "x" } end)()'),
        ("/spellings", '{ status = 200, headers = { ["Content-Type"] = "text/csv", ["content-type"] = "text/plain", '
                       '["CONTENT-TYPE"] = "text/html" }, body = "x" }'),
        ("/many-bad", '(function() local h = { ["x-ok"] = "1" } for i = 1, 20 do h["x bad " .. i] = "v" end '
                      'return { status = 200, headers = h, body = "x" } end)()'),
        ("/counter-bad/{n}", '{ status = 200, headers = { ["x bad " .. req.params.n] = "v", ["x-ok"] = "1" }, '
                             'body = "x" }'),
        ("/odd-types", '{ status = 200, headers = setmetatable({ [1] = "one", [true] = "t", [{}] = "tab", '
                       '["x-num"] = 5, ["x-bool"] = true, ["x-tab"] = {}, ["x-fn"] = tostring, ["x-ok"] = "1", '
                       '["x-\226\130\172"] = "euro" }, { __index = function() error("index") end, '
                       '__pairs = function() error("pairs") end, __len = function() error("len") end, '
                       '__newindex = function() error("newindex") end }), body = "x" }'),
        ("/cookies", '{ status = 200, headers = { ["Set-Cookie"] = { "a=1; Path=/", "b=2; Path=/" } }, body = "x" }'),
        ("/date-server", '{ status = 200, headers = { Date = "Thu, 01 Jan 2015 00:00:00 GMT", '
                         'Server = "catalog/1.0", server = "other" }, body = "x" }'),
    ]) + "\n}\n"

# agg.page with extra headers in several spellings, including ones the page contract sets itself
PAGE_HEADERS = ('local agg = require "agg"\n'
                'local extra = { ["Content-Type"] = "application/vnd.page+json", ["content-type"] = "text/plain", '
                '["Cache-Control"] = "max-age=60", ["cache-control"] = "no-cache", Server = "catalog/1.0", '
                'Date = "Thu, 01 Jan 2015 00:00:00 GMT" }\n'
                'return {\n'
                '  { route = "GET /page-headers/{id}", handler = function(req)\n'
                '      return agg.page(agg.fetch_all { product = { "product", "/products/" .. req.params.id } },\n'
                '                      { headers = extra }) end },\n'
                '  { route = "GET /page-headers-failed", handler = function(req)\n'
                '      return agg.page(agg.fetch_all { product = { "product", "/nowhere", required = true } },\n'
                '                      { headers = extra }) end },\n'
                '}\n')

ECHO = endpoint("GET /echo/{p}", """
    local names = {}
    for k in pairs(req.headers) do names[#names + 1] = k end
    table.sort(names)
    return { status = 200, json = { params = req.params, header_names = agg.array(names) } }""")

POST = endpoint("POST /post", """
    return { status = 200, json = { len = req.body and #req.body or 0 } }""")


WARN_REPEAT_S = 10.0   # a worker writes one header warning at most once per 10 s (worker_core.c)


def warning_intervals(t0):
    """How many times one warning may be written since t0 (time.monotonic()): once per started
    interval. 30 requests take well under 10 s on a quiet machine, over 10 s beside two busy loops;
    without the limit they would write 30 lines."""
    return 1 + int((time.monotonic() - t0) // WARN_REPEAT_S)


class ScriptResponseFraming(GatewayTestCase):
    """A handler's status and headers must never produce a response that clients mis-frame:
    no body (and no Content-Length) on 204/304, no 1xx as a final status, and no framing or
    connection-specific headers (content-length, transfer-encoding, connection, keep-alive,
    upgrade) copied from the script next to the gateway's own."""

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0),
                   scripts={"ok.lua": SCRIPT_RESPONSES, "bad.lua": BAD_RESPONSES, "page.lua": PAGE_HEADERS})

    def fields_over_both(self, path):
        """[(protocol, status, [(name, value)] as received)] of GET path over HTTP/1.1 (curl) and h2c
        (nghttp): every header field, a name that came twice listed twice."""
        r = self.get(path)
        status, fields, _out = h2c_fields(self.url(path))
        return [("HTTP/1.1", r.status, r.header_list), ("h2c", status, fields)]

    def assertOneField(self, fields, name, value=None, where=""):
        """fields has exactly one field called name (with this value, when given); returns its value."""
        values = [v for k, v in fields if k == name]
        self.assertEqual(len(values), 1, "%s: %d %s fields: %r" % (where, len(values), name, fields))
        if value is not None:
            self.assertEqual(values[0], value, "%s: %r" % (where, fields))
        return values[0]

    def assertNextResponseIntact(self, path):
        rs = get_pipelined(self.port, path, "/ok")
        self.assertEqual(len(rs), 2, rs)
        self.assertEqual((rs[1][0], rs[1][2]), (200, b"ok"),
                         "the response after %s is mis-framed: %r" % (path, rs))
        return rs[0]

    def test_status_204_from_a_script_has_no_body_and_keeps_the_connection_framed(self):
        status, headers, _ = self.assertNextResponseIntact("/s204")
        self.assertEqual(status, 204)
        self.assertNotIn("content-length", [k.lower() for k, _ in headers], headers)
        self.assertNotIn("content-type", [k.lower() for k, _ in headers], headers)  # no body to type

    def test_status_304_from_a_script_has_no_body_and_keeps_the_connection_framed(self):
        status, _h, _b = self.assertNextResponseIntact("/s304")
        self.assertEqual(status, 304)

    def test_1xx_status_from_a_script_is_not_sent_as_a_final_response(self):
        for path in ("/s100", "/s101"):
            rs = get_pipelined(self.port, path)
            self.assertTrue(rs and rs[0][0] is not None and rs[0][0] >= 200,
                            "%s: a 1xx was sent as the final response: %r" % (path, rs))

    def test_content_length_from_a_script_does_not_duplicate_the_real_one(self):
        status, headers, body = self.assertNextResponseIntact("/content-length")
        cls = [v for k, v in headers if k.lower() == "content-length"]
        self.assertEqual(cls, [str(len(body))], headers)

    def test_framing_and_connection_headers_from_a_script_are_not_sent(self):
        for path in ("/transfer-encoding", "/connection"):
            _s, headers, _b = self.assertNextResponseIntact(path)
            names = [k.lower() for k, _ in headers]
            self.assertNotIn("transfer-encoding", names, headers)
            self.assertNotIn("keep-alive", names, headers)
            self.assertNotIn("upgrade", names, headers)
            self.assertLessEqual(names.count("connection"), 1, headers)

    def test_header_names_that_are_not_tokens_are_dropped_others_kept(self):
        # RFC 9110 §5.1: a field name is a token; a NUL, a space or a colon in one would corrupt
        # the response (HTTP/1.1) or fail the stream (HTTP/2)
        _s, headers, _b = self.assertNextResponseIntact("/bad-names")
        names = [k.lower() for k, _ in headers]
        self.assertIn("x-ok", names, headers)
        self.assertFalse([n for n in names if n.startswith("x-a") or n.startswith("x a") or n.startswith("x:")],
                         headers)
        status, _h, out = nghttp(self.url("/bad-names"))
        self.assertNotIn("INVALID", out, out)
        self.assertIn("x-ok", out)

    def test_header_values_with_control_characters_or_too_long_are_dropped_others_trimmed(self):
        # RFC 9110 §5.5: no control characters but HTAB; no surrounding whitespace
        _s, headers, _b = self.assertNextResponseIntact("/bad-values")
        h = {k.lower(): v for k, v in headers}
        for dropped in ("x-ctl", "x-del", "x-long"):
            self.assertNotIn(dropped, h, headers)
        self.assertEqual(h.get("x-tab"), "a\tb")
        self.assertEqual(h.get("x-pad"), "padded")
        self.assertEqual(h.get("x-fits"), "v" * 8192)
        self.assertIn("x-utf8", h)

    def test_more_than_64_script_headers_are_cut_to_64(self):
        _s, headers, _b = self.assertNextResponseIntact("/many-headers")
        self.assertEqual(len([k for k, _ in headers if k.lower().startswith("x-h")]), 64)
        self.assertIn("more than 64 response headers", self.gw.log())

    def test_a_dropped_header_name_cannot_forge_a_log_line(self):
        self.assertNextResponseIntact("/bad-names")
        lines = [l for l in self.gw.log().splitlines() if "forged" in l]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("x\\x0d\\x0aforged", lines[0])
        self.assertFalse(any(l.startswith("forged") for l in self.gw.log().splitlines()))

    def test_several_spellings_of_one_header_give_one_field_the_first_bytewise_wins(self):
        # RFC 9110 §5.1: field names are case-insensitive, so these are one field; of CONTENT-TYPE,
        # Content-Type and content-type the first bytewise is CONTENT-TYPE, whatever order Lua gives
        for proto, status, fields in self.fields_over_both("/spellings"):
            self.assertEqual(status, 200, proto)
            self.assertOneField(fields, "content-type", "text/html", proto)
        log = self.gw.log()
        self.assertIn("dropped response header 'Content-Type': the script also set 'CONTENT-TYPE'", log)
        self.assertIn("dropped response header 'content-type': the script also set 'CONTENT-TYPE'", log)

    def test_a_header_warning_repeated_on_every_response_is_logged_once_per_interval(self):
        # a script that repeats a mistake on every response must not flood the log (one worker
        # here): once per interval
        t0 = time.monotonic()
        for _ in range(30):
            self.assertEqual(self.get("/spellings").status, 200)
        most = warning_intervals(t0)
        log = self.gw.log()
        for msg in ("dropped response header 'Content-Type': the script also set 'CONTENT-TYPE'",
                    "dropped response header 'content-type': the script also set 'CONTENT-TYPE'"):
            self.assertGreaterEqual(log.count(msg), 1, log)
            self.assertLessEqual(log.count(msg), most, log)

    def test_many_distinct_header_warnings_cannot_flood_the_log(self):
        # more distinct warnings than the 16 a worker remembers, on every response (20 bad names),
        # or a bad name that changes with every request: at most 16 lines per 10 s (one worker)
        t0 = time.monotonic()
        for i in range(10):
            self.assertEqual(self.get("/many-bad").status, 200)
        for i in range(30):
            r = self.get("/counter-bad/%d" % i)
            self.assertEqual((r.status, r.headers.get("x-ok")), (200, "1"))
        most = warning_intervals(t0)
        log = self.gw.log()
        self.assertLessEqual(log.count("dropped invalid response header"), 16 * most, log[-3000:])
        self.assertGreaterEqual(log.count("dropped invalid response header"), 1, log[-3000:])
        # which 16 of the 20 names are written depends on Lua's table order; none is written twice
        # in one interval
        for i in range(1, 21):
            self.assertLessEqual(log.count("dropped invalid response header 'x bad %d'" % i), most, log[-3000:])

    def test_header_values_and_keys_of_other_types_and_metatables_on_the_headers_table(self):
        # numbers are sent as text; other types and non-string keys are left out; the headers
        # table is read raw (its metamethods are never called)
        for proto, status, fields in self.fields_over_both("/odd-types"):
            where = "%s /odd-types" % proto
            self.assertEqual(status, 200, where)
            self.assertOneField(fields, "x-ok", "1", where)
            self.assertOneField(fields, "x-num", "5", where)
            names = [k for k, _ in fields]
            for absent in ("x-bool", "x-tab", "x-fn", "1", "true"):
                self.assertNotIn(absent, names, where)
        self.assertEqual(self.get("/ok").status, 200)

    def test_a_list_value_gives_one_field_per_element_in_order(self):
        # several Set-Cookie fields cannot be joined into one (RFC 6265 §3)
        for proto, status, fields in self.fields_over_both("/cookies"):
            self.assertEqual(status, 200, proto)
            self.assertEqual([v for k, v in fields if k == "set-cookie"], ["a=1; Path=/", "b=2; Path=/"],
                             "%s: %r" % (proto, fields))

    def test_a_script_date_header_is_dropped_and_the_gateways_is_sent_once(self):
        # h2o writes its own Date on every response and cannot be told not to: a script's would be
        # a second Date
        for proto, status, fields in self.fields_over_both("/date-server"):
            self.assertEqual(status, 200, proto)
            self.assertNotIn("2015", self.assertOneField(fields, "date", where=proto), proto)
        self.assertIn("dropped response header 'date' set by a script", self.gw.log())

    def test_a_script_server_header_replaces_the_gateways(self):
        for proto, status, fields in self.fields_over_both("/date-server"):
            self.assertEqual(status, 200, proto)
            self.assertOneField(fields, "server", "catalog/1.0", proto)  # Server sorts before server
        # responses without a server of their own (a script's, a problem made in C) keep the gateway's
        for path in ("/ok", "/no-such-route"):
            for proto, _status, fields in self.fields_over_both(path):
                self.assertOneField(fields, "server", "aggway", "%s %s" % (proto, path))
                self.assertOneField(fields, "date", where="%s %s" % (proto, path))
        # and so do the answers h2o makes itself (a request body over max_request_body_bytes)
        r = self.get("/ok", "-X", "POST", "-H", "Content-Length: 2000000", "--data-binary", "x" * 10)
        self.assertEqual(r.status, 413, r)
        self.assertOneField(r.header_list, "server", "aggway", "HTTP/1.1 413")

    def test_page_headers_from_a_script_follow_the_same_rules_and_the_page_contract_wins(self):
        for proto, status, fields in self.fields_over_both("/page-headers/1"):
            self.assertEqual(status, 200, proto)
            self.assertOneField(fields, "content-type", "application/vnd.page+json", proto)
            self.assertOneField(fields, "cache-control", "max-age=60", proto)
            self.assertOneField(fields, "x-aggregation-completed", "true", proto)
            self.assertOneField(fields, "server", "catalog/1.0", proto)
            self.assertNotIn("2015", self.assertOneField(fields, "date", where=proto), proto)
        self.assertIn("dropped response header 'cache-control': the script also set 'Cache-Control'", self.gw.log())
        # a failed page: its problem type and no-store replace every spelling the script gave
        for proto, status, fields in self.fields_over_both("/page-headers-failed"):
            self.assertEqual(status, 404, proto)
            self.assertOneField(fields, "content-type", "application/problem+json", proto)
            self.assertOneField(fields, "cache-control", "no-store", proto)
            self.assertOneField(fields, "server", "catalog/1.0", proto)
            self.assertOneField(fields, "date", where=proto)

    def test_script_headers_and_statuses_give_valid_http2_responses(self):
        for path in ("/s204", "/content-length", "/transfer-encoding", "/connection", "/bad-names", "/bad-values",
                     "/many-headers", "/spellings", "/date-server", "/page-headers/1"):
            status, _h, out = nghttp(self.url(path))
            self.assertNotIn("INVALID", out, "%s over h2c: the client rejected the response\n%s" % (path, out))
            self.assertNotIn("PROTOCOL_ERROR", out, out)


class RouteParamTraversal(GatewayTestCase):
    """Route parameters are percent-decoded, so `%2F` becomes '/': the demo's
    `"/products/" .. id` then sends `/products/../../admin` to the product service."""

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=0, reviews_ms=0, inventory_ms=0), scripts=repo_scripts())

    def test_encoded_slash_in_a_route_param_does_not_leave_the_upstream_path(self):
        self.mock.reset()
        self.get("/product-page/..%2F..%2Fadmin%3Fx=1")
        self.get("/product-page/%2E%2E%2Fadmin")
        hits = self.mock.hits()["product"]
        self.assertEqual(hits.get("unmatched", 0), 0,
                         "the product service was asked for a path outside /products/{id}: %r" % hits)


class ClientRequestFraming(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(), scripts={"echo.lua": ECHO, "post.lua": POST})

    def test_obs_fold_continuation_line_does_not_become_a_header_with_an_empty_name(self):
        # RFC 9112 5.2: reject with 400, or replace the fold with spaces; never a nameless header
        rs = split_responses(raw_exchange(self.port, b"GET /echo/x HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"))
        self.assertTrue(rs, "no answer")
        if rs[0][0] == 400:
            return
        self.assertEqual(rs[0][0], 200, rs)
        import json
        names = json.loads(rs[0][2])["header_names"]
        self.assertNotIn("", names, "req.headers has a header with an empty name: %r" % names)

    # libh2o 2.2.5's HTTP/1 parser consumes Content-Length itself and hands the handler neither
    # header: the gateway reads the raw request head again (gateway/guard/guard.h)
    def test_conflicting_content_length_values_are_rejected_with_400(self):
        # RFC 9112 6.3: differing Content-Length values are an unrecoverable framing error
        rs = split_responses(raw_exchange(
            self.port, b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x"))
        self.assertTrue(rs, "no answer")
        self.assertEqual(rs[0][0], 400, rs)

    # libh2o 2.2.5 frames a request that has both Content-Length and Transfer-Encoding by the
    # chunked body and would keep the connection open, so bytes a front proxy framed by
    # Content-Length would be read as a second request: the gateway refuses it and closes
    def test_content_length_with_transfer_encoding_closes_the_connection(self):
        # RFC 9112 6.1: process it by Transfer-Encoding, then close the connection
        rs = split_responses(raw_exchange(
            self.port, b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"2\r\n{}\r\n0\r\n\r\nGET /echo/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"))
        self.assertTrue(rs, "no answer")
        self.assertEqual(len(rs), 1, "a second request followed on the same connection: %r" % rs)

    def test_a_bare_lf_and_an_http_1_0_transfer_encoding_are_refused_and_close(self):
        # RFC 9112 2.2: a proxy in front that ends lines at CRLF only reads "Host: x\nContent-Length:
        # 41" as one field, and passes the body on as a request of its own; 6.1: an HTTP/1.0 message
        # with Transfer-Encoding has faulty framing (an attack review: both were served, and the
        # pipelined request after them answered)
        for head in (b"POST /post HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n\r\n{}",
                     b"POST /post HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"):
            rs = split_responses(raw_exchange(self.port, head + b"GET /echo/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"))
            self.assertTrue(rs, "no answer")
            self.assertEqual(rs[0][0], 400, (head, rs))
            self.assertEqual(len(rs), 1, "a second request followed on the same connection: %r" % rs)
        self.assertEqual(self.get("/echo/fine").status, 200)

    def test_malformed_requests_get_400_and_the_gateway_keeps_serving(self):
        for bad in (b"GARBAGE\r\n\r\n", b"GET /echo/x HTTP/9.9\r\nHost: x\r\n\r\n",
                    b"GET /echo/x HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
                    b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                    b"POST /post HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
            rs = split_responses(raw_exchange(self.port, bad))
            self.assertTrue(rs and rs[0][0] == 400, (bad, rs))
        self.assertEqual(self.get("/echo/fine").status, 200)


# ---------------------------------------------------------------------------------------------
# a raw upstream: answers each request with canned bytes chosen by its path

def exactly(total, body_char=b"e"):
    """A 200 answer of exactly total bytes, headers included (a JSON string body)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %05d\r\n\r\n"
    blen = total - len(head % 0)
    return head % blen + b'"' + body_char * (blen - 2) + b'"'


STALE = b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"stale\":true}"

RAW_ANSWERS = {
    "/no-content": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "/status-000": b"HTTP/1.1 000 Zero\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
    "/interim-framed": b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n"
                       b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
    "/switch": b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    # the gateway reads 16384 bytes at a time: this answer fills one read exactly, and bytes that
    # answer no request follow in the same write
    "/exact-then-stale": exactly(16384) + STALE,
    "/second": b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"second\":true}",
    # answered from the headers alone; the body is never read (RawUpstream reads no further)
    "/too-large": b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n",
    "/deep-256": b"HTTP/1.1 200 OK\r\nContent-Length: 512\r\n\r\n" + b"[" * 256 + b"]" * 256,
}


HOLD_S = 8  # how long RawUpstream keeps a connection open after its answer: beyond every call's timeout


class RawUpstream:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.closed = {}  # path -> time.monotonic() when this side closed the connection it came on
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        c.settimeout(5)
        buf = b""
        path = None
        try:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            path = buf.split(b" ", 2)[1].decode().split("?")[0]
            c.sendall(RAW_ANSWERS.get(path, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))
            time.sleep(HOLD_S)  # keep the connection open: the gateway must frame the answer itself
        except OSError:
            pass
        finally:
            c.close()
            if path is not None:
                self.closed[path] = time.monotonic()

    def stop(self):
        self.stopped = True
        self.sock.close()


RAW_CALL = endpoint("GET /raw/{case}", """
    local r = agg.fetch { "raw", "/" .. req.params.case, timeout_ms = 2000 }
    return { status = 200, json = { ok = r.ok, kind = r.error and r.error.type or agg.null } }""")

RAW_CHAIN = endpoint("GET /raw-then/{first}/{second}", """
    local a = agg.fetch { "raw", "/" .. req.params.first, timeout_ms = 2000 }
    local b = agg.fetch { "raw", "/" .. req.params.second, timeout_ms = 2000 }
    return { status = 200, json = { first = a.ok, second = b.ok and b.data or b.error.type } }""")

RAW_POST = endpoint("GET /raw-post/{case}", """
    local r = agg.fetch { "raw", "/" .. req.params.case, method = "POST", body = string.rep("x", 8 * 1024 * 1024),
                          timeout_ms = 5000 }
    return { status = 200, json = { http_status = r.http_status or agg.null, kind = r.error and r.error.type or agg.null, detail = r.error and r.error.detail } }""")

RAW_READ_PAGE = endpoint("GET /raw-page/{case}", """
    local res = agg.fetch_all { s = { "raw", "/" .. req.params.case, timeout_ms = 2000 } }
    local _ = res.s.ok and res.s.data      -- a script that reads the data decodes it
    return agg.page(res)""")


class UpstreamFraming(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.raw = RawUpstream()
        self.addCleanup(self.raw.stop)
        self.start(services=demo_services(), scripts={"raw.lua": RAW_CALL, "raw_chain.lua": RAW_CHAIN,
                                                      "raw_post.lua": RAW_POST, "raw_page.lua": RAW_READ_PAGE},
                   upstream_options={"raw": {"url": "http://127.0.0.1:%d" % self.raw.port, "timeout_ms": 2000}},
                   # the 8 MiB POST: building and copying its body is CPU time before the script
                   # waits, over 1 s (the default script time limit) beside two busy loops
                   deadline_ms=6000, gateway_extra={"script_time_limit_ms": 10000})

    def test_upstream_204_with_a_content_length_ends_after_the_headers(self):
        # RFC 9112 6.3: a 204 response ends at the empty line after the headers, whatever it says
        r = self.get("/raw/no-content")
        self.assertEqual(r.status, 200, r)
        self.assertLess(r.ms, 1000, "the 204 call waited for a body until its timeout: %r" % r)
        self.assertTrue(r.json()["ok"], r)

    def test_upstream_status_000_fails_fast_as_a_bad_response(self):
        r = self.get("/raw/status-000")
        self.assertEqual(r.status, 200, r)
        self.assertLess(r.ms, 1000, "status 000 was treated as an interim 1xx: %r" % r)
        self.assertEqual(r.json()["kind"], "urn:aggway:problem:upstream-bad-response", r)


    def test_interim_response_with_framing_headers_ends_at_its_headers(self):
        # RFC 9112 6.3: a 1xx response ends at its empty line whatever Content-Length says
        r = self.get("/raw/interim-framed")
        self.assertEqual(r.json(), {"ok": True, "kind": None}, r)

    def test_unasked_101_fails_fast_as_a_bad_response(self):
        r = self.get("/raw/switch")
        self.assertLess(r.ms, 1000, "a 101 was waited past like an interim response: %r" % r)
        self.assertEqual(r.json()["kind"], "urn:aggway:problem:upstream-bad-response", r)

    def test_bytes_after_a_response_are_not_the_next_calls_answer(self):
        r = self.get("/raw-then/exact-then-stale/second")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"first": True, "second": {"second": True}},
                         "the dependent call read bytes sent before its request as its answer: %r" % r)

    def test_answer_before_a_large_request_body_is_read_is_the_result(self):
        # The upstream answers 413 after the request's headers and then holds the connection open
        # without reading (HOLD_S): the 8 MiB body cannot all be sent. The answer must be read
        # while sending, so it is the result before the upstream closes (a client that reads only
        # after the send would time out at 5 s, or learn it at the close). The time it takes is the
        # gateway copying 8 MiB two or three times into fresh memory, which on a busy machine
        # took over 1 s (page faults): not what this test is about, so no bound on it.
        r = self.get("/raw-post/too-large")
        p = r.json()
        self.assertEqual((p["http_status"], p["kind"]), (413, "urn:aggway:problem:upstream-error"), (r, p))
        self.assertNotIn("/too-large", self.raw.closed,
                         "the 413 sent before the body was read was only read at the upstream's close: %r" % r)

    def test_upstream_json_at_the_depth_limit_read_by_a_script_still_encodes(self):
        r = self.get("/raw-page/deep-256")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["s"]["status"], "ok", r)


# ---------------------------------------------------------------------------------------------

SPOILER = endpoint("GET /spoil", """
    agg.fetch_all = function() error("spoiled") end
    agg.page = nil
    return { status = 200, body = "done" }""")

VICTIM = endpoint("GET /victim", """
    return agg.page(agg.fetch_all { product = { "product", "/products/1" } })""")


class ScriptIsolation(GatewayTestCase):

    def test_a_script_that_rewrites_the_agg_module_does_not_break_other_scripts(self):
        self.start(services=demo_services(product_ms=0), scripts={"spoil.lua": SPOILER, "victim.lua": VICTIM})
        self.assertEqual(self.get("/victim").status, 200)
        self.get("/spoil")
        r = self.get("/victim")
        self.assertEqual(r.status, 200, "after /spoil rewrote agg, /victim fails: %r" % r)


class PortInUse(GatewayTestCase):

    def test_second_gateway_on_a_port_in_use_exits_nonzero_instead_of_sharing_it(self):
        self.start(services=demo_services(), scripts={"ok.lua": SCRIPT_RESPONSES})
        d = os.path.join(self.workdir, "second")
        write_scripts(d, {"ok.lua": SCRIPT_RESPONSES}, gateway_lua(self.port, {}))
        log = open(os.path.join(self.workdir, "second.log"), "wb")
        p = subprocess.Popen([AGGWAY_BIN, "serve", "-c", d], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        try:
            p.wait(timeout=20 if SLOW else 10)
        except subprocess.TimeoutExpired:
            pass
        running = p.poll() is None
        stop_process(p)
        with open(os.path.join(self.workdir, "second.log"), "rb") as f:
            out = f.read().decode(errors="replace")
        self.assertFalse(running, "a second gateway serves on port %d already in use:\n%s" % (self.port, out))
        self.assertNotEqual(p.returncode, 0, out)


if __name__ == "__main__":
    main()
