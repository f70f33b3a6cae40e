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

from profiler.expect import Cause

from . import stats as S
from . import unfinished
from .keys import isin_names
from . import graph as G
from . import timemodel as TM
from .critical_path import from_graph
from .verdict import Verdict

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


def _clipped_waits(sp: pd.DataFrame, sem, cuts: pd.Series) -> np.ndarray:
    """Span durations with the time before their op occurrence's last entry (cuts: entry_cuts)
    removed from the spans of waits a peer releases (registry `waits_for`): the wait for a late
    peer is the entry skew row's, not the phase's. A wait no peer releases (a pipeline stall)
    keeps its time."""
    b = sp["begin_ns"].to_numpy()
    e = sp["end_ns"].to_numpy()
    dur = (e - b).astype(float)
    peer_waits = [w for w, rel in sem.waits.items() if rel]
    if cuts.empty or not peer_waits:
        return dur
    rows = np.flatnonzero(isin_names(sp["phase"], peer_waits))
    if not len(rows):
        return dur
    c = cuts.reindex(pd.MultiIndex.from_arrays([sp["rank"].to_numpy()[rows], sp["launch"].to_numpy()[rows]])).to_numpy(float)
    bw, ew = b[rows].astype(float), e[rows].astype(float)
    dur[rows] = np.where(np.isfinite(c), ew - np.clip(c, bw, ew), ew - bw)
    return dur


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
    parts = []
    kind = ev["kind"]
    hs = isin_names(kind, ["host"])
    if hs.any():
        # the host calls that launch each kernel (a host row's phase is its kernel): what a host-side
        # knob (buffers and plans cached or rebuilt per call) moves while the kernels' times stay
        d = pd.DataFrame({"iteration": ev["iteration"].to_numpy()[hs], "kernel": ev["kernel"].array[hs],
                          "value_ns": (ev["end_ns"].to_numpy()[hs] - ev["begin_ns"].to_numpy()[hs])})
        m = d.groupby(["iteration", "kernel"], sort=True, observed=True)["value_ns"].mean().reset_index()
        parts.append(m.assign(kernel=m["kernel"].astype(str), phase=HOST_CALL))
    span = np.flatnonzero(isin_names(kind, ["span"]))
    if len(span):
        sp = ev[["iteration", "kernel", "phase", "rank", "launch", "begin_ns", "end_ns"]].iloc[span]
        # grouped on the categorical columns (.array keeps them categorical: .to_numpy() would make a
        # string object per row, 1.7 s at 10 M events); names become strings on the grouped rows only
        d = pd.DataFrame({"iteration": sp["iteration"].to_numpy(), "kernel": sp["kernel"].array,
                          "phase": sp["phase"].array, "value_ns": _clipped_waits(sp, sem, cuts)})
        m = d.groupby(["iteration", "kernel", "phase"], sort=True, observed=True)["value_ns"].mean().reset_index()
        parts.append(m.assign(kernel=m["kernel"].astype(str), phase=m["phase"].astype(str)))
    return EventSamples(samples=_frame(parts), ranks=frozenset(int(r) for r in pd.unique(ev["rank"])),
                        kernels=frozenset(str(k) for k in pd.unique(ev["kernel"])))


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
    sa, sb = samples(ra, "A"), samples(rb, "B")
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
    v = _verdict(per_phase, e2e.iloc[0], flags, alpha, waits)
    return Comparison(per_phase=per_phase, end_to_end=e2e, per_rank=per_rank, critical_path_changes=cpc, verdict=v,
                      refused=(), flags=tuple(flags), samples=allk, manifest_diff=diff)


def _name(r) -> str:
    if r["phase"] == E2E:
        return E2E
    return f"{r['kernel']}/{r['phase']}" if r["phase"] else f"{r['kernel']} (op latency after entry)"


def _fmt_pct(x) -> str:
    return f"{x:+.1f}%" if np.isfinite(x) else "—"


def _power(e2e) -> str:
    """The end-to-end row's power as a clause."""
    if not np.isfinite(e2e["mde_ns"]):
        return ""
    pct = 100 * e2e["mde_ns"] / e2e["median_a_ns"] if e2e["median_a_ns"] else float("nan")
    return (f"; smallest change it could detect: {e2e['mde_ns']:,.0f} ns ({pct:.1f}% of A's median, "
            f"{100 * S.POWER:.0f}% power at its level)")


