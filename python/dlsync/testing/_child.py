# SPDX-License-Identifier: Apache-2.0
"""check_capture(isolate=True): the check in a child process.

The child is spawned (a fresh interpreter, never a fork of a process whose
CUDA state may be broken). It receives the op by reference (pickle), the
CUDA tensor inputs as CPU copies with their device index, runs the check
there with ``raise_on_failure=False`` and sends back the report; the parent
returns it with what the child printed (``report.child_output``)."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import sys
import tempfile
import traceback
from typing import Any, Dict, List, Tuple

_CUDA = "__dlsync_testing_cuda_tensor__"


def _pack_inputs(inputs: Tuple[Any, ...]) -> List[Any]:
    out = []
    for a in inputs:
        if getattr(a, "is_cuda", False) and hasattr(a, "cpu"):
            from ._harness import _device_index

            out.append((_CUDA, a.detach().cpu(), _device_index(a.device)))
        else:
            out.append(a)
    return out


def _unpack_inputs(packed: List[Any]) -> Tuple[Any, ...]:
    out = []
    for a in packed:
        if isinstance(a, tuple) and len(a) == 3 and a[0] == _CUDA:
            out.append(a[1].to(f"cuda:{a[2]}"))
        else:
            out.append(a)
    return tuple(out)


def _picklable(what: str, obj: Any) -> None:
    if obj is None:
        return
    try:
        pickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - said in the ValueError
        raise ValueError(
            f"check_capture(isolate=True): {what} {obj!r} cannot be sent to a child process "
            f"({type(e).__name__}: {e}); use a function defined at module level (importable by "
            "name), or run the test in a child process with the pytest plugin "
            "(@pytest.mark.capture_modes(..., isolate=True) or --dlsync-isolate)") from e


def _child_main(payload: bytes, out_path: str) -> None:
    """Runs in the spawned child: the check, its report pickled to out_path."""
    result: Dict[str, Any] = {}
    try:
        fn, packed, options = pickle.loads(payload)
        from dlsync.testing import check_capture

        inputs = _unpack_inputs(packed)
        result["report"] = check_capture(fn, *inputs, raise_on_failure=False, isolate=False,
                                         **options)
    except BaseException:  # noqa: BLE001 - sent to the parent as text
        result["error"] = traceback.format_exc()
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


def run_isolated(fn: Any, inputs: Tuple[Any, ...], options: Dict[str, Any]) -> Any:
    """The report of check_capture(fn, *inputs, **options) run in a spawned
    child process."""
    _picklable("fn", fn)
    _picklable("reference", options.get("reference"))
    _picklable("new_inputs", options.get("new_inputs"))
    packed = _pack_inputs(inputs)
    payload = pickle.dumps((fn, packed, options))
    ctx = multiprocessing.get_context("spawn")
    fd, out_path = tempfile.mkstemp(prefix="dlsync-testing-", suffix=".pickle")
    os.close(fd)
    log_fd, log_path = tempfile.mkstemp(prefix="dlsync-testing-", suffix=".log")
    try:
        # The child's stdout and stderr go to a file the parent prints from.
        saved = os.dup(1), os.dup(2)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            proc = ctx.Process(target=_child_main, args=(payload, out_path),
                               name="dlsync-testing-child")
            proc.start()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        proc.join()
        os.close(log_fd)
        log_fd = -1
        with io.open(log_path, errors="replace") as f:
            output = f.read()
        result: Dict[str, Any] = {}
        if os.path.getsize(out_path) > 0:
            with open(out_path, "rb") as f:
                result = pickle.load(f)
        if "report" not in result:
            raise RuntimeError(
                "check_capture(isolate=True): the child process gave no report (exit code "
                f"{proc.exitcode})\n" + result.get("error", "") + output[-4000:])
        report = result["report"]
        report.isolated = True
        report.child_output = output
        return report
    finally:
        if log_fd >= 0:
            os.close(log_fd)
        for p in (out_path, log_path):
            try:
                os.unlink(p)
            except OSError:
                pass
