# SPDX-License-Identifier: Apache-2.0
"""The two paths of the binding, without a GPU: dlsync._native (compiled, the
stable ABI) and the ctypes fallback (DLSYNC_NO_NATIVE=1, or no built module).

Run in one process, the tests check the backend that is active
(dlsync._backend.active); where the native one is, they also compare it call
for call with a ctypes backend over the same library (same values, same
exception types and messages) and run test_binding, test_hardening,
test_producers and this file again in a child process with
DLSYNC_NO_NATIVE=1, so that one run covers both paths.

DLSYNC_EXPECT_NATIVE=1 (the installed wheel, scripts/install-check.sh) fails
when the native module is not in use. Plain unittest."""
import enum
import gc
import os
import subprocess
import sys
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from dlsync import _backend, _ctypes_impl, _exchange  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = dlsync._native_active()
CHILD = os.environ.get("DLSYNC_TEST_NATIVE_CHILD") == "1"
needs_native = unittest.skipUnless(
    NATIVE, f"dlsync._native is not in use here ({dlsync._native_error})")


def _has_driver():
    try:
        dlsync.capture_state(dlsync.LEGACY)
        return True
    except dlsync.Error as e:
        return e.status != "DLSYNC_ERROR_NO_DRIVER"


def _outcome(fn, *args):
    """("ok", value, type) or ("raised", exception type, message)."""
    try:
        value = fn(*args)
    except Exception as e:  # noqa: BLE001
        return ("raised", type(e), str(e))
    return ("ok", value, type(value))


# ---- stream values of every kind, for the two stream_handle ----


class _Proto:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


class _ProtoRaises:
    def __cuda_stream__(self):
        raise KeyError("from the producer")


class _ProtoValue:
    __cuda_stream__ = (0, 0x77)


class _ProtoNone:
    __cuda_stream__ = None
    cuda_stream = 0x78


class _Attrs:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _MissingProperty:
    @property
    def cuda_stream(self):
        raise AttributeError("not this one")

    ptr = 0x79


class _BrokenProperty:
    @property
    def cuda_stream(self):
        raise RuntimeError("broken getter")


class _Flag(enum.IntEnum):
    STREAM = 0x80


class _BigInt(int):
    pass


STREAM_VALUES = [
    None, 0, 1, 2, 0x1234, 2**63, 2**64 - 1, 2**64, 2**64 + 2, -1, -(2**63), True, False, 1.5,
    1.0, "1", b"\x01", object(), [1], _Flag.STREAM, _BigInt(5), _BigInt(-5),
    _Proto((0, 0x1234)), _Proto((1, 2**64)), _Proto((0, -3)), _Proto((0, 1.5)), _Proto((0, True)),
    _Proto((0, None)), _Proto((1, 2, 3)), _Proto(()), _Proto(0x55), _Proto(None), _Proto("x"),
    _ProtoRaises(), _ProtoValue(), _ProtoNone(),
    _Attrs(cuda_stream=0x5678), _Attrs(ptr=0x9ABC), _Attrs(handle=0xDEF0),
    _Attrs(cuda_stream=None, ptr=None, handle=0x42), _Attrs(cuda_stream=None),
    _Attrs(ptr=2**64), _Attrs(handle=-1), _Attrs(cuda_stream=True), _Attrs(ptr=3.0),
    _MissingProperty(), _BrokenProperty(),
]


