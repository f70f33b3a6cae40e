"""ep_core intranode dispatch / combine: kernel time, host cost, tight loop, CUDA-graph replay and
recording overhead per op and SM count, beside DeepEP V1, in one run.

    python benchmarks/bench_ep.py --ranks 2 --out $OUT           # the shape of issue 3, ~1-2 min
    python benchmarks/bench_ep.py --ranks 2 --deepep third_party/DeepEP   # DeepEP built beside it
    python benchmarks/bench_ep.py --ranks 2 --sweep-chunks        # also retune the Config tables

One process per GPU (ep_core.launch, no torchrun). Per rank: `--sets` rotating input sets (uniform
routing, seed = set * 1000 + rank), every timed op validated against ep_core.reference first,
then per op (BF16 dispatch and FP8 dispatch with the handle, BF16 combine) and SM count
(benchmarks/ep_timing.py says how each is timed):
- kernel µs: device time of the op's kernel (CUPTI), mean per call;
- host µs: wall time of one call with the GPU busy ahead of it (median), what the call costs the
  host whatever the GPU does;
- event µs: the call's device span with the GPU kept busy ahead (median, p90), logical GB/s from it;
- tight µs: calls back to back with no GPU lead, per call (median of rounds): host cost shows here;
- graph µs: the op captured once in a CUDA graph and replayed back to back, per replay.
DeepEP V1's figures come from measured-facts.md (2×H200, 2026-11-30, kernel and host columns of
the side-by-side run; tight-loop figures at 64 SMs) unless `--deepep DIR` names a built DeepEP
(baselines.md): then the same measurements are taken of it in the same processes.
Recording (dispatch + combine with the handle, per SM count): compiled out, the instrumented
build with recording off, and recording on through a profile() block (pool slots, no
synchronisation); median, p90 and kernel time, and the on / compiled-out ratios.
Also: a non-cached BF16 dispatch (notify + host sync) and the NCCL all_to_all_single baseline.

Writes <out>/ep-<R>x<GPU>-<date>.md and .json (machine, commit, date); the tables print last.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.ep_timing import (HOST_CALL_ITERS, capture, graph_replay, host_calls, kernel_seconds,  # noqa: E402
                                  kernel_split, pct, tight_loop, time_op)

OPS = ("BF16 dispatch", "FP8 dispatch", "BF16 combine")
# DeepEP V1 intranode on the 2xH200 machine (measured-facts.md): logical GB/s by (op, SMs) ...
DEEPEP_GBPS = {("BF16 dispatch", 24): 362, ("FP8 dispatch", 24): 248, ("BF16 combine", 24): 289,
               ("BF16 dispatch", 64): 545, ("FP8 dispatch", 64): 464, ("BF16 combine", 64): 502}
# ... and its side-by-side run of 2026-11-30: (kernel µs, host µs) by (op, SMs), tight loop µs at 64 SMs.
DEEPEP_SIDE = {("BF16 dispatch", 24): (318, 58), ("FP8 dispatch", 24): (242, 63), ("BF16 combine", 24): (416, 60),
               ("BF16 dispatch", 64): (228, 65), ("FP8 dispatch", 64): (127, 86), ("BF16 combine", 64): (231, 50)}
DEEPEP_TIGHT = {("BF16 dispatch", 64): 296, ("BF16 combine", 64): 249}
# kernel names whose device time makes an op's "kernel µs" (substrings of the CUPTI names)
EP_KERNELS = {"BF16 dispatch": ("dispatch_kernel",), "FP8 dispatch": ("dispatch_kernel",),
              "BF16 combine": ("combine_kernel",)}
DEEPEP_KERNELS = {"BF16 dispatch": ("intranode::dispatch",), "FP8 dispatch": ("intranode::dispatch",),
                  "BF16 combine": ("intranode::combine",)}
STEP_KERNELS = ("dispatch_kernel", "combine_kernel")
PROFILE_MODES = ("compiled out", "instrumented, recording off", "recording on")


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[bench_ep {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _us(v):
    return None if v is None else v * 1e6


def _guard(rank, what, fn, default=None):
    """Run one section; a failure is logged and recorded, the run goes on (the table says n/a)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (one section's failure must not lose the others' numbers)
        log(rank, f"{what} failed: {type(e).__name__}: {e}")
        return default if default is not None else {"error": f"{type(e).__name__}: {e}"}


