# SPDX-License-Identifier: Apache-2.0
"""dlsync.testing without a GPU: importing it, the diagnosis table, the report,
the option checks, and the pytest plugin skipping its cases.

Plain unittest (no pytest needed; the plugin's case runs only where pytest is
installed); ctest runs it with DLSYNC_LIBRARY set."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..")
# The source tree (pyproject.toml, the GPU suite's conftest.py): beside this
# file in a checkout; DLSYNC_SOURCE_ROOT where the test runs from a copy
# (scripts/install-check.sh runs it against the installed wheel).
SOURCE_ROOT = os.environ.get("DLSYNC_SOURCE_ROOT") or os.path.join(HERE, "..", "..")
sys.path.insert(0, PYTHON_DIR)
# These tests run dlsync on the fake driver; a real libcupti (where the toolkit
# has one) would count the real driver's work instead. The streams at replay
# are counted for real by tests/gpu; here no counter is found (unless a test
# names one), and each report says so.
os.environ.setdefault("DLSYNC_CUPTI_STREAMS",
                      os.path.join(tempfile.gettempdir(), "no-cupti-counter-on-the-fake-driver"))
import dlsync.testing as dt  # noqa: E402
from dlsync.testing import _streams  # noqa: E402
from dlsync.testing import report as rp  # noqa: E402

# What the driver and PyTorch say, as seen on the H200 (docs/gpu.md) or as
# CUDA's error strings read.
UNJOINED = "AcceleratorError: CUDA error: capturing stream has unjoined work"
INVALIDATED = ("AcceleratorError: CUDA error: operation failed due to a previous error during "
               "capture")
SYNC = "AcceleratorError: CUDA error: operation not permitted when stream is capturing"
LEGACY = ("RuntimeError: CUDA error: operation would make the legacy stream depend on a "
          "capturing blocking stream")
ISOLATION = "RuntimeError: CUDA error: dependency created on uncaptured work in another stream"
SAMPLES = {
    "CAI stream sync": ["CudaAPIError: [CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED] Call to "
                        "cuStreamSynchronize results in CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                        "[900] Call to cuStreamSynchronize results in "
                        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                        "set NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0"],
    "sync during capture": [SYNC, "cudaErrorStreamCaptureUnsupported",
                            "CUDA error: operation not permitted on an event last recorded in a "
                            "capturing stream"],
    "legacy stream": [LEGACY, "Error: DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE: the consumer asked",
                      "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"],
    "isolation": [ISOLATION, "cuStreamWaitEvent failed: CUDA_ERROR_STREAM_CAPTURE_ISOLATION"],
    "merge": ["CUDA error: operation would result in a merge of two independent capture "
              "sequences"],
    "wrong thread": ["CUDA error: attempt to terminate a thread-local capture sequence from "
                     "another thread"],
    "capture order": ["Error: DLSYNC_ERROR_CAPTURE_ORDER: the producer's stream is capturing"],
    "unjoined work": [UNJOINED, "cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_UNJOINED"],
    "invalidated": [INVALIDATED, "cudaErrorStreamCaptureInvalidated"],
}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _plugin_args():
    """-p for a source tree; nothing where the entry point is installed
    (pytest would register the module twice)."""
    from importlib.metadata import entry_points

    installed = any(ep.value == "dlsync.testing.pytest_plugin"
                    for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "dlsync.testing.pytest_plugin"]


def _has_pytest():
    try:
        import pytest  # noqa: F401
        return True
    except ImportError:
        return False


class Import(unittest.TestCase):
    def test_importing_loads_no_framework(self):
        code = ("import sys, dlsync.testing, dlsync.testing.report\n"
                "print(sorted(m for m in ('torch', 'cupy', 'jax', 'numpy') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                             text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]")

    @unittest.skipUnless(_has_pytest(), "pytest is not installed")
    def test_loading_the_plugin_loads_no_framework(self):
        code = ("import sys, dlsync.testing.pytest_plugin\n"
                "print(sorted(m for m in ('torch', 'cupy', 'jax', 'numpy') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                             text=True, check=True)
        self.assertEqual(out.stdout.strip(), "[]")

    @unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present")
    def test_check_capture_without_a_gpu_says_why(self):
        with self.assertRaises(RuntimeError) as info:
            dt.check_capture(lambda x: x, object())
        self.assertIn("cannot run", str(info.exception))
        self.assertIn(dt.gpu_unavailable_reason(), str(info.exception))


class ErrorTable(unittest.TestCase):
    def test_every_message_names_its_row(self):
        for category, messages in SAMPLES.items():
            for m in messages:
                kind = rp.classify_error([m])
                self.assertIsNotNone(kind, m)
                self.assertEqual(kind.category, category, m)

    def test_every_row_is_tested_and_categories_are_unique(self):
        categories = [k.category for k in rp.ERROR_TABLE]
        self.assertEqual(len(categories), len(set(categories)))
        self.assertEqual(set(categories), set(SAMPLES))
        for k in rp.ERROR_TABLE:
            self.assertTrue(k.cuda and k.meaning and k.advice, k.category)
            self.assertTrue(all(p == p.lower() for p in k.patterns), k.category)

    def test_the_cause_wins_over_the_invalidated_capture(self):
        self.assertEqual(rp.classify_error([SYNC, INVALIDATED]).category, "sync during capture")
        self.assertEqual(rp.classify_error([INVALIDATED, ISOLATION]).category, "isolation")
        self.assertEqual(rp.classify_error([INVALIDATED]).category, "invalidated")

    def test_a_cai_stream_sync_is_named_in_numbas_words_with_the_fix(self):
        numba = SAMPLES["CAI stream sync"][0]
        kind = rp.classify_error([INVALIDATED, numba])
        self.assertEqual(kind.category, "CAI stream sync")
        self.assertIn("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", kind.meaning)
        self.assertIn("operation not permitted when stream is capturing", kind.meaning)
        self.assertIn("dlsync.wrap(x, consumer=stream)", kind.advice)
        # CUDA's own words for a sync, without Numba's, stay the general row.
        self.assertEqual(rp.classify_error([SYNC]).category, "sync during capture")

    def test_unknown_messages_match_no_row(self):
        self.assertIsNone(rp.classify_error(["RuntimeError: out of memory", ""]))
        self.assertIsNone(rp.classify_error([]))


def _captured(name="global", **kw):
    return rp.CaseResult(name, name, **kw)


class Diagnosis(unittest.TestCase):
    def test_a_passing_case_has_no_diagnosis(self):
        case = _captured(runs=3, captured=True)
        self.assertTrue(case.ok)
        self.assertIsNone(case.diagnosis)
        self.assertEqual(case.capture_status, "ok")

    def test_unjoined_work_says_what_to_do(self):
        case = _captured(captured=False, errors=[UNJOINED])
        d = case.diagnosis
        self.assertEqual(d.category, "unjoined work")
        self.assertEqual(d.headline, "capture broke: unjoined work (cudaErrorStreamCaptureUnjoined)")
        self.assertIn("a consumer stream joined the capture and was not joined back", d.meaning)
        self.assertIn("import through dlsync.wrap inside dlsync.scope()", d.advice)
        self.assertEqual(d.said, "AcceleratorError: CUDA error: capturing stream has unjoined work")
        self.assertEqual(d.where, "raised when the capture ended (no call of the op raised)")
        self.assertEqual(case.capture_status, "broken")

    def test_a_sync_names_the_call_and_the_cuda_error(self):
        case = _captured(captured=False, errors=[SYNC, INVALIDATED],
                         where="ops.py:12 in op: torch.cuda.synchronize()")
        d = case.diagnosis
        self.assertEqual(d.category, "sync during capture")
        self.assertIn("cudaErrorStreamCaptureUnsupported", d.headline)
        self.assertIn("  where: ops.py:12 in op: torch.cuda.synchronize()", d.lines())
        self.assertIn("operation not permitted when stream is capturing", d.said)

    def test_multi_line_messages_quote_the_line_that_matched(self):
        case = _captured(captured=False,
                         errors=["AcceleratorError: CUDA error: something\nSearch for "
                                 "`cudaErrorStreamCaptureIsolation' in the docs"])
        self.assertEqual(case.diagnosis.category, "isolation")
        self.assertEqual(case.diagnosis.said,
                         "Search for `cudaErrorStreamCaptureIsolation' in the docs")

    def test_stale_data_that_never_changed_ran_outside_the_graph(self):
        wrong = [rp.WrongOutput(r, "out[1]", "Mismatched elements: 9 / 9 (100.0%)", True)
                 for r in (1, 2, 3)]
        d = _captured(runs=3, captured=True, wrong=wrong).diagnosis
        self.assertEqual(d.category, "stale data")
        self.assertTrue(d.headline.startswith("stale data after replay 1 of 3: output out[1]"),
                        d.headline)
        self.assertIn("in 3 of 3 replays", d.headline)
        self.assertIn("is not in the graph", d.meaning)
        self.assertIn("dlsync.exchange", d.advice)
        self.assertEqual(d.said, "Mismatched elements: 9 / 9 (100.0%)")

    def test_stale_data_that_changed_is_a_missing_dependency(self):
        wrong = [rp.WrongOutput(2, "out", "Mismatched elements: 1 / 9 (11.1%)", False)]
        d = _captured(runs=3, captured=True, wrong=wrong).diagnosis
        self.assertTrue(d.headline.startswith("stale data after replay 2 of 3"), d.headline)
        self.assertIn("missing dependency", d.meaning)

    def test_stale_data_eagerly(self):
        wrong = [rp.WrongOutput(2, "out", "x", False), rp.WrongOutput(3, "out", "x", False)]
        d = rp.CaseResult("eager", "eager", runs=3, wrong=wrong).diagnosis
        self.assertEqual(d.category, "stale data")
        self.assertTrue(d.headline.startswith("stale data in eager call 2 of 3"), d.headline)
        self.assertIn("not ordered after the caller's current stream", d.meaning)

    def test_a_broken_neighbour_is_reported_when_the_op_raised_nothing(self):
        case = _captured("relaxed+capture", runs=3, captured=True, neighbour="capture",
                         neighbour_errors=[SYNC, INVALIDATED])
        d = case.diagnosis
        self.assertEqual(d.category, "neighbour")
        self.assertEqual(d.headline,
                         "the capture neighbour thread broke: sync during capture "
                         "(cudaErrorStreamCaptureUnsupported)")
        self.assertIn("GLOBAL", d.meaning)

    def test_the_ops_own_error_comes_before_the_neighbour(self):
        case = _captured(captured=False, errors=[SYNC], neighbour="capture",
                         neighbour_errors=[INVALIDATED])
        self.assertEqual(case.diagnosis.category, "sync during capture")

    def test_unknown_errors_and_eager_failures(self):
        d = rp.CaseResult("eager", "eager", errors=["ValueError: bad shape"]).diagnosis
        self.assertEqual(d.category, "error")
        self.assertEqual(d.headline, "the op failed: ValueError: bad shape")
        d = _captured(runs=1, captured=True, errors=["RuntimeError: boom"]).diagnosis
        self.assertEqual(d.headline, "replay failed: RuntimeError: boom")

    def test_a_case_that_compared_nothing_fails(self):
        case = _captured(runs=0, captured=True)
        self.assertFalse(case.ok)
        self.assertIn("nothing was compared", case.diagnosis.headline)
        skipped = _captured(skipped="the op failed eagerly")
        self.assertFalse(skipped.ok)
        self.assertEqual(skipped.capture_status, "skipped")
        self.assertEqual(skipped.diagnosis.lines(), ["not run: the op failed eagerly"])

    def test_each_source_of_words_is_labelled(self):
        stale = _captured(runs=1, captured=True, wrong=[rp.WrongOutput(1, "out", "Mismatched")])
        self.assertIn("  compared: Mismatched", stale.diagnosis.lines())
        unknown = rp.CaseResult("eager", "eager", errors=["ValueError: bad shape"])
        self.assertIn("  error: ValueError: bad shape", unknown.diagnosis.lines())
        unjoined = _captured(captured=False, errors=[UNJOINED])
        self.assertIn("  CUDA said: " + UNJOINED, unjoined.diagnosis.lines())

    def test_a_neighbour_failing_for_another_reason_does_not_blame_the_op(self):
        case = _captured("global+eager", runs=3, captured=True, neighbour="eager",
                         neighbour_errors=["Error: DLSYNC_ERROR_NO_DRIVER: no driver"])
        d = case.diagnosis
        self.assertEqual(d.headline, "the eager neighbour thread broke: an error")
        self.assertIn("not a capture rule", d.meaning)


class Report(unittest.TestCase):
    def _report(self):
        return rp.CaptureReport("scale", [
            rp.CaseResult("eager", "eager", runs=3),
            _captured("global", runs=0, captured=False, errors=[UNJOINED]),
            _captured("relaxed", runs=3, captured=True,
                      wrong=[rp.WrongOutput(1, "out", "Mismatched elements: 4 / 4", True)]),
            rp.CaseResult("compile", "reduce-overhead", runs=5, captured=True,
                          note="torch.compile skipped CUDA graphs"),
        ])

    def test_table_has_one_row_per_case(self):
        lines = self._report().table().splitlines()
        self.assertEqual(len(lines), 5)
        for word in ("case", "mode", "neighbour", "runs", "wrong", "capture", "verdict"):
            self.assertIn(word, lines[0])
        self.assertEqual(lines[1].split(), ["eager", "eager", "-", "3", "0", "-", "ok"])
        self.assertEqual(lines[2].split()[:6], ["global", "global", "-", "0", "0", "broken"])
        self.assertTrue(lines[2].endswith("unjoined work"), lines[2])
        self.assertTrue(lines[3].endswith("stale data"), lines[3])
        self.assertIn("1", lines[3].split()[4])
        self.assertTrue(lines[4].endswith("ok (torch.compile skipped CUDA graphs)"), lines[4])

    def test_message_names_each_failed_case(self):
        r = self._report()
        self.assertFalse(r.ok)
        self.assertEqual([c.name for c in r.failures], ["global", "relaxed"])
        msg = r.message()
        self.assertTrue(msg.startswith("capture check of scale: 2 of 4 cases failed"), msg)
        self.assertIn("[global] capture broke: unjoined work (cudaErrorStreamCaptureUnjoined)", msg)
        self.assertIn("what to do: import through dlsync.wrap inside dlsync.scope()", msg)
        self.assertIn("[relaxed] stale data after replay 1 of 3", msg)
        self.assertNotIn("[eager]", msg)

    def test_cases_with_the_same_diagnosis_are_named_together(self):
        r = rp.CaptureReport("op", [_captured(m, captured=False, errors=[UNJOINED])
                                    for m in ("global", "thread_local", "relaxed")]
                             + [_captured("relaxed+capture", captured=False, errors=[SYNC])])
        msg = r.message()
        self.assertIn("\n[global, thread_local, relaxed] capture broke: unjoined work", msg)
        self.assertEqual(msg.count("capture broke: unjoined work"), 1)
        self.assertIn("\n[relaxed+capture] capture broke: sync during capture", msg)

    def test_raise_if_failed_carries_the_report(self):
        r = self._report()
        with self.assertRaises(AssertionError) as info:
            r.raise_if_failed()
        self.assertIs(info.exception.report, r)
        self.assertEqual(str(info.exception), r.message())
        good = rp.CaptureReport("ok", [rp.CaseResult("eager", "eager", runs=1)])
        self.assertIs(good.raise_if_failed(), good)
        self.assertIn("1 cases passed", good.message())
        self.assertFalse(rp.CaptureReport("none").ok)

    def test_case_lookup(self):
        r = self._report()
        self.assertEqual(r.case("relaxed").mode, "relaxed")
        with self.assertRaises(KeyError):
            r.case("thread_local")


class Helpers(unittest.TestCase):
    def test_user_frame_skips_frameworks_and_the_harness(self):
        frames = [
            ("/x/site-packages/dlsync/testing/__init__.py", 300, "eager", "self.fn(*self.args)"),
            ("/work/lib/tests/test_ops.py", 12, "op", "  torch.cuda.synchronize()  "),
            ("/x/site-packages/torch/cuda/__init__.py", 990, "synchronize", "return ..."),
        ]
        self.assertEqual(rp.user_frame(frames), "test_ops.py:12 in op: torch.cuda.synchronize()")
        self.assertEqual(rp.user_frame(frames[:1] + frames[2:]), "")
        self.assertEqual(rp.user_frame([("/a/b.py", 3, "f", None)]), "b.py:3 in f")
        # Any module of this dlsync package is skipped, not only its __init__.py.
        package = os.path.dirname(os.path.abspath(dt.__file__ + "/.."))
        inner = os.path.join(os.path.dirname(package), "dlsync", "_wrap.py")
        self.assertEqual(rp.user_frame(frames[:2] + [(inner, 40, "__dlpack__", "raise ...")]),
                         "test_ops.py:12 in op: torch.cuda.synchronize()")

    def test_where_an_exception_was_raised(self):
        def op():
            raise RuntimeError("inner")

        try:
            try:
                op()
            except RuntimeError:
                raise ValueError("outer")
        except ValueError as e:
            chain = dt._chain(e)
            self.assertEqual([type(x).__name__ for x in chain], ["RuntimeError", "ValueError"])
            self.assertEqual(dt._messages(e), ["RuntimeError: inner", "ValueError: outer"])
            self.assertIn("test_testing_cpu.py:", dt._where(e))
            self.assertIn("in op: raise RuntimeError(\"inner\")", dt._where(e))

    def test_options_are_checked(self):
        self.assertEqual(dt._check_args("relaxed", 1, None, None, None, 0),
                         (("relaxed",), (None,)))
        self.assertEqual(dt._check_args(dt.MODES, 3, (None, "capture"), 1e-5, 1e-8, 10)[1],
                         (None, "capture"))
        bad = [
            (("local",), 3, None, None, None, 10),
            (dt.MODES, 0, None, None, None, 10),
            (dt.MODES, True, None, None, None, 10),
            (dt.MODES, 3, "other", None, None, 10),
            (dt.MODES, 3, None, 1e-5, None, 10),
            (dt.MODES, 3, None, None, None, -1),
            (dt.MODES, 3, None, None, None, float("nan")),
        ]
        for args in bad:
            with self.assertRaises(ValueError, msg=str(args)):
                dt._check_args(*args)

    def test_outputs_are_flattened_with_their_paths(self):
        out = (1, [2, {"y": 3}], None)
        self.assertEqual(list(dt._flatten(out)),
                         [("out[0]", 1), ("out[1][0]", 2), ("out[1][1]['y']", 3),
                          ("out[2]", None)])
        self.assertEqual(list(dt._flatten(7)), [("out", 7)])
        dt._require_outputs((None, 1))
        with self.assertRaises(ValueError):
            dt._require_outputs(None)
        with self.assertRaises(ValueError):
            dt._require_outputs((None, [None]))

    def test_mismatch_summary_keeps_the_numbers(self):
        text = ("Tensor-likes are not close!\n\nMismatched elements: 3 / 8 (37.5%)\n"
                "Greatest absolute difference: 2.0 at index (5,) (up to 1e-05 allowed)\n"
                "Greatest relative difference: 0.5 at index (5,) (up to 1.3e-06 allowed)\n")
        self.assertEqual(dt._mismatch_summary(text),
                         "Mismatched elements: 3 / 8 (37.5%); Greatest absolute difference: 2.0 "
                         "at index (5,) (up to 1e-05 allowed); Greatest relative difference: "
                         "0.5 at index (5,) (up to 1.3e-06 allowed)")
        self.assertEqual(dt._mismatch_summary("The values for attribute 'shape' do not match"),
                         "The values for attribute 'shape' do not match")


# ---- check_capture's flow on a fake PyTorch (no GPU) ----
#
# A few lines of CUDA's capture rules in Python: work on a capturing stream is
# recorded into the graph and runs at replay; work on any other stream runs at
# once; a stream that waits on a capturing one joins its capture and must be
# waited on in turn before the capture ends ("unjoined work"); a device sync
# during a capture, or a query during a GLOBAL capture (any thread's) or a
# THREAD_LOCAL one of this thread, is refused and invalidates the capture. No
# timing: the slow producer is not modelled (the GPU tests cover it).

_SYNC_MSG = "CUDA error: operation not permitted when stream is capturing"


# Compiled under a file name in a torch/ folder, so that the harness looks past
# its frames for the op's own line, as it looks past the real PyTorch's.
_FAKE_TORCH = '''
import contextlib
import threading
import types

torch = types.ModuleType("torch")
cuda = types.ModuleType("torch.cuda")
testing = types.ModuleType("torch.testing")
torch.cuda, torch.testing = cuda, testing
tls = threading.local()
active = []  # graphs being captured
lock = threading.Lock()

class Dtype:
    is_floating_point, is_complex = True, False

class Tensor:
    is_cuda, device, dtype = True, "cuda:0", Dtype()

    def __init__(self, vals):
        self.vals = [float(v) for v in vals]

    shape = property(lambda self: (len(self.vals),))

    def clone(self):
        return Tensor(self.vals)

    def detach(self):
        return self

    def to(self, _dtype):
        return self

    def copy_(self, other):
        self.vals = list(other.vals)
        return self

    def __mul__(self, k):
        return Tensor([v * k for v in self.vals])

    __rmul__ = __mul__

    def __add__(self, k):
        return Tensor([v + k for v in self.vals])

    def cpu(self):
        return Tensor(self.vals)

    def add_(self, k):
        def run():
            self.vals = [v + k for v in self.vals]
        launch(run)
        return self

    def uniform_(self, generator=None):
        (generator or cuda.default_generators[0]).state.increase(4)
        return self

class Allocator:
    """PyTorch's caching allocator, as far as captures touch it: pools that
    captures route allocations to (beginAllocateToPool) and their use
    counts."""

    def __init__(self):
        self.underway, self.pools, self.next_pool = [], {}, 1

    def begin(self, pool):
        self.underway.append(pool)
        self.pools[pool] = self.pools.get(pool, 0) + 1

    def end(self, device, pool):
        if pool not in self.underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.underway.remove(pool)

    def release(self, device, pool):
        self.pools[pool] -= 1
        if not self.pools[pool]:
            del self.pools[pool]

allocator = Allocator()

class GeneratorState:
    """A CUDA generator's state as PyTorch 2.11 keeps it: seed, offset, and
    whether a capture is on (capture_prologue .. capture_epilogue)."""

    def __init__(self):
        self.seed, self.offset, self.capturing = 67280421310721, 0, False

    def increase(self, n):
        if cuda.current_stream().graph is not None:
            if not self.capturing:
                raise RuntimeError("Attempt to increase offset for a CUDA generator not in "
                                   "capture mode.")
        elif self.capturing:
            raise RuntimeError("Offset increment outside graph capture encountered "
                               "unexpectedly.")
        else:
            self.offset += n

class CudaGenerator:
    def __init__(self):
        self.state = GeneratorState()

    def get_state(self):
        return Tensor([self.state.seed, self.state.offset])

    def set_state(self, t):
        self.state.seed, self.state.offset = int(t.vals[0]), int(t.vals[1])

class Graph:
    def capture_begin(self, pool=None, capture_error_mode="global"):
        s = cuda.current_stream()
        # As CUDAGraph::capture_begin: the default generator is registered and
        # put in capture mode, the pool opened, then the capture begun.
        self.gen = cuda.default_generators[0].state
        self.gen.capturing = True
        if pool is None:
            pool = (allocator.next_pool, 0)
            allocator.next_pool += 1
        self.pool = tuple(pool)
        allocator.begin(self.pool)
        self.mode, self.origin, self.thunks = capture_error_mode, s, []
        self.unjoined, self.joined, self.invalid = set(), set(), False
        self.thread = threading.current_thread()
        s.graph = self
        with lock:
            active.append(self)

    def capture_end(self):
        if cuda.current_stream() is not self.origin:
            raise RuntimeError("Capture must end on the same stream it began on.")
        # cudaStreamEndCapture: the capture is over whether it failed or not.
        with lock:
            active.remove(self)
        for st in [self.origin, *self.joined]:
            st.graph = None
        if self.invalid:
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture")
        if self.unjoined:
            raise RuntimeError("CUDA error: capturing stream has unjoined work")
        # Only a capture that ended gets here (as in PyTorch).
        allocator.end(0, self.pool)
        self.gen.capturing = False
        self.ended = True

    def replay(self):
        for thunk in self.thunks:
            thunk()

    def __del__(self):
        if getattr(self, "ended", False):
            allocator.release(0, self.pool)

class FakeDriver:
    """The driver calls dlsync.testing's restore makes, on these streams."""

    available = True

    def __init__(self):
        self.tls = threading.local()
        self.ended = []

    def exchange_mode(self, mode):
        old = getattr(self.tls, "mode", 0)
        self.tls.mode = mode
        return old

    def capture_status(self, handle):
        return 1 if streams[handle].graph is not None else 0

    def end_capture(self, handle):
        st = streams[handle]
        g = st.graph
        with lock:
            if g in active:
                active.remove(g)
        for other in [g.origin, *g.joined]:
            other.graph = None
        self.ended.append(handle)

