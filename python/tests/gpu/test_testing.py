# SPDX-License-Identifier: Apache-2.0
"""dlsync.testing's own tests on a GPU: the harness against real ops, good and
broken.

Each test runs check_capture on a correct op and on a broken one. A table row
(conftest.py prints them) is one case of the harness: `runs wrong broke` for
the correct op, `ctl-w ctl-b` for the broken one, counted only where the
harness gave the diagnosis the test expects (a wrong diagnosis shows as a
control that did not fail, and the note says what the harness said). The
controls' notes print the harness's headline and what CUDA said.

Run: python3 -m pytest -q python/tests/gpu  (DLSYNC_LIBRARY=.../libdlsync.so,
KERNEL_LIB=.../libkernel_lib.so for the example library's case), or
python/run_gpu_suite.sh.
"""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, PYTHON_DIR)
import dlsync  # noqa: E402
from dlsync.testing import check_capture  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

N = 1 << 20
MODES = ("global", "thread_local", "relaxed")


def _check(fn, *inputs, **kw):
    report = check_capture(fn, *inputs, raise_on_failure=False, **kw)
    print(report.message())  # shown by pytest -s, and on failure
    where = os.environ.get("DLSYNC_REPORT_FILE")  # the GPU check keeps every report
    if where:
        with open(where, "a") as f:
            f.write(report.message() + "\n\n")
    return report


def _rows(record, label, good, bad, expect):
    """Table rows for the cases where the broken op must fail; ``expect``
    maps a case name to the diagnosis categories allowed for the broken op
    (None: it must pass that case). Every case of the correct op must pass.
    Raises one AssertionError naming every problem after all rows are in."""
    problems = []
    for g in good.cases:
        if not g.ok:
            problems.append(f"{label}: the correct op failed [{g.name}]: "
                            f"{g.diagnosis.headline} ({g.diagnosis.said})")
    for b in bad.cases:
        allowed = expect(b.name)
        d = b.diagnosis
        if allowed is None:
            if d is not None:
                problems.append(f"{label}: the broken op should pass [{b.name}], the harness "
                                f"said: {d.headline} ({d.said})")
            continue
        right = d is not None and d.category in allowed
        if d is None:
            note = "passed: the harness did not catch it"
        else:
            note = f"{d.headline} | {d.said}" if right else (
                f"WRONG DIAGNOSIS {d.category!r} (expected {' or '.join(sorted(allowed))}): "
                f"{d.headline} | {d.said}")
        if not right:
            problems.append(f"{label} [{b.name}]: {note}")
        g = good.case(b.name)
        g_broke = int(g.captured is False or bool(g.errors))
        b_broke = int(b.captured is False or bool(b.errors) or bool(b.neighbour_errors))
        setting = "check_capture" if b.neighbour == "-" else f"beside {b.neighbour}"
        try:
            record(label, setting, b.mode, (g.runs, g.wrong_runs, g_broke, ""),
                   (b.runs, b.wrong_runs if right else 0, b_broke if right else 0, note))
        except AssertionError as e:
            problems.append(f"{label} [{b.name}]: {e}")
    assert not problems, "\n".join(problems) + "\n\n" + good.message() + "\n\n" + bad.message()


def _only(category):
    return lambda name: None if name == "eager" else {category}


# ---- a correct op (torch -> CuPy through dlsync) and the same op without dlsync ----


def _cupy_op(use_dlsync):
    cupy = pytest.importorskip("cupy")
    side = cupy.cuda.Stream(non_blocking=True)
    out = torch.zeros(N, device="cuda")
    res = cupy.from_dlpack(out)  # CuPy's view of the output, made outside any capture
    torch.cuda.synchronize()

    def torch_to_cupy(x):
        if use_dlsync:
            with dlsync.scope():
                y = x * 2 + 1
                with side:
                    cupy.multiply(cupy.from_dlpack(dlsync.wrap(y)), 3, out=res)
        else:
            y = x * 2 + 1
            with side:
                cupy.multiply(cupy.from_dlpack(y), 3, out=res)
        return out

    return torch_to_cupy


def _scaled(x):
    return (x * 2 + 1) * 3


