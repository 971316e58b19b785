"""HTTPS upstreams: `url = "https://…"` with `tls = { ca_file, server_name, verify }` in gateway.lua.

Given a page with a required Product section (the plain-HTTP mock) and an optional Secure section
served over HTTPS by a Python TLS server whose certificate a throwaway test CA signed (made with the
openssl command in the test's folder):
  - with the CA as ca_file, Secure is `ok` and its calls share one kept-alive TLS connection;
  - when the certificate does not match server_name, or no CA the gateway trusts signed it, Secure is
    `unavailable` with a 502-class `upstream-tls` problem that says why, and the page is still 200;
  - a required section in that state fails the page with 502;
  - `aggway check` reports every tls mistake with file:line, and warns about verify = false."""
import http.server
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, endpoint, gateway_lua, free_port, route, run_aggway, write_scripts, main  # noqa: E402

PAGE = endpoint("GET /page/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. id, required = true },
      secure  = { "secure", "/secure/" .. id },
    })""", deadline_ms=3000)

STRICT_PAGE = endpoint("GET /strict/{id}", """
    return agg.page(agg.fetch_all {
      secure = { "secure", "/secure/" .. req.params.id, required = true },
    })""", deadline_ms=3000)

SCRIPTS = {"page.lua": PAGE, "strict.lua": STRICT_PAGE}
PRODUCT = [route("/products/{id}", json={"id": "{id}", "name": "Sneaker"})]


def make_certificates(d):
    """A test CA (ca.pem) and a certificate it signed for localhost and 127.0.0.1 (srv.pem/srv.key)."""
    def run(*args):
        subprocess.run(args, cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=aggway-test-ca", "-keyout", "ca.key",
        "-out", "ca.pem")
    run("openssl", "req", *ec, "-subj", "/CN=localhost", "-keyout", "srv.key", "-out", "srv.csr")
    with open(os.path.join(d, "srv.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "srv.ext", "-out", "srv.pem")
    return os.path.join(d, "ca.pem"), os.path.join(d, "srv.pem"), os.path.join(d, "srv.key")


class SecureHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, Content-Length framing

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_GET(self):
        with self.server.lock:
            self.server.requests += 1
        body = json.dumps({"secure": True, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class TLSUpstream(http.server.ThreadingHTTPServer):
    """An HTTPS upstream on 127.0.0.1 with cert/key; counts connections and requests."""
    daemon_threads = True

    def __init__(self, cert, key):
        super().__init__(("127.0.0.1", 0), SecureHandler)
        self.lock = threading.Lock()
        self.connections = 0
        self.requests = 0
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        # the handshake runs in the connection's thread, on its first read
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def handle_error(self, request, client_address):
        pass  # a client that refuses the certificate is what some tests want

    def stop(self):
        self.shutdown()
        self.server_close()


class HttpsUpstream(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.certs = os.path.join(self.workdir, "certs")
        os.makedirs(self.certs)
        self.ca, cert, key = make_certificates(self.certs)
        self.upstream = TLSUpstream(cert, key)
        self.addCleanup(self.upstream.stop)

    def start_with_secure(self, **secure):
        opts = {"product": {"timeout_ms": 2000}, "secure": dict(timeout_ms=2000, **secure)}
        self.start(services={"product": PRODUCT}, scripts=SCRIPTS, upstream_options=opts)

    def page(self):
        r = self.get("/page/42")
        self.assertEqual(r.status, 200, r)
        page = r.json()
        self.assertEqual(page["product"]["status"], "ok", r)
        return r, page["secure"]

    def assertTlsProblem(self, section, *words):
        self.assertEqual(section["status"], "unavailable", section)
        err = section["error"]
        self.assertEqual(err["type"].rsplit(":", 1)[-1], "upstream-tls", err)
        self.assertEqual(err["status"], 502, err)
        # the reason is internal: the log has it, the client's problem never does
        text = json.dumps(section)
        for w in words:
            self.assertNotIn(w, text)
            self.assertIn(w, self.gw.log())
        self.assertNotIn("127.0.0.1", text)
        self.assertNotIn(str(self.upstream.port), text)

    def test_https_section_is_ok_over_one_kept_alive_connection(self):
        self.start_with_secure(url="https://localhost:%d/api" % self.upstream.port, tls={"ca_file": self.ca})
        for _ in range(5):
            _, secure = self.page()
            self.assertEqual(secure["status"], "ok", secure)
            self.assertEqual(secure["data"], {"secure": True, "path": "/api/secure/42"})
        self.assertEqual(self.upstream.requests, 5)
        self.assertEqual(self.upstream.connections, 1, "one worker, sequential pages: one TLS connection")
        self.assertLogClean()

    def test_ip_address_url_verifies_the_ip_san(self):
        self.start_with_secure(url="https://127.0.0.1:%d" % self.upstream.port, tls={"ca_file": self.ca})
        _, secure = self.page()
        self.assertEqual(secure["status"], "ok", secure)

    def test_wrong_server_name_makes_section_unavailable_with_tls_problem(self):
        self.start_with_secure(url="https://127.0.0.1:%d" % self.upstream.port,
                               tls={"ca_file": self.ca, "server_name": "billing.internal"})
        r, secure = self.page()
        self.assertTlsProblem(secure, "TLS handshake with upstream secure failed",
                              "certificate verify failed: hostname mismatch")
        self.assertEqual(r.headers.get("x-aggregation-completed"), "false", r)
        self.assertEqual(self.upstream.requests, 0, "nothing is sent to an upstream that was not verified")
        # a required section in that state fails the page with 502
        strict = self.get("/strict/1")
        p = self.assertProblem(strict, 502)
        self.assertEqual(p["sections"]["secure"]["status"], "unavailable", p)

    def test_certificate_from_an_untrusted_ca_makes_section_unavailable(self):
        # no ca_file: the system trust store, which has never heard of the test CA
        self.start_with_secure(url="https://localhost:%d" % self.upstream.port)
        _, secure = self.page()
        self.assertTlsProblem(secure, "certificate verify failed")

    def test_plaintext_upstream_on_https_url_is_a_tls_problem(self):
        # the mock speaks plain HTTP: an https:// URL to it cannot work, and says so
        self.start_mock({"product": PRODUCT})
        self.start_with_secure(url="https://127.0.0.1:%d" % self.mock.ports["product"], tls={"ca_file": self.ca})
        r = self.get("/page/42")
        self.assertEqual(r.status, 200, r)
        self.assertTlsProblem(r.json()["secure"])

    def test_verify_false_accepts_the_certificate_and_warns_at_start(self):
        self.start_with_secure(url="https://127.0.0.1:%d" % self.upstream.port,
                               tls={"verify": False, "server_name": "billing.internal"})
        _, secure = self.page()
        self.assertEqual(secure["status"], "ok", secure)
        self.assertRegex(self.gw.log(), r"warn .*gateway\.lua:\d+: upstreams\.secure\.tls\.verify is false")


class HttpsCheck(unittest.TestCase):
    """`aggway check` on tls mistakes: exit 1, FILE:LINE: where: what."""

    def setUp(self):
        import tempfile
        import shutil
        self.dir = tempfile.mkdtemp(prefix="aggway-https-check-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ca, _, _ = make_certificates(self.dir)

    def check(self, secure_lua):
        src = ('return {\n'
               '  listen = { { port = %d } },\n'
               '  upstreams = {\n'
               '    secure = {\n'
               '%s\n'
               '    },\n'
               '  },\n'
               '}\n') % (free_port(), secure_lua)
        d = os.path.join(self.dir, "s%d" % len(os.listdir(self.dir)))
        write_scripts(d, {"page.lua": endpoint("GET /x", 'return agg.page(agg.fetch_all { s = { "secure", "/" } })')},
                      src)
        p = run_aggway("check", "-c", d)
        return p.returncode, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace"), d

    def assertInvalid(self, secure_lua, line, *words):
        rc, out, d = self.check(secure_lua)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, re.escape(os.path.join(d, "gateway.lua")) + ":%d:" % line, out)
        for w in words:
            self.assertIn(w, out)

    def test_valid_https_upstream_passes(self):
        rc, out, _ = self.check('      url = "https://localhost:8443/api",\n'
                                '      tls = { ca_file = "%s", server_name = "localhost" },' % self.ca)
        self.assertEqual(rc, 0, out)

    def test_relative_ca_file_is_read_from_the_scripts_folder(self):
        rc, out, d = self.check('      url = "https://localhost",\n      tls = { ca_file = "ca.pem" },')
        self.assertEqual(rc, 1, out)  # not copied there yet
        self.assertIn("cannot read " + os.path.join(d, "ca.pem"), out)
        with open(self.ca) as src, open(os.path.join(d, "ca.pem"), "w") as dst:
            dst.write(src.read())
        p = run_aggway("check", "-c", d)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_tls_on_http_url(self):
        self.assertInvalid('      url = "http://localhost:9001",\n      tls = { verify = true },', 6,
                           "upstreams.secure.tls", "only for https://")

    def test_unknown_tls_option_suggests_the_name(self):
        self.assertInvalid('      url = "https://localhost",\n      tls = { ca_fil = "x.pem" },', 6,
                           "upstreams.secure.tls.ca_fil", "unknown option", "ca_file")

    def test_wrong_types(self):
        self.assertInvalid('      url = "https://localhost",\n      tls = {\n        verify = "yes" },', 7,
                           "upstreams.secure.tls.verify", "true or false")
        self.assertInvalid('      url = "https://localhost",\n      tls = {\n        server_name = 42 },', 7,
                           "upstreams.secure.tls.server_name", "host name")
        self.assertInvalid('      url = "https://localhost",\n      tls = "strict",', 6,
                           "upstreams.secure.tls", "must be a table")

    def test_missing_or_non_pem_ca_file(self):
        self.assertInvalid('      url = "https://localhost",\n      tls = {\n        ca_file = "/nonexistent/ca.pem" },',
                           7, "upstreams.secure.tls.ca_file", "cannot read /nonexistent/ca.pem")
        self.assertInvalid('      url = "https://localhost",\n      tls = {\n        ca_file = "%s" },'
                           % os.path.join(self.dir, "srv.ext"), 7, "upstreams.secure.tls.ca_file", "no PEM certificate")

    def test_other_schemes_are_refused(self):
        self.assertInvalid('      url = "ftp://localhost"', 5, "upstreams.secure.url", "http:// or https://")

    def test_verify_false_passes_with_a_warning(self):
        rc, out, _ = self.check('      url = "https://localhost",\n      tls = { verify = false },')
        self.assertEqual(rc, 0, out)
        self.assertIn("upstreams.secure.tls.verify is false", out)


if __name__ == "__main__":
    main()