driver = FakeDriver()
streams = {}

class Stream:
    def __init__(self, device=None):
        self.graph = None
        self.cuda_stream = 0x1000 + len(streams)
        streams[self.cuda_stream] = self

    def wait_stream(self, other):
        if other.graph is not None and self.graph is None:
            self.graph = other.graph  # joins the capture
            other.graph.unjoined.add(self)
            other.graph.joined.add(self)
        elif other.graph is not None and other.graph is self.graph:
            self.graph.unjoined.discard(other)  # joined back

    def synchronize(self):
        pass

    def query(self):
        _unsafe(device_wide=False)
        return True

def _unsafe(device_wide):
    me = threading.current_thread()
    with lock:
        for g in active:
            mine = g.thread is me
            if (mine and (device_wide or g.mode != "relaxed")) or (
                    not mine and g.mode == "global"):
                g.invalid = True
                raise RuntimeError(_SYNC_MSG)

ran = []  # the stream of each thunk run, eagerly or at a replay (as CUPTI's records)

def launch(thunk):
    s = cuda.current_stream()
    def run():
        ran.append(s.cuda_stream)
        thunk()
    if s.graph is not None:
        s.graph.thunks.append(run)
    else:
        run()

def mul(a, k, out):
    def run():
        out.vals = [v * k for v in a.vals]
    launch(run)
    return out

