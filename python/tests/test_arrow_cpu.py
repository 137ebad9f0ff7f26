# SPDX-License-Identifier: Apache-2.0
"""dlsync.arrow (the Arrow C Device data interface, __arrow_c_device_array__)
on the fake CUDA driver, without a GPU.

dlsync's export consumed by dlsync's import on eager streams, from a capture
(the record node's event, waited on after each launch) and into a capture
(a wait node; the producer's release only once the graph is gone); the
producer's release run on the reclaimer thread, once per array; capsules
never consumed released by their destructors; foreign arrays made here by
hand (a NULL sync_event, the CUDA_HOST and CUDA_MANAGED device types); and
every bad input refused with a dlsync.Error naming it, no driver call made
and the capsule left unconsumed. The last class runs this module again on
the compiled backend (dlsync._native) in a child. Plain unittest; ctest
runs it with DLSYNC_LIBRARY and DLSYNC_TEST_FAKE_LIBCUDA set."""
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import fake_cuda  # before dlsync asks for a context

FAKE, WHY = fake_cuda.load()
if os.environ.get("DLSYNC_TEST_PKG"):  # a copy with the compiled backend built into it
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from dlsync import _arrow, _backend  # noqa: E402
from dlsync import arrow  # noqa: E402
from dlsync._interface import Backend  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PTR = 0x7F0000001000
_vp = ctypes.c_void_p

_new = ctypes.pythonapi["PyCapsule_New"]
_new.restype = ctypes.py_object
_new.argtypes = [_vp, ctypes.c_char_p, _vp]
_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_pointer.restype = _vp
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _flush():
    """dlsync_release_flush on the default context (the GIL let go: the
    releases that run Python code can take it)."""
    lib = _backend.lib
    ctx = _vp()
    assert lib.dlsync_context_default(ctypes.byref(ctx)) == 0
    assert lib.dlsync_release_flush(ctx) == 0


def _array_in(capsule):
    return _arrow.ArrowDeviceArray.from_address(_pointer(capsule, b"arrow_device_array"))


class Foreign:
    """A producer made by hand (not dlsync's): the structures held here,
    capsules without destructors, a release that counts."""

    def __init__(self, device_type=2, device_id=0, reserved=(0, 0, 0), released=False,
                 sync_event="none", names=(b"arrow_schema", b"arrow_device_array"),
                 fmt=b"f"):
        self.released = []
        self.schema_released = []
        self._buffers = (_vp * 2)(None, PTR)
        self._fmt = ctypes.create_string_buffer(fmt)
        self._rel = _arrow._ArrayRelease(self._release)
        self._srel = _arrow._SchemaRelease(self._schema_release)
        self.array = _arrow.ArrowDeviceArray()
        a = self.array
        a.array.length = 4
        a.array.n_buffers = 2
        a.array.buffers = ctypes.cast(self._buffers, ctypes.POINTER(_vp))
        a.array.release = None if released else ctypes.cast(self._rel, _vp).value
        a.device_id = device_id
        a.device_type = device_type
        for i, r in enumerate(reserved):
            a.reserved[i] = r
        self._event = _vp(None)
        if sync_event == "null event":
            a.sync_event = ctypes.addressof(self._event)
        self.schema = _arrow.ArrowSchema()
        self.schema.format = ctypes.cast(self._fmt, ctypes.c_char_p)
        self.schema.release = ctypes.cast(self._srel, _vp).value
        self.names = names

    def _release(self, p):
        self.released.append(threading.get_ident())
        p.contents.release = None

    def _schema_release(self, p):
        self.schema_released.append(1)
        p.contents.release = None

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        return (_new(ctypes.addressof(self.schema), self.names[0], None),
                _new(ctypes.addressof(self.array), self.names[1], None))


@unittest.skipIf(FAKE is None, WHY or "")
class _OnFake(unittest.TestCase):
    def setUp(self):
        self.p, self.c = FAKE.stream(), FAKE.stream()
        self.released = []

    def tearDown(self):
        gc.collect()
        _flush()
        self.assertEqual(_arrow._live, {}, "an exported array's keep-alive left behind")
        self.assertEqual(_arrow._capsule_memory, {}, "a capsule's structure left behind")

    def _export(self, producer=None, **kw):
        kw.setdefault("device_id", 0)
        return arrow.export_device_array(PTR, 4, "f", self.p if producer is None else producer,
                                         release=lambda: self.released.append(
                                             threading.get_ident()), **kw)


