# SPDX-License-Identifier: Apache-2.0
"""The Arrow C Device data interface from Python (include/dlsync/arrow.h),
through the Arrow PyCapsule interface: ``__arrow_c_device_array__``.

Consumer: :func:`import_device_array` takes an object with
``__arrow_c_device_array__`` (or the pair of capsules it returns), checks the
capsules and the array, orders the consumer's stream after the array's
``sync_event`` (``dlsync_arrow_wait``: an eager, a capturing or a replayed
graph's stream alike) and moves the array out of its capsule into a
:class:`DeviceArray`, whose ``release()`` (``close()``, the end of a ``with``)
hands the producer's ``release`` to ``dlsync_arrow_release``: it runs only
once the consumer's work queued so far on that stream is done (on dlsync's
reclaimer thread), or once the consumer's graph is gone.

Producer: :func:`export_device_array` wraps a CUDA buffer that a stream
writes, as a primitive Arrow array (one data buffer, no validity buffer);
each call of its ``__arrow_c_device_array__`` signals the producer's stream
then (``dlsync_arrow_sync_event``: an event recorded on an eager stream, an
event-record node in a capture) and returns a fresh capsule pair whose array
keeps the buffer's owner alive until the array's release, which also calls
the ``release`` callback given.

Every check is made before anything is queued; a refusal is a
:class:`dlsync.Error` naming what was wrong.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _backend
from ._backend import active as _b
from ._errors import INVALID_ARGUMENT, Error

# ---- the interface's structures (include/dlsync/arrow.h; the same layout) ----

DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3
DEVICE_CUDA_MANAGED = 13
_CUDA_TYPES = (DEVICE_CUDA, DEVICE_CUDA_HOST, DEVICE_CUDA_MANAGED)
_DEVICE_NAMES = {1: "ARROW_DEVICE_CPU", 2: "ARROW_DEVICE_CUDA", 3: "ARROW_DEVICE_CUDA_HOST",
                 4: "ARROW_DEVICE_OPENCL", 7: "ARROW_DEVICE_VULKAN", 8: "ARROW_DEVICE_METAL",
                 9: "ARROW_DEVICE_VPI", 10: "ARROW_DEVICE_ROCM", 11: "ARROW_DEVICE_ROCM_HOST",
                 12: "ARROW_DEVICE_EXT_DEV", 13: "ARROW_DEVICE_CUDA_MANAGED",
                 14: "ARROW_DEVICE_ONEAPI", 15: "ARROW_DEVICE_WEBGPU", 16: "ARROW_DEVICE_HEXAGON"}

# dlsync_provenance (include/dlsync/foreign.h), by the words this module takes.
PROVENANCES = {"eager": 1, "complete": 2, "external_record": 3}

# The primitive formats export_device_array writes, and their item sizes.
FORMATS = {"c": 1, "C": 1, "s": 2, "S": 2, "i": 4, "I": 4, "l": 8, "L": 8, "e": 2, "f": 4,
           "g": 8}
# The CAI typestr kind of each format (its item size is FORMATS').
_FORMAT_KINDS = {"c": "i", "C": "u", "s": "i", "S": "u", "i": "i", "I": "u", "l": "i",
                 "L": "u", "e": "f", "f": "f", "g": "f"}

_vp = ctypes.c_void_p


class ArrowSchema(ctypes.Structure):
    _fields_ = [
        ("format", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("metadata", _vp),
        ("flags", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("children", _vp),
        ("dictionary", _vp),
        ("release", _vp),
        ("private_data", _vp),
    ]


class ArrowArray(ctypes.Structure):
    _fields_ = [
        ("length", ctypes.c_int64),
        ("null_count", ctypes.c_int64),
        ("offset", ctypes.c_int64),
        ("n_buffers", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("buffers", ctypes.POINTER(_vp)),
        ("children", _vp),
        ("dictionary", _vp),
        ("release", _vp),
        ("private_data", _vp),
    ]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", _vp),
        ("reserved", ctypes.c_int64 * 3),
    ]


class _Sync(ctypes.Structure):
    """dlsync_arrow_sync: the fence and the event sync_event points to."""

    _fields_ = [("fence", _vp), ("event", _vp)]


assert ctypes.sizeof(ArrowArray) == 80 and ctypes.sizeof(ArrowDeviceArray) == 128

_SchemaRelease = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))
_ArrayRelease = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))
_CapsuleDestructor = ctypes.CFUNCTYPE(None, _vp)

# ---- PyCapsule through ctypes.pythonapi (the GIL held, errors raised) ----
# Function objects of this module's own (pythonapi[name], not the attribute,
# which is one object shared with every other user that sets its types).

_SCHEMA_NAME = b"arrow_schema"
_ARRAY_NAME = b"arrow_device_array"
# The names the capsules made here point to: alive as long as the module.
_schema_name = ctypes.create_string_buffer(_SCHEMA_NAME)
_array_name = ctypes.create_string_buffer(_ARRAY_NAME)

_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [_vp, _vp, _CapsuleDestructor]
_capsule_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi["PyCapsule_GetName"]
_capsule_name.restype = _vp
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = _vp
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor's view: the capsule as an address (it is being destroyed:
# no new reference to it may be taken).
_capsule_pointer_raw = ctypes.PYFUNCTYPE(_vp, _vp, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _fail(message: str) -> Error:
    return Error(INVALID_ARGUMENT, message)


# ---- the producer's side ----

_lock = threading.Lock()
_ids = itertools.count(1)
# What an exported array needs until its release: by private_data.
_live: Dict[int, "_Produced"] = {}
# The schemas' strings until their release: by private_data.
_schemas: Dict[int, Tuple[bytes, bytes]] = {}
# The structures a capsule points to, until the capsule is destroyed: by address.
_capsule_memory: Dict[int, ctypes.Structure] = {}


class _Produced:
    """One exported array's keep-alive: its buffers' pointer array, the sync
    its sync_event points into, the buffer's owner and the callback."""

    __slots__ = ("buffers", "sync", "owner", "callback")

    def __init__(self, buffers: Any, owner: Any, callback: Optional[Callable[[], None]]):
        self.buffers = buffers
        self.sync = _Sync()
        self.owner = owner
        self.callback = callback


