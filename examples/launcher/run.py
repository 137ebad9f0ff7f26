# SPDX-License-Identifier: Apache-2.0
"""The launcher (launcher.py) on a GPU with PyTorch tensors: each tensor held
only for the launch and released after it (dlsync_dlpack_release), against the
control that runs the deleters before the launch. One process per case.

    DLSYNC_LIBRARY=... PYTHONPATH=python python3 examples/launcher/run.py BUILD_DIR/libdlsync_launcher_kernel.so
    ... run.py --memcheck LIB   # the release-after cases under compute-sanitizer memcheck

eager: x is a temporary on stream P, launched on the launcher's stream L (the
kernel spins about 10 ms, then reads x); the caller drops x and allocates a
tensor of the same size on P, filled with -1. Released too early, x's memory
is that new tensor's and the kernel reads -1s.

graph:MODE: x (allocated before the capture) is copied from src and launched
inside torch.cuda.graph on the capturing stream; after the capture the caller
drops x and allocates a -1 tensor of its size. Released too early (before the
launch), that tensor gets x's memory and each replay's copy overwrites it;
released after the launch, the graph owns x until it is destroyed.

A run is wrong unless out == 2 x and the -1 tensor is intact. Exit 1 unless
every release-after case is right and every control wrong.
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import ecosystem_cases as ec  # noqa: E402

RUNS = int(os.environ.get("LAUNCHER_RUNS", "20"))
N = int(os.environ.get("LAUNCHER_N", str(1 << 24)))
SPIN = 20_000_000  # about 10 ms


def case(lib: str, setting: str, release: str) -> dict:
    import torch

    sys.path.insert(0, HERE)
    from launcher import Launcher

    torch.cuda.init()
    ln = Launcher(lib, spin=SPIN)
    wrong = 0
    if setting == "eager":
        p, launch = torch.cuda.Stream(), torch.cuda.Stream()
        for i in range(RUNS):
            with torch.cuda.stream(p):
                x = torch.full((N,), float(i + 1), device="cuda")
                out = torch.empty(N, device="cuda")
                ln.scale(x, out, 2.0, stream=launch.cuda_stream, release=release)
                del x  # the launcher's release is all that keeps x's memory now
                junk = torch.full((N,), -1.0, device="cuda")
            torch.cuda.synchronize()
            ok = torch.all(out == 2.0 * (i + 1)).item() and torch.all(junk == -1.0).item()
            wrong += int(not ok)
            del out, junk
        ln.flush()
        return {"runs": RUNS, "wrong": wrong}
    x, out, src = (torch.empty(N, device="cuda") for _ in range(3))
    src.fill_(0.5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # warm-up, eager
        x.copy_(src)
        ln.scale(x, out, 2.0, release="after")
    torch.cuda.synchronize()
    ln.flush()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=setting.split(":")[1]):
        x.copy_(src)
        ln.scale(x, out, 2.0, release=release)  # on the capturing stream
    del x
    junk = torch.full((N,), -1.0, device="cuda")
    torch.cuda.synchronize()
    for i in range(RUNS):
        src.fill_(float(i + 1))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        ok = torch.all(out == 2.0 * (i + 1)).item() and torch.all(junk == -1.0).item()
        wrong += int(not ok)
    del g  # the graph's releases run now (release="after")
    torch.cuda.synchronize()
    ln.flush()
    return {"runs": RUNS, "wrong": wrong}


def _child(lib, setting, release, wrap=None, env=None):
    """One case in a process of its own (4 times the time under memcheck)."""
    return ec.run(__file__, [lib, setting, release], wrap=wrap, env=env,
                  timeout=ec.CASE_TIMEOUT * (4 if wrap else 1))


SETTINGS = ("eager", "graph:global", "graph:thread_local", "graph:relaxed")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        return ec.child(case, *sys.argv[2:5])
    if len(sys.argv) == 3 and sys.argv[1] == "--memcheck":
        cs = shutil.which("compute-sanitizer") or os.path.join(
            os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")
        if not os.path.exists(cs):
            print("launcher memcheck: skipped (no compute-sanitizer)")
            return 0
        env = dict(os.environ, LAUNCHER_RUNS="3", LAUNCHER_N=str(1 << 20))
        ok_all = True
        for setting in ("eager", "graph:thread_local"):
            res, proc = _child(os.path.abspath(sys.argv[2]), setting, "after", env=env,
                               wrap=[cs, "--tool", "memcheck", "--error-exitcode", "99",
                                     "--report-api-errors", "no"])
            summary = [ln for ln in proc.stdout.splitlines() + proc.stderr.splitlines()
                       if "ERROR SUMMARY" in ln]
            clean = (proc.returncode == 0 and res["error"] is None and res["wrong"] == 0
                     and any("ERROR SUMMARY: 0 errors" in ln for ln in summary))
            ok_all = ok_all and clean
            print(f"launcher memcheck {setting:19} release after: "
                  f"{'clean' if clean else 'NOT CLEAN'} (rc {proc.returncode}; "
                  f"{summary[-1].strip() if summary else 'no summary'}; "
                  f"{res['runs']} runs, {res['wrong']} wrong{'; ' + res['error'] if res['error'] else ''})")
        return 0 if ok_all else 1
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    lib = os.path.abspath(sys.argv[1])
    ok_all = True
    # Each row is printed as its case ends: a run cut short still shows what it did.
    print(f"{'case':9} {'setting':19} {'release':7} {'runs':>4} {'wrong':>5}  verdict", flush=True)
    for setting in SETTINGS:
        for release in ("after", "before"):
            res, _ = _child(lib, setting, release)
            failed = res["error"] is not None or res["wrong"] > 0
            if res["error"] and "No module named 'torch'" in res["error"]:
                ok, verdict = True, "skipped (no torch)"
            elif release == "after":
                ok = not failed and res["runs"] == RUNS
                verdict = "ok" if ok else "FAILED"
            else:
                ok, verdict = ec.control_failed(res), ec.control_verdict(res)
            ok_all = ok_all and ok
            print(f"{'launcher':9} {setting:19} {release:7} {res['runs']:>4} {res['wrong']:>5}  "
                  f"{verdict}", flush=True)
            if res["error"] and not verdict.startswith("skipped"):
                print(f"    error: {res['error']}", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