def test_torch_to_cupy_passes_and_without_dlsync_is_unjoined_work(record):
    x = torch.zeros(N, device="cuda")
    good = _check(_cupy_op(True), x, reference=_scaled)
    bad = _check(_cupy_op(False), x, reference=_scaled)
    assert [c.name for c in good.cases] == ["eager", *MODES]
    assert all(c.runs == 3 for c in good.cases), good.message()
    _rows(record, "harness torch->CuPy", good, bad, _only("unjoined work"))
    for mode in MODES:
        d = bad.case(mode).diagnosis
        assert d.headline == "capture broke: unjoined work (cudaErrorStreamCaptureUnjoined)"
        assert "import through dlsync.wrap inside dlsync.scope()" in d.advice
        assert "a consumer stream joined the capture and was not joined back" in d.meaning
        assert "unjoined" in d.said
    msg = bad.message()
    assert msg.startswith(f"capture check of {bad.name}: 3 of 4 cases failed"), msg
    # Cases with the same diagnosis are named together.
    assert "[global, thread_local, relaxed] capture broke: unjoined work" in msg or (
        "[global] capture broke: unjoined work" in msg), msg


# ---- an op that launches on a side stream without ordering ----


def _side_op(use_dlsync):
    side = torch.cuda.Stream()
    out = torch.zeros(N, device="cuda")

    def side_stream(x):
        y = x * 2 + 1  # on the caller's stream: the graph is not empty
        if use_dlsync:
            with dlsync.exchange(torch.cuda.current_stream(), side), torch.cuda.stream(side):
                torch.mul(x, 3, out=out)
        else:
            with torch.cuda.stream(side):
                torch.mul(x, 3, out=out)
        return y, out

    return side_stream


def test_side_stream_without_ordering_is_stale_data(record):
    x = torch.zeros(N, device="cuda")
    ref = lambda x: (x * 2 + 1, x * 3)  # noqa: E731
    good = _check(_side_op(True), x, reference=ref)
    bad = _check(_side_op(False), x, reference=ref)
    _rows(record, "harness side stream", good, bad, lambda name: {"stale data"})
    eager = bad.case("eager").diagnosis
    assert eager.headline.startswith("stale data in eager call 1 of 3: output out[1]"), eager
    for mode in MODES:
        case = bad.case(mode)
        assert case.captured is True
        assert {w.output for w in case.wrong} == {"out[1]"}  # y is right, out is stale
        d = case.diagnosis
        assert d.headline.startswith("stale data after replay 1 of 3: output out[1]"), d.headline
        # The side stream never joined the capture: its kernel ran once, eagerly.
        assert "is not in the graph" in d.meaning, d.meaning
        assert "Mismatched elements" in d.said


# ---- an op that synchronises the device during capture ----


def _plain(x):
    return x * 2 + 1


def _synchronising(x):
    y = x * 2 + 1
    torch.cuda.synchronize()
    return y


def test_a_sync_during_capture_is_reported_as_such(record):
    x = torch.zeros(N, device="cuda")
    good = _check(_plain, x)
    bad = _check(_synchronising, x, reference=_plain)
    _rows(record, "harness device sync", good, bad, _only("sync during capture"))
    for mode in MODES:
        d = bad.case(mode).diagnosis
        assert d.headline == ("capture broke: sync during capture "
                              "(cudaErrorStreamCaptureUnsupported)"), d.headline
        assert "not permitted when stream is capturing" in d.said, d.said
        assert "test_testing.py" in d.where and "torch.cuda.synchronize()" in d.where, d.where


# ---- the example C kernel library (dlsync inside) ----


def _kernel_lib():
    path = os.environ.get("KERNEL_LIB")
    if not path or not os.path.exists(path):
        pytest.skip("KERNEL_LIB not built")
    lib = ctypes.CDLL(path)
    lib.kl_scale.restype = ctypes.c_int
    lib.kl_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_float,
                             ctypes.c_void_p, ctypes.c_int]
    lib.kl_last_error.restype = ctypes.c_char_p
    assert lib.kl_init() == 0
    return lib


def _library_op(lib, use_dlsync):
    out = torch.zeros(N, device="cuda")

    def kernel_library(x):
        y = x * 2 + 1
        rc = lib.kl_scale(out.data_ptr(), y.data_ptr(), N, 3.0,
                          torch.cuda.current_stream().cuda_stream, 1 if use_dlsync else 0)
        if rc != 0:
            raise RuntimeError(lib.kl_last_error().decode())
        return out

    return kernel_library


