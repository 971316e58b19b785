"""Helpers of the deploy tests: install the build into a temporary prefix, read what it laid out.

Environment (set by ctest): AGGWAY_BUILD_DIR (the build folder to install from) besides the
harness's AGGWAY_BIN, AGGWAY_MOCK_BIN and AGGWAY_SOURCE_DIR.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402  (the integration harness: mock, ports, curl)

SOURCE_DIR = harness.SOURCE_DIR
BUILD_DIR = os.environ.get("AGGWAY_BUILD_DIR") or os.path.dirname(harness.AGGWAY_BIN)


def install(prefix, destdir=None, timeout=120):
    """`cmake --install BUILD_DIR --prefix prefix` (with DESTDIR=destdir when given); returns the
    root the files landed in (destdir + prefix, or prefix) and the sorted list of every file laid
    out, as absolute paths seen by the installed system (without destdir)."""
    env = dict(os.environ)
    env.pop("DESTDIR", None)
    if destdir:
        env["DESTDIR"] = destdir
    p = subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", prefix], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("cmake --install failed:\n" + p.stdout.decode(errors="replace"))
    top = destdir or "/"
    files = []
    scan = destdir if destdir else prefix
    for root, _dirs, names in os.walk(scan):
        for n in names:
            full = os.path.join(root, n)
            files.append("/" + os.path.relpath(full, top) if destdir else full)
    return sorted(files)


def unit_settings(text):
    """A systemd unit's text -> {section: {key: [values in order]}} (comments and blanks left out;
    a key given twice keeps both values, as systemd does for list settings)."""
    out, section = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        if "=" not in line or section is None:
            raise AssertionError("not a unit line: %r" % raw)
        k, v = line.split("=", 1)
        out[section].setdefault(k.strip(), []).append(v.strip())
    return out


def timespan_s(v):
    """A systemd time span ("20", "20s", "1min 30s", "500ms") in seconds."""
    import re
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "": 1}
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", v):
        if unit not in units:
            raise AssertionError("unknown time unit in %r" % v)
        total += float(num) * units[unit]
    return total
