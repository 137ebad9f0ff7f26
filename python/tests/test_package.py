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


class Loader(unittest.TestCase):
    """Which libdlsync `import dlsync` loads, in a child interpreter."""

    def run_import(self, env_extra, pythonpath, drop=("DLSYNC_LIBRARY",)):
        import subprocess

        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(env_extra, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=pythonpath,
                   DLSYNC_NO_NATIVE="1")
        return subprocess.run(
            [sys.executable, "-c", "import dlsync; print(dlsync.library_path())"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    def source_tree(self, tmp, builds):
        """A source tree in tmp: python/dlsync, include/dlsync/version.h and
        build folders ({folder: CMakeCache.txt text}) holding this libdlsync."""
        import shutil

        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        shutil.copytree(pkg, os.path.join(tmp, "python", "dlsync"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "lib", "include",
                                                      "bin"))
        os.makedirs(os.path.join(tmp, "include", "dlsync"))
        open(os.path.join(tmp, "include", "dlsync", "version.h"), "w").close()
        for folder, cache in builds.items():
            os.makedirs(os.path.join(tmp, folder))
            shutil.copy(dlsync.library_path(), os.path.join(tmp, folder, "libdlsync.so"))
            with open(os.path.join(tmp, folder, "CMakeCache.txt"), "w") as f:
                f.write(cache)
        return os.path.join(tmp, "python")

    def test_a_tree_with_only_a_sanitizer_build_is_an_import_error_naming_it(self):
        import ctypes.util
        import tempfile

        if ctypes.util.find_library("dlsync"):
            self.skipTest("a libdlsync on the loader's path would be found after the tree")
        with tempfile.TemporaryDirectory() as tmp:
            path = self.source_tree(tmp, {os.path.join("build", "asan"):
                                          "CMAKE_BUILD_TYPE:STRING=Debug\n"
                                          "DLSYNC_SANITIZE:BOOL=ON\n"})
            done = self.run_import({}, path)
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertIn("ImportError", done.stderr)
        self.assertIn(os.path.join("build", "asan", "libdlsync.so") + ": skipped, a sanitizer "
                      "build (DLSYNC_SANITIZE:BOOL=ON in its CMakeCache.txt)", done.stderr)

    def test_the_release_build_is_taken_over_a_sanitizer_build(self):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            asan, release = os.path.join("build", "asan"), os.path.join("build", "release")
            path = self.source_tree(tmp, {"build": "DLSYNC_TSAN:BOOL=ON\n",
                                          asan: "DLSYNC_SANITIZE:BOOL=ON\n",
                                          release: "DLSYNC_SANITIZE:BOOL=OFF\n"})
            done = self.run_import({}, path)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(done.stdout.strip().endswith(
            os.path.join("build", "release", "libdlsync.so")), done.stdout)

    def test_a_library_that_names_a_sanitizer_runtime_is_passed_over(self):
        from dlsync import _loader
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            lib = os.path.join(tmp, "libdlsync.so")
            with open(lib, "wb") as f:
                f.write(b"\x7fELF...libtsan.so.2\0...")
            self.assertEqual(_loader.sanitizer_build(lib),
                             "a sanitizer build (it needs libtsan.so)")
            with open(lib, "wb") as f:
                f.write(b"\x7fELF...libc.so.6\0...")
            self.assertIsNone(_loader.sanitizer_build(lib))

    def test_dlsync_library_naming_another_library_is_an_import_error(self):
        other = os.environ.get("DLSYNC_TEST_FAKE_LIBCUDA")
        if not other:
            import ctypes.util

            other = ctypes.util.find_library("m")
        if not other:
            self.skipTest("no other shared library at hand")
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dlsync.__file__)))
        done = self.run_import({"DLSYNC_LIBRARY": other}, pkg_parent, drop=())
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertNotIn("AttributeError", done.stderr)
        self.assertIn("ImportError: DLSYNC_LIBRARY is set and could not be loaded as libdlsync",
                      done.stderr)
        self.assertIn(f"{other}: loaded, but it is not libdlsync (no dlsync_version_string)",
                      done.stderr)


