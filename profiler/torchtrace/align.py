"""Join a rank's PyTorch trace to the run's launches, and put the trace on the run's timeline.

Join: ep_core labels each launcher call (labels.py). The trace's launch calls (cuda_runtime /
cuda_driver events whose `correlation` is a kernel's) on the label's thread inside the label's
range, less those made by a PyTorch operator that started inside the label (a cpu_op around the
call: the session's pool slab, aten::zeros / aten::copy_, is made inside the first profiled call of
each geometry, and its fill and copy kernels are no launches of the run; seen on the first H100
recording), are, in time order, the launches `first`, `first + 1`, ... of the run; each launch
call's kernel is the kernel event of the same correlation. A label whose kernels do not all name
launches of the run's rank is not joined (counted in `unmatched`).

Alignment: CUPTI's kernel start and end and the kernels' own `%globaltimer` reads come from one
GPU clock; Kineto moved CUPTI's times to its host clock and the run moved the warps' reads to the
run timeline, so on one rank the two differ by an offset that may drift slowly. Every joined
launch bounds it: its first warp read (`gpu_begin_ns`) and last (`gpu_end_ns`) lie inside its
kernel, so offset = kineto - run is in [kernel start - first read, kernel end - last read], each
side widened by the run's GPU time uncertainty (manifest clock.gpu_time). With a drift d the bound
of launch i applies to offset + d (t_i - t_ref); the width left over all launches,
min(hi_i - d x_i) - max(lo_i - d x_i), is concave in d: the drift that leaves the widest interval
(|d| <= MAX_DRIFT_PPM) is the measured drift, the middle of that interval the offset, its width
the stated uncertainty. No drift leaves a non-empty interval: the trace does not belong to this
run and rank (AlignmentError names the two launches that exclude each other).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ..errors import EpscopeError
from . import kineto as K
from .labels import parse_label

# Drift allowed between Kineto's host clock and the GPU clock over one trace: crystal tolerance
# plus NTP slew stay far below it (both are tens of ppm at most); a trace that needs more is not
# this run's.
MAX_DRIFT_PPM = 200.0
JOIN_COLUMNS = ["rank", "launch", "label_ts_ns", "label_end_ns", "pid", "tid", "call_ts_ns", "call_end_ns",
                "kernel_ts_ns", "kernel_end_ns", "stream", "correlation", "kernel_name"]


class AlignmentError(EpscopeError):
    """A trace that cannot be joined to the run or put on its timeline (the message says why)."""


@dataclass(frozen=True)
class Alignment:
    """Kineto time = run time + offset_ns + drift_ppm * 1e-6 * (run time - ref_ns), known to
    +-width_ns / 2 (offset_ns an integer: Kineto times are ~1.7e18 ns since the epoch, past what a
    double holds to the ns). launches: joined launches that bound it; unmatched: labels of this run and
    rank whose kernels could not be joined; binding_lo / binding_hi: the launches whose bounds
    are tightest (what would have to move to narrow it)."""
    rank: int
    offset_ns: int
    drift_ppm: float
    ref_ns: float
    width_ns: float
    launches: int
    unmatched: int
    binding_lo: int
    binding_hi: int

    def to_run(self, t_kineto: np.ndarray) -> np.ndarray:
        """Kineto host-clock ns -> run timeline ns (int64)."""
        d = self.drift_ppm * 1e-6
        y = (np.asarray(t_kineto, np.int64) - np.int64(self.offset_ns)).astype(np.float64)   # exact, then small
        return np.rint((y + d * self.ref_ns) / (1.0 + d)).astype(np.int64)

    def to_json(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> "Alignment":
        return cls(int(d["rank"]), int(d["offset_ns"]), float(d["drift_ppm"]), float(d["ref_ns"]),
                   float(d["width_ns"]), int(d["launches"]), int(d["unmatched"]), int(d["binding_lo"]),
                   int(d["binding_hi"]))


def labels_of(ev: pd.DataFrame) -> pd.DataFrame:
    """[run, rank, launch, ts_ns, end_ns, pid, tid] of the trace's epscope launch labels."""
    u = ev[ev["kind"] == K.USER]
    names = u["name"].astype(str).to_numpy()
    parsed = [parse_label(n) for n in names]
    ok = np.array([p is not None for p in parsed], bool)
    rows = [p for p in parsed if p is not None]
    u = u[ok]
    return pd.DataFrame({"run": [p.run for p in rows], "rank": np.array([p.rank for p in rows], np.int64),
                         "launch": np.array([p.launch for p in rows], np.int64),
                         "ts_ns": u["ts_ns"].to_numpy(), "end_ns": (u["ts_ns"] + u["dur_ns"]).to_numpy(),
                         "pid": u["pid"].to_numpy(), "tid": u["tid"].to_numpy()})