@contextlib.contextmanager
def stream(s):
    prev = cuda.current_stream()
    tls.current = s
    try:
        yield
    finally:
        tls.current = prev

@contextlib.contextmanager
def device(_d):
    yield

class Event:
    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, _other):
        return 5.0

class Generator:
    def __init__(self, device=None):
        import random
        self.rng = random.Random()

    def manual_seed(self, n):
        self.rng.seed(n)

def randn(shape, device=None, generator=None, dtype=None):
    return Tensor([generator.rng.gauss(0, 1) for _ in range(shape[0])])

def assert_close(a, b, rtol=None, atol=None, equal_nan=True, check_device=True):
    bad = sum(1 for x, y in zip(a.vals, b.vals) if abs(x - y) > 1e-6)
    if bad:
        raise AssertionError(f"Tensor-likes are not close!\\n\\nMismatched elements: {bad} / "
                             f"{len(a.vals)}")

default = Stream()
cuda.default_generators = [CudaGenerator()]
cuda.is_available = lambda: True
cuda.current_device = lambda: 0
cuda.set_stream = lambda s: setattr(tls, "current", s)
def graph_pool_handle():
    allocator.next_pool += 1
    return (0, allocator.next_pool)

cuda.graph_pool_handle = graph_pool_handle
torch.fake_driver, torch.fake_allocator, torch.fake_streams = driver, allocator, streams
torch.fake_ran = ran
torch.fake_default = default
torch._C = types.SimpleNamespace(_cuda_endAllocateToPool=allocator.end,
                                 _cuda_releasePool=allocator.release)
