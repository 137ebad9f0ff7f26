# SPDX-License-Identifier: Apache-2.0
"""Calls the Numba kernel library (numba_kernels.py) from PyTorch, eagerly and
inside torch.cuda.graph in its three capture modes, and from CuPy, on the
caller's stream and on the library's own stream, and checks every result.

    PYTHONPATH=python python3 examples/numba_kernels/demo.py

The inputs are produced on a side stream behind a slow kernel
(torch.cuda._sleep), so a read that is not ordered after it sees stale data.
Exit 0 when every result is right, 77 without torch, numba-cuda or a GPU,
1 otherwise.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

N = 1 << 22
SLEEP = 50_000_000  # GPU cycles of the slow producer
REPLAYS = 10


def _torch(kernels, capture_mode):
    """x on a side stream behind a slow kernel, then out = 2 x + 1 by the library
    on the current stream; eager (capture_mode None) or captured and replayed."""
    x = torch.zeros(N, device="cuda")
    src = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()

    def step():
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP)
            x.copy_(src)
        cur.wait_stream(side)  # the library reads x after this point of cur
        kernels.affine(x, out, 2.0, 1.0, stream=cur)

    kernels.affine(x, out, 2.0, 1.0, stream=torch.cuda.current_stream())  # compile first
    torch.cuda.synchronize()
    if capture_mode is None:
        run = step
    else:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode=capture_mode):
            step()
        run = g.replay
    for i in range(REPLAYS):
        src.fill_(float(i + 1))
        run()
        torch.cuda.synchronize()
        if float(out[-1]) != 2.0 * (i + 1) + 1:
            return f"run {i}: {float(out[-1])}, expected {2.0 * (i + 1) + 1}"
    return ""


def _cupy(kernels):
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.arange(N, dtype=cupy.float32)
        y = cupy.ones(N, dtype=cupy.float32)
        out = cupy.empty(N, dtype=cupy.float32)
        kernels.add(x, y, out, stream=s)
        s.synchronize()
    return "" if float(out[-1].get()) == N else f"{float(out[-1].get())}, expected {N}"


def main():
    global torch
    try:
        import torch
        import numba_kernels
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 77
    failed = 0
    for own in (False, True):
        kernels = numba_kernels.Kernels(own_stream=own)
        where = "own stream" if own else "caller's stream"
        for mode in (None, "global", "thread_local", "relaxed"):
            why = _torch(kernels, mode)
            print(f"torch {mode or 'eager':12} {where:15} {'ok' if not why else 'WRONG ' + why}")
            failed += bool(why)
        try:
            why = _cupy(kernels)
        except ImportError:
            continue
        print(f"cupy  {'eager':12} {where:15} {'ok' if not why else 'WRONG ' + why}")
        failed += bool(why)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
