# SPDX-License-Identifier: Apache-2.0
"""The installed package: version from version.h, the library it loaded.

DLSYNC_EXPECT_BUNDLED=1 (CI, gpu-check.sh after installing the wheel) also
asserts that the libdlsync.so inside the package was the one loaded, and that
the package did not come from the source tree."""
import os
import re
import sys
import unittest
import unittest.mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # source tree fallback
import dlsync  # noqa: E402


class PackageTest(unittest.TestCase):
    def test_version_is_the_library_version(self):
        self.assertRegex(dlsync.__version__, r"^\d+\.\d+\.\d+(\.dev\d+)?$")
        self.assertEqual(dlsync.__version__, dlsync.version())

    def test_library_path_names_a_file(self):
        self.assertTrue(os.path.isfile(dlsync.library_path()) or "/" not in dlsync.library_path())

    @unittest.skipUnless(os.environ.get("DLSYNC_EXPECT_BUNDLED") == "1", "not an installed-package run")
    def test_bundled_library_loaded(self):
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        self.assertNotIn("DLSYNC_LIBRARY", os.environ)
        self.assertEqual(os.path.dirname(os.path.abspath(dlsync.library_path())), pkg)
        self.assertFalse(os.path.isfile(os.path.join(pkg, "..", "..", "include", "dlsync", "version.h")))
        # not python/dlsync of a source tree (python/tests is its sibling there)
        self.assertFalse(os.path.isfile(os.path.join(pkg, "..", "tests", "test_binding.py")), pkg)
        self.assertTrue(re.match(r"^\d", dlsync.__version__))


if __name__ == "__main__":
    unittest.main()


class BuildAgainst(unittest.TestCase):
    """get_include / get_cmake_dir / get_pkgconfig_dir on the wheel's layout
    (made here in a temporary folder), on an editable install's (the layout
    in another entry of __path__), and on this run's own package."""

    def setUp(self):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def wheel_layout(self, name):
        d = os.path.join(self.tmp.name, name, "dlsync")
        for sub, f in (("include/dlsync", "dlsync.h"), ("lib/cmake/dlsync", "dlsyncConfig.cmake"),
                       ("lib/pkgconfig", "dlsync.pc")):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
            open(os.path.join(d, sub, f), "w").close()
        return d

    def with_path(self, path):
        from unittest import mock

        return mock.patch.object(dlsync, "__path__", path)

    def test_the_wheel_layout(self):
        d = self.wheel_layout("site")
        with self.with_path([d]):
            self.assertEqual(dlsync.get_include(), os.path.join(d, "include"))
            self.assertEqual(dlsync.get_cmake_dir(), os.path.join(d, "lib", "cmake", "dlsync"))
            self.assertEqual(dlsync.get_pkgconfig_dir(), os.path.join(d, "lib", "pkgconfig"))

    def test_an_editable_install_finds_them_in_another_entry_of_the_path(self):
        src = os.path.join(self.tmp.name, "src", "dlsync")
        os.makedirs(src)
        d = self.wheel_layout("site")
        with self.with_path([src, d]):
            self.assertEqual(dlsync.get_include(), os.path.join(d, "include"))
            self.assertEqual(dlsync.get_cmake_dir(), os.path.join(d, "lib", "cmake", "dlsync"))
        from dlsync import _loader

        with self.with_path([src, d]), \
                unittest.mock.patch.dict(os.environ, {"DLSYNC_LIBRARY": ""}):
            names = _loader.candidates(dlsync.__path__)
        self.assertEqual(names[:2], [os.path.join(src, "libdlsync.so"),
                                     os.path.join(d, "libdlsync.so")])

    def test_none_there_is_a_clear_error(self):
        empty = os.path.join(self.tmp.name, "empty", "dlsync")
        os.makedirs(empty)
        with self.with_path([empty]):
            for fn, words in ((dlsync.get_include, "headers"),
                              (dlsync.get_cmake_dir, "CMake package"),
                              (dlsync.get_pkgconfig_dir, "pkg-config file")):
                with self.assertRaises(FileNotFoundError) as info:
                    fn()
                self.assertIn(words, str(info.exception))
                self.assertIn(empty, str(info.exception))

    def test_this_package_answers_with_what_it_holds(self):
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        for fn, f in ((dlsync.get_include, os.path.join("dlsync", "dlsync.h")),
                      (dlsync.get_cmake_dir, "dlsyncConfig.cmake"),
                      (dlsync.get_pkgconfig_dir, "dlsync.pc")):
            try:
                found = fn()
            except FileNotFoundError as e:
                # Neither the wheel's layout nor (for the headers) a source tree.
                self.assertIn("cmake --install", str(e))
                self.assertIn(pkg, str(e))
            else:
                self.assertTrue(os.path.isfile(os.path.join(found, f)), found)
        if os.path.isfile(os.path.join(pkg, "..", "..", "include", "dlsync", "version.h")):
            self.assertEqual(os.path.realpath(dlsync.get_include()),
                             os.path.realpath(os.path.join(pkg, "..", "..", "include")))


