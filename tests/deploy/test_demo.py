"""tools/demo says each step while it builds and starts, turns on the admin listener and prints the
links to the waterfall page and /metrics, a line per route the gateway serves, and commands that
work as printed (making one route of Reviews hang and bringing it back). The demo's ports are fixed (8080, 9090, 9001-9003, 9100),
so the test runs it in a network namespace of its own: nothing on the machine is in its way."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

SRC = harness.SOURCE_DIR


class Demo(unittest.TestCase):
    def test_demo_prints_the_admin_links_and_a_line_per_route_and_they_answer(self):
        if os.environ.get("AGGWAY_TEST_NETNS") != "1":
            script = "ip link set lo up && exec python3 %s" % os.path.abspath(__file__)
            p = subprocess.run(["unshare", "--net", "sh", "-c", script], env=dict(os.environ, AGGWAY_TEST_NETNS="1"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
            out = p.stdout.decode(errors="replace")
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("Ran 1 test", out)
            return
        log = tempfile.TemporaryFile()
        self.addCleanup(log.close)
        demo = subprocess.Popen([os.path.join(SRC, "tools", "demo")], cwd=SRC, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

        def stop():
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGTERM)
                try:
                    demo.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(demo.pid, signal.SIGKILL)
                    demo.wait(timeout=30)
        self.addCleanup(stop)

        def text():
            # pread: the file's offset is the demo's too (its processes write through the same open
            # file); a seek here moved it back to 0 and the gateway's next log line overwrote the
            # demo's first lines
            fd = log.fileno()
            return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
        end = time.monotonic() + 500
        while "Press Ctrl-C to stop." not in text() and demo.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        out = text()
        self.assertIn("Press Ctrl-C to stop.", out)
        # it says what it does while it works, the build's progress included
        steps = re.findall(r"(?m)^tools/demo: ([1-5])/5 ", out)
        self.assertEqual(steps, ["1", "2", "3", "4", "5"], out)
        self.assertRegex(out, r"(?m)^tools/demo:     built 100%$")
        self.assertIn("http://127.0.0.1:9090/waterfall", out)
        self.assertIn("http://127.0.0.1:9090/metrics", out)
        routes = re.findall(r'(?m)^  (GET \S+)\s+(\S+\.lua)\s+curl -i (?:-H "Authorization: Bearer \$\(cat (\S+)\)" )?'
                            r'(http://localhost:8080\S+)$', out)
        want = set()
        for name, src in harness.repo_scripts(protected=True).items():
            for r in re.findall(r'route = "([^"]+)"', src):
                want.add((r, os.path.basename(name)))
        self.assertEqual({(r, f) for r, f, _, _ in routes}, want, out)
        protected = [(url, token_file) for _r, _f, token_file, url in routes if token_file]
        self.assertEqual([url for url, _ in protected], ["http://localhost:8080/account/42"], out)
        for _route, _file, token_file, url in routes:
            args = ("-H", "Authorization: Bearer " + open(token_file).read().strip()) if token_file else ()
            r = harness.curl(url, *args)
            self.assertEqual(r.status, 200, r)
        # the protected page as the printed commands show it: 401 with an RFC 6750 challenge and a
        # problem body without a token, and with a forged signature; 200 as the demo's user with it
        url, token_file = protected[0]
        token = open(token_file).read().strip()
        self.assertIn("curl -i http://localhost:8080/account/42", out)
        self.assertIn("TOKEN=$(cat %s)" % token_file, out)
        r = harness.curl(url)
        self.assertEqual(r.status, 401, r)
        self.assertTrue(r.headers["www-authenticate"].startswith("Bearer"), r)
        self.assertEqual(r.headers["content-type"], "application/problem+json", r)
        self.assertEqual(r.json()["status"], 401)
        forged = token.rsplit(".", 1)[0] + ".Zm9yZ2Vk"
        r = harness.curl(url, "-H", "Authorization: Bearer " + forged)
        self.assertEqual(r.status, 401, r)
        self.assertIn('error="invalid_token"', r.headers["www-authenticate"])
        r = harness.curl(url, "-H", "Authorization: Bearer " + token)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["customer"]["data"]["sub"], "alice")
        self.assertEqual(r.headers["cache-control"], "private")
        # the printed way to make Reviews hang hangs the product page's reviews only: the
        # dependent chain's /reviews?sku= route keeps answering; the printed way back restores it
        hang, back = re.findall(r"(?m)^  (curl -s -X PATCH http://localhost:9100/services/reviews/routes -d '[^']*')",
                                out)
        subprocess.run(hang, shell=True, check=True, timeout=30, stdout=subprocess.DEVNULL)
        page = harness.curl("http://localhost:8080/product-page/42")
        self.assertEqual(page.status, 200, page)
        self.assertEqual(page.json()["reviews"]["status"], "unavailable", page.body)
        chain = harness.curl("http://localhost:8080/product-detail/42")
        self.assertEqual(chain.json()["reviews"]["status"], "ok", chain.body)
        subprocess.run(back, shell=True, check=True, timeout=30, stdout=subprocess.DEVNULL)
        page = harness.curl("http://localhost:8080/product-page/42")
        self.assertEqual(page.json()["reviews"]["status"], "ok", page.body)
        page = harness.curl("http://127.0.0.1:9090/waterfall")
        self.assertEqual(page.status, 200)
        self.assertIn(b"/product-page/42", page.body)       # the demo's first pages are on it
        metrics = harness.curl("http://127.0.0.1:9090/metrics")
        self.assertIn(b'aggway_requests_total{route="GET /product-page/{id}",code="200"}', metrics.body)
        stop()
        self.assertFalse(harness.tcp_connects(8080))


if __name__ == "__main__":
    unittest.main(verbosity=2)
