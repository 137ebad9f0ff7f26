# SPDX-License-Identifier: Apache-2.0
"""dlsync.testing inside a kernel library's test suite, on a GPU: one broken
op must not break the rest.

The ops here are written as a kernel library's author would write them (a
lookup table behind an event, a statistic on a side stream, a Triton kernel,
a CuPy elementwise kernel, a normalisation by the maximum ...), not taken
from the harness's own examples. For every category of the diagnosis table
one broken op must be caught with that category (and, where one of its calls
raised, ``where`` must name that line of this file); right after it, in the
same process, a correct op's check must pass and plain PyTorch must work: a
random draw on the GPU, a ``torch.cuda.graph`` capture of its own (with a
random draw inside) and a ``torch.compile``d function. Correct ops of every
shape (in place, nested outputs, Triton, CuPy, torch.compile, non-tensor
arguments) must pass every case, each check in 3 s or less.

One row per test in the harness table that conftest.py prints after the
framework suite's table: what was checked, the time of the check, PASS or
FAIL and what the harness said. Each check's time is also printed
(``python -m pytest -s``) and kept in DLSYNC_REPORT_FILE with the reports.
"""
import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest

PYTHON_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, PYTHON_DIR)
import dlsync  # noqa: E402
from dlsync.testing import check_capture  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

HERE = os.path.basename(__file__)
N = 1 << 18
CHECK_S = 3.0  # the most a correct op's check may take on the H200


def _log(text):
    print(text)
    where = os.environ.get("DLSYNC_REPORT_FILE")
    if where:
        with open(where, "a") as f:
            f.write(text + "\n\n")


def _check(fn, *inputs, **kw):
    t0 = time.perf_counter()
    report = check_capture(fn, *inputs, raise_on_failure=False, **kw)
    seconds = time.perf_counter() - t0
    _log(f"[{seconds:.2f} s] " + report.message())
    return report, seconds


def _thread_capture_mode():
    """This thread's capture interaction mode, read through the driver."""
    cuda = ctypes.CDLL("libcuda.so.1")
    mode = ctypes.c_int(2)
    assert cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    old = mode.value
    mode = ctypes.c_int(old)
    assert cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    return old


@pytest.fixture(autouse=True)
def _default_stream_first():
    """Each test starts on the default stream (another file of the suite may
    have left the current stream elsewhere), so that "the current stream is
    the default one" after a broken op is the harness's doing; the stream
    found is put back afterwards."""
    if torch is None or not torch.cuda.is_available():
        yield
        return
    before = torch.cuda.current_stream()
    torch.cuda.set_stream(torch.cuda.default_stream())
    try:
        yield
    finally:
        torch.cuda.set_stream(before)


# ---- correct ops, one of each shape ----


def saxpy_(y, x, alpha):
    """In place, with a non-tensor argument."""
    y.add_(x, alpha=alpha)
    return y


def moments(x):
    """Nested outputs: a dict holding a tuple holding a list."""
    rows = x.view(-1, 256)
    return {"mean": rows.mean(dim=1),
            "spread": (rows.amax(dim=1) - rows.amin(dim=1), [rows.std(dim=1), rows[:, :4] * 1])}


def leaky(x, slope, kind="leaky"):
    """Non-tensor arguments of two types."""
    if kind == "leaky":
        return torch.where(x > 0, x, x * slope)
    return torch.relu(x)


_COMPILED = {}


def _compiled_gelu():
    if "gelu" not in _COMPILED:
        _COMPILED["gelu"] = torch.compile(lambda x: torch.nn.functional.gelu(x) * 1.5 + x)
    return _COMPILED["gelu"]


def compiled_gelu(x):
    return _compiled_gelu()(x)


_TRITON = {}


def _triton_kernel():
    if "k" in _TRITON:
        return _TRITON["k"]
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def scale_shift(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * scale + shift, mask=m)

    _TRITON["k"] = (triton, scale_shift)
    return _TRITON["k"]


def triton_scale_shift(x):
    triton, kernel = _triton_kernel()
    out = torch.empty_like(x)
    n = x.numel()
    kernel[(triton.cdiv(n, 1024),)](x, out, n, 2.5, -1.0, BLOCK=1024)
    return out


_CUPY = {}


