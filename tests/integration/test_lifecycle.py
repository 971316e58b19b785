"""Lifecycle (issue 4, "Shutdown"): SIGTERM/SIGINT stop accepting, let the requests in flight finish
up to shutdown_grace_ms, then exit 0; /readyz says 503 while draining.

A page whose Product call takes 1 s: one request is in flight when SIGTERM arrives and completes
with 200; new connections are refused after the signal; the process exits 0 within the grace. With
a grace shorter than the page, the request is cut and the process still exits 0 in time."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GatewayTestCase, SLOW, curl, demo_services, endpoint, free_port, route,  # noqa: E402
                     tcp_connects, wait_until, main)

PAGE = endpoint("GET /slow/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. id, required = true, timeout_ms = 4000 },
    })""", deadline_ms=5000)

SLACK = 3.0 if SLOW else 1.5


def admin_status(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        return int(data.split(b" ", 2)[1])
    except (OSError, IndexError, ValueError):
        return None


class Lifecycle(GatewayTestCase):

    def start_slow(self, grace_ms=None, product_ms=1000):
        self.admin_port = free_port()
        extra = {"admin": {"port": self.admin_port, "host": "127.0.0.1"}}
        if grace_ms is not None:
            extra["shutdown_grace_ms"] = grace_ms
        self.start(services=demo_services(product_ms=[route("/products/{id}", latency_ms=product_ms,
                                                            json={"id": "{id}", "name": "Sneaker"})]),
                   scripts={"slow.lua": PAGE}, upstream_options={"product": {"timeout_ms": 4000}},
                   gateway_extra=extra, workers=2)
        self.assertTrue(wait_until(lambda: admin_status(self.admin_port, "/readyz") == 200, 5), self.gw.log())

    def request_in_background(self, path):
        """Starts GET path in a thread; returns (thread, box) where box gets the Response."""
        box = {}

        def run():
            box["r"] = curl(self.url(path), timeout=15, workdir=self.workdir)
        t = threading.Thread(target=run)
        t.start()
        return t, box

    def wait_in_flight(self, n=1):
        """Until the mock has n requests in flight (the gateway's calls have started)."""
        ok = wait_until(lambda: self.mock.stats()["product"]["in_flight"] >= n, 5)
        self.assertTrue(ok, "the request did not reach the upstream")

    def test_sigterm_lets_the_request_in_flight_finish_refuses_new_connections_and_exits_0(self):
        product_s = 3.0
        self.start_slow(product_ms=int(product_s * 1000))
        t, box = self.request_in_background("/slow/1")
        self.wait_in_flight()
        sent = time.monotonic()
        self.gw.proc.send_signal(signal.SIGTERM)
        # the listeners close at once, while the request (3 s) is still in flight: the gateway says
        # so once every worker has closed its own (until then a connection may still reach a worker
        # that has not, while one queued at a closing listener is reset); wait for whichever comes
        # first, then the listeners must be closed and the request unfinished (a gateway that keeps
        # accepting until it has drained fails either way); the admin says not ready meanwhile
        wait_until(lambda: "stopping: no new connections" in self.gw.log() or "r" in box, product_s + SLACK)
        self.assertFalse(tcp_connects(self.port), "the gateway still accepts")
        self.assertNotIn("r", box, "the listeners closed only after the request in flight finished")
        self.assertEqual(admin_status(self.admin_port, "/readyz"), 503)
        self.assertIsNone(self.gw.proc.poll(), "the gateway must wait for the request in flight")
        t.join(10)
        r = box["r"]
        self.assertEqual(r.status, 200, r)
        self.assertIn("Sneaker", str(r.body))
        rc = self.gw.proc.wait(timeout=5)
        took = time.monotonic() - sent
        self.assertEqual(rc, 0, self.gw.log())
        self.assertLess(took, product_s + SLACK, "exit after the request, well within the grace (10 s)")
        self.assertIn("every request finished", self.gw.log())
        self.assertLogClean()

    def test_sigint_with_nothing_in_flight_exits_at_once(self):
        self.start_slow()
        sent = time.monotonic()
        self.gw.proc.send_signal(signal.SIGINT)
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())
        self.assertLess(time.monotonic() - sent, SLACK)

    def test_request_past_the_grace_is_cut_and_the_process_still_exits_0(self):
        self.start_slow(grace_ms=300, product_ms=3000)
        t, box = self.request_in_background("/slow/2")
        self.wait_in_flight()
        sent = time.monotonic()
        self.gw.proc.send_signal(signal.SIGTERM)
        rc = self.gw.proc.wait(timeout=5)
        took = time.monotonic() - sent
        self.assertEqual(rc, 0, self.gw.log())
        self.assertGreaterEqual(took, 0.25)
        self.assertLess(took, 0.3 + SLACK)
        t.join(10)
        self.assertNotEqual(box["r"].status, 200, box["r"])
        self.assertIn("grace period of 300 ms over, cutting 1 request", self.gw.log())

    def test_shutdown_grace_ms_is_checked(self):
        for bad in ("-1", "1.5", '"10s"'):
            sdir = os.path.join(self.workdir, "bad%s" % abs(hash(bad)))
            os.makedirs(sdir)
            with open(os.path.join(sdir, "gateway.lua"), "w") as f:
                f.write("return {\n  listen = { { port = %d } },\n  shutdown_grace_ms = %s,\n}\n" % (free_port(), bad))
            out = subprocess.run([os.environ.get("AGGWAY_BIN", "aggway"), "check", "-c", sdir],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
            self.assertNotEqual(out.returncode, 0, out.stdout)
            self.assertIn(b"gateway.lua:3: shutdown_grace_ms", out.stdout)


if __name__ == "__main__":
    main()
