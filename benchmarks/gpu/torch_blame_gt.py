"""Ground truth for issue 30 (the op inside the step), on one GPU: two single-rank runs recorded
with the PyTorch profiler (Session(torch_profiler=True)), each with a planted cause before the
dispatch, and the alignment width the merge states.

    gemm: a BF16 matmul of known length (timed alone with CUDA events) on the dispatch's stream,
          issued between get_dispatch_layout and dispatch: the lead-in of the dispatch's first
          kernel (notify) is queued behind it -> attributed to its kernel and aten::mm, GPU side;
    host: time.sleep of known length inside record_function("planted_host_delay") between
          get_dispatch_layout and dispatch, the GPU idle -> attributed to that range, host side.

Each run's manifest gets an expect block (profiler.groundtruth.expect, op_before_entry); the blame and the
alignment are computed here too (the same code the CPU tests and `epscope report` run) and
printed as a table, so one device call checks the whole chain.

    python benchmarks/gpu/torch_blame_gt.py --out runs/ [--iters 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

GEMM_N = 8192          # BF16 8192^3: ~1.4 ms at ~790 TFLOP/s (KINDS.md), long beside a 1-rank dispatch
CAPACITY = 1024        # records per warp (ep_core bounds dispatch / combine below it)
HOST_DELAY_S = 0.003   # 3 ms: well above time.sleep's ~50 µs overshoot (catalogue_record.py)


def _rank(ctx, opts: dict) -> dict:
    import torch

    import ep_core
    from ep_core import _ext
    from ep_core.config import Problem, op_configs
    from profiler.record.session import Session
    from profiler.store.runstore import update_manifest
    from profiler.workflows.workload import RankOp, make_rank_inputs

    p = Problem(1024, 2048, 4, 16, 1, "bf16")
    ins = make_rank_inputs(p, "uniform", 0, seed=0, device=ctx.device)
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(p.tokens, p.hidden, 1, p.topk))
    dconf, cconf = op_configs(1, 24, None)
    op = RankOp(buffer, p, ins, dconf, cconf)
    for _ in range(3):
        op.iteration(None)
    _ext.load(profile=True)
    a = torch.randn(GEMM_N, GEMM_N, device=ctx.device, dtype=torch.bfloat16)
    gemm_us = _time_gemm(torch, a)
    _profiled_warm_up(torch, ctx, buffer, op)
    facts = {"gemm_us": gemm_us, "host_sleep_us": []}
    paths = {}
    for scenario in ("gemm", "host"):
        name = f"torch-{scenario}-before-dispatch"
        s = Session(opts["out"], name=name, rank=0, world_size=1, group=ctx.group, capacity=CAPACITY, overwrite=True,
                    torch_profiler=True, description=_DESCRIPTIONS[scenario].format(gemm_us=gemm_us),
                    workload={"kind": "ep", **p.to_dict(), "routing": "uniform", "planted": scenario},
                    config={"dispatch": dconf.to_dict(), "combine": cconf.to_dict()})
        with s:
            with buffer.profile(s, calls=3 * opts["iters"]):    # layout, dispatch, combine: no slab inside a call
                for it in range(opts["iters"]):
                    buffer.profile_iteration = it
                    lay = op.layout(True)
                    if scenario == "gemm":
                        torch.matmul(a, a)
                    else:
                        with torch.profiler.record_function("planted_host_delay"):
                            t0 = time.perf_counter()
                            time.sleep(HOST_DELAY_S)
                            facts["host_sleep_us"].append((time.perf_counter() - t0) * 1e6)
                    op.combine(op.dispatch(lay, True), True)
                torch.cuda.synchronize()
        paths[scenario] = str(s.path)
        update_manifest(s.path, {"expect": _expect(scenario, facts)})
    return {"paths": paths, "facts": facts, "gpu": torch.cuda.get_device_name()}


_DESCRIPTIONS = {
    "gemm": "1 rank, PyTorch profiler on: a BF16 8192^3 matmul ({gemm_us:.0f} µs alone) on the dispatch's "
            "stream between get_dispatch_layout and dispatch (issue 30 ground truth)",
    "host": "1 rank, PyTorch profiler on: 3 ms time.sleep inside record_function('planted_host_delay') "
            "between get_dispatch_layout and dispatch, GPU idle (issue 30 ground truth)",
}


def _profiled_warm_up(torch, ctx, buffer, op) -> None:
    """One profiled op into a throwaway session: the Buffer learns its profile geometries, so the
    recorded sessions make every pool slab at `profile(calls=)`'s entry and no profiled call
    allocates between its host call and its launch (the first recording without it blamed
    iteration 0's lead-ins on that allocation, 1-2 ms of host time, not on the planted op)."""
    import tempfile

    from profiler.record.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        w = Session(tmp, name="warm-up", rank=0, world_size=1, group=ctx.group, capacity=CAPACITY, analyze=False,
                    description="profiled warm-up (discarded)")
        with w, buffer.profile(w):
            op.combine(op.dispatch(op.layout(True), True), True)
            torch.cuda.synchronize()


def _time_gemm(torch, a) -> float:
    """Median µs of the matmul alone (CUDA events, after a warm-up)."""
    torch.matmul(a, a)
    out = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, a)
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)


def _expect(scenario: str, facts: dict) -> dict:
    from profiler.groundtruth.expect import Cause, Effect, Expect, OpBeforeEntry

    if scenario == "gemm":
        obe = OpBeforeEntry(scope="lead_in", rank=0, kernel="notify", side="gpu", op="aten::mm")
        eff = Effect("gemm_us", round(facts["gemm_us"], 1), "us")
        note = "the matmul's kernel on the dispatch's stream holds the notify kernel back"
    else:
        obe = OpBeforeEntry(scope="lead_in", rank=0, kernel="notify", side="host", op="planted_host_delay")
        eff = Effect("host_delay_us", round(statistics.median(facts["host_sleep_us"]), 1), "us")
        note = "the host sleeps inside the named range before it launches the dispatch"
    # the host delay is host time on the critical path of the only rank (host_bound, rank 0); the GEMM
    # is GPU work of the rank's own before the op, no EP problem on one rank: no page should alarm
    cause, rank = (Cause.NONE, None) if scenario == "gemm" else (Cause.HOST_BOUND, 0)
    return Expect(cause=cause, rank=rank, kernel="notify", effect=eff, op_before_entry=obe,
                  planted_by="python benchmarks/gpu/torch_blame_gt.py", note=note).to_json()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs")
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args(argv)
    from ep_core.launch import run_ranks

    res = run_ranks(_rank, 1, {"out": a.out, "iters": a.iters}, timeout_s=600)[0]
    print(json.dumps(res, indent=1))
    from profiler.store.runstore import load_run
    from profiler.torchtrace.report import torch_section
    for scenario, path in res["paths"].items():
        print(f"\n== {scenario}: {path}")
        print(torch_section(load_run(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