# ---- the per-rank benchmark ---------------------------------------------------------------------

class _Library:
    """One EP library's Buffer and the op callables of the benchmark (ep_core or DeepEP)."""

    def __init__(self, name, buffer, module, data, dconf_of, cconf_of):
        self.name, self.buffer, self.module, self.data = name, buffer, module, data
        self.dconf_of, self.cconf_of = dconf_of, cconf_of
        self.handles: dict = {}

    def prepare(self, sms: int) -> None:
        """Handles and combine inputs of every set for `sms`: a handle fixes the op's chunking."""
        dc = self.dconf_of(sms)
        hs = []
        for d in self.data:
            out = self.buffer.dispatch(d["x"], num_tokens_per_rank=d[self.name]["layout"][0],
                                       is_token_in_rank=d[self.name]["layout"][1],
                                       num_tokens_per_expert=d[self.name]["layout"][2], topk_idx=d[self.name]["idx"],
                                       topk_weights=d["w"], config=dc)
            hs.append((out[4], out[0]))
        self.handles[sms] = hs

    def op(self, name: str, sms: int, **kw):
        dc, cc = self.dconf_of(sms), self.cconf_of(sms)
        hs, data, b = self.handles[sms], self.data, self.buffer
        if name == "BF16 dispatch":
            return lambda k: b.dispatch(data[k]["x"], handle=hs[k][0], config=dc, **kw)
        if name == "FP8 dispatch":
            return lambda k: b.dispatch(data[k]["x8"], handle=hs[k][0], config=dc, **kw)
        return lambda k: b.combine(hs[k][1], hs[k][0], config=cc, **kw)


