"""The guide's complete page (docs/guide.md, "A complete page in two files") is the one a reader
copies: its gateway.lua, page and spec, taken from the guide as written, pass `aggway check` and
`aggway test`."""
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SOURCE_DIR, main, run_aggway  # noqa: E402


class GuideExample(unittest.TestCase):

    def test_the_guides_first_page_and_spec_pass_check_and_test(self):
        with open(os.path.join(SOURCE_DIR, "docs", "guide.md")) as f:
            guide = f.read()
        first = guide.split("\n## ")[1]                  # the section "A complete page in two files"
        self.assertTrue(first.startswith("A complete page"), first[:80])
        gateway, page, spec = re.findall(r"```lua\n(.*?)```", first, re.S)[:3]
        d = tempfile.mkdtemp(prefix="aggway-guide-")
        self.addCleanup(shutil.rmtree, d, True)
        os.makedirs(os.path.join(d, "scripts"))
        os.makedirs(os.path.join(d, "spec"))
        for path, text in (("scripts/gateway.lua", gateway), ("scripts/dashboard.lua", page),
                           ("spec/dashboard_spec.lua", spec)):
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        p = run_aggway("check", "-c", os.path.join(d, "scripts"))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        p = run_aggway("test", "-c", os.path.join(d, "scripts"), os.path.join(d, "spec"))
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out + p.stderr.decode())
        self.assertRegex(out, r"[1-9]\d* success(es)? / 0 failures / 0 errors", out)


if __name__ == "__main__":
    main()
