"""The one time model every page and `epscope report` read: per op occurrence, when each rank
entered, how long the op took once everyone was in, and why the early ranks waited.

Ranks of a real training step reach an op at different times (unequal work before it, a slow
data loader, a host that falls behind). A rank that launched early spins in its first wait until
the late peer arrives; counting that as the kernel's own time makes a faster kernel look slower
(issue 18). So the model separates, per op occurrence:

* entry skew: the first rank's first warp -> the last rank's first warp, with the late rank named
  and the side its lateness came from (`late_cause`, below);
* op latency after entry: the last rank's entry -> the last warp end of any rank: the op's own
  time, which a kernel change can move and a late peer cannot;
* per rank, its waiting split by cause: `late_wait_ns`, the rank's waits before the last rank
  entered (waiting for a peer that had not launched yet), and `peer_wait_ns`, its waits after
  (waiting for a peer that was working, or for its own pipeline). Waits are the leaf segments of
  kind wait, idle and barrier (registry semantics), per launch its longest-waiting warp's: wall
  time of the rank held, not a sum over warps.

An op occurrence is the k-th launch of one kernel in one iteration on each rank (matched across
ranks by that order: hook mode's send, signal and receive launches of `dispatch` are occurrences
0, 1, 2). A rank that never launched an occurrence the others did is `missing`: the occurrence's
late rank, its entry unknown (its op latency after entry is then undefined: NaN).

Why the late rank entered late (`late_cause`), over the window from the first rank's entry to
its own (_late_cause): the time before its host could have launched the kernel (the host call's
begin, or for a later kernel of one call the end of the call's previous kernel, plus the launch
overhead the other ranks showed) is 'host' (a host delay, a host that synchronises and prepares
between kernels), less any time its GPU ran a recorded kernel then; the rest is 'gpu': the kernel
was queued behind GPU work, recorded (its previous op ran long) or not (a GEMM on the compute
stream, a stream wait). The larger side names the cause. Without host rows the idle time cannot
be told apart: 'unknown' (or 'gpu' when recorded kernels fill most of the window).

Everything here is computed once per dependency graph (graph.memo) and read by the critical
path, idle, barriers, what-if, Compare and the report (style.md rule 16).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G
from . import lane_totals as LT
from .exactsum import exact_sum

HOST, GPU, UNKNOWN, NEVER = "host", "gpu", "unknown", "never launched"

RANK_COLUMNS = ["iteration", "kernel", "occurrence", "rank", "launch", "host_begin_ns", "host_end_ns", "entry_ns",
                "end_ns", "kernel_ns", "after_entry_ns", "late_wait_ns", "late_wait_phase", "peer_wait_ns", "unfinished"]
OP_COLUMNS = ["iteration", "kernel", "occurrence", "ranks", "missing", "first_entry_ns", "last_entry_ns",
              "entry_skew_ns", "late_rank", "late_cause", "late_host_ns", "late_gpu_ns", "op_latency_ns", "end_ns",
              "late_wait_ns", "late_wait_rank", "late_wait_phase", "peer_wait_ns", "unfinished"]
ITERATION_COLUMNS = ["iteration", "op_latency_ns", "entry_skew_ns", "late_wait_ns", "peer_wait_ns", "kernel_ns"]


@dataclass(frozen=True)
class TimeModel:
    """per_rank: RANK_COLUMNS, one row per (op occurrence, rank that launched it);
    ops: OP_COLUMNS, one row per op occurrence; iterations: ITERATION_COLUMNS, sums over the
    iteration's occurrences (kernel_ns: the slowest rank's summed kernel time, first warp to last,
    the figure that counts a late peer as kernel time, kept beside the others for contrast).
    Times in ns (float: NaN where undefined); `ranks` is the run's rank count."""
    per_rank: pd.DataFrame
    ops: pd.DataFrame
    iterations: pd.DataFrame
    ranks: int

    def kernel_iterations(self) -> pd.DataFrame:
        """[iteration, kernel, op_latency_ns, entry_skew_ns, late_wait_ns]: per iteration and kernel,
        summed over the kernel's occurrences."""
        o = self.ops
        if o.empty:
            return pd.DataFrame(columns=["iteration", "kernel", "op_latency_ns", "entry_skew_ns", "late_wait_ns"])
        return (o.groupby(["iteration", "kernel"], sort=True)[["op_latency_ns", "entry_skew_ns", "late_wait_ns"]]
                .sum(min_count=1).reset_index())

    def rank_iterations(self) -> pd.DataFrame:
        """[iteration, rank, after_entry_ns, late_wait_ns, peer_wait_ns]: per iteration and rank."""
        p = self.per_rank
        if p.empty:
            return pd.DataFrame(columns=["iteration", "rank", "after_entry_ns", "late_wait_ns", "peer_wait_ns"])
        return (p.groupby(["iteration", "rank"], sort=True)[["after_entry_ns", "late_wait_ns", "peer_wait_ns"]]
                .sum().reset_index())

    def late_entries(self) -> pd.DataFrame:
        """[iteration, rank, cause, waited_ns]: per iteration, late rank and cause side, what the
        other ranks waited for that rank to enter (the occurrences' late_wait_ns summed)."""
        o = self.ops[self.ops["late_rank"] >= 0]
        if o.empty:
            return pd.DataFrame(columns=["iteration", "rank", "cause", "waited_ns"])
        out = (o.groupby(["iteration", "late_rank", "late_cause"], sort=True)["late_wait_ns"].sum()
               .rename("waited_ns").reset_index().rename(columns={"late_rank": "rank", "late_cause": "cause"}))
        return out


