"""The edge: JWT and API key authentication before any script runs, and the user's identity
toward upstreams (forwarded or exchanged per RFC 8693), with curl against the real gateway and a
mock authorization server (tools/mock-auth) that this test starts and stops. Keys are made with
the openssl command line at test time."""
import hashlib
import json
import os
import socket
import sys
import time

from harness import GatewayTestCase, demo_services, endpoint, main, read_all, run_aggway, wait_until, write_scripts, \
    gateway_lua, free_port, SLOW

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "mock-auth"))
import jose_openssl as jose  # noqa: E402
from mock_auth import MockAuth  # noqa: E402

ME = '''local agg = require "agg"
return {
  route = "GET /me",
  auth = { jwt = true, scopes = { "orders:read" } },
  handler = function(req)
    local ok = pcall(function() req.user.sub = "mallory" end)
    return { status = 200, json = { sub = req.user.sub, via = req.user.via, scopes = req.user.scopes,
                                    iss = req.user.claims.iss, writable = ok,
                                    saw_authorization = req.headers.authorization ~= nil } }
  end,
}
'''
OPEN = endpoint("GET /open", '    return { status = 200, json = { user = req.user == nil and "none" or "some" } }') \
    .replace("return {\n", "return {\n  auth = \"none\",\n", 1)
APP = '''return {
  route = "GET /app",
  auth = "api_key",
  handler = function(req) return { status = 200, json = { app = req.user.app, plan = req.user.plan } } end,
}
'''
# sections calling the services of the mock authorization server with each identity
CALLS = '''local agg = require "agg"
return {
  route = "GET /calls",
  auth = "jwt",
  handler = function(req)
    local res = agg.fetch_all {
      fwd  = { "fwd", "/svc/orders/1" },
      fwd_other = { "fwd_other", "/svc/billing/1" },
      xchg = { "xchg", "/svc/inventory/1" },
      plain = { "plain", "/svc/plain/1", headers = { ["x-note"] = "no identity" } },
      fwd_off = { "fwd", "/svc/orders/2", identity = false },
    }
    return agg.page(res)
  end,
}
'''
REQUIRED = '''local agg = require "agg"
return {
  route = "GET /required",
  handler = function(req)
    return agg.page(agg.fetch_all { xchg = { "xchg", "/svc/inventory/2", required = true } })
  end,
}
'''