def _release_schema(schema: Any) -> None:
    s = schema.contents
    with _lock:
        _schemas.pop(int(s.private_data or 0), None)
    s.release = None


def _release_array(array: Any) -> None:
    """The exported array's release (the interface's; any thread: ctypes
    takes the GIL). Drops the sync's fence and the owner, then calls the
    callback; an exception it raises is reported as unraisable."""
    a = array.contents
    with _lock:
        produced = _live.pop(int(a.private_data or 0), None)
    a.release = None
    if produced is None:
        return
    _b.arrow_sync_release(ctypes.addressof(produced.sync))
    callback = produced.callback
    produced.owner = produced.callback = None
    if callback is not None:
        callback()


def _destroy_capsule(capsule: Optional[int], name: bytes) -> None:
    address = _capsule_pointer_raw(capsule, name)
    if not address:
        return
    with _lock:
        memory = _capsule_memory.pop(int(address), None)
    if memory is None:
        return
    # Not moved out by a consumer (release NULL then): released here.
    if isinstance(memory, ArrowSchema):
        if memory.release:
            _SchemaRelease(memory.release)(ctypes.pointer(memory))
    elif isinstance(memory, ArrowDeviceArray) and memory.array.release:
        _ArrayRelease(memory.array.release)(ctypes.pointer(memory.array))


def _schema_capsule_destructor(capsule: Optional[int]) -> None:
    _destroy_capsule(capsule, _SCHEMA_NAME)


def _array_capsule_destructor(capsule: Optional[int]) -> None:
    _destroy_capsule(capsule, _ARRAY_NAME)


# The C-callable functions (alive as long as the module).
_SCHEMA_RELEASE_C = _SchemaRelease(_release_schema)
_ARRAY_RELEASE_C = _ArrayRelease(_release_array)
_SCHEMA_RELEASE = ctypes.cast(_SCHEMA_RELEASE_C, _vp).value
_ARRAY_RELEASE = ctypes.cast(_ARRAY_RELEASE_C, _vp).value
_SCHEMA_DESTRUCTOR = _CapsuleDestructor(_schema_capsule_destructor)
_ARRAY_DESTRUCTOR = _CapsuleDestructor(_array_capsule_destructor)


def _capsule(memory: ctypes.Structure, name: Any, destructor: Any) -> object:
    address = ctypes.addressof(memory)
    with _lock:
        _capsule_memory[address] = memory
    try:
        return _capsule_new(address, ctypes.addressof(name), destructor)
    except BaseException:
        with _lock:
            _capsule_memory.pop(address, None)
        raise