def time_model(g: G.Graph) -> TimeModel:
    """The time model of the graph's run (memoised on the graph: every page reads the same one)."""
    return G.memo(g, "time_model", lambda: _time_model(g))


def _empty() -> TimeModel:
    return TimeModel(pd.DataFrame(columns=RANK_COLUMNS), pd.DataFrame(columns=OP_COLUMNS),
                     pd.DataFrame(columns=ITERATION_COLUMNS), 0)


def op_latency(g: G.Graph, times: np.ndarray) -> pd.DataFrame:
    """[iteration, op_latency_ns] with the graph's points at `times` (a re-timed graph: what-if),
    the op occurrences matched as recorded: per occurrence the last rank's entry to the last warp
    end, summed per iteration (NaN where a rank never launched an occurrence). The grouping of the
    lanes into launches, occurrences and iterations does not depend on the times: it is made once
    per graph (OpPlan; a what-if asks twice a chunk, recorded and re-timed, issue 31)."""
    tm = time_model(g)
    if tm.ops.empty:
        return pd.DataFrame(columns=["iteration", "op_latency_ns"])
    plan = G.memo(g, "op_latency_plan", lambda: OpPlan.of(g, tm))
    out = plan.latency(g, times) if plan is not None else None
    return _op_latency_pandas(g, times, tm) if out is None else out


def _op_latency_pandas(g: G.Graph, times: np.ndarray, tm: "TimeModel") -> pd.DataFrame:
    """op_latency through pandas' group-bys (the reference OpPlan is held equal to:
    tests/analysis/test_table_paths.py)."""
    ext = _launch_extents(g, times).merge(tm.per_rank[["rank", "launch"]], on=["rank", "launch"])
    grp = ext.groupby(["iteration", "kernel", "occurrence"], sort=True)
    per = (grp["end_ns"].max() - grp["entry_ns"].max()).astype(float).rename("op").reset_index()
    missing = tm.ops.set_index(["iteration", "kernel", "occurrence"])["missing"]
    per.loc[missing.reindex(pd.MultiIndex.from_frame(per[["iteration", "kernel", "occurrence"]])).to_numpy() > 0,
            "op"] = np.nan
    out = per.groupby("iteration", sort=True)["op"].sum(min_count=1)
    bad = per.groupby("iteration")["op"].apply(lambda x: x.isna().any())
    out[bad.reindex(out.index).to_numpy()] = np.nan
    return out.rename("op_latency_ns").reset_index()