class ActivePath(unittest.TestCase):
    def test_the_active_path_is_reported(self):
        self.assertIsInstance(NATIVE, bool)
        if NATIVE:
            self.assertIsNone(dlsync._native_error)
        else:
            self.assertIsInstance(dlsync._native_error, str)
            self.assertTrue(dlsync._native_error)

    @unittest.skipUnless(os.environ.get("DLSYNC_NO_NATIVE") == "1", "DLSYNC_NO_NATIVE not set")
    def test_no_native_selects_ctypes(self):
        self.assertFalse(NATIVE)
        self.assertIn("DLSYNC_NO_NATIVE", dlsync._native_error)

    @unittest.skipUnless(os.environ.get("DLSYNC_EXPECT_NATIVE") == "1",
                         "not a run that expects the compiled binding")
    def test_the_installed_package_uses_the_compiled_binding(self):
        self.assertTrue(NATIVE, dlsync._native_error)
        self.assertTrue(dlsync._native.__file__.endswith(".abi3.so"), dlsync._native.__file__)
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        self.assertEqual(os.path.dirname(os.path.abspath(dlsync._native.__file__)), pkg)

    def test_both_backends_have_every_member_of_the_interface(self):
        from dlsync import _interface

        self.assertIsInstance(_backend.active, _interface.Backend)
        self.assertIsInstance(_ctypes_impl.CtypesBackend(_backend.lib), _interface.Backend)
        self.assertIsInstance(dlsync.exchange(0x10, 0x20), _interface.ExchangeContext)

    def test_the_public_names_are_those_of_the_active_path(self):
        b = _backend.active
        self.assertIs(dlsync.stream_handle, b.stream_handle)
        self.assertEqual(dlsync.capture_state, b.capture_state)
        self.assertIs(type(dlsync.exchange(0x10, 0x20)), b.Exchange)
        self.assertEqual(b.name, "native" if NATIVE else "ctypes")
        if NATIVE:
            self.assertIs(b.stream_handle, dlsync._native.stream_handle)
            self.assertIs(b.capture_state, dlsync._native.capture_state)
            self.assertIs(b.dlpack_stream, dlsync._native.dlpack_stream)
            self.assertIs(b.begin_many, dlsync._native.begin_many)
            self.assertIs(b.env_stream, dlsync._native.env_stream)
            self.assertIs(b.Exchange, dlsync._native.Exchange)
        else:
            self.assertIs(b.stream_handle, _ctypes_impl.stream_handle)
            self.assertIsInstance(b, _ctypes_impl.CtypesBackend)

    def test_exchange_keeps_its_signature_and_documentation(self):
        import inspect

        params = inspect.signature(dlsync.exchange).parameters
        self.assertEqual(list(params), ["producer", "consumer", "capture_stable", "consumers",
                                        "keep_edge_data"])
        self.assertIs(params["capture_stable"].default, False)
        for name in ("consumers", "keep_edge_data"):  # keyword only: positions unchanged
            self.assertIs(params[name].kind, inspect.Parameter.KEYWORD_ONLY)
        self.assertIn("capture_stable=True", dlsync.exchange.__doc__)
        with self.assertRaises(TypeError):
            dlsync.exchange(0x10)

    def test_a_stale_or_missing_native_module_falls_back_with_a_reason(self):
        stale = types.SimpleNamespace(ABI=_backend.NATIVE_ABI + 1, SYMBOLS=())
        with mock.patch.dict(os.environ, {"DLSYNC_NO_NATIVE": ""}), \
                mock.patch.object(_backend.importlib, "import_module", return_value=stale):
            native, why = _backend.load_native(_backend.lib, "dlsync")
        self.assertIsNone(native)
        self.assertIn("stale build", why)
        with mock.patch.dict(os.environ, {"DLSYNC_NO_NATIVE": ""}), \
                mock.patch.object(_backend.importlib, "import_module",
                                  side_effect=ImportError("no such file")):
            native, why = _backend.load_native(_backend.lib, "dlsync")
            chosen, why2 = _backend.choose(_backend.lib, "dlsync")
        self.assertIsNone(native)
        self.assertIn("no such file", why)
        self.assertIsInstance(chosen, _ctypes_impl.CtypesBackend)
        self.assertEqual(chosen.name, "ctypes")
        self.assertIn("no such file", why2)
        with mock.patch.dict(os.environ, {"DLSYNC_NO_NATIVE": "1"}):
            self.assertEqual(_backend.load_native(_backend.lib, "dlsync"),
                             (None, "DLSYNC_NO_NATIVE is set"))

    def test_the_optional_getattr_is_found_on_cpython(self):
        if sys.implementation.name == "cpython":
            self.assertIsInstance(_backend.optional_getattr_address(), int)


