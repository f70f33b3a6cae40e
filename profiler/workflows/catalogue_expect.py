"""The catalogue's expect blocks: what each run planted, checked against what it recorded.

`finalize(runs, per_rank_facts, out_dir, planted_by)` runs in the parent process after the
ranks have recorded (no GPU needed): for every PlannedRun it loads the run directory, measures
the planted effect in the recording and in the ranks' facts (profiler.workflows.catalogue.RankFacts), writes
the `expect` block (profiler.groundtruth.expect) into the manifest, and returns a text report. Every planted
cause has checks that must hold for the run to count as ground truth (the straggler really
received more rows, the late host really entered late, the A/B knob really moved the op
latency); a failed check is kept in `expect.extra.checks` and makes the report not ok.

The measurements are small pure functions of a run's tables (launches, events) so the verdict
tests and people can re-derive every number; they are not analyses (profiler/analysis/ draws
conclusions, these only measure what was planted).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.analysis.verdict import ALARM_SHARE
from profiler.groundtruth.expect import LATE_ENTRY_CAUSES, Cause, ComparisonExpect, Direction, Effect, Expect
from profiler.registry.registry import Registry
from profiler.store.runstore import TRACE, Run, load_run, update_manifest

from .catalogue_plan import SCENARIOS, PlannedRun, RankFacts

# Thresholds of the checks: what "the plant showed" means. Each is far from the planted size,
# so a check fails only when the plant did not happen, not on run-to-run noise.
MIN_IMBALANCE = 1.3          # rows received, max over median (rank-skew plants ~1.5, zero-rank 2.0)
MAX_BALANCED = 1.05          # uniform routing at 4096 tokens: ~1.00 (8163 vs 8157 rows, NOTES.md)
MIN_IDLE_SHARE = 0.5         # few-tokens: at most ~4 of 24 dispatch blocks get a chunk
MIN_DELAY_SHARE = 0.8        # a recorded lag / wait of at least 80 % of the planted delay
MIN_KNOB_EFFECT = 0.10       # the A/B knob moves the named kernel's op latency by >= 10 %
HOOK_MAX_BLOCKS = 4          # issue 11: hook mode holds <= 4 SMs while the copy engines move the rows
# No accidental host lag: in runs that plant none, no rank's host may enter an op this much after
# another's (a whole profiled op takes ~1.3 ms, ep-2xH200-2026-11-29-final-e4b4610.md; the first
# profiled op of an older recording showed 92 ms, epscope-trace-2rank-balanced iteration 4)
MAX_ACCIDENTAL_LAG_MS = 1.0
# A planted late entry is material (the pages must name it) when the others' measured wait for it
# is this far past the pages' alarm share (profiler.analysis.verdict.ALARM_SHARE), immaterial (no
# page may alarm) this far under it; between the two the pages may name it and nothing else. The
# margin covers what this measurement (entry skews over the GPU span of the iteration) does not
# share with the analysis' (the waits themselves over the iteration's span from its host calls).
MATERIAL_MARGIN = 1.25
# random host delays: per iteration, the planted rank's positive GPU entry lags summed reach at
# least half of what its host slept (median over iterations); without the plant they sum to the
# ranks' launch jitter, tens of µs against ~300 µs planted per iteration on average
MIN_LATE_SHARE = 0.5
# kernels whose ranks do not wait for each other: a late entry there costs no one anything
LOCAL_KERNELS = ("layout",)


@dataclass(frozen=True)
class Check:
    """One fact that must hold for a run to count as ground truth."""

    what: str
    ok: bool
    measured: Any
    want: str


@dataclass
class Report:
    ok: bool
    text: str


# -- measurements ------------------------------------------------------------------------------
def kernel_us(launches: pd.DataFrame) -> pd.DataFrame:
    """[rank, iteration, kernel, us]: GPU time of every recorded launch (first warp start to last
    warp end); launches that recorded nothing are left out."""
    ok = launches[(launches["gpu_begin_ns"] >= 0) & (launches["gpu_end_ns"] >= launches["gpu_begin_ns"])]
    return pd.DataFrame({"rank": ok["rank"].astype(int).to_numpy(), "iteration": ok["iteration"].astype(int).to_numpy(),
                         "kernel": ok["kernel"].astype(str).to_numpy(),
                         "us": (ok["gpu_end_ns"] - ok["gpu_begin_ns"]).to_numpy() / 1e3})


def op_latency_us(launches: pd.DataFrame, kernel: str) -> pd.Series:
    """Per iteration, the slowest rank's GPU time of `kernel` (the op's latency), its launches
    summed per rank (a hook-mode op's send, signal and receive are launches of its kernel)."""
    k = kernel_us(launches)
    k = k[k["kernel"] == kernel]
    return k.groupby(["iteration", "rank"])["us"].sum().groupby("iteration").max()


def phase_us(events: pd.DataFrame, launches: pd.DataFrame, kernel: str, phase: str) -> pd.Series:
    """Per iteration, the slowest rank's time in `phase` spans inside `kernel` (µs summed over
    warps: warp time, e.g. how long pipeline warps stalled); 0 for an iteration without any."""
    its = sorted(int(i) for i in launches[launches["kernel"].astype(str) == kernel]["iteration"].unique())
    sp = events[(events["kind"] == "span") & (events["phase"].astype(str) == phase)
                & (events["kernel"].astype(str) == kernel)]
    per = ((sp["end_ns"] - sp["begin_ns"]) / 1e3).groupby([sp["iteration"], sp["rank"]]).sum()
    per = per.groupby(level=0).max() if len(per) else pd.Series(dtype=float)
    return pd.Series([float(per.get(i, 0.0)) for i in its], index=its, dtype=float)


def blocks_during_copies(events: pd.DataFrame, launches: pd.DataFrame) -> int | None:
    """Hook mode: the most ep_core thread blocks that ran while a send's peer copies were in
    flight, over the run's ops and ranks. A send's signal launch (the one that records the
    `publish_hook` instants) starts after the copies in stream order, and the send's kernel before
    it (the pack, or the combine's start barrier) ended before they began: the window runs from the
    last end of a launch of the rank before the signal began to the signal's start, and every
    launch of the rank overlapping it counts with the blocks it recorded. None: no hook-mode op."""
    la = launches[launches["gpu_begin_ns"] >= 0]
    signals = set(map(tuple, events[events["phase"].astype(str) == "publish_hook"][["rank", "launch"]]
                      .drop_duplicates().to_numpy().tolist()))
    if not signals:
        return None
    blocks = events[events["block"] >= 0].groupby(["rank", "launch"])["block"].nunique()
    worst = 0
    for r, g in la.groupby("rank"):
        for launch, hi in zip(g["launch"].to_numpy(), g["gpu_begin_ns"].to_numpy()):
            if (int(r), int(launch)) not in signals:
                continue
            ended = g[g["gpu_end_ns"] <= hi]["gpu_end_ns"]
            if ended.empty:
                continue
            lo = int(ended.max())
            over = g[(g["gpu_begin_ns"] < hi) & (g["gpu_end_ns"] > lo)]
            worst = max(worst, sum(int(blocks.get((int(r), int(x)), 0)) for x in over["launch"]))
    return worst


def kernel_median_us(launches: pd.DataFrame) -> dict[str, list[float]]:
    """{kernel: [median µs of rank 0, rank 1, ...]}, a kernel's launches of one iteration summed
    (a hook-mode op's send, signal and receive)."""
    k = kernel_us(launches)
    if k.empty:
        return {}
    k = k.groupby(["kernel", "rank", "iteration"])["us"].sum().reset_index()
    m = k.groupby(["kernel", "rank"])["us"].median().unstack("rank")
    return {str(kn): [round(float(v), 1) for v in row] for kn, row in m.iterrows()}


def wait_phases(manifest: dict) -> set[str]:
    """Phases the run's registries declare as waits."""
    out = set()
    for reg in (manifest.get("registry") or {}).values():
        out |= {p.name for p in Registry.from_dict(reg).phases if p.wait}
    return out


def idle_warp_share(events: pd.DataFrame, launches: pd.DataFrame, waits: set[str], kernel: str) -> float:
    """Median over the launches of `kernel` of the share of its warps (profile regions) that
    recorded no work span (a span of a phase that is not a wait)."""
    la = launches[launches["kernel"].astype(str) == kernel]
    if la.empty:
        raise ValueError(f"the run has no {kernel} launch")
    sp = events[(events["kind"] == "span") & (events["kernel"].astype(str) == kernel)
                & ~events["phase"].astype(str).isin(waits)]
    working = sp.drop_duplicates(["rank", "launch", "block", "warp"]).groupby(["rank", "launch"]).size()
    shares = [1.0 - float(working.get((int(r.rank), int(r.launch)), 0)) / int(r.regions)
              for r in la.itertuples() if int(r.regions) > 0]
    return float(np.median(shares))


def host_entry_lag_ms(launches: pd.DataFrame, kernel: str, rank: int) -> list[float]:
    """Per iteration, how much later `rank`'s host began the call that launched `kernel` than
    the earliest other rank's (ms; negative when it was earlier)."""
    la = launches[(launches["kernel"].astype(str) == kernel) & (launches["host_begin_ns"] >= 0)]
    first = la.sort_values("launch").groupby(["iteration", "rank"])["host_begin_ns"].first().unstack("rank")
    if rank not in first.columns or len(first.columns) < 2:
        return []
    others = first.drop(columns=[rank]).min(axis=1)
    return [round(float(v) / 1e6, 3) for v in (first[rank] - others).dropna()]


def op_after_entry_us(launches: pd.DataFrame, kernel: str) -> pd.Series:
    """Per iteration, `kernel`'s op latency after entry (issue 18): per occurrence, the last
    rank's first warp to the last warp end of any rank, summed over the iteration's occurrences
    (matched by order within the iteration). A late peer's wait is not in it."""
    la = launches[(launches["kernel"].astype(str) == kernel) & (launches["gpu_begin_ns"] >= 0)
                  & (launches["gpu_end_ns"] >= launches["gpu_begin_ns"])].copy()
    if la.empty:
        return pd.Series(dtype=float)
    la = la.sort_values(["rank", "iteration", "launch"])
    la["occurrence"] = la.groupby(["rank", "iteration"]).cumcount()
    g = la.groupby(["iteration", "occurrence"])
    per = (g["gpu_end_ns"].max() - g["gpu_begin_ns"].max()) / 1e3
    return per.groupby(level=0).sum()


def entry_lags_us(launches: pd.DataFrame, rank: int) -> pd.DataFrame:
    """[iteration, kernel, occurrence, lag_us] per op occurrence of the cross-rank kernels (not
    LOCAL_KERNELS): how much later `rank`'s GPU began it (first warp) than the earliest other
    rank's (negative: earlier). Occurrences are matched across ranks by their order within
    (iteration, kernel), as profiler.analysis.timemodel matches them."""
    la = launches[(launches["gpu_begin_ns"] >= 0) & ~launches["kernel"].astype(str).isin(LOCAL_KERNELS)].copy()
    la["kernel"] = la["kernel"].astype(str)
    la = la.sort_values(["rank", "iteration", "kernel", "launch"])
    la["occurrence"] = la.groupby(["rank", "iteration", "kernel"]).cumcount()
    first = la.pivot_table(index=["iteration", "kernel", "occurrence"], columns="rank", values="gpu_begin_ns",
                           aggfunc="min")
    if rank not in first.columns or len(first.columns) < 2:
        return pd.DataFrame(columns=["iteration", "kernel", "occurrence", "lag_us"])
    lag = ((first[rank] - first.drop(columns=[rank]).min(axis=1)) / 1e3).dropna().rename("lag_us")
    return lag.reset_index()


def late_entry_shares(launches: pd.DataFrame, rank: int) -> list[float]:
    """Per iteration, the others' wait for `rank` to enter: its positive entry lags summed over
    the iteration's cross-rank op occurrences, as a share of the iteration's GPU span (first warp
    of any launch to last warp end)."""
    lags = entry_lags_us(launches, rank)
    la = launches[launches["gpu_begin_ns"] >= 0]
    span = (la.groupby("iteration")["gpu_end_ns"].max() - la.groupby("iteration")["gpu_begin_ns"].min()) / 1e3
    waited = lags["lag_us"].clip(lower=0).groupby(lags["iteration"]).sum() if len(lags) else pd.Series(dtype=float)
    return [round(float(waited.get(it, 0.0)) / float(span[it]), 4) for it in span.index if span[it] > 0]


def late_entry_truth(side: str, shares: list[float]) -> tuple[Cause, str | None]:
    """(cause, late_entry) of a run whose `rank` was planted to enter late from `side`, from the
    median measured share (MATERIAL_MARGIN around ALARM_SHARE; the module docstring of
    catalogue_plan says what each answer asks of the pages)."""
    med = statistics.median(shares) if shares else 0.0
    if med >= ALARM_SHARE * MATERIAL_MARGIN:
        return LATE_ENTRY_CAUSES[side], side
    if med < ALARM_SHARE / MATERIAL_MARGIN:
        return Cause.NONE, None
    return Cause.NONE, side


def last_arrivals(events: pd.DataFrame, kernel: str, barrier: str) -> pd.DataFrame:
    """[iteration, occurrence, last_rank, lead_us] of every occurrence of a cross-rank barrier
    in `kernel`: the rank whose last warp arrived last, and by how much it trailed the next one."""
    a = events[(events["kind"] == "arrive") & (events["kernel"].astype(str) == kernel)
               & (events["phase"].astype(str) == barrier)]
    per_rank = a.groupby(["iteration", "payload", "rank"])["begin_ns"].max().reset_index()
    rows = []
    for (it, occ), g in per_rank.groupby(["iteration", "payload"]):
        g = g.sort_values("begin_ns")
        lead = (g["begin_ns"].iloc[-1] - g["begin_ns"].iloc[-2]) / 1e3 if len(g) > 1 else float("nan")
        rows.append((int(it), int(occ), int(g["rank"].iloc[-1]), round(float(lead), 1)))
    return pd.DataFrame(rows, columns=["iteration", "occurrence", "last_rank", "lead_us"])


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(float(statistics.median(xs)), 3) if xs else None


# -- expect blocks per cause -------------------------------------------------------------------
def _rows(facts: list[RankFacts]) -> list[int]:
    return [f.recv_rows for f in sorted(facts, key=lambda f: f.rank)]


def _imbalance(rows: list[int]) -> float:
    med = statistics.median(rows)
    return round(max(rows) / med, 3) if med > 0 else float("inf")


def _no_host_lag(rec, checks) -> None:
    """No rank's host entered an op late where nothing was planted (first-call costs would
    otherwise pass for a host_bound cause)."""
    ranks = sorted(int(r) for r in rec.launches["rank"].unique())
    lags = [abs(x) for r in ranks for x in host_entry_lag_ms(rec.launches, "layout", r)]
    worst = round(max(lags), 3) if lags else None
    checks.append(Check("largest host entry lag between ranks (ms, layout)", worst is not None
                        and worst < MAX_ACCIDENTAL_LAG_MS, worst, f"< {MAX_ACCIDENTAL_LAG_MS:g}"))


def _measure_none(run, facts, rec, checks) -> tuple[Effect | None, dict]:
    ratio = _imbalance(_rows(facts))
    checks.append(Check("rows received are balanced (max / median)", ratio <= MAX_BALANCED, ratio,
                        f"<= {MAX_BALANCED}"))
    _no_host_lag(rec, checks)
    return None, {}


def _measure_rank_imbalance(run, facts, rec, checks):
    t = run.scenario.truth
    rows = _rows(facts)
    ratio = _imbalance(rows)
    top = int(np.argmax(rows))
    checks.append(Check("the planted rank receives the most rows", top == t.rank, top, f"rank {t.rank}"))
    checks.append(Check("rows received, max / median", ratio >= MIN_IMBALANCE, ratio, f">= {MIN_IMBALANCE}"))
    _no_host_lag(rec, checks)
    extra = {"waiting_ranks": [r for r in range(len(rows)) if r != t.rank]}
    zero = dict(run.scenario.routing_args).get("zero_rank")
    if zero is not None:
        extra["starved_rank"] = zero
        checks.append(Check(f"the starved rank {zero} receives no row", rows[zero] == 0, rows[zero], "0"))
    return Effect("rows_received_max_over_median", ratio, "x"), extra


def _measure_starved(run, facts, rec, checks):
    kernel = run.scenario.truth.kernel
    share = round(idle_warp_share(rec.events, rec.launches, wait_phases(rec.manifest), kernel), 3)
    checks.append(Check(f"share of {kernel} warps with no work span", share >= MIN_IDLE_SHARE, share,
                        f">= {MIN_IDLE_SHARE}"))
    _no_host_lag(rec, checks)
    return Effect("idle_warp_share", share, "fraction"), {}


def _measure_host_bound(run, facts, rec, checks):
    d = run.scenario.host_delay
    slept = next(f for f in facts if f.rank == d.rank).host_delays_ms
    lag = host_entry_lag_ms(rec.launches, run.scenario.truth.kernel, d.rank)
    want = MIN_DELAY_SHARE * d.amount
    checks.append(Check("host sleeps measured (ms)", bool(slept) and min(slept) >= d.amount, slept,
                        f"every one >= {d.amount:g}"))
    checks.append(Check(f"recorded host entry lag of rank {d.rank} (ms, per profiled op)",
                        bool(lag) and min(lag) >= want, lag, f"every one >= {want:g}"))
    return Effect("host_delay_ms", _median(slept) or 0.0, "ms"), {"planted_ms": d.amount, "entry_lag_ms": lag}


def _measure_barrier(run, facts, rec, checks):
    t, d = run.scenario.truth, run.scenario.device_delay
    ran = next(f for f in facts if f.rank == d.rank).device_delays_us
    arr = last_arrivals(rec.events, t.kernel, t.phase)
    lag = host_entry_lag_ms(rec.launches, t.kernel, d.rank)
    want = MIN_DELAY_SHARE * d.amount
    checks.append(Check("device delays measured (µs, CUDA events)", bool(ran) and min(ran) >= want, ran,
                        f"every one >= {want:g}"))
    last = arr["last_rank"].tolist()
    checks.append(Check(f"last arriver at {t.kernel} {t.phase}, per occurrence", bool(last) and set(last) == {t.rank},
                        last, f"rank {t.rank} every time"))
    leads = arr["lead_us"].tolist()
    checks.append(Check("how long the others waited for it (µs)", bool(leads) and min(leads) >= want, leads,
                        f"every one >= {want:g}"))
    # distinct from host_bound: the straggler's host entered the call on time (within a quarter
    # of the planted delay, in ms)
    on_time = d.amount / 1e3 / 4
    checks.append(Check(f"host entry lag of rank {d.rank} (ms)", bool(lag) and max(abs(x) for x in lag) < on_time, lag,
                        f"|lag| < {on_time:g}"))
    extra = {"planted_us": d.amount, "last_arrivals": arr.to_dict("list"), "host_entry_lag_ms": lag}
    return Effect("device_delay_us", _median(ran) or 0.0, "us"), extra


def _measure_late_host(run, facts, rec, checks) -> tuple[Cause, str | None, dict]:
    """A random host delay (RandomDelay) on one rank: it slept what was planned, its GPU entered
    the cross-rank ops late by it, and (cause, late_entry) from the measured share."""
    s, t = run.scenario, run.scenario.truth
    d = s.random_host_delay
    held = next((f for f in facts if f.rank == d.rank), RankFacts(run.name, d.rank)).host_sleeps
    its = range(s.warm_iters, s.warm_iters + s.profile_iters)
    planned = d.sequence(run.replicate, its)
    short = [h for h in held if h["slept_us"] < h["planned_us"]]
    checks.append(Check(f"rank {d.rank}'s host held every planned delay (count, short ones)",
                        len(held) == len(planned) and not short, [len(held), len(short)], f"[{len(planned)}, 0]"))
    lags = entry_lags_us(rec.launches, d.rank)
    late = lags["lag_us"].clip(lower=0).groupby(lags["iteration"]).sum() if len(lags) else pd.Series(dtype=float)
    per_it = pd.Series([x["slept_us"] for x in held], index=[x["iteration"] for x in held], dtype=float)
    slept = per_it.groupby(level=0).sum() if len(per_it) else pd.Series(dtype=float)
    late_med, slept_med = _median(late.tolist()), _median(slept.tolist())
    want = MIN_LATE_SHARE * (slept_med or 0.0)
    checks.append(Check(f"rank {d.rank}'s GPU entry lag per iteration (µs, median, cross-rank ops)",
                        late_med is not None and slept_med is not None and late_med >= want, late_med,
                        f">= {want:g} ({MIN_LATE_SHARE:g} x the median slept per iteration, {slept_med})"))
    shares = late_entry_shares(rec.launches, d.rank)
    cause, side = late_entry_truth(t.late_entry, shares)
    extra = {"late_entry_share": shares, "late_entry_share_median": _median(shares), "alarm_share": ALARM_SHARE,
             "host_sleeps": held, "gpu_entry_lag_us_per_iteration": [round(float(x), 1) for x in late.tolist()]}
    return cause, side, extra


def _measure_late_gpu(run, facts, rec, checks):
    """An upstream GEMM: the planted rank's GEMM took longer than the others', its GPU entered
    the op late by about the difference while its host called on time, and the late entry is
    material (the scenario is sized for it; an immaterial one fails: nothing was planted)."""
    s, t = run.scenario, run.scenario.truth
    gemm = {f.rank: _median(f.upstream_gemm_us) for f in facts}
    mine = gemm.get(t.rank)
    others = [v for r, v in gemm.items() if r != t.rank]
    extra_us = round(mine - max(v or 0.0 for v in others), 1) if mine is not None and others else None
    checks.append(Check(f"rank {t.rank}'s upstream GEMM minus the others' (µs, medians, CUDA events)",
                        extra_us is not None and extra_us > 0, extra_us, "> 0"))
    want = MIN_DELAY_SHARE * (extra_us or 0.0)
    lags = entry_lags_us(rec.launches, t.rank)
    # the op's first cross-rank kernel (notify) is the one queued behind the GEMM
    at = lags[lags["kernel"] == "notify"]["lag_us"].round(1).tolist() if len(lags) else []
    checks.append(Check(f"rank {t.rank}'s GPU entry lag at notify (µs, per profiled op)",
                        bool(at) and extra_us is not None and min(at) >= want, at, f"every one >= {want:g}"))
    host = host_entry_lag_ms(rec.launches, "dispatch", t.rank)
    on_time = (extra_us or 0.0) / 1e3 / 4
    checks.append(Check(f"host entry lag of rank {t.rank} at dispatch (ms)",
                        bool(host) and max(abs(x) for x in host) < on_time, host, f"|lag| < {on_time:g}"))
    shares = late_entry_shares(rec.launches, t.rank)
    cause, side = late_entry_truth(t.late_entry, shares)
    checks.append(Check("the late entry is material (cause, side from the measured share)",
                        (cause, side) == (t.cause, t.late_entry), [cause.value, side],
                        f"[{t.cause.value}, {t.late_entry}] (median share >= {ALARM_SHARE * MATERIAL_MARGIN:g})"))
    extra = {"upstream_gemm_us": {str(r): v for r, v in sorted(gemm.items())}, "gpu_entry_lag_us": at,
             "host_entry_lag_ms": host, "late_entry_share": shares, "alarm_share": ALARM_SHARE}
    return Effect("upstream_gemm_extra_us", extra_us or 0.0, "us"), extra


def _measure_timeout(run, facts, rec, checks):
    t, s = run.scenario.truth, run.scenario
    status = rec.manifest.get("status")
    checks.append(Check("run status", status == "timeout", status, "timeout"))
    rep = next((f.error_report for f in facts if f.rank == t.rank), None) or {}
    got = {k: rep.get(k) for k in ("kind", "kernel", "phase", "peer")}
    want = {"kind": "timeout", "kernel": t.kernel, "phase": t.phase, "peer": t.peer}
    checks.append(Check(f"rank {t.rank}'s first device error", got == want, got, str(want)))
    extra = {"error_reports": {str(f.rank): f.error_report for f in facts},
             "errors": {str(f.rank): f.error.split("\n", 1)[0][:300] if f.error else None for f in facts}}
    return Effect("wait_bound_s", float(s.timeout_s), "s"), extra


_MEASURE = {Cause.NONE: _measure_none, Cause.RANK_IMBALANCE: _measure_rank_imbalance,
            Cause.STARVED_WARPS: _measure_starved, Cause.HOST_BOUND: _measure_host_bound,
            Cause.BARRIER_STRAGGLER: _measure_barrier, Cause.TIMEOUT: _measure_timeout}
assert set(_MEASURE) >= {s.truth.cause for s in SCENARIOS if s.truth.late_entry is None}, \
    "every planted cause needs its measurement"
assert {s.truth.late_entry for s in SCENARIOS if s.pair is None} <= {None, "gpu"}, \
    "a single run's planted late entry needs its measurement (_measure_late_gpu)"


# -- comparisons -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupEffect:
    """A comparison group's measured op latencies, B against A (medians over runs x iterations;
    after entry for a group that plants a late entry, Pair.after_entry),
    keyed by kernel ("dispatch", "combine") and, for a group with a phase, "kernel/phase"
    (the phase's warp time per op). `facts`: medians of what the ranks measured per side (the
    overlapped matmul's µs, when the scenario runs one)."""

    median_a_us: dict
    median_b_us: dict
    change: dict            # op or op/phase -> B / A - 1
    runs: dict              # side -> run names
    facts: dict = None      # e.g. {"gemm_us": {"A": ..., "B": ...}}


def group_effect(recorded: dict[str, Run], runs: list[PlannedRun], kernels=("dispatch", "combine"),
                 facts: dict | None = None) -> GroupEffect:
    phase = runs[0].scenario.pair.phase if runs and runs[0].scenario.pair is not None else None
    keys = list(kernels) + ([f"{k}/{phase}" for k in kernels] if phase else [])
    samples = {"A": {k: [] for k in keys}, "B": {k: [] for k in keys}}
    names = {"A": [], "B": []}
    gemm = {"A": [], "B": []}
    for r in runs:
        if r.name not in recorded:
            continue
        names[r.side].append(r.name)
        rec = recorded[r.name]
        latency = op_after_entry_us if r.scenario.pair.after_entry else op_latency_us
        for k in kernels:
            samples[r.side][k] += latency(rec.launches, k).tolist()
            if phase:
                samples[r.side][f"{k}/{phase}"] += phase_us(rec.events, rec.launches, k, phase).tolist()
        for f in (facts or {}).get(r.name, []):
            gemm[r.side] += f.gemm_us
    med = {side: {k: _median(v) for k, v in d.items()} for side, d in samples.items()}
    change = {k: (round(med["B"][k] / med["A"][k] - 1.0, 4) if med["A"][k] and med["B"][k] is not None else None)
              for k in keys}
    measured = {"gemm_us": {side: _median(v) for side, v in gemm.items()}} if gemm["A"] or gemm["B"] else {}
    return GroupEffect(med["A"], med["B"], change, names, measured)


def _on_both_sides(g: GroupEffect, key: str) -> bool:
    """Whether `key` (an op or op/phase) was seen on both sides (a median above 0)."""
    return bool(g.median_a_us.get(key)) and bool(g.median_b_us.get(key))


def what_moved(g: GroupEffect, kernels=("dispatch", "combine"), phase: str | None = None):
    """(kernel, phase, change) of a measured comparison: the op that moved most if it moved by
    MIN_KNOB_EFFECT, with `phase` when that phase moved the same way by as much; else the phase
    that moved most inside an op; else (the largest change seen, failing the check)."""
    ops = [(k, None, g.change.get(k)) for k in kernels if g.change.get(k) is not None]
    phases = [(k, phase, g.change.get(f"{k}/{phase}")) for k in kernels
              if phase and g.change.get(f"{k}/{phase}") is not None and _on_both_sides(g, f"{k}/{phase}")]
    best = max(ops, key=lambda c: abs(c[2]), default=None)
    if best is not None and abs(best[2]) >= MIN_KNOB_EFFECT:
        # a phase that vanished on one side (B's stage_wait at N = 3: stalls are recorded only when
        # they happen) has no samples there, so Compare cannot rank it: the op carries the verdict
        ph = g.change.get(f"{best[0]}/{phase}") if phase and _on_both_sides(g, f"{best[0]}/{phase}") else None
        same = ph is not None and abs(ph) >= MIN_KNOB_EFFECT and (ph < 0) == (best[2] < 0)
        return best[0], phase if same else None, best[2]
    best_phase = max(phases, key=lambda c: abs(c[2]), default=None)
    if best_phase is not None and abs(best_phase[2]) >= MIN_KNOB_EFFECT:
        return best_phase
    return max(ops + phases, key=lambda c: abs(c[2]), default=(kernels[0], None, None))


def _comparison_expect(run: PlannedRun, g: GroupEffect, checks: list[Check]):
    """(effect, extra, (kernel, phase, direction) of the comparison)."""
    p = run.scenario.pair
    extra = {"group_measured": asdict(g)}
    if p.knob is None:
        return None, extra, (None, None, None)
    enough = min(len(v) for v in g.runs.values()) >= 2
    if p.measured:
        kernel, phase, ch = what_moved(g, phase=p.phase)
        ok = ch is not None and abs(ch) >= MIN_KNOB_EFFECT and enough
        what = f"{kernel}{'/' + phase if phase else ''}"
        checks.append(Check(f"what moved most, B / A - 1 over the group's runs ({what})", ok, ch,
                            f"|change| >= {MIN_KNOB_EFFECT} with >= 2 runs per side"))
        direction = Direction.FASTER if ch is None or ch < 0 else Direction.SLOWER
        metric = "phase_time_change" if phase and kernel and g.change.get(kernel) is not None and \
            abs(g.change[kernel]) < MIN_KNOB_EFFECT else "op_latency_change"
        return Effect(metric, ch if ch is not None else 0.0, "fraction"), extra, (kernel, phase, direction)
    ch = g.change.get(p.kernel)
    sign = -1 if p.direction.value == "faster" else 1
    ok = ch is not None and sign * ch >= MIN_KNOB_EFFECT and enough
    checks.append(Check(f"{p.kernel} op latency B / A - 1 over the group's runs", ok, ch,
                        f"{'<= -' if sign < 0 else '>= '}{MIN_KNOB_EFFECT} with >= 2 runs per side"))
    return Effect("op_latency_change", ch if ch is not None else 0.0, "fraction"), extra, \
        (p.kernel, p.phase, p.direction)


def _hook_checks(run: PlannedRun, rec: Run, checks: list[Check]) -> dict:
    """A hook-mode run: ep_core held at most HOOK_MAX_BLOCKS blocks while the copy engines moved
    the rows (issue 11: <= 4 SMs; one block per SM at most, 512 threads and the staging buffers)."""
    if not run.settings["return_recv_hook"]:
        return {}
    n = blocks_during_copies(rec.events, rec.launches)
    checks.append(Check("ep_core blocks running while the peer copies flew (most, any op and rank)",
                        n is not None and n <= HOOK_MAX_BLOCKS, n, f"<= {HOOK_MAX_BLOCKS}"))
    return {"blocks_during_copies": n}


# -- the whole catalogue -------------------------------------------------------------------------
def build_expect(run: PlannedRun, facts: list[RankFacts], rec: Run, planted_by: str,
                 group: GroupEffect | None = None) -> tuple[Expect, list[Check]]:
    s, t = run.scenario, run.scenario.truth
    checks: list[Check] = []
    if s.pair is not None:
        effect, extra, (kernel, phase, direction) = _comparison_expect(run, group, checks)
        p = s.pair
        cmp_ = ComparisonExpect(group=p.group, side=run.side, replicate=run.replicate, outcome=p.outcome,
                                knob=p.knob, value=run.settings[p.knob] if p.knob else None, kernel=kernel,
                                phase=phase, direction=direction)
        cause, rank, side = t.cause, t.rank, t.late_entry
        if s.random_host_delay is not None:    # the single-run cause is what the late entry measured
            ratio = _imbalance(_rows(facts))
            checks.append(Check("rows received are balanced (max / median)", ratio <= MAX_BALANCED, ratio,
                                f"<= {MAX_BALANCED}"))
            cause, side, late = _measure_late_host(run, facts, rec, checks)
            rank = s.random_host_delay.rank if side is not None else None
            extra["late_entry"] = late
        else:
            _measure_none(run, facts, rec, checks)
        extra.update(_hook_checks(run, rec, checks))
        mine = sorted((f for f in facts if f.gemm_us), key=lambda f: f.rank)
        if mine:
            extra["gemm_us"] = {str(f.rank): f.gemm_us for f in mine}
    else:
        measure = _measure_late_gpu if t.late_entry == "gpu" else _MEASURE[t.cause]
        effect, extra = measure(run, facts, rec, checks)
        cmp_ = None
        cause, rank, side = t.cause, t.rank, t.late_entry
    extra = {**extra, "recv_rows": _rows(facts), "kernel_median_us": kernel_median_us(rec.launches),
             "status": rec.manifest.get("status"), "checks": [asdict(c) for c in checks]}
    exp = Expect(cause=cause, rank=rank, peer=t.peer, kernel=t.kernel, phase=t.phase, effect=effect,
                 comparison=cmp_, planted_by=planted_by, note=s.summary, extra=extra, late_entry=side)
    return exp, checks


def finalize(runs: list[PlannedRun], per_rank: list[list[RankFacts]], out_dir, planted_by: str) -> Report:
    """Measure every recorded run, write its expect block, and report (see the module doc)."""
    out_dir = Path(out_dir)
    facts: dict[str, list[RankFacts]] = {}
    for rank_facts in per_rank:
        for f in rank_facts:
            facts.setdefault(f.run, []).append(f)
    recorded: dict[str, Run] = {}
    problems: list[str] = []
    for r in runs:
        try:
            recorded[r.name] = load_run(out_dir / r.name)
        except Exception as e:  # noqa: BLE001 (a missing or unreadable run is reported, not fatal)
            problems.append(f"{r.name}: not recorded ({type(e).__name__}: {e})")
    by_group: dict[str, list[PlannedRun]] = {}
    for r in runs:
        if r.scenario.pair is not None:
            by_group.setdefault(r.scenario.pair.group, []).append(r)
    groups = {g: group_effect(recorded, members, facts=facts) for g, members in by_group.items()}
    lines = [f"{'run':<24} {'cause':<18} {'rank':>4} {'kernel/phase':<22} {'effect':<36} checks"]
    for r in runs:
        if r.name not in recorded:
            continue
        f = facts.get(r.name, [])
        if len(f) < 2:
            problems.append(f"{r.name}: facts from {len(f)} rank(s) only (a rank stopped)")
            continue
        try:
            exp, checks = build_expect(r, f, recorded[r.name], planted_by,
                                       groups.get(r.scenario.pair.group) if r.scenario.pair else None)
        except Exception as e:  # noqa: BLE001 (one broken run must not hide the others' results)
            problems.append(f"{r.name}: cannot measure ({type(e).__name__}: {e})")
            continue
        update_manifest(out_dir / r.name, {"expect": exp.to_json()})
        failed = [c for c in checks if not c.ok]
        problems += [f"{r.name}: check failed: {c.what}: measured {c.measured}, want {c.want}" for c in failed]
        eff = "-" if exp.effect is None else f"{exp.effect.metric}={exp.effect.value:g} {exp.effect.unit}"
        c = exp.comparison
        where = "/".join(x for x in (exp.kernel or (c.kernel if c else None), exp.phase or (c.phase if c else None))
                         if x) or "-"
        lines.append(f"{r.name:<24} {exp.cause.value:<18} {'-' if exp.rank is None else exp.rank:>4} {where:<22} "
                     f"{eff:<36} {len(checks) - len(failed)}/{len(checks)} ok")
    for g, e in groups.items():
        lines.append(f"group {g}: op latency median A {e.median_a_us} µs, B {e.median_b_us} µs, B/A-1 {e.change}")
    lines += [f"PROBLEM {p}" for p in problems]
    lines.append("catalogue: every planted cause showed in its recording" if not problems
                 else f"catalogue: {len(problems)} problem(s); do not bundle the runs named above")
    return Report(not problems, "\n".join(lines))


# -- traces/README.md ----------------------------------------------------------------------------
README_BEGIN = "<!-- catalogue:begin (written by python -m profiler.workflows.catalogue --readme) -->"
README_END = "<!-- catalogue:end -->"
# the catalogue's module path in a run's `planted_by`: ep_core.catalogue for runs recorded before the
# workflows left ep_core (the bundled ep-* runs), profiler.workflows.catalogue since
PLANTERS = ("profiler.workflows.catalogue", "ep_core.catalogue")


def _run_line(name: str, m: dict, has_trace: bool) -> str:
    e = m["expect"]
    eff = e.get("effect")
    eff = f"; measured {eff['metric']} = {eff['value']:g} {eff['unit']}" if eff else ""
    who = ", ".join(f"{k} {e[k]}" for k in ("rank", "peer", "kernel", "phase") if e.get(k) is not None)
    commit = str((m.get("git") or {}).get("commit", "unknown"))[:7]
    trace = "" if has_trace else " No Perfetto trace bundled (`epscope export RUN` writes it)."
    return (f"- `{name}`: {e['cause']}{' (' + who + ')' if who else ''}: "
            f"{e.get('note', '')}{eff} (commit {commit}).{trace}")


def _span(names: list[str]) -> str:
    """`ep-aa-a0..2` for runs that differ in a trailing number, else the names one by one."""
    stems = {n.rstrip("0123456789") for n in names}
    nums = sorted(int(n[len(next(iter(stems))):]) for n in names) if len(stems) == 1 else []
    if len(names) > 1 and nums and nums == list(range(nums[0], nums[-1] + 1)):
        return f"`{next(iter(stems))}{nums[0]}..{nums[-1]}`"
    return ", ".join(f"`{n}`" for n in sorted(names))


def _story_line(runs: list[tuple[str, dict, bool]]) -> str:
    """One line for the runs of one comparison group (both sides, every replicate): the sides, the
    planted outcome and the note and effect they share."""
    sides: dict[str, list] = {}
    for name, m, has_trace in runs:
        sides.setdefault(m["expect"]["comparison"]["side"], []).append((name, m, has_trace))
    name0, m0, _ = runs[0]
    e, c = m0["expect"], m0["expect"]["comparison"]
    causes = {side: sorted({r[1]["expect"]["cause"] for r in rs}) for side, rs in sorted(sides.items())}
    cause = (", ".join(causes[next(iter(causes))]) if len({tuple(v) for v in causes.values()}) == 1
             else "; ".join(f"{side}: {', '.join(v)}" for side, v in causes.items()))
    eff = e.get("effect")
    eff = f"; measured {eff['metric']} = {eff['value']:g} {eff['unit']}" if eff else ""
    commits = sorted({str((r[1].get("git") or {}).get("commit", "unknown"))[:7] for r in runs})
    untraced = [r[0] for r in runs if not r[2]]
    trace = (" No Perfetto trace bundled (`epscope export RUN` writes it)." if len(untraced) == len(runs)
             else f" No Perfetto trace bundled for {', '.join(untraced)}." if untraced else "")
    vs = " vs ".join(_span([r[0] for r in rs]) for _, rs in sorted(sides.items()))
    return (f"- {vs} ({c['group']}: {c['outcome']}, {len(runs)} runs): {cause}: {e.get('note', '')}{eff} "
            f"(commit {', '.join(commits)}).{trace}")


def readme_section(root) -> str:
    """One line per single catalogue run under `root` and one per comparison story (its runs of
    both sides), from the manifests' expect blocks."""
    root = Path(root)
    lines = [README_BEGIN,
             "## Ground-truth catalogue (ep-*; recorded on 2xH200 by `python -m profiler.workflows.catalogue`)",
             "Each manifest's `expect` block (profiler/groundtruth/expect.py) holds the planted cause and its measured effect; "
             "profiler/workflows/catalogue_plan.py describes every scenario. A comparison story is one line: its "
             "runs of side A vs side B, interleaved replicates of one setting each.",
             ]
    groups: dict[str, list] = {}
    for p in sorted(root.glob("ep-*/manifest.json")):
        m = json.loads(p.read_text())
        e = m.get("expect")
        if not e or not any(p_ in (e.get("planted_by") or "") for p_ in PLANTERS):
            continue
        run = (p.parent.name, m, (p.parent / TRACE).exists())
        c = e.get("comparison")
        if c:
            if c["group"] not in groups:
                groups[c["group"]] = []
                lines.append(c["group"])   # the story's place: its first run's, in name order
            groups[c["group"]].append(run)
        else:
            lines.append(_run_line(*run))
    lines = [_story_line(groups[x]) if x in groups else x for x in lines]
    lines.append(README_END)
    return "\n".join(lines)


def rewrite_readme(root) -> Path:
    """Replace (or append) the catalogue section of root/README.md."""
    path = Path(root) / "README.md"
    text = path.read_text() if path.exists() else "# Bundled traces\n"
    section = readme_section(root)
    if README_BEGIN in text and README_END in text:
        head, rest = text.split(README_BEGIN, 1)
        tail = rest.split(README_END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    return path
