# SPDX-License-Identifier: Apache-2.0
"""python/bench/bench_python.py without a GPU: its skip lines, its result
lines, the order of its rows, and the in-place build of dlsync._native it
makes before measuring (with CMake, and with the C compiler alone), into a
temporary folder. Plain unittest."""
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "bench", "bench_python.py")
spec = importlib.util.spec_from_file_location("bench_python", BENCH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _run_main(argv, modules):
    out = io.StringIO()
    with mock.patch.dict(sys.modules, modules), contextlib.redirect_stdout(out):
        rc = bench.main(argv)
    return rc, out.getvalue()


class SkipLines(unittest.TestCase):
    def test_without_torch_one_skip_line_and_status_0(self):
        rc, out = _run_main([], {"torch": None})
        self.assertEqual(rc, 0)
        self.assertEqual(out.splitlines(), [out.strip()])
        self.assertTrue(out.startswith("bench_python: skipped (no torch"), out)

    def test_without_a_gpu_one_skip_line_and_status_0(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
        rc, out = _run_main([], {"torch": torch})
        self.assertEqual(rc, 0)
        self.assertIn("skipped (no CUDA GPU", out)

    def test_as_a_script_without_torch(self):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        done = subprocess.run([sys.executable, "-c",
                               "import sys, runpy; sys.modules['torch'] = None; "
                               f"sys.argv = [{BENCH!r}]; runpy.run_path({BENCH!r}, "
                               "run_name='__main__')"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout)
        self.assertIn("skipped", done.stdout)


class ResultLines(unittest.TestCase):
    def test_median_of_the_ratios_with_the_range_and_the_target(self):
        self.assertEqual(bench.summary([0.3, 0.1, 0.2]), (0.2, 0.1, 0.3))
        line = bench.row_line("x", 1.5, 6.0, [0.2, 0.25, 0.3], 0.5)
        self.assertIn("0.25  [0.20-0.30]", line)
        self.assertTrue(line.endswith("<= 0.50 ok"), line)
        self.assertIn("<= 1.20 MISSED", bench.row_line("y", 9.0, 6.0, [1.5, 1.4, 1.6], 1.2))
        self.assertIn("(no target)", bench.row_line("z", 1.0, 2.0, [0.5], None))
        self.assertEqual(bench.verdict(0.5, 0.5), "ok")

    def test_paired_rounds_alternate_and_pair(self):
        calls = []
        ns = {"log": calls}
        cand, base, ratios = bench.paired("log.append('b')", "log.append('c')", ns, rounds=3,
                                          batches=2, ops=5)
        self.assertEqual(len(cand), 3)
        self.assertEqual(len(ratios), 3)
        # warm-up (5 + 5), then per round: b c, c b
        self.assertEqual(calls[10:20], list("bbbbbccccc") + [])
        self.assertEqual(calls[20:30], list("cccccbbbbb"))
        for c, b, r in zip(cand, base, ratios):
            self.assertAlmostEqual(r, c / b)


class RowOrder(unittest.TestCase):
    """main() with rows faked: the header, every row with its target, the
    ctypes row from the child, the cupy row skipped without cupy."""

    def test_rows(self):
        torch = types.SimpleNamespace(
            __version__="0-fake",
            cuda=types.SimpleNamespace(is_available=lambda: True, init=lambda: None,
                                       get_device_name=lambda: "no GPU (a test)"))
        result = {"native": True, "why": None, "cand": [1.0], "base": [4.0], "ratios": [0.25]}
        ctypes_result = dict(result, native=False, why="DLSYNC_NO_NATIVE is set",
                             cand=[9.0], ratios=[2.25])
        dlsync = types.SimpleNamespace(_native_active=lambda: True, _native_error=None,
                                       _native=types.SimpleNamespace(__file__="_native.abi3.so"),
                                       __version__="0.1.0", __file__="dlsync/__init__.py",
                                       library_path=lambda: "libdlsync.so")
        with mock.patch.object(bench, "ensure_native", return_value="in place, up to date"), \
                mock.patch.object(bench, "_import_dlsync", return_value=dlsync), \
                mock.patch.object(bench, "_exchange_row", return_value=result), \
                mock.patch.object(bench, "_floor_row", return_value=dict(result, ratios=[0.1])), \
                mock.patch.object(bench, "_ctypes_row", return_value=ctypes_result), \
                mock.patch.object(bench, "_wrap_row",
                                  return_value=dict(result, cand=[5.0], ratios=[1.25])):
            rc, out = _run_main(["--no-pin"], {"torch": torch, "cupy": None})
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        self.assertIn("binding: native (_native.abi3.so)", lines[1])
        rows = [ln for ln in lines if ln.startswith("  ")]
        self.assertEqual(len(rows), 5, out)
        self.assertIn("[native]", rows[0])
        self.assertTrue(rows[0].rstrip().endswith("<= 0.50 ok"), rows[0])
        self.assertIn("[ctypes fallback]", rows[1])
        self.assertIn("<= 0.50 MISSED  (the fallback", rows[1])
        self.assertIn("(no target)", rows[2])
        self.assertIn("torch.from_dlpack(dlsync.wrap(x))", rows[3])
        self.assertIn("<= 1.20 MISSED", rows[3])
        self.assertIn("cupy.from_dlpack(dlsync.wrap(x))", rows[4])
        self.assertIn("skipped: no cupy", rows[4])

    def test_a_row_that_fails_is_reported_and_sets_the_status(self):
        torch = types.SimpleNamespace(
            __version__="0-fake",
            cuda=types.SimpleNamespace(is_available=lambda: True, init=lambda: None,
                                       get_device_name=lambda: "no GPU (a test)"))
        dlsync = types.SimpleNamespace(_native_active=lambda: False, _native_error="why not",
                                       __version__="0.1.0", __file__="x", library_path=lambda: "y")
        with mock.patch.object(bench, "ensure_native", return_value="build failed"), \
                mock.patch.object(bench, "_import_dlsync", return_value=dlsync), \
                mock.patch.object(bench, "_exchange_row", side_effect=RuntimeError("boom")), \
                mock.patch.object(bench, "_ctypes_row", side_effect=RuntimeError("child")), \
                mock.patch.object(bench, "_wrap_row", side_effect=RuntimeError("wrap")):
            rc, out = _run_main(["--no-pin"], {"torch": torch, "cupy": None})
        self.assertEqual(rc, 1)
        self.assertIn("binding: ctypes (why not)", out)
        self.assertIn("ERROR: RuntimeError: boom", out)
        self.assertNotIn("the floor", out)  # no native module: no floor row


class InPlaceBuild(unittest.TestCase):
    def _loads(self, folder):
        built = bench.native_files(folder)
        self.assertEqual(len(built), 1, built)
        self.assertTrue(built[0].endswith(".abi3.so"), built)
        code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location("
                f"'dlsync._native', {built[0]!r}); m = importlib.util.module_from_spec(s); "
                "s.loader.exec_module(m); print(m.ABI, len(m.SYMBOLS))")
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stdout)
        # The ABI the package beside this source expects (dlsync/_backend.py's NATIVE_ABI).
        with open(os.path.join(HERE, "..", "dlsync", "_backend.py")) as f:
            abi = re.search(r"^NATIVE_ABI = (\d+)", f.read(), re.M).group(1)
        self.assertEqual(done.stdout.split()[0], abi, done.stdout)

    @unittest.skipUnless(shutil.which("cmake"), "no cmake")
    def test_cmake_builds_the_module_where_asked(self):
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as build:
            log = []
            self.assertTrue(bench.build_with_cmake(out, build, log), "\n".join(log))
            self._loads(out)
            self.assertTrue(bench.native_is_current(bench.native_files(out), bench.native_inputs()))

    @unittest.skipUnless(shutil.which("cc") or shutil.which("gcc"), "no C compiler")
    def test_the_compiler_alone_builds_it_too(self):
        with tempfile.TemporaryDirectory() as out:
            log = []
            self.assertTrue(bench.build_with_cc(out, log), "\n".join(log))
            self._loads(out)
            self.assertEqual(os.listdir(out), ["_native.abi3.so"])  # no temporary left

    def test_a_module_older_than_its_sources_is_rebuilt(self):
        with tempfile.TemporaryDirectory() as d:
            src, so = os.path.join(d, "_native.c"), os.path.join(d, "_native.abi3.so")
            for f in (src, so):
                open(f, "w").close()
            os.utime(src, (100, 100))
            os.utime(so, (200, 200))
            self.assertTrue(bench.native_is_current([so], [src]))
            os.utime(src, (300, 300))
            self.assertFalse(bench.native_is_current([so], [src]))
            self.assertFalse(bench.native_is_current([], [src]))

    def test_build_only_needs_no_torch(self):
        with mock.patch.object(bench, "ensure_native", return_value="built in place now"):
            rc, out = _run_main(["--build-native"], {"torch": None})
        self.assertEqual(rc, 0)
        self.assertIn("dlsync._native built in place now", out)
        with mock.patch.object(bench, "ensure_native", return_value="build failed (log)"):
            rc, out = _run_main(["--build-native"], {"torch": None})
        self.assertEqual(rc, 1)

    def test_no_native_means_no_build(self):
        with mock.patch.dict(os.environ, {"DLSYNC_NO_NATIVE": "1"}), \
                mock.patch.object(bench, "build_with_cmake") as cmake:
            self.assertIn("DLSYNC_NO_NATIVE", bench.ensure_native())
        cmake.assert_not_called()


if __name__ == "__main__":
    unittest.main()