def test_the_example_kernel_library_passes(record):
    lib = _kernel_lib()
    x = torch.zeros(N, device="cuda")
    good = _check(_library_op(lib, True), x, reference=_scaled)
    bad = _check(_library_op(lib, False), x, reference=_scaled)
    _rows(record, "harness kernel lib", good, bad, lambda name: {"stale data"})
    assert good.ok


# ---- neighbours: another thread exchanging eagerly, or capturing in GLOBAL mode ----


def _querying_op():
    other = torch.cuda.Stream()

    def stream_query(x):
        y = x * 2 + 1
        other.query()  # cudaStreamQuery: unsafe during a GLOBAL capture, anywhere
        return y

    return stream_query


def test_neighbours_pass_a_correct_op_and_catch_an_unsafe_call(record):
    x = torch.zeros(N, device="cuda")
    good = _check(_cupy_op(True), x, reference=_scaled, modes=("global", "relaxed"),
                  neighbour=(None, "eager", "capture"))
    bad = _check(_querying_op(), x, reference=_plain, modes=("global", "relaxed"),
                 neighbour=(None, "eager", "capture"))
    # RELAXED allows the query on the capturing thread; a GLOBAL capture of
    # any thread forbids it (DESIGN.md section 4).
    expect = {
        "eager": None,
        "global": {"sync during capture"},
        "global+eager": {"sync during capture"},
        "global+capture": {"sync during capture"},
        "relaxed": None,
        "relaxed+eager": None,
        "relaxed+capture": {"sync during capture", "neighbour"},
    }
    assert sorted(c.name for c in bad.cases) == sorted(expect)
    _rows(record, "harness neighbours", good, bad, expect.get)


# ---- torch.compile(mode="reduce-overhead") ----


def test_compiled_with_cuda_graphs_passes():
    x = torch.zeros(N, device="cuda")
    report = _check(_plain, x, modes=(), compile=True)
    assert [c.name for c in report.cases] == ["eager", "compile"]
    assert report.case("compile").runs == 5  # warm-up, record, three replays
    assert report.ok, report.message()


# ---- the pytest plugin, in a pytest of its own ----

PLUGIN_CASES = '''
import pytest
import torch

@pytest.fixture
def x():
    return torch.zeros(1 << 16, device="cuda")

@pytest.mark.capture_modes("global", "relaxed", replays=2)
def test_good_body(x):
    return x * 2 + 1

@pytest.mark.capture_modes("global")
def test_syncing_body(x):
    y = x * 2 + 1
    torch.cuda.synchronize()
    return y

@pytest.mark.capture_modes("relaxed", isolate=True)
def test_isolated_body(x):
    return x * 3

@pytest.mark.capture_modes("thread_local", replays=2)
def test_fixture(capture_check):
    report = capture_check(lambda t: t + 1, torch.zeros(64, device="cuda"))
    assert [c.name for c in report.cases] == ["eager", "thread_local"]
'''


def _installed_entry_point():
    from importlib.metadata import entry_points

    return any(ep.value == "dlsync.testing.pytest_plugin"
               for ep in entry_points(group="pytest11"))


def test_the_pytest_plugin_runs_marked_tests(tmp_path):
    (tmp_path / "test_cases.py").write_text(textwrap.dedent(PLUGIN_CASES))
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    # Installed, the entry point loads the plugin; -p as well would register it twice.
    plugin = [] if _installed_entry_point() else ["-p", "dlsync.testing.pytest_plugin"]
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider",
                          "-q", f"--dlsync-report={report}", "test_cases.py"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    print(out)
    assert "1 failed, 3 passed" in out, out
    import json

    records = json.loads(report.read_text())["records"]
    by = {(r["test"].split("::")[-1], r["case"]): r for r in records}
    bad = by[("test_syncing_body", "global")]
    assert (bad["verdict"], bad["category"]) == ("failed", "sync during capture"), bad
    assert "torch.cuda.synchronize()" in bad["where"], bad
    assert any("default generator out of capture mode" in x for x in bad["restored"]), bad
    assert by[("test_isolated_body", "relaxed")]["isolated"] is True, records
    assert by[("test_isolated_body", "relaxed")]["verdict"] == "ok", records
    assert by[("test_good_body", "global")]["isolated"] is False, records
    assert "FAILED test_cases.py::test_syncing_body" in out, out
    assert "capture broke: sync during capture (cudaErrorStreamCaptureUnsupported)" in out, out
    assert "dlsync capture conformance" in out, out