@dataclass(frozen=True)
class OpPlan:
    """op_latency's grouping of a graph's GPU lanes, for any times at their first and last points:
    the lanes (`lanes`, sorted by launch) of each launch the time model has (launch_starts), the
    launches (sorted by occurrence) of each occurrence (occ_starts), the occurrences (sorted by
    iteration) of each iteration (it_starts); per occurrence whether a rank never launched it."""
    lanes: np.ndarray
    launch_starts: np.ndarray
    launches: np.ndarray
    occ_starts: np.ndarray
    missing: np.ndarray
    it_starts: np.ndarray
    iterations: np.ndarray

    @classmethod
    def of(cls, g: G.Graph, tm: "TimeModel") -> "OpPlan | None":
        """The plan of g (numpy over its GPU lanes, as _launch_extents and _op_latency_pandas group
        them: a launch's iteration and kernel its first lane's, an occurrence the launch's position
        among its rank's launches of that kernel in the iteration), or None where
        _op_latency_pandas must answer (keys it would not match one to one)."""
        L = g.lane
        gl = np.flatnonzero(~L["host"].to_numpy())
        keep = tm.per_rank[["rank", "launch"]]
        if not len(gl) or keep.duplicated().any() or tm.ops.duplicated(["iteration", "kernel", "occurrence"]).any():
            return None
        rank = L["rank"].to_numpy()[gl].astype(np.int64)
        launch = L["launch"].to_numpy()[gl].astype(np.int64)
        lo = int(launch.min())
        span = int(launch.max()) - lo + 1
        lane_launch = (rank - int(rank.min())) * span + (launch - lo)       # (rank, launch) order
        o = np.argsort(lane_launch, kind="stable")
        gl, lane_launch = gl[o], lane_launch[o]
        starts = np.flatnonzero(np.r_[True, lane_launch[1:] != lane_launch[:-1]])
        first = gl[starts]                                                    # each launch's first lane
        l_rank, l_launch = L["rank"].to_numpy()[first], L["launch"].to_numpy()[first]
        l_it = L["iteration"].to_numpy()[first]
        names, l_kernel = np.unique(L["kernel"].to_numpy()[first].astype(str), return_inverse=True)
        # occurrence: the launch's position among (rank, iteration, kernel)'s launches (they are in launch order)
        g_code = _pack(l_rank, l_it, l_kernel)
        by = np.argsort(g_code, kind="stable")
        pos = np.empty(len(by), np.int64)
        pos[by] = np.arange(len(by)) - np.searchsorted(g_code[by], g_code[by])
        # the launches the time model has (its per_rank rows)
        kept = pd.MultiIndex.from_frame(keep).get_indexer(pd.MultiIndex.from_arrays([l_rank, l_launch])) >= 0
        n_l = len(first)
        lane_of = np.repeat(np.arange(n_l), np.diff(np.r_[starts, len(gl)]))
        launch_new = np.cumsum(kept) - 1
        lanes = gl[kept[lane_of]]
        lane_launch = launch_new[lane_of[kept[lane_of]]]
        l_it, l_kernel, pos = l_it[kept], l_kernel[kept], pos[kept]
        if not len(l_it):
            return None
        # occurrences numbered in (iteration, kernel name, occurrence) order, as the group-by sorts them
        occ_u, occ = np.unique(_pack(l_it, l_kernel, pos), return_inverse=True)
        occ = occ.reshape(-1)
        by_occ = np.argsort(occ, kind="stable")
        head = by_occ[np.r_[True, occ[by_occ][1:] != occ[by_occ][:-1]]]      # each occurrence's first launch
        miss = tm.ops.set_index(["iteration", "kernel", "occurrence"])["missing"].reindex(
            pd.MultiIndex.from_arrays([l_it[head], names[l_kernel[head]], pos[head]])).to_numpy() > 0
        its = l_it[head]
        return cls(lanes=lanes, launch_starts=_starts(lane_launch, int(kept.sum())), launches=by_occ,
                   occ_starts=_starts(occ[by_occ], len(occ_u)), missing=miss,
                   it_starts=np.flatnonzero(np.r_[True, its[1:] != its[:-1]]), iterations=its)

    def latency(self, g: G.Graph, times: np.ndarray) -> pd.DataFrame | None:
        """op_latency at `times` (None where a float sum could round: pandas' compensated sum answers)."""
        b = times[g.lane_first[self.lanes]]
        e = times[g.lane_last[self.lanes]]
        entry = np.minimum.reduceat(b, self.launch_starts)[self.launches]
        end = np.maximum.reduceat(e, self.launch_starts)[self.launches]
        op = (np.maximum.reduceat(end, self.occ_starts) - np.maximum.reduceat(entry, self.occ_starts)).astype(float)
        op[self.missing] = np.nan
        known = op[~self.missing]
        if not exact_sum(known):
            return None
        # integral values summed exactly: pandas' sum(min_count=1), NaN where any occurrence is
        total = np.add.reduceat(np.where(self.missing, 0.0, op), self.it_starts)
        bad = np.maximum.reduceat(self.missing.astype(np.int8), self.it_starts) > 0
        total[bad] = np.nan
        return pd.DataFrame({"iteration": self.iterations[self.it_starts], "op_latency_ns": total})


