"""The admin waterfall (issue 4): /waterfall draws each upstream call of the last requests as a bar
on the request's time axis, /waterfall.json gives the same data.

Given Product, Reviews and Inventory at 120 ms each: a parallel fan-out page and a dependent chain
page (Reviews after Product, Inventory after Reviews). The JSON says the fan-out's calls overlap
and the chain's calls form a staircase; and a screenshot of the page taken by headless Chromium
shows the same thing in pixels: the fan-out's three bars overlap on the x axis, each bar of the
chain starts where the one above it ends (seed 000: "parallel calls overlap; accidental sequencing
shows as a staircase").
"""
import json
import os
import shutil
import struct
import subprocess
import urllib.error
import urllib.request
import zlib

from harness import SLOW, GatewayTestCase, demo_services, endpoint, free_port, main, route, wait_until

FANOUT = endpoint("GET /fanout", """
    return agg.page(agg.fetch_all {
      product = { "product", "/products/1", collapse = false },
      reviews = { "reviews", "/reviews/1", collapse = false },
      inventory = { "inventory", "/stock/1", collapse = false },
    })""", deadline_ms=5000)
CHAIN = endpoint("GET /chain", """
    return agg.page(agg.fetch_all {
      product = { "product", "/products/1", collapse = false },
      reviews = agg.fetch_then("product", function(p)
        return { "reviews", "/reviews/1", collapse = false } end),
      inventory = agg.fetch_then("reviews", function(r)
        return { "inventory", "/stock/1", collapse = false } end),
    })""", deadline_ms=5000)
FLAKY = endpoint("GET /flaky", """
    return agg.page(agg.fetch_all { f = { "flaky", "/f", collapse = false, retry = { attempts = 2, backoff_ms = 5 } } })""",
                 deadline_ms=5000)

TRACE_FANOUT = "11111111111111111111111111111111"
TRACE_CHAIN = "22222222222222222222222222222222"
TRACE_FLAKY = "33333333333333333333333333333333"
PARENT = "00f067aa0ba902b7"
CALL_MS = 120
BAR_OK = (0x1F, 0x77, 0xB4)   # waterfall.c WF_COLOR_OK
BAR_HEIGHT = 14               # waterfall.c WF_BAR


# ---------------------------------------------------------------------------------------------
# PNG (RFC 2083) decoding with zlib: 8-bit RGB or RGBA, non-interlaced, as Chromium writes them