def trace_rank(trace: K.KinetoTrace, labels: pd.DataFrame, run_name: str) -> int:
    """The trace's rank: distributedInfo's, else its labels' (one rank); refused when they
    disagree or the labels name another run."""
    mine = labels[labels["run"] == run_name]
    others = sorted(set(labels["run"]) - {run_name})
    if len(mine) == 0:
        if others:
            raise AlignmentError(f"{trace.path}: its launch labels name run {others[0]!r}, not {run_name!r}: "
                                 "the trace of another run")
        raise AlignmentError(f"{trace.path}: no epscope launch labels: record the trace with ep_core's profiling "
                             "on inside torch.profiler (ep_core labels each profiled launch), or use "
                             "`epscope trace --torch-profiler`")
    ranks = sorted(set(mine["rank"].tolist()))
    if trace.rank is not None and ranks != [trace.rank]:
        raise AlignmentError(f"{trace.path}: distributedInfo says rank {trace.rank} but its launch labels name "
                             f"rank(s) {ranks}")
    if len(ranks) != 1:
        raise AlignmentError(f"{trace.path}: launch labels of several ranks {ranks} in one trace")
    return ranks[0]


def join(trace: K.KinetoTrace, rank: int, run_name: str, run_launches: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(JOIN_COLUMNS rows, labels not joined) of one rank (see the module docstring)."""
    ev = trace.events
    lab = labels_of(ev)
    lab = lab[(lab["run"] == run_name) & (lab["rank"] == rank)].sort_values("ts_ns")
    kern = ev[ev["kind"] == K.KERNEL]
    kern = kern[kern["correlation"] >= 0].drop_duplicates("correlation").set_index("correlation")
    calls = ev[(ev["kind"] == K.RUNTIME) & ev["correlation"].isin(kern.index)].sort_values("ts_ns")
    have = set(run_launches.loc[run_launches["rank"] == rank, "launch"].astype(int).tolist())
    rows, unmatched = [], 0
    ops = ev[ev["kind"] == K.CPU_OP].sort_values("ts_ns")
    ops_by_thread = {k: (g["ts_ns"].to_numpy(np.int64), (g["ts_ns"] + g["dur_ns"]).to_numpy(np.int64))
                     for k, g in ops.groupby(["pid", "tid"], sort=False)}
    by_thread = {k: g for k, g in calls.groupby(["pid", "tid"], sort=False)}
    # a trace whose launch calls carry other thread ids than its ranges (not seen; Kineto writes the
    # OS thread id on both) is joined within the process instead
    by_process = {k: g for k, g in calls.groupby("pid", sort=False)}
    for lb in lab.itertuples(index=False):
        g = by_thread.get((lb.pid, lb.tid))
        g = by_process.get(lb.pid) if g is None else g
        if g is None:
            unmatched += 1
            continue
        t = g["ts_ns"].to_numpy()
        inside = g.iloc[np.searchsorted(t, lb.ts_ns, "left"): np.searchsorted(t, lb.end_ns, "right")]
        inside = _own_launches(inside, lb.ts_ns, ops_by_thread.get((lb.pid, lb.tid)))
        ids = range(int(lb.launch), int(lb.launch) + len(inside))
        if len(inside) == 0 or any(i not in have for i in ids):
            unmatched += 1
            continue
        for i, c in zip(ids, inside.itertuples(index=False)):
            k = kern.loc[c.correlation]
            rows.append((rank, i, lb.ts_ns, lb.end_ns, lb.pid, lb.tid, c.ts_ns, c.ts_ns + c.dur_ns, int(k["ts_ns"]),
                         int(k["ts_ns"] + k["dur_ns"]), int(k["stream"]), int(c.correlation), str(k["name"])))
    out = pd.DataFrame(rows, columns=JOIN_COLUMNS)
    dup = out["launch"].duplicated(keep=False)
    if dup.any():   # two labels claimed one launch: neither is trusted
        unmatched += int(out.loc[dup, "launch"].nunique())
        out = out[~dup]
    return out.reset_index(drop=True), unmatched


def _own_launches(calls: pd.DataFrame, label_ts: int, ops) -> pd.DataFrame:
    """The launch calls of a label that are the launcher's own: those no PyTorch operator that
    began inside the label (at or after `label_ts`) encloses. `ops`: (starts, ends) of the
    thread's cpu_ops sorted by start, or None."""
    if ops is None or calls.empty:
        return calls
    starts, ends = ops
    keep = []
    for c_ts, c_end in zip(calls["ts_ns"].to_numpy(np.int64), (calls["ts_ns"] + calls["dur_ns"]).to_numpy(np.int64)):
        a, b = np.searchsorted(starts, label_ts, "left"), np.searchsorted(starts, c_ts, "right")
        keep.append(not (b > a and int(ends[a:b].max()) >= c_end))
    return calls[np.array(keep, bool)]


def _width(lo: np.ndarray, hi: np.ndarray, x: np.ndarray, d: float) -> float:
    return float(np.min(hi - d * x) - np.max(lo - d * x))


def align(joined: pd.DataFrame, run_launches: pd.DataFrame, rank: int, slack_ns: float, unmatched: int,
          path: str = "trace") -> Alignment:
    """The rank's Alignment from its joined launches (module docstring); AlignmentError when no
    launch bounds it or the bounds exclude each other."""
    rl = run_launches[(run_launches["rank"] == rank) & (run_launches["gpu_begin_ns"] >= 0)]
    m = joined.merge(rl[["launch", "gpu_begin_ns", "gpu_end_ns"]], on="launch")
    if m.empty:
        raise AlignmentError(f"{path}: rank {rank}: no launch of the run could be joined to a kernel of the trace "
                             f"({unmatched} labels unmatched): is this the trace of this run's profiled steps?")
    # bounds in int64 (exact), then relative to one of them: small enough for doubles
    lo_i = m["kernel_ts_ns"].to_numpy(np.int64) - m["gpu_begin_ns"].to_numpy(np.int64)
    hi_i = m["kernel_end_ns"].to_numpy(np.int64) - m["gpu_end_ns"].to_numpy(np.int64)
    k0 = int(np.median(lo_i))
    lo = (lo_i - k0).astype(np.float64) - slack_ns
    hi = (hi_i - k0).astype(np.float64) + slack_ns
    f = m["gpu_begin_ns"].to_numpy(np.float64)
    ref = float(np.median(f))
    x = f - ref
    d = _best_drift(lo, hi, x)
    w = _width(lo, hi, x, d)
    ilo, ihi = int(np.argmax(lo - d * x)), int(np.argmin(hi - d * x))
    if w < 0:
        la, lb = int(m["launch"].iloc[ilo]), int(m["launch"].iloc[ihi])
        raise AlignmentError(
            f"{path}: rank {rank}: no clock offset puts every joined launch's warps inside its CUPTI kernel "
            f"(launches {la} and {lb} exclude each other by {-w / 1e3:.1f} µs at the best drift, "
            f"{d * 1e6:+.1f} ppm, of ±{MAX_DRIFT_PPM:.0f} allowed): the trace is not of this run and rank")
    mid = (float(np.max(lo - d * x)) + float(np.min(hi - d * x))) / 2
    return Alignment(rank, k0 + int(round(mid)), d * 1e6, ref, w, len(m), unmatched, int(m["launch"].iloc[ilo]),
                     int(m["launch"].iloc[ihi]))


def _best_drift(lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> float:
    """The drift in [-MAX, MAX] (ppm as a fraction) that maximises the concave width; 0 when the
    launches span no time or every drift leaves the same width (the one nearest 0 otherwise)."""
    dmax = MAX_DRIFT_PPM * 1e-6
    if len(x) < 2 or np.ptp(x) <= 0:
        return 0.0
    a, b = -dmax, dmax
    for _ in range(100):   # ternary search on a concave function: 100 steps shrink 2e-4 below 1e-21
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if _width(lo, hi, x, m1) < _width(lo, hi, x, m2):
            a = m1
        else:
            b = m2
    d = (a + b) / 2
    if abs(_width(lo, hi, x, 0.0) - _width(lo, hi, x, d)) <= 1e-9:
        return 0.0
    return d