def _bench_rank(ctx, opts: dict) -> dict:
    import torch
    import torch.distributed as dist

    import ep_core
    from ep_core.config import Config, Problem
    from profiler.workflows.workload import make_all_inputs, routing_matrix, traffic

    rank, R = ctx.rank, ctx.world_size
    p = Problem(opts["tokens"], opts["hidden"], opts["topk"], opts["experts"], R)
    p8 = Problem(p.tokens, p.hidden, p.topk, p.experts, R, "fp8")
    Buffer = ep_core.Buffer
    buffer = Buffer(ctx.group, num_nvl_bytes=Buffer.get_buffer_size_hint(p.tokens, p.hidden, R, p.topk))
    sets = opts["sets"]
    log(rank, f"{R} ranks, {torch.cuda.get_device_name()}, T={p.tokens} H={p.hidden} top-{p.topk} of {p.experts}; "
              f"building {sets} input sets")
    data = []
    for k in range(sets):
        all_in = make_all_inputs(p, opts["routing"], seed=k * 1000, device=ctx.device)
        mine = all_in[rank]
        idx = mine.topk_idx.to(ep_core.topk_idx_t)
        n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, p.experts)
        data.append(dict(all_in=all_in if k == 0 else None, x=mine.x, x8=mine.x_fp8, w=mine.topk_weights,
                         counts=routing_matrix([i.topk_idx for i in all_in], p.experts),
                         ep_core=dict(idx=idx, layout=(n_rank, in_rank, n_exp))))
    d0, c0 = Buffer.get_dispatch_config(R), Buffer.get_combine_config(R)
    ep = _Library("ep_core", buffer, ep_core, data,
                  lambda sms: Config(sms, d0.num_max_nvl_chunked_send_tokens, d0.num_max_nvl_chunked_recv_tokens),
                  lambda sms: Config(sms, c0.num_max_nvl_chunked_send_tokens, c0.num_max_nvl_chunked_recv_tokens))
    _validate(ctx, ep, data, p, opts)
    deep = _guard(rank, "DeepEP setup", lambda: _deepep(ctx, opts, data, p), default={}) if opts["deepep"] else None
    if isinstance(deep, dict):
        deep = None

    def mean_traffic(prob):
        ts = [traffic(prob, d["counts"], r) for d in data for r in range(R)]
        return statistics.mean(t.logical_bytes for t in ts)

    logical = {"BF16 dispatch": mean_traffic(p), "FP8 dispatch": mean_traffic(p8), "BF16 combine": mean_traffic(p)}
    W, N = opts["warmup"], opts["iters"]
    rows, prof_rows, other = [], [], []
    for sms in opts["sms"]:
        ep.prepare(sms)
        if deep is not None:
            _guard(rank, f"DeepEP handles at {sms} SMs", lambda: deep.prepare(sms))
        for op in OPS:
            row = {"op": op, "sms": sms}
            row.update(_measure(ctx, ep, op, sms, sets, W, N, EP_KERNELS[op], graphs=True))
            if row.get("event_us"):
                row["gbps"] = logical[op] / (row["event_us"] / 1e6) / 1e9
            if deep is not None and sms in deep.handles:
                d = _guard(rank, f"DeepEP {op} at {sms} SMs",
                           lambda: _measure(ctx, deep, op, sms, sets, W, N, DEEPEP_KERNELS[op], graphs=False))
                row["deepep"] = {k: v for k, v in d.items() if k != "error"} if "error" not in d else None
            rows.append(row)
            log(rank, f"{op:<14} {sms:>3} SMs: kernel {_fmt(row.get('kernel_us'))} µs, host {_fmt(row.get('host_us'))} "
                      f"µs, event {_fmt(row.get('event_us'))} µs, tight {_fmt(row.get('tight_us'))} µs, graph "
                      f"{_fmt(row.get('graph_us'))} µs")
        prof_rows += _guard(rank, f"recording overhead at {sms} SMs",
                            lambda: _profiling_rows(ctx, ep, sms, sets, W, N, opts, p), default=[])
    # non-cached dispatch and the NCCL baseline, at the largest SM count
    sms = max(opts["sms"])

    def fresh(k):
        d = data[k]
        return buffer.dispatch(d["x"], num_tokens_per_rank=d["ep_core"]["layout"][0],
                               is_token_in_rank=d["ep_core"]["layout"][1],
                               num_tokens_per_expert=d["ep_core"]["layout"][2], topk_idx=d["ep_core"]["idx"],
                               topk_weights=d["w"], config=ep.dconf_of(sms))

    for name, fn in (("BF16 dispatch, non-cached (notify + host sync)", fresh),
                     ("NCCL all_to_all_single dispatch", lambda k: _nccl_dispatch(ctx, data[k], p))):
        r = _guard(rank, name, lambda: time_op(ctx, fn, sets, W, N))
        if isinstance(r, tuple):
            dev, host = r
            other.append({"op": name, "sms": sms if "non-cached" in name else "all",
                          "event_us": statistics.median(dev) * 1e6, "p90_us": pct(dev, 90) * 1e6,
                          "host_us": statistics.median(host) * 1e6,
                          "gbps": logical["BF16 dispatch"] / statistics.median(dev) / 1e9})
    calibration = _guard(rank, "host calibration", lambda: _calibration(ctx, data, logical, p, W, N), default=[])
    sweep = _sweep(ctx, ep, opts, sets, W, N, logical) if opts["sweep_chunks"] else []
    dist.barrier(group=ctx.group)
    return {"rank": rank, "rows": rows, "profiling": prof_rows, "other": other, "sweep": sweep,
            "calibration": calibration,
            "gpu": torch.cuda.get_device_name(), "deepep_measured": deep is not None,
            "recv_rows": logical["BF16 dispatch"] / p.row_bytes}


def _fmt(v, nd=1):
    return "n/a" if v is None else f"{v:.{nd}f}"


