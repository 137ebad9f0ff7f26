# SPDX-License-Identifier: Apache-2.0
"""test_foreign.py's NCCL case, one rank: python3 foreign_nccl_worker.py USE OUT.

torch.distributed with NCCL at world size 1 (RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT from the environment). The first capture (torch.cuda.graph)
spins, writes y = src * 2, issues an async all-reduce of y, waits on its
work (NCCL's stream joined back, as the capture requires) and records an
external event: the collective's completion as an event-record node. Then
the graph break: CuPy, in a second capture on its own stream, reads the sum
after waiting on that event imported as EXTERNAL_RECORD (USE 1), or without
waiting (USE 0, the control). Each of 20 replays launches the first graph
then the second and checks the sum (world size 1: the sum of one rank's y).
Writes {"runs", "wrong", "broken", "note"}, or {"skip": why}, as JSON to OUT.
"""
import json
import os
import sys
import traceback

import cupy
import torch
import torch.distributed as dist

import dlsync

N = 1 << 24
SPIN = 20_000_000
REPLAYS = 20


class _NoSync:
    def __init__(self, t):
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        with torch.cuda.device(self._t.device):
            return self._t.__dlpack__(stream=-1, **kw)


def run(use, world):
    try:
        ev = torch.cuda.Event(external=True)
    except TypeError:
        return {"skip": f"torch {torch.__version__} has no torch.cuda.Event(external=True)"}
    src = torch.zeros(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    dist.all_reduce(y)  # NCCL's communicator made outside the capture
    ev.record()  # torch creates the CUDA event at its first record
    torch.cuda.synchronize()
    g1 = torch.cuda.CUDAGraph()
    try:  # no dlsync in this capture: where torch cannot make it, the case cannot run
        with torch.cuda.graph(g1):
            torch.cuda._sleep(SPIN)
            torch.mul(src, 2, out=y)
            work = dist.all_reduce(y, async_op=True)
            work.wait()  # the capture's stream after NCCL's: the collective's end
            ev.record()  # external: an event-record node after the all-reduce
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return {"skip": f"torch {torch.__version__} did not capture the async all-reduce: "
                        f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    torch.cuda.synchronize()
    # The graph break: a library on its own stream, in a capture of its own.
    cy = cupy.from_dlpack(_NoSync(y))
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    with cs:
        cupy.multiply(cy[-8:], 1, out=res)  # warm up
    cs.synchronize()
    fence = dlsync.Fence.from_event(ev, provenance=dlsync.Provenance.EXTERNAL_RECORD)
    failed = None
    cs.begin_capture()
    try:
        with cs:
            if use:
                fence.wait(cs)
            cupy.multiply(cy[-8:], 1, out=res)
    except Exception as e:  # noqa: BLE001
        failed = e
    try:
        g2 = cs.end_capture()
    except Exception as e:  # noqa: BLE001
        failed = failed or e
    if failed is not None:
        fence.close()
        return {"runs": 0, "wrong": 0, "broken": 1,
                "note": f"{type(failed).__name__}: {str(failed).splitlines()[0][:160]}"}
    runs = wrong = 0
    note = ""
    try:
        for i in range(REPLAYS):
            src.fill_(float(i + 1))
            g1.replay()
            g2.launch(stream=cs)
            cs.synchronize()
            torch.cuda.synchronize()
            got, want = float(res[-1].get()), 2.0 * (i + 1) * world
            runs += 1
            if got != want:
                wrong += 1
                note = note or f"replay {i}: read {got}, want {want}"
    finally:
        fence.close()
    return {"runs": runs, "wrong": wrong, "broken": 0, "note": note}


def main():
    use, out = sys.argv[1] == "1", sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    cupy.cuda.Device(rank).use()
    result = {"runs": 0, "wrong": 0, "broken": 1, "note": "did not run"}
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        result = run(use, world)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        result = {"runs": 0, "wrong": 0, "broken": 1,
                  "note": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    finally:
        with open(out, "w") as f:
            json.dump(result, f)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
