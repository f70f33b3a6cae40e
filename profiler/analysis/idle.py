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

from profiler.expect import Cause

from . import graph as G
from . import imbalance as IM
from . import late_entry as LE
from . import timeouts
from .critical_path import iteration_totals
from .whatif import what_if
from .keys import ranges
from .rendezvous import NO_WORK_SHARE, rank_lateness
from .verdict import Verdict, fmt_ns, fmt_pct

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
    for (rank, kernel), blk in per_block.groupby(["rank", "kernel"], sort=True, observed=True):
        if kernel not in working_kernels:
            continue     # a kernel in which no warp of any rank works (a pure barrier kernel) is not starved
        warps = per_warp[(per_warp["rank"] == rank) & (per_warp["kernel"] == kernel)]
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
    """(kernel/phase, speedup, median op-latency change in ns) of the what-if that makes the
    straggler's most imbalanced work phase as fast as the median rank's (profiler.analysis.whatif:
    the same function the what-if box calls); None when no phase is named."""
    ph = [(k, p) for k, p in s["where"] if p]
    if not ph:
        return None
    k, p = ph[0]
    pb = IM.phase_busy(g)
    row = pb[(pb["kernel"] == k) & (pb["phase"] == p) & (pb["rank"] == rank)]
    if row.empty or not np.isfinite(row["busy_ratio"].iloc[0]) or row["busy_ratio"].iloc[0] <= 1:
        return None
    speedup = round(1.0 - 1.0 / float(row["busy_ratio"].iloc[0]), 3)
    w = what_if(g.events, phase=f"{k}/{p}", speedup=speedup, rank=rank, graph=g, new_path=False).summary
    change = float(np.nanmedian(w["op_change_ns"].to_numpy(float))) if len(w) else float("nan")
    return f"{k}/{p}", speedup, change


def _straggler(rep: IdleReport, totals: pd.DataFrame, late: pd.DataFrame,
               excess: pd.DataFrame, order: list[str], op: pd.DataFrame, g: G.Graph) -> tuple[Verdict | None, list[str]]:
    """The cross-rank finding: the rank that carries extra work (imbalance.straggler), what it
    carries extra, and what it costs the op: how long the others wait on it (its lateness at
    cross-rank barriers (rendezvous) or its busiest warps' extra work (imbalance.busy_excess),
    whichever is larger, median over iterations) or what balancing would save its warps
    (imbalance.straggler_cost), whichever is larger, against the op's latency (imbalance.op_latency).
    An imbalance that costs the op less than imbalance.MATERIAL_SHARE of its latency is no alarm:
    the verdict comes back with alarm False and the page states it as a note."""
    notes = []
    s = IM.straggler(rep.ranks, rep.phases, order)
    if s is None or totals.empty:
        return None, notes
    its = totals["iteration"].to_numpy()
    r = s["rank"]

    def per_it(df, col):
        if df.empty or r not in set(df["rank"]):
            return np.zeros(len(its))
        return df[df["rank"] == r].groupby("iteration")[col].sum().reindex(its).fillna(0).to_numpy(float)
    held = np.maximum(per_it(late, "lateness_ns"), per_it(excess, "excess_ns"))
    grp = s["group"]
    waited, saving = IM.straggler_cost(grp[grp["role"] == s["role"]], r, held, len(its))
    op_ns = float(op["op_ns"].median()) if len(op) else 0.0
    cost = max(waited, saving)
    material = bool(op_ns > 0 and cost >= IM.MATERIAL_SHARE * op_ns)
    top = grp[grp["rank"] == r].iloc[0]
    detail = (f"its {s['role']} warps in {s['kernel']} are busy {fmt_ns(float(top['busy_ns']))} against the median "
              f"rank's {fmt_ns(float(grp['busy_ns'].median()))} (summed over warps and launches; work spans "
              f"{int(top['spans'])} against {int(grp['spans'].median())}); the others waited {fmt_ns(waited)} on it "
              f"per iteration (median), balancing would save each of its {s['role']} warps {fmt_ns(saving)} per "
              f"iteration")
    proj = balancing_projection(g, s, r)
    if proj is not None:
        phase, speedup, change = proj
        detail += (f"; a what-if that makes its {phase} {100 * speedup:.0f}% faster (as fast as the median rank's) "
                   f"changes the op latency after entry by {fmt_ns(change)} per iteration (median): that phase "
                   f"alone{' barely' if -change < IM.MATERIAL_SHARE * op_ns else ''} moves the op, the figure above "
                   f"bounds what balancing the whole role would")
    if not material:
        detail += (f"; not material: it costs the op at most {fmt_ns(cost)} per iteration, under "
                   f"{fmt_pct(IM.MATERIAL_SHARE)} of its latency after entry")
    v = Verdict(page="idle", alarm=material, cause=Cause.RANK_IMBALANCE, rank=r, kernel=s["where"][0][0],
                phase=s["where"][0][1], where=tuple(s["where"]), magnitude_ns=cost, reference_ns=op_ns or None,
                reference="the op latency after entry",
                n=len(its), ratio=s["ratio"], detail=detail, evidence=grp.reset_index(drop=True))
    return v, notes


