"""The ground-truth catalogue's plan: EP runs whose cause is planted and known (issue 8, section 1).
The command is profiler/workflows/catalogue.py; this module is the floor below it, which the
recording (catalogue_record) and the expect blocks (catalogue_expect) share.

Every run of the catalogue is recorded in ONE launch of one process per GPU (ep_core.launch), on
2 ranks at the shape of issue 3 (4096 tokens per rank, hidden 7168, top-8 of 256, BF16, 24 SMs)
unless a scenario changes one thing. Each run directory's manifest gets an `expect` block
(profiler.groundtruth.expect) written by this command from what it planted AND what it measured: the rows
each rank received, the host delay as slept, the device delay as timed by CUDA events, the
kernels' error reports, the A/B knob's effect on the op latency in its own recordings. A planted
cause that did not show in the measurements fails a check: the check is in the expect block
(`extra.checks`) and the command exits 1, so a catalogue run whose truth did not happen is never
bundled silently.

Scenarios (`--only` takes these keys; run directory names in brackets):
  balanced            [ep-balanced]           uniform routing: nothing planted, no page may alarm
  rank-skew           [ep-rank-skew]          every expert of rank 0 is 20x hotter: rank 0 receives ~3x the rows
  zero-rank           [ep-zero-rank]          nobody routes to rank 0's experts: rank 1 gets all the work
  few-tokens          [ep-few-tokens]         32 tokens per rank on 24 SMs: most dispatch blocks have no chunk
  host-late           [ep-host-late]          rank 1's host sleeps 10 ms before each profiled op
  barrier-straggler   [ep-barrier-straggler]  5 ms of GPU work (torch.cuda._sleep) on rank 0's stream before
                                              each dispatch: rank 0 arrives last at notify's rank_start
  aa                  [ep-aa-{a,b}{0,1,2}]    the same code and config, A and B interleaved
  ab-sms              [ep-ab-sms-{a,b}{0,1,2}] 24 SMs (A) against 64 SMs (B), interleaved
  ab-tma-buffers      [ep-ab-tma-buffers-...] bulk-copy path with 1 staging buffer per warp (A) against 3 (B)
  ab-hook             [ep-ab-hook-...]        normal (A) against hook mode (B), an 8192^2 BF16 matmul on the
                                              compute stream while each dispatch's and combine's rows move
  late-entry-ab       [ep-late-entry-ab-...]  24 SMs (A) against 64 SMs (B) while rank 1's host sleeps a seeded
                                              random 0-300 µs before every dispatch and combine, interleaved
  late-entry-aa       [ep-late-entry-aa-...]  the same config on both sides under the same random host delay
  upstream-gemm       [ep-upstream-gemm]      a BF16 GEMM before each dispatch on each rank's compute stream,
                                              8192^2 on rank 0 and 2048^2 on rank 1: rank 0 enters late, its
                                              host on time (the late entry's GPU side)
  timeout             [ep-timeout]            rank 1 never sends its dispatch rows (1 s bound); always last

A late entry (Truth.late_entry: 'host' or 'gpu', profiler.groundtruth.expect.LATE_ENTRY_SIDES) is measured,
not assumed: the expect block names it (host_bound / rank_imbalance on its rank, with its side)
when the others' measured wait for the late rank is clearly past the pages' alarm share, leaves
the run at cause none when it is clearly under, and between the two says cause none with the late
entry named (a page may then name it, and nothing else). The random host delay (RandomDelay) is
drawn per profiled op from a seed of (scenario seed, replicate, iteration, op), not of the side:
replicate i of A and of B sleep the same sequence, so a late-entry A/B is paired and its A/A
compares like with like. A late-entry comparison's op latency is measured after entry (the last
rank's first warp to the last warp end, `Pair.after_entry`): a late peer's wait is not the
kernel's time (issue 18).

A comparison names what must move, B against A (kernel, phase, direction), or leaves it to the
measurement (`Pair.measured`): then the expect block names the kernel (and the phase) that moved
by at least 10 % in the group's own recordings, in the direction it moved, and a group in which
nothing moved that much fails its check instead of claiming an effect.

The plan (`plan()`) runs the single scenarios first, then the comparison runs interleaved
(A0 B0 of each group, then A1 B1, ...), then the timeout: it breaks its Buffer, so nothing may
follow it. This module is pure (no torch at import): the plan, the arguments and the expect
blocks are tested on the CPU; the recording is profiler/workflows/catalogue_record.py, the measurements and
expect blocks profiler/workflows/catalogue_expect.py.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.groundtruth.expect import Cause, Direction

RANKS = 2
# the shape of issue 3 (benchmarks/NOTES.md); scenarios change one field at most
SHAPE = {"tokens": 4096, "hidden": 7168, "topk": 8, "experts": 256, "dtype": "bf16"}
BASE_SMS = 24
SEED = 0
OPS = ("layout", "dispatch", "combine")    # RankOp's op calls, in call order per iteration
DEFAULT_REPLICATES = 3
# profile records per warp: dispatch/combine buffers are sized by Buffer._prof's bound (<= ~200
# records per warp at this shape, 24 SMs), layout and notify record a few; 512 leaves room
# without zeroing 4096-record buffers for every launch
CAPACITY = 512
# bound of every device wait in the scenarios that must not time out (a hang shows in 5 s)
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Delay:
    """A delay planted on one rank: host `ms` (time.sleep before the op's first call) or device
    `us` (torch.cuda._sleep on the compute stream before the dispatch)."""

    rank: int
    amount: float


@dataclass(frozen=True)
class RandomDelay:
    """A host delay on `rank` before each of `ops` (the op calls of RankOp) in every profiled
    iteration: uniform in [0, max_us), drawn from `seed` per (replicate, iteration, op)
    (delay_us), so a rerun sleeps the same sequence and both sides of a replicate share it."""

    rank: int
    max_us: float
    ops: tuple[str, ...] = ("dispatch", "combine")
    seed: int = SEED

    def __post_init__(self):
        if not self.max_us > 0:
            raise ValueError(f"RandomDelay.max_us must be > 0, got {self.max_us}")
        bad = [o for o in self.ops if o not in OPS]
        if bad or not self.ops:
            raise ValueError(f"RandomDelay.ops must be among {OPS}, got {self.ops}")

    def delay_us(self, replicate: int | None, iteration: int, op: str) -> float:
        # a str seed is hashed with SHA-512 by random.Random (stable across processes and runs)
        rng = random.Random(f"catalogue-host-delay:{self.seed}:{replicate or 0}:{iteration}:{op}")
        return round(rng.uniform(0.0, self.max_us), 3)

    def sequence(self, replicate: int | None, iterations) -> list[tuple[int, str, float]]:
        """[(iteration, op, µs)] in call order."""
        return [(it, op, self.delay_us(replicate, it, op)) for it in iterations for op in OPS if op in self.ops]


@dataclass(frozen=True)
class Truth:
    """What the planting makes true, in profiler.groundtruth.expect's vocabulary (the effect is measured).
    late_entry: 'host' | 'gpu' when `rank` is planted to enter ops late (profiler.groundtruth.expect)."""

    cause: Cause
    rank: int | None = None
    peer: int | None = None
    kernel: str | None = None
    phase: str | None = None
    late_entry: str | None = None


# The knobs a comparison may change (PlannedRun.settings), named as the API names them.
KNOBS = ("num_sms", "num_tma_buffers", "return_recv_hook")


@dataclass(frozen=True)
class Pair:
    """A comparison group: side A runs with `a`, side B with `b` of `knob` (one of KNOBS; None
    for A/A). `kernel`/`direction` name what must move, B against A; a knob with no direction is
    `measured`: the expect block names what moved (see the module docstring), among the kernels
    (ops) and, with `phase`, that phase's time in them."""

    group: str
    knob: str | None
    a: Any
    b: Any
    kernel: str | None = None
    direction: Direction | None = None
    phase: str | None = None
    after_entry: bool = False        # op latency from the last rank's entry (a group planting a late entry)

    def __post_init__(self):
        if self.knob is not None and self.knob not in KNOBS:
            raise ValueError(f"Pair.knob must be one of {KNOBS}, got {self.knob!r}")

    @property
    def outcome(self) -> Cause:
        return Cause.SAME_CODE if self.knob is None else Cause.KNOB_CHANGE

    @property
    def measured(self) -> bool:
        return self.knob is not None and self.direction is None


@dataclass(frozen=True)
class Scenario:
    key: str
    summary: str
    truth: Truth
    tokens: int = SHAPE["tokens"]
    routing: str = "uniform"
    routing_args: tuple[tuple[str, Any], ...] = ()
    num_sms: int = BASE_SMS
    path: str = "direct"                 # Config.path of both ops
    num_tma_buffers: int = 3             # Config.num_tma_buffers (the tma path; hook mode's kernels)
    hook: bool = False                   # return_recv_hook on both ops
    gemm_n: int = 0                      # an N x N BF16 matmul on the compute stream while each op's rows move
    warm_iters: int = 2
    profile_iters: int = 2
    host_delay: Delay | None = None      # ms
    device_delay: Delay | None = None    # µs
    skip_send_rank: int | None = None
    timeout_s: float | None = None
    pair: Pair | None = None
    random_host_delay: RandomDelay | None = None
    upstream_gemm: tuple[tuple[int, int], ...] = ()   # (rank, N): an N x N BF16 GEMM before each dispatch

    def upstream_n(self, rank: int) -> int:
        """The upstream GEMM's N on `rank` (0: none)."""
        return dict(self.upstream_gemm).get(rank, 0)

    @property
    def run_name(self) -> str:
        return f"ep-{self.key}"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("balanced", "uniform routing, nothing planted", Truth(Cause.NONE)),
    # hot_fraction 0.5 of 256 experts = all 128 of rank 0's; 20x: a pick lands on rank 1 with
    # p = 1/21, so ~(20/21)^8 = 68 % of tokens skip rank 1 and rank 0 receives ~3x its rows
    Scenario("rank-skew", "every expert of rank 0 is 20x hotter: rank 0 receives ~3x rank 1's rows",
             Truth(Cause.RANK_IMBALANCE, rank=0, kernel="dispatch", phase="copy_out"),
             routing="skewed", routing_args=(("hot_fraction", 0.5), ("hot_factor", 20.0))),
    Scenario("zero-rank", "no token picks an expert of rank 0: rank 0 receives nothing, rank 1 all the rows",
             Truth(Cause.RANK_IMBALANCE, rank=1, kernel="dispatch", phase="copy_out"),
             routing="zero-rank", routing_args=(("zero_rank", 0),)),
    # 32 tokens: 2 chunks of 24 (Config's minimum send chunk at 2 ranks) per source, so at most a
    # few of the 24 dispatch blocks get a chunk (Buffer._chunking)
    Scenario("few-tokens", "32 tokens per rank on 24 SMs: most dispatch blocks get no chunk",
             Truth(Cause.STARVED_WARPS, kernel="dispatch"), tokens=32),
    # 10 ms: ~8x a whole profiled op (~1.3 ms, ep-2xH200-2026-11-29-final-e4b4610.md), far above
    # host jitter, far below the 5 s device bound
    Scenario("host-late", "rank 1's host sleeps 10 ms before each profiled op; its GPU is idle meanwhile",
             Truth(Cause.HOST_BOUND, rank=1, kernel="layout"), host_delay=Delay(1, 10.0)),
    # 5 ms: the first recording (4db78b1) planted 2 ms and the peer waited 1.54-2.01 ms (the
    # peer's own host jitter eats into it); 5 ms keeps the wait far above ~0.5 ms of jitter
    Scenario("barrier-straggler", "5 ms of GPU work on rank 0's stream before each dispatch (its host is on "
             "time): rank 0 arrives last at notify's rank_start barrier",
             Truth(Cause.BARRIER_STRAGGLER, rank=0, kernel="notify", phase="rank_start"),
             device_delay=Delay(0, 5000.0)),
    Scenario("aa", "the same code and config on both sides, runs interleaved", Truth(Cause.NONE),
             profile_iters=5, pair=Pair("aa", None, BASE_SMS, BASE_SMS)),
    # 24 -> 64 SMs: combine 285 -> 232 µs (-19 %), dispatch 229 -> 205 µs (-11 %) in
    # benchmarks/results/ep-2xH200-2026-11-29-final-e4b4610.md: combine is the kernel that must move
    Scenario("ab-sms", "24 SMs (A) against 64 SMs (B), runs interleaved", Truth(Cause.NONE),
             profile_iters=5, pair=Pair("ab-sms", "num_sms", BASE_SMS, 64, kernel="combine",
                                        direction=Direction.FASTER)),
    # Seed 001's prefetch: with 1 staging buffer a warp loads a row, stores it and waits; with 3
    # the next row loads while the last one's stores drain, so the stalls (stage_wait spans,
    # recorded only when a row had not landed) should shrink. Whether the kernels get faster is
    # measured, not assumed. 2 profiled ops a run: N = 1 records a stall span per row (~33 k spans
    # an op on 2 ranks, ~150 KB of events; the A/B runs above weigh ~350 KB for 3 ops)
    Scenario("ab-tma-buffers", "bulk-copy path (Config.path='tma') with 1 staging buffer per warp (A) against 3 "
             "(B): the next row prefetched while the previous row's stores drain, runs interleaved",
             Truth(Cause.NONE), path="tma", profile_iters=2,
             pair=Pair("ab-tma-buffers", "num_tma_buffers", 1, 3, phase="stage_wait")),
    # Seed 000: the same tma-path kernels (N = 3) with the data moved inside the dispatch / combine
    # kernels (A) or by the copy engines between a send and a receive kernel (B), while an 8192^2
    # BF16 matmul (~1.5 ms on H200) runs on the compute stream; the matmul's time is in the facts
    Scenario("ab-hook", "normal mode (A) against hook mode (B), tma path N=3, an 8192x8192 BF16 matmul on the "
             "compute stream while each op's rows move, runs interleaved", Truth(Cause.NONE),
             path="tma", num_tma_buffers=3, gemm_n=8192, profile_iters=2,
             pair=Pair("ab-hook", "return_recv_hook", False, True)),
    # Issue 24. 0-300 µs: the spread of host launch times of real steps (a data loader, Python between
    # ops); before dispatch and combine: both ops' first waits see it. At 24 SMs an iteration's
    # dispatch + combine take ~0.5 ms (229 + 285 µs, ep-2xH200-2026-11-29-final-e4b4610.md), so a
    # mean 2 x 150 µs of late entry sits near the 25 % alarm share: whether it is material is
    # measured per run (module docstring). 64 SMs: -11 % dispatch, -19 % combine after entry
    Scenario("late-entry-ab", "24 SMs (A) against 64 SMs (B) while rank 1's host sleeps a seeded random 0-300 µs "
             "before every dispatch and combine, runs interleaved", Truth(Cause.NONE, rank=1, late_entry="host"),
             profile_iters=5, random_host_delay=RandomDelay(1, 300.0),
             pair=Pair("late-entry-ab", "num_sms", BASE_SMS, 64, kernel="combine", direction=Direction.FASTER,
                       after_entry=True)),
    Scenario("late-entry-aa", "the same code and config on both sides, rank 1's host sleeping the same seeded "
             "random 0-300 µs before every dispatch and combine, runs interleaved",
             Truth(Cause.NONE, rank=1, late_entry="host"), profile_iters=5, random_host_delay=RandomDelay(1, 300.0),
             pair=Pair("late-entry-aa", None, BASE_SMS, BASE_SMS, after_entry=True)),
    # 8192^2 BF16: ~1.5 ms on H200 (the ab-hook overlap's matmul, its gemm_us facts); 2048^2 ~25 µs.
    # Unequal work before dispatch, as unequal attention or expert GEMMs make it in a real step:
    # rank 0 enters dispatch ~1.5 ms late with its host on time (the GEMM is queued asynchronously)
    Scenario("upstream-gemm", "a BF16 GEMM on each rank's compute stream before each dispatch, 8192x8192 on rank 0 "
             "and 2048x2048 on rank 1 (hosts on time): rank 0 enters the op late on the GPU side",
             Truth(Cause.RANK_IMBALANCE, rank=0, late_entry="gpu"), upstream_gemm=((0, 8192), (1, 2048))),
    # one profiled op, no warm-up: its dispatch breaks the Buffer. Rank 0's receivers give up at
    # the bound (its first error: dispatch wait_data on rank 1); rank 1 finished its dispatch and
    # then waits at the combine's rank_start barrier for rank 0 (its own timeout, a consequence)
    Scenario("timeout", "rank 1 never sends its dispatch rows: rank 0's receivers wait until the 1 s bound",
             Truth(Cause.TIMEOUT, rank=0, peer=1, kernel="dispatch", phase="wait_data"),
             warm_iters=0, profile_iters=1, skip_send_rank=1, timeout_s=1.0),
)
BY_KEY = {s.key: s for s in SCENARIOS}
# issue 24's recordings, in the order the next two-GPU session records them (catalogue_gpu.sh --late-entry)
LATE_ENTRY = ("late-entry-ab", "late-entry-aa", "upstream-gemm")


