"""`cpack -G DEB`: the .deb holds exactly what `cmake --install` lays out for /usr, depends on
the Debian packages of the libraries the binary links with, keeps /etc as conffiles, and its
extracted binary serves from its own runtime."""
import os
import re
import shutil
import subprocess

import deploylib
from deploylib import harness
from test_deploy_files import needed_packages

SRC = deploylib.SOURCE_DIR


def read(path):
    with open(path) as f:
        return f.read()


class Package(harness.GatewayTestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("dpkg-shlibdeps") is None:
            raise AssertionError("dpkg-shlibdeps is missing (dpkg-dev; tools/bootstrap installs it)")
        cls.out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "aggway-deb-%d" % os.getpid())
        shutil.rmtree(cls.out, ignore_errors=True)
        p = subprocess.run(["cpack", "-G", "DEB", "-B", cls.out, "--config",
                            os.path.join(deploylib.BUILD_DIR, "CPackConfig.cmake")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=280)
        if p.returncode != 0:
            raise AssertionError("cpack failed:\n" + p.stdout.decode(errors="replace"))
        debs = [f for f in os.listdir(cls.out) if f.endswith(".deb")]
        assert len(debs) == 1, debs
        cls.deb = os.path.join(cls.out, debs[0])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def field(self, name):
        return subprocess.run(["dpkg-deb", "-f", self.deb, name], stdout=subprocess.PIPE, check=True,
                              timeout=60).stdout.decode().strip()

    def test_control_names_the_package_version_and_architecture(self):
        version = re.search(r"set\(AGW_VERSION (\S+)\)", read(os.path.join(SRC, "cmake", "Install.cmake"))).group(1)
        arch = subprocess.run(["dpkg", "--print-architecture"], stdout=subprocess.PIPE, check=True).stdout.decode().strip()
        self.assertEqual(self.field("Package"), "aggway")
        self.assertEqual(self.field("Version"), version)
        self.assertEqual(self.field("Architecture"), arch)
        self.assertEqual(os.path.basename(self.deb), "aggway_%s_%s.deb" % (version, arch))
        self.assertIn("lua-busted", self.field("Recommends"))

    def test_depends_are_the_debian_packages_of_the_linked_libraries(self):
        depends = self.field("Depends")
        first_choice = {alt.split("|")[0].split("(")[0].strip() for alt in depends.split(",")}
        every_choice = {a.split("(")[0].strip() for alt in depends.split(",") for a in alt.split("|")}
        want = needed_packages(os.path.join(deploylib.BUILD_DIR, "aggway"))
        self.assertTrue({"libh2o0.13", "libuv1", "libev4", "libjansson4", "libssl3", "liburing2",
                         "libc6"} <= want, want)
        # upstream answers and the JWKS fetch are read by upstream/http1.c: no libhttp-parser
        self.assertNotIn("libhttp-parser2.9", want)
        self.assertEqual(sorted(want - every_choice), [], "Depends misses a linked library's package")
        self.assertEqual(sorted(first_choice - want), [], "Depends names a package the binary does not link with")
        for alt in depends.split(","):
            self.assertRegex(alt.strip(), r"^[a-z0-9.+-]+( \(>= [^)]+\))?( \| [a-z0-9.+-]+( \(>= [^)]+\))?)*$")

    def test_contents_are_the_install_for_usr_and_etc_is_conffiles(self):
        listing = subprocess.run(["dpkg-deb", "-c", self.deb], stdout=subprocess.PIPE, check=True,
                                 timeout=60).stdout.decode()
        in_deb = sorted(line.split()[5][1:] for line in listing.splitlines() if not line.split()[5].endswith("/"))
        installed = deploylib.install("/usr", destdir=os.path.join(self.workdir, "stage"))
        self.assertEqual(in_deb, installed)
        conffiles = subprocess.run("dpkg-deb --ctrl-tarfile %s | tar -xO ./conffiles" % self.deb, shell=True,
                                   stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode().split()
        self.assertEqual(sorted(conffiles), [f for f in in_deb if f.startswith("/etc/")])
        self.assertTrue(conffiles)

    def test_the_extracted_package_checks_its_example_with_its_own_runtime(self):
        root = os.path.join(self.workdir, "root")
        subprocess.run(["dpkg-deb", "-x", self.deb, root], check=True, timeout=60)
        env = {k: v for k, v in os.environ.items() if k != "AGGWAY_LUA_DIR"}
        r = subprocess.run([os.path.join(root, "usr/bin/aggway"), "version"], stdout=subprocess.PIPE, env=env,
                           timeout=30)
        self.assertIn("lua runtime: %s/usr/share/aggway/lua (installed)" % os.path.realpath(root), r.stdout.decode())
        r = subprocess.run([os.path.join(root, "usr/bin/aggway"), "check", "-c", os.path.join(root, "etc/aggway/scripts")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r)
        unit = read(os.path.join(root, "usr/lib/systemd/system/aggway.service"))
        self.assertIn("ExecStart=/usr/bin/aggway serve -c /etc/aggway/scripts\n", unit)


if __name__ == "__main__":
    harness.main()