def headline(rep: IdleReport, g: G.Graph) -> tuple[Verdict, tuple]:
    warns = tuple(g.warnings)
    totals = iteration_totals(g)
    straggler, notes = _straggler(rep, totals, rank_lateness(g), IM.busy_excess(g), IM.kernel_order(g),
                                  IM.op_latency(g), g)
    if straggler is not None and not straggler.alarm:
        notes.append(straggler.headline)       # an immaterial imbalance: a note, never the headline
        straggler = None
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
        sz = le.size
        findings.append((sz.magnitude_ns / sz.reference_ns if sz.reference_ns else 0.0,
                         Verdict(page="idle", alarm=True, cause=le.cause, rank=le.rank, peer=le.waiter,
                                 kernel=le.kernel, phase=le.phase, magnitude_ns=sz.magnitude_ns,
                                 reference_ns=sz.reference_ns, n=sz.n, iteration=sz.iteration, late_entry=le.side,
                                 detail=le.clause(), evidence=le.evidence)))
    elif le is not None and le.size.borderline:
        notes.append(f"borderline late entry: {le.clause()}; {le.size.note}")
    tv = timeouts.verdict(g, "idle")
    ordered = [f[1] for f in findings]
    if tv is not None:
        # after a stall every rank's load looks unequal (the stalled rank received nothing): only
        # the starvation is worth a note
        ordered = [v for v in ordered if v.cause is Cause.STARVED_WARPS]
        notes = [n for n in notes if "busy" not in n]
    if tv is not None:
        ordered.insert(0, tv)
    others = [v.headline for v in ordered[1:4]]
    if ordered:
        head = ordered[0]
        head = replace(head, notes=tuple(others + notes + list(head.notes)), warnings=warns)
        return head, tuple(ordered)
    worst = rep.ranks["busy_ratio"].replace([np.inf], np.nan).max() if len(rep.ranks) else np.nan
    balanced = ("one rank" if not len(rep.ranks) or rep.ranks["rank"].nunique() < 2 else
                f"busy time across ranks: max/median per kernel and role ≤ {worst:.2f}"
                + (" (balanced)" if worst < RANK_IMBALANCE_RATIO else ""))
    lead = ("every warp did work" if rep.per_warp["did_work"].all()
            else "every warp of the kernels that record work did work")
    if not rep.per_warp["did_work"].any():
        lead = "no warp recorded any work (only waits, barriers or instants)"
    v = Verdict(page="idle", alarm=False, cause=Cause.NONE, detail=f"{lead}; {balanced}", notes=tuple(notes),
                warnings=warns, n=len(totals))
    return v, (v,)


def idle_warps(events: pd.DataFrame, *, registry=None, launches=None) -> IdleReport:
    """Busy/idle time per warp and block, imbalance within and across ranks, and the verdict
    (columns: package docstring). launches: where timed-out kernels stopped (graph.build)."""
    g = G.build(events, registry, launches)
    lanes = per_lane(g)
    # warps that recorded nothing (the launch table says how many there were) did no work either
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
    ranks = IM.per_rank(lanes, waited, phases)
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