class Backends(unittest.TestCase):
    def test_the_backend_has_the_arrow_calls_of_the_protocol(self):
        b = _backend.active
        self.assertIsInstance(b, Backend)
        for name in ("arrow_sync_event", "arrow_sync_release", "arrow_wait", "arrow_release"):
            self.assertTrue(callable(getattr(b, name)), name)
        if os.environ.get("DLSYNC_EXPECT_NATIVE"):
            self.assertEqual(b.name, "native")

    def test_the_layouts_are_the_interface_s(self):
        self.assertEqual(ctypes.sizeof(_arrow.ArrowArray), 80)
        self.assertEqual(ctypes.sizeof(_arrow.ArrowDeviceArray), 128)
        self.assertEqual(ctypes.sizeof(_arrow.ArrowSchema), 72)
        self.assertEqual(_arrow.ArrowDeviceArray.device_id.offset, 80)
        self.assertEqual(_arrow.ArrowDeviceArray.device_type.offset, 88)
        self.assertEqual(_arrow.ArrowDeviceArray.sync_event.offset, 96)
        self.assertEqual(_arrow.ArrowDeviceArray.reserved.offset, 104)
        self.assertIs(dlsync.arrow, arrow)


class RoundTrip(_OnFake):
    def test_eager_to_eager_waits_once_and_releases_after_on_the_reclaimer(self):
        exp = self._export()
        records = FAKE.calls("cuEventRecord")
        schema, array = exp.__arrow_c_device_array__()
        self.assertEqual(FAKE.calls("cuEventRecord"), records + 1)  # the producer's event
        self.assertIsNotNone(_array_in(array).sync_event)
        waits = FAKE.calls("cuStreamWaitEvent")
        arr = arrow.import_device_array((schema, array), self.c)
        self.assertEqual(FAKE.calls("cuStreamWaitEvent"), waits + 1)
        self.assertIsNone(_array_in(array).array.release)  # moved out of the capsule
        self.assertEqual((arr.format, arr.length, arr.buffers, arr.device_id, arr.device_type),
                         ("f", 4, (None, PTR), 0, arrow.DEVICE_CUDA))
        self.assertEqual((arr.null_count, arr.offset, arr.n_children), (0, 0, 0))
        _flush()
        self.assertEqual(self.released, [])  # the consumer holds it
        arr.release()
        self.assertTrue(arr.released)
        _flush()
        self.assertEqual(len(self.released), 1)
        self.assertNotEqual(self.released[0], threading.get_ident())  # the reclaimer's thread
        del schema, array

    def test_the_with_block_releases_and_a_second_release_is_refused(self):
        with arrow.import_device_array(self._export(), self.c) as arr:
            pass
        self.assertTrue(arr.released)
        _flush()
        self.assertEqual(len(self.released), 1)
        with self.assertRaisesRegex(dlsync.Error, "released already"):
            arr.release()
        with self.assertRaisesRegex(dlsync.Error, "was released"):
            arr.wait()
        arr.close()  # released: nothing
        _flush()
        self.assertEqual(len(self.released), 1)

    def test_each_export_is_its_own_array_released_once(self):
        exp = self._export()
        a = arrow.import_device_array(exp, self.c)
        b = arrow.import_device_array(exp, self.c)
        self.assertNotEqual(a.sync_event, b.sync_event)
        a.release()
        _flush()
        self.assertEqual(len(self.released), 1)
        b.release()
        _flush()
        self.assertEqual(len(self.released), 2)

    def test_an_array_dropped_unreleased_is_released_on_the_import_stream(self):
        arr = arrow.import_device_array(self._export(), self.c)
        calls = FAKE.calls("cuEventRecord")
        del arr
        gc.collect()
        self.assertEqual(FAKE.calls("cuEventRecord"), calls + 1)  # the release's event
        _flush()
        self.assertEqual(len(self.released), 1)

    def test_capsules_never_consumed_are_released_by_their_destructors(self):
        pair = self._export().__arrow_c_device_array__()
        self.assertEqual(len(_arrow._live), 1)
        del pair
        gc.collect()
        self.assertEqual(self.released, [threading.get_ident()])  # at once, by the capsule
        self.assertEqual(_arrow._live, {})

    def test_the_owner_is_kept_alive_until_the_release(self):
        class Buf:
            __cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (PTR, False),
                                        "version": 3, "strides": None}

        buf = Buf()
        exp = arrow.export_device_array(buf, 8, "f", self.p, device_id=0)
        before = sys.getrefcount(buf)
        arr = arrow.import_device_array(exp, self.c)
        del exp
        self.assertEqual(sys.getrefcount(buf), before)  # the array's keep-alive, not exp's
        self.assertEqual(arr.buffers, (None, PTR))
        arr.release()
        _flush()
        self.assertEqual(sys.getrefcount(buf), before - 1)

    def test_a_producer_in_a_capture_is_a_record_node_waited_on_after_each_launch(self):
        launch = FAKE._fn("cuGraphLaunch", _vp, _vp)
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        pair = self._export().__arrow_c_device_array__()
        r, graph = FAKE.end_capture_graph(self.p)
        self.assertEqual(r, 0)
        self.assertIn(fake_cuda.CU_GRAPH_NODE_TYPE_EVENT_RECORD, FAKE.node_types(graph))
        r, exe = FAKE.instantiate(graph)
        self.assertEqual(r, 0)
        x = FAKE.stream()
        self.assertEqual(launch(exe, x), 0)
        waits = FAKE.calls("cuStreamWaitEvent")
        arr = arrow.import_device_array(pair, self.c, provenance="external_record")
        self.assertEqual(FAKE.calls("cuStreamWaitEvent"), waits + 1)
        for _ in range(3):  # the record node armed again at each launch
            self.assertEqual(launch(exe, x), 0)
            arr.wait()
        self.assertEqual(FAKE.calls("cuStreamWaitEvent"), waits + 4)
        arr.release()
        _flush()
        self.assertEqual(len(self.released), 1)
        FAKE.exec_destroy(exe)
        FAKE.graph_destroy(graph)

    def test_a_consumer_in_a_capture_gets_a_wait_node_and_releases_once_the_graph_is_gone(self):
        exp = self._export()
        FAKE.begin_capture(self.c)
        arr = arrow.import_device_array(exp, self.c)
        FAKE.work(self.c)
        arr.release()
        r, graph = FAKE.end_capture_graph(self.c)
        self.assertEqual(r, 0)
        self.assertIn(fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT, FAKE.node_types(graph))
        _flush()
        self.assertEqual(self.released, [])  # the graph owns the release
        FAKE.graph_destroy(graph)
        _flush()
        self.assertEqual(self.released, [])  # the destructor is the driver's, still pending
        self.assertGreaterEqual(FAKE.run_destructors(), 1)  # the release's, the event's
        for _ in range(1000):
            _flush()
            if self.released:
                break
            time.sleep(0.01)
        self.assertEqual(len(self.released), 1)

    def test_the_provenances_are_the_library_s(self):
        self.assertEqual(arrow.PROVENANCES, {"eager": 1, "complete": 2, "external_record": 3})


