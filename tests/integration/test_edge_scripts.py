"""The gateway facing a hostile client, a hostile script and a failing upstream, on a real gateway:
the script sandbox holds in serve, route parameters that would confuse an upstream path or spell
another route's path another way are refused (and move no breaker), problems to clients carry no
internal detail while the log and the waterfall do, a log line cannot be forged, and a header
value with a control character is never sent."""
import hashlib
import json
import os
import socket
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GatewayTestCase, endpoint, free_port, main, repo_scripts, route, run_aggway,  # noqa: E402
                     wait_until)

SCRIPTS = dict(repo_scripts(), **{
    "popen.lua": endpoint("GET /popen", """
    return { status = 200, body = io.popen("id"):read("*a") }"""),
    "ffi.lua": endpoint("GET /ffi", """
    local ffi = require "ffi"
    return { status = 200, body = "loaded" }"""),
    "pub.lua": endpoint("GET /pub/{id}", """
    return agg.page(agg.fetch_all { stock = { "inventory", "/stock/" .. req.params.id .. "/public" } })"""),
    "boom.lua": endpoint("GET /boom", """
    error("no product for sku " .. req.query.sku)"""),
    "header.lua": endpoint("GET /header/{which}", """
    local values = { vt = "a\\vb", ff = "a\\fb", esc = "a\\27[31mb", del = "a\\127b", nul = "a\\0b", lf = "a\\nb" }
    return agg.page(agg.fetch_all { stock = { "inventory", "/stock/1", headers = { ["x-note"] = values[req.params.which] } } })"""),
    "oddkey.lua": endpoint("GET /odd-key", """
    return agg.page(agg.fetch_all { ["a\\nb\\127c\\27d"] = { "inventory", "/stock/1" } })"""),
    "hash.lua": endpoint("GET /hash", """
    return agg.page(agg.fetch_all { stock = { "inventory", "/stock/7#x" } })"""),
})

SERVICES = {
    "product": [route("/products/{id}", json={"id": "{id}", "name": "Sneaker", "sku": "SNK-{id}"})],
    "reviews": [route("/reviews", json={"rating": 4.6})],
    "inventory": [route("/stock/{id}/public", json={"inStock": 12}), route("/stock/{id}", json={"inStock": 12})],
}

BREAKER = {"inventory": {"breaker": {"failures": 5, "open_s": 30}}}

# A protected literal route beside an open parameter route, and a cached item (the attack review's
# alias finding: "/users/%61dmin" reached through "/users/{id}" what "/users/admin" guards, as
# upstreams decode %61 and strip ";x", and "/items/%6Fk" was a second cache key for "/items/ok";
# a review's: "/users/me%3Aadmin" beside "/users/me:admin").
USERS = """local agg = require "agg"
return {
  { route = "GET /users/admin", auth = "api_key", handler = function(req)
      return agg.page(agg.fetch_all { u = { "users", "/users/admin" } })
    end },
  { route = "GET /users/me:admin", auth = "api_key", handler = function(req)
      return agg.page(agg.fetch_all { u = { "users", "/users/me:admin" } })
    end },
  { route = "GET /users/{id}", auth = "none", handler = function(req)
      return agg.page(agg.fetch_all { u = { "users", "/users/" .. req.params.id } })
    end },
  { route = "GET /items/{id}", auth = "none", handler = function(req)
      return agg.page(agg.fetch_all { i = { "catalog", "/items/" .. req.params.id } })
    end },
}
"""
USERS_SERVICES = {"users": [route("/users/{id}", json={"id": "{id}"})],
                  "catalog": [route("/items/{id}", json={"id": "{id}"})]}


