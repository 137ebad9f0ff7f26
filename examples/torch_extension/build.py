"""Builds and loads the example torch extension (scale_ext.cu) against libdlsync.

    python3 examples/torch_extension/build.py BUILD_DIR   # prints the .so path
    # or, from Python:
    from build import load; load("/path/to/build")        # registers torch.ops.dlsync_example

BUILD_DIR holds libdlsync.so (the build folder, or an install's lib folder:
its include folder is found next to it, else the repository's include/).
Needs nvcc and PyTorch with CUDA; the build is cached in BUILD_DIR/torch_extension.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(build_dir: str, verbose: bool = False) -> str:
    import torch
    from torch.utils.cpp_extension import load as _load

    build_dir = os.path.abspath(build_dir)
    lib = os.path.join(build_dir, "libdlsync.so")
    if not os.path.exists(lib):
        raise FileNotFoundError(f"{lib} not found: build dlsync first")
    include = os.path.join(os.path.dirname(build_dir), "include")
    if not os.path.exists(os.path.join(include, "dlsync", "dlsync.hpp")):
        include = os.path.join(ROOT, "include")
    out = os.path.join(build_dir, "torch_extension")
    os.makedirs(out, exist_ok=True)
    major, minor = torch.cuda.get_device_capability()
    _load(
        name="dlsync_torch_example",
        sources=[os.path.join(HERE, "scale_ext.cu")],
        extra_include_paths=[include],
        extra_cuda_cflags=["-O2", "-std=c++17", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
        extra_ldflags=[f"-L{build_dir}", "-ldlsync", f"-Wl,-rpath,{build_dir}"],
        build_directory=out,
        is_python_module=False,
        verbose=verbose,
    )
    assert hasattr(torch.ops.dlsync_example, "scale")
    return os.path.join(out, "dlsync_torch_example.so")


if __name__ == "__main__":
    print(load(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "release"),
               verbose=True))
