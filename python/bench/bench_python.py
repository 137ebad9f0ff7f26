#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python rows of the bench, against PyTorch's own calls in the same run.

    cd python && DLSYNC_LIBRARY=<build>/libdlsync.so python3 bench/bench_python.py

(scripts/gpu-check.sh runs it so). Rows, each as interleaved paired rounds
(median of the per-round ratios, with their range, as bench/bench_exchange.c):

  with dlsync.exchange(p, c): pass  (dlsync._native)  vs  c.wait_stream(p); p.wait_stream(c)
  the same through the ctypes fallback (a child process, DLSYNC_NO_NATIVE=1)
  torch.from_dlpack(dlsync.wrap(x))  vs  torch.from_dlpack(x)
  cupy.from_dlpack(dlsync.wrap(x))   vs  cupy.from_dlpack(x)        (x a torch tensor)

Targets: <= 0.50 for the exchange, <= 1.20 for the wraps; each line says ok or
MISSED. A miss is a result, not a failure: the exit status is 0 unless a row
could not be measured. Without torch or a CUDA GPU it prints one skip line and
exits 0.

The compiled binding is imported from this source tree (python/dlsync), where
`cmake -S python` builds it in place (python/CMakeLists.txt); the bench does
that first when dlsync/_native*.so is missing or older than its sources, with
CMake, or the C compiler alone where CMake is missing or fails (--no-build:
never; --build-native: only that, for other scripts, no torch needed). The
header line says which binding each row measured.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import timeit
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)  # python/
PKG = os.path.join(PYDIR, "dlsync")
ROOT = os.path.dirname(PYDIR)

TARGET_EXCHANGE = 0.50
TARGET_WRAP = 1.20

# ---- results ----


def summary(ratios: Sequence[float]) -> Tuple[float, float, float]:
    """(median, min, max) of the per-round ratios."""
    return statistics.median(ratios), min(ratios), max(ratios)


def verdict(ratio: float, target: float) -> str:
    return "ok" if ratio <= target else "MISSED"


HEADER = f"{'measure':<52} {'dlsync':>10} {'baseline':>10} {'ratio':>6}  {'[range]':<13} target"


def row_line(label: str, dlsync_us: float, baseline_us: float, ratios: Sequence[float],
             target: Optional[float], note: str = "") -> str:
    """One result line: host microseconds per call (medians of the rounds),
    the median ratio and its range, and the target with ok / MISSED."""
    m, lo, hi = summary(ratios)
    tgt = f"<= {target:.2f} {verdict(m, target)}" if target is not None else "(no target)"
    rng = f"[{lo:.2f}-{hi:.2f}]"
    line = f"{label:<52} {dlsync_us:>8.2f}us {baseline_us:>8.2f}us {m:>6.2f}  {rng:<13} {tgt}"
    return line + (f"  {note}" if note else "")


def skip_line(label: str, why: str) -> str:
    return f"{label:<52} skipped: {why}"


# ---- the compiled binding, built in place ----


def native_files(pkg: str = PKG) -> List[str]:
    return sorted(glob.glob(os.path.join(pkg, "_native*.so")))


def native_inputs(pydir: str = PYDIR, root: str = ROOT) -> List[str]:
    """The files a built _native depends on."""
    files = [os.path.join(pydir, "dlsync", "_native.c"), os.path.join(pydir, "CMakeLists.txt")]
    files += glob.glob(os.path.join(root, "include", "dlsync", "*.h"))
    return [f for f in files if os.path.isfile(f)]


def native_is_current(built: Sequence[str], inputs: Sequence[str]) -> bool:
    """Whether every built module is at least as new as every input."""
    if not built:
        return False
    newest = max((os.path.getmtime(f) for f in inputs), default=0.0)
    return all(os.path.getmtime(f) >= newest for f in built)


def _run(cmd: Sequence[str], log: List[str]) -> bool:
    log.append("$ " + " ".join(cmd))
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.append(str(e))
        return False
    log.append(done.stdout[-3000:])
    return done.returncode == 0


def build_with_cmake(out_dir: str, build_dir: str, log: List[str], pydir: str = PYDIR) -> bool:
    cmake = shutil.which("cmake")
    if cmake is None:
        log.append("cmake: not found")
        return False
    return (_run([cmake, "-S", pydir, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                  f"-DPython_EXECUTABLE={sys.executable}",
                  f"-DDLSYNC_PYTHON_OUTPUT_DIR={out_dir}"], log) and
            _run([cmake, "--build", build_dir], log))