class BothPaths(unittest.TestCase):
    """What holds on either path (run on each by the child process)."""

    def test_stream_values(self):
        self.assertEqual(dlsync.stream_handle(None), dlsync.LEGACY)
        self.assertEqual(dlsync.stream_handle(_Proto((0, 0x1234))), 0x1234)
        self.assertEqual(dlsync.stream_handle(_ProtoValue()), 0x77)
        self.assertEqual(dlsync.stream_handle(_ProtoNone()), 0x78)
        self.assertEqual(dlsync.stream_handle(_MissingProperty()), 0x79)
        self.assertIs(dlsync.stream_handle(_Flag.STREAM), _Flag.STREAM)
        with self.assertRaises(KeyError):
            dlsync.stream_handle(_ProtoRaises())
        with self.assertRaises(RuntimeError):
            dlsync.stream_handle(_BrokenProperty())
        with self.assertRaises(TypeError) as info:
            dlsync.stream_handle(_Proto((1, 2, 3)))
        self.assertEqual(str(info.exception),
                         "_Proto.__cuda_stream__() must return (version, handle), not a 3-tuple "
                         "(1, 2, 3)")
        with self.assertRaises(ValueError) as info:
            dlsync.stream_handle(_Attrs(ptr=2**64))
        self.assertTrue(str(info.exception).startswith(
            "_Attrs.ptr is 18446744073709551616: a stream handle is an unsigned pointer"))

    def test_exchange_checks_its_streams_before_the_library(self):
        for producer, consumer, error in ((2**64, 0x10, ValueError), (0x10, -1, ValueError),
                                          (1.5, 0x10, TypeError), (0x10, object(), TypeError),
                                          (True, 0x10, TypeError)):
            with self.assertRaises(error):
                with dlsync.exchange(producer, consumer):
                    self.fail("the block must not run")

    @unittest.skipIf(_has_driver(), "a CUDA driver is present")
    def test_without_a_driver_every_call_says_so(self):
        for call in (lambda: dlsync.exchange(0x10, 0x20).__enter__(),
                     lambda: dlsync.exchange(0x10, 0x20, capture_stable=True).__enter__(),
                     lambda: dlsync.capture_state(0x10),
                     lambda: _backend.active.dlpack_stream(1, 0x10),
                     lambda: _backend.active.begin_many([0x10, 0x11], 0x20),
                     lambda: dlsync.exchange([0x10, 0x11], 0x20).__enter__(),
                     lambda: dlsync._Exchange(0x10, 0x20)):
            with self.assertRaises(dlsync.Error) as info:
                call()
            self.assertEqual(info.exception.status, "DLSYNC_ERROR_NO_DRIVER")
            self.assertIn("libcuda.so.1", info.exception.message)

    @unittest.skipIf(_has_driver(), "a CUDA driver is present")
    def test_a_failed_enter_leaves_the_exchange_usable(self):
        ex = dlsync.exchange(0x10, 0x20)
        for _ in range(2):  # either backend: tried again, the same error (not "entered")
            with self.assertRaises(dlsync.Error):
                ex.__enter__()

    def test_dlpack_values_without_a_producer_need_no_driver(self):
        dlpack_stream = _backend.active.dlpack_stream
        self.assertIsNone(dlpack_stream(-1, None))
        self.assertEqual(dlpack_stream(1, None), 1)
        self.assertEqual(dlpack_stream(2, None), 2)
        self.assertEqual(dlpack_stream(0x1234, None), 0x1234)
        for bad in (0, -2):
            with self.assertRaises(dlsync.Error) as info:
                dlpack_stream(bad, None)
            self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")

    def test_capture_stable_is_taken_by_its_truth_at_entry(self):
        class Truth:
            def __bool__(self):
                raise ZeroDivisionError("truth")

        ex = dlsync.exchange(0x10, 0x20, capture_stable=Truth())  # nothing asked yet
        with self.assertRaises(ZeroDivisionError):
            with ex:
                pass


class _Log:
    """The backend's begin, begin_many and end, recorded, as test_producers
    has: the Python exchanges that dlsync.exchange makes for lists and
    tensors call them."""

    def __init__(self):
        self.calls = []
        self.fail_end = False
        self.open = {}
        self._ids = iter(range(0x1000, 1 << 30))

    def begin(self, producer, consumer, flags=0, out=None):
        return self.begin_many([producer], consumer, flags, out)

    def begin_many(self, producers, consumer, flags=0, out=None):
        ps = tuple(dlsync.stream_handle(p) for p in producers)
        c = dlsync.stream_handle(consumer)
        handle = next(self._ids)
        self.open[handle] = (ps, c)
        self.calls.append(("begin", ps, c, flags))
        if out is not None:
            out.value = handle
        return handle

    def end(self, handle):
        ps, c = self.open.pop(handle)
        self.calls.append(("end", ps, c))
        if self.fail_end:
            raise dlsync.Error("DLSYNC_ERROR_DRIVER", "injected at end")

    def patch(self, test):
        for name in ("begin", "begin_many", "end"):
            p = mock.patch.object(_backend.active, name, getattr(self, name))
            p.start()
            test.addCleanup(p.stop)


