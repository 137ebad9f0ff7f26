# SPDX-License-Identifier: Apache-2.0
"""Collects each case's outcome (with dlsync, and the control without it),
asserts it, and prints the table at the end of the session.

One pytest process runs every case, so what one case takes on the GPU must
not stay for the next (on an 80 GB H100 the suite ran out of memory after a
point): JAX allocates on demand (no preallocation of 75% of the GPU, set
here before jax can be imported), and after each test the frameworks that
were imported give back what they cache (free_gpu_caches). The largest
buffers are 512 MiB (N = 1 << 27 floats in test_frameworks.py and
test_reach.py; 8192 x 8192 float matrices, 256 MiB each, in test_reach's JAX
producer); a case holds a few of them at once."""
import gc
import os
import sys
import warnings

import pytest

# Before any test module imports jax: its client would otherwise reserve 75%
# of the GPU's memory at its first use and keep it for the whole session.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def jax_arrays(modules=None):
    """The ids of JAX's live arrays (none where jax was not imported)."""
    jax = (sys.modules if modules is None else modules).get("jax")
    return set() if jax is None else {id(a) for a in jax.live_arrays()}


def free_gpu_caches(modules=None, keep=frozenset()):
    """Gives back the GPU memory the frameworks that this process imported
    hold in their caches: PyTorch's caching allocator (after a device
    synchronisation, so that nothing queued still uses a block), CuPy's
    default memory pools, and JAX's live arrays made since ``keep`` (their
    ids) was taken: deleted, a test's arrays being dead once it returned. A
    framework that was not imported is not imported (``modules``:
    sys.modules, or a stand-in for a test). Returns the names of those it
    freed."""
    modules = sys.modules if modules is None else modules
    freed = []
    gc.collect()  # the last test's tensors and arrays, held in cycles
    for name, free in (("torch", _free_torch), ("cupy", _free_cupy), ("jax", _free_jax)):
        module = modules.get(name)
        if module is None:
            continue
        try:
            if free(module, keep):
                freed.append(name)
        except Exception as e:  # noqa: BLE001 - a test left the device unusable: say so
            warnings.warn(f"freeing {name}'s GPU memory after the test failed: "
                          f"{type(e).__name__}: {e}")
    return freed


def _free_torch(torch, keep):
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return True


def _free_cupy(cupy, keep):
    cupy.cuda.runtime.deviceSynchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return True


def _free_jax(jax, keep):
    for array in jax.live_arrays():
        if id(array) not in keep:
            array.delete()
    jax.clear_caches()
    return True


@pytest.fixture(autouse=True)
def _free_gpu_memory_after_each_test():
    keep = jax_arrays()
    yield
    free_gpu_caches(keep=keep)

_rows = []


@pytest.fixture
def record():
    def _record(case, setting, mode, with_dlsync, control):
        runs, wrong, broken, note = with_dlsync
        _, c_wrong, c_broken, c_note = control
        ok_with = runs > 0 and wrong == 0 and broken == 0
        control_failed = c_wrong > 0 or c_broken > 0
        verdict = "PASS" if ok_with and control_failed else "FAIL"
        _rows.append((case, setting, mode, runs, wrong, broken, c_wrong, c_broken, verdict,
                      note, c_note))
        assert ok_with, f"with dlsync: {runs} runs, {wrong} wrong, {broken} broken ({note})"
        assert control_failed, "the control without dlsync did not fail: the case cannot fail"

    return _record


_harness = []


@pytest.fixture
def harness_row():
    """A row of the harness table (test_harness_hygiene.py): what was
    checked, whether it passed, the check's time, what the harness said."""

    def _row(test, what, ok, seconds, note):
        _harness.append((test, what, "PASS" if ok else "FAIL", seconds, note))

    return _row


def pytest_terminal_summary(terminalreporter):
    _frameworks(terminalreporter.write_line)
    _harness_table(terminalreporter.write_line)


def _harness_table(w):
    if not _harness:
        return
    w("")
    w(f"{'dlsync.testing in a suite':32} {'what':44} {'time':>6}   verdict")
    for test, what, verdict, seconds, _ in _harness:
        t = "" if seconds is None else f"{seconds:5.2f}s"
        w(f"{test:32} {what[:44]:44} {t:>6}   {verdict}")
    w("what the harness said:")
    for test, _, verdict, _, note in _harness:
        w(f"  {test}: {note[:300]}")
    passed = sum(1 for r in _harness if r[2] == "PASS")
    w(f"harness: {passed} passed, {len(_harness) - passed} failed")


def _frameworks(w):
    if not _rows:
        return
    w("")
    w(f"{'case':20} {'setting':17} {'mode':13} {'runs':>5} {'wrong':>5} {'broke':>5}"
      f"   {'ctl-w':>5} {'ctl-b':>5}   verdict")
    for r in _rows:
        w(f"{r[0]:20} {r[1]:17} {r[2]:13} {r[3]:5} {r[4]:5} {r[5]:5}   {r[6]:5} {r[7]:5}   {r[8]}")
    w("")
    w("controls (without dlsync), first line of what went wrong:")
    for r in _rows:
        if r[10]:
            w(f"  {r[0]} [{r[2]}]: {r[10]}")
    passed = sum(1 for r in _rows if r[8] == "PASS")
    w(f"{passed} passed, {len(_rows) - passed} failed")
