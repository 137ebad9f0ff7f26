# SPDX-License-Identifier: Apache-2.0
"""One list of misuses, run on both backends (dlsync._native and the ctypes
code): each raises the same exception type with the same message on both.

The list runs in two child processes, one per backend: the ctypes one with
DLSYNC_NO_NATIVE=1, the compiled one where dlsync._native is in use here
(the installed wheel), else from a copy of the package with _native.c built
by the C compiler into it (a source tree; skipped, saying why, where there
is no compiler or no Python headers). With the fake driver
(DLSYNC_TEST_FAKE_LIBCUDA, fake_cuda.py) the misuses that need real
exchanges run too (a handle ended twice, an exchange on a stream the driver
does not know). Plain unittest."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = "--misuse-child" in sys.argv

if CHILD:
    import fake_cuda  # before dlsync asks for a context

    FAKE, _ = fake_cuda.load()
if os.environ.get("DLSYNC_TEST_PKG"):
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(HERE, ".."))
import dlsync  # noqa: E402
from dlsync import _backend, _loader  # noqa: E402


class _Truth:
    def __bool__(self):
        raise ZeroDivisionError("its truth raises")


class _Proto:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


class _NoStream:
    """A CUDA DLPack producer that exposes no stream (JAX's case)."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        return "capsule"


class _Ends:
    def end(self):
        pass


@contextlib.contextmanager
def _no_driver():
    """Exchanges of a list entered and exited without a driver call: the
    backend's Python exchange (lists, tensors) replaced by one that begins
    nothing, on both backends."""
    from dlsync import _exchange

    _backend.active.set_python_exchange(lambda producer, consumer, flags: _Ends())
    try:
        yield
    finally:
        _backend.active.set_python_exchange(_exchange.exchange_python)


def _entered(consumer=0x20):
    """An exchange entered without a driver call."""
    ex = dlsync.exchange([0x10], consumer)
    with _no_driver():
        ex.__enter__()
    return ex


def _reenter():
    ex = _entered()
    try:
        with _no_driver():
            ex.__enter__()
    finally:
        ex.__exit__(None, None, None)


def _exit_twice():
    ex = _entered()
    ex.__exit__(None, None, None)
    ex.__exit__(None, None, None)


def _with_inside_with():
    ex = dlsync.exchange([0x10], 0x20)
    with _no_driver():
        with ex:
            with ex:
                pass


def _enter_exit_enter_exit():
    ex = dlsync.exchange([0x10], 0x20)
    with _no_driver():
        for _ in range(2):
            with ex:
                pass
    return "entered twice in turn"


def _exchange_type():
    return type(dlsync.exchange(0x10, 0x20))


def _enter(*args, **kwargs):
    return lambda: dlsync.exchange(*args, **kwargs).__enter__()


def _closed_fence_wait():
    f = dlsync.Fence.__new__(dlsync.Fence)
    f._handle = None
    f.wait(0x10)


def _typed(module, name):
    """An object whose type claims ``module.name``."""
    return type(name, (), {"__module__": module})()


def _typed_event(module, **attrs):
    """An event object whose type claims ``module.Event``."""
    return type("Event", (), dict(attrs, __module__=module))()


def _wrap_export(stream):
    return lambda: dlsync.wrap(_NoStream(), producer=0x10).__dlpack__(stream=stream)


MISUSES = [
    ("__exit__ without __enter__", lambda: dlsync.exchange(0x10, 0x20).__exit__(None, None, None)),
    ("entered while entered", _reenter),
    ("__exit__ twice", _exit_twice),
    ("with inside its own with", _with_inside_with),
    ("entered again once exited (allowed)", _enter_exit_enter_exit),
    ("Exchange(): no consumer", lambda: _exchange_type()(0x10)),
    ("Exchange(): four arguments", lambda: _exchange_type()(0x10, 0x20, False, 1)),
    ("Exchange(): unknown keyword", lambda: _exchange_type()(0x10, 0x20, bogus=1)),
    ("Exchange(): producer twice", lambda: _exchange_type()(0x10, 0x20, producer=0x30)),
    ("Exchange(): keywords only, no consumer", lambda: _exchange_type()(producer=0x10)),
    ("exchange(): no consumer", lambda: dlsync.exchange(0x10)),
    ("producer a float", _enter(1.5, 0x20)),
    ("producer a bool", _enter(True, 0x20)),
    ("producer 2**64", _enter(2**64, 0x20)),
    ("producer -1", _enter(-1, 0x20)),
    ("producer an object", _enter(object(), 0x20)),
    ("consumer a str", _enter(0x10, "s")),
    ("consumer's __cuda_stream__ a triple", _enter(0x10, _Proto((1, 2, 3)))),
    ("capture_stable's truth raises", _enter([0x10], 0x20, capture_stable=_Truth())),
    ("an empty list of producers", _enter([], 0x20)),
    ("an empty tuple of producers", _enter((), 0x20)),
    ("wrap of an int", lambda: dlsync.wrap(5).__dlpack__(stream=6)),
    ("wrap of a str", lambda: dlsync.wrap("s")),
    ("producer's __cuda_stream__ a 1-tuple", _enter(_Proto((1,)), 0x20)),
    ("a list with a float", _enter([0x10, 1.5], 0x20)),
    ("a list, consumer a str", _enter([0x10], "s")),
    ("a tensor that exposes no stream", _enter(_NoStream(), 0x20)),
    ("stream_handle(1.5)", lambda: dlsync.stream_handle(1.5)),
    ("stream_handle(object())", lambda: dlsync.stream_handle(object())),
    ("capture_state(2**64)", lambda: dlsync.capture_state(2**64)),
    ("Fence(1.5)", lambda: dlsync.Fence(1.5)),
    ("Fence(2**64)", lambda: dlsync.Fence(2**64)),
    ("a closed fence waited for", _closed_fence_wait),
    ("wrap: __dlpack__(stream=1.5)", _wrap_export(1.5)),
    ("wrap: __dlpack__(stream=2**64)", _wrap_export(2**64)),
    ("wrap: __dlpack__(stream=0)", _wrap_export(0)),
    ("wrap: __dlpack__(stream=-2)", _wrap_export(-2)),
    ("end('x')", lambda: _backend.active.end("x")),
    ("end(True)", lambda: _backend.active.end(True)),
    ("end(None)", lambda: _backend.active.end(None)),
    ("end of a value that was never a handle", lambda: _backend.active.end(0x1234)),
    ("begin_many of a str", lambda: _backend.active.begin_many("ab", 0x20)),
    ("begin_many of None", lambda: _backend.active.begin_many(None, 0x20)),
    ("begin_many of a set", lambda: _backend.active.begin_many({0x10}, 0x20)),
    ("begin_many of a list with a float", lambda: _backend.active.begin_many([0x10, 1.5], 0x20)),
    ("launch(object())", lambda: dlsync.launch(object(), 0x20)),
    ("launch of a CuPy graph", lambda: dlsync.launch(_typed("cupy.cuda.graph", "Graph"), 0x20)),
    ("launch: exec a str", lambda: dlsync.launch(0x30, 0x20, exec="x")),
    ("launch: graph a float", lambda: dlsync.launch(1.5, 0x20)),
    ("launch: graph -1", lambda: dlsync.launch(-1, 0x20)),
    ("launch: exec 2**64", lambda: dlsync.launch(None, 0x20, exec=2**64)),
    ("launch: stream a str", lambda: dlsync.launch(0x30, "s")),
    ("graph_launch: graph a bool", lambda: _backend.active.graph_launch(True, None, 0x20)),
    ("conditional_body(object())", lambda: dlsync.conditional_body(object()).__enter__()),
    ("conditional_body(1.5)", lambda: dlsync.conditional_body(1.5).__enter__()),
    ("body_add(None)", lambda: _backend.active.body_add(None)),
    ("body_add(2**64)", lambda: _backend.active.body_add(2**64)),
    ("body_declared('x')", lambda: _backend.active.body_declared("x")),
    ("body_remove(True)", lambda: _backend.active.body_remove(True)),
    ("capture_graph(1.5)", lambda: dlsync.capture_graph(1.5)),
    ("Fence.from_event(object())",
     lambda: dlsync.Fence.from_event(object(), provenance=dlsync.Provenance.EAGER)),
    ("Fence.from_event(1.5)", lambda: dlsync.Fence.from_event(1.5, provenance="eager")),
    ("Fence.from_event(2**64)", lambda: dlsync.Fence.from_event(2**64, provenance="eager")),
    ("Fence.from_event: provenance 'bogus'",
     lambda: dlsync.Fence.from_event(0x50, provenance="bogus")),
    ("Fence.from_event: own=True of a torch event",
     lambda: dlsync.Fence.from_event(_typed_event("torch.cuda.streams", cuda_event=0x50),
                                     provenance="eager", own=True)),
    ("Fence.from_event: a torch event never recorded",
     lambda: dlsync.Fence.from_event(_typed_event("torch.cuda.streams", cuda_event=0),
                                     provenance="eager")),
    ("capture_id(1.5)", lambda: dlsync.capture_id(1.5)),
    ("Fence.from_event: capture_id 1.5",
     lambda: dlsync.Fence.from_event(0x50, provenance="captured", capture_id=1.5)),
    ("Fence.from_event: capture_id -1",
     lambda: dlsync.Fence.from_event(0x50, provenance="captured", capture_id=-1)),
    ("Fence.from_event: capture_id 2**64",
     lambda: dlsync.Fence.from_event(0x50, provenance="captured", capture_id=2**64)),
    # graph compilers: fan-out, order, conditional nodes
    ("begin_fanout of a str", lambda: _backend.active.begin_fanout(0x10, "ab")),
    ("begin_fanout of None", lambda: _backend.active.begin_fanout(0x10, None)),
    ("begin_fanout: a float consumer", lambda: _backend.active.begin_fanout(0x10, [0x20, 1.5])),
    ("begin_fanout: producer a str", lambda: _backend.active.begin_fanout("p", [0x20])),
    ("exchange: a None consumer", lambda: dlsync.exchange(0x10, consumers=[0x20, None])
     .__enter__()),
    ("exchange: consumers a set", lambda: dlsync.exchange(0x10, consumers={0x20})),
    ("order: then a float", lambda: _backend.active.order(0x10, 1.5)),
    ("node_declare: parent None", lambda: _backend.active.node_declare(None, 0x40, [0x50])),
    ("node_declare: node a str", lambda: _backend.active.node_declare(0x30, "n", [0x50])),
    ("node_declare: bodies a set", lambda: _backend.active.node_declare(0x30, 0x40, {0x50})),
    ("node_declare: bodies[1] -1", lambda: _backend.active.node_declare(0x30, 0x40, [0x50, -1])),
    ("node_declare: node 2**64", lambda: _backend.active.node_declare(0x30, 2**64, [0x50])),
    ("conditional_node(object())", lambda: dlsync.conditional_node(object(), 0x40, 0x50)
     .__enter__()),

    # dlsync.arrow (python/tests/test_arrow_cpu.py has the rest, on both backends)
    ("arrow import of an int", lambda: dlsync.arrow.import_device_array(5, 0x20)),
    ("arrow import on a stream a str", lambda: dlsync.arrow.import_device_array(5, "s")),
    ("arrow export of format 'z'",
     lambda: dlsync.arrow.export_device_array(0x1000, 4, "z", 0x20, device_id=0)),
    ("arrow_wait on a stream 2**64", lambda: _backend.active.arrow_wait(0x1000, 2**64, 1)),
]


def _no_context_address(fn):
    """fn, its dlsync.Error's message without the context's address (a heap
    address, other in each child)."""
    def run():
        try:
            return fn()
        except dlsync.Error as e:
            raise dlsync.Error(e.status, re.sub(r"context 0x[0-9a-f]+", "context 0x...",
                                                e.message)) from None
    return run


def _no_address(fn, what):
    """fn, its dlsync.Error's message without the address after ``what`` (a
    heap address, other in each child)."""
    def run():
        try:
            return fn()
        except dlsync.Error as e:
            raise dlsync.Error(e.status, re.sub(what + r" 0x[0-9a-f]+", what + " 0x...",
                                                e.message)) from None
    return run


def _no_event_address(fn):
    return _no_address(fn, "event")


def _no_fence_address(fn):
    return _no_address(fn, "fence")


def _fake_misuses(fake):
    s1, s2 = fake.stream(), fake.stream()

    def end_twice():
        h = _backend.active.begin(s1, s2, 0)
        _backend.active.end(h)
        _backend.active.end(h)

    def many_ended_twice():
        h = _backend.active.begin_many([s1, fake.stream()], s2, 0)
        _backend.active.end(h)
        _backend.active.end(h)

    def _in_body(fn):
        parent, body = fake.conditional()
        s = fake.stream()
        try:
            with dlsync.conditional_body(body):
                fake.begin_capture_to(s, body)
                try:
                    return fn(s)
                finally:
                    fake.end_capture_graph(s)
        finally:
            fake.graph_destroy(parent)

    def refused_in_body():
        return _in_body(lambda s: dlsync.exchange(s1, s).__enter__())

    def fence_in_body():
        return _in_body(lambda s: dlsync.Fence(s))

    def launch_no_graph_in_capture():
        s = fake.stream()
        fake.begin_capture(s)
        try:
            dlsync.launch(None, s, exec=0x40)
        finally:
            fake.end_capture_graph(s)

    def import_destroyed():
        e = fake.event()
        fake.event_destroy(e)
        return _no_event_address(lambda: dlsync.Fence.from_event(e, provenance="eager"))()

    def captured_waited_eagerly():
        s, e = fake.stream(), fake.event()
        fake.begin_capture(s)
        try:
            fake.record(e, s)
            f = dlsync.Fence.from_event(e, provenance="captured", capture_id=fake.capture_id(s))
            try:
                return _no_fence_address(lambda: f.wait(s1))()
            finally:
                f.close()
        finally:
            fake.end_capture_graph(s)
            fake.event_destroy(e)

    class _Tensor:
        """A CUDA DLPack producer on a stream; ``keep`` makes the cycle."""

        def __init__(self, stream):
            self.stream, self.keep = stream, None

        def __cuda_stream__(self):
            return (0, self.stream)

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None, **kw):
            return "capsule"

    def entered_in_a_cycle():
        """An entered exchange of a list, and of a tensor, left in a reference
        cycle: the collector must end each (the consumer joined back) before
        it clears them. The captures' results."""
        import gc

        results = []
        for kind in ("list", "tensor"):
            producer, consumer = fake.stream(), fake.stream()
            fake.begin_capture(producer)
            if kind == "list":
                prod = [producer]
            else:
                prod = _Tensor(producer)
            gc.collect()  # the producer to the oldest generation, the exchange made after it
            ex = dlsync.exchange(prod, consumer)
            ex.__enter__()
            fake.work(consumer)
            if kind == "list":
                prod.append(ex)
            else:
                prod.keep = ex
            # freeze lists the youngest generation first and unfreeze keeps that
            # order: the collector then clears the exchange before the producer,
            # the order in which an exchange without a finalizer loses its
            # Python exchange before it is ended.
            gc.freeze()
            gc.unfreeze()
            del ex, prod
            gc.collect()
            results.append(fake.end_capture(producer))
        return results

    return [
        ("an entered exchange in a reference cycle, collected", entered_in_a_cycle),
        ("a handle ended twice", end_twice),
        ("a begin_many handle ended twice", many_ended_twice),
        ("an exchange on a stream the driver does not know", _enter(0x10, s2)),
        ("begin_many of no producers", lambda: _backend.active.begin_many([], s2)),
        ("unknown flag bits", lambda: _backend.active.begin(s1, s2, 1 << 7)),
        ("a fence on a stream the driver does not know", lambda: dlsync.Fence(0x10)),
        ("body_add(0)", lambda: _backend.active.body_add(0)),
        ("body_remove of a graph never declared",
         _no_context_address(lambda: _backend.active.body_remove(0x1230))),
        ("body_declared of a graph never declared (allowed)",
         lambda: _backend.active.body_declared(0x1230)),
        ("capture_graph of a stream the driver does not know", lambda: dlsync.capture_graph(0x10)),
        ("capture_graph of an eager stream (allowed)", lambda: dlsync.capture_graph(s1)),
        ("launch on an eager stream without an exec", lambda: dlsync.launch(0x30, s1)),
        ("launch of no graph on a capture", launch_no_graph_in_capture),
        ("a row that adds a node in a declared body", refused_in_body),
        ("a fence signalled in a declared body", fence_in_body),
        ("Fence.from_event(0)", lambda: dlsync.Fence.from_event(0, provenance="eager")),
        ("Fence.from_event of a destroyed event", import_destroyed),
        ("a CAPTURED import waited on an eager stream", captured_waited_eagerly),
        ("begin_fanout of no consumers", lambda: _backend.active.begin_fanout(s1, [])),
        ("begin_fanout: a consumer twice", lambda: _backend.active.begin_fanout(s1, [s2, s2])),
        ("begin_fanout: unknown flag bits", lambda: _backend.active.begin_fanout(s1, [s2], 1 << 7)),
        ("order on a stream the driver does not know", lambda: _backend.active.order(0x10, s2)),
        ("node_declare of a node not in the parent", lambda: _backend.active.node_declare(
            fake.graph(), fake.conditional_node()[1], [0x50])),
        ("an arrow export on a stream the driver does not know",
         lambda: dlsync.arrow.export_device_array(0x1000, 4, "f", 0x10,
                                                  device_id=0).__arrow_c_device_array__()),
    ]