def _buffer_of(data: Any, fmt: str, length: int) -> Tuple[int, Any]:
    """(pointer, owner) of export_device_array's data: an int pointer (no
    owner), or an object with ``__cuda_array_interface__`` (kept alive),
    checked against the format and the length."""
    if isinstance(data, int) and not isinstance(data, bool):
        if not 0 < data < 1 << 64:
            raise _fail(f"export_device_array: the data pointer {data:#x} is not a device "
                        "address (0 < pointer < 2**64)")
        return data, None
    desc = getattr(data, "__cuda_array_interface__", None)
    if not isinstance(desc, dict):
        raise _fail(f"export_device_array: the data is a {type(data).__name__}, which is "
                    "neither an int device pointer nor an object with "
                    "__cuda_array_interface__")
    ptr = desc.get("data", (None,))[0]
    typestr = desc.get("typestr")
    shape = desc.get("shape")
    if not isinstance(ptr, int) or not isinstance(typestr, str) or not isinstance(shape, tuple):
        raise _fail(f"export_device_array: {type(data).__name__}.__cuda_array_interface__ "
                    "lacks an int data pointer, a typestr or a shape")
    if desc.get("mask") is not None:
        raise _fail("export_device_array: the data has a mask (export a validity buffer "
                    "yourself; dlsync writes none)")
    size = FORMATS[fmt]
    kind = _FORMAT_KINDS[fmt]
    if typestr[1:] != f"{kind}{size}":
        raise _fail(f"export_device_array: format {fmt!r} is {kind}{size} and the data's "
                    f"typestr is {typestr!r}")
    count = 1
    for n in shape:
        count *= int(n)
    strides = desc.get("strides")
    if strides is not None and len(shape) == 1 and strides[0] != size:
        raise _fail(f"export_device_array: the data is strided ({strides!r}); an Arrow "
                    "buffer is contiguous")
    if strides is not None and len(shape) > 1:
        raise _fail("export_device_array: the data has more than one dimension and strides; "
                    "give a contiguous 1-D array")
    if length > count:
        raise _fail(f"export_device_array: length {length} is more than the data's {count} "
                    "items")
    return ptr, data


def _data_device(data: Any) -> Optional[int]:
    get = getattr(data, "__dlpack_device__", None)
    if get is None:
        return None
    _, device_id = get()
    return int(device_id)


def _stream_device(stream: Any) -> Optional[int]:
    dev = getattr(stream, "device_id", None)
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    dev = getattr(getattr(stream, "device", None), "index", None)
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    return None


class DeviceArrayExport:
    """A CUDA buffer written by ``producer``'s stream, as an Arrow device
    array: what :func:`export_device_array` returns. Each call of
    ``__arrow_c_device_array__`` marks the work queued so far on the
    producer's stream (dlsync_arrow_sync_event) and returns a new pair of
    capsules; each array it hands out keeps ``data`` alive until its release
    and then calls ``release`` (once per array)."""

    def __init__(self, ptr: int, owner: Any, length: int, fmt: str, producer: Any,
                 release: Optional[Callable[[], None]], device_id: int, device_type: int,
                 name: str):
        self._ptr = ptr
        self._owner = owner
        self._length = length
        self._format = fmt
        self._producer = producer
        self._release = release
        self._device_id = device_id
        self._device_type = device_type
        self._name = name

    @property
    def format(self) -> str:
        return self._format

    @property
    def length(self) -> int:
        return self._length

    def __arrow_c_device_array__(self, requested_schema: Any = None,
                                 **kwargs: Any) -> Tuple[object, object]:
        """(schema capsule, device array capsule). ``requested_schema`` is
        ignored (the interface lets a producer keep its own type); a keyword
        the interface may add later, given a value other than None, is
        NotImplementedError."""
        for key, value in kwargs.items():
            if value is not None:
                raise NotImplementedError(f"__arrow_c_device_array__: keyword {key}={value!r} "
                                          "is not supported by dlsync's export")
        buffers = (_vp * 2)(None, self._ptr)  # validity: none; data
        produced = _Produced(buffers, self._owner, self._release)
        array = ArrowDeviceArray()
        array.array.length = self._length
        array.array.null_count = 0
        array.array.n_buffers = 2
        array.array.buffers = ctypes.cast(buffers, ctypes.POINTER(_vp))
        array.device_id = self._device_id
        array.device_type = self._device_type
        ident = next(_ids)
        array.array.private_data = ident
        # The event first: a refusal leaves nothing to release.
        _b.arrow_sync_event(ctypes.addressof(array), ctypes.addressof(produced.sync),
                            self._producer)
        array.array.release = _ARRAY_RELEASE
        with _lock:
            _live[ident] = produced
        fmt, name = self._format.encode(), self._name.encode()
        with _lock:
            _schemas[ident] = (fmt, name)
        schema = ArrowSchema(fmt, name, None, 0, 0, None, None, _SCHEMA_RELEASE, ident)
        try:
            schema_capsule = _capsule(schema, _schema_name, _SCHEMA_DESTRUCTOR)
        except BaseException:
            _release_schema(ctypes.pointer(schema))
            _release_array(ctypes.pointer(array.array))
            raise
        try:
            array_capsule = _capsule(array, _array_name, _ARRAY_DESTRUCTOR)
        except BaseException:  # the schema capsule's destructor releases the schema
            _release_array(ctypes.pointer(array.array))
            raise
        return schema_capsule, array_capsule