@dataclass(frozen=True)
class PlannedRun:
    """One run directory of the catalogue: a scenario, and for comparisons its side and replicate."""

    name: str
    scenario: Scenario
    side: str | None = None
    replicate: int | None = None

    @property
    def settings(self) -> dict:
        """The knobs this run records with (KNOBS), the comparison's knob set to this side's value."""
        s = self.scenario
        out = {"num_sms": s.num_sms, "num_tma_buffers": s.num_tma_buffers, "return_recv_hook": s.hook}
        if s.pair is not None and s.pair.knob is not None:
            out[s.pair.knob] = s.pair.a if self.side == "A" else s.pair.b
        return out

    @property
    def num_sms(self) -> int:
        return self.settings["num_sms"]

    def description(self) -> str:
        s = self.scenario
        where = ""
        if self.side is not None:
            knob = s.pair.knob or "num_sms"
            where = f" [side {self.side}, replicate {self.replicate}, {knob}={self.settings[knob]}]"
        return (f"catalogue {s.key}: {s.summary}{where}; 2xGPU, T={s.tokens} H={SHAPE['hidden']} "
                f"top-{SHAPE['topk']} of {SHAPE['experts']} {SHAPE['dtype']}")

    def workload(self) -> dict:
        """The manifest's workload: `epscope trace`'s keys (so the two tools' runs compare), plus
        what the catalogue planted."""
        s = self.scenario
        st = self.settings
        plant = {"scenario": s.key, "side": self.side, "replicate": self.replicate,
                 "host_delay_ms": _delay(s.host_delay), "device_delay_us": _delay(s.device_delay),
                 "skip_send_rank": s.skip_send_rank, "timeout_s": s.timeout_s, "path": s.path,
                 "num_tma_buffers": st["num_tma_buffers"], "return_recv_hook": st["return_recv_hook"],
                 "gemm_n": s.gemm_n}
        if s.random_host_delay is not None:
            d = s.random_host_delay
            its = range(s.warm_iters, s.warm_iters + s.profile_iters)
            plant["random_host_delay"] = {"rank": d.rank, "max_us": d.max_us, "ops": list(d.ops), "seed": d.seed,
                                          "planned_us": [[it, op, us] for it, op, us in d.sequence(self.replicate, its)]}
        if s.upstream_gemm:
            plant["upstream_gemm"] = {str(r): n for r, n in s.upstream_gemm}
        return {"kind": "ep", **SHAPE, "tokens": s.tokens, "ranks": RANKS, "routing": s.routing,
                "routing_args": dict(s.routing_args), "drop": 0.0, "seed": SEED,
                "iters": s.warm_iters + s.profile_iters, "profile_iters": s.profile_iters,
                "num_sms": self.num_sms, "chunk": None, "force_timeout_rank": s.skip_send_rank,
                "catalogue": plant}


