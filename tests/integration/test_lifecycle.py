"""Lifecycle (issue 4, "Shutdown"): SIGTERM/SIGINT stop accepting, let the requests in flight finish
up to shutdown_grace_ms, then exit 0; /readyz says 503 while draining.

A page whose Product call takes 1 s: one request is in flight when SIGTERM arrives and completes
with 200; new connections are refused after the signal; the process exits 0 within the grace. With
a grace shorter than the page, the request is cut and the process still exits 0 in time."""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GatewayTestCase, SLOW, curl, demo_services, endpoint, free_port, route,  # noqa: E402
                     tcp_connects, wait_until, main)
from h2_client import (DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, SETTINGS, H2Client,  # noqa: E402
                       _literal)

PAGE = endpoint("GET /slow/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. id, required = true, timeout_ms = 4000 },
    })""", deadline_ms=5000)

SLACK = 3.0 if SLOW else 1.5


def admin_status(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
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
        # it began before the drain, on a keep-alive connection: its response closes the connection
        # (the client learns there and then, not by a reset on its next request)
        self.assertEqual(r.headers.get("connection"), "close", r)
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


ECHO = endpoint("POST /echo", """
    return { status = 200, json = { got = #(req.body or "") } }""")
FAST = endpoint("GET /fast", """
    return { status = 200, json = { ok = true } }""")


def read_http1(sock, timeout=10):
    """One HTTP/1.1 response with a Content-Length from sock: (status, headers, body)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("closed before a response: %r" % data)
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def accept_queue(port):
    """Connections the kernel holds for the gateway's listening sockets on port that no worker has
    accepted yet (/proc/net/tcp: a LISTEN socket's rx_queue is its accept queue)."""
    total = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                total += int(cols[4].split(":")[1], 16)
    return total


class Drain(GatewayTestCase):
    """What a graceful shutdown waits for besides the requests in flight (docs/operations.md,
    "Shutdown"): a request still arriving when SIGTERM comes (HTTP/1 and HTTP/2 bodies, sent in
    two parts around the signal: no timing involved) and a connection accepted before the listeners
    closed that sends its request just after are served; responses from then on close their
    HTTP/1 connection; connections idle between requests do not hold the exit."""

    def start_gw(self):
        self.start(services=demo_services(), scripts={"echo.lua": ECHO, "fast.lua": FAST},
                   gateway_extra={"shutdown_grace_ms": 10000}, workers=2)

    def sigterm_and_wait_for_the_drain(self):
        self.gw.proc.send_signal(signal.SIGTERM)
        self.assertTrue(wait_until(lambda: "stopping: no new connections" in self.gw.log(), 5), self.gw.log())

    def assert_accepted(self, s):
        """A first request on connection s (kept alive): a worker has it, and it has served one."""
        s.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_http1(s)
        self.assertEqual(status, 200)
        self.assertNotEqual(headers.get("connection"), "close")

    def assert_still_waiting(self, seconds):
        """The process is still there after seconds (it would have stopped within 0.1 s of the
        drain with nothing in flight)."""
        time.sleep(seconds)
        self.assertIsNone(self.gw.proc.poll(), "the gateway stopped while a request was arriving:\n" + self.gw.log())

    def test_an_http1_request_whose_body_is_still_arriving_is_served(self):
        self.start_gw()
        body = b"x" * 10000
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            self.assert_accepted(s)
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body[:4000])
            self.sigterm_and_wait_for_the_drain()
            self.assert_still_waiting(0.3)
            s.sendall(body[4000:])
            status, headers, got = read_http1(s)
        self.assertEqual(status, 200, got)
        self.assertEqual(json.loads(got), {"got": 10000})
        self.assertEqual(headers.get("connection"), "close")
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())
        self.assertIn("every request finished", self.gw.log())

    def test_an_http1_request_line_without_its_headers_yet_is_served(self):
        self.start_gw()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            self.assert_accepted(s)
            s.sendall(b"GET /fast HTTP/1.1\r\n")
            self.sigterm_and_wait_for_the_drain()
            self.assert_still_waiting(0.3)
            s.sendall(b"Host: x\r\n\r\n")
            status, headers, got = read_http1(s)
        self.assertEqual((status, json.loads(got)), (200, {"ok": True}))
        self.assertEqual(headers.get("connection"), "close")
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())

    def test_an_http2_upload_still_arriving_is_served_past_h2o_s_own_one_second_close(self):
        self.start_gw()
        body = b"y" * 10000
        c = H2Client(self.port, timeout=10).start_plain()
        try:
            self.assertEqual(c.get("/fast")[0], 200)  # stream 1: the connection is accepted
            block = (_literal(":method", "POST") + _literal(":scheme", "http") + _literal(":path", "/echo") +
                     _literal(":authority", "localhost") + _literal("content-type", "text/plain"))
            c.tls.sendall(c._frame(HEADERS, END_HEADERS, 3, block) + c._frame(DATA, 0, 3, body[:4000]))
            self.sigterm_and_wait_for_the_drain()
            self.assert_still_waiting(1.5)  # h2o 2.2.5's own shutdown closed such a connection after 1 s
            c.tls.sendall(c._frame(DATA, END_STREAM, 3, body[4000:]))
            status, data, goaway = None, b"", None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                ftype, flags, sid, payload = c._read_frame(deadline)
                if ftype == GOAWAY:
                    goaway = struct.unpack(">II", payload[:8])
                elif ftype == HEADERS and sid == 3:
                    status = payload[0]
                elif ftype == DATA and sid == 3:
                    data += payload
                    if flags & END_STREAM:
                        break
        finally:
            c.close()
        self.assertEqual(status, 0x88, "not :status 200 (static index 8)")
        self.assertEqual(json.loads(data), {"got": 10000})
        # RFC 9113 §6.8: the graceful GOAWAY names the largest stream id, NO_ERROR
        self.assertEqual(goaway, (0x7FFFFFFF, 0))
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())

    def test_a_connection_accepted_before_the_drain_is_served_its_first_request(self):
        self.start_gw()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            # accepted by a worker (no longer in a listener's queue, where the drain's closing
            # listener would reset it), and nothing sent yet
            self.assertTrue(wait_until(lambda: accept_queue(self.port) == 0, 5), "not accepted")
            self.sigterm_and_wait_for_the_drain()
            s.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, got = read_http1(s)
        self.assertEqual((status, headers.get("connection")), (200, "close"))
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())

    def test_an_http2_connection_that_only_pings_does_not_hold_the_exit(self):
        self.start_gw()
        c = H2Client(self.port, timeout=10).start_plain()  # the preface and SETTINGS, no request
        try:
            self.assertTrue(wait_until(lambda: accept_queue(self.port) == 0, 5), "not accepted")
            sent = time.monotonic()
            self.gw.proc.send_signal(signal.SIGTERM)
            # frames that are not requests keep coming: they must not count as one arriving
            while self.gw.proc.poll() is None and time.monotonic() - sent < 8:
                try:
                    c.tls.sendall(c._frame(PING, 0, 0, b"12345678"))
                except OSError:
                    break
                time.sleep(0.05)
            self.assertEqual(self.gw.proc.wait(timeout=10), 0, self.gw.log())
            # its first request had 1 s to come (docs/operations.md "Shutdown")
            self.assertLess(time.monotonic() - sent, 1.0 + SLACK, "a pinging HTTP/2 connection held the exit")
        finally:
            c.close()

    def test_a_connection_that_turns_http2_after_the_drain_began_gets_goaway_and_its_answer(self):
        self.start_gw()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            self.assertTrue(wait_until(lambda: accept_queue(self.port) == 0, 5), "not accepted")
            self.sigterm_and_wait_for_the_drain()
            block = (_literal(":method", "GET") + _literal(":scheme", "http") + _literal(":path", "/fast") +
                     _literal(":authority", "localhost"))
            s.sendall(PREFACE + H2Client._frame(SETTINGS, 0, 0, b"") +
                      H2Client._frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
            s.settimeout(5)
            buf, goaway, status, deadline = b"", None, None, time.monotonic() + 5
            while time.monotonic() < deadline and (goaway is None or status is None):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 9:
                    n = struct.unpack(">I", b"\0" + buf[:3])[0]
                    if len(buf) < 9 + n:
                        break
                    ftype, sid, payload = buf[3], struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF, buf[9:9 + n]
                    buf = buf[9 + n:]
                    if ftype == GOAWAY:
                        goaway = struct.unpack(">II", payload[:8])
                    elif ftype == HEADERS and sid == 1:
                        status = payload[0]
        self.assertEqual(status, 0x88, "no :status 200 on stream 1")
        self.assertEqual(goaway, (0x7FFFFFFF, 0))
        self.assertEqual(self.gw.proc.wait(timeout=5), 0, self.gw.log())

    def test_connections_idle_between_requests_do_not_hold_the_exit(self):
        self.start_gw()
        h1 = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        c = H2Client(self.port, timeout=10).start_plain()
        try:
            h1.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = read_http1(h1)
            self.assertEqual(status, 200)
            self.assertNotEqual(headers.get("connection"), "close")  # kept alive, idle from now on
            self.assertEqual(c.get("/fast")[0], 200)
            sent = time.monotonic()
            self.gw.proc.send_signal(signal.SIGTERM)
            self.assertEqual(self.gw.proc.wait(timeout=10), 0, self.gw.log())
            self.assertLess(time.monotonic() - sent, SLACK, "idle connections held the exit")
        finally:
            h1.close()
            c.close()


if __name__ == "__main__":
    main()
