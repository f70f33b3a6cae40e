"""Host cost of ep_core.Buffer's Python side per call, on the CPU (no GPU, no extension).

    python benchmarks/bench_host.py            # table printed, result file under benchmarks/results/
    python benchmarks/bench_host.py --no-write

A one-rank Buffer over the fake extension of the CPU tests (tests/ep_core/fake_ext.py) whose
launcher returns its outputs at once, so what is timed is everything ep_core does in Python for a
call: the usability check, the plan lookup on the handle, the stream mode, the profile slots of a
profiled call, the event. The extension call itself (argument checks, the two kernel launches,
the fork/join events, the output allocations) is not in this number: benchmarks/bench_ep.py
measures the whole call on the GPU machine ("host µs" column).

Per op: the best of 5 rounds of the mean over `--calls` calls (a best-of is the cost without
the machine's noise; the GPU benchmark reports medians of the real thing)."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _Patch:
    """monkeypatch's setattr without pytest (fake_buffer replaces two module attributes)."""

    def setattr(self, obj, name, value, raising=True):
        setattr(obj, name, value)


def per_call_us(fn, calls: int, rounds: int = 5) -> float:
    for _ in range(min(calls, 500)):
        fn()
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return min(best)


def measure(calls: int) -> list[dict]:
    import torch

    from ep_core import buffer as B
    from ep_core.config import Config, Problem
    from profiler.workflows.workload import make_rank_inputs
    from profiler.record.session import Session
    from tests.ep_core.fake_ext import fake_buffer

    # one intra-op thread: the slabs' CPU memsets would otherwise leave OpenMP workers spinning on
    # the cores the timed Python runs on
    torch.set_num_threads(1)
    buf, _ = fake_buffer(compute=False, monkeypatch=_Patch())
    p = Problem(512, 1024, 8, 16, 1)
    ins = make_rank_inputs(p, "uniform", 0, seed=1)
    idx = ins.topk_idx.to(B.topk_idx_t)
    lay = buf.get_dispatch_layout(idx, p.experts)
    # 2 SMs: the Python work does not depend on the grid, and the profile slabs stay small in the
    # CPU memory that stands in for the GPU's here
    cfg = Config(2, 24, 256)
    out = buf.dispatch(ins.x, num_tokens_per_rank=lay[0], is_token_in_rank=lay[3], num_tokens_per_expert=lay[2],
                       config=cfg)
    handle, recv = out[4], out[0]
    x8 = ins.x_fp8
    rows = []
    ops = {"BF16 dispatch": lambda **kw: buf.dispatch(ins.x, handle=handle, config=cfg, **kw),
           "FP8 dispatch": lambda **kw: buf.dispatch(x8, handle=handle, config=cfg, **kw),
           "BF16 combine": lambda **kw: buf.combine(recv, handle, config=cfg, **kw)}
    for name, op in ops.items():
        rows.append({"op": name, "mode": "unprofiled", "us": per_call_us(op, calls)})
    # profiled: every call takes its profile slots from the session's pool. A new slab (one per
    # POOL_SLOTS launches of a geometry) zeroes its memory: on the GPU an asynchronous fill, here a
    # CPU memset of megabytes, so its time is taken out of the per-call figure and shown apart.
    slab_ns = []
    new_slab = Session._new_slab

    def timed_new_slab(self, pool, want=0):
        t0 = time.perf_counter_ns()
        try:
            return new_slab(self, pool, want)
        finally:
            slab_ns.append(time.perf_counter_ns() - t0)

    Session._new_slab = timed_new_slab
    try:
        with tempfile.TemporaryDirectory() as tmp:
            s = Session(tmp, name="bench-host", description="bench_host", device="cpu", capacity=8, host_pairs=0,
                        max_device_bytes=1 << 34)
            with buf.profile(s):
                n = max(calls // 4, 200)
                for name, op in ops.items():
                    slab_ns.clear()
                    t0 = time.perf_counter_ns()
                    for _ in range(n):
                        op(profile=True)
                    total = time.perf_counter_ns() - t0
                    rows.append({"op": name, "mode": "profiled", "us": (total - sum(slab_ns)) / n / 1e3,
                                 "note": f"{len(slab_ns)} slabs made in {n} calls, {sum(slab_ns) / 1e3:.0f} µs "
                                         f"(CPU memset), not in the per-call figure"})
    finally:
        Session._new_slab = new_slab
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    import datetime as dt

    from benchmarks.machine import commit, cpu_name

    rows = measure(a.calls)
    table = ["| op | mode | Python µs per call | note |", "| --- | --- | --- | --- |"]
    table += [f"| {r['op']} | {r['mode']} | {r['us']:.2f} | {r.get('note', 'best of 5 means')} |" for r in rows]
    text = "\n".join(table)
    print(text)
    if not a.no_write:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        path = out / f"host-cpu-{date}.md"
        path.write_text(f"# ep_core host cost, Python side, CPU\n\nCPU: {cpu_name()}; commit "
                        f"{commit(('ep_core', 'benchmarks/bench_host.py'))}; {date}; command: "
                        f"`python benchmarks/bench_host.py --calls {a.calls}`.\n\nPython side of one ep_core.Buffer "
                        f"call (fake one-rank extension whose launcher returns at once): mean over {a.calls} calls "
                        f"(profiled: {max(a.calls // 4, 200)}, one round), best of 5 rounds.\n\n{text}\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