def _pack(*cols: np.ndarray) -> np.ndarray:
    """One int64 per row ordering as the rows of the integer columns do (lexicographically)."""
    key = np.zeros(len(cols[0]), np.int64)
    for c in cols:
        c = np.asarray(c, np.int64)
        c0 = int(c.min()) if c.size else 0
        width = int(c.max()) - c0 + 1 if c.size else 1
        assert float(key.max(initial=0) + 1) * width < 2.0 ** 62, "keys too wide to pack"
        key = key * width + (c - c0)
    return key


def _starts(sorted_codes: np.ndarray, n: int) -> np.ndarray:
    """Where each of the codes 0..n-1 begins in sorted_codes (each present at least once)."""
    starts = np.searchsorted(sorted_codes, np.arange(n))
    assert len(sorted_codes) == 0 or (np.all(np.diff(np.r_[starts, len(sorted_codes)]) > 0)), "a group without members"
    return starts


def _launch_extents(g: G.Graph, times: np.ndarray | None = None) -> pd.DataFrame:
    """Per GPU (rank, launch): iteration, kernel, entry (first warp point), end (last warp point);
    the occurrence: the launch's position among its rank's launches of that kernel in the
    iteration. By sorted segments (as OpPlan groups them), not pandas' group-bys: the same frame
    (_launch_extents_pandas, the reference: tests/analysis/test_tables_fast.py)."""
    t = g.pt_t if times is None else times
    L = g.lane
    gl = np.flatnonzero(~L["host"].to_numpy())
    if not len(gl):
        return _launch_extents_pandas(g, times)
    rank, launch = L["rank"].to_numpy()[gl], L["launch"].to_numpy()[gl]
    o = np.lexsort((launch, rank))                 # stable: a launch's lanes in lane order
    rs, ls = rank[o], launch[o]
    starts = np.flatnonzero(np.r_[True, (rs[1:] != rs[:-1]) | (ls[1:] != ls[:-1])])
    first = gl[o[starts]]
    it = L["iteration"].to_numpy()[first]
    kernel = L["kernel"].to_numpy()[first].astype(str)
    ext = pd.DataFrame({"rank": rs[starts], "launch": ls[starts], "iteration": it, "kernel": kernel,
                        "entry_ns": np.minimum.reduceat(t[g.lane_first[gl[o]]], starts),
                        "end_ns": np.maximum.reduceat(t[g.lane_last[gl[o]]], starts)})
    _, kc = np.unique(kernel, return_inverse=True)
    key = _pack(ext["rank"].to_numpy(), it, kc.reshape(-1))
    by = np.argsort(key, kind="stable")            # launches stay in launch order within a group
    pos = np.empty(len(by), np.int64)
    pos[by] = np.arange(len(by)) - np.searchsorted(key[by], key[by])
    ext["occurrence"] = pos
    return ext


def _launch_extents_pandas(g: G.Graph, times: np.ndarray | None = None) -> pd.DataFrame:
    """_launch_extents through pandas' group-bys (the reference)."""
    t = g.pt_t if times is None else times
    L = g.lane
    gl = ~L["host"].to_numpy()
    df = pd.DataFrame({"rank": L["rank"].to_numpy()[gl], "launch": L["launch"].to_numpy()[gl],
                       "iteration": L["iteration"].to_numpy()[gl], "kernel": L["kernel"].to_numpy()[gl].astype(str),
                       "b": t[g.lane_first[gl]], "e": t[g.lane_last[gl]]})
    if df.empty:
        return df
    ext = df.groupby(["rank", "launch"], sort=True).agg(iteration=("iteration", "first"), kernel=("kernel", "first"),
                                                         entry_ns=("b", "min"), end_ns=("e", "max")).reset_index()
    ext["occurrence"] = ext.sort_values(["rank", "iteration", "kernel", "launch"]).groupby(
        ["rank", "iteration", "kernel"]).cumcount()
    return ext


