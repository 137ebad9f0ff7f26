# SPDX-License-Identifier: Apache-2.0
"""The example TVM FFI module (scale_tvm.cu) called from PyTorch on a GPU,
eagerly and inside torch.cuda.graph (capture modes global, thread_local,
relaxed), with its side stream forked through dlsync (mode 0) and unordered
(mode 1, the control); then TVM FFI tensors as dlsync.wrap producers. One
process per case.

    DLSYNC_LIBRARY=... PYTHONPATH=python python3 examples/tvm_ffi/run.py BUILD_DIR/libdlsync_tvm_ffi.so

A case runs 20 times (eager calls or graph replays) with a slow producer
(torch.cuda._sleep) ahead of x's last write; a run is wrong unless
y == 2 x everywhere. Exit 1 unless every dlsync case is right with no error
and every control is wrong or broken.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem_cases as ec  # noqa: E402

RUNS = 20
N = 1 << 24
SPIN = 20_000_000  # about 10 ms


def module_case(lib: str, setting: str, mode: int) -> dict:
    import torch
    import tvm_ffi

    m = tvm_ffi.load_module(lib)
    torch.cuda.init()
    m.stream(0)  # the module's stream, made eagerly
    s = torch.cuda.Stream()
    x, y, src = (torch.empty(N, device="cuda") for _ in range(3))

    def body():
        torch.cuda._sleep(SPIN)
        x.copy_(src)
        m.scale(x, y, 2.0, mode)  # tvm_ffi sets the env stream to torch's current one

    wrong = 0
    if setting == "eager":
        for i in range(RUNS):
            src.fill_(float(i + 1))
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                body()
                got = y.clone()
            torch.cuda.synchronize()
            wrong += int(not torch.all(got == 2.0 * (i + 1)).item())
        return {"runs": RUNS, "wrong": wrong}
    src.fill_(0.5)
    with torch.cuda.stream(s):  # warm-up
        body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    got = torch.empty(N, device="cuda")
    with torch.cuda.graph(g, capture_error_mode=setting.split(":")[1]):
        body()
        got.copy_(y)
    for i in range(RUNS):
        src.fill_(float(i + 1))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        wrong += int(not torch.all(got == 2.0 * (i + 1)).item())
    return {"runs": RUNS, "wrong": wrong}


def wrap_case(lib: str, how: str) -> dict:
    """A TVM FFI tensor written by the module on the env stream (s), read by
    torch on another stream (s2): through dlsync.wrap with the env stream
    named as producer=, plain torch.from_dlpack (the control: TVM FFI's
    __dlpack__ ignores the stream), or dlsync.wrap without producer=."""
    import torch
    import tvm_ffi

    import dlsync

    m = tvm_ffi.load_module(lib)
    torch.cuda.init()
    m.stream(0)
    dev = tvm_ffi.device("cuda:0")
    s, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x, y, src = (torch.empty(N, device="cuda") for _ in range(3))
    xt, yt = tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(y)
    wrong = 0
    for i in range(RUNS):
        src.fill_(float(i + 1))
        torch.cuda.synchronize()
        with torch.cuda.stream(s), tvm_ffi.use_raw_stream(dev, s.cuda_stream):
            torch.cuda._sleep(SPIN)
            x.copy_(src)
            m.scale(xt, yt, 2.0, 0)  # y on the env stream s
            env = tvm_ffi.get_raw_stream(dev)
        with torch.cuda.stream(s2):
            if how == "wrap_producer":
                z = torch.from_dlpack(dlsync.wrap(yt, producer=env)).clone()
            elif how == "wrap_found":
                z = torch.from_dlpack(dlsync.wrap(yt)).clone()
            else:
                z = torch.from_dlpack(yt).clone()
        torch.cuda.synchronize()
        wrong += int(not torch.all(z == 2.0 * (i + 1)).item())
    return {"runs": RUNS, "wrong": wrong}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        lib, kind, arg = sys.argv[2], sys.argv[3], sys.argv[4]
        if kind == "wrap":
            return ec.child(wrap_case, lib, arg)
        return ec.child(module_case, lib, kind, int(arg))
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    lib = os.path.abspath(sys.argv[1])
    cases = []
    for setting in ("eager", "graph:global", "graph:thread_local", "graph:relaxed"):
        cases.append(("module", setting, "0", "dlsync", "right"))
        cases.append(("module", setting, "1", "control", "fails"))
    cases.append(("wrap", "wrap", "wrap_producer", "wrap(t, producer=env)", "right"))
    cases.append(("wrap", "wrap", "plain", "from_dlpack(t)", "fails"))
    cases.append(("wrap", "wrap", "wrap_found", "wrap(t)", "info"))
    rows, ok_all = [], True
    for what, kind, arg, label, expect in cases:
        res, _ = ec.run(__file__, [lib, kind, arg], timeout=300)
        failed = res["error"] is not None or res["wrong"] > 0
        if ec.framework_missing(res["error"]):
            ok, verdict = True, "skipped (" + res["error"] + ")"
        elif expect == "right":
            ok = not failed and res["runs"] == RUNS
            verdict = "ok" if ok else "FAILED"
        elif expect == "fails":
            ok, verdict = ec.control_failed(res), ec.control_verdict(res)
        else:
            ok, verdict = True, "(information: TVM FFI tensors expose no stream)"
        ok_all = ok_all and ok
        rows.append((what, kind if what == "module" else "eager", label, res, verdict))
    print(f"{'case':8} {'what':7} {'setting':19} {'ordering':22} {'runs':>4} {'wrong':>5}  verdict")
    for what, setting, label, res, verdict in rows:
        print(f"{'tvm_ffi':8} {what:7} {setting:19} {label:22} {res['runs']:>4} {res['wrong']:>5}  "
              f"{verdict}")
        if res["error"] and not ec.framework_missing(res["error"]):
            print(f"    error: {res['error']}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
