# SPDX-License-Identifier: Apache-2.0
"""Calls the example kernel library (scale.cu, dlsync inside) from PyTorch,
on a plain stream and under torch.cuda.graph, and checks the results.

    bash examples/kernel_lib/build.sh build/release       # libkernel_lib.so
    python3 examples/kernel_lib/caller.py build/release/libkernel_lib.so

The library launches on a side stream of its own; one dlsync exchange orders
it after the caller's stream (and, under capture, joins its side stream into
the caller's capture and back), so the caller writes nothing about ordering.
Exit 0 when every result is right, 77 without torch or a GPU, 1 otherwise.
"""
import ctypes
import sys


def load(path):
    lib = ctypes.CDLL(path)
    lib.kl_init.restype = ctypes.c_int
    lib.kl_scale.restype = ctypes.c_int
    lib.kl_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_float,
                             ctypes.c_void_p, ctypes.c_int]
    lib.kl_last_error.restype = ctypes.c_char_p
    if lib.kl_init() != 0:
        raise RuntimeError(lib.kl_last_error().decode())
    return lib


def scale(lib, out, x, a):
    """out = a * x on the library's stream, ordered after the current stream."""
    stream = torch.cuda.current_stream().cuda_stream
    if lib.kl_scale(out.data_ptr(), x.data_ptr(), x.numel(), a, stream, 1) != 0:
        raise RuntimeError(lib.kl_last_error().decode())


def main(argv):
    global torch
    if len(argv) != 2:
        print(__doc__)
        return 2
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no GPU")
        return 77
    lib = load(argv[1])
    n = 1 << 26
    x = torch.zeros(n, device="cuda")
    out = torch.zeros(n, device="cuda")
    wrong = 0

    # Plain streams: the producer (x * 2 + 1) still runs when the library launches.
    for i in range(5):
        x.fill_(float(i))
        scale(lib, out, x * 2 + 1, 3.0)
        wrong += out[-1].item() != (2.0 * i + 1) * 3
    print(f"eager: {5 - wrong}/5 right")

    # Under torch.cuda.graph: the library's launch is captured with the rest.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        scale(lib, out, x * 2 + 1, 3.0)
    bad = 0
    for i in range(10):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        bad += out[-1].item() != (2.0 * (i + 1) + 1) * 3
    print(f"torch.cuda.graph: {10 - bad}/10 replays right")
    return 0 if wrong + bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