def _delay(d: Delay | None):
    return None if d is None else {"rank": d.rank, "amount": d.amount}


@dataclass
class RankFacts:
    """What one rank saw while recording one run (returned to the parent, which writes the expect)."""

    run: str
    rank: int
    recv_rows: int = 0
    host_delays_ms: list[float] = field(default_factory=list)     # as slept, perf_counter
    device_delays_us: list[float] = field(default_factory=list)   # as run, CUDA events
    error: str | None = None                                      # an exception's message
    error_report: dict | None = None                              # ep_core.ErrorReport fields
    gemm_us: list[float] = field(default_factory=list)            # the overlapped matmuls, CUDA events
    host_sleeps: list[dict] = field(default_factory=list)         # RandomDelay: {iteration, op, planned_us, slept_us}
    upstream_gemm_us: list[float] = field(default_factory=list)   # the GEMM before each dispatch, CUDA events
    seconds: float = 0.0


class CatalogueError(ValueError):
    """Bad arguments (the message names the flag)."""


def parse_only(text: str | None) -> list[str]:
    """Scenario keys of `--only` (comma-separated; None: all), in the table's order."""
    if text is None:
        return [s.key for s in SCENARIOS]
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise CatalogueError("--only needs at least one scenario")
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        raise CatalogueError(f"--only: unknown scenario(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(s.key for s in SCENARIOS)}")
    return [s.key for s in SCENARIOS if s.key in keys]


def plan(keys: list[str], replicates: int = DEFAULT_REPLICATES) -> list[PlannedRun]:
    """The runs in recording order: single scenarios, then every comparison group interleaved
    (A0 B0 per group, then A1 B1, ...), the timeout last (it breaks its Buffer)."""
    if replicates < 2:
        raise CatalogueError(f"--replicates must be >= 2 (a spread needs two runs per side), got {replicates}")
    chosen = [BY_KEY[k] for k in keys]
    singles = [PlannedRun(s.run_name, s) for s in chosen if s.pair is None and s.skip_send_rank is None]
    pairs = [s for s in chosen if s.pair is not None]
    interleaved = [PlannedRun(f"{s.run_name}-{side.lower()}{i}", s, side, i)
                   for i in range(replicates) for s in pairs for side in ("A", "B")]
    last = [PlannedRun(s.run_name, s) for s in chosen if s.skip_send_rank is not None]
    return singles + interleaved + last
