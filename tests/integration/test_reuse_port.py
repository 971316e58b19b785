"""listen = { { port = N, reuse_port = true } }: several aggway processes share one port on one host
(SO_REUSEPORT: the kernel spreads new connections over them), so an instance can be replaced
without refusing a connection; without it a port in use stops the start."""
import os
import signal
import threading

import harness
from harness import GatewayTestCase, endpoint, write_scripts


def whoami(name):
    return {"whoami.lua": endpoint("GET /whoami", '    return { status = 200, json = { instance = "%s" } }' % name)}


def gateway_source(port, reuse):
    return "return " + harness.lua_value({"listen": [{"port": port, "reuse_port": reuse}], "workers": 1,
                                          "upstreams": {}}) + "\n"


class ReusePort(GatewayTestCase):
    def second(self, name, reuse=True, port=None):
        """Another gateway process on self.port (or port), answering /whoami with name."""
        sdir = os.path.join(self.workdir, "second-" + name, "scripts")
        write_scripts(sdir, whoami(name), gateway_source(port or self.port, reuse))
        gw = harness.Gateway(sdir, port or self.port)
        self.addCleanup(gw.stop)
        return gw

    def start_first(self):
        """Instance a on a free port with reuse_port = true."""
        for _attempt in range(5):
            self.port = harness.free_port()
            self.scripts_dir = os.path.join(self.workdir, "first-%d" % self.port, "scripts")
            write_scripts(self.scripts_dir, whoami("a"), gateway_source(self.port, True))
            self.gw = harness.Gateway(self.scripts_dir, self.port)
            if self.gw.start():
                return
            self.gw.stop()
        self.fail("instance a did not start:\n" + self.gw.log())

    def who(self):
        r = self.get("/whoami", "-H", "Connection: close")
        return r.json()["instance"] if r.status == 200 else "status %d" % r.status

    def test_two_instances_share_the_port_and_both_get_connections(self):
        self.start_first()
        b = self.second("b")
        self.assertTrue(b.start(), b.log())
        seen = {self.who() for _ in range(60)}
        self.assertEqual(seen, {"a", "b"})

    def test_an_instance_is_replaced_without_a_refused_connection(self):
        self.start_first()
        results, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                results.append(self.who())
        t = threading.Thread(target=client)
        t.start()
        try:
            b = self.second("b")
            self.assertTrue(b.start(), b.log())
            self.gw.proc.send_signal(signal.SIGTERM)     # the old instance drains and exits
            self.assertEqual(self.gw.proc.wait(timeout=30), 0)
            n = len(results)
            self.assertTrue(harness.wait_until(lambda: len(results) >= n + 20, 30))
        finally:
            stop.set()
            t.join(30)
        self.assertEqual([r for r in results if r not in ("a", "b")], [], "requests that failed")
        self.assertEqual(results[-1], "b")

    def test_without_reuse_port_a_port_in_use_stops_the_start(self):
        self.start_first()
        b = self.second("b", reuse=False)
        b.start()    # instance a answers on the port meanwhile: wait for b to give up
        self.assertEqual(b.proc.wait(timeout=harness.START_TIMEOUT), 1, b.log())
        self.assertIn("in use", b.log())

    def test_reuse_port_must_be_a_boolean(self):
        sdir = os.path.join(self.workdir, "bad")
        write_scripts(sdir, {}, "return {\n  listen = { { port = 8080,\n    reuse_port = \"yes\" } },\n  upstreams = {},\n}\n")
        r = harness.run_aggway("check", "-c", sdir)
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"gateway.lua:3: listen[1].reuse_port: must be true or false, got string \"yes\"", r.stderr)
        write_scripts(sdir, {}, "return {\n  listen = { { port = 8080, reuse = true } },\n  upstreams = {},\n}\n")
        r = harness.run_aggway("check", "-c", sdir)
        self.assertIn(b"listen[1].reuse: unknown option (port, host, tls, reuse_port)", r.stderr)


if __name__ == "__main__":
    harness.main()
