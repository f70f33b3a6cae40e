"""Issue 11's kernel table: the direct path against the pipelined bulk-copy path (N = 1, 2, 3
staging buffers per warp), BF16 dispatch, FP8 dispatch and BF16 combine, at 24 and 64 SMs,
balanced and under a 1.5x rank imbalance. One run, table printed last.

    PYTHONPATH=. python benchmarks/gpu/tma_bench.py --out $OUT        # 2 GPUs, ~3 min after the build

Validates before it times (style rule 11): every (path, SMs, routing) first compares a cached
BF16 dispatch bit-exactly with the PyTorch reference and its combine with calc_diff < 1e-6;
a failing configuration is reported and not timed.

Kernel time = the device time of the op's dispatch / combine kernel (CUPTI, through
torch.profiler), median over the timed calls, slowest rank; the start barrier before each op is
not counted (measured-facts.md's "kernel" column counts the same kernel). Logical GB/s = bytes of
the rank's recv_x (its own rows included; FP8 counts its scales) / kernel time, the slower rank.
Imbalance: skewed routing with rank 0's experts hot, the hot factor bisected on the CPU so that
rank 0 receives 1.5x the rows of rank 1 (the measured ratio is printed).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ep_core import reference as ref  # noqa: E402
from ep_core.config import Config, Problem  # noqa: E402
from ep_core.launch import run_ranks  # noqa: E402
from ep_core.routing import make_routing  # noqa: E402
from ep_core.workload import make_all_inputs, rank_seed  # noqa: E402

TOKENS, HIDDEN, TOPK, EXPERTS = 4096, 7168, 8, 256
PATHS = (("direct", 3), ("tma", 1), ("tma", 2), ("tma", 3))
SMS = (24, 64)
TARGET_GBPS = {64: 700.0, 24: 545.0}  # issue 11
KERNEL_RE = {"dispatch": re.compile(r"dispatch(_tma)?_kernel"), "combine": re.compile(r"combine(_tma)?_kernel")}


def log(ctx, *a):
    if ctx.rank == 0:
        print(*a, flush=True)


def path_name(path: str, n: int) -> str:
    return "direct" if path == "direct" else f"tma N={n}"


def imbalance_hot_factor(target: float = 1.5, ranks: int = 2, seed: int = 0) -> tuple[float, float]:
    """Hot factor of `skewed` routing (rank 0's experts hot) whose rows-received ratio rank 0 /
    rank 1 is `target`, by bisection on the CPU with the benchmark's own seeds."""

    def ratio(h):
        recv = [0] * ranks
        for r in range(ranks):
            idx, _ = make_routing("skewed", TOKENS, EXPERTS, TOPK, ranks, rank_seed(seed, r), hot_fraction=1 / ranks,
                                  hot_factor=h)
            dest = idx // (EXPERTS // ranks)
            for d in range(ranks):
                recv[d] += int((dest == d).any(1).sum())
        return recv[0] / recv[1]

    lo, hi = 1.0, 64.0
    for _ in range(20):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
    h = (lo * hi) ** 0.5
    return h, ratio(h)


def kernel_us(ctx, fn, kind: str, iters: int = 20, warmup: int = 3) -> float:
    """Median device time of the `kind` kernel per call, slowest rank (CUPTI via torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    durs = [e.time_range.elapsed_us() for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and KERNEL_RE[kind].search(e.name)]
    if len(durs) < iters:
        raise RuntimeError(f"found {len(durs)} {kind} kernels in the profile, expected {iters}")
    return _slowest(ctx, statistics.median(durs))


def wall_us(ctx, fn, kind: str, iters: int = 2, warmup: int = 1) -> float:
    """The CPU dry run's timer (tests/ep_core/test_gpu_scripts_cpu.py): host time per call."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return _slowest(ctx, (time.perf_counter() - t0) / iters * 1e6)


TIMERS = {"cupti": kernel_us, "wall": wall_us}


def _slowest(ctx, us: float) -> float:
    t = torch.tensor([us], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(t.item())


def slowest_gbps(ctx, nbytes: int, us: float) -> float:
    g = torch.tensor([nbytes / us / 1e3], device=ctx.device)
    dist.all_reduce(g, op=dist.ReduceOp.MIN, group=ctx.group)
    return float(g.item())


def worker(ctx, opts):
    import ep_core

    torch.cuda.set_device(ctx.device)
    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    p = Problem(TOKENS, HIDDEN, TOPK, EXPERTS, R)
    buffer = ep_core.Buffer(ctx.group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(TOKENS, HIDDEN, R))
    hot, measured_ratio = opts["hot_factor"], opts["ratio"]
    rows, checks = [], []
    log(ctx, f"== {R} ranks, {torch.cuda.get_device_name()}; imbalance: hot factor {hot:.2f} -> rows ratio "
             f"{measured_ratio:.3f}")
    for routing, rargs in (("balanced", {}), ("imbalance 1.5x", {"hot_fraction": 1 / R, "hot_factor": hot})):
        kind = "uniform" if not rargs else "skewed"
        ins = make_all_inputs(p, kind, seed=0, device=dev, routing_args=rargs)
        mine = ins[me]
        idx = mine.topk_idx.to(ep_core.topk_idx_t)
        n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, EXPERTS)
        want = ref.dispatch([i.x for i in ins], topk_idx=[i.topk_idx for i in ins],
                            topk_weights=[i.topk_weights for i in ins], num_experts=EXPERTS)
        want_c = ref.combine([d.recv_x for d in want], [d.handle for d in want])[me][0]
        # FP8 rows and scales only: routed by is_token_in_rank (top-k outputs need weights, GPU run 1 at 4db78b1)
        wq = ref.dispatch([i.x_fp8 for i in ins], is_token_in_rank=[d.handle.is_token_in_rank for d in want])[me].recv_x
        for sms in SMS:
            base = Config(sms, 6, 256)
            _, _, _, _, handle, _ = buffer.dispatch(mine.x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank,
                                                    num_tokens_per_expert=n_exp, config=base)
            n = handle.num_recv_tokens
            for path, nbuf in PATHS:
                cfg = base.with_path(path, nbuf)
                name = path_name(path, nbuf)
                tag = f"{routing}, {sms} SMs, {name}"
                try:  # validate first: bit-exact dispatch, combine vs the reference
                    recv = buffer.dispatch(mine.x, handle=handle, config=cfg)[0]
                    assert torch.equal(recv, want[me].recv_x), "BF16 dispatch differs from the reference"
                    rq = buffer.dispatch(mine.x_fp8, handle=handle, config=cfg)[0]
                    assert torch.equal(rq[0].view(torch.uint8), wq[0].view(torch.uint8)) and torch.equal(rq[1], wq[1]), \
                        "FP8 dispatch differs from the reference"
                    comb = buffer.combine(recv, handle, config=cfg)[0]
                    diff = ref.calc_diff(comb.float(), want_c.float())
                    assert diff < 1e-6, f"combine calc_diff {diff:.3g}"
                    ok = torch.tensor([1], device=dev)
                except Exception as e:  # noqa: BLE001 (report, skip its timing, keep the others)
                    checks.append({"config": tag, "rank": me, "error": f"{type(e).__name__}: {e}",
                                   "tb": traceback.format_exc()[-2000:]})
                    ok = torch.tensor([0], device=dev)
                dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=ctx.group)
                if not int(ok):
                    log(ctx, f"  FAIL {tag}: {checks[-1]['error'] if checks else 'on the other rank'}")
                    buffer.synchronize()
                    continue
                log(ctx, f"  ok   {tag}")
                bf16 = n * HIDDEN * 2
                fp8 = n * (HIDDEN + HIDDEN // 128 * 4)
                for op, fn, nbytes in (
                        ("BF16 dispatch", lambda: buffer.dispatch(mine.x, handle=handle, config=cfg), bf16),
                        ("FP8 dispatch", lambda: buffer.dispatch(mine.x_fp8, handle=handle, config=cfg), fp8),
                        ("BF16 combine", lambda: buffer.combine(recv, handle, config=cfg), bf16)):
                    us = kernel_us(ctx, fn, "combine" if "combine" in op else "dispatch")
                    rows.append({"routing": routing, "sms": sms, "path": name, "op": op, "kernel_us": round(us, 1),
                                 "logical_GBps": round(slowest_gbps(ctx, nbytes, us), 1)})
    return {"rank": me, "rows": rows, "checks": checks, "hot_factor": hot, "ratio": measured_ratio}


def table(rows: list) -> str:
    out = ["| routing | op | SMs | " + " | ".join(path_name(*p) for p in PATHS) + " | target |",
           "| --- | --- | --- | " + " | ".join("---" for _ in PATHS) + " | --- |"]
    keys = sorted({(r["routing"], r["op"], r["sms"]) for r in rows}, key=lambda k: (k[0] != "balanced", k[1], k[2]))
    for routing, op, sms in keys:
        cells = []
        for p in PATHS:
            m = [r for r in rows if (r["routing"], r["op"], r["sms"], r["path"]) == (routing, op, sms, path_name(*p))]
            cells.append(f"{m[0]['logical_GBps']:.0f} GB/s ({m[0]['kernel_us']:.0f} µs)" if m else "–")
        out.append(f"| {routing} | {op} | {sms} | " + " | ".join(cells) + f" | ≥ {TARGET_GBPS[sms]:.0f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/tma-gpu-run")
    ap.add_argument("--ranks", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    hot, ratio = imbalance_hot_factor(1.5, a.ranks)
    res = run_ranks(worker, a.ranks, {"hot_factor": hot, "ratio": ratio}, timeout_s=540)
    meta = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?",
            "commit": __import__("os").environ.get("EPSCOPE_GIT_COMMIT", "unknown"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(time.time() - t0, 1)}
    (out / "tma_bench.json").write_text(json.dumps({"meta": meta, "ranks": res}, indent=1))
    for r in res:
        for c in r["checks"]:
            print(f"CHECK FAILED rank {c['rank']} {c['config']}: {c['error']}\n{c['tb']}")
    print(f"\n## ep_core direct vs bulk-copy (TMA) path, {a.ranks}x{meta['gpu']}, commit {meta['commit']}, "
          f"{meta['date']}; imbalance ratio {res[0]['ratio']:.3f}\n")
    print(table(res[0]["rows"]))


if __name__ == "__main__":
    main()
