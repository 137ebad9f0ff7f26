# SPDX-License-Identifier: Apache-2.0
"""The capture-conformance report: what each case saw, what it means in CUDA's
terms, and what to do about it.

Plain Python (no framework, no GPU): :mod:`dlsync.testing` fills
:class:`CaseResult` objects on the GPU, and everything here turns them into a
table and a diagnosis, so that this part is tested anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "ERROR_TABLE",
    "ErrorKind",
    "Diagnosis",
    "WrongOutput",
    "CaseResult",
    "CaptureReport",
    "classify_error",
    "diagnose",
    "user_frame",
]


@dataclass(frozen=True)
class ErrorKind:
    """One row of :data:`ERROR_TABLE`: a failure that CUDA (or PyTorch, or
    dlsync) reports by an error string, and what a person should do."""

    category: str  # short name, used in the table and by tests
    cuda: str  # CUDA's name for it
    patterns: Tuple[str, ...]  # lower-case substrings of the messages that say it
    meaning: str
    advice: str


_WRAP = "import through dlsync.wrap inside dlsync.scope()"

# Most specific first: a chain of errors is diagnosed by the first row that
# matches any message of it, so "invalidated" (the capture ended because of an
# earlier error) only answers when nothing names that earlier error.
ERROR_TABLE: Tuple[ErrorKind, ...] = (
    ErrorKind(
        "CAI stream sync",
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (cuStreamSynchronize)",
        (
            "custreamsynchronize results in cuda_error_stream_capture_unsupported",
            "numba_cuda_array_interface_sync",
        ),
        "a __cuda_array_interface__ consumer (Numba's cuda.as_cuda_array, or a Numba kernel given "
        "a foreign array) synchronised the host on the producer's CAI stream, as Numba does by "
        "default (NUMBA_CUDA_ARRAY_INTERFACE_SYNC=1); cuStreamSynchronize on a capturing stream, "
        "or on any stream while a GLOBAL capture runs, is refused (operation not permitted when "
        "stream is capturing) and invalidates the capture",
        "hand the consumer dlsync.wrap(x, consumer=stream) inside dlsync.scope(), with the stream "
        "its kernel launches on: reading its __cuda_array_interface__ orders that stream after "
        "the producer and exports stream None, so Numba does not synchronise. Turning "
        "NUMBA_CUDA_ARRAY_INTERFACE_SYNC off alone leaves the read unordered",
    ),
    ErrorKind(
        "sync during capture",
        "cudaErrorStreamCaptureUnsupported",
        (
            "operation not permitted when stream is capturing",
            "streamcaptureunsupported",
            "stream_capture_unsupported",
            "operation not permitted on an event last recorded in a capturing stream",
            "capturedevent",
            "captured_event",
        ),
        "a call that waits for or asks about the GPU's progress (cudaDeviceSynchronize, "
        "cudaStreamSynchronize, cudaStreamQuery, cudaEventQuery/Synchronize, .item(), .cpu(), a "
        "synchronous copy or a cudaMalloc) was made while a stream was capturing, or while another "
        "thread captured in GLOBAL mode; CUDA refused it and invalidated the capture",
        "remove the synchronisation from the op (order streams with events: dlsync.exchange), "
        "allocate before the capture, and keep host reads of device data out of captured code",
    ),
    ErrorKind(
        "legacy stream",
        "cudaErrorStreamCaptureImplicit",
        (
            "operation would make the legacy stream depend on a capturing blocking stream",
            "streamcaptureimplicit",
            "stream_capture_implicit",
            "dlsync_error_legacy_stream_in_capture",
        ),
        "work or a wait was queued on the legacy default stream (stream 0, or DLPack stream=None "
        "/ 1) while a blocking stream was capturing; the legacy stream synchronises with every "
        "blocking stream, so CUDA invalidated the capture",
        "run the consumer on a stream of its own (e.g. `with cupy.cuda.Stream(non_blocking=True):`"
        ") and never ask a producer for stream=None or 1 during a capture",
    ),
    ErrorKind(
        "isolation",
        "cudaErrorStreamCaptureIsolation",
        (
            "dependency created on uncaptured work in another stream",
            "streamcaptureisolation",
            "stream_capture_isolation",
        ),
        "the capturing stream waited on an event recorded outside the capture (an eager "
        "producer: e.g. a library that hands over a tensor by recording an event on its own "
        "stream); a capture may not depend on uncaptured work, so CUDA invalidated it",
        "order the eager producer into the capture with dlsync: dlsync.wrap(x, producer=stream) "
        "inside dlsync.scope(), or dlsync.exchange(producer, capturing stream)",
    ),
    ErrorKind(
        "merge",
        "cudaErrorStreamCaptureMerge",
        ("merge of two independent capture sequences", "streamcapturemerge",
         "stream_capture_merge"),
        "two captures were linked by a plain event record/wait, which would merge them",
        "link two captures with dlsync.exchange (an event-record node in one graph and a "
        "wait node in the other) and launch the producer's graph first",
    ),
    ErrorKind(
        "wrong thread",
        "cudaErrorStreamCaptureWrongThread",
        ("capture sequence from another thread", "streamcapturewrongthread",
         "stream_capture_wrong_thread"),
        "a THREAD_LOCAL capture was continued or ended from another thread",
        "end each capture on the thread that began it, or capture in GLOBAL/RELAXED mode",
    ),
    ErrorKind(
        "capture order",
        "DLSYNC_ERROR_CAPTURE_ORDER",
        ("dlsync_error_capture_order",),
        "dlsync refused an exchange whose consumer could not be joined back into the capture",
        "use dlsync.wrap inside `with dlsync.scope():` (the scope joins the consumer back)",
    ),
    ErrorKind(
        "unjoined work",
        "cudaErrorStreamCaptureUnjoined",
        ("capturing stream has unjoined work", "streamcaptureunjoined",
         "stream_capture_unjoined"),
        "a consumer stream joined the capture and was not joined back before it ended (it joined "
        "by waiting on an event recorded in the capturing stream); CUDA refuses to end a capture "
        "with work that the capturing stream is not ordered after",
        _WRAP + " (the scope joins the consumer back), or end the exchange with "
        "dlsync.exchange(producer, consumer) around the consumer's work",
    ),
    ErrorKind(
        "invalidated",
        "cudaErrorStreamCaptureInvalidated",
        ("operation failed due to a previous error during capture",
         "streamcaptureinvalidated", "stream_capture_invalidated"),
        "an earlier call broke the capture and CUDA invalidated it; the message of that call was "
        "not seen (another library may have swallowed it)",
        "find the first failing call: DLSYNC_DEBUG=TRACE lists dlsync's, and each of the op's "
        "calls may be a synchronisation, the legacy stream or a wait on uncaptured work",
    ),
)

STALE = "stale data"
ERROR = "error"
NEIGHBOUR = "neighbour"
SKIPPED = "skipped"


@dataclass
class Diagnosis:
    category: str  # ERROR_TABLE's category, STALE, ERROR or NEIGHBOUR
    headline: str  # one line: "capture broke: unjoined work (cudaErrorStreamCaptureUnjoined)"
    meaning: str
    advice: str
    said: str = ""  # what CUDA (or the library, or the comparison) said, first line
    where: str = ""  # the op's call that raised, where known

    def lines(self) -> List[str]:
        label = {STALE: "compared", ERROR: "error", SKIPPED: ""}.get(self.category, "CUDA said")
        out = [self.headline]
        for name, text in ((label, self.said), ("what it means", self.meaning),
                           ("where", self.where), ("what to do", self.advice)):
            if text and name:
                out.append(f"  {name}: {text}")
        return out


def classify_error(messages: Iterable[str]) -> Optional[ErrorKind]:
    """The first row of :data:`ERROR_TABLE` (most specific first) whose
    pattern occurs in any of ``messages``; None when no row matches."""
    lowered = [m.lower() for m in messages if m]
    for kind in ERROR_TABLE:
        for text in lowered:
            if any(p in text for p in kind.patterns):
                return kind
    return None


def _first_line(text: str, limit: int = 200) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def _said(messages: Sequence[str], kind: Optional[ErrorKind]) -> str:
    """The first line of the message that the diagnosis rests on."""
    if kind is not None:
        for m in messages:
            if any(p in m.lower() for p in kind.patterns):
                for line in m.splitlines():
                    if any(p in line.lower() for p in kind.patterns):
                        return line.strip()[:200]
                return _first_line(m)
    return _first_line(messages[0]) if messages else ""


@dataclass(frozen=True)
class WrongOutput:
    run: int  # 1-based replay (or call) number
    output: str  # which output: "0", "out[1]", "['y']"
    detail: str  # the comparison's words (mismatched elements, greatest difference)
    unchanged: bool = False  # the output kept its previous value although the inputs changed


@dataclass
class CaseResult:
    """What one case saw. ``mode`` is the capture mode ("eager" when nothing
    was captured, "reduce-overhead" under torch.compile)."""

    name: str
    mode: str
    neighbour: str = "-"
    runs: int = 0  # replays (or calls) whose outputs were compared
    wrong: List[WrongOutput] = field(default_factory=list)
    captured: Optional[bool] = None  # None: no capture in this case
    errors: List[str] = field(default_factory=list)  # the exception chain, root cause first
    where: str = ""
    neighbour_errors: List[str] = field(default_factory=list)
    skipped: str = ""  # why the case did not run
    note: str = ""  # what a passing case does not prove (e.g. nothing was captured)
    restored: List[str] = field(default_factory=list)  # state the case left, put back after it
    left: List[str] = field(default_factory=list)  # state the case left that could not be
    # The streams one replay of the op's graph ran on (CUPTI; dlsync.testing._streams), None
    # where not counted (replay_streams_why says why; "" and None: not a counted case), and
    # those of a graph holding two calls of the op (grows: a stream taken per call).
    replay_streams: Optional[int] = None
    replay_streams_why: str = ""
    replay_streams_two_calls: Optional[int] = None
    replay_streams_note: str = ""

    @property
    def streams_grow(self) -> bool:
        """Whether two calls of the op in one capture replay on more
        streams than one call."""
        return (self.replay_streams is not None and self.replay_streams_two_calls is not None
                and self.replay_streams_two_calls > self.replay_streams)

    @property
    def streams_said(self) -> str:
        """"streams at replay: N" (and the two calls' count where it grew),
        "streams at replay: n/a", or "" where the case counted nothing."""
        if self.replay_streams is not None:
            text = f"streams at replay: {self.replay_streams}"
            if self.streams_grow:
                text += f", {self.replay_streams_two_calls} for two calls (grows)"
            return text
        return "streams at replay: n/a" if self.replay_streams_why else ""

    @property
    def wrong_runs(self) -> int:
        return len({w.run for w in self.wrong})

    @property
    def ok(self) -> bool:
        return (not self.skipped and not self.errors and not self.wrong
                and not self.neighbour_errors and self.captured is not False and self.runs > 0)

    @property
    def capture_status(self) -> str:
        if self.skipped:
            return "skipped"
        if self.captured is None:
            return "-"
        return "ok" if self.captured else "broken"

    @property
    def diagnosis(self) -> Optional[Diagnosis]:
        return None if self.ok else diagnose(self)


def _stale(case: CaseResult) -> Diagnosis:
    first = min(case.wrong, key=lambda w: w.run)
    outputs = sorted({w.output for w in case.wrong})
    all_unchanged = all(w.unchanged for w in case.wrong)
    if case.captured is None and case.mode == "eager":
        headline = (f"stale data in eager call {first.run} of {case.runs}: output "
                    f"{', '.join(outputs)} differs from the reference in {case.wrong_runs} of "
                    f"{case.runs} calls")
        meaning = ("the op read its inputs (or its own intermediate results) before the work "
                   "that wrote them had finished: it runs on a stream that is not ordered after "
                   "the caller's current stream, and the slow producer ahead of each call made "
                   "that visible")
        advice = ("order the op's stream after the caller's (dlsync.exchange(torch.cuda."
                  "current_stream(), side) around the launch, or dlsync.wrap(x) for a consumer "
                  "that imports through DLPack)")
    else:
        when = "replay" if case.captured else "call"
        headline = (f"stale data after {when} {first.run} of {case.runs}: output "
                    f"{', '.join(outputs)} differs from the eager reference in "
                    f"{case.wrong_runs} of {case.runs} {when}s")
        if all_unchanged:
            meaning = ("the outputs did not change when the inputs did: the op's work ran once, "
                       "eagerly, while the graph was captured, and is not in the graph; it was "
                       "launched on a stream that never joined the capture")
            advice = ("make the op's stream join the capture: order it after the capturing "
                      "stream with dlsync.exchange(torch.cuda.current_stream(), side) around the "
                      "launch (or dlsync.wrap inside dlsync.scope() for a DLPack consumer)")
        else:
            meaning = ("a read in the graph is not ordered after the write it needs (a missing "
                       "dependency between two streams of the capture), so it sees the previous "
                       "replay's data when the producer is slow")
            advice = ("order the consumer's stream after the producer's inside the capture: "
                      "dlsync.exchange(producer, consumer), or dlsync.wrap inside dlsync.scope()")
    return Diagnosis(STALE, headline, meaning, advice, said=first.detail)


def _neighbour(case: CaseResult) -> Diagnosis:
    kind = classify_error(case.neighbour_errors)
    what = f"{kind.category} ({kind.cuda})" if kind else "an error"
    if kind is None:
        meaning = ("the neighbour thread failed with an error that is not a capture rule: see "
                   "the message (the harness's neighbour needs dlsync and the CUDA driver)")
        advice = "read the message; the op itself passed this case's comparison"
    elif case.neighbour == "capture":
        meaning = ("while the op ran under capture, another thread's GLOBAL-mode capture broke "
                   "with " + what + ": a call of the op is unsafe beside a GLOBAL capture "
                   "(PyTorch captures in GLOBAL mode by default)")
        advice = ("remove synchronisations, queries and allocations from the op, or wrap them in "
                  "a RELAXED thread capture mode (cudaThreadExchangeStreamCaptureMode)")
    else:
        meaning = ("another thread making eager exchanges (dlsync.exchange) beside the capture "
                   "failed with " + what + " while the op was being captured")
        advice = ("the op must leave other threads' streams alone and make no call that is "
                  "unsafe during a capture; DLSYNC_DEBUG=TRACE shows the neighbour's exchanges")
    return Diagnosis(NEIGHBOUR, f"the {case.neighbour} neighbour thread broke: {what}", meaning,
                     advice, said=_said(case.neighbour_errors, kind))


def diagnose(case: CaseResult) -> Optional[Diagnosis]:
    """What went wrong in ``case``, in CUDA's terms, and what to do; None
    when nothing did. An error of the op (or of its capture) comes first,
    then a broken neighbour, then wrong outputs."""
    if case.ok:
        return None
    if case.skipped:
        return Diagnosis(SKIPPED, f"not run: {case.skipped}", "", "")
    if case.errors:
        kind = classify_error(case.errors)
        said = _said(case.errors, kind)
        if case.captured is False:
            prefix = "capture broke"
        elif case.captured is None:
            prefix = "the op failed"
        else:
            prefix = "replay failed"
        where = case.where or (
            "raised when the capture ended (no call of the op raised)" if case.captured is False
            else "")
        if kind is None:
            return Diagnosis(ERROR, f"{prefix}: {said}",
                             "an error that dlsync.testing does not know (not a capture rule)",
                             "read the message and the traceback", said=said, where=where)
        return Diagnosis(kind.category, f"{prefix}: {kind.category} ({kind.cuda})",
                         kind.meaning, kind.advice, said=said, where=where)
    if case.neighbour_errors:
        return _neighbour(case)
    if case.wrong:
        return _stale(case)
    return Diagnosis(ERROR, "nothing was compared (no replay ran)",
                     "the case ran no replay, so it proves nothing", "use replays >= 1")


# ---- where an error came from: the op's own frame, not a framework's ----

_SKIP_PARTS = (
    os.sep + "torch" + os.sep,
    os.sep + "cupy" + os.sep,
    os.sep + "jax" + os.sep,
    os.sep + "jaxlib" + os.sep,
    os.sep + "contextlib.py",
    os.sep + "threading.py",
    # dlsync itself (every module of the package, wherever it is installed)
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep,
    os.sep + "dlsync" + os.sep + "__init__.py",
    os.sep + "dlsync" + os.sep + "testing" + os.sep,
    os.sep + "_pytest" + os.sep,
    os.sep + "pluggy" + os.sep,
)


def user_frame(frames: Sequence[Tuple[str, Optional[int], str, Optional[str]]],
               skip: Sequence[str] = _SKIP_PARTS) -> str:
    """``file:line in function: source`` of the innermost frame that is not
    in a framework, dlsync or this harness; "" when there is none.
    ``frames`` are (filename, lineno, name, line) from outermost to
    innermost, as traceback.extract_tb gives them."""
    for filename, lineno, name, line in reversed(list(frames)):
        if any(part in os.path.abspath(filename) for part in skip):
            continue
        text = f"{os.path.basename(filename)}:{lineno} in {name}"
        return f"{text}: {line.strip()}" if line else text
    return ""


# ---- the report ----

STREAMS_GROW = "the streams at replay grow with the number of calls"


class ReplayStreamsWarning(UserWarning):
    """check_capture's warning: the op's graph replays on more streams when
    the op is called more often in one capture."""


_COLUMNS = (("case", 22), ("mode", 15), ("neighbour", 9), ("runs", 5), ("wrong", 5),
            ("capture", 8))


class CaptureReport:
    """Every case of one :func:`dlsync.testing.check_capture` call."""

    def __init__(self, name: str, cases: Optional[List[CaseResult]] = None):
        self.name = name
        self.cases: List[CaseResult] = list(cases or [])
        self.isolated = False  # run in a child process (check_capture(isolate=True))
        self.child_output = ""  # what the child process printed, when isolated

    @property
    def left(self) -> List[str]:
        """State that some case left in the process and that could not be
        restored (then later checks belong in a child process)."""
        return [x for c in self.cases for x in c.left]

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def failures(self) -> List[CaseResult]:
        return [c for c in self.cases if not c.ok]

    def case(self, name: str) -> CaseResult:
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"no case {name!r}; cases: {', '.join(c.name for c in self.cases)}")

    def rows(self) -> List[str]:
        """One line per case: the table without its header."""
        out = []
        for c in self.cases:
            d = c.diagnosis
            verdict = "ok" if d is None else d.category
            if c.note:
                verdict += f" ({c.note})"
            if c.streams_said:
                verdict += f"; {c.streams_said}"
            cells = (c.name, c.mode, c.neighbour, str(c.runs), str(c.wrong_runs),
                     c.capture_status)
            out.append(" ".join(f"{v:{w}}" if i < 3 or i == 5 else f"{v:>{w}}"
                                for i, (v, (_, w)) in enumerate(zip(cells, _COLUMNS)))
                       + f"  {verdict}")
        return out

    def table(self) -> str:
        head = " ".join(f"{n:{w}}" if i < 3 or i == 5 else f"{n:>{w}}"
                        for i, (n, w) in enumerate(_COLUMNS)) + "  verdict"
        return "\n".join([head] + self.rows())

    def message(self) -> str:
        """The whole report: a headline, the table, and each failure's
        diagnosis."""
        failed = self.failures
        if not self.cases:
            head = f"capture check of {self.name}: no case ran"
        elif not failed:
            head = f"capture check of {self.name}: {len(self.cases)} cases passed"
        else:
            head = (f"capture check of {self.name}: {len(failed)} of {len(self.cases)} cases "
                    "failed")
        if self.isolated:
            head += " (in a child process)"
        lines = [head, self.table()]
        # Cases with the same diagnosis (word for word) are named together.
        groups: List[Tuple[List[str], List[str]]] = []
        for c in failed:
            text = c.diagnosis.lines() if c.diagnosis is not None else []
            for names, seen in groups:
                if seen == text:
                    names.append(c.name)
                    break
            else:
                groups.append(([c.name], text))
        for names, text in groups:
            lines.append("")
            lines.append(f"[{', '.join(names)}] " + text[0])
            lines.extend(text[1:])
        lines.extend(self.streams_lines())
        left = self.left
        if left:
            lines.append("")
            lines.append("left in the process (could not be restored; later checks should run "
                         "in a child process, isolate=True):")
            lines.extend(f"  {x}" for x in left)
        return "\n".join(lines)

    @property
    def streams_grow(self) -> List[CaseResult]:
        """The cases whose graph of two calls replays on more streams than
        that of one call."""
        return [c for c in self.cases if c.streams_grow]

    def streams_lines(self) -> List[str]:
        """Why streams were not counted (once per reason) and the warning
        for streams that grow with the calls."""
        lines: List[str] = []
        reasons: Dict[Tuple[str, str], List[str]] = {}
        for c in self.cases:
            if c.replay_streams is None and c.replay_streams_why:
                reasons.setdefault(("", c.replay_streams_why), []).append(c.name)
            if c.replay_streams_note:
                reasons.setdefault((" of two calls", c.replay_streams_note),
                                   []).append(c.name)
        for (what, why), names in reasons.items():
            lines += ["", f"[{', '.join(names)}] streams at replay{what}: n/a ({why})"]
        grow = self.streams_grow
        if grow:
            c = grow[0]
            lines += ["", f"[{', '.join(x.name for x in grow)}] warning: {STREAMS_GROW} "
                      f"(one call: {c.replay_streams}, two calls in one capture: "
                      f"{c.replay_streams_two_calls}): a model calling it n times replays on "
                      "ever more streams. bench/replay_streams sees this where a call queues "
                      "its side stream's work before the main stream's next work (each call's "
                      "side branch then gets a stream of its own: 65 streams for 64 calls, 2 "
                      "with the main stream's work queued first), and where calls are left "
                      "parallel to each other; queue the main stream's work first and join the "
                      "side stream back within the call (docs/performance.md)."]
        return lines

    def records(self, test: str = "") -> List[Dict[str, Any]]:
        """One JSON-ready dict per case: test id, case, mode, neighbour,
        verdict, category, first error line, where, and what was restored
        or left."""
        out = []
        for c in self.cases:
            d = c.diagnosis
            out.append({
                "test": test or self.name,
                "check": self.name,
                "case": c.name,
                "mode": c.mode,
                "neighbour": c.neighbour,
                "verdict": "ok" if d is None else ("skipped" if c.skipped else "failed"),
                "category": "" if d is None else d.category,
                "headline": "" if d is None else d.headline,
                "first_error": (d.said if d is not None and d.said else
                                (_first_line(c.errors[0]) if c.errors else "")),
                "where": c.where if d is None else (d.where or c.where),
                "runs": c.runs,
                "replay_streams": c.replay_streams,
                "replay_streams_two_calls": c.replay_streams_two_calls,
                "replay_streams_why": c.replay_streams_why or c.replay_streams_note,
                "isolated": self.isolated,
                "restored": list(c.restored),
                "left": list(c.left),
            })
        return out

    def __str__(self) -> str:
        return self.message()

    def raise_if_failed(self) -> "CaptureReport":
        if not self.ok:
            err = AssertionError(self.message())
            err.report = self  # type: ignore[attr-defined]
            raise err
        return self