# Must raise (type name) on both; everything else in MISUSES must not.
MUST_RAISE = {name: None for name, _ in MISUSES}
MUST_RAISE["entered again once exited (allowed)"] = "ok"
MUST_RAISE["body_declared of a graph never declared (allowed)"] = "ok"
MUST_RAISE["capture_graph of an eager stream (allowed)"] = "ok"
MUST_RAISE["an entered exchange in a reference cycle, collected"] = "ok"


def _outcome(fn):
    try:
        value = fn()
    except BaseException as e:  # noqa: BLE001
        return ["raised", type(e).__name__, str(e)]
    return ["ok", repr(value)]


def child() -> int:
    cases = list(MISUSES)
    if FAKE is not None:
        cases += _fake_misuses(FAKE)
    out = {"backend": _backend.active.name, "fake": FAKE is not None,
           "outcomes": [[name] + _outcome(fn) for name, fn in cases]}
    print(json.dumps(out))
    return 0


def _run_child(env_extra, drop=()):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **env_extra)
    for k in drop:
        env.pop(k, None)
    done = subprocess.run([sys.executable, os.path.join(HERE, "test_backends.py"),
                           "--misuse-child"], cwd=HERE, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"the child failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _native_package(tmp):
    """(DLSYNC_TEST_PKG for a child on the compiled backend, None) or (None,
    why not): where dlsync._native is in use here, this package; otherwise a
    copy with _native.c built into it."""
    if dlsync._native_active():
        return {}, None
    pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
    root = _loader.source_root([pkg])
    source = os.path.join(pkg, "_native.c")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths().get("include")
    if root is None or not os.path.isfile(source):
        return None, "not a source tree and dlsync._native is not in use"
    if cc is None or not include or not os.path.isfile(os.path.join(include, "Python.h")):
        return None, f"no C compiler ({cc}) or no Python headers ({include}) to build _native"
    copy = os.path.join(tmp, "dlsync")
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    done = subprocess.run([cc, "-O1", "-std=c11", "-shared", "-fPIC", "-fvisibility=hidden",
                           "-DPy_LIMITED_API=0x03090000", "-I", os.path.join(root, "include"),
                           "-I", include, source, "-o", os.path.join(copy, "_native.abi3.so")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise AssertionError(f"building _native failed:\n{done.stdout[-3000:]}")
    return {"DLSYNC_TEST_PKG": tmp}, None


class SameMisuseOnBothBackends(unittest.TestCase):
    def test_every_misuse_raises_alike_on_both_backends(self):
        with tempfile.TemporaryDirectory() as tmp:
            env, why = _native_package(tmp)
            if env is None:
                self.skipTest(why)
            native = _run_child(env, drop=("DLSYNC_NO_NATIVE",))
            ctypes_ = _run_child({"DLSYNC_NO_NATIVE": "1"})
        self.assertEqual(native["backend"], "native")
        self.assertEqual(ctypes_["backend"], "ctypes")
        self.assertEqual(native["fake"], ctypes_["fake"])
        self.assertGreaterEqual(len(native["outcomes"]), len(MISUSES))
        for n, c in zip(native["outcomes"], ctypes_["outcomes"]):
            self.assertEqual(n, c, f"{n[0]}: native and ctypes differ")
        self.assertEqual(len(native["outcomes"]), len(ctypes_["outcomes"]))
        for outcome in ctypes_["outcomes"]:
            name = outcome[0]
            if MUST_RAISE.get(name) == "ok":
                self.assertEqual(outcome[1], "ok", outcome)
            else:
                self.assertEqual(outcome[1], "raised", outcome)
                self.assertNotIn(outcome[2], ("AttributeError", "SystemError"), outcome)
        by_name = {o[0]: o for o in ctypes_["outcomes"]}
        self.assertEqual(by_name["entered while entered"][2:],
                         ["RuntimeError", "dlsync.exchange: already entered (an exchange is "
                          "entered once at a time)"])
        self.assertEqual(by_name["consumer's __cuda_stream__ a triple"][2:],
                         ["TypeError", "_Proto.__cuda_stream__() must return (version, handle), "
                          "not a 3-tuple (1, 2, 3)"])
        self.assertEqual(by_name["wrap of an int"][2:],
                         ["TypeError", "dlsync.wrap: int 5 is not a DLPack producer (it has no "
                          "__dlpack__ and no __dlpack_device__ and no __cuda_array_interface__)"])
        self.assertEqual(by_name["an empty tuple of producers"][2:],
                         ["ValueError", "dlsync.exchange: the producers are an empty tuple: "
                          "nothing to order the consumer after (enter no exchange for no "
                          "producer)"])
        if ctypes_["fake"]:  # each capture ended cleanly: the collector ended the exchange
            self.assertEqual(by_name["an entered exchange in a reference cycle, collected"][1:],
                             ["ok", "[0, 0]"])
        for name in ("__exit__ without __enter__", "__exit__ twice"):
            self.assertEqual(by_name[name][2:], ["RuntimeError", "dlsync.exchange: __exit__ "
                                                 "without a matching __enter__"])

    @unittest.skipUnless(os.environ.get("DLSYNC_TEST_FAKE_LIBCUDA"), "no fake driver")
    def test_the_interrupt_walk_structured_graphs_and_imports_on_the_compiled_backend(self):
        with tempfile.TemporaryDirectory() as tmp:
            env, why = _native_package(tmp)
            if env is None:
                self.skipTest(why)
            if not env:
                self.skipTest("the compiled backend is the one in use here: test_interrupts "
                              "runs on it in this process")
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", DLSYNC_EXPECT_NATIVE="1", **env)
            env.pop("DLSYNC_NO_NATIVE", None)
            done = subprocess.run([sys.executable, "-m", "unittest", "test_interrupts",
                                   "test_structured_cpu", "test_foreign", "test_compilers_cpu"],
                                  cwd=HERE, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=300)
        self.assertEqual(done.returncode, 0, done.stdout[-4000:])
        self.assertIn("OK", done.stdout)
        self.assertNotIn("skipped", done.stdout)


if __name__ == "__main__":
    if CHILD:
        sys.exit(child())
    unittest.main()
