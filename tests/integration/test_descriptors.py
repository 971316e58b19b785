"""Running out of descriptors, with the gateway under a low RLIMIT_NOFILE.

- A cap on client connections (clients.max_connections, "auto" from RLIMIT_NOFILE) keeps
  descriptors for upstream sockets: hundreds of idle clients never take the gateway to its limit,
  a client already connected gets complete pages meanwhile, the connections beyond the cap wait
  (they are served once slots free up, not dropped), and the descriptors come back afterwards.
- A quiet worker keeps time: a client that connects and sends nothing is closed by the request
  timeout (h2o's 10 s) with no other traffic to wake the worker, so silent clients cannot hold
  the cap's slots; the first client after a quiet spell is served (not taken for timed out); and a
  reload that raises the cap lets the clients waiting in the backlog in at once.
- The cap is the gateway's, not a share per worker: every slot is used whichever worker's listening
  socket the kernel gives a client, and a slot freed on one worker lets in a client waiting in
  another worker's backlog.
- A TLS client that resets its connection gives its descriptor and its slot back (h2o 2.2.5 left
  such a connection open for good: its TLS close wrote to a socket libuv had marked unwritable,
  and the failure was ignored).
- Without the cap's room (max_connections above the limit), the gateway does run out: upstream
  calls then fail as the gateway's own problem (outcome `local`, `gateway-overloaded`), never as
  the upstream's, so its breaker stays closed and the first page after the flood is complete; the
  worker's listeners and the admin listener, whose accept fails meanwhile, rest instead of spinning
  at 100 % CPU, and a client waiting in the backlog meanwhile is served once descriptors come back
  (not dropped).
"""
import http.client
import json
import os
import re
import select
import signal
import socket
import ssl
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import SLOW, GatewayTestCase, demo_services, free_port, main, read_all, repo_scripts, wait_until  # noqa: E402


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def cpu_seconds(pid):
    """User + system CPU time of a process (all its threads), s."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def flood(port, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(5)
        s.connect(("127.0.0.1", port))  # completes in the kernel's backlog whether accepted or not
        socks.append(s)
    return socks


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def has_data(sock, wait_s):
    return bool(select.select([sock], [], [], wait_s)[0])


class KeptClient:
    """An HTTP/1.1 keep-alive connection opened before the flood."""

    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def get(self, path):
        self.c.request("GET", path)
        r = self.c.getresponse()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()

    def close(self):
        self.c.close()


class ConnectionCap(GatewayTestCase):
    NOFILE = 256   # "auto": (256 - 64) / 2 = 96 client connections

    def test_idle_clients_beyond_the_cap_wait_and_pages_stay_complete(self):
        self.start(services=demo_services(5, 5, 5), scripts=repo_scripts("product-page.lua"), nofile=self.NOFILE)
        pid = self.gw.proc.pid
        kept = KeptClient(self.port)
        self.addCleanup(kept.close)
        self.assertEqual(kept.get("/product-page/1")[0], 200)
        base = fd_count(pid)
        socks = flood(self.port, 300)
        self.addCleanup(close_all, socks)
        self.assertTrue(wait_until(lambda: fd_count(pid) >= base + 90, 10), (base, fd_count(pid)))
        time.sleep(0.2)
        held = fd_count(pid)
        print("connection cap: %d descriptors before, %d with 300 idle clients (limit %d)" % (base, held, self.NOFILE))
        self.assertLessEqual(held - base, 96 + 2, "more client connections than the cap")
        for i in range(5):
            status, headers, body = kept.get("/product-page/%d" % (10 + i))
            self.assertEqual(status, 200, body)
            self.assertEqual(headers.get("x-aggregation-completed"), "true", body)
        # a client beyond the cap waits (in the kernel's backlog, in order), and is served once slots
        # free up: the 120th of the flood, with 50 slots freed
        late = socks[119]
        late.sendall(b"GET /product-page/7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        close_all(socks[:50])
        data = read_all(late, 10)
        self.assertTrue(data.startswith(b"HTTP/1.1 200 "), data[:200])
        close_all(socks)
        self.assertTrue(wait_until(lambda: fd_count(pid) <= base + 2, 15), (base, fd_count(pid)))
        self.assertEqual(self.get("/product-page/2").status, 200)
        self.assertEqual(self.log_errors(), [])


SLOW_PAGE = ('local agg = require "agg"\n'
             'return { route = "GET /slow/{id}", deadline_ms = 30000, handler = function(req)\n'
             '  return agg.page(agg.fetch_all { p = { "product", "/products/" .. req.params.id, timeout_ms = 30000,\n'
             '                                        collapse = false } })\n'
             'end }\n')


class OneCapForTheGateway(GatewayTestCase):
    """clients.max_connections counts the gateway's connections, whichever worker holds them.

    Each worker has its own listening socket (SO_REUSEPORT) and the kernel picks one by a hash of
    the client's address and port. The cap was split into equal shares per worker, so a client
    hashed to a worker at its share waited although the other worker had room: with 8 slots on 2
    workers, 8 clients were all served only when the hash split them 4 and 4 (27 % of the time)."""

    CAP = 8

    def test_the_cap_is_the_gateways_and_a_slot_freed_on_any_worker_serves_a_waiting_client(self):
        self.start(services=demo_services(product_ms=25000, reviews_ms=5, inventory_ms=5),
                   scripts={"slow.lua": SLOW_PAGE}, workers=2, deadline_ms=30000,
                   upstream_options={"product": {"timeout_ms": 30000}},
                   gateway_extra={"clients": {"max_connections": self.CAP}})
        held = []
        for i in range(self.CAP):  # a page in flight on each: all CAP connections open at once
            c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.addCleanup(c.close)
            c.sendall(b"GET /slow/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % i)
            held.append(c)
        self.assertTrue(wait_until(lambda: self.mock.requests("product")["total"] == self.CAP, 15),
                        "%d of %d clients were served while the gateway was under its cap"
                        % (self.mock.requests("product")["total"], self.CAP))
        # at the cap: the next clients wait, whichever worker's backlog they are in; each slot
        # freed (on either worker) lets one in
        for k in range(4):
            late = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.addCleanup(late.close)
            late.sendall(b"GET /no-such-route/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % k)
            self.assertFalse(has_data(late, 0.5), "client %d beyond the cap was served" % k)
            held.pop(0).close()  # the gateway sees the client leave, ends its page and frees the slot
            data = read_all(late, 15)
            self.assertTrue(data.startswith(b"HTTP/1.1 404 "), (k, data[:200]))
            # late's connection closed after its answer: a new page takes its slot, and the gateway
            # is at its cap again
            c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.addCleanup(c.close)
            c.sendall(b"GET /slow/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (100 + k))
            held.append(c)
            self.assertTrue(wait_until(lambda: self.mock.requests("product")["total"] == self.CAP + k + 1, 15),
                            "a new client was not served with a slot free")
        for c in held:
            self.assertFalse(has_data(c, 0), "a held page ended early")
        self.assertEqual(self.log_errors(), [])


class QuietWorker(GatewayTestCase):
    def test_first_client_after_a_quiet_spell_is_served(self):
        # libuv's clock moves only when it runs: after 11 s without traffic the new connection's
        # request timeout was stamped 11 s in the past, and the next run closed it at once
        self.start(services=demo_services(5, 5, 5), scripts=repo_scripts("product-page.lua"))
        self.assertEqual(self.get("/product-page/1").status, 200)
        time.sleep(11)
        r = self.get("/product-page/2")
        self.assertEqual(r.status, 200, r)
        r = self.get_h2c("/product-page/3")
        self.assertEqual(r.status, 200, r)

    def test_a_silent_client_is_closed_by_the_request_timeout_with_nothing_else_going_on(self):
        # the timeout was armed anew at each of the worker's once-a-second ticks, as far away each
        # time, and fired only when other traffic ran libuv
        self.start(services=demo_services(5, 5, 5), scripts=repo_scripts("product-page.lua"))
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        try:
            data = read_all(s, 40)
        except socket.timeout:
            self.fail("a client that sent nothing is still connected after 40 s")
        print("a silent client closed after %.1f s" % (time.monotonic() - t0))
        self.assertNotIn(b"200 OK", data)

    def test_a_reload_that_raises_the_cap_lets_the_waiting_clients_in(self):
        slow = ('local agg = require "agg"\n'
                'return { route = "GET /slow/{id}", deadline_ms = 20000, handler = function(req)\n'
                '  return agg.page(agg.fetch_all { p = { "product", "/products/" .. req.params.id, timeout_ms = 20000 } })\n'
                'end }\n')
        self.start(services=demo_services(product_ms=12000, reviews_ms=5, inventory_ms=5),
                   scripts={"slow.lua": slow}, deadline_ms=20000,
                   upstream_options={"product": {"timeout_ms": 20000}},
                   gateway_extra={"clients": {"max_connections": 2}})
        held = []
        for i in range(2):  # two pages in flight for 12 s: the worker is at its cap
            c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self.addCleanup(c.close)
            c.sendall(b"GET /slow/%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % i)
            held.append(c)
        time.sleep(0.3)
        late = socket.create_connection(("127.0.0.1", self.port), timeout=5)  # in the backlog
        self.addCleanup(late.close)
        late.sendall(b"GET /no-such-route HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertFalse(has_data(late, 0.5), "a client beyond the cap was served")
        path = os.path.join(self.scripts_dir, "gateway.lua")
        with open(path) as f:
            src = f.read()
        src, n = re.subn(r"max_connections = 2\b", "max_connections = 100", src)
        self.assertEqual(n, 1, src)
        with open(path, "w") as f:
            f.write(src)
        self.gw.proc.send_signal(signal.SIGHUP)
        data = read_all(late, 15)
        self.assertTrue(data.startswith(b"HTTP/1.1 404 "), data[:200])
        # served by the reload, while both slots were still taken
        for c in held:
            self.assertFalse(has_data(c, 0), "a held page ended before the waiting client was served")


def socket_fds(pid):
    n = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


class TlsResets(GatewayTestCase):
    def test_tls_clients_that_reset_give_their_descriptors_back(self):
        self.start(services=demo_services(5, 5, 5), scripts=repo_scripts("product-page.lua"), tls=True)
        pid = self.gw.proc.pid
        base = socket_fds(pid)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        clients = []
        for alpn in ("http/1.1", "http/1.1", "h2"):
            ctx.set_alpn_protocols([alpn])
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", self.tls_port), timeout=10),
                                server_hostname="localhost")
            self.addCleanup(s.close)
            if alpn == "h2":
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            else:
                s.sendall(b"GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertTrue(s.recv(4096))  # an answer (HTTP/1.1) or the server's SETTINGS (h2)
            clients.append(s)
        print("TLS clients: %d socket descriptors before, %d with three clients" % (base, socket_fds(pid)))
        for s in clients:  # the client resets: the gateway's next read fails with ECONNRESET
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        self.assertTrue(wait_until(lambda: socket_fds(pid) <= base, 15),
                        "descriptors of reset TLS connections kept: %d, %d before" % (socket_fds(pid), base))
        r = self.get_tls("/product-page/1")
        self.assertEqual(r.status, 200, r)
        # (the harness's cleanup checks that SIGTERM stops the gateway within its grace)


class OutOfDescriptors(GatewayTestCase):
    NOFILE = 72

    def metric(self, name, **labels):
        body = self.admin_get("/metrics")
        total = 0.0
        for line in body.splitlines():
            if line.startswith(name + "{") and all('%s="%s"' % kv in line for kv in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def admin_get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=10)
        c.request("GET", path)
        return c.getresponse().read().decode()

    def test_local_socket_errors_do_not_move_the_breaker_and_admin_does_not_spin(self):
        self.admin_port = free_port()
        self.start(services=demo_services(5, 5, 5), scripts=repo_scripts("product-page.lua"), nofile=self.NOFILE,
                   gateway_extra={"clients": {"max_connections": 1000},
                                  "admin": {"port": self.admin_port, "host": "127.0.0.1"}},
                   upstream_options={"product": {"breaker": {"failures": 3, "open_s": 30}}})
        pid = self.gw.proc.pid
        kept = KeptClient(self.port)
        self.addCleanup(kept.close)
        self.assertEqual(kept.get("/no-such-route")[0], 404)  # no upstream connection yet
        socks = flood(self.port, 150)
        self.addCleanup(close_all, socks)
        # the worker accepts until EMFILE, then its listener rests; the rest wait in the backlog
        self.assertTrue(wait_until(lambda: fd_count(pid) >= self.NOFILE - 1, 10), fd_count(pid))
        # the admin listener meets EMFILE too: a connection waits in its backlog
        admin = socket.create_connection(("127.0.0.1", self.admin_port), timeout=5)
        self.addCleanup(admin.close)
        time.sleep(0.3)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(1.5)
        cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        print("out of descriptors: gateway CPU %.0f %% of a core while the admin accept fails" % (cpu * 100))
        self.assertLess(cpu, 0.2, "the gateway spins while it has no descriptor")
        for i in range(5):  # more than the breaker's 3 failures
            status, headers, body = kept.get("/product-page/%d" % i)
            self.assertNotEqual(status, 200, body)
            self.assertIn(b"gateway-overloaded", body, body)
        # the flood's last client waits in the backlog all along; once the others leave it is served
        late = socks[-1]
        late.sendall(b"GET /product-page/7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        close_all(socks[:-1])
        admin.close()
        data = read_all(late, 15)
        self.assertTrue(data.startswith(b"HTTP/1.1 200 "), data[:300])
        self.assertIn(b"x-aggregation-completed: true", data.lower())
        late.close()
        self.assertTrue(wait_until(lambda: fd_count(pid) < self.NOFILE - 20, 15), fd_count(pid))
        status, headers, body = kept.get("/product-page/42")
        self.assertEqual(status, 200, body)
        self.assertEqual(headers.get("x-aggregation-completed"), "true", body)
        self.assertGreaterEqual(self.metric("aggway_upstream_calls_total", upstream="product", outcome="local"), 5)
        self.assertEqual(self.metric("aggway_upstream_calls_total", upstream="product", outcome="circuit_open"), 0)
        self.assertEqual(self.metric("aggway_upstream_calls_total", upstream="product", outcome="refused"), 0)


if __name__ == "__main__":
    main()