torch.empty = lambda n, device=None: Tensor([0.0] * n)
torch.zeros = lambda n, device=None: Tensor([0.0] * n)
torch.cuda.__dict__["fake"] = True
cuda.synchronize = lambda: _unsafe(device_wide=True)
cuda.current_stream = lambda device=None: getattr(tls, "current", default)
cuda.Stream, cuda.CUDAGraph, cuda.Event = Stream, Graph, Event
cuda.stream, cuda.device, cuda.set_device = stream, device, lambda d: None
cuda._sleep = lambda cycles: None
testing.assert_close = assert_close
torch.Tensor, torch.Generator, torch.randn, torch.mul = Tensor, Generator, randn, mul
torch.full = lambda shape, v, device=None: Tensor([v] * shape[0])
torch.zeros_like = torch.empty_like = lambda t: Tensor([0.0] * len(t.vals))
torch.equal = lambda a, b: a.vals == b.vals
torch.compile = lambda fn, mode=None: fn
torch.tensor = Tensor
Tensor.__module__ = "torch"  # pickled by reference into a child process
'''


def _fake_torch():
    ns = {"_SYNC_MSG": _SYNC_MSG}
    path = os.path.join(os.sep, "fake", "torch", "__init__.py")
    exec(compile(_FAKE_TORCH, path, "exec"), ns)  # noqa: S102 - our own source
    return ns["torch"]


class _FakeCounter:
    """The streams of the fake PyTorch's work run by ``run`` (as CUPTI's
    records would name them)."""

    def __init__(self, torch):
        self.torch, self.calls = torch, 0

    def count(self, run):
        self.calls += 1
        del self.torch.fake_ran[:]
        run()
        return len(set(self.torch.fake_ran)), ""


class _NoCounter:
    def __init__(self, why):
        self.why = why

    def count(self, run):
        return None, self.why


class _FakeTorchCase(unittest.TestCase):
    """The fake PyTorch installed as torch for each test (no tests here)."""

    def setUp(self):
        self.saved = {k: sys.modules.get(k) for k in ("torch", "torch.cuda", "torch.testing")}
        torch = self.torch = _fake_torch()
        sys.modules.update({"torch": torch, "torch.cuda": torch.cuda,
                            "torch.testing": torch.testing})
        self.x = torch.tensor([1.0, 2.0, 3.0, 4.0])
        self.out = torch.tensor([0.0] * 4)
        self.side = torch.cuda.Stream()
        self.saved_driver = dt._restore.Driver
        dt._restore.Driver = lambda: torch.fake_driver
        del dt._restore.UNCLEAN[:]
        self.saved_counter = _streams.set_counter(_FakeCounter(torch))

    def tearDown(self):
        _streams.set_counter(self.saved_counter)
        dt._restore.Driver = self.saved_driver
        del dt._restore.UNCLEAN[:]
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v

    def _check(self, fn, **kw):
        return dt.check_capture(fn, self.x, raise_on_failure=False, **kw)

    def _side(self, wait=True, join_back=True):
        torch, side, out = self.torch, self.side, self.out

        def side_op(x):
            cur = torch.cuda.current_stream()
            if wait:
                side.wait_stream(cur)
            with torch.cuda.stream(side):
                torch.mul(x, 3, out=out)
            if join_back:
                cur.wait_stream(side)
            return out

        return side_op


@unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present: tests/gpu runs the real one")
class FlowOnAFakeTorch(_FakeTorchCase):
    def test_a_correct_op_passes_every_case(self):
        r = self._check(self._side(), compile=True, neighbour=(None, "capture"))
        self.assertTrue(r.ok, r.message())
        self.assertEqual([c.name for c in r.cases],
                         ["eager", "global", "global+capture", "thread_local",
                          "thread_local+capture", "relaxed", "relaxed+capture", "compile"])
        self.assertEqual([c.runs for c in r.cases], [3, 3, 3, 3, 3, 3, 3, 5])
        self.assertIsNone(r.raise_if_failed().case("global").diagnosis)

    def test_a_stream_outside_the_capture_is_stale_data(self):
        r = self._check(self._side(wait=False, join_back=False), modes=("global",))
        self.assertTrue(r.case("eager").ok)  # no timing here: eagerly it is right
        case = r.case("global")
        self.assertEqual((case.captured, case.runs, case.wrong_runs), (True, 3, 3))
        self.assertTrue(all(w.unchanged for w in case.wrong))
        self.assertTrue(case.diagnosis.headline.startswith(
            "stale data after replay 1 of 3: output out differs"), case.diagnosis.headline)
        self.assertIn("is not in the graph", case.diagnosis.meaning)
        with self.assertRaises(AssertionError) as info:
            r.raise_if_failed()
        self.assertIn("[global] stale data after replay 1 of 3", str(info.exception))

    def test_a_stream_not_joined_back_is_unjoined_work(self):
        r = self._check(self._side(join_back=False))
        self.assertTrue(r.case("eager").ok)
        for mode in dt.MODES:
            d = r.case(mode).diagnosis
            self.assertEqual(d.headline,
                             "capture broke: unjoined work (cudaErrorStreamCaptureUnjoined)")
            self.assertEqual(d.where, "raised when the capture ended (no call of the op raised)")
        self.assertIn("[global, thread_local, relaxed] capture broke: unjoined work",
                      r.message())

    def test_a_sync_is_named_with_its_line(self):
        torch = self.torch

        def syncing(x):
            y = torch.mul(x, 2, out=torch.empty_like(x))
            torch.cuda.synchronize()
            return y

        r = self._check(syncing)
        for mode in dt.MODES:
            d = r.case(mode).diagnosis
            self.assertEqual(d.category, "sync during capture")
            self.assertIn(_SYNC_MSG, d.said)
            self.assertIn("test_testing_cpu.py", d.where)
            self.assertTrue(d.where.endswith("in syncing: torch.cuda.synchronize()"), d.where)

    def test_a_query_passes_relaxed_alone_and_fails_beside_a_global_capture(self):
        torch, other = self.torch, self.torch.cuda.Stream()

        def querying(x):
            y = torch.mul(x, 2, out=torch.empty_like(x))
            other.query()
            return y

        r = self._check(querying, modes=("global", "relaxed"), neighbour=(None, "capture"))
        verdicts = {c.name: (c.diagnosis.category if c.diagnosis else "ok") for c in r.cases}
        self.assertEqual(verdicts, {"eager": "ok", "global": "sync during capture",
                                    "global+capture": "sync during capture", "relaxed": "ok",
                                    "relaxed+capture": "sync during capture"})
        # The neighbour's GLOBAL capture was invalidated by the op's query.
        self.assertTrue(r.case("relaxed+capture").neighbour_errors)
        self.assertFalse(r.case("relaxed").neighbour_errors)

    def test_an_op_in_place_is_compared_with_the_values_written(self):
        torch = self.torch

        def in_place(x):
            return torch.mul(x, 2, out=x)

        r = self._check(in_place)
        self.assertTrue(r.ok, r.message())

    def test_an_op_that_fails_eagerly_skips_the_captures(self):
        r = self._check(lambda x: None, modes=("global",))
        self.assertEqual([c.capture_status for c in r.cases], ["-", "skipped"])
        self.assertIn("returned no outputs", r.case("eager").diagnosis.headline)

    def test_inputs_must_hold_a_cuda_tensor(self):
        with self.assertRaises(ValueError):
            dt.check_capture(lambda v: v, 3.0)



def _double(x):
    """A module-level op: the child of check_capture(isolate=True) imports it by name."""
    import torch

    print("the op ran in the child")
    return torch.mul(x, 2, out=torch.empty_like(x))


def _fake_torch_dir(tmp):
    """A folder with the fake PyTorch as a package named torch, for child
    processes (spawned check_capture, a pytest of its own)."""
    os.makedirs(os.path.join(tmp, "torch"))
    with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
        # The child's harness asks libcuda.so.1 about the streams it made, as
        # in the parent (setUp): the fake driver, whose handles these are (a
        # GPU machine's real driver crashed the child on them).
        f.write(f"_SYNC_MSG = {_SYNC_MSG!r}\n" + _FAKE_TORCH + "\nimport sys\n"
                "sys.modules.update({'torch': torch, 'torch.cuda': cuda, "
                "'torch.testing': testing})\n"
                "from dlsync.testing import _restore as _dlsync_restore\n"
                "_dlsync_restore.Driver = lambda: torch.fake_driver\n")
    return tmp


@unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present: tests/gpu runs the real one")
@unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present: tests/gpu runs the real one")
class ReplayStreamsOnAFakeTorch(_FakeTorchCase):
    """The streams at replay beside each verdict, with a counter that reads
    the fake PyTorch's streams (as CUPTI's records name them)."""

    def _fresh_side_per_call(self):
        """An op whose every call runs on a new stream: the fake counter
        names capture streams, so its count grows with the calls (on a GPU,
        CUPTI names the streams a replay runs on, which grow where each
        call's work stays parallel to the next call's)."""
        torch, out = self.torch, self.out

        def op(x):
            cur = torch.cuda.current_stream()
            side = torch.cuda.Stream()  # a new stream at every call
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                torch.mul(x, 3, out=out)
            cur.wait_stream(side)
            return out

        return op

    def test_one_side_stream_counted_and_not_growing(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = self._check(self._side(), neighbour=(None, "capture"))
        self.assertTrue(r.ok, r.message())
        self.assertEqual([w for w in seen if issubclass(w.category, dt.ReplayStreamsWarning)],
                         [])
        for mode in dt.MODES:
            c = r.case(mode)
            self.assertEqual((c.replay_streams, c.replay_streams_two_calls), (1, 1))
            self.assertFalse(c.streams_grow)
            n = r.case(f"{mode}+capture")  # beside a neighbour: no second capture
            self.assertEqual((n.replay_streams, n.replay_streams_two_calls), (1, None))
        self.assertIsNone(r.case("eager").replay_streams)
        rows = r.rows()
        self.assertTrue(rows[1].endswith("ok; streams at replay: 1"), rows[1])
        self.assertTrue(rows[0].endswith("ok"), rows[0])  # eager: nothing counted
        self.assertNotIn("warning", r.message())
        self.assertEqual(r.records()[1]["replay_streams"], 1)

    def test_a_stream_per_call_grows_and_warns(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            r = self._check(self._fresh_side_per_call())
        self.assertTrue(r.ok, r.message())  # a warning, not a failure
        for mode in dt.MODES:
            c = r.case(mode)
            self.assertEqual((c.replay_streams, c.replay_streams_two_calls), (1, 2))
            self.assertTrue(c.streams_grow)
        self.assertIn("ok; streams at replay: 1, 2 for two calls (grows)", r.table())
        self.assertIn("[global, thread_local, relaxed] warning: the streams at replay grow with "
                      "the number of calls (one call: 1, two calls in one capture: 2)",
                      r.message())
        warned = [w for w in seen if issubclass(w.category, dt.ReplayStreamsWarning)]
        self.assertEqual(len(warned), 1)
        self.assertIn("grow with the number of calls", str(warned[0].message))
        rec = r.records()[1]
        self.assertEqual((rec["replay_streams"], rec["replay_streams_two_calls"]), (1, 2))

    def test_without_cupti_the_report_says_why_and_nothing_fails(self):
        _streams.set_counter(_NoCounter("libcupti not found (set DLSYNC_CUPTI_LIB to its path)"))
        r = self._check(self._side())
        self.assertTrue(r.ok, r.message())
        self.assertTrue(r.rows()[1].endswith("ok; streams at replay: n/a"), r.rows()[1])
        self.assertIn("[global, thread_local, relaxed] streams at replay: n/a (libcupti not "
                      "found (set DLSYNC_CUPTI_LIB to its path))", r.message())
        self.assertEqual(r.records()[1]["replay_streams_why"],
                         "libcupti not found (set DLSYNC_CUPTI_LIB to its path)")

    def test_two_calls_that_cannot_be_captured_are_said_not_failed(self):
        torch, out = self.torch, self.out
        seen = set()

        def once_per_capture(x):
            g = torch.cuda.current_stream().graph
            if g is not None:
                if id(g) in seen:
                    raise RuntimeError("called twice in one capture")
                seen.add(id(g))
            return torch.mul(x, 3, out=out)

        r = self._check(once_per_capture, modes=("global",))
        self.assertTrue(r.ok, r.message())
        c = r.case("global")
        self.assertEqual((c.replay_streams, c.replay_streams_two_calls), (1, None))
        self.assertTrue(r.rows()[1].endswith("ok; streams at replay: 1"), r.rows()[1])
        self.assertIn("[global] streams at replay of two calls: n/a (RuntimeError: called twice "
                      "in one capture)", r.message())

    def test_a_failing_count_is_said_not_failed(self):
        class Raising:
            def count(self, run):
                raise RuntimeError("boom")

        _streams.set_counter(Raising())
        r = self._check(self._side(), modes=("global",))
        self.assertTrue(r.ok, r.message())
        self.assertIn("streams at replay: n/a (the counted replay raised RuntimeError: boom)",
                      r.message())


class CuptiCounterWithoutAGpu(unittest.TestCase):
    def test_a_missing_library_is_said_and_nothing_runs(self):
        ran = []
        c = _streams.CuptiCounter(path=os.path.join(tempfile.gettempdir(), "no-such-lib.so"))
        n, why = c.count(lambda: ran.append(1))
        self.assertIsNone(n)
        self.assertIn("libdlsync_cupti_streams.so not found", why)
        self.assertEqual(ran, [])

    def test_the_built_counter_refuses_with_a_reason_here(self):
        lib = os.path.join(os.path.dirname(os.environ.get("DLSYNC_LIBRARY", "")),
                           _streams.LIBRARY)
        if not os.path.isfile(lib):
            self.skipTest(f"{lib} is not built here (no cupti.h)")
        if dt.gpu_unavailable_reason() == "":
            self.skipTest("a GPU is present: tests/gpu counts for real")
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from dlsync.testing import _streams; ran = []; "
                "print(repr(_streams.CuptiCounter(sys.argv[2]).count(lambda: ran.append(1)) "
                "+ (ran,)))")
        for env_extra in ({}, {"DLSYNC_CUPTI_LIB": "/no/such/libcupti.so"}):
            done = subprocess.run([sys.executable, "-c", code, PYTHON_DIR, lib],
                                  env=dict(_env(), **env_extra), capture_output=True, text=True,
                                  timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            n, why, ran = eval(done.stdout.strip())  # noqa: S307 - our own child's repr
            self.assertIsNone(n)
            self.assertTrue(why, "no reason given")
            self.assertEqual(ran, [])
            if env_extra:
                self.assertIn("libcupti not found", why)


class RestoreOnAFakeTorch(_FakeTorchCase):
    """What a failed capture leaves in PyTorch 2.11 (as the fake models it:
    the default generator in capture mode, the allocator's pool underway, a
    stream still capturing) and the harness putting each back."""

    def _draws(self):
        torch = self.torch
        torch.empty(4).uniform_(generator=torch.cuda.default_generators[0])

    def _unjoined(self):
        return self._side(join_back=False)

    def test_the_fake_leaves_what_pytorch_leaves(self):
        # The control: without the harness a failed capture_end leaves the
        # generator in capture mode and the pool underway.
        torch, s = self.torch, self.torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            g.capture_begin()
            self._unjoined()(self.x)
            with self.assertRaises(RuntimeError):
                g.capture_end()
        with self.assertRaises(RuntimeError) as info:
            self._draws()
        self.assertIn("Offset increment outside graph capture", str(info.exception))
        self.assertEqual(len(torch.fake_allocator.underway), 1)

    def test_after_a_failed_capture_the_process_works(self):
        torch = self.torch
        kept = len(dt._restore._KEPT)
        r = self._check(self._unjoined())
        # The three failed graphs (one per mode) stay alive; the passing ones do not.
        self.assertEqual(len(dt._restore._KEPT), kept + 3)
        self.assertEqual(r.case("global").diagnosis.category, "unjoined work")
        for mode in dt.MODES:
            restored = " | ".join(r.case(mode).restored)
            self.assertIn("default generator out of capture mode", restored)
            self.assertIn("ended the allocator's routing to pool", restored)
            self.assertIn("released pool", restored)
            self.assertEqual(r.case(mode).left, [])
        self.assertEqual(torch.fake_allocator.underway, [])
        self._draws()  # a random draw works
        good = self._check(self._side())  # a correct op's check passes
        self.assertTrue(good.ok, good.message())
        g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()  # and a capture of its own
        with torch.cuda.stream(s):
            g.capture_begin()
            torch.mul(self.x, 5, out=self.out)
            g.capture_end()
        self.x.vals = [1.0, 2.0, 3.0, 4.0]
        g.replay()
        self.assertEqual(self.out.vals, [5.0, 10.0, 15.0, 20.0])
        self._draws()
        self.assertEqual(dt._restore.UNCLEAN, [])

    def test_a_capture_the_op_began_and_never_ended_is_ended(self):
        torch, lib = self.torch, self.torch.cuda.Stream()

        def own_graph(x):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(lib):
                g.capture_begin()  # and no capture_end: the stream keeps capturing
            return torch.mul(x, 2, out=torch.empty_like(x))

        r = self._check(own_graph, modes=("global",))
        eager = r.case("eager")
        # The GLOBAL capture the op left open refuses the harness's own sync.
        self.assertEqual(eager.diagnosis.category, "sync during capture")
        self.assertIn(f"ended the capture left open on stream {lib.cuda_stream:#x}",
                      eager.restored)
        self.assertIn(lib.cuda_stream, torch.fake_driver.ended)
        self.assertIsNone(lib.graph)
        self.assertEqual(torch.fake_allocator.underway, [])
        self._draws()
        good = self._check(self._side())
        self.assertTrue(good.ok, good.message())

    def test_mode_stream_and_rng_are_put_back(self):
        torch, other = self.torch, self.torch.cuda.Stream()
        before = torch.cuda.default_generators[0].get_state().vals

        def careless(x):
            torch.fake_driver.exchange_mode(2)  # RELAXED, never set back
            self._draws()  # eagerly: the offset moves
            y = torch.mul(x, 2, out=torch.empty_like(x))
            torch.cuda.set_stream(other)  # and the current stream changed for good
            return y

        r = self._check(careless, modes=("global",))
        self.assertTrue(r.ok, r.message())
        self.assertIn("thread capture mode 2 -> 0", r.case("eager").restored)
        self.assertIn("current stream of cuda:0", r.case("eager").restored)
        self.assertIn("the op left another current stream; set back before capture_end",
                      r.case("global").restored)
        self.assertIn("seed and offset of cuda:0's default generator", r.cases[-1].restored)
        self.assertEqual(torch.fake_driver.exchange_mode(0), 0)
        self.assertIs(torch.cuda.current_stream(), torch.fake_default)
        self.assertEqual(torch.cuda.default_generators[0].get_state().vals, before)

    def test_a_harness_thread_still_running_is_reported_and_marks_the_process(self):
        import threading

        torch = self.torch
        stop = threading.Event()
        snap = dt._restore.take(torch, torch.fake_driver, [0])
        t = threading.Thread(target=stop.wait, name="dlsync-testing-stuck", daemon=True)
        t.start()
        try:
            done, left = dt._restore.after_case(torch, torch.fake_driver, snap,
                                                dt._restore.Watch(torch), [], [])
        finally:
            stop.set()
            t.join()
        self.assertEqual(left, ["harness thread(s) still running: dlsync-testing-stuck"])
        self.assertEqual(dt._restore.UNCLEAN, left)

    def test_without_libcuda_the_driver_touches_nothing(self):
        d = self.saved_driver()  # the real class (setUp replaced it with the fake)
        d.lib = None  # as where libcuda.so.1 cannot be loaded
        self.assertFalse(d.available)
        snap = dt._restore.take(self.torch, d, [0])
        self.assertIsNone(snap.mode)
        done, left = [], []
        dt._restore.end_open_streams(d, [self.side.cuda_stream], done, left)
        dt._restore.put_back(self.torch, d, snap, done, left)
        self.assertEqual((done, left), ([], []))

    def test_the_watch_puts_capture_begin_and_end_back(self):
        cls = self.torch.cuda.CUDAGraph
        begin, end = cls.__dict__["capture_begin"], cls.__dict__["capture_end"]
        self._check(self._unjoined(), modes=("global",))
        self.assertIs(cls.__dict__["capture_begin"], begin)
        self.assertIs(cls.__dict__["capture_end"], end)

        class Sub(cls):  # methods inherited: no attribute of its own afterwards
            pass

        self.torch.cuda.CUDAGraph = Sub
        with dt._restore.Watch(self.torch):
            self.assertIn("capture_begin", vars(Sub))
        self.assertNotIn("capture_begin", vars(Sub))
        self.assertNotIn("capture_end", vars(Sub))

    def test_another_live_threads_capture_is_not_ended(self):
        import threading

        torch, lib = self.torch, self.torch.cuda.Stream()
        began, stop = threading.Event(), threading.Event()
        watch = dt._restore.Watch(torch)

        def user_thread():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(lib):
                g.capture_begin(capture_error_mode="relaxed")
                began.set()
                stop.wait()
                g.capture_end()

        with watch:
            t = threading.Thread(target=user_thread)
            t.start()
            began.wait()
        done, left = [], []
        try:
            dt._restore.end_failed_captures(torch, torch.fake_driver, watch.tracked, done, left)
            self.assertEqual((done, left), ([], []))
            self.assertIsNotNone(lib.graph)  # still capturing: its thread ends it
        finally:
            stop.set()
            t.join()
        self.assertIsNone(lib.graph)

    def test_isolate_runs_the_check_in_a_spawned_child(self):
        with tempfile.TemporaryDirectory() as tmp:
            sys.path.insert(0, _fake_torch_dir(tmp))
            try:
                r = dt.check_capture(_double, self.x, modes=("global",), raise_on_failure=False,
                                     isolate=True)
            finally:
                sys.path.remove(tmp)
        self.assertTrue(r.isolated)
        self.assertTrue(r.ok, r.message())
        self.assertEqual([c.name for c in r.cases], ["eager", "global"])
        self.assertIn("the op ran in the child", r.child_output)
        self.assertIn("(in a child process)", r.message().splitlines()[0])
        with self.assertRaises(ValueError) as info:
            dt.check_capture(lambda x: x, self.x, isolate=True)
        self.assertIn("importable by name", str(info.exception))

PLUGIN_CASES = '''
import sys
import pytest

