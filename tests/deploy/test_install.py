"""`cmake --install` into a temporary prefix, then the installed binary serves the installed
example scripts (real gateway + mock upstreams + curl), reads its Lua runtime from the install
(never from the source tree), and tells a service manager (sd_notify) when it is ready."""
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import deploylib
from deploylib import harness

SRC = deploylib.SOURCE_DIR


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def run(args, env=None, timeout=30):
    e = dict(os.environ)
    e.pop("AGGWAY_LUA_DIR", None)
    e.update(env or {})
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=timeout)


class Install(harness.GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.prefix = os.path.join(self.workdir, "opt", "aggway")
        self.files = deploylib.install(self.prefix)
        self.bin = os.path.join(self.prefix, "bin", "aggway")
        self.etc = os.path.join(self.prefix, "etc", "aggway", "scripts")
        self.proc = None
        self.addCleanup(self._stop_installed)

    def _stop_installed(self):
        harness.stop_process(self.proc)

    # ---- layout ---------------------------------------------------------------------------------
    def test_install_lays_out_binary_runtime_examples_unit_logrotate_monitoring_and_man_page(self):
        p = self.prefix
        want = {os.path.join(p, "bin/aggway"), os.path.join(p, "lib/systemd/system/aggway.service"),
                os.path.join(p, "etc/logrotate.d/aggway"), os.path.join(p, "share/man/man1/aggway.1"),
                os.path.join(p, "share/aggway/monitoring/aggway-dashboard.json"),
                os.path.join(p, "share/aggway/monitoring/aggway-alerts.yml"),
                os.path.join(p, "share/doc/aggway/README.md")}
        for f in glob.glob(os.path.join(SRC, "lua", "agg", "*.lua")):
            want.add(os.path.join(p, "share/aggway/lua/agg", os.path.basename(f)))
        for f in harness.repo_scripts(protected=True):
            want.add(os.path.join(self.etc, f))
        want.add(os.path.join(self.etc, "gateway.lua"))
        self.assertEqual(sorted(want - set(self.files)), [], "missing from the install")
        self.assertEqual([f for f in self.files if not f.startswith(p + "/")], [], "installed outside the prefix")
        self.assertTrue(os.access(self.bin, os.X_OK))
        unit = read(os.path.join(p, "lib/systemd/system/aggway.service"))
        self.assertIn("ExecStart=%s serve -c %s\n" % (self.bin, self.etc), unit)
        self.assertIn("ExecStartPre=%s check -c %s\n" % (self.bin, self.etc), unit)
        self.assertEqual(re.findall(r"@[A-Z_]+@", unit), [], "a template variable was left unfilled")

    def test_prefix_usr_puts_the_examples_and_logrotate_in_etc(self):
        stage = os.path.join(self.workdir, "stage")
        files = deploylib.install("/usr", destdir=stage)
        for f in ("/usr/bin/aggway", "/usr/share/aggway/lua/agg/loader.lua", "/etc/aggway/scripts/gateway.lua",
                  "/etc/logrotate.d/aggway", "/usr/lib/systemd/system/aggway.service"):
            self.assertIn(f, files)
        self.assertEqual([f for f in files if f.startswith("/usr/etc")], [])
        unit = read(os.path.join(stage, "usr/lib/systemd/system/aggway.service"))
        self.assertIn("ExecStart=/usr/bin/aggway serve -c /etc/aggway/scripts\n", unit)
        # the staged binary finds the runtime staged beside it
        r = run([os.path.join(stage, "usr/bin/aggway"), "version"])
        self.assertEqual(r.returncode, 0, r)
        self.assertIn("lua runtime: %s/usr/share/aggway/lua (installed)" % os.path.realpath(stage), r.stdout.decode())

    # ---- the runtime's lookup -------------------------------------------------------------------
    def test_installed_binary_reads_the_runtime_installed_beside_it(self):
        r = run([self.bin, "version"])
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(r.stdout.decode().splitlines()[1],
                         "lua runtime: %s/share/aggway/lua (installed)" % os.path.realpath(self.prefix))
        r = run([self.bin, "check", "-c", self.etc])
        self.assertEqual(r.returncode, 0, r)

    def test_a_moved_install_follows_its_binary_and_never_falls_back_to_the_source_tree(self):
        moved = os.path.join(self.workdir, "elsewhere")
        shutil.copytree(self.prefix, moved, symlinks=True)
        r = run([os.path.join(moved, "bin/aggway"), "version"])
        self.assertIn("lua runtime: %s/share/aggway/lua (installed)" % os.path.realpath(moved), r.stdout.decode())
        shutil.rmtree(os.path.join(moved, "share/aggway/lua"))
        for cmd in (["check", "-c", os.path.join(moved, "etc/aggway/scripts")], ["version"]):
            r = run([os.path.join(moved, "bin/aggway")] + cmd)
            out = (r.stdout + r.stderr).decode()
            self.assertEqual(r.returncode, 1, out)
            self.assertIn("cannot find the Lua runtime (agg/loader.lua): not in %s/bin/../share/aggway/lua"
                          % os.path.realpath(moved), out)
            self.assertIn("set AGGWAY_LUA_DIR", out)
            self.assertNotIn(os.path.join(SRC, "lua"), out)
        # serve refuses to start the same way, at once
        r = run([os.path.join(moved, "bin/aggway"), "serve", "-c", os.path.join(moved, "etc/aggway/scripts")])
        self.assertEqual(r.returncode, 1)
        self.assertIn(b"cannot find the Lua runtime", r.stderr)

    def test_AGGWAY_LUA_DIR_is_used_as_given_and_a_wrong_one_is_an_error(self):
        other = os.path.join(self.workdir, "runtime-copy")
        shutil.copytree(os.path.join(self.prefix, "share/aggway/lua"), other)
        r = run([self.bin, "version"], env={"AGGWAY_LUA_DIR": other})
        self.assertIn("lua runtime: %s (AGGWAY_LUA_DIR)" % os.path.realpath(other), r.stdout.decode())
        empty = os.path.join(self.workdir, "empty")
        os.makedirs(empty)
        r = run([self.bin, "check", "-c", self.etc], env={"AGGWAY_LUA_DIR": empty})
        self.assertEqual(r.returncode, 1)
        self.assertIn(("AGGWAY_LUA_DIR=%s has no agg/loader.lua" % empty).encode(), r.stderr)

    # ---- serving the installed examples ---------------------------------------------------------
    def _configure_installed_example(self):
        """Points the installed example gateway.lua at the mock and at free ports (the addresses
        are all an operator edits); the endpoint scripts stay as installed."""
        # (the services answer at once: the example's own timeouts, 100 ms for two of its sections,
        # are then the gateway's alone, which a loaded machine and a sanitized build must meet)
        self.start_mock(harness.demo_services(product_ms=0, reviews_ms=0, inventory_ms=0))
        path = os.path.join(self.etc, "gateway.lua")
        text = read(path)
        self.port, self.admin = harness.free_port(), harness.free_port()
        new = text.replace("port = 8080", "port = %d" % self.port).replace("port = 9090", "port = %d" % self.admin)
        for name, port in (("product", 9001), ("reviews", 9002), ("inventory", 9003)):
            new = new.replace("http://127.0.0.1:%d" % port, self.mock.url(name))
        self.assertEqual(len(re.findall(r"port = \d+", new)), 2, "the example's listen and admin ports")
        self.assertNotEqual(new, text)
        with open(path, "w") as f:
            f.write(new)

    def _notify_socket(self):
        path = os.path.join(self.workdir, "notify.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        self.addCleanup(s.close)
        return s, path

    def _next_notification(self, s, timeout):
        s.settimeout(timeout)
        try:
            return s.recv(4096).decode()
        except socket.timeout:
            return None

    def _serve(self, env):
        log = open(os.path.join(self.workdir, "installed.log"), "wb")
        e = dict(os.environ)
        e.pop("AGGWAY_LUA_DIR", None)
        e.update(env)
        self.proc = subprocess.Popen([self.bin, "serve", "-c", self.etc], stdout=log, stderr=log, env=e,
                                     stdin=subprocess.DEVNULL)
        log.close()

    def _log(self):
        return read(os.path.join(self.workdir, "installed.log"), "rb").decode(errors="replace")

    def test_installed_gateway_serves_the_installed_examples_and_notifies_readiness_reload_and_stop(self):
        self._configure_installed_example()
        r = run([self.bin, "check", "-c", self.etc])
        self.assertEqual(r.returncode, 0, r)
        routes = len(harness.repo_scripts(protected=True))  # one route per example script
        self.assertIn(b"valid: %d routes, 3 upstreams" % routes, r.stdout)
        sock, path = self._notify_socket()
        self._serve({"NOTIFY_SOCKET": path})
        msg = self._next_notification(sock, harness.START_TIMEOUT)
        self.assertIsNotNone(msg, "no READY=1 from the gateway:\n" + self._log())
        self.assertIn("READY=1", msg.splitlines())
        self.assertIn("STATUS=serving %s: generation 1, %d routes, 3 upstreams" % (self.etc, routes), msg.splitlines())
        # READY=1 comes once every worker serves: /readyz and the pages answer at once
        ready = harness.curl("http://127.0.0.1:%d/readyz" % self.admin)
        self.assertEqual(ready.status, 200, ready)
        for path_ in ("/product-page/42", "/product-detail/42"):
            r = harness.curl("http://127.0.0.1:%d%s" % (self.port, path_))
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers.get("x-aggregation-completed"), "true", r)
        # the protected example asks for a token before anything else
        r = harness.curl("http://127.0.0.1:%d/account/42" % self.port)
        self.assertEqual(r.status, 401, r)
        page = harness.curl("http://127.0.0.1:%d/product-page/42" % self.port).json()
        self.assertEqual({k: v["status"] for k, v in page.items()},
                         {"product": "ok", "reviews": "ok", "inventory": "ok"})
        metrics = harness.curl("http://127.0.0.1:%d/metrics" % self.admin)
        self.assertIn(b'aggway_requests_total{route="GET /product-page/{id}",code="200"}', metrics.body)
        # a reload is framed by RELOADING=1 and READY=1
        self.proc.send_signal(signal.SIGHUP)
        msg = self._next_notification(sock, 30)
        self.assertIsNotNone(msg, self._log())
        self.assertIn("RELOADING=1", msg.splitlines())
        self.assertRegex(msg, r"(?m)^MONOTONIC_USEC=\d+$")
        msg = self._next_notification(sock, 30)
        self.assertIn("READY=1", msg.splitlines(), msg)
        self.assertIn("generation 2", msg)
        # a reload that fails is framed the same way (the old generation serves)
        with open(os.path.join(self.etc, "broken.lua"), "w") as f:
            f.write("return {\n")
        self.proc.send_signal(signal.SIGHUP)
        self.assertIn("RELOADING=1", self._next_notification(sock, 30))
        msg = self._next_notification(sock, 30)
        self.assertIn("READY=1", msg.splitlines(), msg)
        self.assertIn("reload failed, generation 2 keeps serving", msg)
        # SIGTERM: STOPPING=1, then a clean exit
        self.proc.send_signal(signal.SIGTERM)
        msg = self._next_notification(sock, 30)
        self.assertIn("STOPPING=1", msg.splitlines(), msg)
        self.assertEqual(self.proc.wait(timeout=30), 0, self._log())

    def test_a_notify_socket_that_is_not_a_path_is_a_warning_and_the_gateway_serves(self):
        self._configure_installed_example()
        self._serve({"NOTIFY_SOCKET": "relative/notify.sock"})
        ok = harness.wait_until(lambda: harness.curl("http://127.0.0.1:%d/readyz" % self.admin, timeout=2).status == 200,
                                harness.START_TIMEOUT)
        self.assertTrue(ok, self._log())
        self.assertIn("NOTIFY_SOCKET=relative/notify.sock is not a socket path or @abstract name", self._log())
        self.assertEqual(harness.curl("http://127.0.0.1:%d/product-page/42" % self.port).status, 200)

    def test_abstract_notify_socket_gets_ready(self):
        self._configure_installed_example()
        name = "aggway-test-%d-%d" % (os.getpid(), time.monotonic_ns())
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind("\0" + name)
        self.addCleanup(s.close)
        self._serve({"NOTIFY_SOCKET": "@" + name})
        msg = self._next_notification(s, harness.START_TIMEOUT)
        self.assertIsNotNone(msg, self._log())
        self.assertIn("READY=1", msg.splitlines())

    # ---- the command line -----------------------------------------------------------------------
    def test_help_lists_every_command_option_and_environment_variable(self):
        main_c = read(glob.glob(os.path.join(SRC, "gateway", "**", "main.c"), recursive=True)[0])
        commands = set(re.findall(r'strcmp\(cmd, "([a-z]+)"\)', main_c))
        self.assertTrue({"serve", "check", "test", "version", "help"} <= commands, commands)
        env_vars = {"NOTIFY_SOCKET"}
        for f in glob.glob(os.path.join(SRC, "gateway", "**", "*.c"), recursive=True):
            env_vars |= set(re.findall(r'getenv\("(AGGWAY_[A-Z_]+)"\)', read(f)))
        self.assertIn("AGGWAY_LUA_DIR", env_vars)
        r = run([self.bin, "--help"])
        self.assertEqual(r.returncode, 0)
        text = r.stdout.decode()
        man = read(os.path.join(self.prefix, "share/man/man1/aggway.1")).replace("\\-", "-")
        readme = read(os.path.join(SRC, "README.md"))
        for c in commands:
            self.assertRegex(text, r"(?m)^  %s\b" % c, "help misses the command " + c)
            self.assertRegex(man, r"(?m)^\.B[RI]? %s\b" % c, "the man page misses the command " + c)
            self.assertTrue("`aggway %s" % c in readme, "README's command line misses " + c)
        for opt in ("-c DIR",):
            self.assertIn(opt, text)
        for v in env_vars:
            self.assertIn(v, text, "help misses the environment variable " + v)
            self.assertIn(v, man, "the man page misses the environment variable " + v)
        for sig in ("SIGHUP", "SIGTERM", "SIGINT", "SIGUSR1"):
            self.assertIn(sig, text)
        # a command-line mistake: what is wrong, then the usage line that says where the help is
        r = run([self.bin, "serve", "-x"])
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.decode(), "aggway: unknown option '-x'\n"
                         "usage: aggway COMMAND [-c DIR] [ARGS...]  ('aggway help' lists the commands and options)\n")


if __name__ == "__main__":
    harness.main()
