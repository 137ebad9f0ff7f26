# SPDX-License-Identifier: Apache-2.0
"""python -m dlsync [dlsync-info's options]: what dlsync-info prints.

``python -m dlsync --include-dir``, ``--cmake-dir``, ``--pkgconfig-dir``
print where to build against this package (dlsync.get_include(),
get_cmake_dir(), get_pkgconfig_dir()), one line each, in the order given;
exit status 1 where the package has none (a source tree has no CMake
package nor pkg-config file until installed).

Runs the dlsync-info program that came with this library (the wheel's
``dlsync/bin/dlsync-info``, or ``tools/dlsync-info`` beside the libdlsync a
build folder holds) with the same arguments, ``--selftest`` included. Where
there is none, prints a summary read through the library (its version and
path, the driver, the GPUs) and refuses ``--selftest``, which needs the
program (exit status 2)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import List, Optional, Sequence

from . import _backend, _paths


def info_program() -> Optional[str]:
    """The dlsync-info that belongs to the loaded library, or None."""
    lib_dir = os.path.dirname(os.path.abspath(_backend.active.library_path()))
    package_dirs = [os.path.abspath(d) for d in sys.modules[__package__].__path__]
    for d in [lib_dir] + package_dirs:
        for rel in (("bin", "dlsync-info"), ("tools", "dlsync-info")):
            path = os.path.join(d, *rel)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


class _DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("ordinal", ctypes.c_int),
        ("name", ctypes.c_char * 256),
        ("pci_bus_id", ctypes.c_char * 32),
        ("cc_major", ctypes.c_int),
        ("cc_minor", ctypes.c_int),
        ("total_memory", ctypes.c_size_t),
        ("multiprocessors", ctypes.c_int),
    ]


def summary() -> List[str]:
    """dlsync-info's first lines, read through the library."""
    b = _backend.active
    lib = b.lib
    vp, P = ctypes.c_void_p, ctypes.POINTER
    lines = [f"dlsync {b.version()}", f"library: {b.library_path()} ({b.name} binding)"]
    ctx = vp()
    lib.dlsync_context_default.argtypes = [P(vp)]
    status = lib.dlsync_context_default(ctypes.byref(ctx))
    if status != 0:
        err = b.error(status)
        if err.status == "DLSYNC_ERROR_NO_DRIVER":
            return lines + [f"driver: none found ({err.message})", "GPUs: none"]
        return lines + [f"driver: error {err.status} ({err.message})"]
    version = ctypes.c_int()
    lib.dlsync_context_driver_version.argtypes = [P(ctypes.c_int), vp]
    if lib.dlsync_context_driver_version(ctypes.byref(version), ctx) == 0:
        v = version.value
        lines.append(f"driver: CUDA {v // 1000}.{v % 1000 // 10}")
    count = ctypes.c_int()
    lib.dlsync_device_count.argtypes = [P(ctypes.c_int), vp]
    status = lib.dlsync_device_count(ctypes.byref(count), ctx)
    if status != 0:
        err = b.error(status)
        return lines + [f"GPUs: error {err.status} ({err.message})"]
    if count.value == 0:
        return lines + ["GPUs: none"]
    lib.dlsync_device_get_info.argtypes = [P(_DeviceInfo), vp, ctypes.c_int]
    for i in range(count.value):
        info = _DeviceInfo(ctypes.sizeof(_DeviceInfo), 1)
        status = lib.dlsync_device_get_info(ctypes.byref(info), ctx, i)
        if status != 0:
            err = b.error(status)
            lines.append(f"GPU {i}: error {err.status} ({err.message})")
            continue
        lines.append(f"GPU {i}: {info.name.decode(errors='replace')}, "
                     f"sm_{info.cc_major}{info.cc_minor}, "
                     f"{info.total_memory / 2**30:.1f} GiB, {info.pci_bus_id.decode()}")
    return lines


_PATH_FLAGS = {
    "--include-dir": _paths.get_include,
    "--cmake-dir": _paths.get_cmake_dir,
    "--pkgconfig-dir": _paths.get_pkgconfig_dir,
}


def print_paths(flags: Sequence[str]) -> int:
    """The folders ``flags`` (keys of _PATH_FLAGS) name, one a line."""
    lines = []
    for flag in flags:
        try:
            lines.append(_PATH_FLAGS[flag]())
        except FileNotFoundError as e:
            sys.stderr.write(f"python -m dlsync {flag}: {e}\n")
            return 1
    print("\n".join(lines))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in _PATH_FLAGS for a in args):
        others = [a for a in args if a not in _PATH_FLAGS]
        if others:
            sys.stderr.write(f"python -m dlsync: {', '.join(_PATH_FLAGS)} go alone, not with "
                             f"{' '.join(others)}\n")
            return 2
        return print_paths(args)
    program = info_program()
    if program is not None:
        sys.stdout.flush()
        return subprocess.call([program] + args)
    if args and args != ["--help"]:
        what = "--selftest needs" if "--selftest" in args else "these options need"
        sys.stderr.write(f"python -m dlsync: {what} the dlsync-info program, which this "
                         "install lacks (a wheel has it in dlsync/bin/); without it only the "
                         "summary is printed (no options)\n")
        return 2
    if args == ["--help"]:
        print(__doc__.strip())
        return 0
    print("\n".join(summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