class EdgeAuth(GatewayTestCase):
    def start_edge(self, jwt=None, scripts=None, api_keys=None, token_exchange=True, upstreams=None, workers=1,
                   token_url=None, limits=None):
        self.auth = getattr(self, "auth", None) or MockAuth(self.workdir).start()
        self.addCleanup(self.auth.stop)
        os.makedirs(os.path.join(self.workdir, "keys"), exist_ok=True)
        j = {"issuer": "https://id.test", "audiences": ["aggway"], "algorithms": ["RS256", "PS256", "ES256"],
             "jwks_url": self.auth.url("/jwks"), "jwks_cooldown_s": 2}
        j.update(jwt or {})
        auth = {"jwt": j}
        if api_keys is not None:
            path = os.path.join(self.workdir, "keys", "api-keys.json")
            with open(path, "w") as f:
                json.dump([{"sha256": hashlib.sha256(k.encode()).hexdigest(), "app": a, "plan": p}
                           for k, a, p in api_keys], f)
            auth["api_keys"] = {"file": path, "header": "X-Client-Key"}
        extra = {"auth": auth}
        if limits:
            extra["limits"] = limits
        if token_exchange:
            secret = os.path.join(self.workdir, "keys", "te-secret")
            with open(secret, "w") as f:
                f.write(self.auth.client_secret + "\n")
            extra["token_exchange"] = {"url": token_url or self.auth.url("/token"), "client_id": self.auth.client_id,
                                       "client_secret_file": secret, "timeout_ms": 500}
        ups = {"fwd": {"url": self.auth.url(), "identity": "forward", "audience": "orders"},
               "fwd_other": {"url": self.auth.url(), "identity": "forward", "audience": "billing"},
               "xchg": {"url": self.auth.url(), "identity": "exchange", "audience": "inventory"},
               "plain": {"url": self.auth.url()}}
        ups.update(upstreams or {})
        s = {"me.lua": ME, "open.lua": OPEN, "calls.lua": CALLS, "required.lua": REQUIRED}
        if api_keys is not None:
            s["app.lua"] = APP
        s.update(scripts or {})
        self.start(services=demo_services(), scripts=s, upstream_options=ups, workers=workers, gateway_extra=extra)
        # the JWKS is fetched off the request path: wait for the first fetch
        wait_until(lambda: self.auth.jwks_fetches > 0, 10)

    def bearer(self, path, token, *args):
        return self.get(path, "-H", "Authorization: Bearer " + token, *args)

    def assertRefused(self, r, status, error=None):
        p = self.assertProblem(r, status)
        challenge = r.headers.get("www-authenticate", "")
        if status in (400, 401, 403):
            self.assertTrue(challenge.startswith("Bearer realm=\"aggway\""), r)
            if error:
                self.assertIn('error="%s"' % error, challenge)
            else:
                self.assertNotIn("error=", challenge)
        body = r.body.decode()
        for secret_word in ("kid", "k1", "signature", "key", "modulus"):
            self.assertNotIn(secret_word, body.lower().replace("api key", ""), body)
        return p

    # ---- JWT --------------------------------------------------------------------------------
    def test_a_valid_token_reaches_the_script_as_a_read_only_user(self):
        self.start_edge()
        r = self.get("/open")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"user": "none"})
        r = wait_until(lambda: (lambda x: x if x.status == 200 else None)(self.bearer("/me", self.auth.token())), 10)
        self.assertIsNotNone(r, "a valid token was refused:\n" + self.gw.log())
        doc = r.json()
        self.assertEqual(doc["sub"], "alice")
        self.assertEqual(doc["via"], "jwt")
        self.assertEqual(doc["scopes"], ["orders:read"])
        self.assertEqual(doc["iss"], "https://id.test")
        self.assertFalse(doc["writable"])
        # ES256 and PS256 keys of the JWKS verify too
        ec = self.auth.rotate("e1", "EC")
        self.auth.published = [ec] + [k for k in self.auth.published if k is not ec]
        t = self.auth.token(key=ec, alg="ES256")
        self.assertEqual(self.bearer("/me", t).status, 200, "an ES256 token of a new key was refused")
        self.assertEqual(self.bearer("/me", self.auth.token(key=self.auth.keys[1], alg="PS256")).status, 200)

    def test_missing_malformed_and_forged_tokens_are_refused_before_the_script(self):
        self.start_edge()
        good = self.auth.token()
        self.assertEqual(self.bearer("/me", good).status, 200)
        self.assertRefused(self.get("/me"), 401)                                   # no credentials
        self.assertRefused(self.get("/me", "-H", "Authorization: Basic YTpi"), 401)
        self.assertRefused(self.get("/me", "-H", "Authorization: Bearer"), 400, "invalid_request")
        self.assertRefused(self.get("/me", "-H", "Authorization: Bearer a b"), 400, "invalid_request")
        self.assertRefused(self.get("/me", "-H", "Authorization: Bearer " + good[:20] + "!!!"), 400, "invalid_request")
        self.assertRefused(self.get("/me", "-H", "Authorization: Bearer " + good, "-H", "Authorization: Bearer " + good),
                           400, "invalid_request")
        head, payload, sig = good.split(".")
        forged_payload = jose.b64url(json.dumps({"iss": "https://id.test", "sub": "root", "aud": "aggway",
                                                 "exp": int(time.time()) + 300, "scope": "orders:read"}))
        k = self.auth.keys[0]
        now = int(time.time())
        claims = {"iss": "https://id.test", "sub": "eve", "aud": "aggway", "exp": now + 300, "scope": "orders:read"}
        cases = {
            "forged signature": head + "." + payload + "." + sig[:-4] + ("AAAA" if not sig.endswith("AAAA") else "BBBB"),
            "payload swapped": head + "." + forged_payload + "." + sig,
            "alg none": jose.unsigned(claims, {"kid": k.kid}),
            "alg none with a signature": jose.unsigned(claims, {"kid": k.kid}) + "c2ln",
            "HS256 with the RSA public key": jose.hs256(k.pub_pem, claims, {"kid": k.kid}),
            "HS256 with the JWK as the secret": jose.hs256(json.dumps(k.jwk).encode(), claims, {"kid": k.kid}),
            "expired": self.auth.token(exp_in=-120),
            "not yet valid": self.auth.token(nbf=now + 600),
            "issued in the future": self.auth.token(iat=now + 600),
            "wrong audience": self.auth.token(aud=("billing",)),
            "wrong issuer": jose.token(k, dict(claims, iss="https://evil.test")),
            "oversized": self.auth.token(pad="x" * 9000),
            "malformed base64": head + ".e30+/." + sig,   # b64token characters, not base64url
            "payload not JSON": head + "." + jose.b64url("not json") + "." + sig,
            "unknown kid": self.auth.token(key=jose.Key(self.workdir, "stranger")),
        }
        for name, tok in cases.items():
            with self.subTest(name):
                self.assertRefused(self.bearer("/me", tok), 401, "invalid_token")
        # within the leeway (60 s) an expired token still passes
        self.assertEqual(self.bearer("/me", self.auth.token(exp_in=-30)).status, 200)
        # no script ran for any refusal: the log says why, the bodies do not
        log = self.gw.log()
        self.assertIn("refused with 401", log)
        self.assertIn("expired", log)

    def test_a_token_without_the_endpoints_scope_gets_403_insufficient_scope(self):
        self.start_edge()
        r = self.bearer("/me", self.auth.token(scope="profile"))
        self.assertRefused(r, 403, "insufficient_scope")
        self.assertIn('scope="orders:read"', r.headers["www-authenticate"])

    def test_an_unknown_kid_refetches_once_then_waits_for_the_cooldown(self):
        self.start_edge(jwt={"jwks_cooldown_s": 30})
        self.assertEqual(self.bearer("/me", self.auth.token()).status, 200)
        before = self.auth.jwks_fetches
        # a rotated key: accepted after one refetch
        new = self.auth.rotate("k2")
        t = self.auth.token(key=new)
        r = self.bearer("/me", t)  # waits for the refetch its unknown kid asked for
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.auth.jwks_fetches, before + 1)
        # random kids within the cooldown fetch nothing more
        for i in range(20):
            self.assertRefused(self.bearer("/me", self.stranger_token(i)), 401, "invalid_token")
        time.sleep(0.5)
        self.assertEqual(self.auth.jwks_fetches, before + 1)

    def stranger_token(self, i):
        if not hasattr(self, "_stranger"):
            self._stranger = jose.Key(self.workdir, "s")
        now = int(time.time())
        return jose.token(self._stranger, {"iss": "https://id.test", "aud": "aggway", "exp": now + 60},
                          header={"kid": "random-%d" % i})

    def test_cached_keys_keep_working_while_the_jwks_endpoint_is_down(self):
        self.start_edge(jwt={"jwks_refresh_s": 1})
        t = self.auth.token()
        self.assertEqual(self.bearer("/me", t).status, 200)
        self.auth.jwks_down = True
        n = self.auth.jwks_fetches
        self.assertTrue(wait_until(lambda: self.auth.jwks_fetches >= n + 2, 15), "no refetch while down")
        self.assertEqual(self.bearer("/me", self.auth.token(sub="bob")).status, 200)
        self.assertIn("fetch failed", self.gw.log())

    def test_a_token_of_a_key_the_jwks_no_longer_has_is_refused_though_verified_before(self):
        # (an attack review: the verified-token cache kept accepting a token until its exp after the
        # key that signed it left the JWKS; a reload alone cleared it)
        self.start_edge(jwt={"jwks_refresh_s": 1})
        old = self.auth.token()
        self.assertEqual(self.bearer("/me", old).status, 200)
        self.assertEqual(self.bearer("/me", old).status, 200)  # (from the cache)
        new = self.auth.rotate("k2", keep_old=False)           # k1 leaves the JWKS
        n = self.auth.jwks_fetches
        self.assertTrue(wait_until(lambda: self.auth.jwks_fetches >= n + 2, 15), "no refetch")
        self.assertRefused(self.bearer("/me", old), 401, "invalid_token")
        self.assertEqual(self.bearer("/me", self.auth.token(key=new)).status, 200)

    def test_a_cold_start_without_keys_answers_503(self):
        self.auth = MockAuth(self.workdir).start()
        self.auth.jwks_down = True
        self.start_edge()
        r = self.bearer("/me", self.auth.token())
        p = self.assertProblem(r, 503)
        self.assertIn("retry-after", r.headers)
        self.assertEqual(p["type"], "urn:aggway:problem:authentication-unavailable")
        self.auth.jwks_down = False
        r = wait_until(lambda: (lambda x: x if x.status == 200 else None)(self.bearer("/me", self.auth.token())), 15)
        self.assertIsNotNone(r, "the keys never came:\n" + self.gw.log())

    # ---- API keys ---------------------------------------------------------------------------
    def test_a_user_rule_counts_a_token_and_an_api_key_of_one_name_apart(self):
        # (an attack review: a token whose subject was an app's name spent that app's count)
        rule = {"name": "per-user", "key": "user", "rate": 1, "per_s": 60, "burst": 1}
        me = ME.replace('route = "GET /me",', 'route = "GET /me-limited",\n  limits = { "per-user" },')
        app = APP.replace('route = "GET /app",', 'route = "GET /app-limited",\n  limits = { "per-user" },')
        self.start_edge(api_keys=[("k-shop-1", "shop", "free")], scripts={"mel.lua": me, "appl.lua": app},
                        limits={"rules": [rule]})
        token = self.auth.token(sub="shop")
        r = wait_until(lambda: (lambda x: x if x.status == 200 else None)(self.bearer("/me-limited", token)), 10)
        self.assertIsNotNone(r, "the token was not accepted")
        self.assertProblem(self.bearer("/me-limited", token), 429)  # the rule counts the token's subject
        r = self.get("/app-limited", "-H", "X-Client-Key: k-shop-1")
        self.assertEqual(r.status, 200, r)  # the app named "shop" has a count of its own
        self.assertProblem(self.get("/app-limited", "-H", "X-Client-Key: k-shop-1"), 429)

    def test_forged_tokens_spend_the_address_rate_then_are_refused_before_their_signature_is_checked(self):
        # a per-address rule counts the edge's refusals: a flood of forged tokens spends its
        # sender's rate, and then costs no signature check (no refusal logged for it)
        rule = {"name": "per-ip", "key": "ip", "rate": 1, "per_s": 600, "burst": 4}
        me = ME.replace('route = "GET /me",', 'route = "GET /me-limited",\n  limits = { "per-ip" },')
        self.start_edge(scripts={"mel.lua": me}, limits={"rules": [rule]})
        good = self.auth.token()
        r = wait_until(lambda: (lambda x: x if x.status == 200 else None)(self.bearer("/me-limited", good)), 10)
        self.assertIsNotNone(r, "the token was not accepted")
        head, payload, sig = good.split(".")
        forged = head + "." + payload + "." + sig[:-4] + ("AAAA" if not sig.endswith("AAAA") else "BBBB")
        self.assertEqual([self.bearer("/me-limited", forged).status for _ in range(3)], [401] * 3)
        refusals = self.gw.log().count("refused with 401")
        for t in (forged, good):
            r = self.bearer("/me-limited", t)
            p = self.assertProblem(r, 429)
            self.assertEqual(p["violated-policies"], ["per-ip"])
            self.assertNotIn("www-authenticate", r.headers)
        self.assertEqual(self.gw.log().count("refused with 401"), refusals, self.gw.log())
        # an endpoint the rule is not on is not refused: the count is the rule's, not the address's
        self.assertRefused(self.bearer("/me", forged), 401, "invalid_token")

    def test_a_cached_call_that_passes_the_api_key_header_on_is_keyed_by_it(self):
        # (an attack review: a call carrying the client's key was one shared entry: every other
        # client, with another key or none, was given the first one's answer, and the upstream
        # never saw their keys) auth.api_keys.header names X-Client-Key here, not X-API-Key
        passes = '''local agg = require "agg"
return {
  route = "GET /passes-key",
  auth = "none",
  handler = function(req)
    return agg.page(agg.fetch_all { p = { "product", "/products/1",
      headers = { ["x-client-key"] = req.headers["x-client-key"] } } })
  end,
}
'''
        self.start_edge(api_keys=[("k-shop-1", "shop", "free")], scripts={"passes.lua": passes},
                        upstreams={"product": {"cache": {"ttl_s": 60}}})
        for key in ("key-a", "key-b", "key-a"):
            self.assertEqual(self.get("/passes-key", "-H", "X-Client-Key: " + key).status, 200)
        keys = [r["headers"].get("x-client-key") for r in self.mock.requests("product")["requests"]]
        self.assertEqual(sorted(keys), ["key-a", "key-b"], self.mock.requests("product"))

    def test_api_keys_name_the_app_and_plan_and_unknown_keys_are_refused(self):
        self.start_edge(api_keys=[("k-mobile-123", "mobile", "gold"), ("k-web-456", "web", "free")])
        r = self.get("/app", "-H", "X-Client-Key: k-mobile-123")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"app": "mobile", "plan": "gold"})
        self.assertEqual(self.get("/app", "-H", "X-Client-Key: k-web-456").json()["app"], "web")
        for hdr in ([], ["-H", "X-Client-Key: k-revoked"], ["-H", "X-API-Key: k-mobile-123"]):
            r = self.get("/app", *hdr)
            self.assertProblem(r, 401)
            self.assertTrue(r.headers["www-authenticate"].startswith("APIKey"), r)
            self.assertNotIn("k-", r.body.decode())
        # whitespace around a field value is not part of it (RFC 9110 §5.5): h2o's HTTP/1.1 parser
        # keeps it at the end, the edge leaves it out
        for raw_value in (b"k-mobile-123 ", b"k-mobile-123\t", b" k-mobile-123 \t"):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(b"GET /app HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Client-Key: " + raw_value + b"\r\n\r\n")
            data = read_all(s, 10)
            s.close()
            self.assertTrue(data.startswith(b"HTTP/1.1 200 "), (raw_value, data[:200]))
            self.assertIn(b'"app":"mobile"', data)
        # two key headers: which one counts is ambiguous (the edge took the last, a limit keyed by
        # the header the first), so the request is refused, whatever the keys
        for second in ("k-web-456", "k-revoked", "k-mobile-123"):
            r = self.get("/app", "-H", "X-Client-Key: k-mobile-123", "-H", "X-Client-Key: " + second)
            self.assertProblem(r, 400)
            self.assertIn("more than one", r.json()["title"])
            self.assertNotIn("k-", r.body.decode())

    # ---- identity toward upstreams ----------------------------------------------------------
    def sections(self, r):
        return r.json()

    def test_each_upstream_gets_the_identity_it_is_configured_for(self):
        self.start_edge()
        t = self.auth.token(aud=("aggway", "orders"))
        r = self.bearer("/calls", t)
        self.assertEqual(r.status, 200, r)
        page = r.json()
        self.assertEqual(page["fwd"]["data"]["authorization"], "Bearer " + t)
        # billing is not in the token's aud: never sent without the right identity
        self.assertEqual(page["fwd_other"]["status"], "unavailable")
        self.assertEqual(page["fwd_other"]["error"]["type"], "urn:aggway:problem:identity-unavailable")
        self.assertNotIn(t, json.dumps(page["fwd_other"]))
        xt = page["xchg"]["data"]["authorization"]
        self.assertTrue(xt.startswith("Bearer xt.inventory."), xt)
        self.assertEqual(self.auth.exchanges, [(t, "inventory")])
        # an upstream without identity never sees the inbound Authorization
        self.assertIsNone(page["plain"]["data"]["authorization"])
        self.assertIsNone(page["fwd_off"]["data"]["authorization"])  # a call that opted out
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false")

    def test_an_unreachable_token_endpoint_is_named_to_the_log_only(self):
        port = free_port()  # nothing listens there
        self.start_edge(token_url="http://127.0.0.1:%d/token" % port)
        r = self.bearer("/calls", self.auth.token())
        self.assertEqual(r.status, 200, r)
        x = r.json()["xchg"]
        self.assertEqual(x["status"], "unavailable")
        self.assertEqual(x["error"]["detail"], "section xchg, upstream xchg: the token exchange failed")
        self.assertNotIn(str(port), r.body.decode())
        self.assertNotIn("refused", r.body.decode())
        self.assertIn("token exchange for upstream xchg failed: the token endpoint did not answer (refused",
                      self.gw.log())

    def test_exchanged_tokens_are_cached_per_user_and_never_shared(self):
        self.start_edge()
        a1, b1 = self.auth.token(sub="alice"), self.auth.token(sub="bob")
        ra = self.bearer("/calls", a1).json()["xchg"]["data"]["authorization"]
        ra2 = self.bearer("/calls", a1).json()["xchg"]["data"]["authorization"]
        self.assertEqual(ra, ra2)                      # cached: one exchange for alice
        rb = self.bearer("/calls", b1).json()["xchg"]["data"]["authorization"]
        self.assertNotEqual(ra, rb)                    # bob never gets alice's token
        self.assertEqual([s for s, _ in self.auth.exchanges], [a1, b1])
        # concurrent first requests of one user share one exchange
        c1 = self.auth.token(sub="carol")
        self.auth.token_delay_s = 0.2
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(lambda _: self.bearer("/calls", c1), range(4)))
        self.auth.token_delay_s = 0
        toks = {r.json()["xchg"]["data"]["authorization"] for r in rs}
        self.assertEqual(len(toks), 1, [r.body for r in rs])
        self.assertEqual([s for s, _ in self.auth.exchanges].count(c1), 1)

    def test_a_token_endpoint_that_is_down_fails_the_section_and_a_required_one_fails_the_page(self):
        self.start_edge()
        self.auth.token_down = True
        t = self.auth.token()
        page = self.bearer("/calls", t).json()
        self.assertEqual(page["xchg"]["status"], "unavailable")
        self.assertEqual(page["xchg"]["error"]["type"], "urn:aggway:problem:identity-unavailable")
        # what the token endpoint said (its status, its error code, the audience asked for) is for
        # the log only: the client reads one title and the section's and upstream's names
        self.assertEqual(page["xchg"]["error"]["title"], "the call cannot carry the user's identity")
        self.assertEqual(page["xchg"]["error"]["detail"], "section xchg, upstream xchg: the token exchange failed")
        self.assertIn("token exchange for upstream xchg failed: the token endpoint refused the exchange for "
                      "audience inventory (HTTP 503", self.gw.log())
        self.assertEqual(page["fwd"]["status"], "unavailable")  # aud is aggway only
        self.assertEqual(page["fwd"]["error"]["title"], "the call cannot carry the user's identity")
        self.assertEqual(page["fwd"]["error"]["detail"],
                         "section fwd, upstream fwd: the user's token is not meant for this upstream")
        r = self.bearer("/required", t)
        p = self.assertProblem(r, 503)
        self.assertNotIn("HTTP 503", json.dumps(p))
        # invalid_target is remembered briefly: no second exchange
        self.auth.token_down = False
        self.auth.invalid_targets = {"inventory"}
        u = self.auth.token(sub="dave")
        n = len(self.auth.exchanges)
        self.assertProblem(self.bearer("/required", u), 503)
        self.assertProblem(self.bearer("/required", u), 503)
        self.assertEqual(len(self.auth.exchanges), n + 1)
        del p


