"""The deploy/ files agree with the gateway they deploy: the systemd unit (systemd-analyze verify
and its settings), logrotate (a real rotation with SIGUSR1), the container recipe (it copies what
the install lays out, its packages cover the .deb's dependencies) and the monitoring files (every
metric, label and label value they use is on /metrics of a running gateway)."""
import json
import os
import re
import shutil
import signal
import subprocess

import yaml

import deploylib
from deploylib import harness

SRC = deploylib.SOURCE_DIR


def read(path):
    with open(path) as f:
        return f.read()


def c_define(name):
    """The value of #define name in the gateway's C sources."""
    for root, _dirs, files in os.walk(os.path.join(SRC, "gateway")):
        for f in files:
            if f.endswith((".c", ".h")):
                m = re.search(r"#define %s (\d+)" % name, read(os.path.join(root, f)))
                if m:
                    return int(m.group(1))
    raise AssertionError(name + " is not defined in gateway/")


def config_default(key):
    """The default of a gateway.lua number key as lua/agg/config.lua sets it (key = number)."""
    text = "".join(read(os.path.join(SRC, "lua", "agg", f)) for f in os.listdir(os.path.join(SRC, "lua", "agg")))
    m = re.search(r"\b%s = (\d+)" % key, text)
    if not m:
        raise AssertionError("no default for %s in lua/agg" % key)
    return int(m.group(1))


class Unit(harness.GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.prefix = os.path.join(self.workdir, "p")
        deploylib.install(self.prefix)
        self.unit_path = os.path.join(self.prefix, "lib/systemd/system/aggway.service")
        self.unit = deploylib.unit_settings(read(self.unit_path))
        self.svc = self.unit["Service"]

    def test_systemd_analyze_verify_passes_and_catches_a_misspelt_key(self):
        if shutil.which("systemd-analyze") is None:
            self.skipTest("systemd-analyze is not installed (tools/bootstrap installs systemd)")
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", self.unit_path], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual((r.returncode, r.stdout.decode()), (0, ""))
        bad = os.path.join(self.workdir, "aggway-bad.service")
        with open(bad, "w") as f:
            f.write(read(self.unit_path).replace("KillSignal=", "KillSignl="))
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", bad], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        self.assertIn("Unknown key 'KillSignl'", r.stdout.decode())

    def test_readiness_reload_and_stop_match_the_gateway(self):
        self.assertEqual(self.svc["Type"], ["notify"])
        # check's dry run first (a SIGHUP's load does not run it), then the signal
        self.assertEqual(len(self.svc["ExecReload"]), 2, self.svc["ExecReload"])
        self.assertTrue(self.svc["ExecReload"][0].endswith("aggway check -c %s/etc/aggway/scripts" % self.prefix))
        self.assertEqual(self.svc["ExecReload"][1], "/bin/kill -HUP $MAINPID")
        self.assertEqual(self.svc["KillSignal"], ["SIGTERM"])
        # the drain may take shutdown_grace_ms, then a stuck worker AGW_WORKER_STOP_WAIT_MS more
        grace_s = config_default("shutdown_grace_ms") / 1000
        stop_wait_s = c_define("AGW_WORKER_STOP_WAIT_MS") / 1000
        self.assertGreater(deploylib.timespan_s(self.svc["TimeoutStopSec"][0]), grace_s + stop_wait_s)
        self.assertIn("journal", self.svc["StandardError"])
        self.assertTrue(self.svc["ExecStart"][0].endswith("aggway serve -c %s/etc/aggway/scripts" % self.prefix))
        self.assertTrue(self.svc["ExecStartPre"][0].endswith("aggway check -c %s/etc/aggway/scripts" % self.prefix))

    def test_open_file_limit_holds_the_example_pools_on_a_big_host_and_clients(self):
        # workers = "auto" on a 64-core host, every upstream of the example at the default pool
        # size, and at least 1024 descriptors for clients, listeners and logs
        example = read(os.path.join(self.prefix, "etc/aggway/scripts/gateway.lua"))
        upstreams = len(re.findall(r"url = ", example))
        self.assertGreater(upstreams, 0)
        need = 64 * upstreams * config_default("max_connections") + 1024
        self.assertGreaterEqual(int(self.svc["LimitNOFILE"][0]), need)

    def test_sandbox(self):
        s = self.svc
        self.assertTrue(s.get("DynamicUser") == ["yes"] or "User" in s)
        for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                           ("PrivateTmp", "yes"), ("PrivateDevices", "yes"), ("RestrictNamespaces", "yes"),
                           ("ProtectKernelTunables", "yes"), ("ProtectControlGroups", "yes")):
            self.assertEqual(s.get(key), [value], key)
        self.assertEqual(set(s["RestrictAddressFamilies"][0].split()), {"AF_INET", "AF_INET6", "AF_UNIX"})
        self.assertIn("@system-service", s["SystemCallFilter"])
        self.assertEqual(s["CapabilityBoundingSet"], [""])
        self.assertNotEqual(s.get("MemoryDenyWriteExecute"), ["yes"], "LuaJIT writes the code it compiles")
        self.assertEqual(s["LogsDirectory"], ["aggway"])


