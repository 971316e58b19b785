"""Integration test harness: starts the real aggway gateway and aggway-mock upstreams.

A test case derives from GatewayTestCase and describes, in its own words, what the upstreams
answer and which scripts the gateway runs, then asserts on what a client sees:

    class ProductPage(GatewayTestCase):
        def test_complete_page(self):
            self.start(services=demo_services(product_ms=40), scripts=repo_scripts())
            r = self.get("/product-page/42")
            self.assertEqual(r.status, 200)

Everything a test starts (mock, gateway, curl, h2load) runs with a bounded timeout and is
stopped in the test's cleanup, whether the test passed or not.

Environment (set by ctest): AGGWAY_BIN, AGGWAY_MOCK_BIN, AGGWAY_SOURCE_DIR. Without them the
harness falls back to build/ in the source tree.
"""
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

SOURCE_DIR = os.environ.get("AGGWAY_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
AGGWAY_BIN = os.environ.get("AGGWAY_BIN") or os.path.join(SOURCE_DIR, "build", "aggway")
MOCK_BIN = os.environ.get("AGGWAY_MOCK_BIN") or os.path.join(SOURCE_DIR, "build", "aggway-mock")

# As ctest's debug preset: exit-time leak reports are off (the sanitizers still abort on errors).
os.environ.setdefault("ASAN_OPTIONS", "detect_leaks=0")

# Sanitizer builds are several times slower; the tests scale their waits (never their claims
# about what must be fast relative to what must be slow) by this factor.
SLOW = os.path.basename(os.path.dirname(AGGWAY_BIN)).startswith("build-debug") or \
    os.environ.get("AGGWAY_SLOW") == "1"

START_TIMEOUT = 20.0 if SLOW else 10.0
CURL_TIMEOUT = 10.0


# ---------------------------------------------------------------------------------------------
# ports

_used_ports = set()
_port_lock = threading.Lock()


def free_port():
    """A TCP port that was free a moment ago (bind port 0 and release it). The caller retries
    on collision: see GatewayTestCase.start."""
    with _port_lock:
        for _ in range(100):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            finally:
                s.close()
            if port not in _used_ports:
                _used_ports.add(port)
                return port
    raise RuntimeError("no free port found")


def read_all(sock, timeout):
    """Everything sock receives until the peer closes it (socket.timeout after timeout s)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        d = sock.recv(65536)
        if not d:
            return data
        data += d


def wait_until(pred, timeout, interval=0.02):
    """Polls pred() until it returns a true value or timeout seconds pass; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval)


def access_log_lines(path, want, timeout=5):
    """The JSON lines of the access log at path (the harness's readiness probes left out) once it
    has want of them, or None when it has fewer after timeout seconds."""
    def lines():
        if not os.path.exists(path):
            return None
        with open(path) as f:
            got = [json.loads(l) for l in f.read().splitlines()]
        got = [l for l in got if l["path"] != "/__harness_probe__"]
        return got if len(got) >= want else None
    return wait_until(lines, timeout)