def _measure(ctx, lib: _Library, op: str, sms: int, sets: int, W: int, N: int, kernels, graphs: bool) -> dict:
    """One op of one library, every figure taken the same way for ep_core and DeepEP."""
    fn = lib.op(op, sms)
    dev, host = time_op(ctx, fn, sets, W, N)
    _, idle = time_op(ctx, fn, sets, min(W, 5), min(N, 30), idle=True)
    out = {"event_us": statistics.median(dev) * 1e6, "p90_us": pct(dev, 90) * 1e6,
           "host_us": statistics.median(host) * 1e6, "host_p90_us": pct(host, 90) * 1e6,
           "host_idle_us": statistics.median(idle) * 1e6,
           "kernel_us": _us(kernel_seconds(ctx, fn, sets, min(N, 30), kernels)),
           "tight_us": tight_loop(ctx, fn, sets) * 1e6,
           "host_calls": host_calls(ctx, fn, sets)}
    if graphs:
        out["graph_us"] = _guard(ctx.rank, f"graph of {op} at {sms} SMs",
                                 lambda: graph_replay(ctx, capture(lambda: fn(0))) * 1e6, default=-1.0)
        if out["graph_us"] == -1.0:
            out["graph_us"] = None
    return out


def _calibration(ctx, data, logical, p, W, N) -> list[dict]:
    """Host µs of the primitives a call is made of, timed like the ops (GPU busy ahead): what one
    allocation, one kernel launch and one event record + wait cost on this machine."""
    import torch

    rows = max(1, round(logical["BF16 dispatch"] / p.row_bytes))
    side = torch.cuda.Stream()
    ev = torch.cuda.Event()
    cur = torch.cuda.current_stream()

    def record_wait(k):
        ev.record(cur)
        side.wait_event(ev)

    prims = (("torch.empty of recv_x (caching allocator)",
              lambda k: torch.empty((rows, p.hidden), dtype=torch.bfloat16, device=ctx.device)),
             ("one kernel launch (torch.cuda._sleep(1))", lambda k: torch.cuda._sleep(1)),
             ("event record + stream wait", record_wait))
    out = []
    for name, fn in prims:
        _, host = time_op(ctx, fn, 1, W, N)
        out.append({"what": name, "host_us": statistics.median(host) * 1e6, "host_calls": host_calls(ctx, fn, 1)})
    cur.wait_stream(side)
    return out


def _validate(ctx, ep: _Library, data, p, opts) -> None:
    """Every timed op of ep_core against ep_core.reference (set 0), at every SM count."""
    import torch

    from ep_core import reference as ref

    log(ctx.rank, "validating ep_core against ep_core.reference (set 0)")
    rank, d0 = ctx.rank, data[0]
    all_in = d0["all_in"]
    kw = dict(topk_idx=[i.topk_idx for i in all_in], topk_weights=[i.topk_weights for i in all_in],
              num_experts=p.experts)
    want = ref.dispatch([i.x for i in all_in], **kw)
    want8 = ref.dispatch([i.x_fp8 for i in all_in], **kw)
    wc = ref.combine([w.recv_x for w in want], [w.handle for w in want])[rank][0]
    for sms in opts["sms"]:
        ep.prepare(sms)
        handle, recv = ep.handles[sms][0]
        assert torch.equal(recv, want[rank].recv_x), f"rank {rank}: BF16 dispatch at {sms} SMs differs"
        got = ep.op("BF16 dispatch", sms)(0)[0]
        assert torch.equal(got, want[rank].recv_x), f"rank {rank}: cached BF16 dispatch at {sms} SMs differs"
        q, s = ep.op("FP8 dispatch", sms)(0)[0]
        assert torch.equal(q.view(torch.uint8), want8[rank].recv_x[0].view(torch.uint8)) and \
            torch.equal(s, want8[rank].recv_x[1]), f"rank {rank}: FP8 dispatch at {sms} SMs differs"
        comb = ep.op("BF16 combine", sms)(0)[0]
        diff = ref.calc_diff(comb.float(), wc.float())
        assert diff < 1e-6, f"rank {rank}: combine at {sms} SMs differs from the reference (diff {diff:.3g})"
    assert torch.equal(_nccl_dispatch(ctx, d0, p), want[rank].recv_x), f"rank {rank}: NCCL baseline rows differ"
    d0["all_in"] = None
    torch.cuda.synchronize()


