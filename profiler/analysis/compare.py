"""Compare two runs or two groups of runs, A vs B (the returned columns are documented in the
package docstring; the statistics are profiler.analysis.stats).

Samples, one per (run, iteration):
* end-to-end: the op's latency, the slowest rank's GPU time in the iteration (per rank: the sum
  over its launches of first warp begin to last warp end), so host gaps between launches and a
  late host never count as kernel time (issue 8: spans with host gaps made an A/A pair differ);
* per kernel (phase ''): the same for that kernel's launches;
* per (kernel, phase): the mean duration of the phase's spans in the iteration;
* per (kernel, 'host call'), when the runs record host rows: the mean duration of the host calls
  that launched the kernel in the iteration (a host-side knob moves these, not kernel time).
The run is the unit of replication: with one run per side nothing is called faster or slower.

Before any statistic the two sides' workloads are checked: runs that record a different kind of
workload, number of ranks or set of kernels are refused (the numbers would compare different
things); a different shape or dtype is flagged (it may be the knob under test) and named in the
verdict.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler.groundtruth.expect import Cause

from . import stats as S
from . import unfinished
from .exactsum import dense_codes, exact_sum
from .keys import isin_names
from . import graph as G
from . import tables_fast
from . import timemodel as TM
from .critical_path import from_graph
from .verdict import Verdict, fmt_ns

COLUMNS = ["kernel", "phase", "runs_a", "runs_b", "n_a", "n_b", "median_a_ns", "median_b_ns", "diff_ns", "diff_pct",
           "ci_low_ns", "ci_high_ns", "noise_ns", "mde_ns", "runs_needed", "heavy_tail", "verdict"]
DIFF_COLUMNS = ["field", "a", "b"]
CP_COLUMNS = ["kernel", "phase", "share_a", "share_b", "in_a", "in_b", "change"]
PER_RANK_COLUMNS = ["rank", "runs_a", "runs_b", "median_a_ns", "median_b_ns", "diff_ns", "diff_pct", "verdict"]
ON_PATH_SHARE = 0.01   # a phase is "on the critical path" with at least 1% of the path time
REFUSE_FIELDS = ("kind", "ranks")           # workload fields that make two runs incomparable
FLAG_FIELDS = ("tokens", "hidden", "topk", "experts", "dtype")   # may be the knob under test: flagged
E2E = "end-to-end"
HOST_CALL = "host call"          # per kernel: the mean duration of the host calls that launch it
ENTRY_SKEW = "entry skew"        # per kernel: first rank's entry -> last rank's entry (timemodel)
# Warm-up. A run's leading iterations are warm-up while each one's op latency after entry (its
# end-to-end sample) exceeds the median of the run's iterations after it by more than WARMUP_SHARE;
# they are set aside from every row of the comparison, and the comparison says so. Where 5 % comes
# from: on the bundled A/B and A/A groups (traces/ll-*, 8 iterations a run) the first one or two
# iterations are 5-28 % slower than the rest (ll-split A's second: 5.1-6.8 %), while an iteration
# from the third on is within 3.1 % of its run's median (bar single outliers mid-run, never
# leading: ll-slice-floor-a2's sixth, +25 %) and the leading iterations of the ep-* runs (2-3
# iterations, warmed up before recording) are within 2.7 % of the rest. Issue 29: warm-up widened
# the run-to-run spread until a -18.5 % end-to-end change read "within noise".
WARMUP_SHARE = 0.05
# A percentage of a base near zero reads huge while the op hardly moves (issue 29: an entry skew of
# a fraction of a µs in A read "+41671.4%"): a row's change is stated in percent only when A's
# median is at least RELATIVE_BASE_SHARE of A's end-to-end median (the op's latency), else as an
# absolute difference. On the bundled groups this sets aside the rows of a few µs in a 560 µs op
# (ep-aa: layout, barrier, entry skews) and none of the phases a planted knob moves.
RELATIVE_BASE_SHARE = 0.01
WARMUP_COLUMNS = ["side", "run", "name", "iteration", "value_ns", "rest_median_ns", "excess_pct"]


@dataclass
class Comparison:
    per_phase: pd.DataFrame          # COLUMNS: per kernel (phase '') and per (kernel, phase)
    end_to_end: pd.DataFrame         # one row, COLUMNS (kernel '', phase 'end-to-end')
    per_rank: pd.DataFrame           # PER_RANK_COLUMNS: each rank's GPU time per iteration
    critical_path_changes: pd.DataFrame
    verdict: Verdict
    refused: tuple = ()              # why the runs cannot be compared (empty: they can)
    flags: tuple = ()                # workload differences the comparison went ahead with, each with what it changes
    manifest_diff: pd.DataFrame = field(default=None, repr=False)   # DIFF_COLUMNS: every manifest field that differs
    samples: pd.DataFrame = field(default=None, repr=False)   # [side, run, iteration, kernel, phase, value_ns]
    warmup: pd.DataFrame = field(default=None, repr=False)    # WARMUP_COLUMNS: the iterations set aside


SAMPLE_COLUMNS = ["iteration", "kernel", "phase", "value_ns"]
PATH_COLUMNS = ["kernel", "phase", "duration_ns"]


@dataclass(frozen=True)
class RunInputs:
    """What a comparison reads of one run, computed once per run from one dependency graph (or
    from its chunks' tables) and small enough to store beside the run (issue 20: compare of 3 runs
    a side reads these instead of 3 event tables and 3 graphs a side).

    samples: SAMPLE_COLUMNS, one row per (iteration, kernel, phase) sample (see the module
    docstring); per-rank rows have kernel '' and phase 'rank N'. path: PATH_COLUMNS, the critical
    path's time per (kernel, phase) summed over the run's iterations (phase '' rows excluded);
    path_total_ns: the iterations' total time it is a share of. ranks / kernels: the workload as
    recorded (None / () for a run without events). waits: the phases its registry declares as
    waits or idle (they never headline a comparison on their own)."""
    name: str
    manifest: dict
    ranks: int | None
    kernels: tuple
    samples: pd.DataFrame
    path: pd.DataFrame
    path_total_ns: int
    waits: frozenset

    def __post_init__(self):
        for what, df, cols in (("samples", self.samples, SAMPLE_COLUMNS), ("path", self.path, PATH_COLUMNS)):
            if list(df.columns) != cols:
                raise ValueError(f"RunInputs.{what} of {self.name!r}: columns {list(df.columns)}, expected {cols}")
        if self.path_total_ns < 0:
            raise ValueError(f"RunInputs of {self.name!r}: negative path_total_ns {self.path_total_ns}")


def _run_name(x, m: dict) -> str:
    return str(getattr(x, "name", None) or getattr(getattr(x, "entry", None), "name", None) or m.get("name", ""))


def _inputs(x, registry) -> list[RunInputs]:
    """One RunInputs per run of `x`: an event table, a run (anything with .events, and .launches /
    .manifest when it has them), a RunInputs, or a list of those."""
    if isinstance(x, RunInputs):
        return [x]
    if isinstance(x, pd.DataFrame):
        return [run_inputs(x, registry=registry)]
    if hasattr(x, "events"):
        m = getattr(x, "manifest", None) or {}
        la = getattr(x, "launches", None)
        return [run_inputs(x.events, manifest=m, name=_run_name(x, m), registry=registry,
                           launches=la if isinstance(la, pd.DataFrame) else None)]
    out = []
    for r in x:
        out.extend(_inputs(r, registry))
    return out


# -- samples ------------------------------------------------------------------------------------
def entry_cuts(rows: pd.DataFrame | None) -> pd.Series:
    """Per GPU (rank, launch): its op occurrence's last entry (NaN when a rank is missing from it),
    from the time model's launch rows (timemodel.launch_rows: each a function of its own iteration,
    so a chunk of whole iterations gives its launches' cuts) or its per_rank + ops tables."""
    if rows is None or rows.empty:
        return pd.Series([], dtype=float, index=pd.MultiIndex.from_arrays([[], []], names=["rank", "launch"]))
    return pd.Series(rows["last_entry_ns"].to_numpy(float),
                     index=pd.MultiIndex.from_arrays([rows["rank"].to_numpy(), rows["launch"].to_numpy()]))


