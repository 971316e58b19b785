#!/usr/bin/env python3
"""A mock authorization server and identity-aware service for aggway's edge tests and demo.

One HTTP/1.1 server (loopback, a free port) plays three parts:
  GET  /jwks              the JWKS (RFC 7517 §5) of the keys it signs with; rotate() changes them
  POST /token             an OAuth 2.0 Token Exchange endpoint (RFC 8693 §2): HTTP Basic client
                          authentication (RFC 6749 §2.3.1), grant_type token-exchange, subject_token,
                          audience; answers { access_token, issued_token_type, token_type, expires_in }
  GET  /svc/NAME/...      a service that answers with the Authorization it received (to see what
                          identity a call carried)
Failures are set on the object (or by POST /admin/state with a JSON object of them): jwks_down,
jwks_delay_s, token_down, token_delay_s, invalid_targets, expires_in. Counters: jwks_fetches, exchanges.

As a library (tests): MockAuth(workdir).start() ... .stop(). As a program (the demo):
  mock_auth.py --port 9500 --client-id aggway --client-secret s3cret --write-token-to FILE
prints a signed user token to FILE and serves until killed.
"""
import argparse
import base64
import hashlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jose_openssl as jose  # noqa: E402

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"


class MockAuth:
    def __init__(self, workdir, issuer="https://id.test", client_id="aggway", client_secret="s3cret", port=0):
        self.workdir, self.issuer = workdir, issuer
        self.client_id, self.client_secret = client_id, client_secret
        self.keys = [jose.Key(workdir, "k1")]
        self.published = list(self.keys)     # keys in the JWKS
        self.jwks_down = False
        self.jwks_delay_s = 0.0
        self.jwks_max_age = None
        self.token_down = False
        self.token_delay_s = 0.0
        self.invalid_targets = set()
        self.expires_in = 300
        self.jwks_fetches = 0
        self.exchanges = []                  # (subject_token, audience) per request
        self.issued = 0
        self.lock = threading.Lock()
        self.port = port
        self.server = None

    # keys and tokens ---------------------------------------------------------------------------
    def rotate(self, kid, kind="RSA", keep_old=True):
        """A new signing key, published in the JWKS (with the old ones when keep_old)."""
        k = jose.Key(self.workdir, kid, kind)
        self.keys.insert(0, k)
        self.published = [k] + (self.published if keep_old else [])
        return k

    def token(self, sub="alice", aud=("aggway",), scope="orders:read", exp_in=300, key=None, alg="RS256", **claims):
        now = int(time.time())
        c = {"iss": self.issuer, "sub": sub, "aud": list(aud) if len(aud) != 1 else aud[0], "iat": now,
             "exp": now + exp_in, "scope": scope}
        c.update(claims)
        return jose.token(key or self.keys[0], c, alg=alg)

    # serving -----------------------------------------------------------------------------------
    def url(self, path=""):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def start(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_json(self, status, doc, headers=None):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/jwks":
                    if outer.jwks_delay_s:
                        time.sleep(outer.jwks_delay_s)
                    with outer.lock:
                        outer.jwks_fetches += 1
                        down, doc = outer.jwks_down, jose.jwks(*outer.published)
                    if down:
                        return self.send_json(503, {"error": "down"})
                    h = {"Cache-Control": "max-age=%d" % outer.jwks_max_age} if outer.jwks_max_age else None
                    return self.send_json(200, doc, h)
                if self.path.startswith("/svc/"):
                    name = self.path.split("/")[2]
                    return self.send_json(200, {"service": name, "authorization": self.headers.get("Authorization")})
                if self.path.startswith("/admin/state"):
                    return self.send_json(200, {"jwks_fetches": outer.jwks_fetches, "exchanges": len(outer.exchanges)})
                self.send_json(404, {"error": "not found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n).decode()
                if self.path.startswith("/admin/"):
                    return outer.admin(self, self.path, raw)
                if self.path != "/token":
                    return self.send_json(404, {"error": "not found"})
                form = dict(urllib.parse.parse_qsl(raw))
                auth = self.headers.get("Authorization", "")
                want = "Basic " + base64.b64encode(("%s:%s" % (urllib.parse.quote(outer.client_id, safe=""),
                                                               urllib.parse.quote(outer.client_secret, safe=""))
                                                    ).encode()).decode()
                if auth != want:
                    return self.send_json(401, {"error": "invalid_client"}, {"WWW-Authenticate": "Basic"})
                if outer.token_delay_s:
                    time.sleep(outer.token_delay_s)
                if outer.token_down:
                    return self.send_json(503, {"error": "temporarily_unavailable"})
                if form.get("grant_type") != TOKEN_EXCHANGE or not form.get("subject_token") or \
                        form.get("subject_token_type") != ACCESS_TOKEN or not form.get("audience"):
                    return self.send_json(400, {"error": "invalid_request"})
                aud = form["audience"]
                with outer.lock:
                    outer.exchanges.append((form["subject_token"], aud))
                    outer.issued += 1
                    seq = outer.issued
                if aud in outer.invalid_targets:
                    return self.send_json(400, {"error": "invalid_target"})
                subj = hashlib.sha256(form["subject_token"].encode()).hexdigest()[:16]
                return self.send_json(200, {"access_token": "xt.%s.%s.%d" % (aud, subj, seq),
                                            "issued_token_type": ACCESS_TOKEN, "token_type": "Bearer",
                                            "expires_in": outer.expires_in})

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def admin(self, handler, path, raw):
        doc = json.loads(raw or "{}")
        for k in ("jwks_down", "jwks_delay_s", "token_down", "token_delay_s", "expires_in"):
            if k in doc:
                setattr(self, k, doc[k])
        if "invalid_targets" in doc:
            self.invalid_targets = set(doc["invalid_targets"])
        handler.send_json(200, {"ok": True})

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=9500)
    ap.add_argument("--client-id", default="aggway")
    ap.add_argument("--client-secret", default="s3cret")
    ap.add_argument("--issuer", default="https://id.test")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--write-token-to", default=None, help="write a signed token for user alice to this file")
    a = ap.parse_args()
    import tempfile
    m = MockAuth(a.workdir or tempfile.mkdtemp(prefix="mock-auth-"), a.issuer, a.client_id, a.client_secret,
                 a.port).start()
    if a.write_token_to:
        with open(a.write_token_to, "w") as f:
            f.write(m.token(exp_in=3600) + "\n")
    print("mock-auth listening on %s (JWKS %s, token endpoint %s)" % (m.url(), m.url("/jwks"), m.url("/token")),
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        m.stop()


if __name__ == "__main__":
    main()
