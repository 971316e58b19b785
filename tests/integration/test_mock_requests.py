"""aggway-mock records the requests it received (method, path with query, headers) and shows them
on its admin port (GET /requests, GET /services/NAME/requests), for tests and for a person
debugging a page; and the gateway sends an upstream the client headers its forward_headers name."""
import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MOCK_BIN, GatewayTestCase, Mock, main, read_all, route  # noqa: E402

SERVICES = {
    "product": [route("/products/{id}", json={"id": "{id}", "name": "Sneaker", "sku": "SNK-{id}"})],
    "reviews": [route("/reviews/{id}", json={"rating": 4.6})],
    "inventory": [route("/stock/{id}", json={"inStock": 12})],
}


def send_raw(port, data):
    """Sends raw request bytes on one connection and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return read_all(s, 10)


class MockRequestLog(GatewayTestCase):

    def test_records_method_path_and_headers_per_service(self):
        mock = self.start_mock(SERVICES)
        send_raw(mock.ports["reviews"], b"GET /reviews/7?lang=th HTTP/1.1\r\nHost: x\r\nAccept-Language: th-TH\r\n"
                                        b"X-Tag: a\r\nx-tag: b\r\n\r\n"
                                        b"POST /nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                        b"Connection: close\r\n\r\nhi")
        got = mock.requests("reviews")
        self.assertEqual(got["total"], 2)
        self.assertEqual(got["dropped"], 0)
        first, second = got["requests"]
        self.assertEqual((first["seq"], first["method"], first["path"]), (1, "GET", "/reviews/7?lang=th"))
        self.assertEqual(first["headers"]["accept-language"], "th-TH")
        self.assertEqual(first["headers"]["x-tag"], "a, b")
        self.assertEqual((second["method"], second["path"]), ("POST", "/nothing"))  # unmatched too
        self.assertEqual(mock.requests()["product"]["total"], 0)
        mock.reset()
        self.assertEqual(mock.requests("reviews"), {"recording": True, "total": 0, "dropped": 0, "requests": []})

    def test_keeps_the_last_requests_and_counts_the_dropped_ones(self):
        mock = self.start_mock(SERVICES)
        n = 300
        reqs = b"".join(b"GET /stock/%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(n - 1))
        send_raw(mock.ports["inventory"], reqs + b"GET /stock/last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = mock.requests("inventory")
        self.assertEqual(got["total"], n)
        self.assertEqual(len(got["requests"]), 256)
        self.assertEqual(got["dropped"], n - 256)
        self.assertEqual(got["requests"][0]["path"], "/stock/%d" % (n - 256))
        self.assertEqual(got["requests"][-1]["path"], "/stock/last")

    def test_record_requests_false_keeps_none_for_benchmarks(self):
        self.mock = Mock(self.workdir, SERVICES, config_extra={"record_requests": False}).start()
        send_raw(self.mock.ports["reviews"], b"GET /reviews/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.assertEqual(self.mock.stats()["reviews"]["requests"], 1)
        self.assertEqual(self.mock.requests("reviews"), {"recording": False, "total": 0, "dropped": 0, "requests": []})

    def test_record_requests_must_be_a_boolean(self):
        path = os.path.join(self.workdir, "bad.json")
        with open(path, "w") as f:
            json.dump({"admin": 1, "record_requests": "yes", "services": {}}, f)
        p = subprocess.run([MOCK_BIN, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"record_requests: must be true or false", p.stderr)

    def test_admin_refuses_unknown_services_and_methods(self):
        mock = self.start_mock(SERVICES)
        for method, path, status in (("GET", "/services/nope/requests", 404), ("POST", "/requests", 405),
                                     ("PUT", "/services/reviews/requests", 405)):
            req = urllib.request.Request("http://127.0.0.1:%d%s" % (mock.admin, path), method=method,
                                         data=b"" if method != "GET" else None)
            with self.assertRaises(urllib.error.HTTPError) as cm:
                urllib.request.urlopen(req, timeout=5)
            self.assertEqual(cm.exception.code, status, path)
            self.assertIn("error", json.loads(cm.exception.read()))

    def test_patch_changes_one_route_and_keeps_the_others(self):
        mock = self.start_mock({"reviews": [route("/reviews", json={"list": True}),
                                            route("/reviews/{id}", json={"rating": 4.6})]})
        port = mock.ports["reviews"]

        def get(path, timeout=5):
            return urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout).read()

        got = mock.patch_route("reviews", {"path": "/reviews/{id}", "fault": "hang"})
        self.assertEqual(got["route"]["fault"], "hang")
        self.assertEqual(got["route"]["json"], {"rating": 4.6})      # the fields not given are kept
        with self.assertRaises(OSError):                              # that route hangs …
            get("/reviews/7", timeout=0.5)
        self.assertEqual(json.loads(get("/reviews")), {"list": True})  # … the other one answers
        mock.patch_route("reviews", {"path": "/reviews/{id}", "fault": None})  # null removes a field
        self.assertEqual(json.loads(get("/reviews/7")), {"rating": 4.6})
        self.assertEqual(len(mock._admin("GET", "/config")["services"]["reviews"]["routes"]), 2)
        for body, status, says in (({"path": "/nope", "fault": "hang"}, 404, "no GET /nope route"),
                                   ({"path": "/reviews", "method": "POST"}, 404, "no POST /reviews route"),
                                   ({"path": "/reviews", "falt": "hang"}, 400, "falt: unknown field"),
                                   ({"path": "/reviews", "fault": "timeout"}, 400, "fault"),
                                   ({"fault": "hang"}, 400, "path"), ([1], 400, "path")):
            req = urllib.request.Request("http://127.0.0.1:%d/services/reviews/routes" % mock.admin,
                                         data=json.dumps(body).encode(), method="PATCH")
            with self.assertRaises(urllib.error.HTTPError) as cm:
                urllib.request.urlopen(req, timeout=5)
            self.assertEqual(cm.exception.code, status, body)
            self.assertIn(says, json.loads(cm.exception.read())["error"], body)
        self.assertEqual(json.loads(get("/reviews")), {"list": True})  # a refused patch changed nothing

    def test_gateway_forwards_only_the_client_headers_forward_headers_names(self):
        self.start(SERVICES, upstream_options={"reviews": {"forward_headers": ["accept-language", "x-device"]}})
        r = self.get("/product-page/5", "-H", "Accept-Language: th-TH", "-H", "X-Secret: s")
        self.assertEqual(r.status, 200, r.body)
        sent = self.mock.requests()
        reviews = sent["reviews"]["requests"][0]
        self.assertEqual(reviews["path"], "/reviews/5")
        self.assertEqual(reviews["headers"].get("accept-language"), "th-TH")
        self.assertNotIn("x-device", reviews["headers"])  # the client sent none
        self.assertNotIn("x-secret", reviews["headers"])
        product = sent["product"]["requests"][0]
        self.assertNotIn("accept-language", product["headers"])
        self.assertIn("traceparent", product["headers"])
        # the spaces and tabs around a value are not part of it (RFC 9110 §5.5): h2o's HTTP/1.1
        # parser keeps them at the end, and the upstream gets the value without them
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.putrequest("GET", "/product-page/6")
        c.putheader("X-Device", "phone \t")
        c.putheader("Accept-Language", "\t th-TH  ")
        c.endheaders()
        self.assertEqual(c.getresponse().status, 200)
        c.close()
        reviews = [q for q in self.mock.requests()["reviews"]["requests"] if q["path"] == "/reviews/6"][0]
        self.assertEqual(reviews["headers"].get("x-device"), "phone")
        self.assertEqual(reviews["headers"].get("accept-language"), "th-TH")


if __name__ == "__main__":
    main()
