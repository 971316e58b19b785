"""`aggway test`: a failed assertion in a test during which a script raised an error prints that
error with its file:line beside the assertion; `--help` prints the harness's own usage; `--watch`
runs the specs again when a script changes."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import AGGWAY_BIN, SOURCE_DIR, endpoint, run_aggway, stop_process, main  # noqa: E402

BROKEN = endpoint("GET /broken/{id}",
                  "    local spec = { \"product\", \"/products/\" .. req.params.id }\n"
                  "    spec.requird = true\n"
                  "    return agg.page(agg.fetch_all { product = spec })")

SPEC = """local testing = require "agg.testing"
describe("the broken page", function()
  it("answers 200", function()
    local gw = testing.gateway()
    gw:stub("product", "/products/1", { json = { id = 1 } })
    assert.equal(200, gw:get("/broken/1").status)
  end)
end)
"""


class SpecRunner(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="aggway-spec-runner-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.scripts = os.path.join(self.dir, "scripts")
        os.makedirs(self.scripts)
        shutil.copy(os.path.join(SOURCE_DIR, "scripts", "gateway.lua"), self.scripts)
        with open(os.path.join(self.scripts, "broken.lua"), "w") as f:
            f.write(BROKEN)
        self.spec = os.path.join(self.dir, "broken_spec.lua")
        with open(self.spec, "w") as f:
            f.write(SPEC)

    def test_failed_assertion_prints_the_script_error_with_file_and_line(self):
        p = run_aggway("test", "-c", self.scripts, self.spec)
        out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
        self.assertNotEqual(p.returncode, 0, out)
        self.assertIn("Expected objects to be equal", out)
        self.assertIn("script errors in this test:", out)
        # the line of `spec.requird = true` (the endpoint helper puts the handler body at line 5)
        self.assertRegex(out, r"broken\.lua:6: call to 'product': unknown option 'requird' "
                              r"\(did you mean 'required'\?\)", out)
        self.assertNotIn("stack traceback", out.split("script errors in this test:")[1].split("\n\n")[0])

    def test_a_passing_spec_prints_no_script_errors(self):
        ok_spec = os.path.join(self.dir, "ok_spec.lua")
        with open(ok_spec, "w") as f:
            f.write(SPEC.replace("assert.equal(200", "assert.equal(500"))
        p = run_aggway("test", "-c", self.scripts, ok_spec)
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out)
        self.assertNotIn("script errors", out)

    def test_the_scripts_folder_may_come_after_the_specs_and_busted_options(self):
        # (busted's own -c is its coverage: taken for it, the folder was "LuaCov not found")
        ok_spec = os.path.join(self.dir, "ok_spec.lua")
        with open(ok_spec, "w") as f:
            f.write(SPEC.replace("assert.equal(200", "assert.equal(500"))
        for args in ((ok_spec, "-c", self.scripts), ("--filter", ".", "-c", self.scripts, ok_spec)):
            p = run_aggway("test", *args)
            out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("1 success", out)
            self.assertNotIn("LuaCov", out)

    def test_a_command_line_mistake_says_what_is_wrong_and_where_the_help_is(self):
        for args, why in ((("chek",), "aggway: unknown command 'chek' (serve, check, test, version, help)"),
                          (("check", "scripts"), "aggway: unexpected argument 'scripts' (the scripts folder is given as -c DIR)"),
                          (("check", "-c"), "aggway: -c needs the scripts folder after it"),
                          (("test", "spec", "-c"), "aggway: -c needs the scripts folder after it"),
                          ((), "aggway: a command is needed (serve, check, test, version, help)"),
                          (("test", "-c", "a", "spec", "-c", "b"), "aggway: -c given twice"),
                          (("check", "-c", ""), "aggway: -c needs the scripts folder after it"),
                          # control characters shown escaped, a long argument cut: one line
                          (("serve\x1b]0;x\x07\n",), "aggway: unknown command 'serve\\x1b]0;x\\x07\\x0a' "
                           "(serve, check, test, version, help)"),
                          (("x" * 300,), "aggway: unknown command '%s…' (serve, check, test, version, help)" % ("x" * 200))):
            p = run_aggway(*args)
            err = p.stderr.decode(errors="replace")
            self.assertEqual(p.returncode, 2, err)
            # what is wrong, then one usage line that says where the help is, not the whole help
            self.assertEqual(err, why + "\nusage: aggway COMMAND [-c DIR] [ARGS...]  ('aggway help' lists the "
                             "commands and options)\n", err)

    def test_a_scripts_folder_that_is_not_there_or_a_file_is_said_as_such(self):
        # found by a new operator: both read "gateway.lua:1: cannot read the gateway configuration;
        # create it", under a path that was not there
        missing = os.path.join(tempfile.mkdtemp(prefix="aggway-nofolder-"), "scripts")
        self.addCleanup(shutil.rmtree, os.path.dirname(missing), True)
        for cmd in ("check", "serve", "test"):
            p = run_aggway(cmd, "-c", missing)
            err = p.stderr.decode(errors="replace")
            self.assertEqual(p.returncode, 1, err)
            self.assertEqual(err, "aggway: the scripts folder '%s' does not exist: -c takes the scripts folder "
                             "(gateway.lua, endpoint scripts, lib/)\n" % missing)
        gw = os.path.join(self.scripts, "gateway.lua")
        p = run_aggway("check", "-c", gw)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr.decode(), "aggway: '%s' is not a folder: -c takes the scripts folder "
                         "(gateway.lua, endpoint scripts, lib/)\n" % gw)
        # without -c: ./scripts, and where that is
        p = subprocess.run([AGGWAY_BIN, "check"], cwd=os.path.dirname(missing), capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("the scripts folder 'scripts' does not exist", p.stderr.decode())
        self.assertIn("without -c it is ./scripts (here %s)" % missing, p.stderr.decode())

    def test_without_a_spec_named_the_spec_folder_beside_the_scripts_folder_runs(self):
        # not the current directory's spec/: from another project's root that ran its specs
        # against this folder (a fresh user's trial)
        spec_dir = os.path.join(self.dir, "spec")
        p = subprocess.run([AGGWAY_BIN, "test", "-c", self.scripts], cwd=SOURCE_DIR, capture_output=True, timeout=120)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 2, err)
        self.assertEqual(err, "aggway test: no spec folder beside the scripts folder %s (%s): put the specs there, or "
                         "name them: aggway test -c %s path/to/spec\n" % (self.scripts, spec_dir, self.scripts))
        os.makedirs(spec_dir)
        shutil.copy(self.spec, spec_dir)
        p = subprocess.run([AGGWAY_BIN, "test", "-c", self.scripts, "--filter", "answers"], cwd=SOURCE_DIR,
                           capture_output=True, timeout=120)
        out = p.stdout.decode(errors="replace")
        self.assertIn("0 successes / 1 failure", out)  # the one spec beside it, not the project's
        self.assertIn("broken_spec.lua", out)

    def test_help_prints_the_harness_usage(self):
        p = run_aggway("test", "--help")
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out + p.stderr.decode())
        self.assertTrue(out.startswith("usage: aggway test [-c DIR] [--watch"), out)
        self.assertIn("--watch", out)
        self.assertNotIn("busted: error", out + p.stderr.decode())

    def test_watch_reruns_when_a_script_changes_and_stops_after_the_runs_asked(self):
        ok_spec = os.path.join(self.dir, "ok_spec.lua")
        with open(ok_spec, "w") as f:
            f.write(SPEC.replace("assert.equal(200", "assert.equal(500"))
        proc = subprocess.Popen([AGGWAY_BIN, "test", "-c", self.scripts, "--watch", "--watch-runs", "2", ok_spec],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(stop_process, proc)
        seen = b""
        deadline = time.monotonic() + 60
        while b"waiting for a change" not in seen and time.monotonic() < deadline:
            seen += os.read(proc.stdout.fileno(), 4096) or b""
            if proc.poll() is not None:
                break
        self.assertIn(b"waiting for a change", seen, seen)
        self.assertIsNone(proc.poll(), seen)
        # mtimes have a fine grain, but make sure the new one differs from the first
        time.sleep(0.05)
        with open(os.path.join(self.scripts, "broken.lua"), "a") as f:
            f.write("-- changed\n")
        rest, _ = proc.communicate(timeout=60)
        seen += rest
        self.assertEqual(proc.returncode, 0, seen)
        self.assertIn(b"run 2", seen, seen)
        self.assertEqual(seen.count(b"1 success"), 2, seen)


if __name__ == "__main__":
    main()