class Logrotate(harness.GatewayTestCase):
    def test_logrotate_rotates_the_access_log_and_the_gateway_reopens_it_on_SIGUSR1(self):
        if shutil.which("logrotate") is None:
            self.skipTest("logrotate is not installed (tools/bootstrap installs it)")
        prefix = os.path.join(self.workdir, "p")
        deploylib.install(prefix)
        conf = read(os.path.join(prefix, "etc/logrotate.d/aggway"))
        self.assertIn("/var/log/aggway/*.log", conf)
        self.assertIn("systemctl kill --signal=SIGUSR1 --kill-who=main aggway.service", conf)
        logdir = os.path.join(self.workdir, "log")
        os.makedirs(logdir)
        access = os.path.join(logdir, "access.log")
        self.start(gateway_extra={"access_log": access})
        for _ in range(3):
            self.assertEqual(self.get("/product-page/1").status, 200)
        self.assertTrue(harness.wait_until(lambda: os.path.exists(access) and read(access).count('"/product-page/1"') == 3,
                                           5))
        # the installed rules, on this log folder, with the signal sent to this gateway
        mine = conf.replace("/var/log/aggway", logdir).replace(
            "systemctl kill --signal=SIGUSR1 --kill-who=main aggway.service", "kill -USR1 %d" % self.gw.proc.pid)
        rules = os.path.join(self.workdir, "logrotate.conf")
        with open(rules, "w") as f:
            f.write(mine)
        r = subprocess.run(["logrotate", "--force", "--state", os.path.join(self.workdir, "state"), rules],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertTrue(os.path.exists(access + ".1"), os.listdir(logdir))   # delaycompress: .1 stays plain
        self.assertTrue(harness.wait_until(lambda: "SIGUSR1: reopened the access log" in self.gw.log(), 5))
        for _ in range(2):
            self.assertEqual(self.get("/product-page/2").status, 200)
        self.assertTrue(harness.wait_until(lambda: os.path.exists(access) and read(access).count("\n") == 2, 5),
                        os.listdir(logdir))
        self.assertEqual(read(access + ".1").count('"/product-page/1"'), 3)
        self.assertNotIn('"/product-page/2"', read(access + ".1"))
        self.assertTrue(all('"/product-page/2"' in l for l in read(access).splitlines()))


class Container(harness.GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.recipe = read(os.path.join(SRC, "deploy", "container", "Containerfile"))
        self.stages = re.split(r"(?m)^FROM ", self.recipe)[1:]

    def packages(self, stage):
        m = re.search(r"apt-get install[^\n]*?--no-install-recommends((?:[^\n]*\\\n)+?[^\n]*?)(?:\\\n)? *&&",
                      stage)
        self.assertIsNotNone(m, stage)
        return set(re.sub(r"\\\n", " ", m.group(1)).split())

    def test_debian_12_two_stages_non_root_with_a_readyz_health_check(self):
        self.assertEqual(len(self.stages), 2)
        for st in self.stages:
            self.assertTrue(st.startswith("debian:12"), st[:40])
        run = self.stages[1]
        m = re.search(r"(?m)^USER (\S+)", run)
        self.assertIsNotNone(m)
        self.assertNotIn(m.group(1), ("root", "0"))
        admin = re.search(r"admin = \{ port = (\d+) \}", read(os.path.join(SRC, "scripts", "gateway.lua")))
        self.assertIsNotNone(admin, "the example gateway.lua turns on the admin listener")
        self.assertIn("HEALTHCHECK", run)
        self.assertIn("http://127.0.0.1:%s/readyz" % admin.group(1), run)
        self.assertIn('CMD ["serve", "-c", "/etc/aggway/scripts"]', run)

    def test_it_copies_what_the_install_lays_out_and_builds_from_what_cmake_reads(self):
        files = deploylib.install("/usr", destdir=os.path.join(self.workdir, "stage"))
        copies = re.findall(r"(?m)^COPY --from=build /stage(/\S+) (/\S+)$", self.stages[1])
        self.assertGreaterEqual(len(copies), 3)
        for src, dst in copies:
            self.assertEqual(src, dst, "the image keeps the install's layout")
            self.assertTrue(src in files or any(f.startswith(src + "/") for f in files),
                            "%s is not laid out by cmake --install" % src)
        copied = [f for f in files if any(f == s or f.startswith(s + "/") for s, _ in copies)]
        for must in ("/usr/bin/aggway", "/usr/share/aggway/lua/agg/loader.lua", "/etc/aggway/scripts/gateway.lua"):
            self.assertIn(must, copied)
        # the build stage copies every top-level entry the build reads (tools, tests, spec and
        # examples only feed ctest)
        build_copies = set()
        for line in re.findall(r"(?m)^COPY (?!--from)(.+)$", self.stages[0]):
            build_copies |= set(line.split()[:-1])
        cmake_text = read(os.path.join(SRC, "CMakeLists.txt")) + read(os.path.join(SRC, "cmake", "Install.cmake"))
        needed = {"CMakeLists.txt", "cmake", "gateway", "lua", "scripts", "deploy", "README.md"}
        for top in set(re.findall(r"\$\{CMAKE_SOURCE_DIR\}/([A-Za-z_.-]+)", cmake_text)) - {"tools", "tests", "spec", "examples"}:
            needed.add(top)
        self.assertEqual(sorted(needed - build_copies), [])
        for top in needed:
            self.assertTrue(os.path.exists(os.path.join(SRC, top)), top)

    def test_runtime_packages_cover_the_libraries_the_binary_links_with(self):
        # the image builds without sanitizers (RelWithDebInfo): a debug build's libasan/libubsan
        # are not among what it needs
        want = {p for p in needed_packages(harness.AGGWAY_BIN) if not re.match(r"lib(a|ub)san\d", p)}
        self.assertTrue({"libh2o0.13", "libluajit2-5.1-2", "libjansson4"} <= want, want)
        self.assertEqual(sorted(want - self.packages(self.stages[1])), [])
        # and the build stage has the -dev packages tools/bootstrap names for building
        boot = read(os.path.join(SRC, "tools", "bootstrap"))
        dev = set(re.findall(r"\b(lib[a-z0-9.+-]+-dev)\b", boot.split("pkgs=(", 1)[1].split("chromium", 1)[0]))
        self.assertTrue(dev)
        self.assertEqual(sorted(dev - self.packages(self.stages[0])), [])


def needed_packages(binary):
    """The Debian packages that hold the shared libraries binary names (DT_NEEDED, as
    dpkg-shlibdeps reads them), found with dpkg -S."""
    out = subprocess.run(["objdump", "-p", binary], stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode()
    libs = re.findall(r"NEEDED\s+(\S+)", out)
    ldd = subprocess.run(["ldd", binary], stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode()
    paths = dict(re.findall(r"(\S+) => (\S+)", ldd))
    pkgs = set()
    for lib in libs:
        if lib not in paths:
            raise AssertionError("ldd does not resolve %s" % lib)
        path = paths[lib]
        real = os.path.realpath(path)
        for cand in (path, real, real.replace("/usr/lib/", "/lib/", 1), path.replace("/lib/", "/usr/lib/", 1)):
            r = subprocess.run(["dpkg", "-S", cand], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
            if r.returncode == 0:
                pkgs.add(r.stdout.decode().split(":")[0])
                break
        else:
            raise AssertionError("no Debian package holds %s (%s)" % (lib, path))
    return pkgs


class Monitoring(harness.GatewayTestCase):
    EXTERNAL = {"up"}                 # Prometheus' own series
    PROMETHEUS_LABELS = {"instance", "job"}

    def expressions(self):
        dash = json.loads(read(os.path.join(SRC, "deploy", "grafana", "aggway-dashboard.json")))
        exprs = []

        def walk(panels):
            for p in panels:
                exprs.extend(t["expr"] for t in p.get("targets", []))
                walk(p.get("panels", []))
        walk(dash["panels"])
        exprs.extend(a["expr"] for a in dash["annotations"]["list"] if "expr" in a)
        for v in dash["templating"]["list"]:
            if v.get("type") == "query":
                exprs.append(re.sub(r"^label_values\((\w+),.*$", r"\1", v["query"]))
        rules = yaml.safe_load(read(os.path.join(SRC, "deploy", "prometheus", "aggway-alerts.yml")))
        for g in rules["groups"]:
            for r in g["rules"]:
                self.assertIn("alert", r)
                exprs.append(r["expr"])
        return [e.replace("$__rate_interval", "5m") for e in exprs]

    def scrape(self):
        """family -> {label -> set of values} from /metrics (histogram series under the family)."""
        text = harness.curl("http://127.0.0.1:%d/metrics" % self.admin).body.decode()
        fams, types = {}, {}
        for name, kind in re.findall(r"(?m)^# TYPE (\S+) (\S+)$", text):
            types[name] = kind
            fams.setdefault(name, {})
        for name, labels in re.findall(r"(?m)^([a-z_:]+)(?:\{(.*)\})? \S+$", text):
            fam = re.sub(r"_(bucket|sum|count)$", "", name) if re.sub(r"_(bucket|sum|count)$", "", name) in types \
                and types[re.sub(r"_(bucket|sum|count)$", "", name)] == "histogram" else name
            for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels or ""):
                fams.setdefault(fam, {}).setdefault(k, set()).add(v)
        return fams, types

    def check_expr(self, e, fams, types):
        """Asserts that every metric, label and literal label value e uses is on /metrics (fams,
        types as scrape() gives them); returns the metric families e uses."""
        names = set(re.findall(r"\b(aggway_[a-z_]+)\b", e))
        self.assertTrue(names or set(re.findall(r"\b(\w+)\{", e)) & self.EXTERNAL, e)
        families = set()
        for n in names:
            base = re.sub(r"_(bucket|sum|count)$", "", n)
            if n != base and types.get(base) == "histogram":
                families.add(base)
            else:
                self.assertIn(n, types, "%s (in %r) is not on /metrics" % (n, e))
                families.add(n)
        # labels in by (...), on (...), and matchers {label op "value"}
        labels = set()
        for group in re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", e):
            labels |= {x.strip() for x in group.split(",") if x.strip()}
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', e)
        labels |= {m[0] for m in matchers}
        for lab in labels - self.PROMETHEUS_LABELS:
            if lab == "le":
                self.assertTrue(any(types.get(f) == "histogram" for f in families), e)
                continue
            self.assertTrue(any(lab in fams.get(f, {}) for f in families),
                            "label %s (in %r) is on none of %s" % (lab, e, sorted(families)))
        for lab, op, value in matchers:
            if lab in self.PROMETHEUS_LABELS or "$" in value:
                continue
            have = set().union(*(fams.get(f, {}).get(lab, set()) for f in families))
            wanted = value.split("|") if op in ("=~", "!~") else [value]
            for w in wanted:
                if op in ("=~", "!~") and re.search(r"[.*+?\[\]()]", w):
                    continue   # a pattern, not a value
                self.assertIn(w, have, "%s=%r (in %r) is not a value of %s on /metrics" % (lab, w, e, lab))
        return families

    def test_every_metric_label_and_value_the_dashboard_and_alerts_use_is_on_metrics(self):
        self.admin = harness.free_port()
        # reviews hangs: pages come partial (the partial-page series), calls time out
        self.start(services=harness.demo_services(reviews_ms=[harness.route("/reviews/{id}", fault="hang")]),
                   gateway_extra={"admin": {"port": self.admin}})
        for _ in range(3):
            r = self.get("/product-page/7")
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers.get("x-aggregation-completed"), "false")
        fams, types = self.scrape()
        exprs = self.expressions()
        self.assertGreater(len(exprs), 20)
        used = set()
        for e in exprs:
            used |= self.check_expr(e, fams, types)
        # the families the issue names are all on the dashboard or in the rules
        for must in ("aggway_partial_pages_total", "aggway_upstream_call_duration_seconds", "aggway_upstream_calls_total",
                     "aggway_upstream_breaker_state", "aggway_upstream_retries_total", "aggway_upstream_hedges_total",
                     "aggway_upstream_collapsed_total", "aggway_reloads_total", "aggway_reload_failures_total"):
            self.assertIn(must, used)

    def test_a_misspelt_metric_label_or_value_is_caught(self):
        # the check above can fail: a metric, a label or a value the gateway does not have
        self.admin = harness.free_port()
        self.start(gateway_extra={"admin": {"port": self.admin}})
        self.assertEqual(self.get("/product-page/1").status, 200)
        fams, types = self.scrape()
        self.check_expr('sum by (upstream, outcome) (rate(aggway_upstream_calls_total{outcome="timeout"}[5m]))',
                        fams, types)
        for bad in ("rate(aggway_partial_page_total[5m])",
                    "sum by (section) (rate(aggway_upstream_calls_total[5m]))",
                    'rate(aggway_upstream_calls_total{outcome="timedout"}[5m])',
                    'rate(aggway_upstream_calls_total{outcome=~"ok|timedout"}[5m])'):
            with self.assertRaises(AssertionError, msg=bad):
                self.check_expr(bad, fams, types)

if __name__ == "__main__":
    harness.main()
