# SPDX-License-Identifier: Apache-2.0
"""Builds and loads the example torch extension (scale_ext.cu) against libdlsync.

    python3 examples/torch_extension/build.py BUILD_DIR   # prints the .so path
    # or, from Python:
    from build import load; load("/path/to/build")        # registers torch.ops.dlsync_example

BUILD_DIR holds libdlsync.so (the build folder, an install's lib folder, or
an installed wheel's dlsync/ folder); the headers are the wheel's
(BUILD_DIR/include), else the install's (BUILD_DIR/../include), else the
repository's include/. header_dir(BUILD_DIR) says which.
Needs nvcc and PyTorch with CUDA; the build is cached in BUILD_DIR/torch_extension.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def header_dir(build_dir: str) -> str:
    """The include folder used with the libdlsync in build_dir."""
    build_dir = os.path.abspath(build_dir)
    for include in (os.path.join(build_dir, "include"),  # the wheel: dlsync/include
                    os.path.join(os.path.dirname(build_dir), "include")):  # an install
        if os.path.exists(os.path.join(include, "dlsync", "dlsync.hpp")):
            return include
    return os.path.join(ROOT, "include")


def load(build_dir: str, verbose: bool = False) -> str:
    import torch
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import load as _load

    build_dir = os.path.abspath(build_dir)
    lib = os.path.join(build_dir, "libdlsync.so")
    if not os.path.exists(lib):
        raise FileNotFoundError(f"{lib} not found: build dlsync first")
    include = header_dir(build_dir)
    out = os.path.join(build_dir, "torch_extension")
    os.makedirs(out, exist_ok=True)
    major, minor = torch.cuda.get_device_capability()
    if not cpp_extension.is_ninja_available():  # load() needs ninja: nvcc by hand
        so = _build_with_nvcc(build_dir, include, out, f"{major}{minor}", verbose)
        torch.ops.load_library(so)
        assert hasattr(torch.ops.dlsync_example, "scale")
        return so
    _load(
        name="dlsync_torch_example",
        sources=[os.path.join(HERE, "scale_ext.cu")],
        extra_include_paths=[include],
        extra_cuda_cflags=["-O2", "-std=c++17",
                           f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
        extra_ldflags=[f"-L{build_dir}", "-ldlsync", f"-Wl,-rpath,{build_dir}"],
        build_directory=out,
        is_python_module=False,
        verbose=verbose,
    )
    assert hasattr(torch.ops.dlsync_example, "scale")
    return os.path.join(out, "dlsync_torch_example.so")


def _build_with_nvcc(build_dir: str, include: str, out: str, arch: str, verbose: bool) -> str:
    """The same build without ninja: one nvcc command, with torch's headers,
    libraries and ABI flag."""
    import shutil
    import subprocess

    import torch
    from torch.utils import cpp_extension

    try:
        incs = cpp_extension.include_paths(device_type="cuda")
    except TypeError:  # older torch: include_paths(cuda=True)
        incs = cpp_extension.include_paths(cuda=True)
    libs = cpp_extension.library_paths()
    try:
        libs = cpp_extension.library_paths(device_type="cuda")
    except TypeError:
        pass
    nvcc = os.path.join(cpp_extension.CUDA_HOME or "/usr/local/cuda", "bin", "nvcc")
    if not os.path.exists(nvcc):
        nvcc = shutil.which("nvcc") or nvcc
    so = os.path.join(out, "dlsync_torch_example.so")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [nvcc, "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", "--expt-relaxed-constexpr",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=dlsync_torch_example",
           f"-I{include}", *[f"-I{i}" for i in incs], os.path.join(HERE, "scale_ext.cu"),
           f"-L{build_dir}", "-ldlsync", "-Xlinker", f"-rpath={build_dir}"]
    for d in libs:
        cmd += [f"-L{d}", "-Xlinker", f"-rpath={d}"]
    cmd += ["-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-o", so]
    if verbose:
        print(" ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return so


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "release")
    print("headers:", header_dir(where))
    print(load(where, verbose=True))
