"""ep_core's low-latency dispatch / combine on 2 GPUs: the latency table of issue 10.

    PYTHONPATH=. python benchmarks/gpu/ll_bench.py --out $OUT            # ~1 min after the build

Shape: hidden 7168, top-8 of 256 experts, FP8 dispatch (per-128 scales), BF16 combine, uniform
routing, num_max_dispatch_tokens_per_rank = the token count of the row (DeepEP's own test does
the same), 1, 4, 16, 64, 128, 256 tokens per rank. One process per GPU (ep_core.launch).
Every row is validated against ep_core.low_latency_reference first (bit for bit), then timed with
benchmarks/ep_timing.py's primitives (ranks released together by a small all-reduce before each
timing):
- kernel µs: device time of the dispatch and of the combine kernel (CUPTI through torch.profiler,
  median per launch); it includes waiting for the other rank's data, as DeepEP's bench_kineto does;
- call µs: calls issued back to back on the current stream, event time per call: the end-to-end
  cost of a call including the host's enqueue (the host paces when it is slower than the GPU);
- graph µs: dispatch + combine captured once in a CUDA graph, replayed back to back, per pair;
- host µs: the Python call alone with the GPU busy ahead (median).
At 4 and 128 tokens the same with LowLatencyConfig.old() (seed 002's five knobs at their old
behaviour), and at 128 tokens the recording cost: kernel time compiled out, instrumented with
recording off, and recording on (profile() block, pool slots), and the ratios.
DeepEP V1's low-latency kernels on the same machine (measured-facts.md, 2026-11-30, 128 tokens):
dispatch 27.0-30.9 µs, combine 40.9-41.2 µs, dispatch + combine end to end 71.8-71.9 µs.

Writes <out>/ll-<R>x<GPU>-<date>.md and .json (machine, commit, date); the table prints last.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ep_timing import capture, graph_replay, time_op, tight_loop  # noqa: E402

TOKENS = (1, 4, 16, 64, 128, 256)
HIDDEN, TOPK, EXPERTS = 7168, 8, 256
# DeepEP V1 low-latency on this 2xH200 machine at 128 tokens (measured-facts.md, 2026-11-30)
DEEPEP_128 = {"dispatch kernel": "27.0-30.9", "combine kernel": "40.9-41.2", "pair call": "71.8-71.9"}
TARGETS_128 = {"dispatch kernel": 15.0, "combine kernel": 20.0}  # issue 10
PROFILE_MODES = ("compiled out", "instrumented, recording off", "recording on")


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[ll_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ll_kernel_us(ctx, fn, iters: int) -> dict:
    """Median device µs per launch of the low-latency dispatch and combine kernels (CUPTI), the
    slowest rank; ranks released together before every iteration. A median, not the mean: one
    launch whose peer came late waits inside the kernel for it (at 5ab00a2 the mean of 50 launches
    of the 128-token dispatch read 109.9 µs while every call took 31.7 µs by events)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.ep_timing import LEAD_US, SM_CLOCK_GHZ

    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            dist.all_reduce(go, group=ctx.group)
            torch.cuda._sleep(lead)
            fn(i)
        torch.cuda.synchronize()
    import statistics

    from torch.autograd import DeviceType

    per = {"dispatch": [], "combine": []}
    for evt in prof.events():
        if evt.device_type != DeviceType.CUDA or "low_latency" not in evt.name:
            continue
        for kind in per:
            if f"{kind}_kernel" in evt.name:
                per[kind].append(float(evt.time_range.elapsed_us()))
    med = [statistics.median(v) if v else float("nan") for v in per.values()]
    t = torch.tensor(med, device=ctx.device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return dict(zip(per, t.tolist()))


def _inputs(R: int, T: int, seed: int, dev):
    import torch

    from ep_core.routing import make_routing

    xs, idxs, ws = [], [], []
    for r in range(R):
        idx, w = make_routing("uniform", T, EXPERTS, TOPK, R, seed * 1000 + r)
        g = torch.Generator().manual_seed(seed * 1000 + r)
        xs.append(torch.randn((T, HIDDEN), generator=g).to(torch.bfloat16).to(dev))
        idxs.append(idx.to(dev))
        ws.append(w.to(dev))
    return xs, idxs, ws


def _validate(ctx, buffer, T: int, xs, idxs, ws, config) -> tuple[object, list[str]]:
    """One dispatch + combine against the reference, bit for bit: (this rank's expert outputs, what
    differs, ep_core.low_latency_diff's findings: empty when right)."""
    import torch

    from ep_core import low_latency_reference as ref
    from ep_core.low_latency_diff import DispatchResult, combine_diff, dispatch_diff

    rank = ctx.rank
    disp = ref.dispatch(xs, idxs, EXPERTS, T, use_fp8=True)
    ys = [ref.expert_outputs(d, HIDDEN, True, seed=T, rank=r) for r, d in enumerate(disp)]
    want = ref.combine(ys, disp, idxs, ws)[rank]
    recv, count, handle, _, _ = buffer.low_latency_dispatch(xs[rank], idxs[rank], T, EXPERTS, config=config)
    out, _, _ = buffer.low_latency_combine(ys[rank], idxs[rank], ws[rank], handle, config=config)
    torch.cuda.synchronize()
    found = dispatch_diff(DispatchResult.of(recv, count, handle), disp[rank], [x.size(0) for x in xs], rank)
    found += combine_diff(out, want)
    return ys[rank], [f"rank {rank}, {T} tokens, {config}: {f}" for f in found]


def _row(ctx, buffer, T: int, config, opts) -> dict:
    import torch

    R, rank = ctx.world_size, ctx.rank
    xs, idxs, ws = _inputs(R, T, seed=T, dev=ctx.device)
    y, wrong = _validate(ctx, buffer, T, xs, idxs, ws, config)
    name = "new" if config.host == "cached" and config.split == "flat" else "old"
    if _any_rank(ctx, bool(wrong)):
        # not timing a wrong kernel; the other sizes still run (each row is a separate finding)
        log(rank, f"{T} tokens ({name}): results differ from the reference; not timed")
        return {"tokens": T, "config": name, "wrong": wrong}
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    state = {}

    def dispatch(_):
        state["h"] = buffer.low_latency_dispatch(x, idx, T, EXPERTS, config=config)[2]

    def combine(_):
        buffer.low_latency_combine(y, idx, w, state["h"], config=config)

    def pair(k):
        dispatch(k)
        combine(k)

    pair(0)
    torch.cuda.synchronize()
    kern = ll_kernel_us(ctx, pair, opts.iters)
    row = {"tokens": T, "config": name, "wrong": [],
           "dispatch kernel": kern["dispatch"], "combine kernel": kern["combine"],
           "dispatch call": tight_loop(ctx, dispatch, 1, opts.calls) * 1e6,
           "combine call": tight_loop(ctx, combine, 1, opts.calls) * 1e6,
           "pair call": tight_loop(ctx, pair, 1, opts.calls) * 1e6}
    _, host_d = time_op(ctx, dispatch, 1, 3, opts.iters)
    _, host_c = time_op(ctx, combine, 1, 3, opts.iters)
    row["dispatch host"] = statistics.median(host_d) * 1e6
    row["combine host"] = statistics.median(host_c) * 1e6
    graph = capture(lambda: pair(0))
    row["pair graph"] = graph_replay(ctx, graph, replays=opts.calls) * 1e6
    del graph
    torch.cuda.synchronize()
    return row


def _recording_rows(ctx, buffer, T: int, opts) -> list[dict]:
    import torch
    import torch.distributed as dist

    from ep_core import _ext
    from ep_core import low_latency as ll
    from profiler.record.session import Session

    R, rank = ctx.world_size, ctx.rank
    xs, idxs, ws = _inputs(R, T, seed=T, dev=ctx.device)
    y, wrong = _validate(ctx, buffer, T, xs, idxs, ws, ll.LowLatencyConfig())
    if _any_rank(ctx, bool(wrong)):
        log(rank, f"recording cost at {T} tokens: results differ from the reference; not timed")
        return []
    x, idx, w = xs[rank], idxs[rank], ws[rank]
    _ext.load(profile=True)

    def pair(_):
        h = buffer.low_latency_dispatch(x, idx, T, EXPERTS)[2]
        buffer.low_latency_combine(y, idx, w, h)

    rows = []
    for mode in PROFILE_MODES:
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        if mode == "recording on":
            session = Session(opts.out, name=f"ll-recording-cost-r{rank}", description="discarded", rank=rank,
                              world_size=R, group=ctx.group, capacity=512)
            with buffer.profile(session):
                pair(0)  # first slabs of the pool, outside the timing
                kern = ll_kernel_us(ctx, pair, opts.iters)
            del session  # never saved: only the kernel times matter here
        else:
            buffer.use_instrumented_build(mode != "compiled out")
            pair(0)
            kern = ll_kernel_us(ctx, pair, opts.iters)
            buffer.use_instrumented_build(False)
        rows.append({"mode": mode, "dispatch kernel": kern["dispatch"], "combine kernel": kern["combine"]})
    return rows


def _any_rank(ctx, flag: bool) -> bool:
    """Whether any rank says so (the ranks must agree on what they time next)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return bool(t.item())


def _bench_rank(ctx, opts) -> dict:
    import torch

    import ep_core
    from ep_core import low_latency as ll

    rank, R = ctx.rank, ctx.world_size
    size = ep_core.Buffer.get_low_latency_rdma_size_hint(max(opts.tokens), HIDDEN, R, EXPERTS)
    buffer = ep_core.Buffer(ctx.group, num_rdma_bytes=size, low_latency_mode=True)
    new = ll.LowLatencyConfig()
    old = ll.LowLatencyConfig.old()
    rows = []
    for T in opts.tokens:
        log(rank, f"{T} tokens per rank")
        rows.append(_row(ctx, buffer, T, new, opts))
        if T in opts.old_at:
            rows.append(_row(ctx, buffer, T, old, opts))
    log(rank, f"recording cost at {opts.recording_tokens} tokens")
    rec = _recording_rows(ctx, buffer, opts.recording_tokens, opts)
    buffer._ll.synchronize()
    return {"rank": rank, "rows": rows, "recording": rec, "gpu": torch.cuda.get_device_name(),
            "config": new.to_dict()}


def _f(v, nd=1):
    return "n/a" if v is None or v != v else f"{v:.{nd}f}"


def format_table(r0: dict) -> str:
    cols = ("dispatch kernel", "combine kernel", "dispatch call", "combine call", "pair call", "pair graph",
            "dispatch host", "combine host")
    lines = ["| tokens/rank | config | " + " | ".join(f"{c} µs" for c in cols) + " |",
             "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for r in r0["rows"]:
        if "dispatch kernel" not in r:  # differs from the reference on some rank: not timed
            lines.append(f"| {r['tokens']} | {r['config']} | " + " | ".join("WRONG" for _ in cols) + " |")
            continue
        lines.append(f"| {r['tokens']} | {r['config']} | " + " | ".join(_f(r[c]) for c in cols) + " |")
        if r["tokens"] == 128 and r["config"] == "new":
            lines.append("| 128 | DeepEP V1 LL (measured-facts) | " + " | ".join(
                DEEPEP_128.get(c, "–") for c in cols) + " |")
    lines += ["", f"targets at 128 tokens (issue 10): dispatch kernel <= {TARGETS_128['dispatch kernel']:g} µs, "
                  f"combine kernel <= {TARGETS_128['combine kernel']:g} µs", "",
              "| recording | dispatch kernel µs | combine kernel µs | dispatch vs compiled out | combine vs compiled out |",
              "| --- | --- | --- | --- | --- |"]
    if not r0["recording"]:
        lines.append("| (not timed: the results differ from the reference) | | | | |")
    base = r0["recording"][0] if r0["recording"] else None
    for m in r0["recording"]:
        lines.append(f"| {m['mode']} | {_f(m['dispatch kernel'], 2)} | {_f(m['combine kernel'], 2)} | "
                     f"{_f(m['dispatch kernel'] / base['dispatch kernel'], 3)}x | "
                     f"{_f(m['combine kernel'] / base['combine kernel'], 3)}x |")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the .md / .json results")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=lambda s: tuple(int(v) for v in s.split(",")), default=TOKENS)
    ap.add_argument("--old-at", type=lambda s: tuple(int(v) for v in s.split(",")) if s else (), default=(4, 128),
                    help="token counts that also get a LowLatencyConfig.old() row")
    ap.add_argument("--recording-tokens", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50, help="timed iterations of the kernel and host columns")
    ap.add_argument("--calls", type=int, default=100, help="back-to-back calls / replays per round")
    ap.add_argument("--timeout", type=float, default=420.0)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    from ep_core.launch import run_ranks
    from profiler.record.session import git_info

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = run_ranks(_bench_rank, opts.ranks, opts, timeout_s=opts.timeout)
    r0 = res[0]
    git = git_info()
    date = _dt.date.today().isoformat()
    head = (f"# ep_core low-latency dispatch / combine, {opts.ranks} x {r0['gpu']}\n\n"
            f"commit {git['commit']}{' (dirty)' if git['dirty'] else ''}; {date}; "
            f"hidden {HIDDEN}, top-{TOPK} of {EXPERTS}, FP8 dispatch, BF16 combine, "
            f"T_max = tokens; config {r0['config']}; {time.time() - t0:.0f} s\n")
    table = format_table(r0)
    name = f"ll-{opts.ranks}x{r0['gpu'].replace(' ', '')}-{date}"
    (out / f"{name}.md").write_text(head + "\n" + table + "\n")
    (out / f"{name}.json").write_text(json.dumps({"git": git, "date": date, "ranks": res}, indent=1))
    print(head)
    print(table, flush=True)
    wrong = [w for r in res for row in r["rows"] for w in row.get("wrong", [])]
    if wrong:
        (out / f"{name}-wrong.txt").write_text("\n".join(wrong) + "\n")
        print(f"\n{len(wrong)} differences from the reference (rows marked WRONG were not timed):")
        print("\n".join(wrong[:40]), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