class PythonDashM(unittest.TestCase):
    """python -m dlsync: dlsync-info's lines, or the library's summary."""

    def run_module(self, *args):
        import subprocess

        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dlsync.__file__)))
        env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
        return subprocess.run([sys.executable, "-m", "dlsync", *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=120)

    def test_it_prints_the_version_first(self):
        done = self.run_module()
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.splitlines()[0], f"dlsync {dlsync.version()}")
        self.assertRegex(done.stdout, r"(?m)^driver: ")

    def test_selftest_runs_the_program_or_says_it_needs_it(self):
        from dlsync import __main__ as m

        done = self.run_module("--selftest")
        if m.info_program() is None:
            self.assertEqual(done.returncode, 2)
            self.assertIn("--selftest needs the dlsync-info program", done.stderr)
        else:  # 77: no GPU, nothing tested
            self.assertIn(done.returncode, (0, 77), done.stdout + done.stderr)
            self.assertIn("selftest", done.stdout)

    def test_the_summary_without_the_program(self):
        import contextlib
        import io
        from unittest import mock

        from dlsync import __main__ as m

        out = io.StringIO()
        with mock.patch.object(m, "info_program", return_value=None), \
                contextlib.redirect_stdout(out):
            self.assertEqual(m.main([]), 0)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], f"dlsync {dlsync.version()}")
        self.assertTrue(lines[1].startswith(f"library: {dlsync.library_path()} ("), lines[1])
        self.assertTrue(lines[2].startswith("driver: "), lines[2])
        self.assertTrue(any(ln.startswith(("GPUs: ", "GPU 0: ")) for ln in lines[2:]), lines)
        err = io.StringIO()
        with mock.patch.object(m, "info_program", return_value=None), \
                contextlib.redirect_stderr(err):
            self.assertEqual(m.main(["--json"]), 2)
        self.assertIn("need the dlsync-info program", err.getvalue())


class PublicNames(unittest.TestCase):
    def test_every_name_of_the_api_is_there(self):
        for name in ("Error", "version", "exchange", "wrap", "scope", "Fence", "stream_handle",
                     "capture_state", "LEGACY", "PER_THREAD", "library_path", "CAPTURE_STABLE",
                     "__version__", "get_include", "get_cmake_dir", "get_pkgconfig_dir"):
            self.assertTrue(hasattr(dlsync, name), name)
        for name in dlsync.__all__:
            self.assertTrue(hasattr(dlsync, name), name)
        self.assertEqual((dlsync.LEGACY, dlsync.PER_THREAD, dlsync.CAPTURE_STABLE), (1, 2, 1))
        self.assertTrue(issubclass(dlsync.Error, RuntimeError))

    def test_the_package_is_typed(self):
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        self.assertTrue(os.path.isfile(os.path.join(pkg, "py.typed")))