def export_device_array(data: Any, length: int, format: str, producer: Any, *,
                        release: Optional[Callable[[], None]] = None,
                        device_id: Optional[int] = None, device_type: int = DEVICE_CUDA,
                        name: str = "") -> DeviceArrayExport:
    """``data`` (an int device pointer, or an object with
    ``__cuda_array_interface__``, kept alive by each array handed out) as an
    Arrow device array of ``length`` items of the primitive ``format`` ("c",
    "C", "s", "S", "i", "I", "l", "L", "e", "f", "g": the signed and unsigned
    integers of 8 to 64 bits, float16, float32, float64), written by the
    work queued on ``producer`` (a stream) before each
    ``__arrow_c_device_array__`` call. ``release()`` is called once per
    array handed out, at its release (after the consumer's work when the
    consumer is dlsync's import_device_array); it may run on another thread.
    ``device_id``: where the data lives (default: its ``__dlpack_device__``,
    else the producer stream's device; required for a bare pointer on a
    stream object that does not say)."""
    if not isinstance(format, str) or format not in FORMATS:
        raise _fail(f"export_device_array: format {format!r} is not one dlsync exports "
                    f"(the primitive formats {', '.join(FORMATS)})")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise _fail(f"export_device_array: length {length!r} is not an int >= 0")
    if device_type not in _CUDA_TYPES:
        raise _fail(f"export_device_array: device_type {device_type!r} is not a CUDA device "
                    "type (DEVICE_CUDA 2, DEVICE_CUDA_HOST 3, DEVICE_CUDA_MANAGED 13)")
    if release is not None and not callable(release):
        raise _fail(f"export_device_array: release is a {type(release).__name__}, not a "
                    "callable")
    if not isinstance(name, str):
        raise _fail(f"export_device_array: name is a {type(name).__name__}, not a str")
    ptr, owner = _buffer_of(data, format, length)
    _b.stream_handle(producer)  # checked now, not at the first export
    if device_id is None:
        device_id = _data_device(data) if owner is not None else None
    if device_id is None:
        device_id = _stream_device(producer)
    if device_id is None:
        raise _fail("export_device_array: the data's device is unknown (a bare pointer on a "
                    "stream that does not say its device): give device_id=")
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise _fail(f"export_device_array: device_id {device_id!r} is not an int >= 0")
    return DeviceArrayExport(ptr, owner, length, format, producer, release, device_id,
                             device_type, name)


# ---- at exit ----

# Whether a release was handed to dlsync from here (import_device_array's):
# then the interpreter's exit waits for the eager ones.
_handed_over = False


def _drain_at_exit() -> None:
    """Runs at the interpreter's exit, before it is torn down: waits
    (dlsync_release_flush, the GIL let go) for the eager releases handed to
    dlsync, whose producer's release may be Python code (an export of this
    module's, a producer's that takes the GIL): once the interpreter is
    finalising, a thread that takes the GIL is ended there. Releases that
    graphs still own run when their graphs go, maybe never before the
    exit."""
    if not (_handed_over or _live):
        return
    context_default = _backend.lib["dlsync_context_default"]
    context_default.restype = ctypes.c_int
    context_default.argtypes = [ctypes.POINTER(_vp)]
    flush = _backend.lib["dlsync_release_flush"]
    flush.restype = ctypes.c_int
    flush.argtypes = [_vp]
    ctx = _vp()
    if context_default(ctypes.byref(ctx)) == 0:
        flush(ctx)  # its status: nothing to report it to at exit