def build_with_cc(out_dir: str, log: List[str], pydir: str = PYDIR, root: str = ROOT) -> bool:
    """The same module with the C compiler alone (no CMake)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths().get("include")
    if cc is None or not include:
        log.append(f"cc: {cc}, Python headers: {include}")
        return False
    target = os.path.join(out_dir, "_native.abi3.so")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    ok = _run([cc, "-O2", "-std=c11", "-shared", "-fPIC", "-fvisibility=hidden",
               "-DPy_LIMITED_API=0x03090000", "-I", os.path.join(root, "include"), "-I", include,
               os.path.join(pydir, "dlsync", "_native.c"), "-o", tmp], log)
    if ok:
        os.replace(tmp, target)
    else:
        os.unlink(tmp)
    return ok


def ensure_native(no_build: bool = False) -> str:
    """Makes python/dlsync/_native*.so current (see the module docstring);
    returns what was done, for the header."""
    if os.environ.get("DLSYNC_NO_NATIVE", "") not in ("", "0"):
        return "DLSYNC_NO_NATIVE is set: not built"
    inputs = native_inputs()
    if not os.path.isfile(os.path.join(PKG, "_native.c")):
        return "no python/dlsync/_native.c next to this bench: not built"
    built = native_files()
    if native_is_current(built, inputs):
        return "in place, up to date"
    if no_build:
        return "not built (--no-build)" + (" and out of date" if built else "")
    log: List[str] = []
    build_dir = os.environ.get("DLSYNC_NATIVE_BUILD_DIR") or os.path.join(PYDIR, "build", "native")
    if build_with_cmake(PKG, build_dir, log) or build_with_cc(PKG, log):
        return "built in place now"
    sys.stderr.write("bench_python: building dlsync._native failed:\n" + "\n".join(log) + "\n")
    return "build failed (log on stderr)"


# ---- timing ----


def time_call(stmt: str, ns: Dict, ops: int) -> float:
    """Host microseconds per run of stmt (a timeit loop; gc off)."""
    return timeit.Timer(stmt, globals=ns).timeit(ops) / ops * 1e6


def paired(baseline: str, candidate: str, ns: Dict, rounds: int, batches: int, ops: int,
           between: Callable[[], None] = lambda: None):
    """Interleaved paired rounds: each round times `batches` batches of each
    statement, alternating which goes first, and keeps each one's median; the
    ratio is candidate / baseline within the round. Returns (candidate us,
    baseline us, ratios), one entry per round."""
    for stmt in (baseline, candidate):  # warm-up: first calls, caches, pools
        time_call(stmt, ns, ops)
    cand, base, ratios = [], [], []
    for _ in range(rounds):
        tb, tc = [], []
        for b in range(batches):
            order = ((tb, baseline), (tc, candidate)) if b % 2 == 0 else \
                ((tc, candidate), (tb, baseline))
            for out, stmt in order:
                between()
                out.append(time_call(stmt, ns, ops))
        mb, mc = statistics.median(tb), statistics.median(tc)
        base.append(mb)
        cand.append(mc)
        ratios.append(mc / mb)
    return cand, base, ratios


def _pin_to_current_cpu() -> Optional[int]:
    """This thread on the CPU it runs on now (as bench_exchange pins one
    core): no migrations inside a batch. None where it cannot."""
    try:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# ---- rows ----


def _exchange_row(torch, dlsync, args) -> Dict:
    p, c = torch.cuda.Stream(), torch.cuda.Stream()
    ns = {"dlsync": dlsync, "p": p, "c": c}
    cand, base, ratios = paired("c.wait_stream(p); p.wait_stream(c)",
                                "with dlsync.exchange(p, c): pass", ns, args.rounds, args.batches,
                                args.ops, torch.cuda.synchronize)
    torch.cuda.synchronize()
    return {"native": dlsync._native_active(), "why": dlsync._native_error, "cand": cand,
            "base": base, "ratios": ratios}


def _floor_row(torch, dlsync, args) -> Optional[Dict]:
    """The C exchange through the binding with no `with` and int handles:
    what the exchange row cannot go below."""
    if not dlsync._native_active():
        return None
    p, c = torch.cuda.Stream(), torch.cuda.Stream()
    ns = {"n": dlsync._native, "p": p, "c": c, "ph": p.cuda_stream, "ch": c.cuda_stream}
    cand, base, ratios = paired("c.wait_stream(p); p.wait_stream(c)", "n.end(n.begin(ph, ch, 0))",
                                ns, args.rounds, args.batches, args.ops, torch.cuda.synchronize)
    torch.cuda.synchronize()
    return {"cand": cand, "base": base, "ratios": ratios}


def _wrap_row(framework, torch, dlsync, args) -> Dict:
    x = torch.empty(1024, device="cuda")
    ns = {"dlsync": dlsync, "x": x, "fw": framework}
    cand, base, ratios = paired("fw.from_dlpack(x)", "fw.from_dlpack(dlsync.wrap(x))", ns,
                                args.rounds, args.batches, args.ops, torch.cuda.synchronize)
    torch.cuda.synchronize()
    return {"cand": cand, "base": base, "ratios": ratios}


def _ctypes_row(args) -> Dict:
    """The exchange row in a child process on the ctypes path."""
    env = dict(os.environ, DLSYNC_NO_NATIVE="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "exchange", "--rounds",
           str(args.rounds), "--batches", str(args.batches), "--ops", str(args.ops), "--no-pin"]
    if args.pin_cpu is not None:
        cmd += ["--cpu", str(args.pin_cpu)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=1200)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the ctypes worker failed (rc {done.returncode}): "
                           f"{(done.stderr or done.stdout)[-2000:]}")
    return json.loads(lines[-1])


def _import_dlsync():
    sys.path.insert(0, PYDIR)
    import dlsync

    return dlsync


def worker(args) -> int:
    """--worker exchange: one row, printed as a JSON line."""
    import torch

    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, AttributeError):
            pass
    dlsync = _import_dlsync()
    torch.cuda.init()
    print(json.dumps(_exchange_row(torch, dlsync, args)))
    return 0


def _describe(dlsync) -> str:
    if dlsync._native_active():
        return f"native ({dlsync._native.__file__})"
    return f"ctypes ({dlsync._native_error})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000, help="calls per timed batch")
    ap.add_argument("--no-build", action="store_true", help="never build dlsync._native")
    ap.add_argument("--build-native", action="store_true",
                    help="only make python/dlsync/_native*.so current (no torch, no GPU needed)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the thread to one CPU")
    ap.add_argument("--worker", choices=["exchange"], help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.pin_cpu = None

    label = "bench_python"
    if args.build_native:
        done = ensure_native(args.no_build)
        print(f"{label}: dlsync._native {done}: {', '.join(native_files()) or 'none'}")
        return 1 if done.startswith("build failed") else 0
    try:
        import torch
    except ImportError as e:
        print(f"{label}: skipped (no torch: {e})")
        return 0
    if torch is None or not getattr(torch, "cuda", None) or not torch.cuda.is_available():
        print(f"{label}: skipped (no CUDA GPU: torch.cuda.is_available() is False)")
        return 0
    if args.worker:
        return worker(args)

    built = ensure_native(args.no_build)
    dlsync = _import_dlsync()
    torch.cuda.init()
    if not args.no_pin:
        args.pin_cpu = _pin_to_current_cpu()
    try:
        import cupy
    except ImportError as e:
        cupy, cupy_why = None, str(e)

    gpu = torch.cuda.get_device_name()
    print(f"dlsync Python bench on {gpu}: Python {sys.version.split()[0]}, torch "
          f"{torch.__version__}" + (f", cupy {cupy.__version__}" if cupy is not None else "") +
          f", dlsync {dlsync.__version__} ({dlsync.__file__}; {dlsync.library_path()})")
    print(f"binding: {_describe(dlsync)}; dlsync._native {built}; "
          f"CPU {'pinned to ' + str(args.pin_cpu) if args.pin_cpu is not None else 'not pinned'}")
    print(f"host us per call: medians over {args.rounds} rounds of {args.batches} batches of "
          f"{args.ops} calls, interleaved; ratio: median of the per-round ratios [min-max]")
    print(HEADER)
    rc = 0

    def row(name: str, fn: Callable[[], Optional[Dict]], target: Optional[float],
            note: Callable[[Dict], str] = lambda r: "") -> None:
        nonlocal rc
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 - one row's failure is reported, the rest run
            print(f"{name:<52} ERROR: {type(e).__name__}: {e}")
            rc = 1
            return
        if r is None:
            return
        print(row_line(name, statistics.median(r["cand"]), statistics.median(r["base"]),
                       r["ratios"], target, note(r)), flush=True)

    def exchange_note(r: Dict) -> str:
        return "" if r["native"] else f"(measured on ctypes: {r['why']})"

    print("vs torch c.wait_stream(p); p.wait_stream(c), two torch streams:")
    row("  with dlsync.exchange(p, c): pass  [native]",
        lambda: _exchange_row(torch, dlsync, args), TARGET_EXCHANGE, exchange_note)
    row("  with dlsync.exchange(p, c): pass  [ctypes fallback]", lambda: _ctypes_row(args),
        TARGET_EXCHANGE, lambda r: "(the fallback; the target is the native row's)"
        if not r["native"] else "(NOT the ctypes path)")
    row("  native begin+end on ints, no `with` (the floor)",
        lambda: _floor_row(torch, dlsync, args), None)
    print("vs plain from_dlpack(x) of the same framework, x a torch tensor (current stream):")
    row("  torch.from_dlpack(dlsync.wrap(x))", lambda: _wrap_row(torch, torch, dlsync, args),
        TARGET_WRAP)
    if cupy is None:
        print(skip_line("  cupy.from_dlpack(dlsync.wrap(x))", f"no cupy ({cupy_why})"))
    else:
        row("  cupy.from_dlpack(dlsync.wrap(x))", lambda: _wrap_row(cupy, torch, dlsync, args),
            TARGET_WRAP)
    return rc


if __name__ == "__main__":
    sys.exit(main())