def _model_cuts(tm: TM.TimeModel) -> pd.Series:
    if tm.per_rank.empty:
        return entry_cuts(None)
    return entry_cuts(tm.per_rank.merge(tm.ops[["iteration", "kernel", "occurrence", "last_entry_ns"]],
                                        on=["iteration", "kernel", "occurrence"]))


def _clipped_waits(ev: pd.DataFrame, rows: np.ndarray, sem, cuts: pd.Series) -> np.ndarray:
    """The durations of ev's spans at `rows`, with the time before their op occurrence's last entry
    (cuts: entry_cuts) removed from the spans of waits a peer releases (registry `waits_for`): the wait for a late
    peer is the entry skew row's, not the phase's. A wait no peer releases (a pipeline stall)
    keeps its time."""
    b = ev["begin_ns"].to_numpy()[rows]
    e = ev["end_ns"].to_numpy()[rows]
    dur = (e - b).astype(float)
    peer_waits = [w for w, rel in sem.waits.items() if rel]
    if cuts.empty or not peer_waits:
        return dur
    w = np.flatnonzero(isin_names(ev["phase"], peer_waits)[rows])
    if not len(w):
        return dur
    at = rows[w]
    c = _cut_of(cuts, ev["rank"].to_numpy()[at], ev["launch"].to_numpy()[at])
    bw, ew = b[w].astype(float), e[w].astype(float)
    dur[w] = np.where(np.isfinite(c), ew - np.clip(c, bw, ew), ew - bw)
    return dur


