"""Endpoint host names re-resolved (issue 15; docs/operations.md "Upstream groups"): every address
of a name is an endpoint, a change of the name's addresses adds and removes endpoints while pages
are served (none fails), the unchanged address keeps its pool, and a resolution that fails keeps
the last good addresses (logged once when it starts and once when it ends).

No DNS is involved: the gateway's test seam AGGWAY_HOSTS_FILE (upstream/resolve.h) stands for the
DNS, and three mocks play one service on the same port at 127.0.0.1, 127.0.0.2 and 127.0.0.3.
"""
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (SLOW, GatewayTestCase, Mock, endpoint, free_port, route, wait_until, main)  # noqa: E402

WAIT = 30.0 if SLOW else 15.0   # bound on what the gateway does on its own (a resolution, a tick)
NAME = "product.test"

PAGE = endpoint("GET /p/{id}", '''
    return agg.page(agg.fetch_all {
      product = { "product", "/products/" .. req.params.id, required = true },
    })''')


class EndpointResolution(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.hosts = os.path.join(self.workdir, "hosts")
        old = os.environ.get("AGGWAY_HOSTS_FILE")
        os.environ["AGGWAY_HOSTS_FILE"] = self.hosts

        def restore():
            if old is None:
                os.environ.pop("AGGWAY_HOSTS_FILE", None)
            else:
                os.environ["AGGWAY_HOSTS_FILE"] = old
        self.addCleanup(restore)

    def set_addresses(self, *addresses):
        tmp = self.hosts + ".new"
        with open(tmp, "w") as f:
            f.write("# the test's DNS\n")
            for a in addresses:
                f.write("%s %s\n" % (a, NAME))
        os.replace(tmp, self.hosts)   # whole, never half-written

    def start_three(self):
        """One product service on the same port at three loopback addresses."""
        port = free_port()
        self.mocks = {}
        for last in (1, 2, 3):
            addr = "127.0.0.%d" % last
            d = tempfile.mkdtemp(dir=self.workdir)
            m = Mock(d, {"product": [route("/products/{id}", json={"id": "{id}", "from": addr})]},
                     config_extra={"host": addr}, ports={"product": port}).start()
            self.addCleanup(m.stop)
            self.mocks[addr] = m
        self.mock = self.mocks["127.0.0.1"]
        self.product_port = port

    def start_gateway(self, workers=2):
        self.admin_port = free_port()
        self.start(scripts={"p.lua": PAGE}, workers=workers, deadline_ms=5000,
                   upstream_options={"product": {"url": "http://%s:%d" % (NAME, self.product_port),
                                                 "resolve_every_s": 1, "timeout_ms": 2000,
                                                 "outlier": False, "retry": {"attempts": 1}}},
                   gateway_extra={"admin": {"port": self.admin_port}})

    def admin(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.admin_port, path), timeout=10) as resp:
            return resp.read().decode()

    def addresses(self):
        doc = json.loads(self.admin("/upstreams"))
        ups = {u["name"]: u for u in doc["upstreams"]}
        if "product" not in ups:   # the admin listener answers before the first generation serves
            return []
        return sorted(e["address"].split(":")[0] for e in ups["product"]["endpoints"])

    def hits(self, addr):
        return self.mocks[addr].hits().get("product", {}).get("GET /products/{id}", 0)

    def connections(self, addr):
        return self.mocks[addr].stats()["product"]["connections_total"]

    def page(self, i):
        try:
            with urllib.request.urlopen(self.url("/p/%d" % i), timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def load(self):
        """Pages from two clients until stopped; every status and who answered is kept."""
        self.statuses, self.stop_load = [], threading.Event()

        def client(k):
            i = 0
            while not self.stop_load.is_set():
                status, body = self.page(k * 100000 + i)
                self.statuses.append((status, body))
                i += 1
        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()

        def stop():
            self.stop_load.set()
            for t in threads:
                t.join(15)
        return stop

    def test_changed_addresses_add_and_remove_endpoints_under_load_with_no_failed_page(self):
        self.start_three()
        self.set_addresses("127.0.0.1", "127.0.0.2")
        self.start_gateway()
        self.assertTrue(wait_until(lambda: self.addresses() == ["127.0.0.1", "127.0.0.2"], WAIT), self.addresses())
        stop = self.load()
        try:
            self.assertTrue(wait_until(lambda: self.hits("127.0.0.1") > 20 and self.hits("127.0.0.2") > 20, WAIT))
            self.assertEqual(self.hits("127.0.0.3"), 0)
            conns_2 = self.connections("127.0.0.2")
            # .1 leaves, .3 comes: pages go on, none fails
            self.set_addresses("127.0.0.2", "127.0.0.3")
            self.assertTrue(wait_until(lambda: self.addresses() == ["127.0.0.2", "127.0.0.3"], WAIT),
                            self.admin("/upstreams"))
            self.assertTrue(wait_until(lambda: self.hits("127.0.0.3") > 20, WAIT), "the new address gets no calls")
            # the workers follow within their next tick: then .1 gets nothing more
            time.sleep(2.5 if not SLOW else 5.0)
            left = self.hits("127.0.0.1")
            time.sleep(1.5)
            self.assertEqual(self.hits("127.0.0.1"), left, "a removed address was still called")
            # its pools drained and closed: the mock sees no connection left open
            self.assertTrue(wait_until(lambda: self.mocks["127.0.0.1"].stats()["product"]["connections_open"] == 0,
                                       WAIT), self.mocks["127.0.0.1"].stats())
            # the unchanged address kept its pool: no new connections beyond a few
            self.assertLessEqual(self.connections("127.0.0.2") - conns_2, 2)
        finally:
            stop()
        failed = [s for s in self.statuses if s[0] != 200]
        self.assertEqual(failed, [], "pages failed while the addresses changed")
        self.assertGreater(len(self.statuses), 100)
        self.assertIn("upstreams.product.url: host '%s' now resolves to 2 address(es); added: 127.0.0.3:%d; "
                      "removed: 127.0.0.1:%d" % (NAME, self.product_port, self.product_port), self.gw.log())
        self.assertLogClean()

    def test_a_resolution_that_fails_keeps_the_last_addresses_logged_once(self):
        self.start_three()
        self.set_addresses("127.0.0.1", "127.0.0.2")
        self.start_gateway(workers=1)
        os.remove(self.hosts)   # the DNS is down
        self.assertTrue(wait_until(lambda: "cannot resolve host '%s'" % NAME in self.gw.log(), WAIT), self.gw.log())
        time.sleep(3.0)         # three more failed resolutions: still one line
        metrics = self.admin("/metrics")
        self.assertIn('aggway_resolve_failing{upstream="product",host="%s"} 1' % NAME, metrics)
        self.assertEqual(self.gw.log().count("cannot resolve host '%s'" % NAME), 1, self.gw.log())
        self.assertEqual(self.addresses(), ["127.0.0.1", "127.0.0.2"])
        for i in range(30):
            self.assertEqual(self.page(i)[0], 200)
        self.set_addresses("127.0.0.1", "127.0.0.2")
        self.assertTrue(wait_until(lambda: "host '%s' resolves again" % NAME in self.gw.log(), WAIT), self.gw.log())
        self.assertTrue(wait_until(
            lambda: 'aggway_resolve_failing{upstream="product",host="%s"} 0' % NAME in self.admin("/metrics"), WAIT))
        self.assertEqual(self.gw.log().count("host '%s' resolves again" % NAME), 1)

    def test_every_address_of_a_name_is_an_endpoint_from_the_start(self):
        self.start_three()
        self.set_addresses("127.0.0.1", "127.0.0.2", "127.0.0.3")
        self.start_gateway(workers=1)
        self.assertTrue(wait_until(lambda: self.addresses() == ["127.0.0.1", "127.0.0.2", "127.0.0.3"], WAIT),
                        self.addresses())
        for i in range(90):
            self.assertEqual(self.page(i)[0], 200)
        for addr in self.mocks:
            self.assertGreater(self.hits(addr), 10, addr)

        def product():
            doc = json.loads(self.admin("/upstreams"))
            return [u for u in doc["upstreams"] if u["name"] == "product"][0]
        # published by the worker about once a second
        self.assertTrue(wait_until(lambda: sum(e["calls"] for e in product()["endpoints"]) == 90, WAIT), product())
        self.assertTrue(product()["group"])


if __name__ == "__main__":
    main()
