"""A minimal HTTP/2-over-TLS client for the integration tests (not a test file itself).

curl and nghttp open a connection per run; a test of what happens to a connection across an
event (a reload that rotates the certificate) needs one it holds: connect, see the server's
certificate, send requests on it now and later. This client speaks just enough HTTP/2 (RFC 9113)
for GET requests with small answers:

    c = H2Client(port)           # TCP connection; the TLS handshake may wait (start_tls)
    c.start_tls()                # ALPN h2, certificate not verified (the tests make their own)
    c.peer_cert_der()            # the certificate the server sent, DER bytes
    status, body = c.get("/shape/1")
    [(status, body), ...] = c.get_many(["/a", "/b"])   # streams sent in one write
    c.close()

Header blocks are sent as HPACK literals without Huffman coding (RFC 7541 §6.2.2); of the
response headers only :status is read, from its static-table index (RFC 7541 Appendix A), which
is how the gateway sends 200, 204, 206, 304, 400, 404 and 500. Every wait is bounded by the
socket's timeout and by a deadline per request.
"""
import socket
import ssl
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}


def _hpack_int(value, prefix_bits, first=0):
    """RFC 7541 §5.1 integer with an N-bit prefix; first holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name, value):
    """Literal header field without indexing, new name (RFC 7541 §6.2.2), no Huffman."""
    name, value = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


class H2Error(Exception):
    pass


class H2Client:

    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.timeout = timeout
        self.raw = socket.create_connection((host, port), timeout=timeout)
        self.tls = None
        self.next_stream = 1
        self.buf = b""

    def start_tls(self):
        """TLS handshake with ALPN h2, then the connection preface and our (empty) SETTINGS."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        self.tls = ctx.wrap_socket(self.raw, server_hostname="localhost")
        if self.tls.selected_alpn_protocol() != "h2":
            raise H2Error("ALPN selected %r, not h2" % self.tls.selected_alpn_protocol())
        self.tls.sendall(PREFACE + self._frame(SETTINGS, 0, 0, b""))
        return self

    def start_plain(self):
        """h2c with prior knowledge on a cleartext port: the preface and our (empty) SETTINGS."""
        self.tls = self.raw  # the frames go over the TCP connection as they are
        self.raw.sendall(PREFACE + self._frame(SETTINGS, 0, 0, b""))
        return self

    def peer_cert_der(self):
        return self.tls.getpeercert(binary_form=True)

    def close(self):
        for s in ((self.tls, self.raw) if self.tls is not self.raw else (self.raw,)):
            try:
                if s is not None:
                    s.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # frames ------------------------------------------------------------------------------------
    @staticmethod
    def _frame(ftype, flags, stream, payload):
        return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload

    def _read_exact(self, n, deadline):
        while len(self.buf) < n:
            if time.monotonic() > deadline:
                raise H2Error("no answer in time")
            chunk = self.tls.recv(65536)
            if not chunk:
                raise H2Error("the server closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _read_frame(self, deadline):
        head = self._read_exact(9, deadline)
        length = struct.unpack(">I", b"\0" + head[:3])[0]
        ftype, flags = head[3], head[4]
        stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
        return ftype, flags, stream, self._read_exact(length, deadline)

    @staticmethod
    def _unpad(flags, payload, ftype):
        if flags & PADDED:
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        if ftype == HEADERS and flags & PRIORITY:
            payload = payload[5:]
        return payload

    # requests ----------------------------------------------------------------------------------
    def get(self, path, authority="localhost"):
        """GET path on a new stream of this connection; returns (status, body bytes). status is
        None when the server sent it other than by static index."""
        return self.get_many([path], authority)[0]

    def get_many(self, paths, authority="localhost"):
        """GETs every path on a stream of its own, all HEADERS frames in one write (so the server
        reads them together, as one batch); returns [(status, body bytes)] in the order of paths.
        Raises H2Error on a reset stream, a GOAWAY or no answer within the timeout."""
        return self.read_answers(self.send_gets(paths, authority))

    def send_gets(self, paths, authority="localhost"):
        """Sends a GET of every path on a stream of its own, all in one write, without reading
        anything; returns the stream ids for read_answers."""
        first = self.next_stream
        sids = [first + 2 * i for i in range(len(paths))]
        self.next_stream = first + 2 * len(paths)
        self.tls.sendall(b"".join(
            self._frame(HEADERS, END_STREAM | END_HEADERS, sid,
                        _literal(":method", "GET") + _literal(":scheme", "https") + _literal(":path", path) +
                        _literal(":authority", authority))
            for sid, path in zip(sids, paths)))
        return sids

    def read_answers(self, sids):
        """Reads until every stream of sids has ended; returns [(status, body bytes)] in their
        order (see get_many)."""
        out = {sid: [None, b"", False] for sid in sids}   # status, body, ended
        deadline = time.monotonic() + self.timeout
        left = len(sids)
        while left:
            ftype, flags, stream, payload = self._read_frame(deadline)
            if ftype == SETTINGS and not flags & ACK:
                self.tls.sendall(self._frame(SETTINGS, ACK, 0, b""))
            elif ftype == PING and not flags & ACK:
                self.tls.sendall(self._frame(PING, ACK, 0, payload))
            elif ftype == GOAWAY:
                raise H2Error("GOAWAY %r" % payload)
            elif stream not in out or out[stream][2]:
                continue
            elif ftype == RST_STREAM:
                raise H2Error("stream %d reset: %r" % (stream, payload))
            elif ftype in (HEADERS, CONTINUATION):
                block = self._unpad(flags, payload, ftype)
                if ftype == HEADERS and out[stream][0] is None and block and block[0] & 0x80:
                    out[stream][0] = STATIC_STATUS.get(block[0] & 0x7F)
            elif ftype == DATA:
                out[stream][1] += self._unpad(flags, payload, ftype)
                if payload:  # give the flow-control windows back (the stream's while it lasts)
                    inc = struct.pack(">I", len(payload))
                    self.tls.sendall(self._frame(WINDOW_UPDATE, 0, 0, inc) +
                                     (b"" if flags & END_STREAM else self._frame(WINDOW_UPDATE, 0, stream, inc)))
            if stream in out and ftype in (HEADERS, CONTINUATION, DATA) and flags & END_STREAM:
                out[stream][2] = True
                left -= 1
        return [(out[sid][0], out[sid][1]) for sid in sids]
