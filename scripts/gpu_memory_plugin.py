# SPDX-License-Identifier: Apache-2.0
"""A pytest plugin for the GPU suites: after each test, the GPU memory this
process and the whole device hold (NVML), the PyTorch and CuPy pools, and
whether JAX is loaded, one line each to $MEMDIAG_OUT (default
/tmp/memdiag.txt). Used as

    PYTHONPATH=scripts PYTEST_ADDOPTS="-p gpu_memory_plugin" MEMDIAG_OUT=$OUT/memdiag.txt \
      bash python/run_gpu_suite.sh BUILD_DIR
"""
import os
import sys
import time

import pytest

_t0 = time.time()
try:
    import pynvml
    pynvml.nvmlInit()
    _h = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception as e:  # noqa
    pynvml = None
    print("memdiag: no nvml", e)

def _mine():
    if pynvml is None:
        return -1
    used = 0
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(_h):
        if p.pid == os.getpid():
            used += (p.usedGpuMemory or 0)
    info = pynvml.nvmlDeviceGetMemoryInfo(_h)
    return used / 2**30, info.used / 2**30

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    m = _mine()
    extra = []
    if "torch" in sys.modules:
        import torch
        if torch.cuda.is_initialized():
            extra.append(f"torch_reserved={torch.cuda.memory_reserved()/2**30:.2f}")
            extra.append(f"torch_alloc={torch.cuda.memory_allocated()/2**30:.2f}")
    if "cupy" in sys.modules:
        import cupy
        try:
            extra.append(f"cupy_pool={cupy.get_default_memory_pool().total_bytes()/2**30:.2f}")
        except Exception:
            pass
    extra.append("jax" if "jax" in sys.modules else "")
    line = f"MEM {time.time()-_t0:7.1f}s {m} {item.nodeid} {' '.join(extra)}"
    print(line, file=sys.stderr)
    with open(os.environ.get("MEMDIAG_OUT", "/tmp/memdiag.txt"), "a") as f:
        f.write(line + "\n")