def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data):
    """PNG bytes -> (width, height, rows) with rows[y] a bytes object of RGB triples."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _comp, _filt, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0, "unsupported PNG %r" % ((depth, color, interlace),)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 255
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                upleft = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + paeth(left, prev[i], upleft)) & 255
        prev = line
        if bpp == 4:
            rgb = bytearray(width * 3)
            rgb[0::3], rgb[1::3], rgb[2::3] = line[0::4], line[1::4], line[2::4]
            rows.append(bytes(rgb))
        else:
            rows.append(bytes(line))
    return width, height, rows


def find_bars(png, color, min_height=BAR_HEIGHT - 2):
    """Bars of exactly this colour (±6 per channel), top to bottom: [(x0, x1, y0, y1)] in pixels.
    Smaller patches (the legend's swatches) are left out."""
    width, _height, rows = decode_png(png)
    tol = 6
    bands, current = [], None
    for y, row in enumerate(rows):
        xs = [x for x in range(width)
              if abs(row[3 * x] - color[0]) <= tol and abs(row[3 * x + 1] - color[1]) <= tol
              and abs(row[3 * x + 2] - color[2]) <= tol]
        if xs:
            if current and current[3] == y - 1:
                current = (min(current[0], xs[0]), max(current[1], xs[-1]), current[2], y)
            else:
                if current:
                    bands.append(current)
                current = (xs[0], xs[-1], y, y)
        elif current:
            bands.append(current)
            current = None
    if current:
        bands.append(current)
    return [b for b in bands if b[3] - b[2] + 1 >= min_height]


class Waterfall(GatewayTestCase):

    def setUp(self):
        super().setUp()
        self.admin_port = free_port()
        services = demo_services(product_ms=CALL_MS, reviews_ms=CALL_MS, inventory_ms=CALL_MS)
        services["flaky"] = [route("/f", status=503, json={"status": 503})]
        self.start(services=services, scripts={"fanout.lua": FANOUT, "chain.lua": CHAIN, "flaky.lua": FLAKY},
                   upstream_options={"product": {"timeout_ms": 2000}, "reviews": {"timeout_ms": 2000},
                                     "inventory": {"timeout_ms": 2000}, "flaky": {"breaker": False}},
                   gateway_extra={"admin": {"port": self.admin_port}})
        for trace, path in ((TRACE_FANOUT, "/fanout"), (TRACE_CHAIN, "/chain"), (TRACE_FLAKY, "/flaky")):
            r = self.get(path, "-H", "traceparent: 00-%s-%s-01" % (trace, PARENT))
            self.assertIn(r.status, (200, 502), r)

    def admin(self, path, method="GET"):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.admin_port, path), method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Content-Type"), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read()

    def request_of(self, trace):
        status, ctype, body = self.admin("/waterfall.json?trace=" + trace)
        self.assertEqual((status, ctype), (200, "application/json"), body)
        reqs = json.loads(body)["requests"]
        self.assertEqual(len(reqs), 1, reqs)
        return reqs[0]

    def test_json_fanout_overlaps_and_chain_is_a_staircase(self):
        fan = self.request_of(TRACE_FANOUT)
        self.assertEqual((fan["request"], fan["route"], fan["status"]), ("GET /fanout", "GET /fanout", 200))
        calls = {c["section"]: c for c in fan["calls"]}
        self.assertEqual(set(calls), {"product", "reviews", "inventory"})
        self.assertEqual({c["upstream"] for c in fan["calls"]}, {"product", "reviews", "inventory"})
        starts = [c["start_ms"] for c in fan["calls"]]
        ends = [c["start_ms"] + c["duration_ms"] for c in fan["calls"]]
        self.assertLess(max(starts), min(ends), "parallel calls overlap: %r" % fan["calls"])
        for c in fan["calls"]:
            self.assertEqual((c["http_status"], c["outcome"], c["retry"], c["hedge"]), (200, "ok", False, False))
            self.assertGreaterEqual(c["duration_ms"], CALL_MS - 5)
        chain = self.request_of(TRACE_CHAIN)
        order = sorted(chain["calls"], key=lambda c: c["start_ms"])
        self.assertEqual([c["section"] for c in order], ["product", "reviews", "inventory"])
        for before, after in zip(order, order[1:]):
            self.assertGreaterEqual(after["start_ms"], before["start_ms"] + before["duration_ms"] - 0.001,
                                    "a dependent call starts when its dependency ended: %r" % order)
        self.assertGreaterEqual(chain["duration_ms"], 3 * CALL_MS - 5)
        flaky = self.request_of(TRACE_FLAKY)
        self.assertEqual([(c["attempt"], c["retry"], c["http_status"]) for c in flaky["calls"]],
                         [(1, False, 503), (2, True, 503)])

    def test_html_page_is_self_contained_and_labelled(self):
        status, ctype, body = self.admin("/waterfall")
        self.assertEqual((status, ctype), (200, "text/html; charset=utf-8"))
        html = body.decode()
        self.assertTrue(html.startswith("<!DOCTYPE html>"))
        for needle in ("GET /fanout", "GET /chain", "product &#8594; product", "reviews &#8594; reviews",
                       "retry (attempt 2)", TRACE_CHAIN, "<svg"):
            self.assertIn(needle, html)
        self.assertNotIn("<script", html)
        self.assertNotIn("src=", html)
        self.assertNotIn("<link", html)
        status, _, body = self.admin("/waterfall?trace=" + TRACE_FANOUT)
        self.assertIn("GET /fanout", body.decode())
        self.assertNotIn("GET /chain", body.decode())
        self.assertEqual(self.admin("/waterfall.json?limit=1")[0], 200)
        self.assertEqual(len(json.loads(self.admin("/waterfall.json?limit=1")[2])["requests"]), 1)
        self.assertEqual(self.admin("/waterfall?trace=XYZ")[0], 400)
        for bad in ("abc", "0", "", "-1", "1.5", "2x"):
            self.assertEqual(self.admin("/waterfall.json?limit=" + bad)[0], 400, bad)
        everything = len(json.loads(self.admin("/waterfall.json")[2])["requests"])
        self.assertGreater(everything, 1)
        for big in ("999999999", "1000000000", "9" * 40):
            self.assertEqual(len(json.loads(self.admin("/waterfall.json?limit=" + big)[2])["requests"]), everything)
        self.assertEqual(self.admin("/waterfall", method="HEAD")[:2], (200, "text/html; charset=utf-8"))
        self.assertEqual(self.admin("/waterfall", method="POST")[0], 405)

    def screenshot(self, trace):
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            self.fail("chromium is not installed: tools/bootstrap installs it (Debian package chromium); "
                      "this test needs it to check the waterfall as a browser draws it")
        out = os.path.join(self.workdir, "shot-%s.png" % trace[:4])
        profile = os.path.join(self.workdir, "chromium-profile-" + trace[:4])
        url = "http://127.0.0.1:%d/waterfall?trace=%s" % (self.admin_port, trace)
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", "--force-device-scale-factor=1", "--user-data-dir=" + profile,
               "--screenshot=" + out, "--window-size=1200,400", url]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180 if SLOW else 120)
        self.assertTrue(os.path.exists(out), "chromium wrote no screenshot (exit %d):\n%s"
                        % (p.returncode, p.stdout.decode(errors="replace")[-3000:]))
        with open(out, "rb") as f:
            return f.read()

    def test_screenshot_fanout_bars_overlap_chain_bars_step_down(self):
        bars = find_bars(self.screenshot(TRACE_FANOUT), BAR_OK)
        self.assertEqual(len(bars), 3, "three call bars in the fan-out: %r" % bars)
        self.assertLess(max(b[0] for b in bars), min(b[1] for b in bars),
                        "the fan-out's bars overlap on the time axis: %r" % bars)
        for b in bars:
            self.assertGreater(b[1] - b[0], 100, "each bar is most of the request's width: %r" % bars)

        bars = find_bars(self.screenshot(TRACE_CHAIN), BAR_OK)
        self.assertEqual(len(bars), 3, "three call bars in the chain: %r" % bars)
        for above, below in zip(bars, bars[1:]):
            self.assertGreater(below[2], above[3], "one row per call, top to bottom")
            self.assertGreaterEqual(below[0], above[1] - 2,
                                    "each call starts at or after the end of the one before: %r" % bars)
        self.assertGreater(bars[2][0] - bars[0][0], 300, "the staircase spans the axis: %r" % bars)


if __name__ == "__main__":
    main()
