"""`epscope trace`: run a profiled EP workload on the local GPUs and write a run directory.

    epscope trace --ranks 2 --routing uniform --iters 8 --profile-iters 2 --out runs --name ep-2rank-balanced
    python -m profiler.workflows.trace --ranks 2 --routing skewed --out runs --name ep-2rank-skewed
    python -m profiler.workflows.trace --ranks 2 --force-timeout-rank 1 --out runs --name ep-2rank-forced-timeout

One process per rank (ep_core.launch). Each rank builds its inputs (routing of `--routing`,
seed = `--seed` + rank), runs `--iters` iterations of get_dispatch_layout + dispatch + combine,
the last `--profile-iters` of them profiled into a profiler.record Session (the first ones warm
the JIT build and the caches, unprofiled and timed with CUDA events). The run directory
(`--out`/`--name`, docs/design.md) is what `epscope report` and the viewer read.

`--force-timeout-rank R` sets the Buffer's test hook (EPSCOPE_TEST_SKIP_SEND_RANK): rank R
never sends its rows, its peers time out after `--timeout-s`, and the partial trace is saved
with status "timeout" (its open spans show where each warp was waiting). The command then exits
0 if the timeout happened and was recorded, 1 if it did not.

The heavy imports (torch, the extension, the recorder) happen inside the functions: `--help`
and the GPU-count check work anywhere.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROUTING_CHOICES = ("uniform", "skewed", "zipf", "zero-rank")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epscope trace", description="Run a profiled expert-parallel dispatch/combine "
                                 "workload on the local GPUs and write a run directory.")
    ap.add_argument("--ranks", type=int, default=2, help="GPUs, one process each (1..8; default 2)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank (default 4096)")
    ap.add_argument("--hidden", type=int, default=7168, help="hidden size, a multiple of 128 up to 8192")
    ap.add_argument("--topk", type=int, default=8, help="experts per token, 1..16")
    ap.add_argument("--experts", type=int, default=256, help="experts, a multiple of --ranks up to 512")
    ap.add_argument("--routing", choices=ROUTING_CHOICES, default="uniform")
    ap.add_argument("--drop", type=float, default=0.0, help="probability of a -1 (no expert) top-k entry")
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16", help="dispatch payload")
    ap.add_argument("--num-sms", type=int, default=24, help="SMs per dispatch / combine kernel (even)")
    ap.add_argument("--chunk", type=int, default=None,
                    help="send chunk tokens (Config.num_max_nvl_chunked_send_tokens; default: the table's)")
    ap.add_argument("--iters", type=int, default=6, help="iterations in all (default 6)")
    ap.add_argument("--profile-iters", type=int, default=2,
                    help="profile only the last N iterations, to keep traces small (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="rank r uses seed + r")
    ap.add_argument("--capacity", type=int, default=4096, help="profile records per warp")
    # no default: the checkout's traces/ (the old one) is the bundled runs (issue 34)
    ap.add_argument("--out", required=True, help="directory that receives the run directory (e.g. runs/)")
    ap.add_argument("--name", default=None, help="run directory name (default ep-<R>rank-<routing>-<dtype>)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an existing run of that name (default: write NAME-2, NAME-3, ...)")
    ap.add_argument("--description", default=None, help="one line describing the run")
    ap.add_argument("--no-analyze", action="store_true",
                    help="save the run without computing and storing its analyses (`epscope analyze RUN` later)")
    ap.add_argument("--torch-profiler", action="store_true",
                    help="run the PyTorch profiler over the profiled iterations and store each rank's trace in the "
                         "run (the op inside the step: `epscope report` names what a late rank was doing)")
    ap.add_argument("--force-timeout-rank", type=int, default=None, metavar="R",
                    help="rank R never sends: record a timeout and its partial trace")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="bound of every device wait (default: the Buffer's; 2 s with --force-timeout-rank)")
    ap.add_argument("--launch-timeout", type=float, default=900.0, help="seconds before the ranks are killed")
    return ap


class TraceError(RuntimeError):
    """A user-facing failure of `epscope trace` (the message says what to do)."""


def check_args(a) -> dict:
    """Validate everything that can be checked without a GPU; return the workload dict."""
    from ep_core.config import Config, Problem, dispatch_config

    try:
        p = Problem(a.tokens, a.hidden, a.topk, a.experts, a.ranks, a.dtype)
    except (ValueError, TypeError) as e:
        raise TraceError(str(e)) from None
    if a.iters < 1:
        raise TraceError(f"--iters must be >= 1, got {a.iters}")
    if not 1 <= a.profile_iters <= a.iters:
        raise TraceError(f"--profile-iters must be in 1..--iters ({a.iters}), got {a.profile_iters}")
    if a.force_timeout_rank is not None and not 0 <= a.force_timeout_rank < a.ranks:
        raise TraceError(f"--force-timeout-rank must be a rank in 0..{a.ranks - 1}, got {a.force_timeout_rank}")
    if a.force_timeout_rank is not None and a.ranks < 2:
        raise TraceError("--force-timeout-rank needs at least 2 ranks (someone has to wait)")
    if a.routing == "zero-rank" and a.ranks < 2:
        raise TraceError("--routing zero-rank needs at least 2 ranks")
    if not 0.0 <= a.drop <= 1.0:
        raise TraceError(f"--drop must be a probability, got {a.drop}")
    base = dispatch_config(a.ranks)
    try:
        Config(a.num_sms, a.chunk or base.num_max_nvl_chunked_send_tokens, base.num_max_nvl_chunked_recv_tokens)
    except (ValueError, TypeError) as e:
        raise TraceError(str(e).replace("Config.num_sms", "--num-sms").replace(
            "Config.num_max_nvl_chunked_send_tokens", "--chunk")) from None
    return {"kind": "ep", **p.to_dict(), "routing": a.routing, "drop": a.drop, "seed": a.seed,
            "iters": a.iters, "profile_iters": a.profile_iters, "num_sms": a.num_sms, "chunk": a.chunk,
            "force_timeout_rank": a.force_timeout_rank}


def default_name(a) -> str:
    base = f"ep-{a.ranks}rank-{a.routing}-{a.dtype}"
    return base + (f"-timeout-rank{a.force_timeout_rank}" if a.force_timeout_rank is not None else "")


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[epscope trace {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _trace_rank(ctx, opts: dict) -> dict:
    import torch

    import ep_core
    from ep_core.config import Problem, op_configs
    from profiler.workflows.workload import RankOp, make_rank_inputs
    from profiler.record.session import Session

    w = opts["workload"]
    rank, R = ctx.rank, ctx.world_size
    p = Problem(w["tokens"], w["hidden"], w["topk"], w["experts"], R, w["dtype"])
    ins = make_rank_inputs(p, w["routing"], rank, seed=w["seed"], device=ctx.device, drop=w["drop"])
    Buffer = ep_core.Buffer
    kw = {"timeout_s": opts["timeout_s"]} if opts["timeout_s"] else {}
    buffer = Buffer(ctx.group, num_nvl_bytes=Buffer.get_buffer_size_hint(p.tokens, p.hidden, R, p.topk), **kw)
    dconf, cconf = op_configs(R, w["num_sms"], w["chunk"])
    op = RankOp(buffer, p, ins, dconf, cconf)

    # A forced timeout breaks the Buffer at the first dispatch: profile from the first iteration
    # so the partial trace exists.
    n_warm = 0 if w["force_timeout_rank"] is not None else w["iters"] - w["profile_iters"]
    times, recv_rows = [], 0
    for it in range(n_warm):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        recv_rows = op.iteration(None)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
        _say(rank, f"iteration {it + 1}/{w['iters']} (warm-up, not profiled): {times[-1]:.0f} µs")

    # Load the instrumented build and line the ranks up before the first profiled call: a one-time
    # extension load on one rank would otherwise show in the trace as the peer waiting ~100 ms at
    # notify's rank_start barrier (seen in the first epscope-trace-2rank-skewed recording).
    from ep_core import _ext
    import torch.distributed as dist

    _ext.load(profile=True)
    torch.cuda.synchronize()
    if R > 1:
        dist.barrier(group=ctx.group)
    session = Session(opts["out"], name=opts["name"], description=opts["description"], rank=rank, world_size=R,
                      group=ctx.group, capacity=opts["capacity"], workload=w, overwrite=opts.get("overwrite", False),
                      analyze=opts.get("analyze", True), torch_profiler=opts.get("torch_profiler", False),
                      config={"dispatch": dconf.to_dict(), "combine": cconf.to_dict(),
                              "timeout_s": buffer.timeout_s})
    error = None
    try:
        with session:
            with buffer.profile(session):
                for it in range(n_warm, w["iters"]):
                    buffer.profile_iteration = it
                    recv_rows = op.iteration(True)
                    _say(rank, f"iteration {it + 1}/{w['iters']} (profiled)")
            _say(rank, "saving the run (gather on rank 0, decode)")
    except Exception as e:  # noqa: BLE001 (a forced timeout is the expected outcome; the caller decides)
        error = f"{type(e).__name__}: {e}"
    return {"rank": rank, "recv_rows": recv_rows, "warm_us": times, "error": error,
            "gpu": torch.cuda.get_device_name()}


def summarize(run_dir: Path, results: list) -> str:
    """A readable summary: per rank rows and times, then per kernel and phase from the run."""
    lines = []
    lines.append(f"{'rank':>4}  {'recv rows':>9}  {'warm-up iteration µs (median)':>29}  status")
    for r in results:
        warm = f"{statistics.median(r['warm_us']):.0f}" if r["warm_us"] else "-"
        lines.append(f"{r['rank']:>4}  {r['recv_rows']:>9}  {warm:>29}  {r['error'] or 'ok'}")
    try:
        from profiler.store.runstore import load_run

        run = load_run(run_dir)
    except Exception as e:  # noqa: BLE001 (the summary must not hide the run's own result)
        lines.append(f"(run directory {run_dir} could not be read back: {type(e).__name__}: {e})")
        return "\n".join(lines)
    m = run.manifest
    lines.append("")
    lines.append(f"run {run_dir}  status={m.get('status')}  events={run.num_events}  "
                 f"dropped={int(run.launches['dropped'].sum()) if len(run.launches) else 0}")
    if len(run.launches):
        la = run.launches.copy()
        la["us"] = (la["gpu_end_ns"] - la["gpu_begin_ns"]) / 1e3
        g = la.groupby(["kernel", "rank"], observed=True)["us"].median().unstack("rank")
        lines.append("")
        lines.append("kernel time per launch (µs, median, GPU first warp start to last warp end):")
        lines.append(g.round(1).to_string())
    ev = run.events
    spans = ev[ev["kind"] == "span"]
    if len(spans):
        spans = spans.assign(us=(spans["end_ns"] - spans["begin_ns"]) / 1e3)
        ph = spans.groupby(["phase", "rank"], observed=True)["us"].agg(["count", "sum"]).unstack("rank")
        lines.append("")
        lines.append("phases (count and total warp-µs per rank):")
        lines.append(ph.round(1).to_string())
        opened = spans[spans["open"]]
        if len(opened):
            lines.append("")
            lines.append(f"open spans (warps still inside a phase when the kernel stopped): {len(opened)}")
            lines.append(opened.groupby(["rank", "phase"], observed=True).size().to_string())
    return "\n".join(lines)


def main(argv=None) -> int:
    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        workload = check_args(a)
    except TraceError as e:
        print(f"epscope trace: {e}", file=sys.stderr)
        return 2
    have = gpu_count()
    if have < a.ranks:
        print(f"epscope trace: --ranks {a.ranks} needs {a.ranks} CUDA GPUs, this machine has {have} "
              f"(run it on a GPU machine, or lower --ranks)", file=sys.stderr)
        return 2
    name = a.name or default_name(a)
    desc = a.description or (f"{a.ranks}-rank {a.dtype} dispatch+combine, {a.routing} routing, T={a.tokens} "
                             f"H={a.hidden} top-{a.topk} of {a.experts}, {a.num_sms} SMs"
                             + (f", rank {a.force_timeout_rank} never sends (forced timeout)"
                                if a.force_timeout_rank is not None else ""))
    env = {}
    timeout_s = a.timeout_s
    if a.force_timeout_rank is not None:
        env["EPSCOPE_TEST_SKIP_SEND_RANK"] = str(a.force_timeout_rank)
        timeout_s = timeout_s or 2.0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.overwrite:   # rank 0 writes the run in a child process: pick the free name here
        from profiler.store.runstore import free_path
        name = free_path(out / name).name
    opts = {"workload": workload, "out": str(out), "name": name, "description": desc, "capacity": a.capacity,
            "timeout_s": timeout_s, "overwrite": a.overwrite, "analyze": not a.no_analyze,
            "torch_profiler": a.torch_profiler}
    print(f"epscope trace: {desc}; {a.iters} iterations, last {a.profile_iters} profiled -> {out / name}",
          flush=True)
    from ep_core.launch import run_ranks

    t0 = time.time()
    results = run_ranks(_trace_rank, a.ranks, opts, timeout_s=a.launch_timeout, env=env)
    print(f"\nepscope trace: done in {time.time() - t0:.0f} s\n", flush=True)
    print(summarize(out / name, results), flush=True)
    errors = [r for r in results if r["error"]]
    if a.force_timeout_rank is not None:
        timed_out = any("timed out" in (r["error"] or "") for r in results)
        if not timed_out:
            print(f"\nepscope trace: rank {a.force_timeout_rank} skipped its sends but no rank timed out",
                  file=sys.stderr)
            return 1
        print(f"\nepscope trace: forced timeout recorded in {out / name}", flush=True)
        return 0
    if errors:
        for r in errors:
            print(f"epscope trace: rank {r['rank']} failed: {r['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