atexit.register(_drain_at_exit)


# ---- the consumer's side ----


def _device_name(device_type: int) -> str:
    return f"{_DEVICE_NAMES.get(device_type, 'unknown device type')} ({device_type})"


def _capsules(obj: Any) -> Tuple[Any, Any]:
    if isinstance(obj, tuple):
        pair = obj
    else:
        get = getattr(type(obj), "__arrow_c_device_array__", None)
        if get is None:
            raise _fail(f"import_device_array: a {type(obj).__name__} has no "
                        "__arrow_c_device_array__ (and is not its (schema, array) capsule "
                        "pair)")
        pair = obj.__arrow_c_device_array__()
        if not isinstance(pair, tuple):
            raise _fail(f"import_device_array: {type(obj).__name__}.__arrow_c_device_array__() "
                        f"returned a {type(pair).__name__}, not a (schema, array) pair of "
                        "capsules")
    if len(pair) != 2:
        raise _fail(f"import_device_array: a tuple of {len(pair)} items, not a (schema, "
                    "array) pair of capsules")
    for capsule, want in zip(pair, (_SCHEMA_NAME, _ARRAY_NAME)):
        if type(capsule).__name__ != "PyCapsule":
            raise _fail(f"import_device_array: the {want.decode()} capsule is a "
                        f"{type(capsule).__name__}, not a PyCapsule")
        if not _capsule_valid(capsule, want):
            got = _capsule_name(capsule)
            seen = repr(ctypes.string_at(got).decode(errors="replace")) if got else "no name"
            raise _fail(f"import_device_array: a capsule named {seen} where the Arrow "
                        f"PyCapsule interface says {want.decode()!r}")
    return pair[0], pair[1]


class DeviceArray:
    """An Arrow device array moved out of its producer's capsule by
    :func:`import_device_array`: the consumer's stream already ordered after
    its ``sync_event``. ``release()`` (``close()``, leaving a ``with``) hands
    the producer's release to dlsync_arrow_release on the consumer's stream:
    it runs after the work queued there so far. Dropped unreleased, it is
    released so on the import's stream (if that fails, the array is left
    unreleased: a leak, never an early release)."""

    def __init__(self, array: ArrowDeviceArray, fmt: str, name: str, consumer: Any,
                 provenance: int):
        self._array = array
        self._consumer = consumer
        self._provenance = provenance
        self._released = False
        self.format = fmt
        self.name = name
        a = array.array
        self.length = int(a.length)
        self.null_count = int(a.null_count)
        self.offset = int(a.offset)
        self.n_children = int(a.n_children)
        self.device_id = int(array.device_id)
        self.device_type = int(array.device_type)
        self.sync_event: Optional[int] = array.sync_event
        n = int(a.n_buffers)
        self.buffers: Tuple[Optional[int], ...] = (
            tuple(a.buffers[i] for i in range(n)) if n > 0 and a.buffers else ())

    @property
    def released(self) -> bool:
        return self._released

    @property
    def address(self) -> int:
        """The address of the moved ArrowDeviceArray (for a C consumer that
        reads it in place; it stays this object's)."""
        return ctypes.addressof(self._array)

    def wait(self, stream: Any = None) -> None:
        """Orders ``stream`` (default: the import's consumer) after the
        array's sync_event again: for a producer that is a graph, whose
        event-record node is armed again at each launch (wait after each)."""
        if self._released:
            raise _fail("DeviceArray.wait: the array was released")
        _b.arrow_wait(ctypes.addressof(self._array),
                      self._consumer if stream is None else stream, self._provenance)

    def release(self, stream: Any = None) -> None:
        """The producer's release, run after the work queued so far on
        ``stream`` (default: the import's consumer stream); in a capture, once
        the graph and its executables are gone. Twice: dlsync.Error."""
        if self._released:
            raise _fail("DeviceArray.release: the array was released already")
        global _handed_over
        _b.arrow_release(ctypes.addressof(self._array),
                         self._consumer if stream is None else stream)
        self._released = True
        _handed_over = True

    def close(self) -> None:
        """release() on the import's stream; nothing once released."""
        if not self._released:
            self.release()

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_released", True):
            return
        try:
            self.release()
        except Exception:  # noqa: BLE001 - nothing to report it to; leaked, not freed early
            pass