class ForeignArrays(_OnFake):
    def test_a_null_sync_event_is_nothing_to_wait_on(self):
        f = Foreign()
        calls = FAKE.calls("cuStreamWaitEvent")
        arr = arrow.import_device_array(f, self.c)
        self.assertEqual(FAKE.calls("cuStreamWaitEvent"), calls)
        self.assertIsNone(arr.sync_event)
        self.assertEqual(f.schema_released, [1])  # the schema read and released at import
        self.assertIsNone(f.array.array.release)  # moved
        arr.release()
        _flush()
        self.assertEqual(len(f.released), 1)

    def test_cuda_host_and_managed_arrays_are_taken(self):
        for t in (arrow.DEVICE_CUDA_HOST, arrow.DEVICE_CUDA_MANAGED):
            f = Foreign(device_type=t, device_id=3)  # the device of host memory: not compared
            with arrow.import_device_array(f, self.c, device_id=0) as arr:
                self.assertEqual(arr.device_type, t)
            _flush()
            self.assertEqual(len(f.released), 1, t)


class BadInput(_OnFake):
    def _refused(self, obj, pattern, **kw):
        total = FAKE.lib.fake_libcuda_calls_total()
        with self.assertRaisesRegex(dlsync.Error, pattern) as cm:
            arrow.import_device_array(obj, self.c, **kw)
        self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        self.assertEqual(FAKE.lib.fake_libcuda_calls_total(), total, "a driver call was made")
        return cm.exception

    def test_wrong_capsule_names(self):
        f = Foreign(names=(b"arrow_schema", b"arrow_array"))
        self._refused(f, "a capsule named 'arrow_array' where the Arrow PyCapsule interface "
                         "says 'arrow_device_array'")
        f = Foreign(names=(b"arrow_device_array", b"arrow_schema"))
        self._refused(f, "named 'arrow_device_array' where .* says 'arrow_schema'")
        self.assertIsNotNone(f.array.array.release)  # not consumed

    def test_objects_that_are_no_producer(self):
        self._refused(5, "a int has no __arrow_c_device_array__")
        self._refused(object(), "a object has no __arrow_c_device_array__")
        self._refused((1, 2, 3), "a tuple of 3 items")
        self._refused((1, 2), "the arrow_schema capsule is a int, not a PyCapsule")

        class Bad:
            def __arrow_c_device_array__(self, requested_schema=None):
                return [1, 2]

        self._refused(Bad(), r"Bad.__arrow_c_device_array__\(\) returned a list")

    def test_another_device_type(self):
        for t, name in ((1, "ARROW_DEVICE_CPU"), (10, "ARROW_DEVICE_ROCM"),
                        (99, "unknown device type")):
            f = Foreign(device_type=t)
            self._refused(f, f"device type is {name} \\({t}\\), not ARROW_DEVICE_CUDA")
            self.assertIsNotNone(f.array.array.release)

    def test_reserved_bytes(self):
        f = Foreign(reserved=(0, 7, 0))
        self._refused(f, r"reserved\[1\] is 7, not 0")

    def test_a_released_array(self):
        self._refused(Foreign(released=True), r"released already \(its release is NULL\)")

    def test_an_array_imported_twice_from_the_same_capsules(self):
        pair = Foreign().__arrow_c_device_array__()
        arrow.import_device_array(pair, self.c).release()
        _flush()  # the reclaimer's driver calls done before counting
        self._refused(pair, "released already")

    def test_a_device_other_than_the_consumer_s(self):
        self._refused(Foreign(device_id=1), "on device 1 and the consumer expects device 0",
                      device_id=0)

    def test_an_unknown_provenance(self):
        self._refused(Foreign(), "provenance 'captured' is not one of", provenance="captured")

    def test_a_sync_event_pointing_to_a_null_event_is_the_library_s_refusal(self):
        f = Foreign(sync_event="null event")
        with self.assertRaisesRegex(dlsync.Error, "points to a NULL event"):
            arrow.import_device_array(f, self.c)
        self.assertIsNotNone(f.array.array.release)  # not consumed

    def test_export_refusals(self):
        cases = [
            (dict(format="z"), "format 'z' is not one dlsync exports"),
            (dict(length=-1), "length -1 is not an int >= 0"),
            (dict(length=True), "length True is not an int >= 0"),
            (dict(device_type=1), "device_type 1 is not a CUDA device type"),
            (dict(release=5), "release is a int, not a callable"),
            (dict(data="abc"), "the data is a str, which is neither"),
            (dict(data=0), "the data pointer 0x0 is not a device address"),
            (dict(device_id=None), "the data's device is unknown"),
            (dict(device_id=-2), "device_id -2 is not an int >= 0"),
        ]
        for changes, pattern in cases:
            kw = dict(data=PTR, length=4, format="f", producer=self.p, device_id=0)
            kw.update(changes)
            total = FAKE.lib.fake_libcuda_calls_total()
            with self.assertRaisesRegex(dlsync.Error, pattern, msg=str(changes)):
                arrow.export_device_array(**kw)
            self.assertEqual(FAKE.lib.fake_libcuda_calls_total(), total)

    def test_export_checks_the_data_s_interface(self):
        class Buf:
            def __init__(self, typestr, shape, strides=None):
                self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                                 "data": (PTR, False), "version": 3,
                                                 "strides": strides}

        with self.assertRaisesRegex(dlsync.Error, "format 'f' is f4 and the data's typestr is "
                                                  "'<i4'"):
            arrow.export_device_array(Buf("<i4", (4,)), 4, "f", self.p, device_id=0)
        with self.assertRaisesRegex(dlsync.Error, "length 5 is more than the data's 4 items"):
            arrow.export_device_array(Buf("<f4", (4,)), 5, "f", self.p, device_id=0)
        with self.assertRaisesRegex(dlsync.Error, "strided"):
            arrow.export_device_array(Buf("<f4", (4,), (8,)), 4, "f", self.p, device_id=0)
        exp = arrow.export_device_array(Buf("<f8", (2, 2)), 4, "g", self.p, device_id=0)
        self.assertEqual(exp.format, "g")

    def test_an_unknown_keyword_with_a_value_is_not_implemented(self):
        exp = self._export()
        with self.assertRaisesRegex(NotImplementedError, "keyword copy=True"):
            exp.__arrow_c_device_array__(copy=True)
        pair = exp.__arrow_c_device_array__(requested_schema=None, copy=None)
        del pair

    def test_an_export_on_a_stream_the_driver_does_not_know_is_refused_with_nothing_made(self):
        exp = self._export(producer=0x10)
        with self.assertRaises(dlsync.Error):
            exp.__arrow_c_device_array__()
        self.assertEqual(self.released, [])  # nothing handed out, nothing released