def _host_calls(g: G.Graph) -> pd.DataFrame:
    """Per (rank, launch) with a host row: the host call's begin and end."""
    host_iv = np.flatnonzero(g.iv_kind == G.HOST)
    if len(host_iv) == 0:
        return pd.DataFrame(columns=["rank", "launch", "host_begin_ns", "host_end_ns"])
    df = pd.DataFrame({"rank": g.lane["rank"].to_numpy()[g.pt_lane[g.iv_pb[host_iv]]],
                       "launch": g.iv_launch[host_iv], "host_begin_ns": g.pt_t[g.iv_pb[host_iv]],
                       "host_end_ns": g.pt_t[g.iv_pe[host_iv]]})
    return df.groupby(["rank", "launch"], sort=True).agg(host_begin_ns=("host_begin_ns", "min"),
                                                         host_end_ns=("host_end_ns", "max")).reset_index()


def lane_cut(g: G.Graph, rows: pd.DataFrame) -> np.ndarray:
    """Per lane: the last entry of its (rank, launch)'s op occurrence (rows: launch_rows, its
    last_entry_ns set), inf where the lane has no row or the entry is unknown: where each lane's
    waits are cut (the time model's late / peer waits, imbalance.held_after_entry)."""
    L = g.lane
    key = pd.MultiIndex.from_arrays([rows["rank"].to_numpy(), rows["launch"].to_numpy()])
    at = key.get_indexer(pd.MultiIndex.from_arrays([L["rank"].to_numpy(), L["launch"].to_numpy()]))
    cut = np.where(at >= 0, rows["last_entry_ns"].to_numpy(float)[np.maximum(at, 0)], np.nan)
    return np.where(np.isnan(cut), np.inf, cut)


