"""A kept-alive upstream connection with unread bytes is never written to.

Given an upstream (a python server) that answers /first and then sends a second response no one
asked for on the same connection, and a script that calls /first, computes for a
while (the worker does not poll meanwhile), then calls /second: the second call's answer is the
upstream's answer to /second, on a new connection, never the unasked-for response.
"""
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import GatewayTestCase, endpoint, main  # noqa: E402


def response(body):
    return ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)).encode()


class LateSecondResponseUpstream:
    """Answers each request by its path; right after the answer to /first, in a write of its own,
    it sends a response no one asked for."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests = []
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        c.settimeout(10)
        buf = b""
        try:
            while not self.stopping:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(4096)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                path = head.split(b" ")[1].decode()
                self.requests.append(path)
                if path == "/first":
                    # two writes: the gateway wakes for the first and, most often, reads it before
                    # the second arrives (else it finds both in one read: the same outcome)
                    c.sendall(response('{"n":"first"}'))
                    c.sendall(response('{"n":"unasked"}'))
                else:
                    c.sendall(response('{"n":"%s"}' % path.strip("/")))
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        self.stopping = True
        self.sock.close()


SCRIPT = endpoint("GET /late", """
    local a = agg.fetch({ "late", "/first", timeout_ms = 10000 })
    local t = os.clock()
    while os.clock() - t < 0.2 do end  -- the worker computes: no poll, the late bytes arrive
    local b = agg.fetch({ "late", "/second", timeout_ms = 10000 })
    return { status = 200, json = { a = a.data or agg.null, b = b.data or agg.null, b_status = b.status,
                                    b_error = b.error or agg.null } }
""", deadline_ms=30000)


class UpstreamReuse(GatewayTestCase):
    def test_unasked_second_response_is_never_read_as_the_next_answer(self):
        up = LateSecondResponseUpstream()
        self.addCleanup(up.stop)
        self.start(services={}, scripts={"late.lua": SCRIPT},
                   upstream_options={"late": {"url": "http://127.0.0.1:%d" % up.port, "timeout_ms": 10000}},
                   gateway_extra={"script_time_limit_ms": 20000})  # the spin is CPU time: slower on a busy machine
        for i in range(3):
            r = self.get("/late")
            self.assertEqual(r.status, 200, r)
            page = r.json()
            self.assertEqual(page["a"], {"n": "first"}, page)
            self.assertEqual(page["b"], {"n": "second"}, page)
        # each page: /first on a connection that then carries the late bytes, so /second on another
        self.assertEqual(up.requests.count("/second"), 3)
        self.assertGreaterEqual(up.connections, 4, "the connection with unread bytes was reused")


if __name__ == "__main__":
    main()
