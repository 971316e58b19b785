"""Cluster-wide limits through Redis (issue 18): the store's script (gateway/limits/limit_redis.lua)
run by a real redis-server on a free loopback port, started and stopped by each test. Checks that
the script counts as the local store does (GCRA rates, fixed-window quotas), only accepted requests,
a request's rules all or none, keys that expire, and arguments it refuses."""
import os
import shutil
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import AGGWAY_BIN, GatewayTestCase  # noqa: E402
from test_cache import Redis  # noqa: E402

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
        keys = [k for k, _ in rules]
        args = [now_ms] + [a for _, spec in rules for a in spec]
        reply = self.r.call("EVALSHA", self.sha, len(keys), *keys, *args)
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
        reply = self.r.call("EVAL", self.src, 1, "agw:rl:{r}:x", 1_000, *rate(1, 1, 1))
        self.assertEqual(reply, [1, 1, 0, 1000])

    def test_bad_arguments_are_an_error_reply(self):
        for args in ([1, "agw:rl:{r}:x", "now", "r", 1, 1], [1, "agw:rl:{r}:x", 1, "r", 1],
                     [1, "agw:rl:{r}:x", 1, "z", 1, 1], [1, "agw:rl:{r}:x", 1, "r", 0, 1]):
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


if __name__ == "__main__":
    unittest.main()
