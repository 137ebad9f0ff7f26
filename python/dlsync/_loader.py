# SPDX-License-Identifier: Apache-2.0
"""Finding and loading libdlsync (one per process, with ctypes).

The order: ``DLSYNC_LIBRARY`` (a path) when set, and then only it, so that an
override never silently falls back; otherwise a ``libdlsync.so`` in any entry
of the package's ``__path__`` (an installed wheel has it beside
``__init__.py``; an editable install puts the built files in another entry);
otherwise, run from a source tree, the repository's build folders; last, the
loader's path (``ctypes.util.find_library``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Iterable, List, Optional

_NAME = "libdlsync.so"


def source_root(package_dirs: Iterable[str]) -> Optional[str]:
    """The repository around python/dlsync when the package runs from a
    source tree (include/dlsync/version.h two levels up), else None."""
    for d in package_dirs:
        root = os.path.dirname(os.path.dirname(os.path.abspath(d)))
        if os.path.isfile(os.path.join(root, "include", "dlsync", "version.h")):
            return root
    return None


def candidates(package_dirs: Iterable[str]) -> List[str]:
    """Where libdlsync is looked for, in order (see the module docstring)."""
    env = os.environ.get("DLSYNC_LIBRARY")
    if env:
        return [env]
    dirs = [os.path.abspath(d) for d in package_dirs]
    names = [os.path.join(d, _NAME) for d in dirs]
    root = source_root(dirs)
    if root is not None:
        for build in ("build/release", "build", "build/asan"):
            names.append(os.path.join(root, build, _NAME))
    found = ctypes.util.find_library("dlsync")
    if found:
        names.append(found)
    return names


def load(package_dirs: Iterable[str]) -> ctypes.CDLL:
    """The first candidate that loads; ImportError naming each one tried."""
    tried = []
    for name in candidates(package_dirs):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    hint = (
        "DLSYNC_LIBRARY is set and could not be loaded"
        if os.environ.get("DLSYNC_LIBRARY")
        else f"{_NAME} not found; reinstall the package or set DLSYNC_LIBRARY to its path"
    )
    raise ImportError(hint + ". Tried:\n  " + "\n  ".join(tried))
