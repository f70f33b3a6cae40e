"""Recording cost of the EP kernels on one rank (run by benchmarks/gpu/recorder_gpu.sh).

    PYTHONPATH=. python benchmarks/gpu/recorder_ep_cost.py --out $OUT

One rank (all tokens stay local), 4096 tokens, hidden 7168, top-8 of 256, uniform routing: kernel
time of [barrier + dispatch] (cached handle) and [barrier + combine] launched through the Buffer's
own launcher and plans, in three modes: the compiled-out build (what an unprofiled call runs),
the instrumented build with a null profile buffer (the runtime switch, what a call would pay if
"off" did not pick the compiled-out build) and the instrumented build writing a real profile
buffer (recording on). Modes interleave round by round (CUDA events around `iters` launches a
round); medians over rounds and the spread of the compiled-out rounds are reported. The profile
buffers of the last round are decoded (profiler.decode.decode) and must hold events and no drops.
Writes <out>/recorder-ep-1rank.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MODES = ("compiled out", "instrumented, recording off", "instrumented, recording on")
CAPACITY = 256   # record slots per warp: the dispatch / combine warps of this shape write well under it


def _events_us(fn, iters: int) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def _profile_buffer(grid: int, warps: int, rank: int, device):
    from ep_core.generated import ep_intranode_phases as P
    from profiler.record.session import buffer_bytes, make_header

    hdr = make_header(registry_hash=P.REGISTRY_HASH, num_regions=grid * warps, capacity=CAPACITY, rank=rank,
                      launch_id=0, warps_per_block=warps, hires=True)
    b = torch.zeros(buffer_bytes(grid * warps, CAPACITY), dtype=torch.uint8, device=device)
    b[: hdr.size].copy_(torch.from_numpy(hdr.copy()))
    return b


def _launchers(buffer, x, handle, recv_x, cfg, mode: str, bufs):
    build = buffer._build(mode != MODES[0])
    dplan = buffer._cached_dispatch_plan(build, handle, x, None, cfg, 0)
    cplan = buffer._combine_plan(build, handle, recv_x, None, cfg)
    pd, pc = (bufs[0].data_ptr(), bufs[1].data_ptr()) if mode == MODES[2] else (0, 0)

    def stream_mode():
        return build.mode(torch.cuda.current_stream().cuda_stream, True, True, False, False)

    def dispatch():
        build.launcher.dispatch(dplan.cpp, x, None, None, None, stream_mode(), 0, pd)

    def combine():
        build.launcher.combine(cplan.cpp, recv_x, None, None, None, stream_mode(), 0, pc)
    return dispatch, combine


def _decode_check(bufs, grid_d: int, grid_c: int, warps: int) -> dict:
    from ep_core.generated import ep_intranode_phases as P
    from profiler.decode.decode import LaunchInfo, decode_launches

    items = [(bufs[0].cpu().numpy(), LaunchInfo(0, 0, "dispatch", 0, P.FAMILY)),
             (bufs[1].cpu().numpy(), LaunchInfo(0, 1, "combine", 0, P.FAMILY))]
    d = decode_launches(items, {P.FAMILY: P.REGISTRY})
    ev = d.events
    out = {"events": {k: int((ev["kernel"] == k).sum()) for k in ("dispatch", "combine")},
           "phases": sorted(map(str, ev["phase"].unique())), "dropped": int(d.launches["dropped"].sum()),
           "warnings": {type(w).__name__: w.count for w in d.warnings}, "regions": [grid_d * warps, grid_c * warps]}
    assert out["events"]["dispatch"] > 0 and out["events"]["combine"] > 0 and out["dropped"] == 0, out
    return out


def worker(ctx, opts):
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
    res = {"gpu": torch.cuda.get_device_name(), "shape": {"tokens": tokens, "hidden": hidden, "topk": topk,
                                                          "experts": experts, "ranks": ctx.world_size}, "rows": {}}
    for sms in opts["sms"]:
        cfg = Config(sms, 6, 256)
        recv_x, _, _, _, handle, _ = buffer.dispatch(mine.x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank,
                                                     num_tokens_per_expert=n_exp, config=cfg)
        grid_d, grid_c = buffer._dispatch_blocks(cfg)[0], buffer._combine_blocks(cfg)[0]
        bufs = (_profile_buffer(grid_d, warps, ctx.rank, ctx.device), _profile_buffer(grid_c, warps, ctx.rank, ctx.device))
        fns = {m: _launchers(buffer, mine.x, handle, recv_x, cfg, m, bufs) for m in MODES}
        times = {(op, m): [] for op in ("dispatch", "combine") for m in MODES}
        for m in MODES:   # warm-up (and the builds' first launches)
            for f in fns[m]:
                for _ in range(3):
                    f()
        torch.cuda.synchronize()
        for _ in range(opts["rounds"]):
            for m in MODES:
                for op, f in zip(("dispatch", "combine"), fns[m]):
                    times[(op, m)].append(_events_us(f, opts["iters"]))
        for op in ("dispatch", "combine"):
            med = {m: float(np.median(times[(op, m)])) for m in MODES}
            co = np.array(times[(op, MODES[0])])
            half = len(co) // 2
            res["rows"][f"{op} {sms} SMs"] = {
                "median_us": {m: round(v, 3) for m, v in med.items()},
                "on_vs_compiled_out_pct": round((med[MODES[2]] / med[MODES[0]] - 1) * 100, 3),
                "runtime_off_vs_compiled_out_pct": round((med[MODES[1]] / med[MODES[0]] - 1) * 100, 3),
                "noise_compiled_out_halves_pct": round(abs(float(np.median(co[:half])) - float(np.median(co[half:])))
                                                       / med[MODES[0]] * 100, 3),
                "rounds": opts["rounds"], "iters_per_round": opts["iters"]}
        hdrs = [_profile_buffer(g, warps, ctx.rank, ctx.device) for g in (grid_d, grid_c)]
        for b, h in zip(bufs, hdrs):
            b.copy_(h)
        fns[MODES[2]][0]()
        fns[MODES[2]][1]()
        torch.cuda.synchronize()
        res["rows"][f"decoded {sms} SMs"] = _decode_check(bufs, grid_d, grid_c, warps)
    buffer.synchronize()
    return res


def main() -> int:
    from ep_core.launch import run_ranks

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sms", type=int, nargs="+", default=[24, 64])
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run_ranks(worker, 1, {"rounds": a.rounds, "iters": a.iters, "sms": a.sms}, timeout_s=400)[0]
    (out / "recorder-ep-1rank.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"EP kernels, 1 rank, {res['gpu']}: kernel us (median of {a.rounds} rounds x {a.iters} launches)")
    print(f"{'kernel':24s} {'compiled out':>13s} {'instr. off':>11s} {'on':>10s} {'on vs out':>10s} {'off vs out':>11s} "
          f"{'noise':>7s}")
    for k, r in res["rows"].items():
        if k.startswith("decoded"):
            print(f"{k}: {r}")
            continue
        m = r["median_us"]
        print(f"{k:24s} {m[MODES[0]]:13.2f} {m[MODES[1]]:11.2f} {m[MODES[2]]:10.2f} {r['on_vs_compiled_out_pct']:+9.2f}% "
              f"{r['runtime_off_vs_compiled_out_pct']:+10.2f}% {r['noise_compiled_out_halves_pct']:6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
