"""Cluster-wide limits through Redis (issue 18): the store's script (gateway/limits/limit_redis.lua)
run by a real redis-server on a free loopback port, started and stopped by each test. Checks that
the script counts as the local store does (GCRA rates, fixed-window quotas), only accepted requests,
a request's rules all or none, keys that expire, and arguments it refuses; then the gateway's
`store = "redis"` rules: two gateways sharing one limit, a quota's reset, Redis killed, hung
(SIGSTOP) or lying for each on_redis_error, and clients that leave while their request waits."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import (AGGWAY_BIN, Gateway, GatewayTestCase, curl, free_port, gateway_lua, h2load,  # noqa: E402
                     wait_until, write_scripts)
from test_cache import Redis  # noqa: E402
from test_limits import OK, RATELIMIT_ITEM, SERVICES, rate_run_bounds, script  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "gateway", "limits", "limit_redis.lua")


class RedisError(Exception):
    pass


class Resp:
    """A blocking RESP2 client, enough for the tests' commands."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.sock.makefile("rb")

    def close(self):
        self.f.close()
        self.sock.close()

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self.read()

    def read(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise AssertionError("connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2].decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise AssertionError("not RESP: %r" % line)


def rate(rate_n, per_s, burst):
    t = max(1, per_s * 1000000 // rate_n)
    return ["r", t, t * burst]


def quota(n, end_ms):
    return ["q", n, end_ms]


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed (tools/bootstrap installs it)")
class LimitScript(GatewayTestCase):
    def setUp(self):
        super().setUp()
        self.redis = Redis(self.workdir).start()
        self.addCleanup(self.redis.stop)
        self.r = Resp(self.redis.port)
        self.addCleanup(self.r.close)
        with open(SCRIPT) as f:
            self.src = f.read()
        self.sha = self.r.call("SCRIPT", "LOAD", self.src)

    def check(self, now_ms, *rules):
        # the last argument, a number the reply gives back as its last element (the gateway's check
        # that a reply answers its own command)
        keys = [k for k, _ in rules]
        self.checks = getattr(self, "checks", 0) + 1
        args = [now_ms] + [a for _, spec in rules for a in spec] + [self.checks]
        reply = self.r.call("EVALSHA", self.sha, len(keys), *keys, *args)
        self.assertEqual(reply[-1], self.checks)
        self.assertEqual(len(reply), 2 + 3 * len(keys))
        return reply[0], [tuple(reply[1 + 3 * i:4 + 3 * i]) for i in range(len(keys))]

    def test_rate_is_gcra_as_the_local_store(self):
        # 10 per second, burst 3: three at once, then one each 100 ms.
        now = 1_764_600_000_000
        k = "agw:rl:{per-ip}:127.0.0.1"
        got = [self.check(now, (k, rate(10, 1, 3))) for _ in range(3)]
        self.assertEqual(got, [(1, [(1, 2, 100)]), (1, [(1, 1, 200)]), (1, [(1, 0, 300)])])
        self.assertEqual(self.check(now, (k, rate(10, 1, 3))), (0, [(0, 0, 100)]))
        self.assertEqual(self.check(now + 50, (k, rate(10, 1, 3))), (0, [(0, 0, 50)]))
        self.assertEqual(self.check(now + 100, (k, rate(10, 1, 3))), (1, [(1, 0, 300)]))
        ttl = self.r.call("PTTL", k)
        self.assertTrue(0 < ttl <= 1300, ttl)

    def test_quota_counts_in_its_window_and_resets_at_the_end(self):
        end = 1_764_633_600_000  # 2025-12-02T00:00Z
        now = end - 10_000
        k = "agw:rl:{daily}:app-1"
        for left in (1, 0):
            self.assertEqual(self.check(now, (k, quota(2, end))), (1, [(1, left, 10_000)]))
        self.assertEqual(self.check(now + 1, (k, quota(2, end))), (0, [(0, 0, 9_999)]))
        self.assertEqual(self.r.call("GET", k), "%d:2" % end)
        self.assertTrue(0 < self.r.call("PTTL", k) <= 11_000)
        # The next day's window starts from zero.
        self.assertEqual(self.check(end, (k, quota(2, end + 86_400_000))), (1, [(1, 1, 86_400_000)]))

    def test_a_refused_request_counts_under_none_of_its_rules(self):
        now = 1_764_600_000_000
        kr, kq = "agw:rl:{burst}:a", "agw:rl:{daily}:a"
        end = now + 3_600_000
        self.assertEqual(self.check(now, (kr, rate(100, 1, 5)), (kq, quota(1, end)))[0], 1)
        tat = self.r.call("GET", kr)
        allowed, results = self.check(now, (kr, rate(100, 1, 5)), (kq, quota(1, end)))
        self.assertEqual(allowed, 0)
        self.assertEqual(results[0][0], 1)  # the rate would accept...
        self.assertEqual(results[1][:2], (0, 0))  # ...the quota refuses
        self.assertEqual(self.r.call("GET", kr), tat)  # and the rate counted nothing
        self.assertEqual(self.r.call("GET", kq), "%d:1" % end)

    def test_large_times_keep_every_digit(self):
        now = 1_764_600_000_123
        k = "agw:rl:{r}:x"
        self.check(now, (k, rate(3, 1, 2)))
        self.assertEqual(int(self.r.call("GET", k)), now * 1000 + 333_333)

    def test_eval_runs_the_script_after_a_flush(self):
        self.r.call("SCRIPT", "FLUSH")
        with self.assertRaisesRegex(RedisError, "NOSCRIPT"):
            self.check(1_000, ("agw:rl:{r}:x", rate(1, 1, 1)))
        reply = self.r.call("EVAL", self.src, 1, "agw:rl:{r}:x", 1_000, *rate(1, 1, 1), 4242)
        self.assertEqual(reply, [1, 1, 0, 1000, 4242])

    def test_bad_arguments_are_an_error_reply(self):
        for args in ([1, "agw:rl:{r}:x", "now", "r", 1, 1, 7], [1, "agw:rl:{r}:x", 1, "r", 1, 7],
                     [1, "agw:rl:{r}:x", 1, "z", 1, 1, 7], [1, "agw:rl:{r}:x", 1, "r", 0, 1, 7],
                     [1, "agw:rl:{r}:x", 1, "r", 1, 1], [1, "agw:rl:{r}:x", 1, "r", 1, 1, "x"]):
            with self.assertRaisesRegex(RedisError, "agw limits"):
                self.r.call("EVALSHA", self.sha, *args)

    def test_the_gateways_commands_count_as_the_local_store(self):
        # gateway/tests/limits/test_limit_redis.c, given this Redis: the C side's command and reading
        # of the reply, step by step against the local store's verdicts.
        exe = os.path.join(os.path.dirname(AGGWAY_BIN), "test_limit_redis")
        self.assertTrue(os.path.exists(exe), exe + " is not built")
        p = subprocess.run([exe, str(self.redis.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60, text=True)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("ok   against_redis", p.stdout)


class Monitor:
    """Redis's MONITOR record, read on a thread: every command in the order Redis ran it, the
    commands a script ran ("lua") included."""

    LINE = re.compile(r'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
    ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def __init__(self, port):
        self.conn = Resp(port)
        self.conn.sock.settimeout(None)
        if self.conn.call("MONITOR") != "OK":
            raise AssertionError("MONITOR refused")
        self.lines, self.lock = [], threading.Lock()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        try:
            while True:
                line = self.conn.f.readline()
                if not line:
                    return
                with self.lock:
                    self.lines.append(line.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):
            return

    def close(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()

    def checks(self, key, want):
        """[(gateway time ms, TAT the check's SET wrote or None: refused)] of the limits script's
        calls on key, in Redis's order; None while fewer than want were seen."""
        with self.lock:
            lines = list(self.lines)
        out = []
        for line in lines:
            m = self.LINE.match(line)
            if not m:
                continue
            args = self.ARG.findall(m.group(3))
            if m.group(2) == "lua":
                if args[:2] == ["SET", key] and out:
                    out[-1] = (out[-1][0], int(args[2]))
            elif args and args[0].upper() in ("EVALSHA", "EVAL") and args[3:4] == [key]:
                out.append((int(args[4]), None))
        return out if len(out) >= want else None


class FakeRedis:
    """A TCP server on a free port that answers every RESP command with the same reply (reply
    bytes), so that the gateway's client becomes ready (SELECT gets +OK) and then reads garbage."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.conns = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self.answer, args=(c,), daemon=True).start()

    def answer(self, c):
        buf = b""
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    return
                buf += data
                # one reply per complete command (an array header "*N" starts each)
                while True:
                    n = count_command(buf)
                    if n == 0:
                        break
                    cmd, buf = buf[:n], buf[n:]
                    self.respond(c, cmd)
        except OSError:
            return

    def respond(self, c, cmd):
        # (reply: bytes, or a function of the command's arguments giving them)
        reply = self.reply(resp_args(cmd)) if callable(self.reply) else self.reply
        c.sendall(b"+OK\r\n" if b"SELECT" in cmd else reply)

    def stop(self):
        self.stopped = True
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def count_command(buf):
    """Bytes of the first complete RESP array command in buf, or 0."""
    if not buf.startswith(b"*"):
        return 0
    end = buf.find(b"\r\n")
    if end < 0:
        return 0
    n, pos = int(buf[1:end]), end + 2
    for _ in range(n):
        e = buf.find(b"\r\n", pos)
        if e < 0 or buf[pos:pos + 1] != b"$":
            return 0
        ln = int(buf[pos + 1:e])
        pos = e + 2 + ln + 2
        if pos > len(buf):
            return 0
    return pos


def resp_args(cmd):
    """The arguments of one complete RESP array command (bytes each)."""
    end = cmd.find(b"\r\n")
    n, pos, args = int(cmd[1:end]), end + 2, []
    for _ in range(n):
        e = cmd.find(b"\r\n", pos)
        ln = int(cmd[pos + 1:e])
        args.append(cmd[e + 2:e + 2 + ln])
        pos = e + 2 + ln + 2
    return args


class ShiftingRedis(FakeRedis):
    """A stand-in for the limits script that refuses keys holding "blocked" and accepts the others
    (rate 1 per s, burst 5), giving back each command's check; armed, it holds the reply to the next
    check of another key until a second check comes, then sends the held reply twice and the second's:
    the second command gets the first's reply, as from a Redis or a proxy that sent one reply twice."""

    def __init__(self):
        super().__init__(b"")
        self.armed = threading.Event()
        self.shifted = threading.Event()
        self.held = {}  # connection -> the reply held back

    @staticmethod
    def verdict(args):
        check = int(args[-1])
        if b"blocked" in args[3]:
            return b"*5\r\n:0\r\n:0\r\n:0\r\n:1000\r\n:%d\r\n" % check
        return b"*5\r\n:1\r\n:1\r\n:4\r\n:1000\r\n:%d\r\n" % check

    def respond(self, c, cmd):
        if b"SELECT" in cmd:
            c.sendall(b"+OK\r\n")
            return
        reply = self.verdict(resp_args(cmd))
        held = self.held.pop(c, None)
        if held is not None:
            c.sendall(held + held + reply)
            self.shifted.set()
        elif self.armed.is_set() and b"blocked" not in cmd:
            self.armed.clear()
            self.held[c] = reply
        else:
            c.sendall(reply)


class HeldRedis(ShiftingRedis):
    """The limits script's stand-in of ShiftingRedis (every key accepted), whose verdicts are held
    while hold is set, until release is set: a Redis that answers late."""

    def __init__(self):
        super().__init__()
        self.hold, self.release, self.sent = threading.Event(), threading.Event(), threading.Event()

    def respond(self, c, cmd):
        if b"SELECT" in cmd:
            c.sendall(b"+OK\r\n")
            return
        reply = self.verdict(resp_args(cmd))
        if self.hold.is_set():
            def late():
                self.release.wait(60)
                try:
                    c.sendall(reply)
                finally:
                    self.sent.set()
            threading.Thread(target=late, daemon=True).start()
            return
        c.sendall(reply)


def redis_rules(on_error="local", **rule):
    r = {"name": "shared", "key": "route", "rate": 1, "per_s": 600, "burst": 5, "store": "redis",
         "on_redis_error": on_error}
    r.update(rule)
    return [r]


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed (tools/bootstrap installs it)")
class RedisStore(GatewayTestCase):
    """Rules with store = "redis" on the real gateway."""

    def setUp(self):
        super().setUp()
        self.redis = Redis(self.workdir).start()
        self.addCleanup(self.redis.stop)
        self.admin_port = None

    def extra(self, rules, port=None, timeout_ms=200, headers=True):
        self.admin_port = free_port()
        return {"redis": {"url": "redis://127.0.0.1:%d/3" % (port or self.redis.port), "timeout_ms": timeout_ms},
                "limits": {"rules": rules, "headers": headers},
                "admin": {"port": self.admin_port}}

    def start_limited(self, rules, port=None, timeout_ms=200, workers=1):
        """Starts the gateway; with the test's Redis (port None), waits until /readyz says every worker
        has its Redis connection: a check made before that is decided by on_redis_error, never by
        Redis (a fake Redis on port never makes a connection ready: the test waits for what it needs)."""
        gw = self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK, limits=[r["name"] for r in rules])},
                        workers=workers, gateway_extra=self.extra(rules, port, timeout_ms))
        if port is None:
            self.wait_ready()
        return gw

    def readyz(self):
        r = curl("http://127.0.0.1:%d/readyz" % self.admin_port)
        return r.status, r.body.decode()

    def readyz_once_serving(self):
        """/readyz once the workers serve (before that it says "not ready" whatever Redis does)."""
        got = wait_until(lambda: (lambda r: r if r[1] != "not ready\n" else None)(self.readyz()), 30)
        self.assertIsNotNone(got, self.gw.log())
        return got

    def wait_ready(self):
        self.assertTrue(wait_until(lambda: self.readyz()[0] == 200, 30), (self.readyz(), self.gw.log()))

    def second_gateway(self):
        """Another gateway process on the same scripts folder's settings (and the same Redis)."""
        d = os.path.join(self.workdir, "second")
        os.makedirs(d)
        sdir = os.path.join(d, "scripts")
        os.makedirs(sdir)
        for name in os.listdir(self.scripts_dir):
            with open(os.path.join(self.scripts_dir, name)) as f:
                src = f.read()
            if name == "gateway.lua":
                port, admin_port = free_port(), free_port()
                src = re.sub(r"port = %d" % self.port, "port = %d" % port, src, count=1)
                src = re.sub(r"port = %d" % self.admin_port, "port = %d" % admin_port, src)
            with open(os.path.join(sdir, name), "w") as f:
                f.write(src)
        gw = Gateway(sdir, port)
        gw.admin_port = admin_port
        self.addCleanup(gw.stop)
        self.assertTrue(gw.start(), gw.log())
        return gw

    def wait_redis_connected(self, *admin_ports, rule="shared"):
        """Waits until every worker of each gateway has its Redis connection ready (/limits): a
        check made before that is decided by on_redis_error (no connection yet), never by Redis."""
        def ready(port):
            page = json.loads(curl("http://127.0.0.1:%d/limits?rule=%s&key=x" % (port, rule)).body)
            return page["redis"]["workers_connected"] == page["redis"]["workers"]
        for port in admin_ports:
            self.assertTrue(wait_until(lambda: ready(port), 30), "Redis not connected on admin port %d" % port)

    def metrics(self):
        return curl("http://127.0.0.1:%d/metrics" % self.admin_port).body.decode()

    def redis_errors(self, rule="shared"):
        m = re.search(r'^aggway_limit_errors_total\{rule="%s",cause="redis"\} (\d+)' % rule, self.metrics(), re.M)
        return int(m.group(1)) if m else None

    def test_two_gateways_share_one_limit_n_in_total_not_2n(self):
        self.start_limited(redis_rules(burst=10))
        second = self.second_gateway()
        self.wait_redis_connected(self.admin_port, second.admin_port)
        statuses = []
        for i in range(30):
            port = self.port if i % 2 == 0 else second.port
            statuses.append(curl("http://127.0.0.1:%d/a" % port).status)
        self.assertEqual(statuses.count(200), 10, statuses)
        self.assertEqual(statuses.count(429), 20, statuses)
        self.assertEqual(statuses[:10], [200] * 10)
        # the answers are Redis's: the remaining count went down across both gateways
        r = curl("http://127.0.0.1:%d/a" % second.port)
        self.assertEqual(r.status, 429)
        self.assertEqual(r.headers["ratelimit-policy"], '"shared";q=10;w=6000')
        m = RATELIMIT_ITEM.match(r.headers["ratelimit"])
        self.assertEqual(int(m.group(2)), 0)
        self.assertGreaterEqual(int(r.headers["retry-after"]), 590)
        self.assertEqual(self.redis_errors(), 0)
        self.assertNotIn("did not answer", self.gw.log())

    def test_two_gateways_under_load_accept_the_rate_within_5_percent(self):
        rate = 50
        self.start_limited(redis_rules(rate=rate, per_s=1, burst=10))
        second = self.second_gateway()
        self.wait_redis_connected(self.admin_port, second.admin_port)
        answers, lock, stop = [], threading.Lock(), time.monotonic() + 3.0   # (sent, received, status)

        def client(port):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            while time.monotonic() < stop:
                sent = time.monotonic()
                conn.request("GET", "/a")
                resp = conn.getresponse()
                resp.read()
                with lock:
                    answers.append((sent, time.monotonic(), resp.status))
            conn.close()

        threads = [threading.Thread(target=client, args=(p,)) for p in (self.port, second.port) * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        answers.sort(key=lambda a: a[1])
        self.assertEqual({a[2] for a in answers} - {200, 429}, set())
        self.assertGreater(len(answers), rate * 3 * 1.3, "the clients must offer more than the limit")
        # burst + rate x the time from the first request sent to the last answer, for both gateways
        # together (two gateways each counting alone would accept about twice that), less the
        # tokens GCRA gives up while the clients left it idle (a stall longer than a bucket's
        # refill: rate_run_bounds), within 5 % (the ends are off by one round trip)
        span = answers[-1][1] - answers[0][0]
        low, high, idle_s = rate_run_bounds(answers, rate, 10)
        accepted = sum(1 for a in answers if a[2] == 200)
        if os.environ.get("AGGWAY_VERBOSE"):
            print("accepted %d of %d over %.2f s (%.2f s idle), expected %.0f to %.0f"
                  % (accepted, len(answers), span, idle_s, low, high))
        self.assertGreaterEqual(accepted, low - high * 0.05, "%d accepted over %.2f s (%.2f s of it idle), "
                                "at least %.0f expected" % (accepted, span, idle_s, low))
        self.assertLessEqual(accepted, high * 1.05, "%d accepted over %.2f s, at most %.0f expected"
                             % (accepted, span, high))

    def test_two_gateways_under_load_each_second_between_refusals_within_the_bound(self):
        # Windows are measured by Redis's own record of the checks (MONITOR: each script call with
        # the gateway's time, in Redis's order, and the SET of the key that an accepted check makes),
        # not by the clients' clocks: a busy machine delays answers but cannot move that record.
        rate, burst = 50, 10
        t_ms = 1000 / rate
        r = Resp(self.redis.port)
        with open(SCRIPT) as f:
            r.call("SCRIPT", "LOAD", f.read())                 # no NOSCRIPT round in the record
        r.close()
        monitor = Monitor(self.redis.port)
        self.addCleanup(monitor.close)
        self.start_limited(redis_rules(rate=rate, per_s=1, burst=burst), timeout_ms=3000)
        second = self.second_gateway()
        self.wait_redis_connected(self.admin_port, second.admin_port)
        statuses, lock, stop = [], threading.Lock(), time.monotonic() + 4.0

        def client(port):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            while time.monotonic() < stop:
                conn.request("GET", "/a")
                resp = conn.getresponse()
                resp.read()
                with lock:
                    statuses.append(resp.status)
            conn.close()

        threads = [threading.Thread(target=client, args=(p,)) for p in (self.port, second.port) * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(set(statuses) - {200, 429}, set())
        key = "agw:rl:{shared}:GET /a"
        events = wait_until(lambda: monitor.checks(key, len(statuses)), 10)
        self.assertIsNotNone(events, "MONITOR saw %d checks of %d" % (len(monitor.checks(key, 0)), len(statuses)))
        # Redis's record is what the clients got: one check per request, one SET per 200
        self.assertEqual(len(events), len(statuses))
        self.assertEqual(sum(1 for e in events if e[1] is not None), statuses.count(200))
        self.assertGreater(len(statuses), rate * 4 * 1.3, "the clients must offer more than the limit")
        # Every one-second window of the gateways' time, whatever the load: at most burst + rate.
        accepted_at = sorted(e[0] for e in events if e[1] is not None)
        for i, a in enumerate(accepted_at):
            n = sum(1 for b in accepted_at[i:] if b < a + 1000)
            self.assertLessEqual(n, burst + rate, "%d accepted in the second from %d" % (n, a))
        # From one refusal (the bucket empty) to the first refusal at least a second later, with the
        # key's TAT advancing by exactly one interval per acceptance in between (the bucket never
        # filled: the offered load stayed over the limit; else the window is not judged), the count
        # is rate x the time between them within 1, plus rate x the lag of a refusal's timestamp
        # behind the latest one Redis had seen before it (two gateways' loop clocks).
        latest, lag = 0, []
        for now, _ in events:
            lag.append(max(0, latest - now))
            latest = max(latest, now)
        refusals = [i for i, e in enumerate(events) if e[1] is None]
        sets = [e[1] for e in events if e[1] is not None]
        before = [0]                                          # SETs among events[:i]
        for e in events:
            before.append(before[-1] + (e[1] is not None))
        jumps = [0, 0]                                        # TATs not one interval past the last, among sets[:k]
        for a, b in zip(sets, sets[1:]):
            jumps.append(jumps[-1] + (b - a != t_ms * 1000))
        judged, worst = 0, 0.0
        for k, i in enumerate(refusals):
            j = next((j for j in refusals[k + 1:] if events[j][0] - events[i][0] >= 1000), None)
            if j is None:
                break
            first, last = before[i], before[j]                # sets[first:last]: accepted between them
            if first == 0 or jumps[last] != jumps[first]:
                continue
            n = last - first
            expect = (events[j][0] - events[i][0]) / t_ms
            bound = 1 + max(lag[i], lag[j]) / t_ms
            judged += 1
            worst = max(worst, abs(n - expect) / expect)
            self.assertLess(abs(n - expect), bound, "%d accepted between refusals %d ms apart, expected %.1f +- %.2f"
                            % (n, events[j][0] - events[i][0], expect, bound))
        if os.environ.get("AGGWAY_VERBOSE"):
            print("checks %d, accepted %d, windows judged %d, worst %.1f %%, largest lag %d ms"
                  % (len(events), statuses.count(200), judged, worst * 100, max(lag)))
        self.assertGreater(judged, 0, "no second of the run kept the limit saturated")

    def test_quota_in_redis_resets_at_utc_midnight_as_the_headers_say(self):
        self.start_limited([{"name": "daily", "key": {"header": "x-client"}, "quota": 3, "window": "day",
                             "store": "redis"}])
        for left in (2, 1, 0):
            r = self.get("/a", "-H", "X-Client: alice")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.headers["ratelimit-policy"], '"daily";q=3;w=86400')
            self.assertEqual(int(RATELIMIT_ITEM.match(r.headers["ratelimit"]).group(2)), left)
        before = time.time()
        r = self.get("/a", "-H", "X-Client: alice")
        after = time.time()
        p = self.assertProblem(r, 429)
        self.assertEqual(p["violated-policies"], ["daily"])
        midnight = (int(before) // 86400 + 1) * 86400
        retry = int(r.headers["retry-after"])
        self.assertGreaterEqual(retry, midnight - after)
        self.assertLessEqual(retry, midnight - before + 1)
        self.assertEqual(int(RATELIMIT_ITEM.match(r.headers["ratelimit"]).group(3)), retry)
        self.assertEqual(self.get("/a", "-H", "X-Client: bob").status, 200)
        # the count is Redis's, under the documented key, expiring at the window's end
        key = "agw:rl:{daily}:alice"
        out = subprocess.run(["redis-cli", "-p", str(self.redis.port), "-n", "3", "GET", key],
                             stdout=subprocess.PIPE, text=True, timeout=10).stdout.strip()
        self.assertEqual(out, "%d:3" % (midnight * 1000))

    def kill_mid_run(self, on_error):
        self.start_limited(redis_rules(on_error, burst=3))
        self.assertEqual([self.get("/a").status for _ in range(2)], [200, 200])
        self.redis.stop()
        statuses = [self.get("/a").status for _ in range(5)]
        log = self.gw.log()
        self.assertEqual(log.count("limits: Redis did not answer a check"), 1, log)
        self.assertEqual(self.redis_errors(), 5)
        return statuses

    def test_redis_killed_mid_run_local_counts_in_the_process(self):
        statuses = self.kill_mid_run("local")
        # the process's store counts the rule from nothing: its burst of 3, then 429
        self.assertEqual(statuses, [200, 200, 200, 429, 429])
        # Redis back on the same port: checks go to it again (its count: 2 taken, one left)
        self.restart_redis()
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200, 30))
        self.assertTrue(wait_until(lambda: "limits: Redis answers checks again" in self.gw.log(), 10), self.gw.log())
        self.assertEqual([self.get("/a").status for _ in range(3)], [200, 200, 429])  # a fresh Redis: 3 again, 1 taken

    def admin(self, path):
        return json.loads(curl("http://127.0.0.1:%d%s" % (self.admin_port, path)).body)

    def restart_redis(self):
        self.redis.proc = subprocess.Popen(["redis-server", "--port", str(self.redis.port), "--bind", "127.0.0.1",
                                            "--save", "", "--appendonly", "no", "--dir", self.workdir],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def test_admin_page_shows_redis_answers_and_health_never_a_local_count(self):
        self.start_limited(redis_rules(burst=5))
        page = self.admin("/limits?rule=shared&key=GET+/a")
        self.assertEqual((page["store"], page["kind"], page["limit"], page["on_redis_error"]), ("redis", "rate", 5, "local"))
        self.assertIsNone(page["last_answer"])                  # nothing asked of Redis for the key yet
        self.assertNotIn("remaining", page)                     # no count of this process's
        self.assertEqual(self.get("/a").status, 200)
        self.assertEqual(self.get("/a").status, 200)
        page = self.admin("/limits?rule=shared&key=GET+/a")
        last = page["last_answer"]
        self.assertEqual((last["allowed"], last["remaining"]), (True, 3))
        self.assertLessEqual(last["at_ms"], time.time() * 1000 + 1)
        self.assertGreater(last["reset_at_ms"], last["at_ms"])
        self.assertEqual(page["redis"], {"answering": True, "workers_connected": 1, "workers": 1, "workers_failing": 0,
                                         "outage_since_ms": None, "outage_fallbacks": 0, "fallbacks_total": 0,
                                         "outages": 0})
        self.assertNotIn("process_fallback_count", page)
        # another gateway counts in the same Redis: this page keeps what Redis last told this process,
        # and says when; the next answer shows the cluster's count
        second = self.second_gateway()
        self.wait_redis_connected(second.admin_port)
        self.assertEqual(curl("http://127.0.0.1:%d/a" % second.port).status, 200)
        self.assertEqual(self.admin("/limits?rule=shared&key=GET+/a")["last_answer"]["remaining"], 3)
        self.assertEqual(self.get("/a").status, 200)
        self.assertEqual(self.admin("/limits?rule=shared&key=GET+/a")["last_answer"]["remaining"], 1)
        self.assertIsNone(self.admin("/limits?rule=shared&key=GET+/b")["last_answer"])
        # Redis killed: the page says so, since when, what fell back, and the process's own count
        # during the outage under its own name
        before = time.time() * 1000
        self.redis.stop()
        self.assertEqual(self.get("/a").status, 200)
        page = self.admin("/limits?rule=shared&key=GET+/a")
        self.assertFalse(page["redis"]["answering"])
        self.assertEqual((page["redis"]["workers_failing"], page["redis"]["outage_fallbacks"],
                          page["redis"]["fallbacks_total"], page["redis"]["outages"]), (1, 1, 1, 1))
        self.assertGreaterEqual(page["redis"]["outage_since_ms"], before - 1000)
        self.assertEqual(page["redis"]["workers_connected"], 0)
        self.assertEqual(page["process_fallback_count"]["remaining"], 4)
        self.assertEqual(page["last_answer"]["remaining"], 1)   # still Redis's last word, not the fallback's
        self.restart_redis()
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200 and
                                   self.admin("/limits?rule=shared&key=GET+/a")["redis"]["answering"], 30))
        page = self.admin("/limits?rule=shared&key=GET+/a")
        self.assertEqual((page["redis"]["outage_since_ms"], page["redis"]["outages"]), (None, 1))
        self.assertNotIn("process_fallback_count", page)
        self.assertEqual(page["last_answer"]["remaining"], 4)  # a fresh Redis: 5, one taken

    def test_outage_is_logged_once_per_process_with_two_workers(self):
        self.start_limited(redis_rules("allow", burst=1000), workers=2)
        self.assertEqual(self.get("/a").status, 200)
        self.redis.stop()
        # until both workers failed a check (new connections spread over the workers)
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200 and
                                   self.admin("/limits?rule=shared&key=x")["redis"]["workers_failing"] == 2, 60),
                        self.admin("/limits?rule=shared&key=x"))
        self.restart_redis()
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200 and
                                   self.admin("/limits?rule=shared&key=x")["redis"]["answering"], 60),
                        self.admin("/limits?rule=shared&key=x"))
        for _ in range(10):
            self.assertEqual(self.get("/a").status, 200)
        log = self.gw.log()
        self.assertEqual(log.count("limits: Redis did not answer a check"), 1, log)
        self.assertEqual(log.count("limits: Redis answers checks again"), 1, log)
        page = self.admin("/limits?rule=shared&key=x")
        self.assertEqual((page["redis"]["outages"], page["redis"]["workers_failing"]), (1, 0))
        m = re.search(r"again after [\d.]+ s; (\d+) checks were decided", log)
        self.assertEqual(int(m.group(1)), page["redis"]["fallbacks_total"])
        self.assertGreaterEqual(int(m.group(1)), 2)

    def test_redis_killed_mid_run_allow_lets_everything_through(self):
        self.assertEqual(self.kill_mid_run("allow"), [200] * 5)

    def test_redis_killed_mid_run_deny_answers_503(self):
        statuses = self.kill_mid_run("deny")
        self.assertEqual(statuses, [503] * 5)
        r = self.get("/a")
        p = self.assertProblem(r, 503)
        self.assertEqual(p["type"], "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity")
        self.assertIn("on_redis_error", p["detail"])
        self.assertEqual(r.headers["retry-after"], "1")

    def hung(self, mode, want):
        self.start_limited(redis_rules(mode, burst=100), timeout_ms=100)
        self.assertEqual(self.get("/a").status, 200)
        self.redis.proc.send_signal(signal.SIGSTOP)
        try:
            for _ in range(3):
                t0 = time.monotonic()
                r = self.get("/a")
                took = time.monotonic() - t0
                self.assertEqual(r.status, want, r)
                # a 100 ms command timeout, not curl's: generous for a busy machine
                self.assertLess(took, 3.0)
        finally:
            self.redis.proc.send_signal(signal.SIGCONT)
        self.assertGreaterEqual(self.redis_errors(), 3)
        self.assertIn("timeout", self.gw.log())

    def test_the_wait_for_redis_counts_in_the_deadline(self):
        # a page whose deadline the wait used up starts no call: its section fails at once as
        # deadline-exceeded (before, the deadline began when the script did and the call was made)
        rules = redis_rules("allow", burst=100)
        page = ('local agg = require "agg"\nreturn {\n  route = "GET /d",\n  deadline_ms = 1000,\n'
                '  limits = { "shared" },\n  handler = function(req)\n'
                '    local r = agg.fetch_all { s = { "slow", "/slow" } }\n'
                '    return { status = 200, json = { s = r.s.ok and "ok" or r.s.error.type } }\n  end,\n}\n')
        self.start(services=SERVICES, scripts={"d.lua": page}, gateway_extra=self.extra(rules, None, 8000))
        self.wait_ready()
        self.assertEqual(self.get("/d").json(), {"s": "ok"})
        self.redis.proc.send_signal(signal.SIGSTOP)
        try:
            # parked until the page's 1,000 ms deadline, not the command's 8,000 ms timeout, then
            # allowed (on_redis_error "allow"): the deadline was all it had
            t0 = time.monotonic()
            r = self.get("/d")
            took = time.monotonic() - t0
        finally:
            self.redis.proc.send_signal(signal.SIGCONT)
        self.assertEqual(r.json(), {"s": "urn:aggway:problem:deadline-exceeded"}, r)
        self.assertLess(took, 6.0)  # the command's timeout would be 8 s at least, however busy the machine
        self.assertIn("no answer within the endpoint's deadline", self.gw.log())

    def test_hung_redis_deny_costs_at_most_the_command_timeout(self):
        self.hung("deny", 503)

    def test_hung_redis_allow_costs_at_most_the_command_timeout(self):
        self.hung("allow", 200)

    def garbage(self, reply, mode, want, says="an answer that is not the limits script's"):
        fake = FakeRedis(reply)
        self.addCleanup(fake.stop)
        self.start_limited(redis_rules(mode, burst=2), port=fake.port)
        self.assertTrue(wait_until(lambda: self.get("/a").status == want, 10), self.gw.log())
        self.assertEqual(self.get("/a").status, want)
        self.assertIn(says, self.gw.log())
        self.assertGreaterEqual(self.redis_errors(), 2)

    def test_redis_answering_ok_to_the_script_is_an_error_not_a_verdict(self):
        self.garbage(b"+OK\r\n", "deny", 503)

    def test_redis_answering_an_integer_falls_back_to_the_local_store(self):
        self.garbage(b":7\r\n", "local", 200)

    def test_redis_answering_remaining_over_the_limit_is_an_error(self):
        # the command's own reply (its check number given back), with more remaining than the rule's
        # burst of 2: no answer, and no drop (only another command's reply drops the connection)
        self.garbage(lambda args: b"*5\r\n:1\r\n:1\r\n:99\r\n:5\r\n:%d\r\n" % int(args[-1]), "deny", 503,
                     says="a verdict its rules do not allow")
        self.assertNotIn("another command's reply", self.gw.log())

    def test_a_reply_shifted_onto_another_check_lets_no_request_through(self):
        # (an attack review: a Redis or a proxy that sent one reply twice while checks waited gave each
        # later check the reply of the one before it: a client its rule refuses got through on another
        # client's verdict, and the replies stayed shifted for seconds.) The script gives back each
        # command's check: a reply without it is no answer (on_redis_error decides: deny here), and the
        # connection is dropped and made again.
        fake = ShiftingRedis()
        self.addCleanup(fake.stop)
        rules = [{"name": "per-client", "key": {"header": "x-client"}, "rate": 1, "per_s": 1, "burst": 5,
                  "store": "redis", "on_redis_error": "deny"}]
        # (the held check waits for the next one: its wait is bounded by the endpoint's deadline and the
        # command's timeout, each far above what a loaded machine takes to send the next request)
        self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK, limits=["per-client"])},
                   deadline_ms=30000, gateway_extra=self.extra(rules, fake.port, timeout_ms=10000))
        self.wait_ready()
        self.assertEqual(self.get("/a", "-H", "x-client: good").status, 200)
        self.assertEqual(self.get("/a", "-H", "x-client: blocked").status, 429)
        fake.armed.set()
        good = {}
        t = threading.Thread(target=lambda: good.update(r=self.get("/a", "-H", "x-client: good")))
        t.start()  # its check's reply is held by the fake until the next check comes
        self.assertTrue(wait_until(lambda: not fake.armed.is_set(), 10))
        blocked = self.get("/a", "-H", "x-client: blocked")
        t.join(30)
        self.assertTrue(fake.shifted.is_set())
        self.assertEqual(good["r"].status, 200)
        self.assertEqual(blocked.status, 503, blocked)  # never 200: the good client's reply was not its own
        self.assertIn("Redis answered a limits check with another command's reply", self.gw.log())
        # the connection made again answers as before
        self.assertTrue(wait_until(lambda: self.get("/a", "-H", "x-client: blocked").status == 429, 10), self.gw.log())
        self.assertEqual(self.get("/a", "-H", "x-client: good").status, 200)

    def test_a_late_reply_after_its_request_ended_and_a_reload_reads_nothing_of_the_old_rules(self):
        # (an attack review: a check whose request stopped waiting, at its deadline or when its client
        # left, kept pointers to its generation's rules without holding the generation; a reload freed
        # them, and the late reply read them: the ASan build reported a heap-use-after-free and died,
        # the optimized build read freed memory into /limits and the outage log)
        fake = HeldRedis()
        self.addCleanup(fake.stop)
        rules = redis_rules("local", burst=100)
        self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK, limits=["shared"])}, deadline_ms=300,
                   gateway_extra=self.extra(rules, fake.port, timeout_ms=10000))
        self.wait_ready()
        self.assertEqual(self.get("/a").status, 200)
        fake.hold.set()
        # parked until its 300 ms deadline, then decided by on_redis_error (local): its check's reply
        # is still to come
        self.assertEqual(self.get("/a").status, 200)
        # a reload retires the generation whose rules the check named (the request has ended)
        path = os.path.join(self.scripts_dir, "gateway.lua")
        with open(path) as f:
            src = f.read()
        with open(path + ".tmp~", "w") as f:
            f.write(src.replace("per_s = 600", "per_s = 601"))
        os.replace(path + ".tmp~", path)
        self.gw.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_until(lambda: "generation 2 serves new requests" in self.gw.log(), 30), self.gw.log())
        fake.hold.clear()
        fake.release.set()
        self.assertTrue(fake.sent.wait(30))
        # the reply read, the gateway goes on (the cleanup fails the test on a sanitizer report)
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200, 10), self.gw.log())
        self.assertIsNone(self.gw.proc.poll())

    def test_a_refusal_counted_by_a_clock_ahead_is_a_refusal_not_an_error(self):
        # A bucket whose theoretical arrival time another gateway's clock put ahead of this one's (or
        # another worker's loop time, or the rule's looser numbers before a reload) gives a reset
        # beyond what the rule allows by this clock. It is cut to that, and Redis's refusal stands: a
        # 429, never taken for a lie (an attack review: each such refusal was a 503 and dropped the
        # connection, failing the other clients' checks in flight with it).
        rules = [{"name": "per-client", "key": {"header": "x-client"}, "rate": 200, "per_s": 1, "burst": 1,
                  "store": "redis", "on_redis_error": "deny"}]
        self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK, limits=["per-client"])},
                   gateway_extra=self.extra(rules, timeout_ms=2000))
        self.wait_ready()
        self.assertEqual(self.get("/a", "-H", "x-client: ahead").status, 200)
        r = Resp(self.redis.port)
        self.addCleanup(r.close)
        r.call("SELECT", 3)
        keys = [k for k in r.call("KEYS", "agw:rl:{per-client}:*") if "ahead" in k]
        self.assertEqual(len(keys), 1, keys)
        r.call("SET", keys[0], (int(time.time() * 1000) + 120000) * 1000, "PX", 300000)  # 2 minutes ahead
        got = self.get("/a", "-H", "x-client: ahead")
        self.assertEqual(got.status, 429, got)
        self.assertEqual(self.get("/a", "-H", "x-client: other").status, 200)
        self.assertNotIn("another command's reply", self.gw.log())
        self.assertNotIn("an answer that is not the limits script's", self.gw.log())
        self.assertNotIn("a verdict its rules do not allow", self.gw.log())

    def test_decisions_in_the_access_log_and_the_waterfall(self):
        log_path = os.path.join(self.workdir, "access.log")
        rules = redis_rules(burst=2) + [{"name": "per-ip", "key": "ip", "rate": 1, "per_s": 600, "burst": 50}]
        ex = self.extra(rules)
        ex["access_log"] = log_path
        self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK, limits=["shared", "per-ip"])},
                   gateway_extra=ex)
        self.wait_ready()
        self.assertEqual([self.get("/a").status for _ in range(3)], [200, 200, 429])

        def lines():
            if not os.path.exists(log_path):
                return None
            with open(log_path) as f:
                got = [json.loads(l) for l in f if '"/a"' in l]
            return got if len(got) >= 3 else None
        got = wait_until(lines, 10)
        self.assertIsNotNone(got)
        first, second, refused = got[:3]
        self.assertEqual(first["limit"]["rule"], "shared")   # the most restrictive: 1 left of 2
        self.assertEqual((first["limit"]["outcome"], first["limit"]["remaining"], first["limit"]["store"]),
                         ("allowed", 1, "redis"))
        self.assertEqual(second["limit"]["remaining"], 0)
        self.assertEqual((refused["status"], refused["limit"]["outcome"], refused["limit"]["rule"]),
                         (429, "limited", "shared"))
        self.assertIsInstance(first["limit"]["wait_ms"], float)
        # the waterfall of an accepted request says which rule decided, and what is left
        wf = json.loads(curl("http://127.0.0.1:%d/waterfall.json" % self.admin_port).body)
        mine = [r for r in wf["requests"] if r["request"] == "GET /a"]
        self.assertEqual(len(mine), 2, wf)
        self.assertEqual(sorted(r["limit"]["remaining"] for r in mine), [0, 1])
        self.assertTrue(all(r["limit"]["rule"] == "shared" and r["limit"]["store"] == "redis" for r in mine))
        html = curl("http://127.0.0.1:%d/waterfall" % self.admin_port).body.decode()
        self.assertIn("limit shared: 0 left (redis", html)

    def start_keyed(self, redis_port=None, burst=3, timeout_ms=200, rules=None):
        """GET /a behind auth = "api_key" (one key, "k-good") with a Redis rule keyed by the client's
        address: 1 per 600 s, a burst of 3 (or rules); its access log is self.alog."""
        import hashlib
        kfile = os.path.join(self.workdir, "api-keys.json")
        with open(kfile, "w") as f:
            json.dump([{"sha256": hashlib.sha256(b"k-good").hexdigest(), "app": "shop", "plan": "free"}], f)
        rules = rules or redis_rules(key="ip", burst=burst)
        ex = self.extra(rules, port=redis_port, timeout_ms=timeout_ms)
        ex["auth"] = {"api_keys": {"file": kfile}}
        self.alog = os.path.join(self.workdir, "access.log")
        ex["access_log"] = self.alog
        src = script("GET /a", OK, limits=[r["name"] for r in rules]).replace("  route =", '  auth = "api_key",\n  route =')
        b = script("GET /b", OK, limits=[rules[-1]["name"]]).replace("  route =", '  auth = "none",\n  route =')
        scripts = {"a.lua": src, "b.lua": b}  # (GET /b: no auth, the last rule)
        self.start(services=SERVICES, scripts=scripts, gateway_extra=ex)

    def alog_lines(self, n):
        def lines():
            if not os.path.exists(self.alog):
                return None
            with open(self.alog) as f:
                got = [json.loads(l) for l in f if '"/a"' in l]
            return got if len(got) >= n else None
        got = wait_until(lines, 10)
        self.assertIsNotNone(got)
        return got

    def test_refused_credentials_spend_the_address_count_in_redis_then_are_not_checked(self):
        # a flood of guessed keys multiplexed on one HTTP/2 connection: each refusal is counted in
        # Redis and in the process's shadow of the rule, which refuses the rest before their key
        # is looked at: exactly the burst's three keys are checked, whatever Redis's replies' timing
        self.start_keyed()
        self.wait_ready()
        res = h2load("http://127.0.0.1:%d/a" % self.port, "-n", "300", "-c", "1", "-m", "100",
                     "-H", "X-API-Key: guess")
        self.assertEqual(res.get("4xx"), 300, res["output"])
        self.assertTrue(wait_until(lambda: self.gw.log().count("refused with 401") >= 3, 10), self.gw.log())
        self.assertEqual(self.gw.log().count("refused with 401"), 3, self.gw.log())
        r = self.get("/a", "-H", "X-API-Key: k-good")   # the address's good key too
        self.assertEqual(r.status, 429, r)
        self.assertEqual(json.loads(r.body)["violated-policies"], ["shared"])
        self.assertEqual(r.headers["retry-after"], "600")   # the next one fits in 600 s (not 1,800: full)
        last = self.alog_lines(301)[-1]
        self.assertEqual((last["status"], last["limit"]["rule"], last["limit"]["store"]), (429, "shared", "shadow"))
        # /limits shows the shadow beside Redis's answers: why the address is refused before the edge
        shadow = self.admin("/limits?rule=shared&key=127.0.0.1")["shadow"]
        self.assertEqual(shadow["remaining"], 0)
        self.assertGreater(shadow["reset_ms"], 590000)
        # Redis counted them: another gateway on the same Redis refuses the address at once
        second = self.second_gateway()
        self.assertTrue(wait_until(lambda: curl("http://127.0.0.1:%d/readyz" % second.admin_port).status == 200, 30))
        self.assertEqual(curl("http://127.0.0.1:%d/a" % second.port, "-H", "X-API-Key: k-good").status, 429)
        self.assertEqual(self.redis_errors(), 0)
        self.assertNotIn("did not answer", self.gw.log())

    def test_commands_counting_refusals_in_flight_are_bounded(self):
        # a Redis that never answers and a rule whose burst lets 400 refusals through: a worker
        # sends at most 256 commands counting them (AGW_LIMIT_CHARGES_MAX), the rest wait for none
        evals = []
        fake = FakeRedis(lambda args: (evals.append(1) if args[0].upper() in (b"EVALSHA", b"EVAL") else None,
                                       b"" if args[0].upper() in (b"EVALSHA", b"EVAL") else b"+PONG\r\n")[1])
        self.addCleanup(fake.stop)
        self.start_keyed(redis_port=fake.port, burst=1000, timeout_ms=10000)
        self.wait_ready()
        res = h2load("http://127.0.0.1:%d/a" % self.port, "-n", "400", "-c", "4", "-m", "50",
                     "-H", "X-API-Key: guess")
        self.assertEqual(res.get("4xx"), 400, res["output"])
        self.assertEqual(self.gw.log().count("refused with 401"), 400)
        self.assertTrue(wait_until(lambda: len(evals) >= 256, 10), len(evals))
        time.sleep(0.3)  # (a command beyond the bound would have been sent with its request)
        self.assertEqual(len(evals), 256)

    def test_accepted_requests_counted_during_an_outage_refuse_nothing_before_the_edge(self):
        # on_redis_error = "local" counts accepted requests in the process's store during an
        # outage; the shadow of refused attempts is a count of its own, so once Redis is back the
        # address is Redis's to judge (the review of this change: 429 for 594 s, Redis holding no key)
        self.start_keyed()
        self.wait_ready()
        self.redis.stop()
        self.assertEqual([self.get("/a", "-H", "X-API-Key: k-good").status for _ in range(3)], [200] * 3)
        self.restart_redis()
        self.wait_ready()
        self.assertTrue(wait_until(lambda: self.get("/a", "-H", "X-API-Key: k-good").status == 200 and
                                   "limits: Redis answers checks again" in self.gw.log(), 30), self.gw.log())

    def test_each_redis_rule_counts_a_refusal_on_its_own(self):
        # two Redis rules of the address: one spent by an accepted request, the other still has room;
        # a refused key is counted by the second though the first refuses it (one command a rule)
        rules = [dict(redis_rules(key="ip", burst=1)[0], name="tight"), dict(redis_rules(key="ip", burst=3)[0], name="wide")]
        self.start_keyed(rules=rules)
        self.wait_ready()
        self.assertEqual(self.get("/a", "-H", "X-API-Key: k-good").status, 200)   # tight: 0 left, wide: 2
        self.assertEqual(self.get("/a", "-H", "X-API-Key: guess").status, 401)   # wide: 1 left
        # (the charge's command went out before /b's check on the worker's one Redis connection,
        # and Redis runs a connection's commands in order: nothing to wait for)
        r = self.get("/b")   # wide alone, on an endpoint without auth: the charge spent one of its three
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers["ratelimit"].split(";")[:2], ['"wide"', "r=0"], r.headers)

    def test_refused_credentials_are_counted_while_redis_is_down(self):
        # no Redis to count them: the process's shadow of the rule still does
        self.redis.stop()
        self.start_keyed(redis_port=self.redis.port)
        self.assertEqual([self.get("/a", "-H", "X-API-Key: guess-%d" % i).status for i in range(5)],
                         [401, 401, 401, 429, 429])
        self.assertEqual(self.gw.log().count("refused with 401"), 3, self.gw.log())

    def test_readyz_is_503_until_every_worker_has_its_redis_connection_then_stays_200(self):
        self.redis.stop()  # not there yet when the gateway starts
        self.start_limited(redis_rules("allow", burst=1000), port=self.redis.port, workers=2)
        status, body = self.readyz_once_serving()
        self.assertEqual(status, 503, body)
        self.assertIn("Redis connection (127.0.0.1 port %d) is ready in 0 of 2 workers" % self.redis.port, body)
        self.assertIn('limits rules with store = "redis" and the cache\'s tier 2 wait for it', body)
        self.assertEqual(self.get("/a").status, 200)  # served meanwhile: on_redis_error = "allow" decides
        self.restart_redis()
        self.wait_ready()
        self.assertEqual(self.readyz(), (200, "ready\n"))
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200 and
                                   "limits: Redis answers checks again" in self.gw.log(), 30), self.gw.log())
        # a later outage leaves it ready: every gateway shares the Redis, on_redis_error decides meanwhile
        self.redis.stop()
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200 and
                                   self.gw.log().count("limits: Redis did not answer a check") == 2, 30), self.gw.log())
        self.assertEqual(self.readyz(), (200, "ready\n"))

    def test_readyz_waits_for_redis_when_the_cache_tier_2_uses_it(self):
        self.redis.stop()
        self.admin_port = free_port()
        self.start(services=SERVICES, scripts={"a.lua": script("GET /a", OK)},
                   gateway_extra={"redis": {"url": "redis://127.0.0.1:%d/3" % self.redis.port},
                                  "admin": {"port": self.admin_port}})
        status, body = self.readyz_once_serving()
        self.assertEqual(status, 503, body)
        self.assertIn("is ready in 0 of 1 workers; the cache's tier 2 wait for it", body)
        self.restart_redis()
        self.wait_ready()

    def test_client_leaving_while_parked_costs_nothing(self):
        # a Redis that hangs long enough for clients to give up first (HTTP/1.1 and HTTP/2 resets)
        self.start_limited(redis_rules("allow", burst=1000), timeout_ms=1500, workers=2)
        self.assertEqual(self.get("/a").status, 200)
        self.redis.proc.send_signal(signal.SIGSTOP)
        for i in range(20):
            args = ["--max-time", "0.2"] + (["--http2-prior-knowledge"] if i % 2 else [])
            curl(self.url("/a"), *args)
        self.redis.proc.send_signal(signal.SIGCONT)
        self.assertTrue(wait_until(lambda: self.get("/a").status == 200, 10))
        # nothing left waiting: the gateway drains at once on SIGTERM
        t0 = time.monotonic()
        self.gw.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.gw.proc.wait(timeout=30), 0, self.gw.log())
        self.assertLess(time.monotonic() - t0, 10)
        self.assertNotIn("AddressSanitizer", self.gw.log())
        self.assertNotIn("runtime error", self.gw.log())


if __name__ == "__main__":
    unittest.main()