def _profiling_rows(ctx, ep: _Library, sms: int, sets, W, N, opts, p) -> list[dict]:
    """Dispatch + combine with the handle: compiled out, instrumented with recording off,
    recording on (a Session's profile() block; never saved: filling the buffers is what costs)."""
    import tempfile

    import torch

    from profiler.record.session import Session

    buffer = ep.buffer
    dispatch, combine = ep.op("BF16 dispatch", sms), ep.op("BF16 combine", sms)
    pd, pc = ep.op("BF16 dispatch", sms, profile=True), ep.op("BF16 combine", sms, profile=True)

    def step(k):
        dispatch(k)
        combine(k)

    def step_on(k):
        pd(k)
        pc(k)

    # Recording on: capacity 1024 records per warp caps the work-split bound (ep_core/buffer.py
    # _prof_geometry); device memory for every profiled launch of the run stays on the GPU (no
    # collect inside the timed loops: that would synchronise). Each profile block announces its
    # calls (2 per step: time_op's warm-up + timed steps, kernel_split's, host_calls'), so each
    # kernel's profile buffers are allocated, zeroed and stamped once per block, by the block's
    # entry or its warm step, before anything is timed (at b28d6ee a new slab every 32 launches
    # put a cudaMalloc, a fill and a header copy into one profiled call in 30).
    tmp = tempfile.mkdtemp(prefix="bench-ep-prof-")
    session = Session(tmp, name="bench", description="bench_ep recording overhead", rank=ctx.rank,
                      world_size=ctx.world_size, group=ctx.group, capacity=1024, max_device_bytes=32 << 30,
                      workload={"kind": "ep", **p.to_dict()})
    calls = 2 * (1 + W + N + min(N, 30) + HOST_CALL_ITERS)

    @contextlib.contextmanager
    def mode_ctx(mode):
        if mode == PROFILE_MODES[1]:
            buffer.use_instrumented_build(True)
            try:
                yield step
            finally:
                buffer.use_instrumented_build(False)
        elif mode == PROFILE_MODES[2]:
            with buffer.profile(session, calls=calls):
                step_on(0)
                torch.cuda.synchronize()
                yield step_on
        else:
            yield step

    # Two rounds, the second in reverse order (run 3 at b28d6ee: at 64 SMs the compiled-out and
    # recording-off steps took 387 µs of kernel time, 27 µs under the same rows of run 2 and
    # under their ops' sum, while recording on stayed at 416: a state that one order may favour
    # shows as a difference between the rounds); the "both" rows pool the two rounds' samples.
    out, pooled = [], {}
    for rnd, order in enumerate((PROFILE_MODES, PROFILE_MODES[::-1]), start=1):
        for mode in order:
            with mode_ctx(mode) as fn:
                dev, host = time_op(ctx, fn, sets, W, N)
                split = kernel_split(ctx, fn, sets, min(N, 30), STEP_KERNELS)
                hc = host_calls(ctx, fn, sets)
            pd_ = pooled.setdefault(mode, {"dev": [], "host": [], "kernel": [], "split": []})
            pd_["dev"] += dev
            pd_["host"] += host
            row = {"sms": sms, "mode": mode, "round": rnd, "median_us": statistics.median(dev) * 1e6,
                   "p90_us": pct(dev, 90) * 1e6, "host_us": statistics.median(host) * 1e6,
                   "kernel_us": _us(None if split is None else sum(split.values())),
                   "kernel_split_us": None if split is None else {k: v * 1e6 for k, v in split.items()},
                   "host_calls": hc}
            if split is not None:
                pd_["split"].append(row["kernel_split_us"])
            out.append(row)
            log(ctx.rank, f"dispatch+combine {sms} SMs, round {rnd}, {mode}: median {row['median_us']:.1f} µs, p90 "
                          f"{row['p90_us']:.1f}, kernel {_fmt(row['kernel_us'])} ({_split_text(row)}), "
                          f"host {row['host_us']:.1f}")
    for mode in PROFILE_MODES:
        d = pooled[mode]
        split = ({k: statistics.mean(s[k] for s in d["split"]) for k in STEP_KERNELS}
                 if len(d["split"]) == 2 else None)
        out.append({"sms": sms, "mode": mode, "round": "both", "median_us": statistics.median(d["dev"]) * 1e6,
                    "p90_us": pct(d["dev"], 90) * 1e6, "host_us": statistics.median(d["host"]) * 1e6,
                    "kernel_us": None if split is None else sum(split.values()), "kernel_split_us": split,
                    "host_calls": next(r["host_calls"] for r in out if r["mode"] == mode and r["round"] == 2)})
    # the session is never saved: its slabs are freed with it on return
    return out


