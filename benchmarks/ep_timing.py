"""Timing primitives of the EP benchmark (benchmarks/bench_ep.py), one per question a user asks of
an expert-parallel op; every one releases the ranks together (a small NCCL all-reduce on the
stream) before it times, and reports the slowest rank where ranks differ.

- `time_op`: device time of one call (CUDA events around it) with the GPU kept busy ahead of the
  call (torch.cuda._sleep), so the host's enqueue is not in the span; plus the host's wall time
  of that call, which then never waits on the GPU (DeepEP's "host" convention, measured-facts.md).
- `kernel_seconds`: device time of the op's kernels alone (CUPTI through torch.profiler).
- `tight_loop`: calls issued back to back with no lead, timed with events: what a training step
  with little other work sees (host cost shows here when it exceeds the GPU's).
- `graph_replay`: the op captured once in a CUDA graph and replayed back to back.
- `host_calls`: where a call's host time goes: the CUDA runtime calls and torch ops inside it,
  counted and timed by the PyTorch profiler (CUPTI's runtime-API callbacks see every cuda* call
  of the process, the library's own included), with the GPU kept busy ahead as in `time_op`.
"""
from __future__ import annotations

import statistics
import time

# the GPU lead before each timed op, shared with `epscope ab`'s worker (why 300 µs: there)
from profiler.workflows.ab_worker import LEAD_US, SM_CLOCK_GHZ  # noqa: F401  (ll_bench imports them from here)


def _release(ctx, go) -> None:
    import torch.distributed as dist

    if ctx.world_size > 1:
        dist.all_reduce(go, group=ctx.group)  # on the stream: what follows starts after every rank got here


def _slowest(ctx, values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, device=ctx.device, dtype=torch.float64)
    if ctx.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.tolist()


def time_op(ctx, fn, sets: int, warmup: int, iters: int, idle: bool = False) -> tuple[list[float], list[float]]:
    """(per-iteration device seconds of fn(set), per-iteration host seconds of the call), slowest rank.
    idle=True: the host waits for the GPU before every call instead (no work queued ahead), so a
    call's host time cannot include waiting for room in the launch queue."""
    import torch

    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    host = []
    for i in range(warmup + iters):
        _release(ctx, go)
        k = i % sets
        if idle:
            torch.cuda.synchronize()
        else:
            torch.cuda._sleep(lead)  # the GPU is busy while the host enqueues the op
        if i >= warmup:
            starts[i - warmup].record()
        t0 = time.perf_counter_ns()
        fn(k)
        t1 = time.perf_counter_ns()
        if i >= warmup:
            ends[i - warmup].record()
            host.append((t1 - t0) / 1e9)
    torch.cuda.synchronize()
    dev = _slowest(ctx, [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)])
    return dev, _slowest(ctx, host)


def kernel_seconds(ctx, fn, sets: int, iters: int, names: tuple[str, ...]) -> float | None:
    """Device seconds per iteration of the kernels whose names contain one of `names` (mean per
    launch of each, summed; CUPTI via torch.profiler), ranks released together before every
    iteration; None if the profiler is unavailable or a kernel never ran."""
    split = kernel_split(ctx, fn, sets, iters, names)
    return None if split is None else sum(split.values())


def kernel_split(ctx, fn, sets: int, iters: int, names: tuple[str, ...]) -> dict[str, float] | None:
    """kernel_seconds per name: {name: device seconds per launch, mean}."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(iters):
                _release(ctx, go)
                torch.cuda._sleep(lead)
                fn(i % sets)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 (CUPTI missing or busy: say n/a rather than fail the run)
        return None
    per_name: dict[str, list] = {n: [0.0, 0] for n in names}
    for evt in prof.key_averages():
        for n in names:
            if n in evt.key:
                dt = getattr(evt, "self_device_time_total", None)
                if dt is None:
                    dt = getattr(evt, "self_cuda_time_total", 0.0)
                per_name[n][0] += float(dt)
                per_name[n][1] += int(evt.count)
    if any(c == 0 for _, c in per_name.values()):
        return None
    return {n: t / c / 1e6 for n, (t, c) in per_name.items()}


# Calls host_calls profiles (a caller that reserves profile buffers counts them).
HOST_CALL_ITERS = 30
# What host_calls counts inside a call: CUDA runtime / driver entry points and torch operators.
_HOST_EVENT = ("cuda", "cu", "aten::")


def host_calls(ctx, fn, sets: int, iters: int = HOST_CALL_ITERS) -> dict | None:
    """{name: [calls per op, host µs per op]} of the CUDA API calls and torch ops made inside
    fn(set) (median rank 0's view; the profiler adds its own cost to each), plus "_wall" (µs per
    op under the profiler). None if the profiler is unavailable."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        return None
    go = torch.zeros(1, device=ctx.device)
    lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(iters):
                _release(ctx, go)
                torch.cuda._sleep(lead)
                with record_function("epscope_bench_op"):
                    fn(i % sets)
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 (CUPTI missing or busy: say n/a rather than fail the run)
        return None
    events = list(prof.events())
    # by time alone: the profiler numbers its own operator threads differently from the OS thread
    # ids CUPTI reports, and the benchmark issues everything from one thread
    ops = [(e.time_range.start, e.time_range.end) for e in events if e.name == "epscope_bench_op"]
    if not ops:
        return None
    out: dict = {}
    for e in events:
        if e.name == "epscope_bench_op" or not e.name.startswith(_HOST_EVENT) or e.device_type.name != "CPU":
            continue
        t = e.time_range.start
        if any(b <= t <= end for b, end in ops):
            c = out.setdefault(e.name, [0.0, 0.0])
            c[0] += 1
            c[1] += e.time_range.end - e.time_range.start
    n = len(ops)
    res = {k: [v[0] / n, v[1] / n] for k, v in sorted(out.items(), key=lambda kv: -kv[1][1])}
    res["_wall"] = [1.0, sum(end - b for b, end in ops) / n]
    return res


def tight_loop(ctx, fn, sets: int, calls: int = 50, rounds: int = 5) -> float:
    """Median over rounds of (event time of `calls` back-to-back calls) / calls, slowest rank."""
    import torch

    go = torch.zeros(1, device=ctx.device)
    per = []
    for r in range(rounds + 1):  # round 0 warms up
        _release(ctx, go)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(calls):
            fn(i % sets)
        e.record()
        torch.cuda.synchronize()
        if r:
            per.append(s.elapsed_time(e) / 1e3 / calls)
    return statistics.median(_slowest(ctx, per))


def capture(fn):
    """fn() warmed up on a side stream (torch's recipe), then captured in a CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def graph_replay(ctx, graph, replays: int = 50, rounds: int = 5) -> float:
    """Median over rounds of (event time of `replays` back-to-back replays) / replays, slowest rank."""
    return tight_loop(ctx, lambda k: graph.replay(), 1, replays, rounds)


def pct(values, q) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]