def tcp_connects(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# the mock upstream

def route(path, **fields):
    """A mock route: route("/products/{id}", latency_ms=40, json={...}, fault="hang")."""
    r = {"path": path}
    r.update(fields)
    return r


def demo_services(product_ms=40, reviews_ms=80, inventory_ms=30):
    """Product, Reviews and Inventory as in tools/mock/demo.json, with the given latencies.
    Each value is a latency in ms, or a list of routes to use instead."""
    def routes(v, default):
        if isinstance(v, list):
            return v
        return [dict(default, latency_ms=v)]
    return {
        "product": routes(product_ms, route(
            "/products/{id}", json={"id": "{id}", "name": "Sneaker", "price": 89, "sku": "SNK-{id}",
                                    "description": "A comfortable running shoe."})),
        "reviews": routes(reviews_ms, route(
            "/reviews/{id}", json={"sku": "SNK-{id}", "rating": 4.6, "count": 128,
                                   "top": [{"user": "a", "stars": 5}]})) +
        ([] if isinstance(reviews_ms, list) else [route(
            "/reviews", latency_ms=reviews_ms,
            json={"sku": "{sku}", "rating": 4.6, "count": 128, "top": [{"user": "a", "stars": 5}]})]),
        "inventory": routes(inventory_ms, route(
            "/stock/{id}", json={"productId": "{id}", "inStock": 12, "warehouse": "BKK-1"})),
    }


class Mock:
    """One aggway-mock process. services: name -> list of routes (or a dict with routes and
    refuse). Ports are allocated here; self.ports[name] gives each service's port."""

    def __init__(self, workdir, services, config_extra=None, ports=None):
        self.workdir = workdir
        self.services = services
        self.config_extra = config_extra or {}
        self.fixed_ports = ports  # name -> port: the same port on several hosts (config_extra's host)
        self.proc = None
        self.ports = {}
        self.admin = None
        self.stdout_lines = []

    def start(self):
        last = None
        for _attempt in range(5):
            self.ports = dict(self.fixed_ports) if self.fixed_ports else {name: free_port() for name in self.services}
            self.admin = free_port()
            cfg = dict(self.config_extra, admin=self.admin, services={})
            for name, spec in self.services.items():
                svc = {"port": self.ports[name]}
                if isinstance(spec, dict):
                    svc.update(spec)
                else:
                    svc["routes"] = spec
                cfg["services"][name] = svc
            path = os.path.join(self.workdir, "mock.json")
            with open(path, "w") as f:
                json.dump(cfg, f, indent=1)
            self.log_path = os.path.join(self.workdir, "mock.log")
            log = open(self.log_path, "wb")
            self.proc = subprocess.Popen([MOCK_BIN, path], stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL)
            log.close()
            if self._wait_ready():
                return self
            self.stop()
            with open(self.log_path, "rb") as f:
                last = f.read().decode(errors="replace")
            if "in use" not in last or self.fixed_ports:
                break
        raise RuntimeError("aggway-mock did not start: " + (last or ""))

    def _wait_ready(self):
        ready = threading.Event()

        def reader():
            for line in self.proc.stdout:
                self.stdout_lines.append(line)
                if b"aggway-mock: ready" in line:
                    ready.set()
            ready.set()
        threading.Thread(target=reader, daemon=True).start()
        ready.wait(START_TIMEOUT)
        return self.proc.poll() is None and any(b"ready" in l for l in self.stdout_lines)

    def stop(self):
        stop_process(self.proc)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    # admin API -------------------------------------------------------------------------------
    def _admin(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        host = self.config_extra.get("host", "127.0.0.1")   # the mock binds every port, admin too, there
        req = urllib.request.Request("http://%s:%d%s" % (host, self.admin, path), data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError("mock admin %s %s: %d %s" % (method, path, e.code, e.read()))

    def set_routes(self, service, routes):
        return self._admin("PUT", "/services/%s/routes" % service, routes)

    def patch_route(self, service, fields):
        """Changes one route (named by fields' path and method) and keeps the others."""
        return self._admin("PATCH", "/services/%s/routes" % service, fields)

    def refuse(self, service):
        return self._admin("POST", "/services/%s/refuse" % service)

    def accept(self, service):
        return self._admin("POST", "/services/%s/accept" % service)

    def hits(self):
        return self._admin("GET", "/hits")

    def stats(self):
        return self._admin("GET", "/stats")

    def reset(self):
        return self._admin("POST", "/reset")

    def requests(self, service=None):
        """The requests the mock received (method, path, headers): per service, or one service's."""
        if service is None:
            return self._admin("GET", "/requests")
        return self._admin("GET", "/services/%s/requests" % service)

    def url(self, service):
        return "http://%s:%d" % (self.config_extra.get("host", "127.0.0.1"), self.ports[service])


# ---------------------------------------------------------------------------------------------
# the gateway

class LuaCode(str):
    """Lua source written as it is into gateway.lua (a function, an expression)."""


def lua_value(v, indent=""):
    """Python value -> Lua source (for gateway.lua)."""
    if isinstance(v, LuaCode):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "{ " + ", ".join(lua_value(x) for x in v) + " }"
    if isinstance(v, dict):
        inner = indent + "  "
        items = []
        for k, x in v.items():
            key = k if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) else "[%s]" % json.dumps(k)
            items.append("%s%s = %s" % (inner, key, lua_value(x, inner)))
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    raise TypeError(v)


def gateway_lua(port, upstreams, workers=1, deadline_ms=1000, tls=None, extra_listen=None, **extra):
    """The text of a gateway.lua: listen on port (plus TLS listeners), upstreams name -> options."""
    listen = [{"port": port}]
    if extra_listen:
        listen += extra_listen
    cfg = {"listen": listen, "workers": workers, "deadline_ms": deadline_ms, "upstreams": upstreams}
    cfg.update(extra)
    return "-- written by tests/integration/harness.py\nreturn " + lua_value(cfg) + "\n"


def repo_scripts(*names, protected=False):
    """Endpoint scripts of the repository's scripts/ folder: name -> source (all when no names).
    A script that asks for authentication (`auth = "jwt"`) needs the demo gateway.lua's `auth`
    block, which a test's own gateway.lua does not have: it is left out unless protected is true."""
    d = os.path.join(SOURCE_DIR, "scripts")
    out = {}
    for root, _dirs, files in os.walk(d):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), d)
            if rel == "gateway.lua" or not rel.endswith(".lua"):
                continue
            if names and rel not in names:
                continue
            with open(os.path.join(root, f)) as fh:
                src = fh.read()
            if not protected and re.search(r'(?m)^\s*auth\s*=\s*"(jwt|api_key)"', src):
                continue
            out[rel] = src
    return out