def _split_text(row: dict) -> str:
    """'dispatch 196.5 + combine 217.8' from a recording row's per-kernel times."""
    sp = row.get("kernel_split_us")
    if not sp:
        return "n/a"
    return " + ".join(f"{k.replace('_kernel', '')} {v:.1f}" for k, v in sp.items())


def _deepep(ctx, opts: dict, data, p):
    """DeepEP V1 (built per baselines.md, importable from --deepep) beside ep_core, same inputs."""
    import importlib

    import torch

    if opts["deepep"] not in sys.path:
        sys.path.insert(0, opts["deepep"])
    deep_ep = importlib.import_module("deep_ep")
    R = ctx.world_size
    hidden_bytes = p.hidden * 2
    nvl = max(deep_ep.Config(24, 6, 256, 6, 128).get_nvl_buffer_size_hint(hidden_bytes, R),
              deep_ep.Config(64, 6, 256, 6, 128).get_nvl_buffer_size_hint(hidden_bytes, R))
    buf = deep_ep.Buffer(ctx.group, nvl, 0)
    for d in data:
        idx = d["ep_core"]["idx"].to(deep_ep.topk_idx_t) if hasattr(deep_ep, "topk_idx_t") else d["ep_core"]["idx"]
        n_rank, _, n_exp, in_rank, _ = buf.get_dispatch_layout(idx, p.experts)
        d["deep_ep"] = dict(idx=idx, layout=(n_rank, in_rank, n_exp))
    torch.cuda.synchronize()

    def conf(kind):
        def make(sms):
            deep_ep.Buffer.set_num_sms(sms)
            return (deep_ep.Buffer.get_dispatch_config if kind == "d" else deep_ep.Buffer.get_combine_config)(R)
        return make

    return _Library("deep_ep", buf, deep_ep, data, conf("d"), conf("c"))


def _sweep(ctx, ep: _Library, opts, sets, W, N, logical) -> list[dict]:
    from ep_core.config import Config

    out = []
    base_d, base_c = ep.dconf_of, ep.cconf_of
    try:
        for sms in opts["sms"]:
            for chunk in opts["chunks"]:
                ep.dconf_of = lambda s, c=chunk: Config(s, c, 256)
                ep.cconf_of = lambda s, c=chunk: Config(s, c, 256)
                ep.prepare(sms)
                td = statistics.median(time_op(ctx, ep.op("BF16 dispatch", sms), sets, W, N)[0])
                tc = statistics.median(time_op(ctx, ep.op("BF16 combine", sms), sets, W, N)[0])
                out.append(dict(sms=sms, chunk=chunk, dispatch_us=td * 1e6, combine_us=tc * 1e6,
                                dispatch_gbps=logical["BF16 dispatch"] / td / 1e9,
                                combine_gbps=logical["BF16 combine"] / tc / 1e9))
                log(ctx.rank, f"sweep {sms} SMs chunk {chunk}: dispatch {td * 1e6:.1f} us, combine {tc * 1e6:.1f} us")
    finally:
        ep.dconf_of, ep.cconf_of = base_d, base_c
    return out


# ---- NCCL baseline ------------------------------------------------------------------------------

def _nccl_dispatch(ctx, d, p):
    """The DeepEP-less way: exchange counts, pack the rows per destination, all_to_all_single."""
    import torch
    import torch.distributed as dist

    R = ctx.world_size
    in_rank = d["layout"][1] if "layout" in d else d["ep_core"]["layout"][1]
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
    ap.add_argument("--deepep", default=None, metavar="DIR",
                    help="a built DeepEP V1 (baselines.md): measure it beside ep_core instead of quoting measured-facts")
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


def _ratio(a, b, nd=3):
    return f"{a / b:.{nd}f}×" if a and b else "n/a"