def _verdict(per_phase: pd.DataFrame, e2e, flags: list[str], alpha: float, waits: set = frozenset()) -> Verdict:
    level = f"{100 * (1 - alpha):.0f}% CI"
    flag = ("; workloads differ: " + "; ".join(flags)) if flags else ""
    tail = "; heavy tails: read medians, not means" if bool(per_phase["heavy_tail"].any() or e2e["heavy_tail"]) else ""
    head = (f"end-to-end (op latency after entry) B − A {e2e['diff_pct']:+.1f}% ({level} {e2e['ci_low_ns']:+,.0f} to "
            f"{e2e['ci_high_ns']:+,.0f} ns" if np.isfinite(e2e["ci_low_ns"])
            else f"end-to-end (op latency after entry) B − A {e2e['diff_pct']:+.1f}% (no interval")
    head += f", A-vs-A spread {e2e['noise_ns']:,.0f} ns)" if np.isfinite(e2e["noise_ns"]) else ")"
    head += _power(e2e)
    n_runs = (int(e2e["runs_a"]), int(e2e["runs_b"]))
    common = dict(page="compare", n=min(n_runs), evidence=per_phase,
                  magnitude_ns=float(e2e["diff_ns"]) if np.isfinite(e2e["diff_ns"]) else None,
                  reference_ns=float(e2e["median_a_ns"]) if np.isfinite(e2e["median_a_ns"]) else None)
    if min(n_runs) < 2:
        return Verdict(alarm=False, cause=Cause.NONE, **common,
                       detail=(f"cannot tell with {n_runs[0]} run(s) of A and {n_runs[1]} of B: run-to-run noise "
                               f"cannot be estimated with one run on a side (need at least 2 a side, 3 to say how "
                               f"small a change is visible), so nothing is called faster or slower; {head}{flag}{tail}"))
    rows = pd.concat([pd.DataFrame([e2e]), per_phase], ignore_index=True)
    sig = rows[rows["verdict"].isin([S.FASTER, S.SLOWER])].copy()
    is_wait = sig["phase"].isin(waits)
    if sig.empty or is_wait.all():
        only_waits = ("; only waits moved (" + ", ".join(f"{_name(r)} {_fmt_pct(r['diff_pct'])}" for r in
                      sig.to_dict("records")) + "): no work phase, op latency or entry skew changed beyond noise, "
                      "so the wait is not the kernel's own") if len(sig) else ""
        if e2e["verdict"] == S.CANNOT_TELL:
            need = int(e2e["runs_needed"])
            need_s = f"need about {need}" if need <= S.MAX_RUNS_NEEDED else f"need over {S.MAX_RUNS_NEEDED}"
            return Verdict(alarm=False, cause=Cause.NONE, **common,
                           detail=(f"cannot tell with {n_runs[0]} runs of A and {n_runs[1]} of B ({need_s} a side to "
                                   f"see a {100 * S.DETECT_SHARE:.0f}% change): {head}{only_waits}{flag}{tail}"))
        return Verdict(alarm=False, cause=Cause.SAME_CODE, **common,
                       detail=f"{head}; every kernel and phase within noise{only_waits}{flag}{tail}")
    # lead with what a user times: end-to-end, then whole kernels, then entry skew and work phases;
    # a wait phase never leads (the work or the late entry that made it does); largest first
    sig["mag"] = sig["diff_pct"].abs()
    sig["level"] = np.select([sig["phase"] == E2E, sig["phase"] == "", is_wait], [0, 1, 3], 2)
    sig = sig.sort_values(["level", "mag"], ascending=[True, False])
    top = sig.iloc[0]
    why = sig[(sig["level"] == 2) & ((top["phase"] == E2E) | (sig["kernel"] == top["kernel"]))
              & (sig["verdict"] == top["verdict"])]
    moved = ", ".join(f"{_name(r)} {_fmt_pct(r['diff_pct'])}" for r in why.iloc[:3].to_dict("records"))
    because = f"; moved by {moved}" if top["level"] < 2 and len(why) else ""
    where = tuple((str(k), str(p) if p else None) for k, p in sig[["kernel", "phase"]].itertuples(index=False))
    others = ", ".join(f"{_name(r)} {r['diff_pct']:+.1f}%" for r in sig.iloc[1:6].to_dict("records"))
    direction = S.direction_of(top["verdict"])
    return Verdict(alarm=True, cause=Cause.KNOB_CHANGE, kernel=str(top["kernel"]) or None,
                   phase=str(top["phase"]) or None, where=where, direction=direction,
                   ratio=float(top["median_b_ns"] / top["median_a_ns"]) if top["median_a_ns"] else None,
                   detail=f"{head}{because}" + (f"; also {others}" if others else "") + flag + tail,
                   **{**common, "magnitude_ns": float(top["diff_ns"]), "reference_ns": float(top["median_a_ns"])})
