"""A paced HTTP/1.1 load client for the integration tests (not a test file itself).

h2load sends requests as fast as it can (closed loop) or, with --rps / --timing-script-file, in
bursts: every client follows the same clock, so 100 clients at 100 req/s send 100 requests at
once every 10 ms. The single-flight seed (10,000 requests spread *evenly* over 1 s) and the soak
(a steady moderate load whose every answer is checked) need an open-loop client that sends each
request at its own planned moment and records the exact status of every answer, so here is one:

    results = paced_get(port, [(0.0, "/a"), (0.0001, "/a"), ...], connections=500)

Request i is written at t0 + offset_i on an idle keep-alive connection (one request in flight
per connection, so a slow answer never holds up the next request; a new connection is opened
when none is idle). One thread, non-blocking sockets and epoll: about 30 µs of CPU per request,
so 10,000 requests/s fit on one core. Each result records when the request was planned, sent
and answered, and its status (0 when no answer came: connection closed, error or timeout).

Keep-alive race: the gateway closes a connection that stayed idle for its keep-alive timeout
(10 s). A request written on such a connection as the close crosses it gets no answer at all,
which is not a lost request: RFC 9112 §9.3.1 lets a client retry an idempotent request when a
reused connection closes before any byte of the response, and every HTTP client does. So does
this one, once, on a new connection; Result.retried says so. Only a connection that sat idle for
close to that timeout (KEEPALIVE_RACE_S) qualifies: any other silent close stays status 0, so a
gateway that drops requests is still caught.
"""
import select
import socket
import time

KEEPALIVE_RACE_S = 9.0   # the gateway's keep-alive timeout is 10 s; idle this long may meet it


class Result:
    __slots__ = ("planned", "sent", "done", "status", "path", "body", "retried")

    def __init__(self, planned, path):
        self.planned = planned
        self.path = path
        self.sent = None
        self.done = None
        self.status = 0
        self.body = None
        self.retried = False

    @property
    def ms(self):
        return None if self.done is None or self.sent is None else (self.done - self.sent) * 1000.0

    def __repr__(self):
        return "<%s %s sent=%s ms=%s>" % (self.path, self.status, self.sent, self.ms)


class _Conn:
    __slots__ = ("sock", "buf", "req", "fd", "idle_since", "idle_for")

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = b""
        self.req = None
        self.idle_since = time.monotonic()
        self.idle_for = 0.0     # how long it sat idle before its current request


def _parse(buf):
    """One response from buf -> (status, body, rest) or None when incomplete. The gateway frames
    every answer with Content-Length (h2o); chunked answers are not expected here."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
        elif k.strip().lower() == "transfer-encoding":
            raise ValueError("chunked answers are not supported by paced_client")
    start = end + 4
    if len(buf) - start < length:
        return None
    return status, buf[start:start + length], buf[start + length:]


def paced_get(port, schedule, connections=64, max_connections=2000, timeout=10.0, keep_bodies=False,
              host="127.0.0.1", headers=""):
    """Sends GET schedule[i][1] at t0 + schedule[i][0] seconds (offsets ascending) to host:port.
    Opens `connections` keep-alive connections before t0 and more when none is idle (up to
    max_connections; beyond that a request waits for a free connection). Waits up to `timeout`
    seconds after the last planned send for the answers. Returns the Result list in schedule
    order (times are time.monotonic() values)."""
    results = [Result(off, path) for off, path in schedule]
    ep = select.epoll()
    conns = {}
    idle = []

    def open_conn():
        s = socket.create_connection((host, port), timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        c = _Conn(s)
        conns[c.fd] = c
        ep.register(c.fd, select.EPOLLIN)
        return c

    def retry_on_new(c):
        """The keep-alive race (module doc): c was reused and closed before any response byte."""
        r = c.req
        if r is None or r.retried or c.idle_for < KEEPALIVE_RACE_S or c.buf:
            return False
        r.retried = True
        c.req = None
        waiting.insert(0, r)
        return True

    def close_conn(c):
        if c.req is not None and c.req.done is None:
            c.req.done = time.monotonic()
            c.req.status = 0
        c.req = None
        try:
            ep.unregister(c.fd)
        except (OSError, ValueError):
            pass
        c.sock.close()
        conns.pop(c.fd, None)
        if c in idle:
            idle.remove(c)

    for _ in range(connections):
        idle.append(open_conn())
    extra = headers
    t0 = time.monotonic() + 0.05
    i, n = 0, len(results)
    outstanding = 0
    waiting = []          # planned requests with no free connection yet (FIFO)
    deadline = t0 + (schedule[-1][0] if schedule else 0) + timeout
    try:
        while True:
            now = time.monotonic()
            while i < n and t0 + results[i].planned <= now:
                waiting.append(results[i])
                i += 1
            while waiting:
                if not idle and len(conns) < max_connections:
                    try:
                        idle.append(open_conn())
                    except OSError:
                        break
                if not idle:
                    break
                r = waiting.pop(0)
                c = idle.pop()
                data = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (r.path, extra)).encode()
                r.sent = time.monotonic()
                c.req = r
                c.idle_for = time.monotonic() - c.idle_since
                try:
                    c.sock.send(data)
                    outstanding += 1
                except OSError:
                    if not retry_on_new(c):
                        r.done = r.sent
                    close_conn(c)
            if i >= n and not waiting and outstanding == 0:
                break
            now = time.monotonic()
            if now >= deadline:
                break
            wait = (t0 + results[i].planned - now) if i < n else (deadline - now)
            wait = max(0.0, min(wait, deadline - now, 0.05))
            for fd, _ev in ep.poll(wait):
                c = conns.get(fd)
                if c is None:
                    continue
                try:
                    data = c.sock.recv(262144)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    if c.req is not None:
                        outstanding -= 1
                        retry_on_new(c)
                    close_conn(c)
                    continue
                c.buf += data
                parsed = _parse(c.buf)
                if parsed is not None and c.req is not None:
                    status, body, rest = parsed
                    c.req.done = time.monotonic()
                    c.req.status = status
                    if keep_bodies:
                        c.req.body = body
                    c.req = None
                    c.buf = rest
                    c.idle_since = time.monotonic()
                    outstanding -= 1
                    idle.append(c)
    finally:
        for c in list(conns.values()):
            close_conn(c)
        ep.close()
    return results