class PathFlags(unittest.TestCase):
    """python -m dlsync --include-dir / --cmake-dir / --pkgconfig-dir."""

    def test_each_flag_prints_its_folder_or_says_why_not(self):
        run = PythonDashM.run_module
        for flag, fn in (("--include-dir", dlsync.get_include),
                         ("--cmake-dir", dlsync.get_cmake_dir),
                         ("--pkgconfig-dir", dlsync.get_pkgconfig_dir)):
            with self.subTest(flag=flag):
                done = run(self, flag)
                try:
                    want = fn()
                except FileNotFoundError as e:
                    self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
                    self.assertEqual(done.stdout, "")
                    self.assertEqual(done.stderr, f"python -m dlsync {flag}: {e}\n")
                else:
                    self.assertEqual(done.returncode, 0, done.stderr)
                    self.assertEqual(done.stdout, want + "\n")

    def test_the_include_dir_holds_the_header(self):
        done = PythonDashM.run_module(self, "--include-dir")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(os.path.isfile(os.path.join(done.stdout.strip(), "dlsync", "dlsync.h")))

    def test_several_flags_one_line_each_in_order(self):
        from unittest import mock

        from dlsync import __main__ as m

        with mock.patch.dict(m._PATH_FLAGS, {"--cmake-dir": lambda: "/c",
                                             "--pkgconfig-dir": lambda: "/p",
                                             "--include-dir": lambda: "/i"}):
            import contextlib
            import io

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(m.main(["--pkgconfig-dir", "--include-dir", "--cmake-dir"]), 0)
        self.assertEqual(out.getvalue(), "/p\n/i\n/c\n")

    def test_a_flag_with_other_options_is_refused(self):
        done = PythonDashM.run_module(self, "--include-dir", "--json")
        self.assertEqual(done.returncode, 2)
        self.assertIn("go alone, not with --json", done.stderr)


class NoToolkitHint(unittest.TestCase):
    """The message the configure step stops with where no cuda.h is found
    (cmake/dlsyncCudaHeaders.cmake), run in CMake's script mode."""

    def test_it_names_every_package_the_build_without_isolation_needs(self):
        import shutil
        import subprocess
        import tempfile

        cmake = shutil.which("cmake")
        if cmake is None:
            self.skipTest("no cmake")
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        module = os.path.join(root, "cmake", "dlsyncCudaHeaders.cmake")
        if not os.path.isfile(module):
            self.skipTest("not run from a source tree (no cmake/dlsyncCudaHeaders.cmake)")
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "hint.cmake")
            with open(script, "w") as f:
                f.write(f'set(Python_EXECUTABLE "{tmp}/no-python")\n'
                        f'include("{module}")\ndlsync_find_cuda_headers()\n')
            env = {k: v for k, v in os.environ.items()
                   if k not in ("DLSYNC_CUDA_INCLUDE", "CUDA_HOME", "CUDA_PATH")}
            env["DLSYNC_IGNORE_CUDA_TOOLKIT"] = "1"
            done = subprocess.run([cmake, "-P", script], env=env, capture_output=True,
                                  text=True, timeout=60)
        self.assertNotEqual(done.returncode, 0)
        text = " ".join(done.stderr.split())
        self.assertIn("found none", text)
        # --no-build-isolation builds with what is installed: the build backend too.
        before, _, _ = text.partition("pip install --no-build-isolation .")
        self.assertIn("pip install scikit-build-core nvidia-cuda-runtime", before, text)


