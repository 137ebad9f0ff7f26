# SPDX-License-Identifier: Apache-2.0
"""Finding and loading libdlsync (one per process, with ctypes).

The order: ``DLSYNC_LIBRARY`` (a path) when set, and then only it, so that an
override never silently falls back; otherwise a ``libdlsync.so`` in any entry
of the package's ``__path__`` (an installed wheel has it beside
``__init__.py``; an editable install puts the built files in another entry);
otherwise, run from a source tree, the repository's build folders
(``build/release``, ``build``, ``build/asan``), passing over sanitizer builds,
which an uninstrumented interpreter cannot load; last, the loader's path
(``ctypes.util.find_library``). ``dlsync.library_path()`` says which was
loaded; ``skipped`` lists the sanitizer builds passed over."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Iterable, List, Optional, Tuple

_NAME = "libdlsync.so"


def source_root(package_dirs: Iterable[str]) -> Optional[str]:
    """The repository around python/dlsync when the package runs from a
    source tree (include/dlsync/version.h two levels up), else None."""
    for d in package_dirs:
        root = os.path.dirname(os.path.dirname(os.path.abspath(d)))
        if os.path.isfile(os.path.join(root, "include", "dlsync", "version.h")):
            return root
    return None


_SANITIZER_OPTIONS = ("DLSYNC_SANITIZE:BOOL=ON", "DLSYNC_TSAN:BOOL=ON")
_SANITIZER_RUNTIMES = (b"libasan.so", b"libtsan.so", b"libubsan.so", b"libhwasan.so")

# The build folders of a source tree that were passed over: (path, why).
skipped: List[Tuple[str, str]] = []


def sanitizer_build(path: str) -> Optional[str]:
    """Why the library at ``path`` is a sanitizer build, which an
    uninstrumented interpreter cannot load (the sanitizer's runtime kills
    the process), or None: its build folder's CMakeCache.txt turned a
    sanitizer on, or the file names a sanitizer runtime it needs."""
    try:
        with open(os.path.join(os.path.dirname(path), "CMakeCache.txt")) as f:
            for line in f:
                if line.strip() in _SANITIZER_OPTIONS:
                    return f"a sanitizer build ({line.strip()} in its CMakeCache.txt)"
    except OSError:
        pass
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    for runtime in _SANITIZER_RUNTIMES:
        if runtime in data:
            return f"a sanitizer build (it needs {runtime.decode()})"
    return None


def candidates(package_dirs: Iterable[str]) -> List[str]:
    """Where libdlsync is looked for, in order (see the module docstring).
    A source tree's build folders holding a sanitizer build are passed over
    (listed in ``skipped``)."""
    env = os.environ.get("DLSYNC_LIBRARY")
    if env:
        return [env]
    dirs = [os.path.abspath(d) for d in package_dirs]
    names = [os.path.join(d, _NAME) for d in dirs]
    root = source_root(dirs)
    if root is not None:
        for build in ("build/release", "build", "build/asan"):
            path = os.path.join(root, build, _NAME)
            if not os.path.isfile(path):
                continue
            why = sanitizer_build(path)
            if why is None:
                names.append(path)
            elif (path, why) not in skipped:
                skipped.append((path, why))
    found = ctypes.util.find_library("dlsync")
    if found:
        names.append(found)
    return names


def load(package_dirs: Iterable[str]) -> ctypes.CDLL:
    """The first candidate that loads and is libdlsync; ImportError naming
    each one tried (and each sanitizer build passed over) otherwise."""
    tried = []
    for name in candidates(package_dirs):
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
            continue
        if not hasattr(lib, "dlsync_version_string"):
            tried.append(f"{name}: loaded, but it is not libdlsync (no dlsync_version_string)")
            continue
        return lib
    tried += [f"{path}: skipped, {why}" for path, why in skipped]
    hint = (
        "DLSYNC_LIBRARY is set and could not be loaded as libdlsync"
        if os.environ.get("DLSYNC_LIBRARY")
        else f"{_NAME} not found; reinstall the package, build a release build "
             "(cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release) in a source tree, or set "
             "DLSYNC_LIBRARY to its path"
    )
    raise ImportError(hint + ". Tried:\n  " + "\n  ".join(tried))
