"""listen = { { port = N, reuse_port = true } }: several aggway processes share one port on one host
(SO_REUSEPORT: the kernel spreads new connections over them), so an instance can be replaced
without refusing a connection; without it a port in use stops the start."""
import os
import signal
import subprocess
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
        return r.json()["instance"] if r.status == 200 else "status %d (curl exit %d)" % (r.status, r.exit_code)

    def test_two_instances_share_the_port_and_both_get_connections(self):
        self.start_first()
        b = self.second("b")
        self.assertTrue(b.start(), b.log())
        # b.start() saw an answer on the port, maybe a's: wait for b's own "serving" line (its
        # listening sockets are open by then) before counting who answers; a b that never
        # shares the port still leaves {"a"} after it
        self.assertTrue(harness.wait_until(lambda: "aggway serving" in b.log(), harness.START_TIMEOUT), b.log())
        seen = {self.who() for _ in range(60)}
        self.assertEqual(seen, {"a", "b"})

    def test_an_instance_is_replaced_without_a_refused_connection(self):
        # Connections the kernel already queued at the old instance's listener when it closes are
        # reset unless net.ipv4.tcp_migrate_req = 1 (Linux 5.14+) hands them to the other listeners
        # of the port: docs/operations.md "Deploying" asks for it. The test sets it in a network namespace of
        # its own (the machine's setting is left alone).
        if os.environ.get("AGGWAY_TEST_NETNS") != "1":
            if open("/proc/sys/net/ipv4/tcp_migrate_req").read().strip() == "1":
                return self.replace_instance()
            script = ("ip link set lo up && echo 1 > /proc/sys/net/ipv4/tcp_migrate_req && exec python3 %s "
                      "ReusePort.test_an_instance_is_replaced_without_a_refused_connection" % os.path.abspath(__file__))
            env = dict(os.environ, AGGWAY_TEST_NETNS="1")
            p = subprocess.run(["unshare", "--net", "sh", "-c", script], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=240)
            out = p.stdout.decode(errors="replace")
            if p.returncode != 0 and "unshare failed" in out:
                self.skipTest("cannot make a network namespace here (unshare: %s) and net.ipv4.tcp_migrate_req "
                              "is 0" % out.strip()[-200:])
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("Ran 1 test", out)
            return
        self.replace_instance()

    def replace_instance(self):
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
            # b.start() saw an answer on the port, maybe a's: wait for b's own "serving" line (its
            # listening sockets are open by then), as an operator waits for READY=1 or /readyz
            self.assertTrue(harness.wait_until(lambda: "aggway serving" in b.log(), harness.START_TIMEOUT), b.log())
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
        self.assertIn(b"listen[1].reuse: unknown option (did you mean 'reuse_port'?) (port, host, tls, reuse_port)", r.stderr)


if __name__ == "__main__":
    harness.main()
