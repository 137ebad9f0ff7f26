# SPDX-License-Identifier: Apache-2.0
"""dlsync.Error and the words both backends use for misuse.

The compiled backend (_native.c) spells the same messages; the misuse test
(python/tests/test_backends.py) runs one list of misuses on both and compares
type and message."""

from __future__ import annotations

SUCCESS = 0
INVALID_ARGUMENT = "DLSYNC_ERROR_INVALID_ARGUMENT"
CAPTURE_ORDER = "DLSYNC_ERROR_CAPTURE_ORDER"
CONDITIONAL_BODY = "DLSYNC_ERROR_CONDITIONAL_BODY"


class Error(RuntimeError):
    """A dlsync call failed. ``status`` is the status name, ``message`` the
    library's words for what went wrong."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


# The exchange object (dlsync.exchange's context manager), on both backends.
ALREADY_ENTERED = "dlsync.exchange: already entered (an exchange is entered once at a time)"
EXIT_WITHOUT_ENTER = "dlsync.exchange: __exit__ without a matching __enter__"
EXCHANGE_SIGNATURE = "dlsync.exchange(producer, consumer, capture_stable=False)"
# The backend's end() and begin_many() arguments.
END_TAKES_A_HANDLE = "end: an exchange handle (int) from begin"
MANY_TAKES_A_LIST = "begin_many: the producers are a list or tuple of streams"
# The graph calls' handle arguments (graph_launch, the conditional bodies).
GRAPH_KIND = "CUgraph"
EXEC_KIND = "CUgraphExec"
# Other runtimes' events (dlsync.Fence.from_event, the backends' fence_import).
EVENT_KIND = "CUevent"


def not_a_capture_id(value: object) -> str:
    return (f"capture_id must be an int (a capture's id) or None, not "
            f"{type(value).__name__} {value!r}")


def capture_id_out_of_range(value: int) -> str:
    return f"capture_id is {value}: a capture's id is an unsigned 64-bit int"


# ---- graph compilers: fan-out and conditional nodes ----
NODE_KIND = "CUgraphNode"
FANOUT_TAKES_A_LIST = "begin_fanout: the consumers are a list or tuple of streams"
DECLARE_TAKES_A_LIST = "node_declare: the bodies are a list or tuple of CUgraph handles"
# ---- end graph compilers ----


def not_a_handle(what: str, kind: str, value: object) -> str:
    return f"{what} must be an int {kind} handle, not {type(value).__name__} {value!r}"


def handle_out_of_range(what: str, kind: str, value: int, bits: int) -> str:
    return (f"{what} is {value}: a {kind} handle is an unsigned pointer, "
            f"0 <= handle < 2**{bits}")
