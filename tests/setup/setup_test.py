#!/usr/bin/env python3
"""tools/setup.sh decides from capability, installs only what is missing, and when it
cannot install prints one line naming what is missing and how to point CMake at it.

Runs the real script with a doctored PATH: a directory of links to every program on the
real PATH except the ones a case hides, in front of fakes (apt-get that records its
arguments, id, sudo). A missing CMake package is simulated with
KPACK_CMAKE_ARGS=-DCMAKE_DISABLE_FIND_PACKAGE_<name>=ON, which the probe honours like any
CMake argument. Every case stops before configuring or building kpack.

Usage: setup_test.py [REPO_ROOT]   (stdlib only; ctest kpack_setup_test)
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else
                    pathlib.Path(__file__).resolve().parents[2])
SETUP = ROOT / "tools" / "setup.sh"

FAKE_APT = """#!/bin/sh
echo "$*" >> "$FAKE_APT_LOG"
case "$1" in
  update) exit "${FAKE_APT_UPDATE_RC:-0}" ;;
  *) exit "${FAKE_APT_INSTALL_RC:-0}" ;;
esac
"""


class SetupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.shared = pathlib.Path(tempfile.mkdtemp(prefix="kpack_setup_test_path_"))
        cls.real_dirs = {}  # frozenset(hidden names) -> a directory of links

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)

    def real_dir(self, hide):
        key = frozenset(hide)
        if key not in self.real_dirs:
            d = self.shared / f"real{len(self.real_dirs)}"
            d.mkdir()
            for p in os.environ["PATH"].split(os.pathsep):
                if not os.path.isdir(p):
                    continue
                for name in os.listdir(p):
                    src, dst = os.path.join(p, name), d / name
                    if name in key or dst.exists() or dst.is_symlink():
                        continue
                    if os.path.isfile(src) and os.access(src, os.X_OK):
                        dst.symlink_to(src)
            self.real_dirs[key] = d
        return self.real_dirs[key]

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="kpack_setup_test_"))
        self.apt_log = self.tmp / "apt.log"

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, hide=(), fakes=None):
        """A PATH with the fakes first, then every real program except `hide`."""
        fake_dir = self.tmp / "fake"
        fake_dir.mkdir(exist_ok=True)
        for name, text in (fakes or {}).items():
            (fake_dir / name).write_text(text)
            (fake_dir / name).chmod(0o755)
        real_dir = self.real_dir(hide)
        return f"{fake_dir}{os.pathsep}{real_dir}"

    def run_setup(self, *args, path, cmake_args="", env=None):
        e = dict(os.environ, PATH=path, FAKE_APT_LOG=str(self.apt_log),
                 KPACK_CMAKE_ARGS=cmake_args, TMPDIR=str(self.tmp))
        e.pop("CXX", None)
        e.update(env or {})
        return subprocess.run(["bash", str(SETUP), *args], capture_output=True, text=True,
                              env=e, timeout=300)

    def apt_calls(self):
        return self.apt_log.read_text().splitlines() if self.apt_log.exists() else []

    def assert_one_line(self, r, *parts):
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        for p in parts:
            self.assertIn(p, lines[0])
        self.assertIn("CMAKE_PREFIX_PATH", lines[0])
        return lines[0]

    def test_check_finds_everything_here(self):
        # This machine built kpack, so nothing the build needs is missing.
        r = self.run_setup("--check", path=self.path())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("nothing missing", r.stdout)
        for what in ("cmake", "ninja", "absl", "fmt", "GTest", "OpenSSL", "CUDAToolkit"):
            self.assertIn(what, r.stdout)

    def test_no_apt_get_prints_one_line_and_exits_1(self):
        r = self.run_setup(path=self.path(hide={"apt-get"}),
                           cmake_args="-DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON")
        line = self.assert_one_line(r, "missing CLI11; cannot install: no "
                                    "apt-get on PATH", "(Debian/Ubuntu: libcli11-dev)")
        # Only fmt: cmake, ninja and the rest are there and must not be named.
        self.assertNotIn("cmake >=", line)
        self.assertNotIn("ninja", line)
        self.assertNotIn("absl", line)
        self.assertEqual(r.stdout, "")

    def test_installs_only_what_is_missing(self):
        # apt-get "succeeds" without installing anything: setup asks for exactly the
        # missing packages' Debian names, probes again and reports what is still missing.
        r = self.run_setup(path=self.path(fakes={"apt-get": FAKE_APT}),
                           cmake_args="-DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON "
                                      "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON",
                           env={"FAKE_APT_INSTALL_RC": "0"})
        calls = self.apt_calls()
        self.assertEqual(calls[0], "update -qq")
        self.assertEqual(calls[1].split()[:3], ["install", "-y", "-qq"])
        self.assertEqual(sorted(calls[1].split()[3:]),
                         ["libcli11-dev", "libgmock-dev", "libgtest-dev"])
        self.assertEqual(len(calls), 2)
        self.assert_one_line(r, "missing CLI11; GTest with gmock",
                             "still missing after apt-get install")

    def test_a_missing_tool_is_installed_first(self):
        r = self.run_setup(path=self.path(hide={"ninja"}, fakes={"apt-get": FAKE_APT}))
        calls = self.apt_calls()
        self.assertEqual(calls, ["update -qq", "install -y -qq ninja-build"])
        self.assert_one_line(r, "missing ninja", "still missing after apt-get install")

    def test_apt_without_network_prints_one_line(self):
        r = self.run_setup(path=self.path(fakes={"apt-get": FAKE_APT}),
                           cmake_args="-DCMAKE_DISABLE_FIND_PACKAGE_spdlog=ON",
                           env={"FAKE_APT_UPDATE_RC": "100"})
        self.assert_one_line(r, "missing spdlog",
                             "apt-get update failed (no network?")
        self.assertEqual(self.apt_calls(), ["update -qq"])

    def test_not_root_without_sudo_prints_one_line(self):
        fakes = {"apt-get": FAKE_APT, "id": "#!/bin/sh\necho 1000\n",
                 "sudo": "#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n"}
        r = self.run_setup(path=self.path(fakes=fakes),
                           cmake_args="-DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON")
        self.assert_one_line(r, "missing benchmark",
                             "not root, and no sudo without a password",
                             "libbenchmark-dev")
        self.assertEqual(self.apt_calls(), [])

    def test_what_apt_cannot_provide_is_reported_without_calling_it(self):
        r = self.run_setup(path=self.path(fakes={"apt-get": FAKE_APT}),
                           cmake_args="-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
        self.assert_one_line(r, "the CUDA toolkit headers", "set CUDA_HOME",
                             "apt-get does not provide")
        self.assertEqual(self.apt_calls(), [])

    def test_without_a_compiler_packages_are_not_probed_and_it_says_so(self):
        r = self.run_setup("--check", path=self.path(hide={"c++", "g++", "clang++"}))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("missing: a C++ compiler (c++, g++ or clang++)", r.stdout)
        self.assertIn("CMake packages not probed", r.stdout)
        self.assertIn("would install (apt-get): g++", r.stdout)

    def test_test_profile_needs_clang_14_and_its_runtimes(self):
        r = self.run_setup("--for", "test", "--check", path=self.path(hide={"clang++-14"}))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("clang-14 with its sanitizer and libFuzzer runtimes", r.stdout)
        self.assertIn("would install (apt-get): clang-14 libclang-rt-14-dev", r.stdout)
        # The run profile does not need clang.
        r = self.run_setup("--check", path=self.path(hide={"clang++-14"}))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_the_main_job_builds_only_the_command_line(self):
        # A cmake that runs the probe for real but only records the configure and the build
        # of kpack itself: the run profile (tools/run.sh) builds the target it runs, the
        # test profile everything.
        real = shutil.which("cmake")
        log = self.tmp / "cmake.log"
        fake = (f'#!/bin/sh\necho "$*" >> {log}\n'
                f'case "$*" in\n  --version*|*cmake/probe*) exec {real} "$@" ;;\n'
                f'  *) exit 0 ;;\nesac\n')
        builds = {}
        for profile in ("run", "test"):
            log.unlink(missing_ok=True)
            r = self.run_setup("--for", profile, path=self.path(fakes={"cmake": fake}))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            builds[profile] = [line for line in log.read_text().splitlines()
                               if line.startswith("--build")]
        self.assertEqual(len(builds["run"]), 1, builds)
        self.assertTrue(builds["run"][0].endswith(" --target kpack_cli"), builds)
        self.assertEqual(len(builds["test"]), 1, builds)
        self.assertNotIn("--target", builds["test"][0])

    def test_probe_covers_every_package_the_build_finds(self):
        probe = (ROOT / "cmake" / "probe" / "CMakeLists.txt").read_text()
        probed = set(re.findall(r"kpack-probe|find_package\((\w+)", probe)) - {""}
        probed |= set(re.search(r"foreach\(package ([^)]*)\)", probe).group(1).split())
        used = set()
        # The repository's own files (not a venv, a build tree or a carried folder beside
        # them): git's list where there is one.
        try:
            tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                     text=True, check=True).stdout.split()
            files = [ROOT / name for name in tracked]
        except (OSError, subprocess.CalledProcessError):
            files = list(ROOT.rglob("*"))
        for f in files:
            rel = f.relative_to(ROOT).parts
            if rel[0] in ("examples", ".git") or rel[0].startswith("build") or \
                    rel[:2] == ("cmake", "probe") or not f.is_file():
                continue
            if f.name == "CMakeLists.txt" or f.name.endswith((".cmake", ".cmake.in")):
                text = f.read_text()
                used |= set(re.findall(r"find_(?:package|dependency)\((\w+)", text))
                used |= {"lib" + n for n in re.findall(r"find_library\([^)]*NAMES (\w+)", text)}
        # Python3 is optional (GPU-tier scripts); Python and nanobind are found only when
        # pip builds the extension (KPACK_BUILD_PYTHON), with the build requirements that
        # pyproject.toml pins; kpack is the package itself.
        probed |= {"lib" + n for n in re.findall(r"find_library\([^)]*NAMES (\w+)", probe)}
        self.assertEqual(sorted(used - probed - {"Python3", "Python", "nanobind", "kpack"}), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
