# SPDX-License-Identifier: Apache-2.0
"""Prints, one a line, NAME=DIR for the Python packages that may ship
dlpack.h (PyTorch, CuPy, TVM FFI), without importing them (no CUDA
initialisation). tests/gpu/CMakeLists.txt looks for dlpack.h under each DIR."""
import importlib.util
import os

CANDIDATES = (
    ("torch", ("include",)),
    ("cupy", (os.path.join("_core", "include"),)),
    ("tvm_ffi", ("include",)),
)

for name, subdirs in CANDIDATES:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        continue
    if spec is None or not spec.submodule_search_locations:
        continue
    root = list(spec.submodule_search_locations)[0]
    for sub in subdirs:
        path = os.path.join(root, sub)
        if os.path.isdir(path):
            print(f"{name}={path}")
