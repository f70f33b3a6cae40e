"""Idle warps and starvation, within a rank and across ranks (columns: package docstring).

Busy time is the leaf time of a warp's work spans (nested children counted once, by the graph's
segment ownership); a warp that recorded nothing at all counts as a warp with no work when the
launch table says it existed (`launches=`: its profile buffer's regions); wait time is its wait spans, idle spans and barrier waits, unfinished ones
included (they last until the kernel gave up). A warp "did no work" when its busy time is below
NO_WORK_SHARE of the busiest warp of the same kernel (any rank): it recorded only waits, idle
phases, barriers or instants. The kernel time of a warp is its launch's GPU time (first warp
begin to last warp end on that rank).

Starvation across ranks is imbalance: when one rank carries more work (busy time of a role) and
the others wait on it, the verdict names that rank, what it carries extra and how long the
others wait (profiler.analysis.imbalance). The page leads with the largest effect.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from profiler.groundtruth.expect import Cause

from . import graph as G
from . import imbalance as IM
from . import late_entry as LE
from . import path_verdict as PV
from . import straggler as ST
from . import timeouts
from .critical_path import iteration_totals
from .whatif import what_if
from .keys import ranges
from .rendezvous import NO_WORK_SHARE
from .verdict import Verdict, fmt_ns

PER_WARP_COLUMNS = ["rank", "kernel", "block", "warp", "role", "launches", "kernel_ns", "busy_ns", "wait_ns",
                    "idle_ns", "busy_share", "did_work"]
PER_BLOCK_COLUMNS = ["rank", "kernel", "block", "warps", "working_warps", "busy_ns", "idle_ns", "busy_share", "did_work"]
IMBALANCE_COLUMNS = ["rank", "kernel", "role", "warps", "max_busy_ns", "median_busy_ns", "ratio"]
# a (rank, role) whose busiest warp does more than this multiple of the median is called out
IMBALANCE_CALL_OUT = 1.5
from .imbalance import RANK_IMBALANCE_RATIO, per_lane  # noqa: E402,F401 (re-exported: pages read them here)
# NO_WORK_SHARE (rendezvous.py, 1%): a warp busy for less than this share of the busiest warp of
# its kernel did no work: what remains is the leaf time a container span keeps around its
# idle/wait children, i.e. the recorder's own bookkeeping (0.12% on the real
# traces/selftest-starved-warps, whose idle warps' `iteration` spans each hold one `idle` span; the
# working warps there are busy 99.7% of the kernel).


@dataclass
class IdleReport:
    per_warp: pd.DataFrame
    per_block: pd.DataFrame
    imbalance: pd.DataFrame           # within a rank: busiest warp / median warp per (rank, kernel, role)
    ranks: pd.DataFrame               # across ranks: imbalance.RANK_COLUMNS
    phases: pd.DataFrame              # across ranks per work phase: imbalance.PHASE_COLUMNS
    waited: pd.DataFrame              # imbalance.WAITED_COLUMNS
    verdict: Verdict
    evidence: pd.DataFrame
    warnings: tuple = ()
    findings: tuple = field(default=())   # every verdict the page found, the headline first


def _empty(cols):
    return pd.DataFrame({c: pd.Series([], dtype="object") for c in cols})


def _statements(per_warp: pd.DataFrame, per_block: pd.DataFrame, order: list[str] = ()) -> list[dict]:
    """One starvation finding per (rank, kernel) with warps that did no work, most idle first."""
    out = []
    working_kernels = set(per_warp.loc[per_warp["did_work"], "kernel"])
    # each (rank, kernel)'s warps, split once (a selection of every warp per group was 10 of this
    # function's 15 ms at 10 M events: 24 groups); a group keeps the rows' order and index
    by_group = dict(iter(per_warp.groupby(["rank", "kernel"], sort=False, observed=True)))
    for (rank, kernel), blk in per_block.groupby(["rank", "kernel"], sort=True, observed=True):
        if kernel not in working_kernels:
            continue     # a kernel in which no warp of any rank works (a pure barrier kernel) is not starved
        warps = by_group.get((rank, kernel), per_warp.iloc[0:0])
        working = int(warps["did_work"].sum())
        n_idle = int((~warps["did_work"]).sum())
        if n_idle == 0:
            continue
        if working == 0:
            text = f"rank {rank} {kernel}: no warp did work ({len(warps)} warps; other ranks' warps did)"
        else:
            parts = []
            idle_blocks = blk.loc[~blk["did_work"], "block"]
            idle_w = warps[~warps["did_work"] & warps["block"].isin(blk.loc[blk["did_work"], "block"])]
            if len(idle_blocks):
                parts.append(f"{'block' if len(idle_blocks) == 1 else 'blocks'} {ranges(idle_blocks)} did no work")
            if len(idle_w):
                # group the idle warps of working blocks by their warp set: "warps 4–7 of blocks 0–15"
                sets = idle_w.groupby("block")["warp"].apply(lambda w: ranges(w))
                by_set = sets.groupby(sets).apply(lambda s: ranges(s.index))
                desc = "; ".join(f"warp{'s' if ('–' in ws or ',' in ws) else ''} {ws} of "
                                 f"block{'s' if ('–' in bs or ',' in bs) else ''} {bs}" for ws, bs in by_set.items())
                parts.append(f"{len(idle_w)} warp{'s' if len(idle_w) != 1 else ''} did no work ({desc})")
            text = (f"rank {rank} {kernel}: " + "; ".join(parts)
                    + f"; {working} warp{'s' if working != 1 else ''} carried all work")
        out.append({"rank": int(rank), "kernel": str(kernel), "idle": n_idle, "share": n_idle / len(warps),
                    "text": text})
    pos = {k: i for i, k in enumerate(order)}
    out.sort(key=lambda s: (-s["idle"], s["rank"], pos.get(s["kernel"], len(pos))))   # ties: the op's order
    return out


def balancing_projection(g: G.Graph, s: dict, rank: int) -> tuple[str, float, float] | None:
    """(kernel/phase, speedup, mean op-latency change per iteration in ns) of the what-if that makes the
    straggler's most imbalanced work phase as fast as the median rank's, the balancing target
    (profiler.analysis.whatif: the same function the what-if box calls); None when no phase is named."""
    ph = [(k, p) for k, p in s["where"] if p]
    if not ph:
        return None
    k, p = ph[0]
    pb = IM.phase_busy(g)
    grp = pb[(pb["kernel"] == k) & (pb["phase"] == p)]
    row = grp[grp["rank"] == rank]
    # balanced, every rank would carry the median rank's share (with 2 ranks their mean): the
    # balancing target, not the other ranks' busy time the ratio is taken against
    target = float(grp["busy_ns"].median()) if len(grp) else 0.0
    if row.empty or target <= 0 or float(row["busy_ns"].iloc[0]) <= target:
        return None
    speedup = round(1.0 - target / float(row["busy_ns"].iloc[0]), 3)
    if hasattr(g, "what_if_summary"):       # a run analysed in chunks re-times chunk by chunk
        w = g.what_if_summary(phase=f"{k}/{p}", speedup=speedup, rank=rank)
    else:
        w = what_if(g.events, phase=f"{k}/{p}", speedup=speedup, rank=rank, graph=g, new_path=False,
                    keep_retimed=False).summary
    # an iteration the what-if cannot re-time has no change (NaN); none re-timed: no mean (NaN), and
    # no all-NaN nanmean, whose RuntimeWarning the suite showed (issue 34)
    known = w["op_change_ns"].to_numpy(float)
    known = known[~np.isnan(known)]
    change = float(known.mean()) if known.size else float("nan")
    return f"{k}/{p}", speedup, change


def _straggler(g: G.Graph, warns) -> tuple[Verdict | None, list[str]]:
    """The shared straggler decision (profiler.analysis.straggler) as this page's verdict, with the
    balancing what-if as a fact; an immaterial one comes back as a note only."""
    st = ST.decision(g)
    if st is None:
        return None, []
    if not st.alarm:
        return None, [st.note()]
    facts = []
    proj = balancing_projection(g, {"where": list(st.where)}, st.rank)
    if proj is not None:
        phase, speedup, change = proj
        facts.append(f"what-if: making its {phase} {100 * speedup:.0f}% faster (as fast as the median rank's) changes "
                     f"the op latency after entry by {fmt_ns(change)} per iteration (mean): that "
                     f"phase alone bounds what balancing the whole role would save")
    return PV.straggler_verdict(st, "idle", warns, (), facts), []


def headline(rep: IdleReport, g: G.Graph) -> tuple[Verdict, tuple]:
    warns = tuple(g.warnings)
    totals = iteration_totals(g)
    straggler, notes = _straggler(g, warns)
    starving = _statements(rep.per_warp, rep.per_block, IM.kernel_order(g))
    findings = []
    if straggler is not None:
        findings.append((straggler.share or 0.0, straggler))
    for s in starving:
        same = [(x["kernel"], None) for x in starving if x["rank"] == s["rank"] and x["kernel"] != s["kernel"]]
        findings.append((s["share"], Verdict(page="idle", alarm=True, cause=Cause.STARVED_WARPS, rank=s["rank"],
                                              kernel=s["kernel"], where=((s["kernel"], None), *same),
                                              n=int(s["idle"]), detail=s["text"])))
    findings.sort(key=lambda f: -f[0])
    if straggler is not None:
        # warps that starve on the other ranks while one rank carries the work are the same story
        # (a zero-rank routing: rank 0's receivers get nothing, rank 1 all the rows): the straggler
        # leads, the starvation follows as a note
        findings.sort(key=lambda f: f[1] is not straggler and f[1].rank != straggler.rank)
    if len(rep.imbalance):
        worst = rep.imbalance.replace([np.inf], np.nan).dropna(subset=["ratio"]).sort_values("ratio", ascending=False)
        if len(worst) and worst.iloc[0]["ratio"] > IMBALANCE_CALL_OUT:
            w0 = worst.iloc[0]
            notes.append(f"within rank {w0['rank']} {w0['kernel']}, the busiest {w0['role']} warp is "
                         f"{w0['ratio']:.2f}× the median warp")
    le = LE.decision(g, totals)
    if le is not None and le.alarm:
        # the other ranks' warps sat idle waiting for a late rank to enter: after the warps' own
        # findings (what the page is for), the same decision as the other pages (late_entry.py)
        findings.append((le.decision.share, Verdict(
            page="idle", alarm=True, cause=le.cause, rank=le.rank, peer=le.waiter, kernel=le.kernel or None,
            phase=le.phase, magnitude_ns=le.waited.mean_ns, reference_ns=le.waited.reference_mean_ns, n=le.n,
            late_entry=le.side, detail=le.headline(), facts=le.facts(), decisions=le.decisions(),
            evidence=le.evidence)))
    elif le is not None:
        notes += le.notes()
    tv = timeouts.verdict(g, "idle")
    ordered = [f[1] for f in findings]
    if tv is not None:
        # after a stall every rank's load looks unequal (the stalled rank received nothing): only
        # the starvation is worth a note
        ordered = [v for v in ordered if v.cause is Cause.STARVED_WARPS]
        notes = [n for n in notes if "busy" not in n and "carries" not in n]
        ordered.insert(0, tv)
    if ordered:
        head = ordered[0]
        others = [v.headline for v in ordered[1:]]
        return replace(head, notes=tuple(others + notes + list(head.notes)), warnings=warns,
                       decisions=_decisions(ordered, g, totals)), tuple(ordered)
    worst = rep.ranks["busy_ratio"].replace([np.inf], np.nan).max() if len(rep.ranks) else np.nan
    balanced = ("one rank" if not len(rep.ranks) or rep.ranks["rank"].nunique() < 2 else
                f"busy time across ranks: each rank's over the other ranks' per kernel and role ≤ {worst:.2f}"
                + (" (balanced)" if worst < RANK_IMBALANCE_RATIO else ""))
    lead = ("every warp did work" if rep.per_warp["did_work"].all()
            else "every warp of the kernels that record work did work")
    if not rep.per_warp["did_work"].any():
        lead = "no warp recorded any work (only waits, barriers or instants)"
    v = Verdict(page="idle", alarm=False, cause=Cause.NONE, detail=f"{lead}; {balanced}", notes=tuple(notes),
                warnings=warns, n=len(totals), decisions=_decisions([], g, totals))
    return v, (v,)


def _decisions(ordered: list, g: G.Graph, totals: pd.DataFrame) -> tuple:
    """Every decision the page states: its findings' and the shared ones its notes state."""
    out = [d for v in ordered for d in v.decisions]
    for o in (LE.decision(g, totals), ST.decision(g)):
        if o is not None:
            out += [d for d in o.decisions() if d not in out]
    return tuple(out)