def _softplus():
    if "k" not in _CUPY:
        cupy = pytest.importorskip("cupy")
        kern = cupy.ElementwiseKernel("float32 x", "float32 y", "y = log1pf(expf(x))",
                                      "hygiene_softplus")
        _CUPY["k"] = (cupy, kern, cupy.cuda.Stream(non_blocking=True))
    return _CUPY["k"]


def cupy_softplus(x, out):
    """A CuPy kernel on a CuPy stream of its own, ordered through dlsync."""
    cupy, kern, stream = _softplus()
    with dlsync.scope():
        y = x * 0.5
        with stream:
            kern(cupy.from_dlpack(dlsync.wrap(y)), cupy.from_dlpack(dlsync.wrap(out)))
    return out


def _correct_ops():
    x = torch.randn(N, device="cuda")
    y = torch.randn(N, device="cuda")
    ops = [("saxpy_ (in place)", saxpy_, (y, x, 0.25), {}),
           ("moments (nested outputs)", moments, (x,), {}),
           ("leaky (non-tensor args)", leaky, (x, 0.1, "leaky"), {}),
           ("compiled_gelu (torch.compile)", compiled_gelu, (x,), {})]
    try:
        _triton_kernel()
        ops.append(("triton_scale_shift (Triton)", triton_scale_shift, (x,), {}))
    except pytest.skip.Exception:
        pass
    try:
        _softplus()
        ops.append(("cupy_softplus (CuPy inside)", cupy_softplus,
                    (x, torch.zeros(N, device="cuda")),
                    {"reference": lambda a, o: torch.nn.functional.softplus(a * 0.5),
                     "rtol": 1e-5, "atol": 1e-5}))
    except pytest.skip.Exception:
        pass
    return ops


@pytest.mark.parametrize("index", range(6))
def test_a_correct_op_of_every_shape_passes_every_case(harness_row, index):
    ops = _correct_ops()
    if index >= len(ops):
        pytest.skip("Triton or CuPy is not installed")
    label, fn, inputs, kw = ops[index]
    fn(*inputs)  # the library's own first call: kernels compiled, caches filled
    torch.cuda.synchronize()
    report, seconds = _check(fn, *inputs, **kw)
    print(f"check of {label}: {seconds:.2f} s")
    ok = report.ok and not report.left and seconds <= CHECK_S
    first = report.failures[0].diagnosis.headline if report.failures else ""
    harness_row(label, "correct op: every case passes", ok, seconds,
                f"{len(report.cases)} cases ok" if report.ok else first)
    assert report.ok, report.message()
    assert not report.left, report.message()
    assert [c.name for c in report.cases] == ["eager", "global", "thread_local", "relaxed"]
    assert seconds <= CHECK_S, f"{label}: the check took {seconds:.2f} s (at most {CHECK_S} s)"


# ---- what must still work after a broken op ----