_AT_EXIT = r"""
import os, sys, time
sys.path.insert(0, os.getcwd())
import fake_cuda
fake, _ = fake_cuda.load()
sys.path.insert(0, os.environ.get("DLSYNC_TEST_PKG") or os.path.join(os.getcwd(), ".."))
import dlsync


def slow():
    time.sleep(0.5)  # on the reclaimer thread, the GIL let go: the interpreter goes on to exit
    print("first released", flush=True)


p, c = fake.stream(), fake.stream()
for name, cb in (("first", slow), ("second", lambda: print("second released", flush=True))):
    out = dlsync.arrow.export_device_array(0x1000, 4, "f", p, device_id=0, release=cb)
    dlsync.arrow.import_device_array(out, c).release()
print("exiting", flush=True)
"""


@unittest.skipIf(FAKE is None, WHY or "")
class AtExit(unittest.TestCase):
    def test_releases_still_queued_at_exit_run_before_the_interpreter_is_gone(self):
        done = subprocess.run([sys.executable, "-c", _AT_EXIT], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stdout)
        self.assertEqual(done.stdout.split("\n")[:3],
                         ["exiting", "first released", "second released"], done.stdout)


@unittest.skipIf(FAKE is None, WHY or "")
class CompiledBackend(unittest.TestCase):
    def test_this_module_on_the_compiled_backend_too(self):
        if os.environ.get("DLSYNC_EXPECT_NATIVE") or os.environ.get("DLSYNC_NO_NATIVE") == "1":
            self.skipTest("this is the child run (or the compiled backend is off)")
        from test_backends import _native_package

        with tempfile.TemporaryDirectory() as tmp:
            env, why = _native_package(tmp)
            if env is None:
                self.skipTest(why)
            # This process ran one backend; the child runs the other.
            runs = [dict(DLSYNC_EXPECT_NATIVE="1", **env)] if env else [{"DLSYNC_NO_NATIVE": "1"}]
            for extra in runs:
                full = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **extra)
                if "DLSYNC_NO_NATIVE" not in extra:
                    full.pop("DLSYNC_NO_NATIVE", None)
                done = subprocess.run([sys.executable, "-m", "unittest", "test_arrow_cpu"],
                                      cwd=HERE, env=full, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=300)
                self.assertEqual(done.returncode, 0, f"{extra}:\n{done.stdout[-4000:]}")
                self.assertIn("OK (skipped=1)", done.stdout)  # only this test skips there


if __name__ == "__main__":
    unittest.main()