def _waits(g: G.Graph, ext: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(late_wait, peer_wait, late_phase) per row of `ext`: per launch, its longest-waiting warp's
    wait segments before / after the occurrence's last entry (ext['last_entry_ns']), and the phase
    or barrier that held the most of the launch's waiting before it ('' when none). The per-lane
    sums: lane_totals.entry."""
    n = len(ext)
    if g.n_points == 0 or n == 0:
        return np.zeros(n), np.zeros(n), np.full(n, "", dtype=object)
    L = g.lane
    key = pd.MultiIndex.from_arrays([ext["rank"].to_numpy(), ext["launch"].to_numpy()])
    lane_row = key.get_indexer(pd.MultiIndex.from_arrays([L["rank"].to_numpy(), L["launch"].to_numpy()]))
    lane_row = np.where(L["host"].to_numpy(), -1, lane_row)
    tot = LT.entry(g, lane_cut(g, ext))
    lanes = np.flatnonzero(lane_row >= 0)
    row = lane_row[lanes]
    late = np.zeros(n)
    peer = np.zeros(n)
    phase = np.full(n, "", dtype=object)
    np.maximum.at(late, row, tot.before[lanes])
    np.maximum.at(peer, row, tot.after[lanes])
    li, pc = np.nonzero(tot.before_phase[lanes] > 0)
    if len(li):
        ph = pd.DataFrame({"row": row[li], "ph": (pc - 1).astype(np.int32), "t": tot.before_phase[lanes][li, pc]})
        top = ph.groupby(["row", "ph"])["t"].sum().reset_index().sort_values("t").drop_duplicates("row", keep="last")
        ok = top["ph"].to_numpy() >= 0
        phase[top["row"].to_numpy()[ok]] = g.phase_names[top["ph"].to_numpy()[ok]].astype(str)
    return late, peer, phase


def _busy_union(ext: pd.DataFrame) -> dict:
    """Per rank: its launches' [entry, end] sorted by entry (for the late-cause split)."""
    return {int(r): s.sort_values("entry_ns")[["entry_ns", "end_ns"]].to_numpy(np.int64)
            for r, s in ext.groupby("rank")}


def _overlap(iv: np.ndarray, a: float, b: float) -> float:
    """Length of [a, b] covered by the union of the intervals `iv` ([n, 2], sorted by start)."""
    if b <= a or len(iv) == 0:
        return 0.0
    s = np.clip(iv[:, 0], a, b)
    e = np.clip(iv[:, 1], a, b)
    e = np.maximum.accumulate(e)
    s = np.maximum(s, np.r_[a, e[:-1]])
    return float(np.clip(e - s, 0, None).sum())


def _call_ready(ext: pd.DataFrame) -> pd.Series:
    """Per launch row: when its host call could have launched it: the call's begin for the first
    kernel of the call, the end of the call's previous kernel for a later one (one call launches
    notify and dispatch, with the host reading notify's counts in between); NaN without host rows."""
    has = ext["host_begin_ns"].notna()
    out = pd.Series(np.nan, index=ext.index)
    if not has.any():
        return out
    h = ext[has].sort_values(["rank", "host_begin_ns", "entry_ns"])
    prev_end = h.groupby(["rank", "host_begin_ns"])["end_ns"].shift(1)
    out.loc[h.index] = np.where(prev_end.notna(), prev_end, h["host_begin_ns"]).astype(float)
    return out


def _late_cause(busy: dict, row, overhead: float, a: float, b: float) -> tuple[str, float, float]:
    """(cause, host_ns, gpu_ns) of the late rank's launch `row` entering at b instead of a (the
    first rank's entry). Its host could have launched the kernel at row.ready (_call_ready); with
    the launch overhead the other ranks showed (`overhead`: the least of ready -> entry among the
    occurrence's ranks), the kernel would have started at ready + overhead had its GPU been free:
    the window's time before that is the host's, after it the GPU's (queued behind work,
    recorded or not). A later kernel of a call is launched by the host after the previous one
    ends: its whole wait is the host's."""
    own = busy.get(int(row["rank"]), np.zeros((0, 2), np.int64))
    gpu_busy = _overlap(own, a, b)
    ready = row["ready_ns"]
    if not np.isfinite(ready):
        idle = max(b - a - gpu_busy, 0.0)
        return (GPU if gpu_busy > idle else UNKNOWN), 0.0, gpu_busy
    later_in_call = ready != row["host_begin_ns"]
    launched = b if later_in_call else min(max(ready + overhead, a), b)
    host_part = max(launched - a - _overlap(own, a, launched), 0.0)
    gpu = max(b - a - host_part, 0.0)
    return (HOST if host_part >= gpu else GPU), host_part, gpu


def _time_model(g: G.Graph) -> TimeModel:
    ext = launch_rows(g)
    if ext is None:
        return _empty()
    return from_rows(ext, int(g.derived.get("run_ranks") or g.lane["rank"].nunique()))


def launch_rows(g: G.Graph) -> pd.DataFrame | None:
    """Per GPU (rank, launch): its occurrence, entry, end, host call and waits (what the model's
    rows are made of; None without GPU lanes). Every column is a function of the launch's own
    iteration; the late-cause split (from_rows) reads other iterations' launches too (a late rank's
    GPU may still run the previous iteration's kernels), so a run analysed in chunks concatenates
    these rows and builds the model once (chunked.py). Memoised per graph (the waits after entry
    of imbalance.held_after_entry cut at its last_entry_ns)."""
    return G.memo(g, "launch_rows", lambda: _launch_rows(g))


def _launch_rows(g: G.Graph) -> pd.DataFrame | None:
    ext = _launch_extents(g)
    if ext.empty:
        return None
    hc = _host_calls(g)
    ext = ext.merge(hc, on=["rank", "launch"], how="left")
    ext["ready_ns"] = _call_ready(ext)
    occ = ["iteration", "kernel", "occurrence"]
    grp = ext.groupby(occ, sort=True)
    ext["first_entry_ns"] = grp["entry_ns"].transform("min")
    ext["last_entry_ns"] = grp["entry_ns"].transform("max").astype(float)
    ext["n_ranks"] = grp["rank"].transform("nunique")
    # every rank of the run is expected in every occurrence: a rank that launched nothing at all in
    # an iteration is missing from each of its occurrences, not left out of them (issue 29)
    ext["expected"] = int(g.derived.get("run_ranks") or g.lane["rank"].nunique())
    # a rank missing from an occurrence the others launched: its entry is unknown
    ext.loc[ext["n_ranks"] < ext["expected"], "last_entry_ns"] = np.nan
    late, peer, late_phase = _waits(g, ext)
    ext["late_wait_ns"] = late
    ext["late_wait_phase"] = late_phase
    ext["peer_wait_ns"] = peer
    ext["kernel_ns"] = (ext["end_ns"] - ext["entry_ns"]).astype(float)
    ext["after_entry_ns"] = (ext["end_ns"] - np.fmax(ext["entry_ns"].to_numpy(float),
                                                     ext["last_entry_ns"].to_numpy(float))).clip(lower=0)
    unf = _unfinished_launches(g)
    ext["unfinished"] = [(int(r), int(la)) in unf for r, la in zip(ext["rank"], ext["launch"])]
    return ext


def from_rows(ext: pd.DataFrame, nranks: int) -> TimeModel:
    """The model from launch_rows (of one graph, or concatenated over chunks of iterations);
    nranks: the run's rank count."""
    occ = ["iteration", "kernel", "occurrence"]
    per_rank = ext[RANK_COLUMNS].sort_values(occ + ["rank"]).reset_index(drop=True)
    ops = _ops(ext, nranks)
    its = _iterations(ops, per_rank)
    return TimeModel(per_rank=per_rank, ops=ops, iterations=its, ranks=nranks)


def _unfinished_launches(g: G.Graph) -> set:
    iv = np.flatnonzero(g.iv_unfinished)
    if len(iv) == 0:
        return set()
    ranks = g.lane["rank"].to_numpy()[g.pt_lane[g.iv_pb[iv]]]
    return set(zip(ranks.tolist(), g.iv_launch[iv].tolist()))


def _ops(ext: pd.DataFrame, nranks: int) -> pd.DataFrame:
    busy = _busy_union(ext)
    rows = []
    for (it, k, o), s in ext.groupby(["iteration", "kernel", "occurrence"], sort=True):
        first, end = float(s["entry_ns"].min()), float(s["end_ns"].max())
        expected = int(s["expected"].iloc[0])
        missing = sorted(set(range(nranks)) - set(s["rank"].astype(int))) if len(s) < expected else []
        late_host = late_gpu = 0.0
        if missing:
            last, late_rank, cause = np.nan, int(missing[0]), NEVER
            skew, op = end - first, np.nan
        else:
            last = float(s["entry_ns"].max())
            lr = s.loc[s["entry_ns"].idxmax()]
            late_rank = int(lr["rank"]) if len(s) > 1 and last > first else -1
            skew, op = last - first, end - last
            cause = ""
            if late_rank >= 0:
                oh = (s["entry_ns"] - s["ready_ns"]).clip(lower=0).min()
                cause, late_host, late_gpu = _late_cause(busy, lr, float(oh) if np.isfinite(oh) else 0.0, first, last)
        waiter = s.loc[s["late_wait_ns"].idxmax()]
        rows.append({"iteration": int(it), "kernel": str(k), "occurrence": int(o), "ranks": int(len(s)),
                     "missing": len(missing), "first_entry_ns": first, "last_entry_ns": last,
                     "entry_skew_ns": float(skew), "late_rank": late_rank, "late_cause": cause,
                     "late_host_ns": late_host, "late_gpu_ns": late_gpu, "op_latency_ns": float(op), "end_ns": end,
                     "late_wait_ns": float(waiter["late_wait_ns"]),
                     "late_wait_rank": int(waiter["rank"]) if waiter["late_wait_ns"] > 0 else -1,
                     "late_wait_phase": str(waiter["late_wait_phase"]), "peer_wait_ns": float(s["peer_wait_ns"].max()),
                     "unfinished": bool(s["unfinished"].any())})
    ops = pd.DataFrame(rows, columns=OP_COLUMNS)
    return ops.sort_values(["iteration", "first_entry_ns", "kernel", "occurrence"], kind="stable").reset_index(drop=True)


def _iterations(ops: pd.DataFrame, per_rank: pd.DataFrame) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=ITERATION_COLUMNS)
    it = ops.groupby("iteration", sort=True).agg(op_latency_ns=("op_latency_ns", lambda x: x.sum(min_count=len(x))),
                                                entry_skew_ns=("entry_skew_ns", "sum"),
                                                late_wait_ns=("late_wait_ns", "sum"),
                                                peer_wait_ns=("peer_wait_ns", "sum"))
    kt = per_rank.groupby(["iteration", "rank"])["kernel_ns"].sum().groupby(level=0).max()
    it["kernel_ns"] = kt.reindex(it.index).to_numpy(float)
    return it.reset_index()[ITERATION_COLUMNS]