class _Tensor:
    """A DLPack producer whose stream is its __cuda_stream__."""

    def __init__(self, stream):
        self.stream = _Proto((0, stream))

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        return "capsule"


class PythonExchanges(unittest.TestCase):
    """Lists and tensors as producers: the native exchange hands them to the
    Python code (dlsync._exchange.exchange_python), which calls the backend's
    begin, begin_many and end: faked here."""

    def setUp(self):
        self.log = _Log()
        self.log.patch(self)

    def tearDown(self):
        self.assertEqual(self.log.open, {}, "exchanges begun and never ended")

    def test_a_list_and_a_tensor_go_through_the_python_code(self):
        with dlsync.exchange([0x51, _Tensor(0x52), 0x51], 0xC0, capture_stable=True):
            self.assertEqual(self.log.calls, [("begin", (0x51, 0x52), 0xC0, 1)])
        self.assertEqual(self.log.calls[1:], [("end", (0x51, 0x52), 0xC0)])
        self.log.calls.clear()
        with dlsync.exchange(_Tensor(0x53), _Proto((0, 0xC1))):
            pass
        self.assertEqual(self.log.calls, [("begin", (0x53,), 0xC1, 0), ("end", (0x53,), 0xC1)])

    def test_the_block_error_passes_and_the_exchange_still_ends(self):
        with self.assertRaises(KeyError):
            with dlsync.exchange([0x51], 0xC0):
                raise KeyError("user")
        self.assertEqual([c[0] for c in self.log.calls], ["begin", "end"])

    def test_an_error_at_end_replaces_the_block_error_which_is_its_context(self):
        self.log.fail_end = True
        with self.assertRaises(dlsync.Error) as info:
            with dlsync.exchange((0x51,), 0xC0):
                raise KeyError("user")
        self.assertIsInstance(info.exception.__context__, KeyError)
        with self.assertRaises(dlsync.Error):
            with dlsync.exchange((0x51,), 0xC0):
                pass

    def test_an_exchange_entered_and_dropped_is_ended(self):
        ex = dlsync.exchange([0x51], 0xC0)
        ex.__enter__()
        del ex
        gc.collect()
        self.assertEqual([c[0] for c in self.log.calls], ["begin", "end"])

    def test_exit_returns_false(self):
        ex = dlsync.exchange([0x51], 0xC0)
        ex.__enter__()
        self.assertFalse(ex.__exit__(None, None, None))


class EitherBackend(unittest.TestCase):
    def test_the_garbage_collector_sees_what_an_exchange_holds(self):
        producers = [0x51]
        ex = dlsync.exchange(producers, 0xC0)
        if NATIVE:
            self.assertIn(producers, gc.get_referents(ex))
        producers.append(ex)  # a cycle
        del ex, producers
        self.assertGreaterEqual(gc.collect(), 1)

    def test_end_takes_a_handle(self):
        for bad in ("x", 1.5, True, None):
            with self.assertRaises(TypeError) as info:
                _backend.active.end(bad)
            self.assertEqual(str(info.exception), "end: an exchange handle (int) from begin")


@needs_native
class NativeOnly(unittest.TestCase):
    def test_the_module_names_what_it_needs(self):
        self.assertIn("dlsync_exchange_begin_flags", dlsync._native.SYMBOLS)
        self.assertIn("dlsync_exchange_begin_many", dlsync._native.SYMBOLS)
        self.assertIn("dlsync_fence_import", dlsync._native.SYMBOLS)
        self.assertEqual(dlsync._native.ABI, _backend.NATIVE_ABI)
        self.assertEqual(dlsync._native.POINTER_BITS, 8 * _ctypes_impl.ctypes.sizeof(
            _ctypes_impl.ctypes.c_void_p))