TYPED_USE = """
from typing import List, Optional

import dlsync
from dlsync import __version__, library_path


def use(a: object, b: object, body: int) -> None:
    text: str = __version__ + library_path() + dlsync.version() + dlsync.capture_state(a)
    handle: int = dlsync.stream_handle(a)
    with dlsync.exchange(a, b, capture_stable=True):
        pass
    producers: List[object] = [a, b]
    with dlsync.exchange(producers, b):
        pass
    with dlsync.scope():
        wrapped = dlsync.wrap(a, producer=b)
    fence = dlsync.Fence(a)
    fence.wait(b)
    fence.close()
    imported = dlsync.Fence.from_event(handle, provenance=dlsync.Provenance.EAGER)
    event: int = imported.event()
    prov: Optional[dlsync.Provenance] = imported.provenance
    also = dlsync.Fence.from_event(event, provenance="captured", capture_id=dlsync.capture_id(a))
    graph: Optional[int] = dlsync.capture_graph(a)
    dlsync.launch(graph, b)
    declared: bool = dlsync.is_conditional_body(body)
    with dlsync.conditional_body(body) as g:
        inside: int = g
    with dlsync.exchange(a, consumers=[b, a], keep_edge_data=True):
        pass
    dlsync.order(a, b)
    with dlsync.conditional_node(body, body, [body]) as bodies:
        first: int = bodies[0]
    more: int = dlsync.KEEP_EDGE_DATA
    where: str = dlsync.get_include() + dlsync.get_cmake_dir() + dlsync.get_pkgconfig_dir()
    flags: int = dlsync.LEGACY | dlsync.PER_THREAD | dlsync.CAPTURE_STABLE
    out = dlsync.arrow.export_device_array(body, 4, "f", a, release=lambda: None, device_id=0)
    with dlsync.arrow.import_device_array(out, b, provenance="external_record") as arr:
        data: Optional[int] = arr.buffers[1]
        length: int = arr.length + arr.device_id + arr.device_type
        fmt: str = arr.format
        arr.wait(a)
    pair = out.__arrow_c_device_array__()
    dlsync.arrow.import_device_array(pair, b).release(a)
    try:
        pass
    except dlsync.Error as e:
        status: str = e.status + e.message
"""


def _has_mypy():
    try:
        import mypy  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_has_mypy(), "mypy is not installed here (pip install mypy runs this check)")
class TypeChecked(unittest.TestCase):
    """The public API as a type checker sees it: mypy --strict on a use of
    every public name, with no expression of type Any (--disallow-any-expr)."""

    def test_the_package_passes_mypy_strict(self):
        import subprocess

        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dlsync.__file__)))
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
             os.devnull, "-p", "dlsync"],
            cwd=pkg_parent, capture_output=True, text=True, timeout=600)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_the_public_api_is_typed_and_exported(self):
        import subprocess
        import tempfile

        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dlsync.__file__)))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "use_dlsync.py")
            with open(path, "w") as f:
                f.write(TYPED_USE)
            env = dict(os.environ, MYPYPATH=pkg_parent)
            done = subprocess.run(
                [sys.executable, "-m", "mypy", "--strict", "--disallow-any-expr",
                 "--follow-imports=silent", "--no-incremental", "--cache-dir", os.devnull,
                 "--warn-unused-ignores", path],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)


class PublicNames(unittest.TestCase):
    def test_every_name_of_the_api_is_there(self):
        for name in ("Error", "version", "exchange", "wrap", "scope", "Fence", "Provenance",
                     "capture_id", "stream_handle",
                     "capture_state", "LEGACY", "PER_THREAD", "library_path", "CAPTURE_STABLE",
                     "KEEP_EDGE_DATA", "order", "conditional_node",
                     "__version__", "get_include", "get_cmake_dir", "get_pkgconfig_dir"):
            self.assertTrue(hasattr(dlsync, name), name)
        for name in dlsync.__all__:
            self.assertTrue(hasattr(dlsync, name), name)
        for name in ("library_path", "__version__"):
            self.assertIn(name, dlsync.__all__)
        self.assertEqual((dlsync.LEGACY, dlsync.PER_THREAD, dlsync.CAPTURE_STABLE), (1, 2, 1))
        self.assertTrue(issubclass(dlsync.Error, RuntimeError))

    def test_the_package_is_typed(self):
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        self.assertTrue(os.path.isfile(os.path.join(pkg, "py.typed")))