def raw_request(port, target):
    """Sends one HTTP/1.1 request with target as raw bytes (curl would strip a '#'); returns the
    status and the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head.decode("latin-1"), body


class Sandbox(GatewayTestCase):
    def test_io_popen_in_a_handler_answers_500_and_runs_nothing(self):
        self.start(services=SERVICES, scripts=SCRIPTS)
        r = self.get("/popen")
        p = self.assertProblem(r, 500)
        self.assertNotIn("uid=", r.body.decode(errors="replace"))
        self.assertEqual(p["type"], "urn:aggway:problem:script-error")
        self.assertIn("popen.lua:6: io is not available to scripts", self.gw.log())
        r = self.get("/ffi")
        self.assertProblem(r, 500)
        self.assertIn("module 'ffi' is not available to scripts", self.gw.log())

    def test_a_trusted_folder_runs_without_the_sandbox_and_says_so_at_every_load(self):
        self.start(services=SERVICES, scripts=SCRIPTS, gateway_extra={"scripts": {"trusted": True}})
        r = self.get("/popen")
        self.assertEqual(r.status, 200, r)
        self.assertIn("uid=", r.body.decode())
        self.assertIn("scripts = { trusted = true }: the scripts of", self.gw.log())
        check = run_aggway("check", "-c", self.scripts_dir)
        self.assertEqual(check.returncode, 0, check.stderr)
        self.assertIn(b"run without the sandbox", check.stderr)


class RouteParameters(GatewayTestCase):
    def test_fragment_and_raw_byte_in_a_parameter_are_400_reach_no_upstream_and_move_no_breaker(self):
        self.start(services=SERVICES, scripts=SCRIPTS, upstream_options=BREAKER)
        before = self.mock.stats()["inventory"]["requests"]
        for target in (b"/pub/7#", b"/pub/7\xff", b"/pub/7%FF", b"/pub/7%2Fpublic", b"/pub/7%0A"):
            for _ in range(6):  # more than the breaker's 5 failures
                status, head, body = raw_request(self.port, target)
                self.assertEqual(status, 400, (target, head, body))
                self.assertIn("content-type: application/problem+json", head.lower())
                self.assertEqual(json.loads(body)["type"], "urn:aggway:problem:bad-route-parameter")
        self.assertEqual(self.mock.stats()["inventory"]["requests"], before, "nothing reached the upstream")
        # the breaker did not move: a good request is served by the upstream
        r = self.get("/pub/7")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["stock"]["status"], "ok", r)
        self.assertEqual(self.mock.hits()["inventory"]["GET /stock/{id}/public"], 1)

    def start_users(self):
        keys = os.path.join(self.workdir, "api-keys.json")
        with open(keys, "w") as f:
            json.dump([{"sha256": hashlib.sha256(b"k-admin-1").hexdigest(), "app": "ops", "plan": "gold"}], f)
        self.start(services=USERS_SERVICES, scripts={"users.lua": USERS},
                   upstream_options={"catalog": {"cache": {"ttl_s": 60}}},
                   gateway_extra={"auth": {"api_keys": {"file": keys, "header": "X-Client-Key"}, "default": "none"}})

    def assertRefused(self, target):
        status, head, body = raw_request(self.port, target)
        self.assertEqual(status, 400, (target, head, body))
        self.assertIn("content-type: application/problem+json", head.lower())
        self.assertEqual(json.loads(body)["type"], "urn:aggway:problem:bad-route-parameter", target)

    def test_another_spelling_of_a_protected_literal_route_is_that_route_never_the_open_ones(self):
        self.start_users()
        self.assertEqual(self.get("/users/admin").status, 401)
        r = self.get("/users/admin", "-H", "X-Client-Key: k-admin-1")
        self.assertEqual(r.status, 200, r)
        r = self.get("/users/ada")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["u"]["data"]["id"], "ada", r)
        # what decodes to a literal segment is the literal route's (its auth), in either hex case,
        # ':' too (a review: %3A reached the open route beside GET /users/me:admin)
        for target in (b"/users/%61dmin", b"/users/adm%69n", b"/users/%61%64%6d%69%6e", b"/users/me%3Aadmin",
                       b"/users/me%3aadmin", b"/%75sers/admin"):
            status, head, body = raw_request(self.port, target)
            self.assertEqual(status, 401, (target, head, body))
        # a parameter's escapes of unreserved characters (another spelling of some value) and ';'
        # (a path parameter upstreams strip) are refused
        for target in (b"/users/ADM%49N", b"/users/admin;x", b"/users/admin;", b"/users/admin%3Bx", b"/users/admin%3bx"):
            self.assertRefused(target)
        paths = [q["path"] for q in self.mock.requests("users")["requests"]]
        self.assertEqual(paths, ["/users/admin", "/users/ada"], "only the two served requests reached the upstream")

    def test_other_spellings_of_a_cached_item_are_400_and_make_no_cache_key_or_upstream_call(self):
        self.start_users()
        for _ in range(2):
            r = self.get("/items/ok")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["i"]["data"]["id"], "ok", r)
        self.assertEqual(self.mock.stats()["catalog"]["requests"], 1, "the second was a cache hit")
        for target in (b"/items/%6Fk", b"/items/%6fk", b"/items/o%6B", b"/items/o%6b", b"/items/%6F%6B",
                       b"/items/%6f%6b", b"/items/ok;x", b"/items/ok%3B"):
            self.assertRefused(target)
        self.assertEqual(self.mock.stats()["catalog"]["requests"], 1, "no other spelling reached the upstream")

    def test_a_path_with_a_hash_from_a_script_fails_the_call_before_sending(self):
        self.start(services=SERVICES, scripts=SCRIPTS)
        before = self.mock.stats()["inventory"]["requests"]
        r = self.get("/hash")
        self.assertEqual(r.status, 502, r)
        self.assertEqual(r.json()["sections"]["stock"]["error"]["type"], "urn:aggway:problem:invalid-call", r)
        self.assertEqual(self.mock.stats()["inventory"]["requests"], before)
        self.assertIn("path contains '#'", self.gw.log())


class NoInternalDetail(GatewayTestCase):
    def start_with_inventory(self, url):
        self.admin_port = free_port()
        self.start(services=SERVICES, scripts=SCRIPTS, upstream_options={"inventory": {"url": url}},
                   gateway_extra={"admin": {"port": self.admin_port}})

    def waterfall_details(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/waterfall.json" % self.admin_port, timeout=10) as r:
            data = json.loads(r.read())
        return [c.get("detail", "") for req in data["requests"] for c in req["calls"]]

    def assertNoDetail(self, body, *words):
        text = body.decode(errors="replace")
        for w in words:
            self.assertNotIn(w, text)

    def test_refused_upstream_page_names_no_address_port_or_errno_but_the_log_and_waterfall_do(self):
        port = free_port()  # nothing listens there
        self.start_with_inventory("http://127.0.0.1:%d" % port)
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r)
        err = r.json()["inventory"]["error"]
        self.assertEqual(err["type"], "urn:aggway:problem:upstream-unreachable")
        self.assertEqual(err["title"], "the upstream could not be reached")
        self.assertNoDetail(r.body, "127.0.0.1", str(port), "Connection refused", "http://")
        self.assertIn("Connection refused", self.gw.log())
        self.assertIn("127.0.0.1:%d" % port, self.gw.log())
        self.assertTrue(any("Connection refused" in d for d in self.waterfall_details()), self.waterfall_details())

    def test_tls_failure_page_names_no_address_port_or_tls_reason_but_the_log_and_waterfall_do(self):
        self.start_mock(SERVICES)
        port = self.mock.ports["inventory"]  # speaks plain HTTP: the handshake fails
        self.start_with_inventory("https://127.0.0.1:%d" % port)
        r = self.get("/product-page/42")
        self.assertEqual(r.status, 200, r)
        err = r.json()["inventory"]["error"]
        self.assertEqual(err["type"], "urn:aggway:problem:upstream-tls")
        self.assertNoDetail(r.body, "127.0.0.1", str(port), "TLS handshake with", "SSL", "ssl", "wrong version")
        self.assertIn("TLS handshake with upstream inventory failed", self.gw.log())
        self.assertTrue(any("TLS handshake" in d for d in self.waterfall_details()), self.waterfall_details())


class Logs(GatewayTestCase):
    def test_a_script_error_with_a_decoded_newline_from_the_query_is_one_log_line(self):
        self.start(services=SERVICES, scripts=SCRIPTS)
        forged = "2026-12-01T00:00:00.000Z error forged-line"
        r = self.get("/boom?sku=x%0A" + forged.replace(" ", "%20") + "%0D%0B%0C%1B%7F")
        self.assertProblem(r, 500)
        lines = self.gw.log().splitlines()
        hits = [l for l in lines if "forged-line" in l]
        self.assertEqual(len(hits), 1, hits)
        self.assertIn("script error in GET /boom", hits[0])
        self.assertIn("no product for sku x\\n2026-12-01T00:00:00.000Z error forged-line\\r\\x0b\\x0c\\x1b\\x7f",
                      hits[0])
        self.assertFalse(any(l.startswith(forged) for l in lines))

    def test_a_section_name_with_control_characters_is_one_access_log_line_with_them_escaped(self):
        path = os.path.join(self.workdir, "access.log")
        self.start(services=SERVICES, scripts=SCRIPTS, gateway_extra={"access_log": path})
        self.assertEqual(self.get("/odd-key").status, 200)

        def logged():
            with open(path, "rb") as f:
                return [l for l in f.read().split(b"\n") if b"/odd-key" in l]
        self.assertTrue(wait_until(lambda: logged(), 10), "the access log has no line for /odd-key")
        raw = logged()[0]
        self.assertNotIn(b"\x7f", raw)
        self.assertNotIn(b"\x1b", raw)
        self.assertIn(b"a\\nb\\u007fc\\u001bd", raw)
        self.assertEqual(json.loads(raw)["sections"][0]["name"], "a\nb\x7fc\x1bd")

    def test_header_values_with_any_control_character_are_never_sent(self):
        self.start(services=SERVICES, scripts=SCRIPTS)
        before = self.mock.stats()["inventory"]["requests"]
        for which in ("vt", "ff", "esc", "del", "nul", "lf"):
            r = self.get("/header/" + which)
            self.assertEqual(r.status, 502, (which, r))
            self.assertEqual(r.json()["sections"]["stock"]["error"]["type"], "urn:aggway:problem:invalid-call",
                             (which, r))
        self.assertEqual(self.mock.stats()["inventory"]["requests"], before, "nothing was sent")
        self.assertIn("header value contains a control character (only HTAB is allowed)", self.gw.log())


if __name__ == "__main__":
    main()
