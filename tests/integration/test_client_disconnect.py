"""A client that goes away during a fan-out: the gateway cancels its calls (DESIGN §2.1: "When
the gateway stops waiting for a call (deadline, client gone, hedge won), it cancels it: the
upstream connection is closed"), logs no error, and leaks nothing from its pools.

Given Reviews hanging, a 5 s deadline, and at most 2 connections to Reviews: clients that hang up
after 50 ms leave no open connection at Reviews, and a normal page afterwards is served at once
(a leaked pool slot would make it wait for a connection that never frees)."""
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GatewayTestCase, SLOW, demo_services, endpoint, route, wait_until, main  # noqa: E402

PAGE = endpoint("GET /slow-page/{id}", """
    local id = req.params.id
    return agg.page(agg.fetch_all {
      product   = { "product", "/products/" .. id, required = true },
      reviews   = { "reviews", "/reviews/" .. id, timeout_ms = 4000 },
      inventory = { "inventory", "/stock/" .. id },
    })""", deadline_ms=5000)

CLIENTS = 6
CLOSE_WAIT_S = 3.0 if SLOW else 1.5


class ClientDisconnect(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.start(services=demo_services(product_ms=5, inventory_ms=5,
                                          reviews_ms=[route("/reviews/{id}", fault="hang")]),
                   scripts={"page.lua": PAGE},
                   upstream_options={"reviews": {"max_connections": 2, "timeout_ms": 4000},
                                     "product": {"timeout_ms": 1000}, "inventory": {"timeout_ms": 1000}},
                   workers=1)

    def hang_up_after_50ms(self, n, *curl_args):
        """n clients at once, each giving up after 50 ms (curl --max-time 0.05)."""
        procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--max-time", "0.05"] + list(curl_args) +
                                  [self.url("/slow-page/%d" % i)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for i in range(n)]
        for p in procs:
            p.wait(timeout=10)
            self.assertEqual(p.returncode, 28, "curl should have timed out: the page waits for Reviews")

    def reviews_stats(self):
        return self.mock.stats()["reviews"]

    def requests_connections_open(self):
        """Reviews connections open that carried a request. A connection whose call was cancelled
        while it was still connecting (before its request went out) may stay as an idle spare of
        the pool (upstream/upstream_internal.h, orphans): the upstream was asked nothing on it."""
        s = self.reviews_stats()
        return s["connections_open"] - s["connections_unused"]

    def assertReviewsConnectionsClosed(self, within_s=CLOSE_WAIT_S):
        closed = wait_until(lambda: self.requests_connections_open() == 0, within_s)
        self.assertTrue(closed, "the gateway must close the calls of a client that left: %s" % self.reviews_stats())

    def test_http1_client_disconnect_closes_the_upstream_connections_of_its_calls(self):
        self.hang_up_after_50ms(1)
        self.assertReviewsConnectionsClosed()
        self.assertEqual(self.reviews_stats()["in_flight"], 0)

    def test_many_http1_clients_disconnecting_close_every_upstream_connection(self):
        for _ in range(2):
            self.hang_up_after_50ms(CLIENTS)
        self.assertReviewsConnectionsClosed()

    def test_client_disconnect_logs_no_error(self):
        self.hang_up_after_50ms(CLIENTS)
        wait_until(lambda: self.requests_connections_open() == 0, 4.0 + CLOSE_WAIT_S + 1)
        time.sleep(0.1)
        self.assertEqual(self.log_errors(), [])

    def test_after_http1_disconnects_a_normal_request_succeeds_no_pool_leak(self):
        self.hang_up_after_50ms(CLIENTS)
        self.assertReviewsConnectionsClosed()
        self.mock.set_routes("reviews", [route("/reviews/{id}", json={"rating": 4.6})])
        for i in range(4):                       # more pages than the 2 Reviews connections
            r = self.get("/slow-page/%d" % i, timeout=5)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["reviews"]["status"], "ok", r)
            self.assertLess(r.ms, 1000, "a Reviews connection slot leaked: the call waited for one")

    def test_once_the_abandoned_calls_have_ended_the_pool_is_whole_again(self):
        # Whatever the cancel path does, the abandoned calls end by Reviews' 4 s timeout at the
        # latest; after that the 2 Reviews connections must all be usable again.
        self.hang_up_after_50ms(CLIENTS)
        self.assertReviewsConnectionsClosed(4.0 + CLOSE_WAIT_S + 1)
        self.mock.set_routes("reviews", [route("/reviews/{id}", json={"rating": 4.6})])
        for i in range(4):
            r = self.get("/slow-page/%d" % i, timeout=5)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["reviews"]["status"], "ok", r)
            self.assertLess(r.ms, 1000, "a Reviews connection slot leaked")
        self.assertEqual(self.log_errors(), [])

    def test_pipelined_requests_behind_a_client_that_left_are_not_started(self):
        # five requests sent at once on one connection, then the connection closed: the first is
        # abandoned when its client is seen gone, and the four behind it are never started (each
        # would make its calls and be abandoned in turn)
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"".join(b"GET /slow-page/%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(1, 6)))
        self.assertTrue(wait_until(lambda: len(self.mock.requests("product")["requests"]) >= 1, 5))
        s.close()
        self.assertReviewsConnectionsClosed()
        # the four behind it would each start within the watch's 25 ms of the one before
        self.assertFalse(wait_until(lambda: len(self.mock.requests("product")["requests"]) > 1, 1.0),
                         self.mock.requests("product"))
        self.assertEqual([q["path"] for q in self.mock.requests("product")["requests"]], ["/products/1"])
        self.assertEqual(self.log_errors(), [])

    def test_h2_stream_reset_cancels_its_calls_too(self):
        self.hang_up_after_50ms(CLIENTS, "--http2-prior-knowledge")
        self.assertReviewsConnectionsClosed()
        self.mock.set_routes("reviews", [route("/reviews/{id}", json={"rating": 4.6})])
        r = self.get_h2c("/slow-page/1", timeout=5)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["reviews"]["status"], "ok", r)
        self.assertLess(r.ms, 1000, r)
        self.assertEqual(self.log_errors(), [])


if __name__ == "__main__":
    main()
