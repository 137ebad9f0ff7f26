# SPDX-License-Identifier: Apache-2.0
"""The example nanobind extension (dlsync_nb_example) on a GPU: torch and CuPy
producers eagerly and inside torch.cuda.graph (capture modes global,
thread_local, relaxed), JAX eagerly; each with the extension's dlsync import
and with nanobind's plain nb::ndarray import (the control). One process per
case (a broken capture leaves nothing behind for the next).

    PYTHONPATH=<folder of the module> DLSYNC_LIBRARY=... python3 examples/nanobind_ext/run.py

A case runs 20 times (eager calls or graph replays) with a slow producer
(torch.cuda._sleep) ahead of the tensor's last write; a run is wrong unless
out == 2 x everywhere. Exit 1 unless every dlsync case is right with no
error and every control of torch / CuPy is wrong or broken.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem_cases as ec  # noqa: E402

RUNS = 20
N = 1 << 24
SPIN = 20_000_000  # about 10 ms


def case(producer: str, setting: str, mode: str) -> dict:
    import torch
    import dlsync_nb_example as ext

    torch.cuda.init()
    ext.stream()  # the extension's stream, made eagerly
    s = torch.cuda.Stream()
    wrong = 0
    if producer == "raising":  # bad input on the GPU: the producer's exception, nothing left open
        import dlsync

        class Raising:
            def __dlpack_device__(self):
                return (2, torch.cuda.current_device())

            def __dlpack__(self, **kwargs):
                raise RuntimeError("the producer failed")

        out = torch.empty(N, device="cuda")
        try:
            ext.scale(Raising(), out, 2.0, mode)
        finally:
            assert dlsync._scope._scopes() == [], "a dlsync scope was left open"
        return {"runs": 1, "wrong": 0}
    if producer == "jax":
        import jax.numpy as jnp

        out = torch.empty(N, device="cuda")
        for i in range(RUNS):
            # 1/2048 is a fixed point of a @ a (2048 x 2048): the chain stays finite, so
            # a[0, 0] * 0.0 below is 0 (1e-3 grew to inf in 8 steps, and inf * 0 is NaN).
            a = jnp.full((2048, 2048), 1.0 / 2048, jnp.float32)
            for _ in range(8):  # the slow producer: matmuls queued ahead of x
                a = a @ a
            x = jnp.full((N,), float(i + 1), jnp.float32) + a[0, 0] * 0.0
            with torch.cuda.stream(s):
                ext.scale(x, out, 2.0, mode)
                got = out.clone()
            torch.cuda.synchronize()
            wrong += int(not torch.all(got == 2.0 * (i + 1)).item())
        return {"runs": RUNS, "wrong": wrong}
    if producer == "cupy":
        import cupy

    def body(x, out, src):  # the producer's work, then the extension
        torch.cuda._sleep(SPIN)
        if producer == "torch":
            x.copy_(src)
            ext.scale(x, out, 2.0, mode)
        else:
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                x[...] = src
                ext.scale(x, out, 2.0, mode)

    if producer == "torch":
        x, out, src = (torch.empty(N, device="cuda") for _ in range(3))
        check = lambda v: bool(torch.all(out == 2.0 * v).item())  # noqa: E731
        fill = lambda v: src.fill_(v)  # noqa: E731
    else:
        x, out, src = (cupy.empty(N, dtype=cupy.float32) for _ in range(3))
        check = lambda v: bool(cupy.all(out == 2.0 * v).item())  # noqa: E731
        fill = lambda v: src.fill(v)  # noqa: E731
    if setting == "eager":
        for i in range(RUNS):
            fill(float(i + 1))
            torch.cuda.synchronize()
            if producer == "cupy":
                cupy.cuda.Device().synchronize()
            with torch.cuda.stream(s):
                body(x, out, src)
            torch.cuda.synchronize()
            if producer == "cupy":
                cupy.cuda.Device().synchronize()
            wrong += int(not check(float(i + 1)))
        return {"runs": RUNS, "wrong": wrong}
    g = torch.cuda.CUDAGraph()
    fill(0.5)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):  # warm-up: CuPy's copy kernel compiled, dlsync's paths taken
        body(x, out, src)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, capture_error_mode=setting.split(":")[1]):
        body(x, out, src)
    for i in range(RUNS):
        fill(float(i + 1))
        torch.cuda.synchronize()
        if producer == "cupy":
            cupy.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        wrong += int(not check(float(i + 1)))
    return {"runs": RUNS, "wrong": wrong}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        return ec.child(case, *sys.argv[2:5])
    cases = []
    for producer in ("torch", "cupy"):
        for setting in ("eager", "graph:global", "graph:thread_local", "graph:relaxed"):
            cases.append((producer, setting))
    cases.append(("jax", "eager"))
    cases.append(("raising", "eager"))
    ok_all = True
    # Each row is printed as its case ends: a run cut short still shows what it did.
    print(f"{'case':14} {'producer':8} {'setting':19} {'import':7} {'runs':>4} {'wrong':>5}  verdict",
          flush=True)
    for producer, setting in cases:
        for mode in ("dlsync", "plain"):
            env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
            res, _ = ec.run(__file__, [producer, setting, mode], env=env)
            if ec.framework_missing(res["error"]):
                verdict, ok = "skipped (" + res["error"] + ")", True
            elif producer == "raising":
                ok = mode == "plain" or "the producer failed" in (res["error"] or "")
                verdict = ("raised the producer's error" if ok else "FAILED") if mode == "dlsync" \
                    else "(information)"
            elif mode == "dlsync":
                ok = res["error"] is None and res["wrong"] == 0 and res["runs"] == RUNS
                verdict = "ok" if ok else "FAILED"
            elif producer == "jax":
                ok, verdict = True, "(information: JAX's own export may wait)"
            else:
                ok, verdict = ec.control_failed(res), ec.control_verdict(res)
            ok_all = ok_all and ok
            print(f"{'nanobind_ext':14} {producer:8} {setting:19} {mode:7} {res['runs']:>4} "
                  f"{res['wrong']:>5}  {verdict}", flush=True)
            if res["error"] and not ec.framework_missing(res["error"]):
                print(f"    error: {res['error']}", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