def format_tables(r0: dict, ranks: int) -> str:
    """The op table (ep_core beside DeepEP), the recording table and the other rows, markdown."""
    measured = r0.get("deepep_measured")
    src = "measured in this run" if measured else "measured-facts.md, 2026-11-30"
    L = [f"### Per op (DeepEP V1: {src})", "",
         "| op | SMs | kernel µs ep_core | kernel µs DeepEP | host µs ep_core | host µs DeepEP | event µs (p90) "
         "| GB/s | tight µs/call ep_core | tight µs/call DeepEP | graph replay µs |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in r0["rows"]:
        key = (r["op"], r["sms"])
        if measured:
            d = r.get("deepep") or {}
            dk, dh, dt = d.get("kernel_us"), d.get("host_us"), d.get("tight_us")
        else:
            dk, dh = DEEPEP_SIDE.get(key, (None, None)) if ranks == 2 else (None, None)
            dt = DEEPEP_TIGHT.get(key) if ranks == 2 else None
        L.append(f"| {r['op']} | {r['sms']} | {_fmt(r.get('kernel_us'))} | {_fmt(dk)} | {_fmt(r.get('host_us'))} | "
                 f"{_fmt(dh)} | {_fmt(r.get('event_us'))} ({_fmt(r.get('p90_us'), 0)}) | {_fmt(r.get('gbps'))} | "
                 f"{_fmt(r.get('tight_us'))} | {_fmt(dt)} | {_fmt(r.get('graph_us'))} |")
    L += ["", "### Recording: dispatch + combine with the handle", "",
          "Two rounds per SM count, the second in reverse mode order; \"both\" pools their per-iteration "
          "samples (median, p90) and averages their kernel times: the ratios to judge by.", "",
          "| SMs | round | mode | median µs | p90 µs | kernel µs (dispatch + combine) | host µs | median / compiled out "
          "| p90 / compiled out | kernel / compiled out | host: inside one dispatch + combine (profiled) |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = {(r["sms"], r.get("round", 1)): r for r in r0["profiling"] if r["mode"] == PROFILE_MODES[0]}
    for r in r0["profiling"]:
        b = base.get((r["sms"], r.get("round", 1)), {})
        cell = _calls_cell(r.get("host_calls"), top=4) if r.get("round", 1) != "both" else "(round 2's)"
        L.append(f"| {r['sms']} | {r.get('round', 1)} | {r['mode']} | {r['median_us']:.1f} | {r['p90_us']:.1f} | "
                 f"{_fmt(r['kernel_us'])} ({_split_text(r)}) | {r['host_us']:.1f} | "
                 f"{_ratio(r['median_us'], b.get('median_us'))} | {_ratio(r['p90_us'], b.get('p90_us'))} | "
                 f"{_ratio(r['kernel_us'], b.get('kernel_us'))} | {cell} |")
    L += _host_tables(r0)
    if r0["other"]:
        L += ["", "### Other rows", "", "| op | SMs | event µs (p90) | host µs | GB/s |", "| --- | --- | --- | --- | --- |"]
        L += [f"| {r['op']} | {r['sms']} | {r['event_us']:.1f} ({r['p90_us']:.0f}) | {r['host_us']:.1f} | "
              f"{r['gbps']:.1f} |" for r in r0["other"]]
    if r0.get("sweep"):
        L += ["", "### Send chunk sweep (BF16, with the handle)", "",
              "| SMs | chunk | dispatch µs | GB/s | combine µs | GB/s |", "| --- | --- | --- | --- | --- | --- |"]
        L += [f"| {s['sms']} | {s['chunk']} | {s['dispatch_us']:.1f} | {s['dispatch_gbps']:.1f} | "
              f"{s['combine_us']:.1f} | {s['combine_gbps']:.1f} |" for s in r0["sweep"]]
    return "\n".join(L)


def _calls_cell(hc: dict | None, top: int = 7) -> str:
    """'cudaLaunchKernel 2 × 3.1 µs, aten::empty 1 × 2.0 µs, ...; 9.3 of 14.0 µs' (per op)."""
    if not hc:
        return "n/a"
    items = [(k, n, us) for k, (n, us) in hc.items() if k != "_wall"]
    shown = ", ".join(f"{k} {n:g} × {us / n:.1f} µs" for k, n, us in items[:top] if n)
    inside = sum(us for k, _, us in items if not k.startswith("aten::"))  # aten ops contain their cuda calls
    return f"{shown}; cuda* {inside:.1f} of {hc['_wall'][1]:.1f} µs"


def _host_tables(r0: dict) -> list[str]:
    """Where a call's host time goes, both libraries measured alike (ep_timing.host_calls)."""
    rows = r0.get("rows", [])
    if not any(r.get("host_calls") or (r.get("deepep") or {}).get("host_calls") for r in rows) \
            and not r0.get("calibration"):
        return []
    L = ["", "### Host time per call: where it goes", "",
         "Host µs with the GPU busy ahead (as in the op table) and idle (the host waits for the GPU before each "
         "call: no queued work); then, under the PyTorch profiler (which adds its own cost per call), the CUDA "
         "API calls and torch ops inside one call, count × µs each, and the cuda* total against the call's "
         "profiled wall time.", "",
         "| op | SMs | library | host µs (busy) | host µs (idle) | inside one call (profiled) |",
         "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        libs = [("ep_core", r)] + ([("DeepEP", r["deepep"])] if r.get("deepep") else [])
        for name, d in libs:
            L.append(f"| {r['op']} | {r['sms']} | {name} | {_fmt(d.get('host_us'))} | {_fmt(d.get('host_idle_us'))} | "
                     f"{_calls_cell(d.get('host_calls'))} |")
    if r0.get("calibration"):
        L += ["", "### Host calibration: the primitives, timed like the ops", "",
              "| primitive | host µs | inside (profiled) |", "| --- | --- | --- |"]
        L += [f"| {c['what']} | {c['host_us']:.1f} | {_calls_cell(c.get('host_calls'))} |" for c in r0["calibration"]]
    return L


def main(argv=None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from ep_core.launch import run_ranks
    from profiler.record.session import git_info

    opts = dict(tokens=a.tokens, hidden=a.hidden, topk=a.topk, experts=a.experts, routing=a.routing, sms=a.sms,
                warmup=a.warmup, iters=a.iters, sets=a.sets, sweep_chunks=a.sweep_chunks, chunks=a.chunks,
                deepep=str(Path(a.deepep).resolve()) if a.deepep else None)
    t0 = time.time()
    results = run_ranks(_bench_rank, a.ranks, opts, timeout_s=a.timeout)
    r0 = results[0]
    git = git_info()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    head = (f"ep_core intranode benchmark: {a.ranks} × {r0['gpu']}, T={a.tokens} tokens per rank, H={a.hidden}, "
            f"top-{a.topk} of {a.experts} experts, {a.routing} routing; commit {git['commit'][:12]}"
            f"{' (dirty)' if git['dirty'] else ''}, {date}; median of {a.iters} iterations after {a.warmup} "
            f"warm-up, {a.sets} rotating input sets; rank 0 receives ≈{r0['recv_rows']:.0f} rows per dispatch. "
            f"Times are the slowest rank's.")
    text = f"{head}\n\n{format_tables(r0, a.ranks)}\n"
    if not a.no_write:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        short = r0["gpu"].split()[-1] if r0["gpu"] else "GPU"  # "NVIDIA H200" -> H200
        path = out / f"ep-{a.ranks}x{short}-{date}.md"
        cmd = "python benchmarks/bench_ep.py " + " ".join(sys.argv[1:] if argv is None else argv)
        path.write_text(f"# ep_core benchmark, {a.ranks} × {r0['gpu']}, {date}\n\n"
                        f"GPU: {r0['gpu']}; commit: {git['commit']} (branch {git['branch']}, dirty={git['dirty']}); "
                        f"command: `{cmd.strip()}`; wall time {time.time() - t0:.0f} s.\n\n{text}")
        path.with_suffix(".json").write_text(json.dumps({"git": git, "date": date, "opts": opts, "rank0": r0},
                                                        indent=1, default=str) + "\n")
        print(f"wrote {path} (+ .json)", flush=True)
    print("\n" + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