@needs_native
class SameAsCtypes(unittest.TestCase):
    """The compiled calls against a ctypes backend over the same library."""

    def setUp(self):
        self.ct = _ctypes_impl.CtypesBackend(_backend.lib)
        self.ct.set_python_exchange(_exchange.exchange_python)

    def test_stream_handle(self):
        for value in STREAM_VALUES:
            native = _outcome(dlsync._native.stream_handle, value)
            python = _outcome(self.ct.stream_handle, value)
            self.assertEqual(native, python, repr(value))

    def test_dlpack_values(self):
        for value in (-1, 0, 1, 2, 3, -2, 2**62, -(2**63)):
            self.assertEqual(_outcome(dlsync._native.dlpack_stream, value, None),
                             _outcome(self.ct.dlpack_stream, value, None), value)

    def test_the_producers_exchange_api(self):
        try:  # its capsules: a DLPack exchange API built with ctypes
            import test_producers as tp
        except ImportError as e:
            self.skipTest(f"test_producers: {e}")

        for answer, major in ((0xA110, 1), (None, 1), ("fail", 1), (0x1, 2)):
            cls = tp._producer_class(tp._capsule(answer, major=major))
            api = dlsync._producers.exchange_api_of(cls)
            for device in ((2, 0), (2, 3), (1, 0)):
                self.assertEqual(_outcome(dlsync._native.env_stream, api, *device, cls),
                                 _outcome(self.ct.env_stream, api, *device, cls),
                                 (answer, major, device))

    def test_begin_many_checks_its_arguments_alike(self):
        for args in (((0x10, 1.5), 0x20), ([2**64], 0x20), ([0x10], "s"), ("ab", 0x20),
                     (None, 0x20), ({0x10}, 0x20)):
            self.assertEqual(_outcome(dlsync._native.begin_many, *args),
                             _outcome(self.ct.begin_many, *args), args)

    @unittest.skipIf(_has_driver(), "a CUDA driver is present")
    def test_errors_of_the_library(self):
        def enter(impl):
            return lambda p, c, s: impl(p, c, s).__enter__()

        for args in ((0x10, 0x20, False), (0x10, 0x20, True), (None, 2, False),
                     (2**64, 0x10, False), (0x10, "s", False), ([0x10, 0x11], 0x20, False)):
            self.assertEqual(_outcome(enter(dlsync._native.Exchange), *args),
                             _outcome(enter(self.ct.Exchange), *args), args)
        for stream in (0x10, 2**64, 1.5):
            self.assertEqual(_outcome(dlsync._native.capture_state, stream),
                             _outcome(self.ct.capture_state, stream), stream)
        for value, producer in ((1, 0x10), (0, 0x10), (1, -1)):
            self.assertEqual(_outcome(dlsync._native.dlpack_stream, value, producer),
                             _outcome(self.ct.dlpack_stream, value, producer), (value, producer))
        self.assertEqual(_outcome(dlsync._native.begin, 0x10, 0x20, 0),
                         _outcome(self.ct.begin, 0x10, 0x20, 0))
        self.assertEqual(_outcome(dlsync._native.begin_many, [0x10, 0x11], 0x20, 0),
                         _outcome(self.ct.begin_many, [0x10, 0x11], 0x20, 0))
        self.assertEqual(_outcome(dlsync._native.end, 0x1234),
                         _outcome(self.ct.end, 0x1234))


@unittest.skipUnless(NATIVE and not CHILD, "the ctypes path is the one in use here already")
class CtypesPathToo(unittest.TestCase):
    def test_the_unit_tests_pass_on_the_ctypes_path(self):
        env = dict(os.environ, DLSYNC_NO_NATIVE="1", DLSYNC_TEST_NATIVE_CHILD="1",
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("DLSYNC_EXPECT_NATIVE", None)
        modules = [m for m in ("test_binding", "test_hardening", "test_producers", "test_native",
                               "test_backends", "test_interrupts")
                   if os.path.isfile(os.path.join(HERE, m + ".py"))]
        run = subprocess.run([sys.executable, "-m", "unittest", *modules], cwd=HERE, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=300)
        self.assertEqual(run.returncode, 0, run.stdout[-4000:])
        self.assertIn("OK", run.stdout)


if __name__ == "__main__":
    unittest.main()
