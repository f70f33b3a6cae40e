"""The catalogue's recording, one process per rank (profiler.workflows.catalogue plans, this records).

`catalogue_rank(ctx, opts)` runs every PlannedRun of `opts["runs"]` in order on this rank and
returns one RankFacts per run: what was planted as it happened (host sleeps timed with
perf_counter, device sleeps timed with CUDA events, the Buffer's error report). Each run is its
own profiler Session (its own run directory); the runs share one Buffer, except the timeout run,
which gets its own Buffer with the skip-send test hook and a short bound and is always last.

After each run the ranks exchange whether it went as planned (an object all-gather on the
process group): if one rank failed, both stop, so a broken Buffer never cascades into runs that
would record its consequences instead of their own plant.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .catalogue_plan import SEED, SHAPE, PlannedRun, RankFacts

# cycles of torch.cuda._sleep per µs, calibrated once per process (the SM clock is not fixed)
_CALIBRATION_CYCLES = 2_000_000


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[catalogue {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _problem(tokens: int):
    from ep_core.config import Problem

    return Problem(tokens, SHAPE["hidden"], SHAPE["topk"], SHAPE["experts"], 2, SHAPE["dtype"])


class Matmul:
    """The work a scenario overlaps with each op's data movement (Scenario.gemm_n): an N x N BF16
    matmul on the compute stream, timed with CUDA events (RankFacts.gemm_us)."""

    _operands: dict = {}  # one operand per (n, device) for the whole recording

    def __init__(self, n: int, device):
        key = (n, str(device))
        if key not in Matmul._operands:
            g = torch.Generator(device=device).manual_seed(SEED)
            Matmul._operands[key] = torch.randn(n, n, generator=g, device=device).to(torch.bfloat16)
        self.a = Matmul._operands[key]
        self.events: list = []

    def __call__(self) -> None:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.matmul(self.a, self.a)
        e1.record()
        self.events.append((e0, e1))

    def times_us(self) -> list[float]:
        torch.cuda.synchronize()
        return [round(a.elapsed_time(b) * 1e3, 1) for a, b in self.events]


def _op(buffer, run: PlannedRun, rank: int, device):
    from ep_core.config import op_configs
    from .workload import RankOp, make_rank_inputs

    s = run.scenario
    st = run.settings
    p = _problem(s.tokens)
    ins = make_rank_inputs(p, s.routing, rank, seed=SEED, device=device, routing_args=dict(s.routing_args))
    d, c = (cfg.with_path(s.path, st["num_tma_buffers"]) for cfg in op_configs(p.ranks, st["num_sms"]))
    return RankOp(buffer, p, ins, d, c, hook=st["return_recv_hook"],
                  overlap=Matmul(s.gemm_n, device) if s.gemm_n else None)


def sleep_cycles_per_us() -> float:
    """torch.cuda._sleep cycles per µs on this GPU, timed with CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(_CALIBRATION_CYCLES)  # first call loads the kernel
    a.record()
    torch.cuda._sleep(_CALIBRATION_CYCLES)
    b.record()
    torch.cuda.synchronize()
    return _CALIBRATION_CYCLES / (a.elapsed_time(b) * 1e3)


def _warm_up(ctx, buffer, runs: list[PlannedRun], opts) -> None:
    """Unprofiled iterations of every (tokens, routing, SMs) the plan uses, then one profiled
    iteration into a throwaway run: first-call costs (allocations, the instrumented build, pinned
    host memory) must not land in the first catalogue run."""
    from profiler.record.session import Session

    from ep_core import _ext

    seen = {}
    for r in runs:
        if r.scenario.skip_send_rank is None:
            s = r.scenario  # every kernel variant and overlap once (first-call costs: tma plans, cuBLAS)
            seen.setdefault((s.tokens, s.routing, s.routing_args, s.path, s.gemm_n, *r.settings.values()), r)
    for r in seen.values():
        op = _op(buffer, r, ctx.rank, ctx.device)
        for _ in range(2):
            op.iteration(None)
    _ext.load(profile=True)
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    first = next(iter(seen.values()), None)
    if first is None:
        return
    op = _op(buffer, first, ctx.rank, ctx.device)
    with Session(opts["scratch"], name="warmup", description="catalogue warm-up (deleted)", rank=ctx.rank,
                 world_size=ctx.world_size, group=ctx.group, capacity=opts["capacity"]) as s:
        with buffer.profile(s):
            op.iteration(True)


