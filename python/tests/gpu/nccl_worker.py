# SPDX-License-Identifier: Apache-2.0
"""One rank of test_reach.py's NCCL case: python3 nccl_worker.py SETTING USE OUT.

SETTING is "eager" or "graph" (the all_reduce and the consumer captured in
torch.cuda.graph, replayed), USE 1 with dlsync and 0 for the control. RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment. Writes
{"runs", "wrong", "broken", "note"} as JSON to OUT.
"""
import json
import os
import sys
import traceback

import cupy
import torch
import torch.distributed as dist

import dlsync

N = 1 << 26
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


def eager(rank, use):
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    runs = wrong = 0
    note = ""
    for i in range(10):
        x = torch.full((N,), float(i + 1 + rank), device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN)  # NCCL's stream waits for this first: a slow producer
        dist.all_reduce(x)  # the current stream waits for NCCL's
        with cs:
            cx = cupy.from_dlpack(dlsync.wrap(x) if use else _NoSync(x))
            cupy.multiply(cx[-8:], 1, out=res)
        cs.synchronize()
        got, want = float(res[-1].get()), float(2 * (i + 1) + 1)
        runs += 1
        if got != want:
            wrong += 1
            note = note or f"run {i}: read {got}, want {want}"
        torch.cuda.synchronize()
    return runs, wrong, 0, note


def graph(rank, use):
    x = torch.zeros(N, device="cuda")
    res = cupy.zeros(N, dtype=cupy.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    dist.all_reduce(x)  # NCCL's communicator made outside the capture
    cupy.multiply(cupy.from_dlpack(x), 3, out=res)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            if use:
                with dlsync.scope():
                    dist.all_reduce(x)
                    with side:
                        cupy.multiply(cupy.from_dlpack(dlsync.wrap(x)), 3, out=res)
            else:
                dist.all_reduce(x)
                with side:
                    cupy.multiply(cupy.from_dlpack(x), 3, out=res)
    except Exception as e:  # noqa: BLE001 - the control's broken capture
        failed = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    else:
        failed = ""
    # Agree through the store (not NCCL, which a broken capture may have left
    # unusable), so that no rank replays while the other has no graph.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"capture-{use}-{rank}", failed or "ok")
    other = store.get(f"capture-{use}-{1 - rank}").decode()
    if failed or other != "ok":
        torch.cuda.synchronize()
        return 0, 0, 1, failed or f"the other rank's capture failed: {other}"
    runs = wrong = 0
    note = ""
    for i in range(REPLAYS):
        x.fill_(float(i + 1 + rank))
        torch.cuda.synchronize()
        dist.barrier()
        g.replay()
        torch.cuda.synchronize()
        got, want = float(res[-1].get()), float(2 * (i + 1) + 1) * 3
        runs += 1
        if got != want:
            wrong += 1
            note = note or f"replay {i}: read {got}, want {want}"
    return runs, wrong, 0, note


def main():
    setting, use, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    cupy.cuda.Device(rank).use()
    result = {"runs": 0, "wrong": 0, "broken": 0, "note": ""}
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        runs, wrong, broken, note = (eager if setting == "eager" else graph)(rank, use)
        result = {"runs": runs, "wrong": wrong, "broken": broken, "note": note}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        result["broken"] = 1
        result["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    finally:
        with open(out, "w") as f:
            json.dump(result, f)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
