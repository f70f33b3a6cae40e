"""ep_core intranode dispatch / combine speed vs the NCCL all_to_all_single baseline, one run.

    python benchmarks/bench_ep.py --ranks 2                 # the shape of issue 3
    python benchmarks/bench_ep.py --ranks 8 --sms 24,64 --iters 200
    python benchmarks/bench_ep.py --ranks 2 --sweep-chunks  # retune the Config tables

One process per GPU (ep_core.launch, no torchrun). Per rank: build `--sets` rotating input sets
(uniform routing, seed = set * 1000 + rank), validate every timed op against ep_core.reference,
then time each op with CUDA events around it, `--warmup` + `--iters` iterations, input sets
rotating, all ranks released together by a small NCCL all-reduce before every iteration.
An iteration's time is the slowest rank's; a row reports the median over iterations.

Columns (the DeepEP intranode benchmark's conventions, measured-facts.md):
- logical GB/s: bytes of recv_x (every received row, the rank's own included; FP8 rows count
  their scales) / time; combine counts the BF16 rows it sends back, i.e. the same bytes.
- NVLink GB/s: bytes of the rows that crossed to another GPU / time.
Rows: ep_core BF16 dispatch, FP8 dispatch, BF16 combine at each `--sms` (dispatch with the
handle, as DeepEP's tuning loop times it; a non-cached BF16 dispatch with its notify and host
sync too), the NCCL baseline (counts exchange + index_select pack + payload all_to_all_single),
and profiling: recording off (compiled out), the instrumented build with recording off, and
recording on. Both the event time of the whole op (what a user leaving profiling on pays,
including zeroing the profile buffers) and the device time of the dispatch and combine kernels
from torch.profiler (CUPTI) are shown.

The table is printed last and written to benchmarks/results/ep-<R>x<GPU>-<date>.md (e.g.
ep-2xH200-2026-11-29.md) with the GPU name, commit and date (--out to change the folder,
--no-write to skip).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# DeepEP V1 intranode on this machine (measured-facts.md): logical GB/s by (op, SMs).
DEEPEP_GBPS = {("BF16 dispatch", 24): 362, ("FP8 dispatch", 24): 248, ("BF16 combine", 24): 289,
               ("BF16 dispatch", 64): 545, ("FP8 dispatch", 64): 464, ("BF16 combine", 64): 502}


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[bench_ep {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- timing -------------------------------------------------------------------------------------

# Before each timed op the stream spins this long (torch.cuda._sleep, in SM cycles at the H200's
# 1.98 GHz max clock, measured-facts.md) so the host's enqueue of the op (tens of µs of Python)
# happens while the GPU is busy and not inside the timed span. Equal on every rank.
LEAD_US = 300
SM_CLOCK_GHZ = 1.98

def time_op(ctx, fn, sets: int, warmup: int, iters: int) -> list[float]:
    """Per-iteration seconds (slowest rank) of fn(set_index), ranks started together."""
    import torch
    import torch.distributed as dist

    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(warmup + iters):
        if ctx.world_size > 1:
            dist.all_reduce(go, group=ctx.group)  # on the stream: the op below starts after every rank got here
        k = i % sets
        # keep the GPU busy while the host enqueues the op, so the timed span holds GPU work only
        torch.cuda._sleep(lead)
        if i >= warmup:
            starts[i - warmup].record()
        fn(k)
        if i >= warmup:
            ends[i - warmup].record()
    torch.cuda.synchronize()
    ms = torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)], device=ctx.device, dtype=torch.float64)
    if ctx.world_size > 1:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=ctx.group)
    return [v / 1e3 for v in ms.tolist()]


# The kernels whose device time the profiling rows compare (ep_core/csrc/dispatch.cu and
# combine.cu). The small barrier / notify kernels are left out: their time is mostly spent
# waiting for the peer rank, i.e. host skew between ranks, not work (a first run that summed every
# ep_core kernel read recording-on as 20x, which was the peer's host-side profiling prologue).
KERNEL_NAMES = ("dispatch_kernel", "combine_kernel")


def kernel_seconds(ctx, fn, sets: int, iters: int) -> float | None:
    """Device time of one dispatch kernel plus one combine kernel (mean per launch, CUPTI via
    torch.profiler), ranks released together before every iteration as in time_op; None if
    the profiler is unavailable."""
    import torch
    import torch.distributed as dist

    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(iters):
                if ctx.world_size > 1:
                    dist.all_reduce(go, group=ctx.group)
                torch.cuda._sleep(lead)
                fn(i % sets)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 (CUPTI missing or busy: say n/a rather than fail the run)
        return None
    per_name: dict[str, list[float]] = {n: [0.0, 0] for n in KERNEL_NAMES}
    for evt in prof.key_averages():
        for n in KERNEL_NAMES:
            if n in evt.key:
                dt = getattr(evt, "self_device_time_total", None)
                if dt is None:
                    dt = getattr(evt, "self_cuda_time_total", 0.0)
                per_name[n][0] += float(dt)
                per_name[n][1] += int(evt.count)
    if any(c == 0 for _, c in per_name.values()):
        return None
    return sum(t / c for t, c in per_name.values()) / 1e6


# ---- the per-rank benchmark ---------------------------------------------------------------------

def _bench_rank(ctx, opts: dict) -> dict:
    import torch
    import torch.distributed as dist

    import ep_core
    from ep_core import reference as ref
    from ep_core.config import Config, Problem
    from ep_core.workload import make_all_inputs, routing_matrix, traffic

    rank, R = ctx.rank, ctx.world_size
    p = Problem(opts["tokens"], opts["hidden"], opts["topk"], opts["experts"], R)
    p8 = Problem(p.tokens, p.hidden, p.topk, p.experts, R, "fp8")
    Buffer = ep_core.Buffer
    buffer = Buffer(ctx.group, num_nvl_bytes=Buffer.get_buffer_size_hint(p.tokens, p.hidden, R, p.topk))
    sets = opts["sets"]
    log(rank, f"{R} ranks, {torch.cuda.get_device_name()}, T={p.tokens} H={p.hidden} top-{p.topk} of {p.experts}; "
              f"building {sets} input sets")

    # inputs and layouts of every set (set k: seed k*1000 + rank); all ranks' routing for bytes
    data = []
    for k in range(sets):
        all_in = make_all_inputs(p, opts["routing"], seed=k * 1000, device=ctx.device)
        mine = all_in[rank]
        idx = mine.topk_idx.to(ep_core.topk_idx_t)
        n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, p.experts)
        counts = routing_matrix([i.topk_idx for i in all_in], p.experts)
        data.append(dict(all_in=all_in if k == 0 else None, x=mine.x, x8=mine.x_fp8, idx=idx,
                         w=mine.topk_weights, layout=(n_rank, in_rank, n_exp), counts=counts))
    dconf = Buffer.get_dispatch_config(R)
    cconf = Buffer.get_combine_config(R)

    def cfg(base: Config, sms: int, chunk: int | None = None) -> Config:
        return Config(sms, chunk or base.num_max_nvl_chunked_send_tokens, base.num_max_nvl_chunked_recv_tokens)

    def full_dispatch(k, x, config, **kw):
        d = data[k]
        return buffer.dispatch(x, num_tokens_per_rank=d["layout"][0], is_token_in_rank=d["layout"][1],
                               num_tokens_per_expert=d["layout"][2], topk_idx=d["idx"], topk_weights=d["w"],
                               config=config, **kw)

    def make_handles(config: Config) -> None:
        """Handles and combine inputs of every set, from a full dispatch with `config`: a handle
        fixes the op's token chunking for the SM count it was made with (ep_core/buffer.py
        _chunking), so the cached calls timed at an SM count use handles made at that count."""
        for k, d in enumerate(data):
            out = full_dispatch(k, d["x"], config)
            d["handle"], d["recv"], d["recv_w"] = out[4], out[0], out[2]

    make_handles(dconf)

    # ---- validate before timing (set 0 against the reference over all ranks' inputs) ----
    log(rank, "validating ep_core against ep_core.reference (set 0)")
    d0 = data[0]
    all_in = d0["all_in"]
    want = ref.dispatch([i.x for i in all_in], topk_idx=[i.topk_idx for i in all_in],
                        topk_weights=[i.topk_weights for i in all_in], num_experts=p.experts)
    want8 = ref.dispatch([i.x_fp8 for i in all_in], topk_idx=[i.topk_idx for i in all_in],
                         topk_weights=[i.topk_weights for i in all_in], num_experts=p.experts)
    for sms in opts["sms"]:
        make_handles(cfg(dconf, sms))
        got = full_dispatch(0, d0["x"], cfg(dconf, sms))
        assert torch.equal(got[0], want[rank].recv_x), f"rank {rank}: BF16 dispatch at {sms} SMs differs from the reference"
        assert torch.equal(got[1], want[rank].recv_topk_idx), f"rank {rank}: recv_topk_idx at {sms} SMs"
        cached = buffer.dispatch(d0["x8"], handle=d0["handle"], config=cfg(dconf, sms))[0]
        assert torch.equal(cached[0].view(torch.uint8), want8[rank].recv_x[0].view(torch.uint8)) and \
            torch.equal(cached[1], want8[rank].recv_x[1]), f"rank {rank}: FP8 dispatch at {sms} SMs differs"
        comb = buffer.combine(d0["recv"], d0["handle"], config=cfg(cconf, sms))[0]
        wc = ref.combine([w.recv_x for w in want], [w.handle for w in want])[rank][0]
        diff = ref.calc_diff(comb.float(), wc.float())
        assert diff < 1e-6, f"rank {rank}: combine at {sms} SMs differs from the reference (diff {diff:.3g})"
    nccl_ok = _validate_nccl(ctx, data[0], want[rank], p)
    assert nccl_ok, f"rank {rank}: the NCCL baseline's rows differ from the reference"
    del want, want8, all_in
    d0["all_in"] = None
    torch.cuda.synchronize()

    # bytes per rank, averaged over sets and ranks (every rank's own traffic)
    def mean_traffic(prob):
        ts = [traffic(prob, d["counts"], r) for d in data for r in range(R)]
        return (statistics.mean(t.logical_bytes for t in ts), statistics.mean(t.nvlink_bytes for t in ts))

    bytes_bf16, bytes8 = mean_traffic(p), mean_traffic(p8)

    rows = []
    n_rows = len(opts["sms"]) * 4 + 1 + 3
    step = [0]

    def add(op, sms, secs, nbytes, note=""):
        step[0] += 1
        med = statistics.median(secs)
        row = dict(op=op, sms=sms, us=med * 1e6, p10=_pct(secs, 10) * 1e6, p90=_pct(secs, 90) * 1e6,
                   logical=nbytes[0] / med / 1e9 if nbytes else None,
                   nvlink=nbytes[1] / med / 1e9 if nbytes else None, note=note)
        rows.append(row)
        log(rank, f"[{step[0]}/{n_rows}] {op:<34} {str(sms):>4} SMs  {row['us']:8.1f} us"
                  + (f"  {row['logical']:6.1f} GB/s logical" if nbytes else ""))

    W, N = opts["warmup"], opts["iters"]
    for sms in opts["sms"]:
        dc, cc = cfg(dconf, sms), cfg(cconf, sms)
        make_handles(dc)
        add("BF16 dispatch", sms, time_op(ctx, lambda k: buffer.dispatch(data[k]["x"], handle=data[k]["handle"],
                                                                          config=dc), sets, W, N), bytes_bf16)
        add("FP8 dispatch", sms, time_op(ctx, lambda k: buffer.dispatch(data[k]["x8"], handle=data[k]["handle"],
                                                                         config=dc), sets, W, N), bytes8)
        add("BF16 combine", sms, time_op(ctx, lambda k: buffer.combine(data[k]["recv"], data[k]["handle"],
                                                                        config=cc), sets, W, N), bytes_bf16)
        add("BF16 dispatch, non-cached", sms, time_op(ctx, lambda k: full_dispatch(k, data[k]["x"], dc), sets, W, N),
            bytes_bf16, "notify + host sync + dispatch")

    # NCCL baseline, same inputs
    add("NCCL all_to_all_single dispatch", "all",
        time_op(ctx, lambda k: _nccl_dispatch(ctx, data[k], p), sets, W, N), bytes_bf16,
        "counts exchange + index_select pack + payload")

    # profiling on vs off: BF16 cached dispatch + combine at the largest SM count
    sms = max(opts["sms"])
    dc, cc = cfg(dconf, sms), cfg(cconf, sms)
    make_handles(dc)

    def step_fn(k, profile=None):
        buffer.dispatch(data[k]["x"], handle=data[k]["handle"], config=dc, profile=profile)
        buffer.combine(data[k]["recv"], data[k]["handle"], config=cc, profile=profile)

    prof_rows = _profiling_rows(ctx, buffer, step_fn, sets, W, N, opts, p)
    for name, secs, kern, note in prof_rows:
        add(name, sms, secs, None, note)
        rows[-1]["kernel_us"] = kern * 1e6 if kern else None

    sweep = []
    if opts["sweep_chunks"]:
        for sms in opts["sms"]:
            for chunk in opts["chunks"]:
                dc, cc = cfg(dconf, sms, chunk), cfg(cconf, sms, chunk)
                make_handles(dc)
                td = statistics.median(time_op(ctx, lambda k: buffer.dispatch(data[k]["x"], handle=data[k]["handle"],
                                                                                config=dc), sets, W, N))
                tc = statistics.median(time_op(ctx, lambda k: buffer.combine(data[k]["recv"], data[k]["handle"],
                                                                               config=cc), sets, W, N))
                sweep.append(dict(sms=sms, chunk=chunk, dispatch_us=td * 1e6, combine_us=tc * 1e6,
                                  dispatch_gbps=bytes_bf16[0] / td / 1e9, combine_gbps=bytes_bf16[0] / tc / 1e9))
                log(rank, f"sweep {sms} SMs chunk {chunk}: dispatch {td * 1e6:.1f} us, combine {tc * 1e6:.1f} us")
    dist.barrier(group=ctx.group)
    return {"rank": rank, "rows": rows, "sweep": sweep, "gpu": torch.cuda.get_device_name(),
            "recv_rows": bytes_bf16[0] / p.row_bytes, "nvlink_rows": bytes_bf16[1] / p.row_bytes}


def _pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _profiling_rows(ctx, buffer, step_fn, sets, W, N, opts, p):
    """(name, per-iteration seconds, kernel seconds per iteration or None, note) rows."""
    import tempfile

    from profiler.record.session import Session

    out = []
    off = time_op(ctx, lambda k: step_fn(k), sets, W, N)
    out.append(("dispatch+combine, profiling compiled out", off, kernel_seconds(ctx, step_fn, sets, N),
                "default build"))
    # the instrumented build with recording off (null profile buffer): the runtime switch
    try:
        buffer.use_instrumented_build(True)
        null = time_op(ctx, lambda k: step_fn(k), sets, W, N)
        out.append(("dispatch+combine, instrumented, recording off", null,
                    kernel_seconds(ctx, step_fn, sets, N), "null profile buffer"))
    finally:
        buffer.use_instrumented_build(False)
    tmp = tempfile.mkdtemp(prefix="bench-ep-prof-")
    # Profile a bounded number of iterations: each fills one buffer per kernel launch. 1024
    # records per warp is far above what one dispatch or combine warp writes, so nothing drops;
    # the session is never saved (decoding is not what is measured), only its buffers are filled.
    n_prof = min(N, opts["profile_iters"])
    session = Session(tmp, name="bench", description="bench_ep profiling overhead", rank=ctx.rank,
                      world_size=ctx.world_size, group=ctx.group, capacity=1024,
                      workload={"kind": "ep", **p.to_dict()})
    with buffer.profile(session):
        on = time_op(ctx, lambda k: step_fn(k, profile=True), sets, min(W, 3), n_prof)
        kern_on = kernel_seconds(ctx, lambda k: step_fn(k, profile=True), sets, min(n_prof, 10))
    out.append(("dispatch+combine, recording on", on, kern_on, "profile buffers zeroed per launch"))
    return out


# ---- NCCL baseline ------------------------------------------------------------------------------

def _nccl_dispatch(ctx, d, p):
    """The DeepEP-less way: exchange counts, pack the rows per destination, all_to_all_single."""
    import torch
    import torch.distributed as dist

    R = ctx.world_size
    in_rank = d["layout"][1]
    send_counts = in_rank.sum(0).to(torch.int64)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ctx.group)
    counts = torch.stack([send_counts, recv_counts]).tolist()  # the host needs the split sizes
    # pack: token indices grouped by destination rank, in token order
    order = d.get("pack")
    if order is None:
        order = torch.cat([torch.nonzero(in_rank[:, r]).flatten() for r in range(R)])
        d["pack"] = order
    send = d["x"].index_select(0, order)
    recv = torch.empty((sum(counts[1]), p.hidden), dtype=d["x"].dtype, device=d["x"].device)
    dist.all_to_all_single(recv, send, output_split_sizes=counts[1], input_split_sizes=counts[0], group=ctx.group)
    return recv


def _validate_nccl(ctx, d, want, p) -> bool:
    import torch

    got = _nccl_dispatch(ctx, d, p)
    return bool(torch.equal(got, want.recv_x))


# ---- driver -------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="GPUs / ranks (1..8)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--routing", default="uniform")
    ap.add_argument("--sms", default="24,64", help="comma-separated SM counts")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--sets", type=int, default=4, help="rotating input sets")
    ap.add_argument("--profile-iters", type=int, default=20, help="iterations timed with recording on")
    ap.add_argument("--sweep-chunks", action="store_true", help="also time a range of send chunk sizes")
    ap.add_argument("--chunks", default="4,8,12,16,24,32", help="send chunk sizes for --sweep-chunks")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds before the ranks are killed")
    a = ap.parse_args(argv)
    if not 1 <= a.ranks <= 8:
        ap.error("--ranks must be in 1..8")
    a.sms = [int(s) for s in a.sms.split(",") if s]
    a.chunks = [int(s) for s in a.chunks.split(",") if s]
    return a


def format_table(rows, ranks) -> str:
    nccl = next((r for r in rows if r["op"].startswith("NCCL")), None)
    off = next((r for r in rows if "compiled out" in r["op"]), None)
    lines = ["| op | SMs | µs (median) | p10–p90 µs | logical GB/s | NVLink GB/s | vs DeepEP V1 | vs NCCL | kernel µs | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        deep = DEEPEP_GBPS.get((r["op"], r["sms"])) if ranks == 2 else None
        vs_deep = f"{r['logical'] / deep:.2f}× ({deep})" if deep and r["logical"] else ""
        vs_nccl = ""
        if nccl and r is not nccl and r["op"].startswith("BF16 dispatch"):
            vs_nccl = f"{nccl['us'] / r['us']:.2f}×"
        kern = r.get("kernel_us")
        kern_s = f"{kern:.1f}" if kern else ""
        if off and kern and off.get("kernel_us") and r is not off:
            kern_s += f" ({kern / off['kernel_us']:.3f}× off)"
        logical = "" if r["logical"] is None else f"{r['logical']:.1f}"
        nvlink = "" if r["nvlink"] is None else f"{r['nvlink']:.1f}"
        lines.append(f"| {r['op']} | {r['sms']} | {r['us']:.1f} | {r['p10']:.0f}–{r['p90']:.0f} | {logical} | "
                     f"{nvlink} | {vs_deep} | {vs_nccl} | {kern_s} | {r['note']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from ep_core.launch import run_ranks
    from profiler.record.session import git_info

    opts = dict(tokens=a.tokens, hidden=a.hidden, topk=a.topk, experts=a.experts, routing=a.routing, sms=a.sms,
                warmup=a.warmup, iters=a.iters, sets=a.sets, profile_iters=a.profile_iters,
                sweep_chunks=a.sweep_chunks, chunks=a.chunks)
    t0 = time.time()
    results = run_ranks(_bench_rank, a.ranks, opts, timeout_s=a.timeout)
    r0 = results[0]
    git = git_info()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    head = (f"ep_core intranode benchmark: {a.ranks} × {r0['gpu']}, T={a.tokens} tokens per rank, H={a.hidden}, "
            f"top-{a.topk} of {a.experts} experts, {a.routing} routing; commit {git['commit'][:12]}"
            f"{' (dirty)' if git['dirty'] else ''}, {date}; median of {a.iters} iterations after {a.warmup} "
            f"warm-up, {a.sets} rotating input sets; rank 0 receives ≈{r0['recv_rows']:.0f} rows per dispatch, "
            f"≈{r0['nvlink_rows']:.0f} over NVLink.")
    table = format_table(r0["rows"], a.ranks)
    sweep = ""
    if r0["sweep"]:
        sweep = "\n\nSend chunk sweep (BF16, cached dispatch / combine):\n\n| SMs | chunk | dispatch µs | GB/s | combine µs | GB/s |\n| --- | --- | --- | --- | --- | --- |\n"
        sweep += "\n".join(f"| {s['sms']} | {s['chunk']} | {s['dispatch_us']:.1f} | {s['dispatch_gbps']:.1f} | "
                           f"{s['combine_us']:.1f} | {s['combine_gbps']:.1f} |" for s in r0["sweep"])
    text = f"{head}\n\n{table}{sweep}\n"
    if not a.no_write:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        # "NVIDIA H200" -> H200: the file says which GPU it was measured on
        short = r0["gpu"].split()[-1] if r0["gpu"] else "GPU"
        path = out / f"ep-{a.ranks}x{short}-{date}.md"
        cmd = "python benchmarks/bench_ep.py " + " ".join(sys.argv[1:] if argv is None else argv)
        path.write_text(f"# ep_core benchmark, {a.ranks} × {r0['gpu']}, {date}\n\n"
                        f"GPU: {r0['gpu']}; commit: {git['commit']} (branch {git['branch']}, dirty={git['dirty']}); "
                        f"command: `{cmd.strip()}`; wall time {time.time() - t0:.0f} s.\n\n{text}")
        print(f"wrote {path}", flush=True)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