def idle_warps(events: pd.DataFrame, *, registry=None, launches=None) -> IdleReport:
    """Busy/idle time per warp and block, imbalance within and across ranks, and the verdict
    (columns: package docstring). launches: where timed-out kernels stopped (graph.build)."""
    return from_graph(G.build(events, registry, launches), launches)


def from_graph(g, launches=None) -> IdleReport:
    """The report of a graph (graph.Graph, or the combined summaries of a run analysed in chunks:
    profiler.analysis.chunked), read through the memoised per-graph tables only."""
    # warps that recorded nothing (the launch table says how many there were) did no work either;
    # the straggler decision's rows when its launch table is this one (computed once: straggler.lanes)
    shared = launches is g.derived.get("launches")
    if shared:
        lanes = ST.lanes(g)
    else:
        lanes = per_lane(g)
        lanes = pd.concat([lanes, IM.silent_lanes(lanes, launches)], ignore_index=True) if launches is not None else lanes
    if lanes.empty:
        v = Verdict(page="idle", alarm=False, cause=Cause.NONE, detail="no GPU warps in the run",
                    warnings=tuple(g.warnings))
        return IdleReport(_empty(PER_WARP_COLUMNS), _empty(PER_BLOCK_COLUMNS), _empty(IMBALANCE_COLUMNS),
                          _empty(IM.RANK_COLUMNS), _empty(IM.PHASE_COLUMNS), _empty(IM.WAITED_COLUMNS), v,
                          _empty(PER_WARP_COLUMNS), tuple(g.warnings), (v,))
    pw = lanes.groupby(["rank", "kernel", "block", "warp"], sort=True, observed=True).agg(
        role=("role", "first"), launches=("launch", "size"), kernel_ns=("kernel_ns", "sum"),
        busy_ns=("busy_ns", "sum"), wait_ns=("wait_ns", "sum")).reset_index()
    pw["idle_ns"] = (pw["kernel_ns"] - pw["busy_ns"]).clip(lower=0)
    pw["busy_share"] = np.where(pw["kernel_ns"] > 0, pw["busy_ns"] / pw["kernel_ns"].where(pw["kernel_ns"] > 0, 1), 0.0)
    top = pw.groupby("kernel", observed=True)["busy_ns"].transform("max").to_numpy(float)
    pw["did_work"] = (pw["busy_ns"].to_numpy(float) >= NO_WORK_SHARE * top) & (pw["busy_ns"].to_numpy() > 0)
    pw = pw[PER_WARP_COLUMNS]

    pb = pw.groupby(["rank", "kernel", "block"], sort=True, observed=True).agg(
        warps=("warp", "size"), working_warps=("did_work", "sum"), busy_ns=("busy_ns", "sum"),
        kernel_ns=("kernel_ns", "sum"), idle_ns=("idle_ns", "sum")).reset_index()
    pb["busy_share"] = np.where(pb["kernel_ns"] > 0, pb["busy_ns"] / pb["kernel_ns"].where(pb["kernel_ns"] > 0, 1), 0.0)
    pb["did_work"] = pb["working_warps"] > 0
    pb = pb[PER_BLOCK_COLUMNS]

    im = pw.groupby(["rank", "kernel", "role"], sort=True, observed=True)["busy_ns"].agg(
        warps="size", max_busy_ns="max", median_busy_ns="median").reset_index()
    mx, md = im["max_busy_ns"].to_numpy(float), im["median_busy_ns"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        im["ratio"] = np.where(md > 0, mx / np.where(md > 0, md, 1), np.where(mx > 0, np.inf, np.nan))
    im = im[IMBALANCE_COLUMNS]

    waited = IM.waited_on(g)
    phases = IM.phase_busy(g)
    ranks = ST.rank_table(g).copy() if shared else IM.per_rank(lanes, waited, phases)
    rep = IdleReport(per_warp=pw, per_block=pb, imbalance=im, ranks=ranks, phases=phases, waited=waited,
                     verdict=None, evidence=pw.iloc[0:0], warnings=tuple(g.warnings))
    v, findings = headline(rep, g)
    rep.verdict, rep.findings = v, findings
    if v.cause is Cause.STARVED_WARPS or v.cause is Cause.TIMEOUT:
        sel = (pw["rank"] == v.rank) & (pw["kernel"] == v.kernel)
        rep.evidence = pw[sel].reset_index(drop=True)
    elif v.cause is Cause.RANK_IMBALANCE:
        rep.evidence = ranks[ranks["kernel"] == v.kernel].reset_index(drop=True)
    return rep
