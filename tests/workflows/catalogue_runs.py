"""Hand-built 2-rank EP run directories with known numbers, for the catalogue's CPU tests.

Every iteration launches layout, notify, dispatch, barrier, combine on each rank, the way
profiler.workflows.workload.RankOp does; the knobs set exactly what the catalogue measures (kernel times,
host entry times, notify rank_start arrivals, dispatch blocks that work), so each test knows
the answer before it measures.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ep_core.generated import ep_intranode_phases as P
from profiler.store.runstore import write_run

KERNELS = ("layout", "notify", "dispatch", "barrier", "combine")
# an iteration in hook mode (return_recv_hook=True): each op's send, signal and receive are launches
# of its kernel, told apart by what they record (on block 0, warp 0): (kernel, part, role, phase)
HOOK_LAUNCHES = (("layout", "", None, None), ("notify", "", None, None),
                 ("dispatch", "send", "sender", "pack"), ("dispatch", "signal", "sender", "publish_hook"),
                 ("dispatch", "recv", "receiver", "copy_out"), ("barrier", "", None, None),
                 ("combine", "signal", "sender", "publish_hook"), ("combine", "recv", "receiver", "reduce"))
HOOK_US = {("dispatch", "send"): 60, ("dispatch", "signal"): 3, ("dispatch", "recv"): 50, ("combine", "signal"): 3,
           ("combine", "recv"): 70}
ITER_NS = 10_000_000      # iterations 10 ms apart
WARPS = 2                 # warps per block (2 keep the tables small; shares do not depend on it)


def fake_run(path, *, iterations=(2, 3), kernel_us=None, host_lag_ms=None, late_rank=None, late_us=0.0,
             dispatch_blocks=24, working_blocks=24, status="ok", hook=False, stall_us=None,
             entry_lag_us=None, gpu_side=False) -> Path:
    """kernel_us: {kernel: (rank 0 µs, rank 1 µs)}; host_lag_ms: {rank: ms its host enters every
    op late}; late_rank arrives late_us after the other at notify's rank_start; blocks >=
    working_blocks of each dispatch record nothing but a wait. `hook`: the ops in hook mode
    (HOOK_LAUNCHES, back to back, HOOK_US each); stall_us: {kernel: (rank 0, rank 1)} µs of
    stage_wait span that kernel's block 0 records, split over its two warps. entry_lag_us:
    {(rank, kernel) or (rank, kernel, iteration): µs} that rank enters that launch late: its host
    call starts late (a host delay), or with `gpu_side` its host calls on time and its GPU starts
    the kernel late (work queued before it); the rank's later launches shift with it."""
    kernel_us = {"layout": (2, 2), "notify": (20, 20), "dispatch": (200, 200), "barrier": (2, 2),
                 "combine": (250, 250), **(kernel_us or {})}
    for (k, part), us in HOOK_US.items():
        kernel_us[(k, part)] = (us, us)
    stall_us = stall_us or {}
    launches = HOOK_LAUNCHES if hook else tuple((k, "", None, None) for k in KERNELS)
    host_lag_ms = host_lag_ms or {}
    ev, la = [], []
    for r in (0, 1):
        launch = 0
        for it in iterations:
            t = it * ITER_NS + int(host_lag_ms.get(r, 0.0) * 1e6)
            queued = 0              # iterations are 10 ms apart: the GPU has caught up
            for k, part, hook_role, hook_phase in launches:
                us = kernel_us[(k, part) if part else k][r]
                lags = entry_lag_us or {}
                lag = int(lags.get((r, k, it), lags.get((r, k), 0.0)) * 1e3)
                if gpu_side:
                    queued += lag           # the host goes on; the GPU runs this and what follows later
                else:
                    t += lag
                g0 = t + 5_000 + queued
                g1 = g0 + int(us * 1e3)
                regions = dispatch_blocks * WARPS if k == "dispatch" else WARPS
                la.append({"rank": r, "launch": launch, "kernel": k, "iteration": it, "host_begin_ns": t,
                           "host_end_ns": t + 3_000, "gpu_begin_ns": g0, "gpu_end_ns": g1, "regions": regions,
                           "dropped": 0})
                if k == "notify":
                    arrive = g0 + 1_000 + (int(late_us * 1e3) if r == late_rank else 0)
                    for w in range(WARPS):
                        ev.append(_row(r, launch, k, it, 0, w, "notify", "arrive", "rank_start", arrive, arrive,
                                       2 * it + 1))
                if k == "dispatch" and not part:
                    for b in range(dispatch_blocks):
                        for w in range(WARPS):
                            role = "receiver"
                            ev.append(_row(r, launch, k, it, b, w, role, "span", "wait_data", g0, g0 + 100, 1 - r))
                            if b < working_blocks:
                                ev.append(_row(r, launch, k, it, b, w, role, "span", "copy_out", g0 + 100, g1, b))
                if hook_phase is not None:
                    kind = "instant" if hook_phase == "publish_hook" else "span"
                    ev.append(_row(r, launch, k, it, 0, 0, hook_role, kind, hook_phase, g0,
                                   g0 if kind == "instant" else g1, 1 - r))
                if k in stall_us and part != "signal":
                    half = int(stall_us[k][r] * 1e3 / 2)
                    for w in range(WARPS):
                        ev.append(_row(r, launch, k, it, 0, w, "sender", "span", "stage_wait", g0, g0 + half, 0))
                launch += 1
                t += int(us * 1e3) + 10_000
    manifest = {"name": Path(path).name, "description": "fake catalogue run", "status": status,
                "workload": {"kind": "ep"}, "registry": {P.FAMILY: P.REGISTRY}, "git": {"commit": "abcdef0123"}}
    return write_run(path, pd.DataFrame(ev), pd.DataFrame(la), manifest, perfetto=False)


def _row(rank, launch, kernel, it, block, warp, role, kind, phase, b, e, payload):
    return {"rank": rank, "launch": launch, "kernel": kernel, "iteration": it, "sm": block, "block": block,
            "warp": warp, "role": role, "kind": kind, "phase": phase, "begin_ns": b, "end_ns": e,
            "payload": payload, "open": False}
