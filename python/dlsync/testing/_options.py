# SPDX-License-Identifier: Apache-2.0
"""check_capture's options and the plain helpers of the harness: the
argument checks, the outputs to compare, an exception's messages and where
it was raised, and whether a GPU is there. No framework is imported."""

from __future__ import annotations

import traceback
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from .report import user_frame

MODES = ("global", "thread_local", "relaxed")
NEIGHBOURS = (None, "eager", "capture")
_WAIT_S = 60.0  # the longest a thread waits for the other; past it the case fails


# ---- argument checks and plain helpers (no framework needed) ----


def _check_args(modes: Sequence[str], replays: int, neighbour: Any, rtol: Any, atol: Any,
                slow_producer_ms: float) -> Tuple[Tuple[str, ...], Tuple[Optional[str], ...]]:
    """Validates check_capture's options; returns (modes, neighbours)."""
    if isinstance(modes, str):
        modes = (modes,)
    modes = tuple(modes)
    for m in modes:
        if m not in MODES:
            raise ValueError(f"capture mode {m!r}: expected one of {', '.join(MODES)}")
    if isinstance(replays, bool) or not isinstance(replays, int) or replays < 1:
        raise ValueError(f"replays must be an int >= 1, not {replays!r}")
    if neighbour is None or isinstance(neighbour, str):
        neighbours: Tuple[Optional[str], ...] = (neighbour,)
    else:
        neighbours = tuple(neighbour)
    for n in neighbours:
        if n not in NEIGHBOURS:
            raise ValueError(f"neighbour {n!r}: expected None, 'eager' or 'capture'")
    if (rtol is None) != (atol is None):
        raise ValueError("rtol and atol go together (as torch.testing.assert_close takes them)")
    if not slow_producer_ms >= 0:
        raise ValueError(f"slow_producer_ms must be >= 0, not {slow_producer_ms!r}")
    return modes, neighbours


def _flatten(obj: Any, path: str = "out") -> Iterator[Tuple[str, Any]]:
    """(path, leaf) for every leaf of nested tuples, lists and dicts."""
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{path}[{k!r}]")
    else:
        yield path, obj


def _require_outputs(out: Any) -> None:
    if all(leaf is None for _, leaf in _flatten(out)):
        raise ValueError("the op returned no outputs to compare (None): return them, e.g. "
                         "`return out` for an op that writes into `out`")


def _mismatch_summary(text: str) -> str:
    """The lines of an assert_close message that say how much differs."""
    keep = [line.strip() for line in text.splitlines()
            if line.strip().startswith(("Mismatched elements", "Greatest absolute",
                                        "Greatest relative"))]
    if keep:
        return "; ".join(keep)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[:2])[:300]


def _chain(exc: BaseException) -> List[BaseException]:
    """exc and the exceptions it was raised from or during, root cause first."""
    out: List[BaseException] = []
    seen = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    out.reverse()
    return out


def _messages(exc: BaseException) -> List[str]:
    return [f"{type(e).__name__}: {e}" for e in _chain(exc)]


def _where(exc: BaseException) -> str:
    """The op's own frame nearest the error: the innermost exception's
    traceback first; where that one holds no frame of the op (raised in
    dlsync or a framework called back from C code, e.g. a __dlpack__ that
    torch.from_dlpack calls), the next exception of the chain, whose
    traceback reaches the op's line."""
    for e in _chain(exc):
        frames = [(f.filename, f.lineno, f.name, f.line) for f in
                  traceback.extract_tb(e.__traceback__)]
        where = user_frame(frames)
        if where:
            return where
    return ""


def gpu_unavailable_reason() -> str:
    """Why check_capture cannot run here ("" when it can): PyTorch missing,
    or no CUDA GPU."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        return f"PyTorch is not installed ({e})"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
    except Exception as e:  # noqa: BLE001 - a broken driver install says so here
        return f"CUDA is not usable: {e}"
    return ""
