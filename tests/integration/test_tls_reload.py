"""Certificate rotation on reload: SIGHUP reads every TLS listener's `cert` and `key` again.

- The same paths with new contents, or new paths: connections accepted after the reload get the
  new certificate over h2; connections opened before keep theirs and go on serving requests,
  even one whose TLS handshake had not started when the reload came.
- A key that does not load or is not the certificate's fails the reload with gateway.lua's
  file:line, the listener and the file (log and admin /reload); the certificate serving goes on.
- Turning TLS on or off on a listener still needs a restart.
"""
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from h2_client import H2Client  # noqa: E402
from harness import make_self_signed_cert, main, run_aggway, wait_until  # noqa: E402
from test_reload import WAIT, ReloadCase, version_of  # noqa: E402


def der_of(cert_path):
    with open(cert_path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def accept_queue(port):
    """Connections the kernel holds for the listening sockets on port that no worker has accepted
    yet (Linux: the rx_queue of a LISTEN socket in /proc/net/tcp is its accept backlog)."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                n += int(fields[4].split(":")[1], 16)
    return n


class Cert:
    """A certificate as a test names it: equal by its DER bytes, shown by its name."""

    def __init__(self, name, der):
        self.name, self.der = name, der

    def __eq__(self, other):
        return isinstance(other, Cert) and self.der == other.der

    def __repr__(self):
        return "certificate %s (sha256 %s…)" % (self.name, hashlib.sha256(self.der).hexdigest()[:12])


class CertificateReload(ReloadCase):

    def setUp(self):
        super().setUp()
        self.start_gateway(tls=True)
        # the files gateway.lua names (harness: cert.pem and key.pem of the work folder): cert A
        self.cert, self.key = os.path.join(self.workdir, "cert.pem"), os.path.join(self.workdir, "key.pem")
        self.known = {}
        self.cert_a = self.named("A", der_of(self.cert))

    def named(self, name, der):
        self.known[der] = Cert(name, der)
        return self.known[der]

    def seen(self, conn):
        """The certificate conn got from the gateway."""
        der = conn.peer_cert_der()
        return self.known.get(der) or Cert("unknown", der)

    def make_cert(self, name):
        """A new certificate and key in the work folder: (cert path, key path, Cert)."""
        cert, key = make_self_signed_cert(self.workdir, name.lower() + "-")
        return cert, key, self.named(name, der_of(cert))

    def install(self, cert, key):
        """Puts the contents of cert and key at the paths gateway.lua names (each file at once)."""
        for src, dst in ((cert, self.cert), (key, self.key)):
            shutil.copyfile(src, dst + ".tmp~")
            os.replace(dst + ".tmp~", dst)

    def not_a_key(self):
        """A file that looks like a PEM key (so only OpenSSL finds out) and is not one."""
        path = os.path.join(self.workdir, "not-a-key.pem")
        with open(path, "w") as f:
            f.write("-----BEGIN PRIVATE KEY-----\nAAAAnot a key\n-----END PRIVATE KEY-----\n")
        return path

    def accepted_without_handshake(self):
        """A connection a worker has accepted and whose TLS handshake has not started."""
        c = H2Client(self.tls_port)
        self.addCleanup(c.close)
        time.sleep(0.05)
        self.assertTrue(wait_until(lambda: accept_queue(self.tls_port) == 0, WAIT), "no worker accepted it")
        return c

    def connect(self):
        return H2Client(self.tls_port).start_tls()

    def assertServes(self, cert, n=6, what=""):
        """n new h2 connections (spread over the workers) get cert and a page."""
        for i in range(n):
            with self.connect() as c:
                self.assertEqual(self.seen(c), cert, "%s: connection %d" % (what, i))
                self.assertPage(c, 7000 + i)

    def assertPage(self, c, n):
        status, body = c.get("/shape/%d" % n)
        self.assertEqual(status, 200, body)
        self.assertIsNotNone(version_of(200, json.loads(body)), body)

    def gateway_line(self, needle):
        lines = self.read("gateway.lua").splitlines()
        return next(i for i, l in enumerate(lines, 1) if needle in l)

    def test_same_paths_new_contents_new_connections_get_the_new_certificate_open_ones_keep_working(self):
        self.assertServes(self.cert_a, n=2, what="before the reload")
        old = self.connect()
        self.addCleanup(old.close)
        self.assertPage(old, 1)
        early = self.accepted_without_handshake()
        b_cert, b_key, cert_b = self.make_cert("B")
        self.install(b_cert, b_key)
        self.reload_ok(2)
        self.assertServes(cert_b, what="after the reload")
        # the connection opened before the reload: its certificate, and requests still served
        self.assertEqual(self.seen(old), self.cert_a)
        for n in range(2, 5):
            self.assertPage(old, n)
        early.start_tls()
        self.assertEqual(self.seen(early), self.cert_a, "accepted before the reload: the old certificate")
        self.assertPage(early, 5)
        self.assertRegex(self.gw.log(), r"reload: new TLS connections on 0\.0\.0\.0:%d get the certificate %s "
                         r"\(subject CN=localhost, expires " % (self.tls_port, re.escape(self.cert)))
        self.assertLogClean()

    def test_a_key_that_does_not_load_fails_the_reload_and_new_paths_are_taken(self):
        b_cert, b_key, cert_b = self.make_cert("B")
        c_cert, c_key, cert_c = self.make_cert("C")
        self.install(b_cert, b_key)
        self.reload_ok(2)
        self.assertServes(cert_b, what="B installed")
        old = self.connect()
        self.addCleanup(old.close)
        self.assertPage(old, 1)
        key_line = self.gateway_line("key = ")
        cases = [
            ("another certificate's key", lambda: self.install(b_cert, c_key),
             r"gateway\.lua:%d: listen\[2\]\.tls\.key: the private key %s does not match the certificate %s"
             % (key_line, re.escape(self.key), re.escape(self.cert))),
            ("a key that is not one", lambda: self.install(b_cert, self.not_a_key()),
             r"gateway\.lua:%d: listen\[2\]\.tls\.key: cannot load the private key %s"
             % (key_line, re.escape(self.key))),
            ("a missing key", lambda: os.remove(self.key),
             r"gateway\.lua:%d: listen\[2\]\.tls\.key: cannot read %s" % (key_line, re.escape(self.key))),
        ]
        failures = 0
        for what, breaks, pattern in cases:
            with self.subTest(what):
                breaks()
                failures += 1
                rec = self.reload_fails(failures)
                self.assertEqual(rec["generation"], 2)
                self.assertRegex("\n".join(rec["last_reload"]["errors"]), pattern)
                self.assertRegex(self.gw.log(), r"error reload failed, generation 2 keeps serving: .*" + pattern)
                self.assertServes(cert_b, n=2, what="after a failed reload")
                self.install(b_cert, b_key)
        # TLS off on the listener: a listener change, restart only
        gw = self.read("gateway.lua")
        tls_off = re.sub(r",\s*tls = \{[^}]*\}", "", gw)
        self.assertNotIn("tls", tls_off)
        self.write("gateway.lua", tls_off)
        failures += 1
        rec = self.reload_fails(failures)
        self.assertRegex("\n".join(rec["last_reload"]["errors"]),
                         r"gateway\.lua:\d+: listen: the listeners \(ports, hosts, reuse_port, or TLS turned on or off\) changed; "
                         r".*needs a restart")
        self.assertServes(cert_b, n=2, what="after TLS off was refused")
        self.write("gateway.lua", gw)
        # the connection opened before all of that still serves
        self.assertEqual(self.seen(old), cert_b)
        self.assertPage(old, 2)
        # new paths; a connection whose handshake starts after the reload was accepted with B,
        # which then has no other user: it must still be there for it
        old.close()
        early = self.accepted_without_handshake()
        self.write("gateway.lua", self.read("gateway.lua").replace(self.cert, c_cert).replace(self.key, c_key))
        self.reload_ok(3)
        self.assertServes(cert_c, what="new paths")
        early.start_tls()
        self.assertEqual(self.seen(early), cert_b)
        self.assertPage(early, 9)
        self.assertTrue(wait_until(lambda: self.reload_record()["generations_live"] == 1, WAIT), self.reload_record())

    def test_a_fifo_device_or_directory_at_a_certificate_path_fails_the_reload_at_once(self):
        # opening a FIFO waits for a writer and /dev/zero never ends: the reload (and with it the
        # main thread, which also handles SIGTERM) must not wait on either
        b_cert, b_key, cert_b = self.make_cert("B")
        self.install(b_cert, b_key)
        self.reload_ok(2)
        cert_line, key_line = self.gateway_line("cert = "), self.gateway_line("key = ")
        cases = [
            ("a FIFO as the certificate", self.cert, lambda p: os.mkfifo(p), cert_line, "cert",
             "not a regular file"),
            ("a symlink to /dev/zero as the key", self.key, lambda p: os.symlink("/dev/zero", p), key_line, "key",
             "not a regular file"),
            ("a directory as the certificate", self.cert, lambda p: os.mkdir(p), cert_line, "cert", "a directory"),
        ]
        failures = 0
        for what, path, make, line, kind, why in cases:
            with self.subTest(what):
                os.remove(path)
                make(path)
                failures += 1
                rec = self.reload_fails(failures)
                self.assertRegex("\n".join(rec["last_reload"]["errors"]),
                                 r"gateway\.lua:%d: listen\[2\]\.tls\.%s: cannot read %s: %s"
                                 % (line, kind, re.escape(path), why))
                self.assertServes(cert_b, n=2, what="after " + what)
                os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
                self.install(b_cert, b_key)
        self.reload_ok(3)
        self.assertServes(cert_b, n=2, what="files back")

    def test_an_expired_certificate_is_served_with_a_warning(self):
        # an operator may have nothing better at hand: the reload takes it, and the log says so
        key = os.path.join(self.workdir, "exp-key.pem")
        csr, cert = os.path.join(self.workdir, "exp.csr"), os.path.join(self.workdir, "exp-cert.pem")
        for cmd in (["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj",
                     "/CN=expired"],
                    ["openssl", "x509", "-req", "-in", csr, "-signkey", key, "-out", cert, "-days", "-1"]):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        expired = self.named("expired", der_of(cert))
        self.install(cert, key)
        self.reload_ok(2)
        self.assertServes(expired, n=2, what="expired")
        self.assertRegex(self.gw.log(), r"warn reload: new TLS connections on 0\.0\.0\.0:%d get the certificate %s "
                         r"\(subject CN=expired, expires [^)]*\); it has EXPIRED" % (self.tls_port, re.escape(self.cert)))
        # aggway check says so too (the folder is valid: serve would serve it)
        out = run_aggway("check", "-c", self.scripts_dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stderr.decode(), r"gateway\.lua: warning: listen 0\.0\.0\.0:%d: the certificate %s "
                         r"\(subject CN=expired, expires [^)]*\); it has EXPIRED" % (self.tls_port, re.escape(self.cert)))


if __name__ == "__main__":
    main()