def test_plain_runs_and_the_plugin_loaded_no_framework():
    assert "torch" not in sys.modules

@pytest.mark.capture_modes("global", "relaxed", replays=2)
def test_marked_body(x):
    return x * 2

def test_fixture(capture_check):
    capture_check(lambda x: x, None)

def test_fixture_body_needs_the_gpu_first(capture_check):
    raise RuntimeError("Torch not compiled with CUDA enabled")

def test_fixture_misspelt_mode(capture_check):
    capture_check(lambda x: x, None, modes=("global", "relaxd"))

def test_fixture_misspelt_option(capture_check):
    capture_check(lambda x: x, None, replay=2)

@pytest.mark.capture_modes(replay=2)
def test_misspelt_option(x):
    return x

@pytest.mark.capture_modes("globl", "relaxed")
def test_misspelt_mode(x):
    return x

@pytest.fixture
def x():
    import torch
    return torch.ones(4, device="cuda")
'''


@unittest.skipUnless(_has_pytest(), "pytest is not installed")
@unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present: tests/gpu runs the plugin")
class Plugin(unittest.TestCase):
    def test_cases_skip_with_the_reason_without_a_gpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "test_plugin_cases.py")
            with open(path, "w") as f:
                f.write(textwrap.dedent(PLUGIN_CASES))
            run = subprocess.run(
                [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider",
                 "-rsE", "-q", path],
                cwd=tmp, env=_env(), capture_output=True, text=True)
            out = run.stdout + run.stderr
            self.assertIn("2 failed, 1 passed, 3 skipped, 2 errors", out, out)
            reason = "dlsync capture check: " + dt.gpu_unavailable_reason()
            self.assertEqual(out.count(reason), 3, out)
            self.assertIn("(the test raised RuntimeError before calling capture_check)", out)
            # The fixture's options are checked before the skip, as the marker's are.
            self.assertIn("ValueError: capture_check: capture mode 'relaxd': expected one of "
                          "global, thread_local, relaxed", out, out)
            self.assertIn("TypeError: capture_check: got an unexpected keyword argument "
                          "'replay'", out, out)
            self.assertIn("unknown capture_modes option(s) replay", out, out)
            # A misspelt mode is an error too, not a skip, without a GPU.
            self.assertIn("test_misspelt_mode: capture_modes: unknown capture mode(s) 'globl'; "
                          "known: global, thread_local, relaxed", out, out)

    def test_the_marker_is_registered(self):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", *_plugin_args(), "--markers"],
            env=_env(), capture_output=True, text=True, check=True)
        self.assertIn("@pytest.mark.capture_modes(*modes, replays=3", run.stdout)
        from dlsync.testing import pytest_plugin

        line = next(x for x in run.stdout.splitlines() if "capture_modes(" in x)
        for option in pytest_plugin._OPTIONS:
            self.assertIn(f"{option}=", line)


def _pyproject_entry_points(group):
    """``name = value`` lines of pyproject.toml's [project.entry-points.<group>]."""
    header = f"[project.entry-points.{group}]"
    lines, inside = [], False
    with open(os.path.join(SOURCE_ROOT, "pyproject.toml")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                inside = line == header
            elif inside and "=" in line and not line.startswith("#"):
                name, value = (x.strip().strip('"') for x in line.split("=", 1))
                lines.append(f"{name} = {value}")
    return lines


@unittest.skipUnless(_has_pytest(), "pytest is not installed")
class PluginEntryPoint(unittest.TestCase):
    """The plugin as an installed dlsync declares it (pyproject.toml's pytest11
    entry point, in a dist-info on the path), with each way docs/testing.md
    gives to load it or keep it out."""

    def run_pytest(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            info = os.path.join(tmp, "dlsync_entry_point-0.dist-info")
            os.makedirs(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write("Metadata-Version: 2.1\nName: dlsync-entry-point\nVersion: 0\n")
            points = _pyproject_entry_points("pytest11")
            self.assertTrue(points, "pyproject.toml declares the pytest11 entry point")
            with open(os.path.join(info, "entry_points.txt"), "w") as f:
                f.write("[pytest11]\n" + "\n".join(points) + "\n")
            with open(os.path.join(tmp, "test_one.py"), "w") as f:
                f.write("def test_one(capture_check):\n    pass\n")
            env = _env()
            env["PYTHONPATH"] = tmp + os.pathsep + env["PYTHONPATH"]
            env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
            run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                                  *args, "test_one.py"], cwd=tmp, env=env, capture_output=True,
                                 text=True, timeout=120)
            return run.returncode, run.stdout + run.stderr

    def test_the_documented_dash_p_with_the_entry_point_installed(self):
        code, out = self.run_pytest("-p", "dlsync.testing.pytest_plugin")
        self.assertNotIn("already registered", out)
        self.assertEqual(code, 0, out)
        self.assertIn("1 passed", out, out)

    def test_the_entry_point_alone(self):
        code, out = self.run_pytest()
        self.assertEqual(code, 0, out)
        self.assertIn("1 passed", out, out)

    def test_dash_p_no_keeps_it_out(self):
        code, out = self.run_pytest("-p", "no:dlsync.testing.pytest_plugin")
        self.assertNotEqual(code, 0, out)
        self.assertIn("fixture 'capture_check' not found", out, out)


class _Recorder:
    """A stand-in module: every attribute path called is logged."""

    def __init__(self, log, name, answers=None):
        self._log, self._name, self._answers = log, name, answers or {}

    def __getattr__(self, attr):
        return _Recorder(self._log, f"{self._name}.{attr}", self._answers)

    def __call__(self, *args):
        self._log.append(self._name)
        if self._name in self._answers:
            return self._answers[self._name]
        return self  # what a call returns is recorded under the same name


@unittest.skipUnless(_has_pytest(), "pytest is not installed (the GPU suite's conftest needs it)")
class GpuSuiteMemory(unittest.TestCase):
    """python/tests/gpu/conftest.py: what one pytest process of the GPU suite
    gives back between tests, without a GPU (stand-in frameworks)."""

    def conftest(self):
        import importlib.util

        path = os.path.join(SOURCE_ROOT, "python", "tests", "gpu", "conftest.py")
        spec = importlib.util.spec_from_file_location("dlsync_gpu_conftest", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def test_jax_is_told_not_to_preallocate_before_it_can_be_imported(self):
        conftest = os.path.join(SOURCE_ROOT, "python", "tests", "gpu", "conftest.py")
        code = ("import importlib.util, os, sys\n"
                f"spec = importlib.util.spec_from_file_location('c', {conftest!r})\n"
                "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
                "print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'), 'jax' in sys.modules)")
        env = _env()
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "false False", out.stderr)

    def test_nothing_is_imported_to_be_freed(self):
        c = self.conftest()
        before = {m for m in ("torch", "cupy", "jax") if m in sys.modules}
        self.assertEqual(c.free_gpu_caches({}), [])
        self.assertEqual(c.jax_arrays({}), set())
        self.assertEqual({m for m in ("torch", "cupy", "jax") if m in sys.modules}, before)

    def test_each_imported_framework_gives_back_its_cache(self):
        c = self.conftest()
        log = []

        class Array:
            def __init__(self, name):
                self.name = name

            def delete(self):
                log.append(f"delete {self.name}")

        old, new = Array("old"), Array("new")
        torch = _Recorder(log, "torch", {"torch.cuda.is_available": True,
                                         "torch.cuda.is_initialized": True})
        cupy = _Recorder(log, "cupy")
        jax = _Recorder(log, "jax", {"jax.live_arrays": [old, new]})
        freed = c.free_gpu_caches({"torch": torch, "cupy": cupy, "jax": jax}, keep={id(old)})
        self.assertEqual(freed, ["torch", "cupy", "jax"])
        calls = [x for x in log if not x.startswith(("torch.cuda.is_", "jax.live"))]
        self.assertEqual(calls, [
            "torch.cuda.synchronize", "torch.cuda.empty_cache",
            "cupy.cuda.runtime.deviceSynchronize",
            "cupy.get_default_memory_pool", "cupy.get_default_memory_pool.free_all_blocks",
            "cupy.get_default_pinned_memory_pool",
            "cupy.get_default_pinned_memory_pool.free_all_blocks",
            "delete new", "jax.clear_caches"])

    def test_an_uninitialised_torch_is_left_alone(self):
        c = self.conftest()
        log = []
        torch = _Recorder(log, "torch", {"torch.cuda.is_available": True,
                                         "torch.cuda.is_initialized": False})
        self.assertEqual(c.free_gpu_caches({"torch": torch}), [])
        self.assertNotIn("torch.cuda.empty_cache", log)


PLUGIN_FAKE_CASES = '''
import threading
import pytest
import torch