def _everything_still_works():
    """A correct op's check, a random draw, a capture of its own with a
    random draw inside, a torch.compile'd function; returns how many worked
    and raises AssertionError naming what did not."""
    problems = []
    mode = _thread_capture_mode()
    if mode != 0:  # CU_STREAM_CAPTURE_MODE_GLOBAL, every thread's default
        problems.append(f"the thread's capture mode is {mode}, not GLOBAL (0)")
    if torch.cuda.is_current_stream_capturing():
        problems.append("the current stream is still capturing")
    if torch.cuda.current_stream() != torch.cuda.default_stream():
        problems.append("the current stream is not the default stream any more")
    worked = 0
    x = torch.randn(N, device="cuda")
    report, seconds = _check(leaky, x, 0.2, "leaky")
    if report.ok:
        worked += 1
    else:
        problems.append("a correct op's check failed: " + report.message())
    try:
        r = torch.randn(1 << 16, device="cuda")
        assert r.isfinite().all() and 0.5 < float(r.std()) < 1.5
        worked += 1
    except Exception as e:  # noqa: BLE001
        problems.append(f"torch.randn on cuda: {type(e).__name__}: {e}")
    try:
        static = torch.randn(1 << 16, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            noisy = static * 2 + torch.rand_like(static)
        static.copy_(torch.full_like(static, 3.0))
        g.replay()
        torch.cuda.synchronize()
        d = noisy - 6.0  # 6 + U[0, 1) in float32: a draw near 1 rounds to 7.0, so d <= 1
        assert float(d.min()) >= 0.0 and float(d.max()) <= 1.0, (float(d.min()), float(d.max()))
        assert float(d.std()) > 0.1, "the replay drew no new random numbers"
        worked += 1
    except Exception as e:  # noqa: BLE001
        problems.append(f"a torch.cuda.graph capture of its own: {type(e).__name__}: {e}")
    try:
        fn = _compiled_gelu()
        a = torch.randn(N, device="cuda")
        torch.testing.assert_close(fn(a), torch.nn.functional.gelu(a) * 1.5 + a)
        worked += 1
    except Exception as e:  # noqa: BLE001
        problems.append(f"torch.compile: {type(e).__name__}: {e}")
    return worked, problems


def _caught(row, label, report, seconds, case_names, category, where=None, restored=(),
            passing=()):
    """The broken op's report: every case in case_names diagnosed with
    category (its where line holding ``where``, its restore list each of
    ``restored``), every case in ``passing`` passed, nothing left behind;
    then everything still works. One row in the table."""
    problems = [f"[{name}] should pass: {report.case(name).diagnosis.headline}"
                for name in passing if not report.case(name).ok]
    for name in case_names:
        c = report.case(name)
        d = c.diagnosis
        if d is None or d.category != category:
            problems.append(f"[{name}] expected {category!r}, the harness said "
                            f"{'ok' if d is None else repr(d.category)}: "
                            f"{'' if d is None else d.headline} ({'' if d is None else d.said})")
            continue
        own = not where.startswith("raised when") if where else False
        if where is not None and not (where in d.where and (HERE in d.where or not own)):
            problems.append(f"[{name}] where: expected {where!r}"
                            f"{f' in {HERE}' if own else ''}, got {d.where!r}")
        for item in restored:
            if not any(item in r for r in c.restored):
                problems.append(f"[{name}] the restore did not say {item!r}: {c.restored}")
    if report.left:
        problems.append(f"left in the process: {report.left}")
    worked, after = _everything_still_works()
    problems += after
    d = report.case(case_names[0]).diagnosis
    note = (f"{d.headline} | {d.said}" if d is not None else "not caught") + (
        f" | then {worked} of 4 worked" + (": " + "; ".join(after) if after else ""))
    row(label, f"{category} [{', '.join(case_names)}]", not problems, seconds, note)
    assert not problems, "\n".join(problems) + "\n\n" + report.message()


# ---- broken ops, one per category ----


def normalize_by_max(x):
    scale = float(x.abs().max())  # a host read of device data
    return x / scale


def test_sync_during_capture(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(normalize_by_max, x)
    _caught(harness_row, "host read", report, seconds, ("global", "thread_local", "relaxed"),
            "sync during capture", where="scale = float(x.abs().max())",
            restored=("default generator out of capture mode", "allocator's routing"))


def half_then_import(x):
    y = x * 0.5
    with dlsync.scope():
        capsule = dlsync.wrap(y).__dlpack__()  # stream=None: the legacy default stream
    return torch.utils.dlpack.from_dlpack(capsule) + 1


def test_legacy_stream(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(half_then_import, x, reference=lambda a: a * 0.5 + 1)
    _caught(harness_row, "legacy stream", report, seconds, ("global", "thread_local", "relaxed"),
            "legacy stream", where="capsule = dlsync.wrap(y).__dlpack__()")


class _TableLib:
    """A library that uploads a table on its own stream once, and makes each
    call wait for the upload's event."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            self.table = torch.linspace(0, 1, N, device="cuda")
        self.ready = torch.cuda.Event()
        self.ready.record(self.stream)


_LIBS = {}


def _lib(name, make):
    """The library object `name`, made on first use only (dict.setdefault
    would build a new one, on a new stream, at every call: inside the
    capture too)."""
    if name not in _LIBS:
        _LIBS[name] = make()
    return _LIBS[name]


def table_add(x):
    lib = _lib("table", _TableLib)
    torch.cuda.current_stream().wait_event(lib.ready)  # recorded eagerly, long ago
    return x + lib.table


def test_isolation(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(table_add, x)
    _caught(harness_row, "eager event", report, seconds, ("global", "thread_local", "relaxed"), "isolation",
            where="torch.cuda.current_stream().wait_event(lib.ready)",
            restored=("default generator out of capture mode",))


def prologue_graph(x):
    """Under capture, builds its prologue as a graph of its own on its own
    stream and links it to the caller's capture with a plain event."""
    if not torch.cuda.is_current_stream_capturing():
        return x * 0.5 + 1
    lib = _lib("prologue", torch.cuda.Stream)
    ev = torch.cuda.Event()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(lib):
        g.capture_begin(capture_error_mode="relaxed")
        half = x * 0.5
        ev.record(lib)
    try:
        torch.cuda.current_stream().wait_event(ev)  # two captures linked by a plain wait
        return half + 1
    finally:
        with torch.cuda.stream(lib):
            try:
                g.capture_end()
            except RuntimeError:
                pass


def test_merge(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(prologue_graph, x)
    _caught(harness_row, "two captures", report, seconds, ("global", "thread_local", "relaxed"), "merge",
            where="torch.cuda.current_stream().wait_event(ev)",
            restored=("default generator out of capture mode",))


def finalize_on_worker(x):
    """Captures its own graph on the caller's thread and hands the end to a
    worker thread."""
    lib = _lib("worker", torch.cuda.Stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(lib):
        g.capture_begin(capture_error_mode="thread_local")
        y = x * 2
    errors = []

    def finish():
        try:
            with torch.cuda.stream(lib):
                g.capture_end()  # on another thread than the one that began it
        except RuntimeError as e:
            errors.append(e)

    worker = threading.Thread(target=finish)
    worker.start()
    worker.join()
    if errors:
        with torch.cuda.stream(lib):
            try:
                g.capture_end()
            except RuntimeError:
                pass
        raise errors[0]
    g.replay()
    return y


def test_wrong_thread(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(finalize_on_worker, x, reference=lambda a: a * 2)
    _caught(harness_row, "end on worker", report, seconds, ("eager",), "wrong thread",
            where="g.capture_end()  # on another thread")


def import_without_scope(x):
    y = x * 2
    side = _lib("consumer", torch.cuda.Stream)
    made = dlsync.wrap(y, producer=torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z = torch.from_dlpack(made)  # no dlsync.scope() around it
        return z * 3


def test_capture_order(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(import_without_scope, x, reference=lambda a: a * 6)
    _caught(harness_row, "wrap, no scope", report, seconds, ("global", "thread_local", "relaxed"),
            "capture order", where="z = torch.from_dlpack(made)")


def with_side_statistic(x):
    aux = _lib("aux", torch.cuda.Stream)
    aux.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(aux):
        peak = x.abs().amax()  # and the caller's stream never waits for aux
    return x * 2, peak


def test_unjoined_work(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(with_side_statistic, x)
    _caught(harness_row, "side statistic", report, seconds, ("global", "thread_local", "relaxed"),
            "unjoined work", where="raised when the capture ended",
            restored=("default generator out of capture mode", "allocator's routing"))


def exp_best_effort(x):
    y = x.exp()
    try:
        torch.cuda.current_stream().synchronize()  # "make sure y is ready"
    except RuntimeError:
        pass  # best effort
    return y


def test_invalidated(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(exp_best_effort, x)
    _caught(harness_row, "swallowed sync", report, seconds, ("global", "thread_local", "relaxed"),
            "invalidated", where="raised when the capture ended",
            restored=("default generator out of capture mode",))


def sine_on_own_stream(x):
    lib = _lib("sine", torch.cuda.Stream)
    out = torch.empty_like(x)
    with torch.cuda.stream(lib):  # never ordered after the caller's stream
        torch.sin(x, out=out)
    return out


def test_stale_data(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(sine_on_own_stream, x, reference=torch.sin, slow_producer_ms=20.0)
    _caught(harness_row, "own stream", report, seconds, ("eager", "global", "thread_local", "relaxed"),
            "stale data")


def poll_other_stream(x):
    """A background poller of the library asks another stream's progress
    (cudaStreamQuery) and treats an error as "busy"."""
    other = _lib("polled", torch.cuda.Stream)

    def poll():
        try:
            other.query()
        except RuntimeError:
            pass

    t = threading.Thread(target=poll)
    t.start()
    t.join()
    return x * 3


def test_neighbour(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(poll_other_stream, x, modes=("relaxed",), neighbour=(None, "capture"))
    _caught(harness_row, "poller", report, seconds, ("relaxed+capture",), "neighbour",
            passing=("eager", "relaxed"))


def refuses_capture(x):
    if torch.cuda.is_current_stream_capturing():
        raise NotImplementedError("refuses_capture: CUDA graphs are not supported yet")
    return x + 1


def test_error(harness_row):
    x = torch.randn(N, device="cuda")
    report, seconds = _check(refuses_capture, x)
    _caught(harness_row, "refuses capture", report, seconds, ("global", "thread_local", "relaxed"), "error",
            where="raise NotImplementedError")


# ---- what a failed capture leaves, without the harness (in a fresh process) ----

LEFTOVERS = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
from dlsync.testing import _restore

def draws():
    try:
        torch.randn(16, device="cuda")
        return "draws"
    except RuntimeError as e:
        return "stuck: " + str(e).splitlines()[0]

x = torch.randn(1 << 16, device="cuda")
side, s = torch.cuda.Stream(), torch.cuda.Stream()
pool = torch.cuda.graph_pool_handle()
g = torch.cuda.CUDAGraph()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    g.capture_begin(pool=pool)
    side.wait_stream(s)
    with torch.cuda.stream(side):
        y = x * 2
    try:
        g.capture_end()
        print("capture_end: ended")
    except RuntimeError as e:
        print("capture_end: " + str(e).splitlines()[0])
print("generator after the failed end: " + draws())
watch = _restore.Watch(torch)
watch.track(g, pool, torch.cuda.current_device(), s.cuda_stream)
done, left = [], []
stuck = _restore.end_failed_captures(torch, _restore.Driver(), watch.tracked, done, left)
print("pool: " + ("was underway" if any("routing" in d for d in done) else "not underway"))
_restore.repair_generator(torch, stuck[0])
print("generator after the repair: " + draws())
h = torch.cuda.CUDAGraph()
with torch.cuda.graph(h):
    z = x + torch.rand_like(x)
h.replay()
torch.cuda.synchronize()
print("a capture of its own: " + ("ok" if bool(((z - x) < 1).all()) else "wrong"))
print("left: " + repr(left))
'''


def test_what_a_failed_capture_leaves_and_its_restore(harness_row):
    """The state the harness restores exists: after a capture_end that
    fails, PyTorch's default generator refuses every draw and the pool is
    still underway; the restore puts both back."""
    run = subprocess.run([sys.executable, "-c", LEFTOVERS, PYTHON_DIR], capture_output=True,
                         text=True, timeout=120)
    out = run.stdout + run.stderr
    print(out)
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines() if ": " in line)
    expect = {
        "generator after the failed end": "stuck: Offset increment outside graph capture",
        "pool": "was underway",
        "generator after the repair": "draws",
        "a capture of its own": "ok",
        "left": "[]",
    }
    got = {k: lines.get(k, "(missing)") for k in expect}
    same = {k: got[k].startswith(v) for k, v in expect.items()}
    harness_row("a failed capture_end, by hand", "what it leaves; the restore",
                run.returncode == 0 and all(same.values()), None,
                "; ".join(f"{k}: {v}" for k, v in got.items()))
    assert run.returncode == 0, out
    assert "unjoined" in lines.get("capture_end", ""), out
    assert all(same.values()), out


def test_compile_reduce_overhead_after_the_broken_ops(harness_row):
    """Last in the file: torch.compile(mode="reduce-overhead") compiles and
    replays after every broken op above ran in this process."""
    t0 = time.perf_counter()
    fn = torch.compile(lambda a: (a * 2).sin() + 1, mode="reduce-overhead")
    a = torch.randn(N, device="cuda")
    runs = 0
    try:
        for _ in range(4):
            a.copy_(torch.randn(N, device="cuda"))
            torch.testing.assert_close(fn(a).clone(), (a * 2).sin() + 1)
            runs += 1
    finally:
        harness_row("torch.compile reduce-overhead", "after every broken op above",
                    runs == 4, time.perf_counter() - t0, f"{runs} of 4 calls right")


def test_isolate_runs_a_check_in_a_spawned_child(harness_row):
    """check_capture(isolate=True): the broken op's check runs in a spawned
    child; its report comes back here, and this process never saw the
    broken capture."""
    x = torch.randn(N, device="cuda")
    t0 = time.perf_counter()
    report = check_capture(normalize_by_max, x, modes=("global",), raise_on_failure=False,
                           isolate=True)
    seconds = time.perf_counter() - t0
    _log(f"[{seconds:.2f} s] " + report.message())
    d = report.case("global").diagnosis
    ok = (report.isolated and d is not None and d.category == "sync during capture"
          and "scale = float(x.abs().max())" in d.where)
    harness_row("isolate=True (spawned child)", "sync during capture [global]", ok, seconds,
                report.message().splitlines()[0])
    assert ok, report.message()
    assert report.message().splitlines()[0].endswith("(in a child process)")