def make_self_signed_cert(workdir, prefix=""):
    """A throwaway self-signed certificate for localhost and 127.0.0.1 and its key: the paths of
    PREFIXcert.pem and PREFIXkey.pem in workdir."""
    cert = os.path.join(workdir, prefix + "cert.pem")
    key = os.path.join(workdir, prefix + "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return cert, key


class Gateway:
    """One `aggway serve -c DIR` process; its stderr (the log) goes to a file."""

    def __init__(self, scripts_dir, port, tls_port=None, nofile=None):
        self.dir = scripts_dir
        self.port = port
        self.tls_port = tls_port
        self.nofile = nofile          # RLIMIT_NOFILE (soft and hard) for the gateway, or None
        self.proc = None
        self.log_path = os.path.join(os.path.dirname(scripts_dir), "gateway.log")

    def start(self):
        log = open(self.log_path, "ab")
        nofile = self.nofile
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        self.proc = subprocess.Popen([AGGWAY_BIN, "serve", "-c", self.dir], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, preexec_fn=limit)
        log.close()
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            if tcp_connects(self.port) and self._answers():
                return True
            time.sleep(0.05)
        return False

    def _answers(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            s.sendall(b"GET /__harness_probe__ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = s.recv(64)
            s.close()
            return data.startswith(b"HTTP/1.1 ")
        except OSError:
            return False

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        stop_process(self.proc)


def stop_process(proc, timeout=5):
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------------
# clients: curl, nghttp, h2load

class Response:
    def __init__(self, status, headers, body, time_total, http_version, exit_code=0, header_list=None):
        self.status = status
        self.headers = headers            # lower-case name -> value (the last one)
        self.header_list = header_list or []
        self.body = body                  # bytes
        self.time_total = time_total      # seconds, as curl measured it
        self.ms = time_total * 1000.0
        self.http_version = http_version  # "1.1", "2"
        self.exit_code = exit_code

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return "<Response %s %.1f ms %s %r>" % (self.status, self.ms, self.headers, self.body[:400])


def parse_header_block(text):
    blocks = [b for b in re.split(r"\r?\n\r?\n", text) if b.strip()]
    headers, hlist = {}, []
    if not blocks:
        return headers, hlist
    for line in blocks[-1].splitlines()[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
            hlist.append((k.strip().lower(), v.strip()))
    return headers, hlist


def curl(url, *args, timeout=CURL_TIMEOUT, workdir=None):
    """Runs curl; returns a Response (status 0 when curl got no answer, exit_code says why)."""
    tmp = tempfile.mkdtemp(dir=workdir)
    try:
        hfile, bfile = os.path.join(tmp, "h"), os.path.join(tmp, "b")
        cmd = ["curl", "-s", "-o", bfile, "-D", hfile, "-w", "%{http_code} %{time_total} %{http_version}",
               "--max-time", str(timeout)] + list(args) + [url]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout + 10)
        code, t, ver = (p.stdout.decode().split() + ["0", "0", "0"])[:3]
        headers, hlist = {}, []
        if os.path.exists(hfile):
            with open(hfile, "rb") as f:
                headers, hlist = parse_header_block(f.read().decode("latin-1"))
        body = b""
        if os.path.exists(bfile):
            with open(bfile, "rb") as f:
                body = f.read()
        return Response(int(code), headers, body, float(t), ver, p.returncode, hlist)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def nghttp(url, *args, timeout=CURL_TIMEOUT):
    """Runs `nghttp -v URL` (h2c prior knowledge); returns (status, headers, raw output text)."""
    p = subprocess.run(["nghttp", "-v", "-t", "%ds" % int(timeout)] + list(args) + [url],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout + 10)
    out = p.stdout.decode(errors="replace")
    headers = {}
    status = 0
    for m in re.finditer(r"recv \(stream_id=\d+(?:, sensitive)?\) (:?[\w-]+): (.*)", out):
        name, value = m.group(1).lower(), m.group(2).strip()
        if name == ":status":
            status = int(value)
        headers[name] = value
    return status, headers, out


def h2c_fields(url, *args, timeout=CURL_TIMEOUT):
    """GETs url with nghttp (h2c prior knowledge); returns (status, [(name, value)] of every response
    header field as received, pseudo-headers left out, raw output text). Unlike nghttp()'s dict,
    the list keeps a name that came twice (and the fields HPACK marks never-indexed, as h2o does
    set-cookie: nghttp prints them "sensitive")."""
    status, _headers, out = nghttp(url, *args, timeout=timeout)
    fields = [(m.group(1).lower(), m.group(2).strip())
              for m in re.finditer(r"recv \(stream_id=\d+(?:, sensitive)?\) ([\w-]+): (.*)", out)]
    return status, fields, out


def h2load(url, *args, timeout=120):
    """Runs h2load; returns a dict with total/succeeded/failed/errored, status classes and output."""
    p = subprocess.run(["h2load"] + list(args) + [url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    out = p.stdout.decode(errors="replace")
    res = {"output": out, "exit_code": p.returncode}
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    if m:
        for i, k in enumerate(["total", "started", "done", "succeeded", "failed", "errored", "timeout"]):
            res[k] = int(m.group(i + 1))
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        for i, k in enumerate(["2xx", "3xx", "4xx", "5xx"]):
            res[k] = int(m.group(i + 1))
    return res


# ---------------------------------------------------------------------------------------------
# the test case

# The upstream options of the repository's scripts/gateway.lua (without the URLs).
DEMO_UPSTREAM_OPTIONS = {
    "product": {"timeout_ms": 150, "connect_timeout_ms": 50},
    "reviews": {"timeout_ms": 100},
    "inventory": {"timeout_ms": 100},
}


def merge_options(base, override):
    out = {k: dict(v) for k, v in base.items()}
    for k, v in override.items():
        out.setdefault(k, {}).update(v)
    return out


# AddressSanitizer / UndefinedBehaviorSanitizer reports (the debug build): any is a test failure.
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak|Thread)Sanitizer|runtime error: |SUMMARY: \w+Sanitizer")


class GatewayTestCase(unittest.TestCase):
    """Base class: self.start(...) brings up the mock and the gateway; cleanup stops both."""

    maxDiff = None

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="aggway-it-")
        self.mock = None
        self.gw = None
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        for p in (self.gw, self.mock):
            try:
                if p:
                    p.stop()
            except Exception:
                pass
        problems = []
        try:
            if self.gw is not None:
                log = self.gw.log()
                if SANITIZER_REPORT.search(log):
                    problems.append("the gateway log has a sanitizer report:\n" + log[-6000:])
                rc = self.gw.proc.returncode if self.gw.proc else 0
                if rc not in (0, None):
                    problems.append("the gateway exited with %s on SIGTERM:\n%s" % (rc, log[-3000:]))
        finally:
            if os.environ.get("AGGWAY_KEEP_TMP") != "1":
                shutil.rmtree(self.workdir, ignore_errors=True)
        if problems:
            raise AssertionError("\n".join(problems))

    def start_mock(self, services):
        self.mock = Mock(self.workdir, services).start()
        return self.mock

    def start(self, services=None, scripts=None, upstream_options=None, workers=1, deadline_ms=1000,
              tls=False, gateway_extra=None, check_ok=True, nofile=None):
        """Starts the mock (services: name -> routes) and the gateway on scripts (name -> source;
        default: the repository's scripts). upstream_options: name -> extra options for that
        upstream in gateway.lua. tls: also listen with TLS on self.tls_port. nofile: the gateway's
        RLIMIT_NOFILE (soft and hard)."""
        if services is None:
            services = demo_services()
        if scripts is None:
            scripts = repo_scripts()
        if self.mock is None:
            self.start_mock(services)
        upstream_options = merge_options(DEMO_UPSTREAM_OPTIONS, upstream_options or {})
        cert_key = make_self_signed_cert(self.workdir) if tls else None
        for attempt in range(5):
            sdir = os.path.join(self.workdir, "scripts%d" % attempt)
            os.makedirs(sdir)
            self.port = free_port()
            self.tls_port = free_port() if tls else None
            ups = {}
            for name in self.mock.ports:
                u = {"url": self.mock.url(name)}
                u.update(upstream_options.get(name, {}))
                if "endpoints" in u:                      # an upstream group: its endpoints instead
                    del u["url"]
                ups[name] = u
            for name, opts in upstream_options.items():
                if name not in ups and "url" in opts:     # an upstream the mock does not play
                    ups[name] = opts
            extra_listen = None
            if tls:
                extra_listen = [{"port": self.tls_port, "tls": {"cert": cert_key[0], "key": cert_key[1]}}]
            write_scripts(sdir, scripts, gateway_lua(self.port, ups, workers=workers, deadline_ms=deadline_ms,
                                                     extra_listen=extra_listen, **(gateway_extra or {})))
            self.scripts_dir = sdir
            self.gw = Gateway(sdir, self.port, self.tls_port, nofile=nofile)
            if self.gw.start():
                if tls and not wait_until(lambda: tcp_connects(self.tls_port), START_TIMEOUT):
                    raise AssertionError("gateway does not listen on its TLS port:\n" + self.gw.log())
                return self.gw
            log = self.gw.log()
            self.gw.stop()
            if "in use" not in log and "another process" not in log:
                raise AssertionError("gateway did not start:\n" + log)
        raise AssertionError("gateway did not start after 5 port choices")

    # requests ----------------------------------------------------------------------------------
    def url(self, path, tls=False):
        if tls:
            return "https://127.0.0.1:%d%s" % (self.tls_port, path)
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def get(self, path, *curl_args, timeout=CURL_TIMEOUT):
        """GET path over HTTP/1.1 with curl."""
        return curl(self.url(path), *curl_args, timeout=timeout, workdir=self.workdir)

    def get_h2c(self, path, *curl_args, timeout=CURL_TIMEOUT):
        return curl(self.url(path), "--http2-prior-knowledge", *curl_args, timeout=timeout, workdir=self.workdir)

    def get_tls(self, path, *curl_args, h2=True, timeout=CURL_TIMEOUT):
        proto = ["--http2"] if h2 else ["--http1.1"]
        return curl(self.url(path, tls=True), "-k", *proto, *curl_args, timeout=timeout, workdir=self.workdir)

    def fastest_of(self, n, path, *curl_args):
        """The fastest of n sequential GETs (timing claims use the minimum, which load can only raise)."""
        runs = [self.get(path, *curl_args) for _ in range(n)]
        return min(runs, key=lambda r: r.time_total)

    # assertions --------------------------------------------------------------------------------
    def assertProblem(self, r, status):
        """r is an RFC 9457 problem answer with this status."""
        self.assertEqual(r.status, status, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("application/problem+json"), r)
        p = r.json()
        for k in ("type", "title", "status"):
            self.assertIn(k, p, r)
        self.assertEqual(p["status"], status, r)
        return p

    def assertLogClean(self):
        """The gateway log has no error lines."""
        errors = [l for l in self.gw.log().splitlines() if " error " in l]
        self.assertEqual(errors, [], "gateway log has errors")

    def log_errors(self):
        return [l for l in self.gw.log().splitlines() if " error " in l]


def write_scripts(sdir, scripts, gateway_source):
    os.makedirs(sdir, exist_ok=True)
    with open(os.path.join(sdir, "gateway.lua"), "w") as f:
        f.write(gateway_source)
    for rel, src in scripts.items():
        path = os.path.join(sdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(src)


def run_aggway(*args, timeout=120, cwd=None):
    """Runs the aggway binary (check, serve …) to completion, in folder cwd (default: this one);
    returns CompletedProcess. timeout (s) only guards against a hang: the commands need a few
    seconds of CPU, and a machine shared by several builds gives a process a fraction of a core."""
    return subprocess.run([AGGWAY_BIN] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, cwd=cwd)


def endpoint(route, body, deadline_ms=None):
    """Source of an endpoint script: route and the body of handler(req) (Lua)."""
    dl = "" if deadline_ms is None else "  deadline_ms = %d,\n" % deadline_ms
    return ('local agg = require "agg"\n'
            "return {\n"
            "  route = %s,\n%s"
            "  handler = function(req)\n%s\n  end,\n"
            "}\n") % (json.dumps(route), dl, body)


# The demo page with time to spare, for tests that compare the bytes of pages (across protocols,
# across I/O paths) and not what the gateway does with slow upstreams: every call and the page
# may take 10 s. The repository's page gives Reviews 100 ms, and beside two busy loops a call now
# and then took longer (a section unavailable, and after five such the breaker open), which says
# nothing about what those tests compare. A broken path still shows as a failed section, a wrong
# byte or no answer.
UNHURRIED_DEADLINE_MS = 10000
UNHURRIED_PAGE = {"product-page.lua": endpoint("GET /product-page/{id}", """
    local id = req.params.id
    local res = agg.fetch_all {
      product   = { "product", "/products/" .. id, required = true },
      reviews   = { "reviews", "/reviews/" .. id },
      inventory = { "inventory", "/stock/" .. id },
    }
    if res.product.ok then
      res.product.data.description = nil
    end
    return agg.page(res)""")}
UNHURRIED_UPSTREAMS = {name: {"timeout_ms": UNHURRIED_DEADLINE_MS, "connect_timeout_ms": UNHURRIED_DEADLINE_MS}
                       for name in ("product", "reviews", "inventory")}


def main():
    unittest.main(verbosity=2)
