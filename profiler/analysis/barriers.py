"""Barrier contention (the returned columns are documented in the package docstring).

An occurrence is the set of arrivals of one barrier with one occurrence number (the payload) in
one scope (from the registry): the block (scope 'block'), the launch on one rank ('grid'), or
every rank of the same kernel and iteration ('rank'). An arrival is "useless" when the arriving
warp brought no work to it (busy below idle.NO_WORK_SHARE of its kernel's busiest warp since it
last synchronised, while another arrival of the occurrence brought work; or no work in its whole
launch): it only came to be released (profiler.analysis.rendezvous). Waits are warp time: `total_wait_ns` sums, over the
occurrence's arrivals, each warp's own departure - own arrival (an unfinished one lasts until its
kernel gave up).

The verdict: a timeout first; else the rank (cross-rank barriers) or warp (block / grid barriers)
that arrives last and how long the others wait on it per iteration (the last arrival minus the
one before it, summed per iteration, median over iterations); else useless arrivals that hold
their warps for a material share of the op's latency (below: a note).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from profiler.groundtruth.expect import Cause

from . import graph as G
from . import timeouts
from .critical_path import iteration_totals
from . import imbalance as IM
from . import late_entry as LE
from .timemodel import GPU
from .rendezvous import arrivals, kernel_busy_top, lateness, occurrence_info
from .verdict import MATERIAL_SHARE, Verdict, fmt_ns, fmt_pct, size

OCC_COLUMNS = ["rank", "kernel", "iteration", "launch", "block", "barrier", "scope", "occurrence", "arrivals",
               "useless_arrivals", "unfinished", "first_arrive_ns", "last_arrive_ns", "spread_ns", "lateness_ns",
               "entry_ns", "held_ns", "depart_ns", "total_wait_ns", "last_rank", "last_block", "last_warp"]
# the barrier's own quantity (one name, one computation: issue 29)
LATENESS = "barrier lateness after entry"
USELESS_WAIT = "useless wait"
SUMMARY_COLUMNS = ["rank", "kernel", "barrier", "scope", "occurrences", "arrivals", "useless_arrivals", "useless_share",
                   "mean_spread_ns", "max_spread_ns", "total_wait_ns", "last_rank", "last_block", "last_warp",
                   "last_share"]
PER_RANK_COLUMNS = ["kernel", "barrier", "rank", "occurrences", "times_last", "last_share", "mean_lateness_ns",
                    "total_wait_ns"]
# Useless arrivals (rendezvous.arrivals: the warp brought no work since it last synchronised, while
# another arrival did, or did no work in its whole launch) are an alarm when the time they are held
# there costs the op: per occurrence the median wait of its useless arrivals, median over the
# occurrences, against verdict.MATERIAL_SHARE of the op's latency (imbalance.op_latency). A warp
# held at a barrier it brings nothing to starts its next work that much later. They must also be
# MATERIAL_SHARE of the arrivals: every arrival is one more update of the barrier's counter that
# the working warps queue behind, and one stray warp in a thousand (ll_combine/recv_done with
# barrier 'working' at 5ab00a2: 1 of ~900 arrivals per occurrence, a duty warp that had already
# finished) costs the others nothing however long it is itself held. Measured: the
# low-latency dispatch with barrier 'all' (128 of 1024 warps arrive at send_done without a send
# task) 9.7% at send_done and 6.2% at combine's recv_done; with 'working' and in every other
# recorded run no useless arrival outside pure barrier kernels.
# a warp's lateness at a block / grid barrier that costs this share of its rank's lateness at the
# next cross-rank barrier is named as the root of it
ROOT_SHARE = 0.5


@dataclass
class BarrierReport:
    occurrences: pd.DataFrame
    summary: pd.DataFrame
    per_rank: pd.DataFrame
    verdict: Verdict = None
    warnings: tuple = ()
    findings: tuple = field(default=())


def _empty(cols):
    return pd.DataFrame({c: pd.Series([], dtype="object") for c in cols})


def _stragglers(occ: pd.DataFrame, totals: pd.DataFrame, g: G.Graph) -> list[Verdict]:
    """One verdict per (kernel, barrier, last arriver): LATENESS (the occurrences' held_ns: at a
    cross-rank barrier only what came after the last rank entered the op, the rest being the late
    entry's) summed per iteration, decided against ALARM_SHARE of the iteration."""
    if occ.empty or totals.empty:
        return []
    its = totals["iteration"].to_numpy()
    tot = totals["total_ns"].to_numpy(float)
    out = []
    # who: the last rank (cross-rank barriers) or the last warp (block / grid barriers)
    cross = occ["scope"].to_numpy() == "rank"
    who = np.where(cross, occ["last_rank"].astype(str),
                   occ["last_rank"].astype(str) + "/" + occ["last_block"].astype(str) + "/" + occ["last_warp"].astype(str))
    # what each group's verdict reads of the others, grouped once (per group, a selection of every
    # occurrence and a group-by of its own were most of this function's 0.22 s at 10 M events)
    who = pd.Series(who, index=occ.index, name="who")
    held = occ.groupby([occ["kernel"], occ["barrier"], who, occ["iteration"]], sort=True)["held_ns"].sum()
    # per group a row of the iterations' sums (a MultiIndex look-up and a reindex per group were half
    # of this function's 40 ms at 10 M events: 68 groups)
    held = held.unstack(level=-1).reindex(columns=its).fillna(0)
    held_row = {key: i for i, key in enumerate(held.index)}
    held = held.to_numpy(float)
    n_occ = occ.groupby(["kernel", "barrier"], sort=True).size().to_dict()
    for (kernel, barrier, w), grp in occ.groupby([occ["kernel"], occ["barrier"], who], sort=True):
        per_it = held[held_row[(kernel, barrier, w)]]
        r = int(grp["last_rank"].iloc[0])
        scope = str(grp["scope"].iloc[0])
        subject = (f"rank {r} at {kernel}/{barrier}" if scope == "rank" else
                   f"rank {r} block {int(grp['last_block'].iloc[0])} warp {int(grp['last_warp'].iloc[0])} at "
                   f"{kernel}/{barrier}")
        d = size(per_it, its, tot, quantity=LATENESS, subject=subject)
        all_occ = int(n_occ[(kernel, barrier)])
        who_words = (f"rank {r}" if scope == "rank" else
                     f"block {int(grp['last_block'].iloc[0])} warp {int(grp['last_warp'].iloc[0])} of rank {r}")
        detail = (f"{who_words} arrived last in {len(grp)} of {all_occ} occurrences "
                  f"({fmt_pct(len(grp) / all_occ)})")
        out.append(Verdict(page="barriers", alarm=d.alarm, cause=Cause.BARRIER_STRAGGLER, rank=r,
                           kernel=str(kernel), phase=str(barrier), magnitude_ns=d.mean_ns,
                           reference_ns=d.reference_mean_ns, n=d.n, detail=detail,
                           facts=(f"decision: {LATENESS} {fmt_ns(d.mean_ns)} per iteration, {d.describe()}",
                                  detail + (" (at a cross-rank barrier, what the others waited before the last "
                                            "rank entered the op is the late entry's)" if scope == "rank" else "")),
                           decisions=(d,), evidence=grp.reset_index(drop=True)))
    out.sort(key=lambda v: -(v.share or 0))
    # a rank that arrives late at a cross-rank barrier because one of its own warps arrived late at
    # a grid / block barrier before: lead with that warp (the root) when it costs at least half as
    # much (the late_arriver scenario of profiler.groundtruth.synthetic plants exactly this)
    if out and out[0].alarm and _scope(occ, out[0]) == "rank":
        own = [v for v in out[1:] if v.alarm and v.rank == out[0].rank and _scope(occ, v) != "rank"
               and (v.share or 0) >= ROOT_SHARE * (out[0].share or 0)]
        if own:
            out.remove(own[0])
            out.insert(0, own[0])
    return out


def _scope(occ: pd.DataFrame, v: Verdict) -> str:
    s = occ.loc[(occ["kernel"] == v.kernel) & (occ["barrier"] == v.phase), "scope"]
    return str(s.iloc[0]) if len(s) else ""


def _useless(g: G.Graph, busy_kernels: set, totals: pd.DataFrame) -> list[Verdict]:
    """One verdict per (rank, kernel, barrier) with useless arrivals, in kernels with work (a
    kernel that only synchronises has nothing for its warps to bring): USELESS_WAIT per iteration
    (the median over the iteration's occurrences of their useless arrivals' median wait) decided
    against MATERIAL_SHARE of the op latency after entry, when the useless arrivals are
    MATERIAL_SHARE of the barrier's arrivals or more; largest first."""
    a = arrivals(g)
    u = a[a["useless"].to_numpy()]
    if u.empty or totals.empty:
        return []
    info = occurrence_info(g)
    cross = info["cross"].to_numpy()
    n_arr = np.bincount(a["occ"].to_numpy(), minlength=len(info))
    per = u.groupby("occ", sort=True).agg(n=("row", "size"), wait=("wait_ns", "median"), rank=("rank", "first"))
    occ = per.index.to_numpy()
    per = per.assign(kernel=info["kernel"].to_numpy()[occ], barrier=info["barrier"].to_numpy()[occ],
                     iteration=info["iteration"].to_numpy()[occ], arrivals=n_arr[occ],
                     rank=np.where(cross[occ], -1, per["rank"].to_numpy()))
    per = per[per["kernel"].isin(busy_kernels)]
    its = totals["iteration"].to_numpy()
    op = IM.op_latency(g).set_index("iteration")["op_ns"].reindex(its).to_numpy(float)
    out = []
    for (rank, k, b), grp in per.groupby(["rank", "kernel", "barrier"], sort=True):
        held = grp.groupby("iteration")["wait"].median().reindex(its).fillna(0).to_numpy(float)
        n, tot = int(grp["n"].sum()), int(grp["arrivals"].sum())
        where = f"{k}/{b}" + ("" if int(rank) < 0 else f" on rank {int(rank)}")
        d = size(held, its, op, MATERIAL_SHARE, quantity=USELESS_WAIT, subject=where,
                 reference="the op latency after entry")
        many = n >= MATERIAL_SHARE * tot
        detail = (f"{n} of {tot} arrivals ({fmt_pct(n / max(tot, 1))}) come from warps that brought no work since "
                  f"they last synchronised; held {fmt_ns(d.mean_ns)} per iteration ({fmt_pct(d.share)} of the op "
                  f"latency after entry)")
        out.append(Verdict(page="barriers", alarm=d.alarm and many, cause=Cause.USELESS_ARRIVALS,
                           rank=None if int(rank) < 0 else int(rank), kernel=str(k), phase=str(b),
                           magnitude_ns=d.mean_ns, reference_ns=d.reference_mean_ns, reference=d.reference, n=d.n,
                           detail=detail,
                           facts=(f"decision: {USELESS_WAIT} {fmt_ns(d.mean_ns)} per iteration, {d.describe()}"
                                  + ("" if many else f"; not material: under {fmt_pct(MATERIAL_SHARE)} of the "
                                                     f"barrier's arrivals"),),
                           decisions=(d,)))
    out.sort(key=lambda v: -(v.magnitude_ns or 0))
    return out


def _with_late_entry(found: list[Verdict], occ: pd.DataFrame, le: LE.LateEntry | None) -> list[Verdict]:
    """One decision about a late rank (late_entry.py): when it is an alarm and the run has
    cross-rank barriers, the rank that entered late is named here as the rank the others waited
    for, with the same sentences as every page; it leads, unless it entered late on the GPU side
    because one of its own warps held its previous kernel at a grid / block barrier: that warp is
    the root (ROOT_SHARE, as in _stragglers)."""
    if le is None or not le.alarm or not bool((occ["scope"] == "rank").any()):
        return found
    head = Verdict(page="barriers", alarm=True, cause=Cause.BARRIER_STRAGGLER, rank=le.rank, peer=le.waiter,
                   kernel=le.kernel or None, phase=le.phase, magnitude_ns=le.waited.mean_ns,
                   reference_ns=le.waited.reference_mean_ns, n=le.n, late_entry=le.side, detail=le.headline(),
                   facts=le.facts(), decisions=le.decisions(), evidence=le.evidence)
    own = [v for v in found if v.alarm and v.rank == le.rank and _scope(occ, v) != "rank"
           and (v.share or 0) >= ROOT_SHARE * le.decision.share]
    if le.side == GPU and own:
        root = replace(own[0], notes=tuple(own[0].notes) + (f"which is why late entry: {le.headline()}",))
        return [root, head] + [v for v in found if v is not own[0]]
    return [head] + found


def headline(rep: BarrierReport, g: G.Graph) -> tuple[Verdict, tuple]:
    warns = tuple(g.warnings)
    totals = iteration_totals(g)
    found = _stragglers(rep.occurrences, totals, g)
    le = LE.decision(g, totals)
    if len(rep.occurrences):
        found = _with_late_entry(found, rep.occurrences, le)
    alarms = [v for v in found if v.alarm]
    top = kernel_busy_top(g)
    busy_kernels = set(top.index[top.to_numpy() > 0])
    useless = _useless(g, busy_kernels, totals) if len(rep.summary) else []
    alarms += [v for v in useless if v.alarm]
    unf = rep.occurrences[rep.occurrences["unfinished"] > 0] if len(rep.occurrences) else rep.occurrences
    extra = ""
    if len(unf):
        u = unf.iloc[0]
        extra = (f"at barriers: {int(unf['unfinished'].sum())} arrival(s) never departed "
                 f"(first: {u['kernel']}/{u['barrier']})")
    tv = timeouts.verdict(g, "barriers", extra=extra)
    ordered = ([tv] if tv is not None else []) + alarms
    notes = [v.headline for v in ordered[1:4]]
    notes += [v.headline + " (not material)" for v in useless if not v.alarm][:2]
    if le is not None and not le.alarm:
        notes += le.notes()
    decisions = tuple(dict.fromkeys([d for v in ordered + found[:1] for d in v.decisions]
                                    + (list(le.decisions()) if le is not None else [])))
    if ordered:
        return (replace(ordered[0], notes=tuple(list(ordered[0].notes) + notes), warnings=warns,
                        decisions=decisions), tuple(ordered))
    if rep.occurrences.empty:
        v = Verdict(page="barriers", alarm=False, cause=Cause.NONE, detail="the run recorded no barrier events",
                    notes=tuple(notes), warnings=warns, decisions=decisions)
        return v, (v,)
    top = found[0] if found else None
    detail = "no barrier holds anyone up"
    if top is not None:
        d = top.decisions[0]
        detail += (f": the longest {LATENESS} is {fmt_ns(d.mean_ns)} per iteration at {top.kernel}/{top.phase} "
                   f"({top.detail}; {fmt_pct(d.share)} of the iteration)")
    v = Verdict(page="barriers", alarm=False, cause=Cause.NONE, detail=detail, n=len(totals), warnings=warns,
                facts=top.facts if top is not None else (), notes=tuple(notes), decisions=decisions)
    return v, (v,)


def held_after_entry(occ: pd.DataFrame) -> np.ndarray:
    """Per occurrence, LATENESS: the last arrival minus the later of the arrival before it and, at a
    cross-rank barrier, the last rank's entry into the op occurrence (entry_ns; unknown: the whole
    lateness). At a barrier in a kernel's first steps a late rank arrives last because it entered
    late: that part is the late-entry decision's, counted there once."""
    late = occ["lateness_ns"].to_numpy(float)
    last = occ["last_arrive_ns"].to_numpy(float)
    entry = occ["entry_ns"].to_numpy(float)
    prev = last - late
    cut = np.where((occ["scope"].to_numpy() == "rank") & np.isfinite(entry), np.maximum(prev, entry), prev)
    return np.clip(last - cut, 0, None).astype(np.int64)


def barrier_contention(events: pd.DataFrame, *, registry=None, launches=None) -> BarrierReport:
    """Per barrier occurrence: arrivals, useless arrivals, spread, wait, last arriver (columns:
    package docstring). launches: where timed-out kernels stopped (graph.build)."""
    return from_graph(G.build(events, registry, launches))


def from_graph(g) -> BarrierReport:
    """The report of a graph (graph.Graph, or the combined summaries of a run analysed in chunks:
    profiler.analysis.chunked), read through arrivals and occurrence_info only."""
    info = occurrence_info(g)
    if len(info) == 0:
        rep = BarrierReport(_empty(OCC_COLUMNS), _empty(SUMMARY_COLUMNS), _empty(PER_RANK_COLUMNS),
                            warnings=tuple(g.warnings))
        rep.verdict, rep.findings = headline(rep, g)
        return rep
    a = arrivals(g)
    starts = np.r_[0, np.flatnonzero(a["occ"].to_numpy()[1:] != a["occ"].to_numpy()[:-1]) + 1]
    ends = np.r_[starts[1:], len(a)] - 1                # arrivals are sorted by time within an occurrence
    barrier = info["barrier"].to_numpy()
    scope = info["scope"].to_numpy()
    cross = info["cross"].to_numpy()
    grp = a.groupby("occ", sort=True)
    occ = pd.DataFrame({
        "rank": np.where(cross, -1, a["rank"].to_numpy()[starts]),
        "kernel": info["kernel"].to_numpy(),
        "iteration": info["iteration"].to_numpy(),
        "launch": np.where(cross, -1, info["launch"].to_numpy()),
        "block": np.where(scope == "block", a["block"].to_numpy()[starts], -1),
        "barrier": barrier, "scope": scope,
        "occurrence": info["payload"].to_numpy(),
        "arrivals": np.diff(np.r_[starts, len(a)]),
        "useless_arrivals": grp["useless"].sum().to_numpy().astype(np.int64),
        "unfinished": grp["unfinished"].sum().to_numpy().astype(np.int64),
        "first_arrive_ns": a["t"].to_numpy()[starts],
        "last_arrive_ns": a["t"].to_numpy()[ends],
        "lateness_ns": lateness(a, cross),
        "entry_ns": grp["entry_ns"].max().to_numpy(),
        "depart_ns": grp["depart_ns"].max().to_numpy(),
        "total_wait_ns": grp["wait_ns"].sum().to_numpy().astype(np.int64),
        "last_rank": a["rank"].to_numpy()[ends], "last_block": a["block"].to_numpy()[ends],
        "last_warp": a["warp"].to_numpy()[ends],
    })
    occ["spread_ns"] = occ["last_arrive_ns"] - occ["first_arrive_ns"]
    occ["held_ns"] = held_after_entry(occ)
    occ = occ[OCC_COLUMNS]

    keys = ["rank", "kernel", "barrier"]
    sm = occ.groupby(keys, sort=True).agg(
        scope=("scope", "first"), occurrences=("occurrence", "size"), arrivals=("arrivals", "sum"),
        useless_arrivals=("useless_arrivals", "sum"), mean_spread_ns=("spread_ns", "mean"),
        max_spread_ns=("spread_ns", "max"), total_wait_ns=("total_wait_ns", "sum")).reset_index()
    sm["useless_share"] = sm["useless_arrivals"] / sm["arrivals"].where(sm["arrivals"] > 0, 1)
    top = (occ.groupby(keys + ["last_rank", "last_block", "last_warp"], sort=True).size().rename("n").reset_index()
           .sort_values(keys + ["n"], ascending=[True, True, True, False], kind="stable").drop_duplicates(keys))
    sm = sm.merge(top, on=keys, how="left")
    sm["last_share"] = sm["n"] / sm["occurrences"]
    summary = sm[SUMMARY_COLUMNS]

    # cross-rank barriers: per rank
    cross_occ = np.flatnonzero(cross)
    if len(cross_occ):
        ac = a[np.isin(a["occ"].to_numpy(), cross_occ)]
        per = ac.groupby(["occ", "rank"], sort=True).agg(last_t=("t", "max"), wait=("wait_ns", "sum")).reset_index()
        o = occ.iloc[per["occ"].to_numpy()]
        per["kernel"] = o["kernel"].to_numpy()
        per["barrier"] = o["barrier"].to_numpy()
        per["late"] = per["last_t"].to_numpy() - o["first_arrive_ns"].to_numpy()
        per["is_last"] = per["rank"].to_numpy() == o["last_rank"].to_numpy()
        pr = per.groupby(["kernel", "barrier", "rank"], sort=True).agg(
            occurrences=("occ", "size"), times_last=("is_last", "sum"), mean_lateness_ns=("late", "mean"),
            total_wait_ns=("wait", "sum")).reset_index()
        pr["times_last"] = pr["times_last"].astype(np.int64)
        pr["last_share"] = pr["times_last"] / pr["occurrences"]
        per_rank = pr[PER_RANK_COLUMNS]
    else:
        per_rank = _empty(PER_RANK_COLUMNS)
    rep = BarrierReport(occurrences=occ.reset_index(drop=True), summary=summary.reset_index(drop=True),
                        per_rank=per_rank.reset_index(drop=True), warnings=tuple(g.warnings))
    rep.verdict, rep.findings = headline(rep, g)
    return rep
