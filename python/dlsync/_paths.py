# SPDX-License-Identifier: Apache-2.0
"""Where to build against dlsync: the headers, the CMake package and the
pkg-config file of an installed wheel, or those of the source tree the
package runs from.

An installed wheel holds ``dlsync/include/``, ``dlsync/lib/cmake/dlsync/`` and
``dlsync/lib/pkgconfig/dlsync.pc`` (any entry of the package's ``__path__``,
so an editable install too). Run from a source tree (python/dlsync of the
repository) the headers are the repository's ``include/``; its CMake package
and pkg-config file exist only once installed, so those two raise
FileNotFoundError saying what to do."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import _loader

_package = __name__.rpartition(".")[0]


def _package_dirs() -> List[str]:
    return [os.path.abspath(d) for d in sys.modules[_package].__path__]


def _find(holding: str, *parts: str) -> Optional[str]:
    """The first folder <package dir>/<parts> that holds the file ``holding``."""
    for d in _package_dirs():
        path = os.path.join(d, *parts)
        if os.path.isfile(os.path.join(path, holding)):
            return path
    return None


def _missing(what: str, parts: str) -> FileNotFoundError:
    where = ", ".join(os.path.join(d, parts) for d in _package_dirs())
    return FileNotFoundError(
        f"dlsync: no {what} in this package (looked for {where}); a wheel built from this "
        "source has it; from a source tree, install dlsync with `cmake --install` and use that "
        "prefix instead")


def get_include() -> str:
    """The folder to put on the include path: it holds ``dlsync/dlsync.h``
    (``#include <dlsync/dlsync.h>``)."""
    found = _find(os.path.join("dlsync", "dlsync.h"), "include")
    if found is not None:
        return found
    root = _loader.source_root(_package_dirs())
    if root is not None:
        return os.path.join(root, "include")
    raise _missing("headers", os.path.join("include", "dlsync", "dlsync.h"))


def get_cmake_dir() -> str:
    """The folder holding ``dlsyncConfig.cmake``: hand it to CMake as
    ``-Ddlsync_DIR=...`` (or its prefix, two levels up, in
    ``CMAKE_PREFIX_PATH``) for ``find_package(dlsync CONFIG)``."""
    found = _find("dlsyncConfig.cmake", "lib", "cmake", "dlsync")
    if found is not None:
        return found
    raise _missing("CMake package", os.path.join("lib", "cmake", "dlsync"))


def get_pkgconfig_dir() -> str:
    """The folder holding ``dlsync.pc``, for ``PKG_CONFIG_PATH``."""
    found = _find("dlsync.pc", "lib", "pkgconfig")
    if found is not None:
        return found
    raise _missing("pkg-config file", os.path.join("lib", "pkgconfig", "dlsync.pc"))