side = torch.cuda.Stream()

@pytest.fixture
def x():
    return torch.tensor([1.0, 2.0, 3.0, 4.0])

@pytest.mark.capture_modes("global", replays=2)
def test_unjoined(x):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        return torch.mul(x, 3, out=torch.empty_like(x))

@pytest.mark.capture_modes("global")
def test_leaves_a_thread(x):
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="dlsync-testing-stray", daemon=True).start()
    return torch.mul(x, 2, out=torch.empty_like(x))

@pytest.mark.capture_modes("global")
def test_after(x):
    return torch.mul(x, 2, out=torch.empty_like(x))

@pytest.mark.capture_modes("relaxed", isolate=True)
def test_marked_isolated(x):
    return torch.mul(x, 4, out=torch.empty_like(x))
'''


@unittest.skipUnless(_has_pytest(), "pytest is not installed")
@unittest.skipIf(dt.gpu_unavailable_reason() == "", "a GPU is present: tests/gpu runs the plugin")
class PluginOnAFakeTorch(unittest.TestCase):
    """The plugin in a pytest of its own, on the fake PyTorch: the JSON
    report, isolation by marker, and isolation chosen after a case that left
    state behind."""

    def test_report_and_isolation(self):
        import json

        with tempfile.TemporaryDirectory() as tmp:
            _fake_torch_dir(os.path.join(tmp, "fake"))
            cases = os.path.join(tmp, "cases")
            os.makedirs(cases)
            with open(os.path.join(cases, "test_fake_cases.py"), "w") as f:
                f.write(textwrap.dedent(PLUGIN_FAKE_CASES))
            env = _env()
            env["PYTHONPATH"] = os.path.join(tmp, "fake") + os.pathsep + env["PYTHONPATH"]
            report = os.path.join(tmp, "report.json")
            run = subprocess.run(
                [sys.executable, "-m", "pytest", *_plugin_args(), "-p", "no:cacheprovider",
                 "-q", f"--dlsync-report={report}", "test_fake_cases.py"],
                cwd=cases, env=env, capture_output=True, text=True, timeout=300)
            out = run.stdout + run.stderr
            self.assertIn("1 failed, 3 passed", out, out)
            with open(report) as f:
                records = json.load(f)["records"]
        by = {(r["test"].split("::")[-1], r["case"]): r for r in records}
        self.assertEqual(sorted(by), sorted([
            ("test_unjoined", "eager"), ("test_unjoined", "global"),
            ("test_leaves_a_thread", "eager"), ("test_leaves_a_thread", "global"),
            ("test_after", "eager"), ("test_after", "global"),
            ("test_marked_isolated", "eager"), ("test_marked_isolated", "relaxed")]), records)
        bad = by[("test_unjoined", "global")]
        self.assertEqual((bad["verdict"], bad["category"], bad["mode"]),
                         ("failed", "unjoined work", "global"))
        self.assertEqual(bad["first_error"], "RuntimeError: CUDA error: capturing stream has "
                                             "unjoined work")
        self.assertEqual(bad["where"], "raised when the capture ended (no call of the op raised)")
        self.assertIn("default generator out of capture mode", " ".join(bad["restored"]))
        self.assertEqual(by[("test_unjoined", "eager")]["verdict"], "ok")
        self.assertIn("harness thread(s) still running: dlsync-testing-stray",
                      " ".join(by[("test_leaves_a_thread", "eager")]["left"]))
        # Not isolated until a case left state behind; then every check is.
        self.assertEqual([by[(t, "eager")]["isolated"] for t in
                          ("test_unjoined", "test_leaves_a_thread", "test_after",
                           "test_marked_isolated")], [False, False, True, True])
        self.assertIn("checks after this ran in child processes", out, out)
        self.assertIn("test_after: passed (in a child process)", out, out)


if __name__ == "__main__":
    unittest.main()
