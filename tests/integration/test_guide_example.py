"""docs/guide.md cannot rot: every Lua sample in it runs or is a file CI runs, and its commands work.

- "A complete page in two files": its gateway.lua, page and spec, taken from the guide as written,
  pass `aggway check` and `aggway test`;
- "Testing your page": its failing page and spec, run with that gateway.lua, print the failure the
  guide shows, line for line;
- every other ```lua sample is an excerpt, line for line (indentation aside), of a script or spec
  of this repository that CI runs (scripts/, spec/, examples/);
- every `aggway check` and `aggway test` command of its ```sh samples (but --watch) succeeds from
  the repository's top folder."""
import glob
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SOURCE_DIR, main, run_aggway  # noqa: E402

GUIDE = os.path.join(SOURCE_DIR, "docs", "guide.md")


def guide():
    with open(GUIDE) as f:
        return f.read()


def blocks(text, lang):
    """(line number of its first line, body) of each ```lang block ("" for a plain ``` block)."""
    found, current, start = [], None, 0
    for n, line in enumerate(text.split("\n"), 1):
        if current is None and line.startswith("```"):
            current, start, kind = [], n + 1, line[3:].strip()
        elif current is not None and line == "```":
            if kind == lang:
                found.append((start, "".join(l + "\n" for l in current)))
            current = None
        elif current is not None:
            current.append(line)
    return found


def section(text, title):
    part = text.split("\n## " + title, 1)[1]
    return part.split("\n## ", 1)[0]


class GuideExample(unittest.TestCase):

    def folder(self, files):
        d = tempfile.mkdtemp(prefix="aggway-guide-")
        self.addCleanup(shutil.rmtree, d, True)
        for path, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        return d

    def first_page(self):
        first = section(guide(), "A complete page in two files")
        return [b for _, b in blocks(first, "lua")[:3]]

    def test_the_guides_first_page_and_spec_pass_check_and_test(self):
        gateway, page, spec = self.first_page()
        d = self.folder({"scripts/gateway.lua": gateway, "scripts/dashboard.lua": page,
                         "spec/dashboard_spec.lua": spec})
        p = run_aggway("check", "-c", os.path.join(d, "scripts"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = run_aggway("test", "-c", os.path.join(d, "scripts"), os.path.join(d, "spec"))
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out + p.stderr.decode())
        self.assertRegex(out, r"[1-9]\d* success(es)? / 0 failures / 0 errors", out)

    def test_the_guides_failing_spec_prints_the_failure_the_guide_shows(self):
        gateway = self.first_page()[0]
        testing = section(guide(), "Testing your page")
        files = {"scripts/gateway.lua": gateway}
        for _, b in blocks(testing, "lua"):
            name = re.match(r"-- ((?:scripts|spec)/\S+\.lua)\n", b)
            if name:
                files[name.group(1)] = b
        self.assertEqual(sorted(files), ["scripts/gateway.lua", "scripts/home.lua", "spec/home_spec.lua"])
        shown = [b for _, b in blocks(testing, "") if b.startswith("Failure ->")]
        self.assertEqual(len(shown), 1, "the guide shows one failure")
        d = self.folder(files)
        p = run_aggway("test", "-c", "scripts", "spec", cwd=d)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 1, out + p.stderr.decode())
        self.assertIn(shown[0], out + "\n")

    def test_every_other_lua_sample_is_an_excerpt_of_a_file_ci_runs(self):
        text = guide()
        run_here = set(self.first_page())
        run_here.update(b for _, b in blocks(section(text, "Testing your page"), "lua")
                        if re.match(r"-- (scripts|spec)/", b))
        files = {}
        for pattern in ("scripts/**/*.lua", "spec/**/*.lua", "examples/*/scripts/**/*.lua",
                        "examples/*/spec/**/*.lua"):
            for f in glob.glob(os.path.join(SOURCE_DIR, pattern), recursive=True):
                # (errors="replace": the loader's specs keep binary chunks named .lua among their fixtures)
                with open(f, encoding="utf-8", errors="replace") as fh:
                    files[os.path.relpath(f, SOURCE_DIR)] = "\n".join(l.strip() for l in fh.read().split("\n"))
        samples = blocks(text, "lua")
        self.assertGreaterEqual(len(samples), 6)
        for line, b in samples:
            if b in run_here:
                continue
            want = "\n".join(l.strip() for l in b.rstrip("\n").split("\n"))
            found = [f for f, body in files.items() if want in body]
            self.assertTrue(found, "docs/guide.md:%d: this Lua sample is neither run by this test nor an "
                                   "excerpt of a script or spec CI runs:\n%s" % (line, b))

    def test_the_guides_check_and_test_commands_succeed(self):
        commands = []
        for _, b in blocks(guide(), "sh"):
            for cmd in b.split("\n"):
                cmd = cmd.split("#")[0].strip()
                if re.match(r"aggway (check|test)\b", cmd) and "--watch" not in cmd:
                    commands.append(cmd)
        self.assertGreaterEqual(len(commands), 4, commands)
        for cmd in commands:
            args = re.findall(r'"[^"]*"|\S+', cmd)[1:]
            # the repository's whole spec suite: about 4 s of CPU, 40 s at a load average of 15
            p = run_aggway(*[a.strip('"') for a in args], cwd=SOURCE_DIR, timeout=600)
            out = p.stdout.decode() + p.stderr.decode()
            self.assertEqual(p.returncode, 0, "%s:\n%s" % (cmd, out))
            if args[0] == "test":
                self.assertRegex(out, r"[1-9]\d* success(es)? / 0 failures / 0 errors", cmd)

    def test_every_link_of_the_guide_reaches_a_file_and_heading(self):
        def slug(heading):   # GitHub's anchor of a heading
            return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        links = re.findall(r"\]\(([\w.-]+\.md)?(?:#([\w-]+))?\)", guide())
        self.assertGreaterEqual(len(links), 10)
        for target, anchor in links:
            path = os.path.join(SOURCE_DIR, "docs", target or "guide.md")
            self.assertTrue(os.path.exists(path), target)
            if anchor:
                with open(path) as f:
                    anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}
                self.assertIn(anchor, anchors, "docs/guide.md links to %s#%s, which has no such heading"
                              % (target, anchor))


if __name__ == "__main__":
    main()