class EdgeCheck(GatewayTestCase):
    """aggway check: the edge's options are validated with file:line and did-you-mean."""

    def check(self, gateway_extra, scripts=None, upstreams=None):
        sdir = os.path.join(self.workdir, "s%d" % len(os.listdir(self.workdir)))
        ups = {"product": {"url": "http://127.0.0.1:9"}}
        ups.update(upstreams or {})
        write_scripts(sdir, scripts or {}, gateway_lua(free_port(), ups, **gateway_extra))
        p = run_aggway("check", "-c", sdir)
        return p.returncode, (p.stdout + p.stderr).decode()

    def test_issuer_and_audiences_are_required_unless_turned_off(self):
        # (an attack review: without them any token the keys verified passed, one issued for another
        # application of the identity provider included; RFC 8725 §3.8, §3.9)
        path = os.path.join(self.workdir, "jwks-one.json")
        with open(path, "w") as f:
            json.dump(jose.jwks(jose.Key(self.workdir, "k")), f)
        rc, out = self.check({"auth": {"jwt": {"jwks_file": path}}})
        self.assertNotEqual(rc, 0, out)
        self.assertIn("auth.jwt.issuer: is required", out)
        self.assertIn("auth.jwt.audiences: is required", out)
        rc, out = self.check({"auth": {"jwt": {"issuer": False, "audiences": False, "jwks_file": path}}})
        self.assertEqual(rc, 0, out)
        rc, out = self.check({"auth": {"jwt": {"issuer": "https://id.test", "audiences": ["aggway"], "jwks_file": path}}})
        self.assertEqual(rc, 0, out)

    def test_misspelt_and_wrong_edge_options_are_errors_with_lines(self):
        keys = os.path.join(self.workdir, "jwks.json")
        with open(keys, "w") as f:
            f.write('{"keys":[]}')
        cases = [
            ({"auth": {"jwt": {"isuer": "x", "jwks_file": keys}}}, "auth.jwt.isuer: unknown option (did you mean 'issuer'?)"),
            ({"auth": {"jwt": {"algorithms": ["none"], "jwks_file": keys}}}, "\"none\" is never accepted"),
            ({"auth": {"jwt": {"algorithms": ["RS265"], "jwks_file": keys}}}, "unknown algorithm 'RS265'"),
            ({"auth": {"jwt": {"algorithms": ["HS256"]}}}, "need secret_file"),
            ({"auth": {"jwt": {"issuer": "x"}}}, "the keys are missing"),
            ({"auth": {"jwt": {"issuer": "x", "audiences": ["a"], "jwks_file": keys}}}, "no usable key"),
            ({"auth": {"jwt": {"audiences": ["a"], "jwks_file": keys}}}, "auth.jwt.issuer: is required"),
            ({"auth": {"jwt": {"issuer": "x", "jwks_file": keys}}}, "auth.jwt.audiences: is required"),
            ({"auth": {"jwt": {"issuer": "x", "audiences": [], "jwks_file": keys}}}, "auth.jwt.audiences: must be a list"),
            ({"auth": {"jwt": {"jwks_url": "ftp://x"}}}, "auth.jwt.jwks_url: must be an http"),
            ({"auth": {"api_key": {"file": "x"}}}, "auth.api_key: unknown option (did you mean 'api_keys'?)"),
            ({"auth": {"api_keys": {"file": "missing.json"}}}, "auth.api_keys.file: cannot read"),
            ({"auth": {"default": "jwt"}}, "auth.default: is \"jwt\" but auth has no jwt block"),
            ({"token_exchange": {"url": "http://127.0.0.1:9/token", "client_id": "a", "client_secret": "x"}},
             "token_exchange.client_secret: unknown option (did you mean 'client_secret_file'?)"),
        ]
        for extra, want in cases:
            with self.subTest(want):
                rc, out = self.check(extra)
                self.assertNotEqual(rc, 0, out)
                self.assertRegex(out, r"gateway\.lua:\d+: ")
                self.assertIn(want, out)
        rc, out = self.check({}, upstreams={"product": {"url": "http://127.0.0.1:9", "identity": "exchnage"}})
        self.assertIn("upstreams.product.identity: must be \"forward\", \"exchange\" or \"none\", got string "
                      "\"exchnage\" (did you mean 'exchange'?)", out)
        rc, out = self.check({}, upstreams={"product": {"url": "http://127.0.0.1:9", "identity": "forward"}})
        self.assertIn("upstreams.product.audience: is required", out)
        rc, out = self.check({}, scripts={"x.lua": 'return { route = "GET /x", auth = "jwk", handler = function() end }'})
        self.assertNotEqual(rc, 0)
        self.assertRegex(out, r"x\.lua:1: endpoint: auth: unknown authenticator 'jwk' \(did you mean 'jwt'\?\)")
        rc, out = self.check({}, scripts={"x.lua": 'return { route = "GET /x",\n auth = { jwt = true, scope = {} },\n'
                                                   ' handler = function() end }'})
        self.assertIn("x.lua:2: endpoint: auth: unknown option 'scope' (did you mean 'scopes'?)", out)
        rc, out = self.check({}, scripts={"x.lua": 'return { route = "GET /x", auth = "jwt", handler = function() end }'})
        self.assertIn("gateway.lua has no auth.jwt block", out)


if __name__ == "__main__":
    main()