def _cut_of(cuts: pd.Series, rank: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """cuts.reindex((rank, launch) pairs).to_numpy(float), by a search in the sorted keys rather than
    a MultiIndex of every wait row (pandas hashed a million pairs a 2.5 M-event chunk). Integer
    keys that pack into one int64 only; otherwise (and for keys reindex refuses) pandas answers."""
    kr = cuts.index.get_level_values(0).to_numpy()
    kl = cuts.index.get_level_values(1).to_numpy()
    pandas = lambda: cuts.reindex(pd.MultiIndex.from_arrays([rank, launch])).to_numpy(float)
    if not len(kr) or not all(np.issubdtype(a.dtype, np.integer) for a in (kr, kl, rank, launch)):
        return pandas()
    lo = int(min(kl.min(), launch.min()))
    span = int(max(kl.max(), launch.max())) - lo + 1
    r0, r1 = int(min(kr.min(), rank.min())), int(max(kr.max(), rank.max()))
    if (r1 - r0 + 1) * span >= 2 ** 62:
        return pandas()
    key = (kr.astype(np.int64) - r0) * span + (kl.astype(np.int64) - lo)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    if sk.size > 1 and not bool(np.all(sk[1:] > sk[:-1])):      # duplicate labels: reindex raises
        return pandas()
    want = (rank.astype(np.int64) - r0) * span + (launch.astype(np.int64) - lo)
    at = np.minimum(np.searchsorted(sk, want), sk.size - 1)
    vals = cuts.to_numpy(float)[order]
    return np.where(sk[at] == want, vals[at], np.nan)


def _model_samples(tm: TM.TimeModel) -> list[pd.DataFrame]:
    """End-to-end, rank, kernel and entry-skew samples: the time model's (op latency after entry)."""
    parts = []
    it = tm.iterations.dropna(subset=["op_latency_ns"])
    if len(it):
        parts.append(pd.DataFrame({"iteration": it["iteration"], "kernel": "", "phase": E2E,
                                   "value_ns": it["op_latency_ns"]}))
        pr = tm.rank_iterations()
        parts.append(pd.DataFrame({"iteration": pr["iteration"], "kernel": "", "phase": "rank " + pr["rank"].astype(str),
                                   "value_ns": pr["after_entry_ns"]}))
        k = tm.kernel_iterations().dropna(subset=["op_latency_ns"])
        parts.append(pd.DataFrame({"iteration": k["iteration"], "kernel": k["kernel"], "phase": "",
                                   "value_ns": k["op_latency_ns"]}))
        if tm.ranks > 1:
            parts.append(pd.DataFrame({"iteration": k["iteration"], "kernel": k["kernel"], "phase": ENTRY_SKEW,
                                       "value_ns": k["entry_skew_ns"]}))
    return parts


@dataclass(frozen=True)
class EventSamples:
    """The host-call and phase samples of the events of whole iterations (every sample is a mean
    within one iteration, so a chunk of whole iterations gives its iterations' samples whole), and
    the ranks and kernels those events record."""
    samples: pd.DataFrame            # SAMPLE_COLUMNS
    ranks: frozenset
    kernels: frozenset


def event_samples(ev: pd.DataFrame, sem, cuts: pd.Series) -> EventSamples:
    """EventSamples of `ev` (unfinished waits closed); cuts: entry_cuts of its launches."""
    parts = _fast_samples(ev, sem, cuts)
    if parts is not None:
        return EventSamples(samples=_frame(parts), ranks=_used_ranks(ev["rank"]), kernels=_used_kernels(ev["kernel"]))
    parts = []
    kind = ev["kind"]
    hs = np.flatnonzero(isin_names(kind, ["host"]))
    if len(hs):
        # the host calls that launch each kernel (a host row's phase is its kernel): what a host-side
        # knob (buffers and plans cached or rebuilt per call) moves while the kernels' times stay
        parts.append(_mean_samples(ev, hs, False, ev["end_ns"].to_numpy()[hs] - ev["begin_ns"].to_numpy()[hs]))
    span = np.flatnonzero(isin_names(kind, ["span"]))
    if len(span):
        parts.append(_mean_samples(ev, span, True, _clipped_waits(ev, span, sem, cuts)))
    return EventSamples(samples=_frame(parts), ranks=frozenset(int(r) for r in pd.unique(ev["rank"])),
                        kernels=frozenset(str(k) for k in pd.unique(ev["kernel"])))


_STORED = {"iteration": np.int32, "rank": np.int16, "launch": np.int32}


def _fast_samples(ev: pd.DataFrame, sem, cuts: pd.Series) -> list[pd.DataFrame] | None:
    """event_samples' parts (host calls, then spans) from one compiled pass over the events per
    part (profiler.analysis.tables_fast), equal to _mean_samples of _clipped_waits to the bit; None
    where it cannot run or a sum could round (integral ns below 2**53: exactsum), or a column is
    not categorical with distinct names, or the keys are not dense: the numpy path then runs."""
    cat = [ev[c] for c in ("kind", "kernel", "phase")]
    if not tables_fast.enabled() or not len(ev) or not all(isinstance(c.dtype, pd.CategoricalDtype) for c in cat):
        return None
    names = [[str(x) for x in c.cat.categories] for c in cat[1:]]
    it = ev["iteration"].to_numpy()
    i0 = int(it.min())
    nk, nph = max(len(names[0]), 1), max(len(names[1]), 1)
    table = _cut_table(cuts, sem)
    if (any(len(set(n)) != len(n) for n in names) or table is None
            or (int(it.max()) - i0 + 1) * nk * nph > max(4 * len(ev), 1 << 16)):
        return None
    codes = [c.cat.codes.to_numpy() for c in cat]
    ints = {c: ev[c].to_numpy() for c in _STORED}
    stored = all(c.dtype == np.int8 for c in codes) and all(ints[c].dtype == d for c, d in _STORED.items())
    if not stored:
        codes = [np.ascontiguousarray(c, np.int64) for c in codes]
        ints = {c: np.ascontiguousarray(v, np.int64) for c, v in ints.items()}
    r0, n_rank, lo, span, cut, has = table
    waits = set(w for w, rel in sem.waits.items() if rel) if len(cut) else set()
    wait_ph = np.zeros(nph, bool)
    wait_ph[:len(names[1])] = [c in waits for c in cat[2].cat.categories]
    b, e = (np.ascontiguousarray(ev[c].to_numpy(), np.int64) for c in ("begin_ns", "end_ns"))
    parts = []
    for kind, by_phase in (("host", False), ("span", True)):
        if kind not in list(cat[0].cat.categories):
            continue
        n_keys = (int(it.max()) - i0 + 1) * nk * (nph if by_phase else 1)
        counts, sums, stats = np.zeros(n_keys, np.int64), np.zeros(n_keys, np.int64), np.zeros(3, np.int64)
        tables_fast.run_void(tables_fast.SAMPLE_VARIANTS["stored" if stored else "wide"], codes[0],
                             np.int64(list(cat[0].cat.categories).index(kind)), ints["iteration"], np.int64(i0),
                             codes[1], np.int64(nk), codes[2], np.int64(nph), by_phase, b, e, wait_ph,
                             ints["rank"], ints["launch"], np.int64(r0), np.int64(n_rank), np.int64(lo),
                             np.int64(span), cut, has, counts, sums, stats)
        if stats[0] >= _EXACT or stats[1] >= _EXACT:
            return None
        if stats[2]:
            parts.append(_keyed_means(counts, sums, i0, names if by_phase else names[:1], by_phase))
    return parts


_EXACT = 2 ** 53


def _used_ranks(col: pd.Series) -> frozenset:
    """The ranks a column holds (pd.unique's, by one compiled pass marking them)."""
    v = col.to_numpy()
    name = tables_fast.SEEN_VARIANTS.get(v.dtype)
    if name is None or not len(v):
        return frozenset(int(r) for r in pd.unique(col))
    lo, hi = int(v.min()), int(v.max())
    seen = np.zeros(hi - lo + 1, bool)
    tables_fast.run_void(name, np.ascontiguousarray(v), np.int64(lo), seen)
    return frozenset(int(r) for r in np.flatnonzero(seen) + lo)


def _used_kernels(col: pd.Series) -> frozenset:
    """The kernel names a categorical column holds as str (pd.unique's: 'nan' for a missing one)."""
    codes = col.cat.codes.to_numpy()
    name = tables_fast.SEEN_VARIANTS.get(codes.dtype)
    if name is None:
        return frozenset(str(k) for k in pd.unique(col))
    seen = np.zeros(len(col.cat.categories) + 1, bool)
    tables_fast.run_void(name, np.ascontiguousarray(codes), np.int64(-1), seen)
    names = [str(col.cat.categories[c]) for c in np.flatnonzero(seen[1:])]
    return frozenset(names + (["nan"] if seen[0] else []))


def _cut_table(cuts: pd.Series, sem) -> tuple | None:
    """entry_cuts as a dense table over (rank, launch): (r0, ranks, lo, span, cut int64, has cut),
    empty where no wait is cut (none, or no wait a peer releases); None where _cut_of would not
    search (keys not integers, duplicates) or a cut is not an integer float64 holds exactly."""
    if cuts.empty or not any(rel for rel in sem.waits.values()):
        return 0, 0, 0, 0, np.zeros(0, np.int64), np.zeros(0, bool)
    kr = cuts.index.get_level_values(0).to_numpy()
    kl = cuts.index.get_level_values(1).to_numpy()
    if not all(np.issubdtype(a.dtype, np.integer) for a in (kr, kl)):
        return None
    r0, lo = int(kr.min()), int(kl.min())
    n_rank, span = int(kr.max()) - r0 + 1, int(kl.max()) - lo + 1
    if n_rank * span > (1 << 22):
        return None
    at = (kr.astype(np.int64) - r0) * span + (kl.astype(np.int64) - lo)
    v = cuts.to_numpy(float)
    fin = np.isfinite(v)
    if (np.unique(at).size != at.size or not bool(np.all(v[fin] == np.floor(v[fin])))
            or (fin.any() and float(np.abs(v[fin]).max()) >= _EXACT)):
        return None
    cut, has = np.zeros(n_rank * span, np.int64), np.zeros(n_rank * span, bool)
    cut[at[fin]] = v[fin].astype(np.int64)
    has[at[fin]] = True
    return r0, n_rank, lo, span, cut, has


def _keyed_means(counts: np.ndarray, sums: np.ndarray, i0: int, names: list, by_phase: bool) -> pd.DataFrame:
    """_mean_samples' frame from the dense per-key counts and sums of _fast_samples."""
    uniq = np.flatnonzero(counts)
    rest, named = uniq, {}
    for col, nm in reversed(list(zip(["kernel", "phase"], names))):
        rest, code = np.divmod(rest, max(len(nm), 1))
        named[col] = np.asarray(nm, dtype=object)[code]
    return pd.DataFrame({"iteration": rest + i0, "kernel": named["kernel"],
                         "phase": named["phase"] if by_phase else HOST_CALL, "value_ns": sums[uniq] / counts[uniq]})


def _mean_samples(ev: pd.DataFrame, rows: np.ndarray, by_phase: bool, value: np.ndarray) -> pd.DataFrame:
    """[iteration, kernel, phase, value_ns]: the mean of `value` (one per row of `rows`) per
    (iteration, kernel, phase) of those rows (by_phase False: per (iteration, kernel), phase
    HOST_CALL), as DataFrame.groupby([...], sort=True, observed=True)["value_ns"].mean() gives it
    (rows with a missing kernel or phase dropped). Sums by bincount over the dense group codes,
    not pandas' group-by (0.2 s and 190 MB above the graph a 2.5 M-event chunk: the peak of the
    chunk's tables, issue 31); where a float sum could round (values not integral, or too large)
    or a column's names are not distinct strings, pandas computes it: the means are its to the bit."""
    v = np.asarray(value, dtype=np.float64)
    cols = ["kernel", "phase"] if by_phase else ["kernel"]
    keys = [_name_codes(ev[c], rows) for c in cols]
    if not exact_sum(v) or any(k is None for k in keys):
        return _mean_samples_pandas(ev, rows, cols, value)
    it = ev["iteration"].to_numpy()[rows].astype(np.int64)
    i0 = int(it.min()) if it.size else 0
    key, ok = it - i0, np.ones(v.size, bool)
    for c, names in keys:
        key = key * max(len(names), 1) + c
        ok &= c >= 0
    uniq, inv = dense_codes(key[ok])
    counts = np.bincount(inv, minlength=uniq.size)
    sums = np.bincount(inv, weights=v[ok], minlength=uniq.size)
    rest, named = uniq, {}
    for col, (_, names) in reversed(list(zip(cols, keys))):
        rest, code = np.divmod(rest, max(len(names), 1))
        named[col] = np.asarray(names, dtype=object)[code]
    return pd.DataFrame({"iteration": rest + i0, "kernel": named["kernel"],
                         "phase": named["phase"] if by_phase else HOST_CALL, "value_ns": sums / counts})


def _name_codes(col: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, list[str]] | None:
    """(codes, -1 for a missing value; the names as strings) of a column's `rows`: its categories'
    when it has them (no string per row); None when two names read as one string."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        c, names = col.cat.codes.to_numpy()[rows], [str(x) for x in col.cat.categories]
    else:
        c, uniq = pd.factorize(col.iloc[rows])
        names = [str(x) for x in uniq]
    return (c.astype(np.int64), names) if len(set(names)) == len(names) else None


def _mean_samples_pandas(ev: pd.DataFrame, rows: np.ndarray, cols: list, value) -> pd.DataFrame:
    """_mean_samples through pandas' group-by (its compensated sums: the reference)."""
    # grouped on the categorical columns (.array keeps them categorical: .to_numpy() would make a
    # string object per row, 1.7 s at 10 M events); names become strings on the grouped rows only
    d = pd.DataFrame({"iteration": ev["iteration"].to_numpy()[rows], **{c: ev[c].array[rows] for c in cols},
                      "value_ns": value})
    m = d.groupby(["iteration", *cols], sort=True, observed=True)["value_ns"].mean().reset_index()
    return m.assign(kernel=m["kernel"].astype(str), phase=m["phase"].astype(str) if "phase" in cols else HOST_CALL)


def _frame(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame({"iteration": pd.Series([], dtype="int64"), "kernel": pd.Series([], dtype=str),
                             "phase": pd.Series([], dtype=str), "value_ns": pd.Series([], dtype=float)})
    out = pd.concat(parts, ignore_index=True)[SAMPLE_COLUMNS]
    # names as pandas' string dtype (what a stored copy reads back as: profiler.analysis.stored),
    # rows in one order whatever grouped them (categorical group keys come in category order)
    out = out.astype({"iteration": "int64", "kernel": str, "phase": str, "value_ns": float})
    return out.sort_values(["iteration", "kernel", "phase"], kind="stable", ignore_index=True)


def path_per_phase(cp) -> tuple[pd.DataFrame, int]:
    """(PATH_COLUMNS, total): a critical path's time per (kernel, phase) summed over its iterations,
    and the iterations' total time (the shares' denominator)."""
    seg = cp.segments[cp.segments["phase"] != ""]
    s = seg.groupby(["kernel", "phase"])["duration_ns"].sum()
    path = pd.DataFrame({"kernel": pd.Series([str(k) for k, _ in s.index], dtype=str),
                         "phase": pd.Series([str(p) for _, p in s.index], dtype=str),
                         "duration_ns": s.to_numpy(np.int64)}, columns=PATH_COLUMNS)
    return path, int(cp.total_ns["total_ns"].sum())


def inputs_from(*, tm: TM.TimeModel, cp, parts, sem, manifest: dict | None = None, name: str = "") -> RunInputs:
    """A run's RunInputs from its time model and critical path (computed whole or in chunks of
    iterations: profiler.analysis.chunked) and the EventSamples of its chunks (event_samples of
    each chunk of whole iterations). Equal to run_inputs on the whole table
    (tests/analysis/test_compare_inputs.py)."""
    parts = [p for p in parts if p.ranks]
    ranks = set().union(*(p.ranks for p in parts)) if parts else set()
    kernels = set().union(*(p.kernels for p in parts)) if parts else set()
    path, total = path_per_phase(cp)
    samples = _frame(_model_samples(tm) + [p.samples for p in parts if len(p.samples)])
    return RunInputs(name=name, manifest=dict(manifest or {}), ranks=len(ranks) if parts else None,
                     kernels=tuple(sorted(kernels)), samples=samples, path=path, path_total_ns=total,
                     waits=frozenset(set(sem.waits) | set(sem.idle)))


def inputs_of_graph(g: G.Graph, cp, events: pd.DataFrame, *, manifest: dict | None = None,
                    name: str = "") -> RunInputs:
    """A run's RunInputs from the dependency graph of its whole table (`events`, unfinished waits
    closed) and the critical path found on it."""
    tm = TM.time_model(g)
    return inputs_from(tm=tm, cp=cp, parts=[event_samples(events, g.sem, _model_cuts(tm))], sem=g.sem,
                       manifest=manifest, name=name)


def run_inputs(events: pd.DataFrame, *, manifest: dict | None = None, name: str = "", registry=None,
               launches: pd.DataFrame | None = None) -> RunInputs:
    """A run's RunInputs from its whole event table (one dependency graph). registry: the phase
    registry to read it with (default: the manifest's)."""
    m = manifest or {}
    ev = unfinished.close(events, launches)
    g = G.build(ev, registry or m.get("registry"))
    if not len(ev):
        empty = pd.DataFrame({"kernel": pd.Series([], dtype=str), "phase": pd.Series([], dtype=str),
                              "duration_ns": pd.Series([], dtype="int64")})
        return RunInputs(name=name, manifest=dict(m), ranks=None, kernels=(), samples=_frame([]), path=empty,
                         path_total_ns=0, waits=frozenset(set(g.sem.waits) | set(g.sem.idle)))
    return inputs_of_graph(g, from_graph(g, verdict=False), ev, manifest=m, name=name)


def samples(runs: list[RunInputs], side: str) -> pd.DataFrame:
    """[side, run, iteration, kernel, phase, value_ns]: every sample the comparison uses (per-rank
    samples have kernel '' and phase 'rank N')."""
    parts = [r.samples.assign(run=i) for i, r in enumerate(runs) if len(r.samples)]
    if not parts:
        return pd.DataFrame(columns=["side", "run", "iteration", "kernel", "phase", "value_ns"])
    out = pd.concat(parts, ignore_index=True)
    out.insert(0, "side", side)
    out["value_ns"] = out["value_ns"].astype(float)
    return out[["side", "run", "iteration", "kernel", "phase", "value_ns"]]


def warmup_iterations(values: np.ndarray, share: float | None = None) -> int:
    """How many leading values (one run's end-to-end samples in iteration order) are warm-up: each
    above (1 + share) x the median of the values after it (module constant WARMUP_SHARE); at most
    half of them, and never fewer than 2 kept (with 2 samples nothing is set aside: one later
    iteration is no baseline)."""
    share = WARMUP_SHARE if share is None else share
    x = np.asarray(values, float)
    n = len(x)
    w = 0
    while w < min(n // 2, n - 2) and x[w] > (1 + share) * float(np.median(x[w + 1:])):
        w += 1
    return w


def set_aside_warmup(s: pd.DataFrame, names: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the samples without each run's warm-up iterations, WARMUP_COLUMNS rows for those set aside).
    s: one side's samples (compare.samples); names: its runs' names by run index."""
    e2e = s[(s["kernel"] == "") & (s["phase"] == E2E)].sort_values(["run", "iteration"], kind="stable")
    rows, drop = [], []
    for run, g in e2e.groupby("run", sort=True):
        v, its = g["value_ns"].to_numpy(float), g["iteration"].to_numpy()
        w = warmup_iterations(v)
        for i in range(w):
            rest = float(np.median(v[i + 1:]))
            rows.append({"side": str(s["side"].iloc[0]), "run": int(run), "name": names[int(run)],
                         "iteration": int(its[i]), "value_ns": float(v[i]), "rest_median_ns": rest,
                         "excess_pct": 100 * (v[i] / rest - 1)})
            drop.append((int(run), int(its[i])))
    table = pd.DataFrame(rows, columns=WARMUP_COLUMNS)
    if not drop:
        return s, table
    key = pd.MultiIndex.from_arrays([s["run"].to_numpy(), s["iteration"].to_numpy()])
    keep = ~key.isin(pd.MultiIndex.from_tuples(drop))
    return s[keep].reset_index(drop=True), table


def warmup_note(table: pd.DataFrame, runs: int) -> str:
    """The line that says which iterations were set aside as warm-up ('' when none)."""
    if table.empty:
        return ""
    per_run = table.groupby(["side", "run"]).size()
    counts = sorted(set(per_run.tolist()))
    k = ("the first iteration" if counts == [1] else f"the first {counts[0]} iterations" if len(counts) == 1 else
         f"the first {counts[0]}-{counts[-1]} iterations")
    lo, hi = table["excess_pct"].min(), table["excess_pct"].max()
    return (f"warm-up set aside: {k} of {len(per_run)} of the {runs} runs ({len(table)} iterations, "
            f"{lo:.0f}-{hi:.0f}% slower than the later iterations of their run; rule: a run's leading "
            f"iterations more than {100 * WARMUP_SHARE:.0f}% above the median of those after them, "
            f"op latency after entry)")


# -- workloads ----------------------------------------------------------------------------------
def _workload(r: RunInputs) -> dict:
    w = dict((r.manifest or {}).get("workload") or {})
    w["ranks"] = r.ranks if r.ranks is not None else w.get("ranks")
    w["kernels"] = r.kernels     # the kernels recorded
    return w


def check_workloads(ra: list[RunInputs], rb: list[RunInputs]) -> tuple[list[str], list[str]]:
    """(reasons to refuse, differences to flag): one message per workload field whose values
    differ between or within the sides, naming each side's values."""
    if not ra or not rb:
        return [], []
    wa, wb = [_workload(r) for r in ra], [_workload(r) for r in rb]
    refuse, flag = [], []
    for f in REFUSE_FIELDS + ("kernels",) + FLAG_FIELDS:
        va = [w.get(f) for w in wa if w.get(f) is not None]
        vb = [w.get(f) for w in wb if w.get(f) is not None]
        if not va or not vb or len(set(va) | set(vb)) == 1:
            continue

        def shown(vs):
            u = list(dict.fromkeys(vs))
            return " / ".join("{" + ", ".join(v) + "}" if isinstance(v, tuple) else str(v) for v in u)
        msg = f"{f}: {shown(va)} in A, {shown(vb)} in B"
        (flag if f in FLAG_FIELDS else refuse).append(msg)
    return refuse, flag


# -- statistics ---------------------------------------------------------------------------------
def _groups(sa: pd.DataFrame) -> list[np.ndarray]:
    return [g["value_ns"].to_numpy() for _, g in sa.groupby("run")] if len(sa) else []


def _as_row(kernel: str, phase: str, c: S.SampleComparison) -> dict:
    verdict = c.verdict
    if verdict == S.WITHIN_NOISE and not c.powered:
        verdict = S.CANNOT_TELL       # it could not have seen a change the project would act on
    return {"kernel": kernel, "phase": phase, "runs_a": c.runs_a, "runs_b": c.runs_b, "n_a": c.n_a, "n_b": c.n_b,
            "median_a_ns": c.median_a, "median_b_ns": c.median_b, "diff_ns": c.diff, "diff_pct": c.diff_pct,
            "ci_low_ns": c.ci_low, "ci_high_ns": c.ci_high, "noise_ns": c.noise, "mde_ns": c.mde,
            "runs_needed": c.runs_needed, "heavy_tail": c.heavy_tail, "verdict": verdict}


def _row(kernel: str, phase: str, sa: pd.DataFrame, sb: pd.DataFrame, n_boot: int, seed: int, alpha: float,
         tests: int = 1) -> dict:
    c = S.compare_samples(_groups(sa), _groups(sb), n_boot=n_boot, seed=seed, alpha=alpha, tests=tests)
    return _as_row(kernel, phase, c)


def _path_shares(runs: list[RunInputs]) -> pd.Series:
    parts = [r.path.set_index(["kernel", "phase"])["duration_ns"] for r in runs]
    total = sum(r.path_total_ns for r in runs)
    if not parts or total == 0:
        return pd.Series(dtype=float)
    s = pd.concat(parts).groupby(level=[0, 1]).sum()
    return s / total


def _path_changes(ra, rb) -> pd.DataFrame:
    pa, pb = _path_shares(ra), _path_shares(rb)
    idx = pa.index.union(pb.index)
    cpc = pd.DataFrame({"share_a": pa.reindex(idx).fillna(0.0), "share_b": pb.reindex(idx).fillna(0.0)})
    cpc["in_a"] = cpc["share_a"] >= ON_PATH_SHARE
    cpc["in_b"] = cpc["share_b"] >= ON_PATH_SHARE
    cpc = cpc[cpc["in_a"] | cpc["in_b"]]
    cpc["change"] = np.where(cpc["in_a"] & cpc["in_b"], "stayed", np.where(cpc["in_b"], "entered", "left"))
    cpc = cpc.reset_index()
    cpc.columns = ["kernel", "phase"] + list(cpc.columns[2:])
    return cpc[CP_COLUMNS].sort_values(["change", "kernel", "phase"], kind="stable").reset_index(drop=True)


# fields that name a run rather than configure it: never listed as a difference
IDENTITY_FIELDS = ("name", "description", "created", "version_id", "num_events", "expect", "headline", "warnings",
                   "drops", "registry", "clock", "status", "error", "git.dirty")


def _flatten(d, prefix="") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v, sort_keys=True, default=str) if isinstance(v, (list, tuple)) else v
    return out


def manifest_diff(ra: list[RunInputs], rb: list[RunInputs]) -> pd.DataFrame:
    """DIFF_COLUMNS: every manifest field (flattened: 'workload.dtype', 'config.dispatch.num_sms')
    whose values differ between the sides, each side's values joined by ' / '."""
    fa, fb = [_flatten(r.manifest) for r in ra], [_flatten(r.manifest) for r in rb]
    keys = sorted(set().union(*fa, *fb)) if fa or fb else []
    rows = []
    for k in keys:
        if any(k == f or k.startswith(f + ".") for f in IDENTITY_FIELDS):
            continue
        va = list(dict.fromkeys(str(f.get(k, "—")) for f in fa))
        vb = list(dict.fromkeys(str(f.get(k, "—")) for f in fb))
        if set(va) != set(vb):
            rows.append({"field": k, "a": " / ".join(va), "b": " / ".join(vb)})
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)


def _row_bytes(w: dict) -> dict | None:
    """Bytes one token row moves per kernel, from an EP workload's fields (the recorder writes
    kind 'ep' with hidden and dtype): dispatch sends the row in its dtype (FP8: 1 byte an element
    plus a float32 scale per 128), combine returns it in BF16 (2 bytes an element)."""
    if w.get("kind") != "ep" or not isinstance(w.get("hidden"), int):
        return None
    h = int(w["hidden"])
    fp8 = str(w.get("dtype", "bf16")).lower().startswith("fp8")
    return {"dispatch": h + 4 * (-(-h // 128)) if fp8 else 2 * h, "combine": 2 * h}


def _consequences(ra: list[RunInputs], rb: list[RunInputs]) -> str:
    """What a flagged workload difference changes: bytes moved per row and rows per op per kernel."""
    wa, wb = _workload(ra[0]), _workload(rb[0])
    ba, bb = _row_bytes(wa), _row_bytes(wb)
    if ba is None or bb is None:
        return ""
    rows_a = (wa.get("tokens") or 0) * (wa.get("topk") or 0)
    rows_b = (wb.get("tokens") or 0) * (wb.get("topk") or 0)
    parts = []
    for k in ("dispatch", "combine"):
        tot_a, tot_b = ba[k] * rows_a, bb[k] * rows_b
        ratio = f" ({tot_b / tot_a:.2f}× the bytes per op)" if tot_a else ""
        parts.append(f"{k} moves {ba[k]:,} B a row in A, {bb[k]:,} in B{ratio}")
    return "what it changes: " + "; ".join(parts)


def compare(a, b, *, n_boot: int = S.N_BOOT, seed: int = S.SEED, alpha: float = S.ALPHA, registry=None) -> Comparison:
    """Per kernel, per phase and end-to-end: medians, the bootstrap interval of B - A over runs then
    iterations, the power of each row, and verdicts (columns: package docstring).

    a, b: an event table, a run (anything with .events, and .launches / .manifest when it has
    them: a run's manifest gives its workload), or a list of those per side.
    """
    ra, rb = _inputs(a, registry), _inputs(b, registry)
    refuse, flags = check_workloads(ra, rb)
    diff = manifest_diff(ra, rb)
    empty = pd.DataFrame(columns=COLUMNS)
    if refuse:
        v = Verdict(page="compare", alarm=False, cause=Cause.NONE,
                    detail="refused: A and B record different workloads (" + "; ".join(refuse) + ")")
        return Comparison(empty, empty.copy(), pd.DataFrame(columns=PER_RANK_COLUMNS),
                          pd.DataFrame(columns=CP_COLUMNS), v, tuple(refuse), tuple(flags), diff)
    if flags:
        c = _consequences(ra, rb)
        flags = flags + [c] if c else flags
    sa, wa = set_aside_warmup(samples(ra, "A"), [r.name for r in ra])
    sb, wb = set_aside_warmup(samples(rb, "B"), [r.name for r in rb])
    warm = pd.concat([wa, wb], ignore_index=True) if len(wa) or len(wb) else wa
    allk = pd.concat([sa, sb], ignore_index=True)
    keys = list(allk[["kernel", "phase"]].drop_duplicates().sort_values(["kernel", "phase"]).itertuples(index=False))
    # every row (end-to-end, per rank, per kernel, per phase) is one test of a family decided at one
    # level (stats.compare_family: Benjamini-Hochberg; an A/A pair stays within noise on all rows at
    # once with probability >= 1 - alpha)
    ga, gb = dict(iter(sa.groupby(["kernel", "phase"]))), dict(iter(sb.groupby(["kernel", "phase"])))
    pairs = [(_groups(ga.get((k, p), sa.iloc[0:0])), _groups(gb.get((k, p), sb.iloc[0:0]))) for k, p in keys]
    fam = S.compare_family(pairs, n_boot=n_boot, seed=seed, alpha=alpha)
    table = pd.DataFrame([_as_row(k, p, c) for (k, p), c in zip(keys, fam)], columns=COLUMNS)
    is_e2e = (table["kernel"] == "") & (table["phase"] == E2E)
    is_rank = (table["kernel"] == "") & table["phase"].str.startswith("rank ")
    e2e = table[is_e2e].reset_index(drop=True)
    if e2e.empty:
        e2e = pd.DataFrame([_row("", E2E, sa.iloc[0:0], sb.iloc[0:0], n_boot, seed, alpha)], columns=COLUMNS)
    pr = table[is_rank].copy()
    pr.insert(0, "rank", pr["phase"].str[5:].astype(int))
    per_rank = pr[PER_RANK_COLUMNS].sort_values("rank").reset_index(drop=True)
    per_phase = table[~is_e2e & ~is_rank].reset_index(drop=True)
    cpc = _path_changes(ra, rb)
    waits = set().union(*(r.waits for r in ra + rb if r.ranks is not None))
    v = _verdict(per_phase, e2e.iloc[0], flags, alpha, waits,
                 warmup_note(warm, len(ra) + len(rb)))
    return Comparison(per_phase=per_phase, end_to_end=e2e, per_rank=per_rank, critical_path_changes=cpc, verdict=v,
                      refused=(), flags=tuple(flags), samples=allk, manifest_diff=diff, warmup=warm)


def _name(r) -> str:
    if r["phase"] == E2E:
        return E2E
    return f"{r['kernel']}/{r['phase']}" if r["phase"] else f"{r['kernel']} (op latency after entry)"


def _fmt_pct(x) -> str:
    return f"{x:+.1f}%" if np.isfinite(x) else "—"


def relative_shown(base_ns, op_ns) -> bool:
    """Whether a change of a row whose A median is base_ns is stated in percent (RELATIVE_BASE_SHARE
    of the op's latency op_ns); True when the op's latency is unknown."""
    if op_ns is None or not np.isfinite(op_ns) or op_ns <= 0:
        return True
    return bool(np.isfinite(base_ns) and abs(base_ns) >= RELATIVE_BASE_SHARE * op_ns)


def _change(r, op_ns) -> str:
    return _fmt_pct(r["diff_pct"]) if relative_shown(r["median_a_ns"], op_ns) else _signed(r["diff_ns"])


def _signed(v) -> str:
    return ("+" if np.isfinite(v) and v > 0 else "") + fmt_ns(v)


def _rows(rs, op_ns=None) -> str:
    return ", ".join(f"{_name(r)} {_change(r, op_ns)}" for r in rs)


def _e2e_line(e2e, alpha: float) -> str:
    """The end-to-end row as one line of evidence: B − A, its interval, the A-vs-A spread, the power."""
    line = f"end-to-end (op latency after entry): B − A {_signed(e2e['diff_ns'])} ({_fmt_pct(e2e['diff_pct'])})"
    if np.isfinite(e2e["ci_low_ns"]):
        line += f", {100 * (1 - alpha):.0f}% CI {_signed(e2e['ci_low_ns'])} to {_signed(e2e['ci_high_ns'])}"
    if np.isfinite(e2e["noise_ns"]):
        line += f"; A-vs-A spread {fmt_ns(e2e['noise_ns'])}"
    return line + _power(e2e)


def _power(e2e) -> str:
    """The end-to-end row's power as a clause."""
    if not np.isfinite(e2e["mde_ns"]):
        return ""
    pct = 100 * e2e["mde_ns"] / e2e["median_a_ns"] if e2e["median_a_ns"] else float("nan")
    return (f"; smallest change it could detect: {fmt_ns(e2e['mde_ns'])} ({pct:.1f}% of A's median, "
            f"{100 * S.POWER:.0f}% power under the rule that decides)")


def _context(e2e, alpha: float, flags: list[str], named: pd.DataFrame, warm: str) -> list[str]:
    """The evidence every Compare verdict lists after its own: end-to-end, warm-up, workloads, and
    the heavy tails of the rows it names (end-to-end included)."""
    out = [_e2e_line(e2e, alpha)]
    out += [warm] if warm else []
    out += ["workloads differ: " + "; ".join(flags)] if flags else []
    heavy = [_name(r) for r in pd.concat([pd.DataFrame([e2e]), named]).to_dict("records") if r["heavy_tail"]]
    out += [f"heavy tails in {', '.join(dict.fromkeys(heavy))}: a side's mean and median differ by over "
            f"{100 * S.HEAVY_TAIL_SHARE:.0f}% of the median; read medians, not means"] if heavy else []
    return out


def _runs_needed(e2e) -> str:
    need = int(e2e["runs_needed"])
    return f"about {need}" if need <= S.MAX_RUNS_NEEDED else f"more than {S.MAX_RUNS_NEEDED}"


def _quiet(e2e, n_runs, sig, is_wait, common: dict) -> Verdict:
    """No row moved beyond noise (or only waits did): same code, or cannot tell (underpowered)."""
    only_waits = (f"; only waits moved ({_rows(sig.to_dict('records'), e2e['median_a_ns'])}), no work phase, op latency or entry "
                  f"skew: the wait is not the kernel's own") if len(sig) else ""
    if e2e["verdict"] == S.CANNOT_TELL:
        pct = 100 * e2e["mde_ns"] / e2e["median_a_ns"] if e2e["median_a_ns"] else float("nan")
        return Verdict(alarm=False, cause=Cause.NONE, **common,
                       detail=(f"cannot tell with {n_runs[0]} runs of A and {n_runs[1]} of B: the smallest change "
                               f"it could detect is {fmt_ns(e2e['mde_ns'])} ({pct:.0f}% of A's median); "
                               f"{_runs_needed(e2e)} runs a side would see a {100 * S.DETECT_SHARE:.0f}% "
                               f"change{only_waits}"))
    return Verdict(alarm=False, cause=Cause.SAME_CODE, **common,
                   detail=f"end-to-end {_fmt_pct(e2e['diff_pct'])}{only_waits}")


def _moved(sig: pd.DataFrame, top, op_ns) -> tuple[list[str], pd.DataFrame]:
    """(evidence lines, the rows the headline and those lines name): under an end-to-end or kernel
    headline, the kernels and work phases that moved the same way ("moved with it"), then every
    other row called, each row named once."""
    same = sig[(sig["verdict"] == top["verdict"]) & sig["level"].isin([1, 2])
               & ((top["phase"] == E2E) | (sig["kernel"] == top["kernel"]))].iloc[:4] if top["level"] < 2 else sig.iloc[0:0]
    same = same[(same["kernel"] != top["kernel"]) | (same["phase"] != top["phase"])]
    named = pd.concat([sig.iloc[:1], same])
    key = set(zip(named["kernel"], named["phase"]))
    others = [r for r in sig.to_dict("records") if (r["kernel"], r["phase"]) not in key][:6]
    lines = ([f"moved with it: {_rows(same.to_dict('records'), op_ns)}"] if len(same) else []) + \
        ([f"also changed: {_rows(others, op_ns)}"] if others else [])
    return lines, named


def _verdict(per_phase: pd.DataFrame, e2e, flags: list[str], alpha: float, waits: set = frozenset(),
             warm: str = "") -> Verdict:
    """The headline is one sentence (what moved, where, by how much: verdict.sentence); the evidence
    follows as notes, each row named once."""
    n_runs = (int(e2e["runs_a"]), int(e2e["runs_b"]))
    common = dict(page="compare", n=min(n_runs), evidence=per_phase,
                  magnitude_ns=float(e2e["diff_ns"]) if np.isfinite(e2e["diff_ns"]) else None,
                  reference_ns=float(e2e["median_a_ns"]) if np.isfinite(e2e["median_a_ns"]) else None)
    context = _context(e2e, alpha, flags, per_phase.iloc[0:0], warm)
    if min(n_runs) < 2:
        runs = f"{n_runs[0]} run{'s' if n_runs[0] != 1 else ''} of A and {n_runs[1]} of B"
        return Verdict(alarm=False, cause=Cause.NONE, **common,
                       notes=("nothing is called faster or slower with one run on a side; 2 runs a side estimate "
                              "the noise, 3 say how small a change is visible",) + tuple(context),
                       detail=f"cannot tell with {runs}: with one run on a side run-to-run noise cannot be estimated")
    rows = pd.concat([pd.DataFrame([e2e]), per_phase], ignore_index=True)
    sig = rows[rows["verdict"].isin([S.FASTER, S.SLOWER])].copy()
    is_wait = sig["phase"].isin(waits)
    if sig.empty or is_wait.all():
        return _quiet(e2e, n_runs, sig, is_wait, {**common, "notes": tuple(context)})
    # lead with what a user times: end-to-end, then whole kernels, then entry skew and work phases;
    # a wait phase never leads (the work or the late entry that made it does); largest first, a
    # change of a near-zero base measured against RELATIVE_BASE_SHARE of the op, not its own base
    op = e2e["median_a_ns"]
    floor = RELATIVE_BASE_SHARE * op if np.isfinite(op) and op > 0 else 0.0
    sig["mag"] = sig["diff_ns"].abs() / np.maximum(sig["median_a_ns"].abs(), floor)
    sig["level"] = np.select([sig["phase"] == E2E, sig["phase"] == "", is_wait], [0, 1, 3], 2)
    sig = sig.sort_values(["level", "mag"], ascending=[True, False])
    top = sig.iloc[0]
    notes, named = _moved(sig, top, op)
    where = tuple((str(k), str(p) if p else None) for k, p in sig[["kernel", "phase"]].itertuples(index=False))
    return Verdict(alarm=True, cause=Cause.KNOB_CHANGE, kernel=str(top["kernel"]) or None,
                   phase=str(top["phase"]) or None, where=where, direction=S.direction_of(top["verdict"]),
                   ratio=(float(top["median_b_ns"] / top["median_a_ns"])
                          if top["median_a_ns"] and relative_shown(top["median_a_ns"], op) else None),
                   detail=f"{fmt_ns(top['median_a_ns'])} → {fmt_ns(top['median_b_ns'])}",
                   notes=tuple(notes + _context(e2e, alpha, flags, named, warm)),
                   **{**common, "magnitude_ns": float(top["diff_ns"]), "reference_ns": float(top["median_a_ns"])})