def import_device_array(obj: Any, consumer: Any, *, provenance: str = "eager",
                        device_id: Optional[int] = None) -> DeviceArray:
    """The Arrow device array of ``obj`` (an object with
    ``__arrow_c_device_array__``, or the (schema, array) capsule pair it
    returned), for the stream ``consumer``: that stream is ordered after the
    array's sync_event (NULL: nothing to wait on), in any capture state, and
    the array is moved out of its capsule into the :class:`DeviceArray`
    returned (the schema is read and released).

    ``provenance`` says how the producer recorded the event (foreign.h):
    "eager" (cuEventRecord on a stream not capturing), "complete" (and its
    work is done) or "external_record" (an event-record node of a graph,
    armed at each launch; dlsync's own export in a capture is one).
    ``device_id``: the device the consumer expects (default: the consumer
    stream's, where the stream object says it); an ARROW_DEVICE_CUDA array
    of another device is refused.

    Refused, with nothing queued and the capsules left as they were (their
    destructors then release them): another capsule name, a device type that
    is not CUDA, CUDA_HOST or CUDA_MANAGED, non-zero reserved bytes, a
    released array (release NULL), a schema without a format."""
    if provenance not in PROVENANCES:
        raise _fail(f"import_device_array: provenance {provenance!r} is not one of "
                    f"{', '.join(PROVENANCES)}")
    _b.stream_handle(consumer)
    schema_capsule, array_capsule = _capsules(obj)
    array_p = _capsule_pointer(array_capsule, _ARRAY_NAME)
    schema_p = _capsule_pointer(schema_capsule, _SCHEMA_NAME)
    if not array_p or not schema_p:
        raise _fail("import_device_array: a capsule holds a NULL pointer")
    array = ArrowDeviceArray.from_address(array_p)
    schema = ArrowSchema.from_address(schema_p)
    if not array.array.release:
        raise _fail("import_device_array: the array was released already (its release is "
                    "NULL)")
    if not schema.release:
        raise _fail("import_device_array: the schema was released already (its release is "
                    "NULL)")
    if array.device_type not in _CUDA_TYPES:
        raise _fail(f"import_device_array: the array's device type is "
                    f"{_device_name(array.device_type)}, not ARROW_DEVICE_CUDA (2), "
                    "ARROW_DEVICE_CUDA_HOST (3) or ARROW_DEVICE_CUDA_MANAGED (13): dlsync "
                    "orders CUDA work only")
    for i, r in enumerate(array.reserved):
        if r != 0:
            raise _fail(f"import_device_array: reserved[{i}] is {r}, not 0 (the interface "
                        "says the producer zeroes them)")
    if array.device_id < 0:
        raise _fail(f"import_device_array: the array's device_id is {array.device_id}")
    want = device_id if device_id is not None else _stream_device(consumer)
    if array.device_type == DEVICE_CUDA and want is not None and array.device_id != want:
        raise _fail(f"import_device_array: the array is on device {array.device_id} and the "
                    f"consumer expects device {want}")
    if not schema.format:
        raise _fail("import_device_array: the schema has no format")
    fmt = schema.format.decode(errors="replace")
    name = schema.name.decode(errors="replace") if schema.name else ""
    _b.arrow_wait(array_p, consumer, PROVENANCES[provenance])
    # Ordered: move both out of their capsules (the interface's move: the
    # source's release set to NULL), the schema released now.
    moved = ArrowDeviceArray()
    ctypes.memmove(ctypes.addressof(moved), array_p, ctypes.sizeof(ArrowDeviceArray))
    array.array.release = None
    schema_moved = ArrowSchema()
    ctypes.memmove(ctypes.addressof(schema_moved), schema_p, ctypes.sizeof(ArrowSchema))
    schema.release = None
    _SchemaRelease(schema_moved.release)(ctypes.pointer(schema_moved))
    return DeviceArray(moved, fmt, name, consumer, PROVENANCES[provenance])


__all__: List[str] = [
    "DeviceArray",
    "DeviceArrayExport",
    "import_device_array",
    "export_device_array",
    "DEVICE_CUDA",
    "DEVICE_CUDA_HOST",
    "DEVICE_CUDA_MANAGED",
    "FORMATS",
    "PROVENANCES",
]
