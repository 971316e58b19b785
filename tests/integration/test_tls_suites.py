"""The TLS listener offers AEAD suites only (Mozilla's intermediate profile): one handshake per
protocol version and cipher suite, with OpenSSL (python's ssl and `openssl s_client`).

- TLS 1.2: every CBC suite (and every other non-AEAD suite OpenSSL knows) is refused; the ECDHE
  AES-GCM and ChaCha20-Poly1305 suites of the certificate's key type (RSA here) are accepted.
- TLS 1.3: each of OpenSSL's three default suites is accepted.
- TLS 1.0 and 1.1 are refused.
"""
import os
import re
import ssl
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import GatewayTestCase, demo_services, main, repo_scripts  # noqa: E402

AEAD_RSA = {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-CHACHA20-POLY1305"}


def tls12_suites():
    """Every cipher suite this OpenSSL can offer with TLS 1.2 (TLS 1.3 suites excluded)."""
    out = subprocess.run(["openssl", "ciphers", "-v", "ALL:COMPLEMENTOFALL:@SECLEVEL=0"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    names = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 2 and f[1] != "TLSv1.3":
            names.append(f[0])
    return names


def handshake(port, version, cipher=None):
    """The suite negotiated by a handshake at this version offering only cipher, or None when the
    gateway refused it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = version
    ctx.maximum_version = version
    if cipher:
        ctx.set_ciphers(cipher + ":@SECLEVEL=0")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                return s.cipher()[0]
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return None


class TlsSuites(GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.start(services=demo_services(0, 0, 0), scripts=repo_scripts("product-page.lua"), tls=True)

    def test_tls12_accepts_the_aead_suites_and_refuses_every_other(self):
        accepted = set()
        tried = 0
        for name in tls12_suites():
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).set_ciphers(name + ":@SECLEVEL=0")
            except ssl.SSLError:
                continue  # not offerable by this client build
            tried += 1
            got = handshake(self.tls_port, ssl.TLSVersion.TLSv1_2, name)
            if got:
                self.assertEqual(got, name)
                accepted.add(got)
        self.assertGreater(tried, 30, "the client offered too few suites for the test to mean anything")
        self.assertEqual(accepted, AEAD_RSA)

    def test_cbc_suites_are_refused_by_openssl_s_client(self):
        for suite in ("ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA384", "AES128-SHA256", "AES256-SHA"):
            p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.tls_port, "-tls1_2",
                                "-cipher", suite + ":@SECLEVEL=0"], input="", capture_output=True, text=True,
                               timeout=30)
            self.assertNotEqual(p.returncode, 0, suite)
            self.assertIn("Cipher is (NONE)", p.stdout, suite)  # no suite in common: no session
        p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.tls_port, "-tls1_2",
                            "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"], input="", capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"Cipher is ECDHE-RSA-AES128-GCM-SHA256")

    def test_tls13_accepts_its_default_suites(self):
        for suite in ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"):
            p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.tls_port, "-tls1_3",
                                "-ciphersuites", suite], input="", capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("Cipher is " + suite, p.stdout)
        self.assertEqual(handshake(self.tls_port, ssl.TLSVersion.TLSv1_3), "TLS_AES_256_GCM_SHA384")

    def test_tls10_and_tls11_are_refused(self):
        for flag in ("-tls1", "-tls1_1"):
            p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % self.tls_port, flag,
                                "-cipher", "ALL:@SECLEVEL=0"], input="", capture_output=True, text=True, timeout=30)
            self.assertNotEqual(p.returncode, 0, flag)
            self.assertFalse(re.search(r"Cipher is (?!\(NONE\))", p.stdout), p.stdout)

    def test_a_page_over_tls12_aead(self):
        r = self.get_tls("/product-page/42", "--tlsv1.2", "--tls-max", "1.2", "--ciphers",
                         "ECDHE-RSA-CHACHA20-POLY1305")
        self.assertEqual(r.status, 200, r)


if __name__ == "__main__":
    main()
