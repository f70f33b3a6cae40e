"""Where the EP kernels' recording cost goes on one rank: per-kernel times and Nsight Compute counters.

    PYTHONPATH=. python benchmarks/gpu/ep_cost_ncu.py --phase cupti --out $OUT
    ncu ... python benchmarks/gpu/ep_cost_ncu.py --phase ncu --out $OUT      (benchmarks/gpu/ep_ncu_gpu.sh)

Issue 33: combine costs +1.7-2.2 % with the instrumented build and recording off at run time, and
+2.3-3.3 % with recording on, against the compiled-out build, while its ~16 records a warp account
for ~0.1 % (benchmarks/NOTES.md, "Issue 33: measured on one H100"). recorder_ep_cost.py times
[barrier + combine] with CUDA events around 20 calls, so the figure holds the barrier kernel, the
output allocation and the gaps too. This script separates them:

- `cupti`: each mode's kernels under torch.profiler (CUPTI kernel records), rounds interleaved:
  median duration of the barrier, dispatch and combine kernels per mode. Says whether the cost is
  inside combine_kernel or around it.
- `ncu`: the same launches, few of them, under `ncu` (the shell script gives the sections): each
  matching launch's order is written to <out>/ncu_launches.json so that the report's kernels can
  be told apart by mode (the two builds give the kernels the same names).

Shape as recorder_ep_cost.py: 4096 tokens, hidden 7168, top-8 of 256, uniform routing, 1 rank.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from recorder_ep_cost import MODES, _launchers, _profile_buffer  # noqa: E402

KERNELS = ("barrier_kernel", "dispatch_kernel", "combine_kernel")


def _setup(ctx, sms_list):
    import ep_core
    from ep_core.config import Config, Problem
    from profiler.workflows.workload import make_all_inputs

    torch.cuda.set_device(ctx.device)
    tokens, hidden, topk, experts = 4096, 7168, 8, 256
    p = Problem(tokens, hidden, topk, experts, ctx.world_size)
    mine = make_all_inputs(p, "uniform", seed=0, device=ctx.device)[ctx.rank]
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(tokens, hidden, ctx.world_size))
    n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(mine.topk_idx.to(ep_core.topk_idx_t), experts)
    warps = buffer.limits["threads"] // 32
    configs = {}
    for sms in sms_list:
        cfg = Config(sms, 6, 256)
        recv_x, _, _, _, handle, _ = buffer.dispatch(mine.x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank,
                                                     num_tokens_per_expert=n_exp, config=cfg)
        grid_d, grid_c = buffer._dispatch_blocks(cfg)[0], buffer._combine_blocks(cfg)[0]
        bufs = (_profile_buffer(grid_d, warps, ctx.rank, ctx.device), _profile_buffer(grid_c, warps, ctx.rank, ctx.device))
        configs[sms] = {m: _launchers(buffer, mine.x, handle, recv_x, cfg, m, bufs) for m in MODES}
    return buffer, configs


def _kernel_of(name: str) -> str | None:
    return next((k for k in KERNELS if k in name), None)


def _cupti_round(fns, iters: int) -> dict[str, list[float]]:
    """Device durations (us) of each kernel kind over `iters` (dispatch, combine) calls of one mode."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            for f in fns:
                f()
        torch.cuda.synchronize()
    out: dict[str, list[float]] = {k: [] for k in KERNELS}
    for e in prof.events():
        k = _kernel_of(e.name)
        if k is not None and e.device_type == torch.autograd.DeviceType.CUDA:
            out[k].append(float(e.time_range.elapsed_us()))
    return out


def cupti_worker(ctx, opts):
    buffer, configs = _setup(ctx, opts["sms"])
    res = {"gpu": torch.cuda.get_device_name(), "rows": {}}
    for sms, fns_by_mode in configs.items():
        for m in MODES:
            for f in fns_by_mode[m]:
                for _ in range(3):
                    f()
        torch.cuda.synchronize()
        times = {(k, m): [] for k in KERNELS for m in MODES}
        for _ in range(opts["rounds"]):
            for m in MODES:
                for k, v in _cupti_round(fns_by_mode[m], opts["iters"]).items():
                    times[(k, m)].extend(v)
        for k in KERNELS:
            med = {m: float(np.median(times[(k, m)])) if times[(k, m)] else float("nan") for m in MODES}
            res["rows"][f"{k} {sms} SMs"] = {
                "median_us": {m: round(v, 3) for m, v in med.items()},
                "n": {m: len(times[(k, m)]) for m in MODES},
                "p10_p90_us": {m: [round(float(np.percentile(times[(k, m)], q)), 3) for q in (10, 90)]
                               for m in MODES if times[(k, m)]},
                "on_vs_compiled_out_pct": round((med[MODES[2]] / med[MODES[0]] - 1) * 100, 3),
                "off_vs_compiled_out_pct": round((med[MODES[1]] / med[MODES[0]] - 1) * 100, 3)}
    buffer.synchronize()
    return res


def ncu_worker(ctx, opts):
    """Per mode: `warm` unmeasured-by-intent (dispatch, combine) pairs, then `count` more. ncu profiles
    every matching launch; the list of launches in order lets the report's IDs be read by mode."""
    buffer, configs = _setup(ctx, opts["sms"])
    # one entry per dispatch / combine kernel launched here, in launch order; _setup's first
    # dispatch of each SM count (the handle's) comes first
    launches = [{"kernel": "dispatch_kernel", "mode": "setup", "sms": sms, "warm": True} for sms in opts["sms"]]
    for sms, fns_by_mode in configs.items():
        for m in MODES:
            for i in range(opts["warm"] + opts["count"]):
                for k, f in zip(("dispatch_kernel", "combine_kernel"), fns_by_mode[m]):
                    f()
                    launches.append({"kernel": k, "mode": m, "sms": sms, "warm": i < opts["warm"]})
            torch.cuda.synchronize()
    buffer.synchronize()
    return launches


def main() -> int:
    from ep_core.launch import run_ranks

    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("cupti", "ncu"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sms", type=int, nargs="+", default=[24, 64])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--count", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.phase == "ncu":
        launches = run_ranks(ncu_worker, 1, {"sms": a.sms, "warm": a.warm, "count": a.count}, timeout_s=500)[0]
        (out / "ncu_launches.json").write_text(json.dumps(launches, indent=0) + "\n")
        print(f"{len(launches)} dispatch / combine launches written to {out / 'ncu_launches.json'}")
        return 0
    res = run_ranks(cupti_worker, 1, {"sms": a.sms, "rounds": a.rounds, "iters": a.iters}, timeout_s=400)[0]
    (out / "ep-cost-cupti.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"EP kernels, 1 rank, {res['gpu']}: CUPTI kernel durations, median over {a.rounds} rounds x {a.iters} calls")
    print(f"{'kernel':26s} {'compiled out':>13s} {'instr. off':>11s} {'on':>10s} {'on vs out':>10s} {'off vs out':>11s}")
    for k, r in res["rows"].items():
        m = r["median_us"]
        print(f"{k:26s} {m[MODES[0]]:13.2f} {m[MODES[1]]:11.2f} {m[MODES[2]]:10.2f} {r['on_vs_compiled_out_pct']:+9.2f}% "
              f"{r['off_vs_compiled_out_pct']:+10.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
