"""Issue 11's measurements in one run on 2 GPUs, tables printed last:

1. Kernel table: the direct path against the pipelined bulk-copy path (N = 1, 2, 3 staging
   buffers per warp), BF16 dispatch, FP8 dispatch and BF16 combine, at 24 and 64 SMs, balanced
   and under a 1.5x rank imbalance.
2. Hook table: hook mode (`return_recv_hook=True`) against normal mode (direct, and tma N=3)
   with an 8192 x 8192 BF16 matmul on the compute stream while the op's data moves: the kernel
   time of send + receive, the send-to-hook-return time without the matmul, the matmul's
   slowdown against running alone, and the SMs ep_core held while the copy engines moved the
   rows.

    PYTHONPATH=. python benchmarks/gpu/tma_bench.py --out $OUT        # 2 GPUs, ~3 min after the build

Validates before it times (style rule 11): every (path, SMs, routing) first compares a cached
BF16 and FP8 dispatch bit-exactly with the PyTorch reference and its combine with calc_diff <
1e-6 (hook mode likewise, at each SM count); a failing configuration is reported and not timed.

Definitions (both tables; CUPTI device times through torch.profiler, medians over the timed
calls, slowest rank):
- kernel time: the op's data kernels (dispatch / combine; in hook mode the send's pack kernel,
  the signal kernel and the receive kernel). The start barrier before each op is not counted
  (measured-facts.md's "kernel" column counts the same kernels).
- logical GB/s: bytes of the rank's recv_x (own rows included; FP8 counts its scales) / time.
- send-to-return: from the op's first kernel (the barrier) to the end of its last (the receive
  in hook mode), the hook called right after the send (no matmul): the issue's "from send to
  hook return".
- matmul slowdown: the matmul kernels' time inside the overlapped op / alone - 1.
- SMs held during the transfer: normal mode moves the rows inside its kernel, so it holds its
  `num_sms` for the whole kernel; hook mode: the most ep_core thread blocks resident at once
  while the copy engines' peer copies were in flight (from the trace: the kernels overlapping
  the copies, each counted with its grid: data kernels num_sms blocks, barrier and signal 1).
Imbalance: skewed routing with rank 0's experts hot, the hot factor bisected on the CPU so that
rank 0 receives 1.5x the rows of rank 1 (the measured ratio is printed).

The CPU dry run (tests/ep_core/test_gpu_scripts_cpu.py) runs this file's worker on a
reference-backed Buffer over gloo with `--timer wall`: host clocks and synthetic kernel records,
so the orchestration and the analysis run; its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ep_core import reference as ref  # noqa: E402
from ep_core.config import Config, Problem  # noqa: E402
from ep_core.launch import run_ranks  # noqa: E402
from ep_core.routing import make_routing  # noqa: E402
from profiler.workflows.workload import make_all_inputs, rank_seed  # noqa: E402

ISSUE_SHAPE = {"tokens": 4096, "hidden": 7168, "topk": 8, "experts": 256}
PATHS = (("direct", 3), ("tma", 1), ("tma", 2), ("tma", 3))
SMS = (24, 64)
TARGET_GBPS = {64: 700.0, 24: 545.0}  # issue 11
HOOK_TARGET_GBPS = 600.0               # issue 11: send to hook return
HOOK_MAX_SMS = 4                       # issue 11: SMs held during the transfer
GEMM_N = 8192                          # issue 11: an 8192 x 8192 BF16 matmul on the compute stream
NORMAL_MODES = (("normal", "direct", 3), ("normal", "tma", 3))
ITERS, WARMUP = 20, 3
HOOK_ITERS = 8

# kernels by name (CUPTI names are the demangled functions of ep_core/csrc/*.cu)
DATA_RE = re.compile(r"(dispatch|combine)(_tma)?_kernel")
SIGNAL_RE = re.compile(r"signal_kernel")
OPEN_RE = re.compile(r"barrier_kernel|notify_kernel")
KIND_RE = {"dispatch": re.compile(r"dispatch(_tma)?_kernel"), "combine": re.compile(r"combine(_tma)?_kernel")}


def log(ctx, *a):
    if ctx.rank == 0:
        print(*a, flush=True)


def path_name(path: str, n: int) -> str:
    return "direct" if path == "direct" else f"tma N={n}"


def imbalance_hot_factor(shape: dict, target: float = 1.5, ranks: int = 2, seed: int = 0) -> tuple[float, float]:
    """Hot factor of `skewed` routing (rank 0's experts hot) whose rows-received ratio rank 0 /
    rank 1 is `target`, by bisection on the CPU with the benchmark's own seeds."""
    T, E, K = shape["tokens"], shape["experts"], shape["topk"]

    def ratio(h):
        recv = [0] * ranks
        for r in range(ranks):
            idx, _ = make_routing("skewed", T, E, K, ranks, rank_seed(seed, r), hot_fraction=1 / ranks, hot_factor=h)
            dest = idx // (E // ranks)
            for d in range(ranks):
                recv[d] += int((dest == d).any(1).sum())
        return recv[0] / max(recv[1], 1)

    lo, hi = 1.0, 64.0
    for _ in range(20):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
    h = (lo * hi) ** 0.5
    return h, ratio(h)


# -- device traces ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ev:
    """One device record: a kernel or a copy, µs on the profiler's clock."""

    name: str
    start: float
    end: float

    @property
    def us(self) -> float:
        return self.end - self.start


def cupti_trace(fn, iters: int, template=None) -> list[list[Ev]]:
    """The CUDA kernels and copies of `iters` calls of fn (synchronised after each), split per
    call: each call's records precede the next call's, and every call launches the same ones."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
            torch.cuda.synchronize()
    evs = sorted((Ev(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.start)
    if not evs or len(evs) % iters:
        raise RuntimeError(f"{len(evs)} device records for {iters} calls: calls launched different work")
    k = len(evs) // iters
    out = [evs[i * k:(i + 1) * k] for i in range(iters)]
    names = sorted(e.name for e in out[0])
    if any(sorted(e.name for e in o) != names for o in out):
        raise RuntimeError("calls launched different kernels; cannot split the trace per call")
    return out


def wall_trace(fn, iters: int, template=None) -> list[list[Ev]]:
    """The CPU dry run's stand-in: host time per call, laid out as the records `template` names
    (what the call launches on a GPU), one after the other."""
    out = []
    for _ in range(iters):
        t0 = time.perf_counter() * 1e6
        fn()
        t1 = time.perf_counter() * 1e6
        names = template or ["kernel"]
        step = (t1 - t0) / len(names)
        out.append([Ev(n, t0 + i * step, t0 + (i + 1) * step) for i, n in enumerate(names)])
    return out


TRACERS = {"cupti": cupti_trace, "wall": wall_trace}


def kernel_us(calls: list[list[Ev]], kind: str) -> float:
    """Median over calls of the `kind` data kernels' device time (the kernel table)."""
    return statistics.median(sum(e.us for e in c if KIND_RE[kind].search(e.name)) for c in calls)


@dataclass
class OpMetrics:
    """One call of an op (with or without the matmul), from its device records."""

    ep_us: float            # data kernels + signal kernel (send + receive)
    span_us: float          # first ep_core record (barrier) to the last ep_core kernel's end
    gemm_us: float          # the matmul's kernels
    copies_us: float        # the peer copies' window (0 without copies)
    sms_during_copies: int  # most ep_core blocks resident at once while the copies ran (-1: no copies)


def op_metrics(call: list[Ev], gemm_names: set, num_sms: int) -> OpMetrics:
    data = [e for e in call if DATA_RE.search(e.name)]
    sig = [e for e in call if SIGNAL_RE.search(e.name)]
    opn = [e for e in call if OPEN_RE.search(e.name)]
    cps = [e for e in call if e.name.startswith("Memcpy")]
    gemm = [e for e in call if e.name in gemm_names]
    ep = data + sig
    if not ep:
        raise ValueError("the call launched no ep_core data kernel")
    span = max(e.end for e in ep) - min(e.start for e in ep + opn + cps)
    sms = -1
    window = 0.0
    if cps:
        lo, hi = min(e.start for e in cps), max(e.end for e in cps)
        window = hi - lo
        blocks = [(e, num_sms if DATA_RE.search(e.name) else 1) for e in ep + opn]
        cuts = sorted({lo, hi} | {t for e, _ in blocks for t in (e.start, e.end) if lo < t < hi})
        sms = 0
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            sms = max(sms, sum(g for e, g in blocks if e.start < mid < e.end))
    return OpMetrics(sum(e.us for e in ep), span, sum(e.us for e in gemm), window, sms)


def _slowest(ctx, value: float, op=dist.ReduceOp.MAX) -> float:
    t = torch.tensor([float(value)], device=ctx.device)
    dist.all_reduce(t, op=op, group=ctx.group)
    return float(t.item())


# -- the worker ---------------------------------------------------------------------------------
def _buffer_class(spec: str | None):
    if spec:
        module, cls = spec.split(":")
        m = importlib.import_module(module)
        return getattr(m, cls), m.topk_idx_t
    import ep_core

    return ep_core.Buffer, ep_core.topk_idx_t


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
    return torch.equal(a, b)


def _validate(buffer, mine, handle, cfg, want_x, want_q, want_c, hook: bool) -> None:
    """Cached BF16 and FP8 dispatch bit-exact, combine within calc_diff 1e-6 of the reference."""
    def run(fn, *a, **kw):
        if not hook:
            return fn(*a, **kw)
        out = fn(*a, return_recv_hook=True, **kw)
        out[-1]()
        return out[:-1]

    recv = run(buffer.dispatch, mine.x, handle=handle, config=cfg)[0]
    assert _same(recv, want_x), "BF16 dispatch differs from the reference"
    rq = run(buffer.dispatch, mine.x_fp8, handle=handle, config=cfg)[0]
    assert _same(rq, want_q), "FP8 dispatch differs from the reference"
    comb = run(buffer.combine, recv, handle, config=cfg)[0]
    diff = ref.calc_diff(comb.float(), want_c.float())
    assert diff < 1e-6, f"combine calc_diff {diff:.3g}"


def _agree(ctx, checks: list, tag: str, fn) -> bool:
    """Run a validation on every rank; all must pass (a failure is recorded, not raised)."""
    try:
        fn()
        ok = 1
    except Exception as e:  # noqa: BLE001 (report, skip its timing, keep the others)
        checks.append({"config": tag, "rank": ctx.rank, "error": f"{type(e).__name__}: {e}",
                       "tb": traceback.format_exc()[-2000:]})
        ok = 0
    ok = int(_slowest(ctx, ok, dist.ReduceOp.MIN))
    why = "" if ok else f": {checks[-1]['error'] if checks else 'on the other rank'}"
    log(ctx, f"  {'ok  ' if ok else 'FAIL'} {tag}{why}")
    return bool(ok)


def worker(ctx, opts):
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    Buffer, topk_idx_t = _buffer_class(opts.get("buffer"))
    trace = TRACERS[opts["timer"]]
    shape, iters = opts["shape"], opts["iters"]
    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    T, H, K, E = shape["tokens"], shape["hidden"], shape["topk"], shape["experts"]
    p = Problem(T, H, K, E, R)
    buffer = Buffer(ctx.group, num_nvl_bytes=Buffer.get_hook_buffer_size_hint(T, H, R, K))
    hot, measured_ratio = opts["hot_factor"], opts["ratio"]
    rows, hook_rows, checks = [], [], []
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    log(ctx, f"== {R} ranks, {name}; imbalance: hot factor {hot:.2f} -> rows ratio {measured_ratio:.3f}")
    for routing, rargs in (("balanced", {}), ("imbalance 1.5x", {"hot_fraction": 1 / R, "hot_factor": hot})):
        kind = "uniform" if not rargs else "skewed"
        ins = make_all_inputs(p, kind, seed=0, device=dev, routing_args=rargs)
        mine = ins[me]
        idx = mine.topk_idx.to(topk_idx_t)
        n_rank, _, n_exp, in_rank, _ = buffer.get_dispatch_layout(idx, E)
        want = ref.dispatch([i.x for i in ins], topk_idx=[i.topk_idx for i in ins],
                            topk_weights=[i.topk_weights for i in ins], num_experts=E)
        want_c = ref.combine([d.recv_x for d in want], [d.handle for d in want])[me][0]
        # FP8 rows and scales only: routed by is_token_in_rank (top-k outputs need weights; GPU run 1 at
        # 4db78b1 died on a reference call without them)
        want_q = ref.dispatch([i.x_fp8 for i in ins], is_token_in_rank=[d.handle.is_token_in_rank for d in want])
        want_q = want_q[me].recv_x
        n = want[me].handle.num_recv_tokens
        bf16, fp8 = n * H * 2, n * (H + H // 128 * 4)
        for sms in SMS:
            base = Config(sms, 6, 256)
            handle = buffer.dispatch(mine.x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank,
                                     num_tokens_per_expert=n_exp, config=base)[4]
            for path, nbuf in PATHS:
                cfg = base.with_path(path, nbuf)
                tag = f"{routing}, {sms} SMs, {path_name(path, nbuf)}"
                if not _agree(ctx, checks, tag, lambda: _validate(buffer, mine, handle, cfg, want[me].recv_x, want_q,
                                                                  want_c, False)):
                    getattr(buffer, "synchronize", lambda: None)()
                    continue
                recv = buffer.dispatch(mine.x, handle=handle, config=cfg)[0]
                for op, fn, nbytes, kern in (
                        ("BF16 dispatch", lambda: buffer.dispatch(mine.x, handle=handle, config=cfg), bf16, "dispatch"),
                        ("FP8 dispatch", lambda: buffer.dispatch(mine.x_fp8, handle=handle, config=cfg), fp8,
                         "dispatch"),
                        ("BF16 combine", lambda: buffer.combine(recv, handle, config=cfg), bf16, "combine")):
                    for _ in range(WARMUP):
                        fn()
                    us = _slowest(ctx, kernel_us(trace(fn, iters, [f"{kern}_tma_kernel"]), kern))
                    rows.append({"routing": routing, "sms": sms, "path": path_name(path, nbuf), "op": op,
                                 "kernel_us": round(us, 1),
                                 "logical_GBps": round(_slowest(ctx, nbytes / us / 1e3, dist.ReduceOp.MIN), 1)})
            if routing == "balanced":
                hook_rows += hook_table(ctx, buffer, mine, handle, base, (want[me].recv_x, want_q, want_c),
                                        {"BF16": bf16, "FP8": fp8}, checks, trace, opts)
    return {"rank": me, "rows": rows, "hook_rows": hook_rows, "checks": checks, "hot_factor": hot,
            "ratio": measured_ratio}


def hook_table(ctx, buffer, mine, handle, base: Config, wants, nbytes: dict, checks: list, trace, opts) -> list:
    """Part 2 at one SM count: per op, normal mode (direct, tma N=3) against hook mode, with and
    without the matmul on the compute stream (see the module docstring for the columns)."""
    sms = base.num_sms
    g = opts["gemm_n"]
    dev = ctx.device
    a = torch.randn(g, g, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32, device=dev)

    def gemm():
        return a @ a

    for _ in range(2):
        gemm()
    alone = trace(gemm, opts["hook_iters"], ["gemm"])
    gemm_names = {e.name for c in alone for e in c}
    gemm_alone = _slowest(ctx, statistics.median(sum(e.us for e in c) for c in alone))
    recv = buffer.dispatch(mine.x, handle=handle, config=base)[0]
    ops = (("BF16 dispatch", lambda c, **kw: buffer.dispatch(mine.x, handle=handle, config=c, **kw), nbytes["BF16"],
            "dispatch"),
           ("FP8 dispatch", lambda c, **kw: buffer.dispatch(mine.x_fp8, handle=handle, config=c, **kw), nbytes["FP8"],
            "dispatch"),
           ("BF16 combine", lambda c, **kw: buffer.combine(recv, handle, config=c, **kw), nbytes["BF16"], "combine"))
    hook_cfg = base.with_path("tma", 3)
    if not _agree(ctx, checks, f"hook mode, {sms} SMs", lambda: _validate(buffer, mine, handle, hook_cfg, *wants,
                                                                          True)):
        return []
    out = []
    for op, call, nb, kern in ops:
        modes = [(m, base.with_path(p, n)) for m, p, n in NORMAL_MODES] + [("hook", hook_cfg)]
        for mode, cfg in modes:
            def plain(cfg=cfg, mode=mode):
                if mode == "hook":
                    call(cfg, return_recv_hook=True)[-1]()
                else:
                    call(cfg)

            def overlapped(cfg=cfg, mode=mode):
                if mode == "hook":
                    hook = call(cfg, return_recv_hook=True)[-1]
                    gemm()
                    hook()
                else:
                    ev = call(cfg, async_finish=True)[-1 if kern == "combine" else 5]
                    gemm()
                    ev.current_stream_wait()

            tmpl = _template(kern, mode)
            for _ in range(WARMUP):
                plain()
                overlapped()
            alone_m = [op_metrics(c, gemm_names, sms) for c in trace(plain, opts["hook_iters"], tmpl)]
            over_m = [op_metrics(c, gemm_names, sms) for c in trace(overlapped, opts["hook_iters"], tmpl + ["gemm"])]
            med = {f: statistics.median(getattr(m, f) for m in ms)
                   for f, ms in (("ep_us", over_m), ("gemm_us", over_m))}
            span = _slowest(ctx, statistics.median(m.span_us for m in alone_m))
            ep_alone = _slowest(ctx, statistics.median(m.ep_us for m in alone_m))
            ep_over = _slowest(ctx, med["ep_us"])
            gemm_over = _slowest(ctx, med["gemm_us"])
            held = (max(m.sms_during_copies for m in over_m) if mode == "hook" else sms)
            held = int(_slowest(ctx, held))
            name = mode if mode == "hook" else f"normal {path_name(cfg.path, cfg.num_tma_buffers)}"
            out.append({"sms": sms, "op": op, "mode": name, "kernel_us": round(ep_alone, 1),
                        "kernel_us_with_gemm": round(ep_over, 1), "send_to_return_us": round(span, 1),
                        "send_to_return_GBps": round(_slowest(ctx, nb / span / 1e3, dist.ReduceOp.MIN), 1),
                        "gemm_alone_us": round(gemm_alone, 1), "gemm_with_op_us": round(gemm_over, 1),
                        "gemm_slowdown_pct": round((gemm_over / gemm_alone - 1) * 100, 1),
                        "sms_held_during_transfer": held,
                        "copies_us": round(_slowest(ctx, statistics.median(m.copies_us for m in over_m)), 1)})
            log(ctx, f"  {sms} SMs {op:<13} {name:<14} kernel {ep_alone:7.1f} µs, send->return {span:7.1f} µs, "
                     f"matmul {gemm_alone:.0f} -> {gemm_over:.0f} µs, SMs held {held}")
    return out


def _template(kern: str, mode: str) -> list[str]:
    """What one call launches (names as CUPTI gives them), for the CPU dry run's wall_trace."""
    data = f"{kern}_tma_kernel"
    if mode != "hook":
        return ["barrier_kernel", data]
    if kern == "dispatch":
        return ["barrier_kernel", data, "Memcpy PtoP (Device -> Device)", "signal_kernel", data]
    return ["barrier_kernel", "Memcpy PtoP (Device -> Device)", "signal_kernel", data]


# -- tables -------------------------------------------------------------------------------------
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


def hook_table_md(rows: list) -> str:
    out = ["| SMs | op | mode | kernel µs (send+recv) | with matmul | send→return µs | send→return GB/s "
           "| matmul alone µs | with op µs | matmul slowdown | SMs held during transfer |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['sms']} | {r['op']} | {r['mode']} | {r['kernel_us']:.0f} | {r['kernel_us_with_gemm']:.0f} | "
                   f"{r['send_to_return_us']:.0f} | {r['send_to_return_GBps']:.0f} | {r['gemm_alone_us']:.0f} | "
                   f"{r['gemm_with_op_us']:.0f} | {r['gemm_slowdown_pct']:+.1f} % | {r['sms_held_during_transfer']} |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/tma-gpu-run")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timer", choices=sorted(TRACERS), default="cupti",
                    help="cupti: device times (the measurement); wall: the CPU dry run")
    ap.add_argument("--buffer", default=None, help="module:Class of a Buffer stand-in (the CPU dry run)")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--shape", default=None, help="tokens,hidden,topk,experts (default the issue's)")
    ap.add_argument("--gemm-n", type=int, default=GEMM_N)
    ap.add_argument("--iters", type=int, default=ITERS)
    ap.add_argument("--hook-iters", type=int, default=HOOK_ITERS)
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    shape = dict(ISSUE_SHAPE)
    if a.shape:
        shape = dict(zip(("tokens", "hidden", "topk", "experts"), (int(v) for v in a.shape.split(","))))
    hot, ratio = imbalance_hot_factor(shape, 1.5, a.ranks)
    opts = {"hot_factor": hot, "ratio": ratio, "timer": a.timer, "buffer": a.buffer, "shape": shape,
            "gemm_n": a.gemm_n, "iters": a.iters, "hook_iters": a.hook_iters}
    res = run_ranks(worker, a.ranks, opts, backend=a.backend, timeout_s=540)
    meta = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
            "commit": os.environ.get("EPSCOPE_GIT_COMMIT", "unknown"), "timer": a.timer, "shape": shape,
            "gemm_n": a.gemm_n, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "seconds": round(time.time() - t0, 1)}
    (out / "tma_bench.json").write_text(json.dumps({"meta": meta, "ranks": res}, indent=1))
    head = (f"## ep_core direct vs bulk-copy (TMA) path, and hook mode, {a.ranks}x{meta['gpu']}, commit "
            f"{meta['commit']}, {meta['date']}; imbalance ratio {res[0]['ratio']:.3f}")
    md = (f"{head}\n\n### Kernel table (logical GB/s by kernel time)\n\n{table(res[0]['rows'])}\n\n"
          f"### Hook vs normal mode, {a.gemm_n}x{a.gemm_n} BF16 matmul on the compute stream (balanced)\n\n"
          f"{hook_table_md(res[0]['hook_rows'])}\n\ntargets: kernel table as the last column; hook mode "
          f"send->return >= {HOOK_TARGET_GBPS:.0f} GB/s with <= {HOOK_MAX_SMS} SMs held during the transfer\n")
    (out / "tma_bench.md").write_text(md)
    for r in res:
        for c in r["checks"]:
            print(f"CHECK FAILED rank {c['rank']} {c['config']}: {c['error']}\n{c['tb']}")
    print("\n" + md)
    return res


if __name__ == "__main__":
    main()