def _record(ctx, buffer, run: PlannedRun, opts, cycles_per_us: float) -> RankFacts:
    from profiler.record.session import Session

    from ep_core.buffer import EPTimeoutError

    s, rank = run.scenario, ctx.rank
    facts = RankFacts(run.name, rank)
    t0 = time.time()
    op = _op(buffer, run, rank, ctx.device)
    for _ in range(s.warm_iters):
        facts.recv_rows = op.iteration(None)
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    host = s.host_delay if s.host_delay is not None and s.host_delay.rank == rank else None
    dev = s.device_delay if s.device_delay is not None and s.device_delay.rank == rank else None
    dev_events = []
    session = Session(opts["out"], name=run.name, description=run.description(), rank=rank,
                      world_size=ctx.world_size, group=ctx.group, capacity=opts["capacity"],
                      workload=run.workload(), overwrite=opts.get("overwrite", False),
                      config={"dispatch": op.dispatch_config.to_dict(), "combine": op.combine_config.to_dict(),
                              "timeout_s": buffer.timeout_s})
    if op.overlap is not None:
        op.overlap.events.clear()  # the profiled ops' matmuls only
    try:
        with session:
            with buffer.profile(session):
                for it in range(s.warm_iters, s.warm_iters + s.profile_iters):
                    buffer.profile_iteration = it
                    if host is not None:
                        h0 = time.perf_counter_ns()
                        time.sleep(host.amount / 1e3)
                        facts.host_delays_ms.append((time.perf_counter_ns() - h0) / 1e6)
                    layout = op.layout(True)
                    if dev is not None:
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        torch.cuda._sleep(int(dev.amount * cycles_per_us))
                        e1.record()
                        dev_events.append((e0, e1))
                    d = op.dispatch(layout, True)
                    op.combine(d, True)
                    facts.recv_rows = d.rows
                # a device error of the last op surfaces here, inside the block, so the Buffer saves
                # the partial run with status "timeout" on every rank that failed
                buffer.synchronize()
    except EPTimeoutError as e:  # the timeout scenario's outcome; the Buffer saved the partial run
        facts.error = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 (reported to the parent, which fails the run's checks)
        facts.error = f"{type(e).__name__}: {e}"
    report = buffer.error_report()
    if report is not None:
        facts.error_report = {k: getattr(report, k) for k in report.__dataclass_fields__}
    if facts.error is None or facts.error_report is not None:
        torch.cuda.synchronize()  # the events below are complete (after a timeout too: waits are bounded)
        facts.device_delays_us = [a.elapsed_time(b) * 1e3 for a, b in dev_events]
    if op.overlap is not None and facts.error is None:
        facts.gemm_us = op.overlap.times_us()
    facts.seconds = round(time.time() - t0, 2)
    return facts


def catalogue_rank(ctx, opts) -> list[RankFacts]:
    import ep_core

    torch.cuda.set_device(ctx.device)
    runs: list[PlannedRun] = opts["runs"]
    B = ep_core.Buffer
    max_tokens = max(r.scenario.tokens for r in runs)
    # hook mode packs its peers' rows next to the rows it receives: a larger data region (it
    # changes nothing for the other runs, whose rows start at the same offset)
    sizing = B.get_hook_buffer_size_hint if any(r.settings["return_recv_hook"] for r in runs) else \
        B.get_buffer_size_hint
    hint = sizing(max_tokens, SHAPE["hidden"], ctx.world_size, SHAPE["topk"])
    buffer = B(ctx.group, num_nvl_bytes=hint, timeout_s=opts["timeout_s"])
    cycles = sleep_cycles_per_us()
    _say(ctx.rank, f"warm-up ({torch.cuda.get_device_name()}, _sleep {cycles:.0f} cycles/µs)")
    _warm_up(ctx, buffer, runs, opts)
    out: list[RankFacts] = []
    for i, run in enumerate(runs):
        s = run.scenario
        buf = buffer
        if s.skip_send_rank is not None:
            buf = B(ctx.group, num_nvl_bytes=hint, timeout_s=s.timeout_s, _test_skip_send_rank=s.skip_send_rank)
        facts = _record(ctx, buf, run, opts, cycles)
        out.append(facts)
        expected_error = s.skip_send_rank is not None
        ok = facts.error is None or expected_error
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, ok, group=ctx.group)
        _say(ctx.rank, f"{i + 1}/{len(runs)} {run.name}: {facts.seconds:.1f} s"
             + ("" if facts.error is None else f" ({facts.error.splitlines()[0][:160]})"))
        if not all(everyone):
            _say(ctx.rank, "a rank failed where nothing should: stopping (the runs so far are kept)")
            break
    return out
