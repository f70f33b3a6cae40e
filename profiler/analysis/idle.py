"""Idle warps and starvation (the returned columns are documented in the package docstring).

Busy time is the leaf time of a warp's non-wait, non-idle spans (nested children counted once, by
the graph's segment ownership); wait time is its wait spans, idle spans and barrier waits. A warp
"did no work" when its busy time is 0: it recorded only waits, idle phases, barriers or
instants. The kernel time of a warp is its launch's GPU time (first warp begin to last warp end
on that rank).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import graph as G

PER_WARP_COLUMNS = ["rank", "kernel", "block", "warp", "role", "launches", "kernel_ns", "busy_ns", "wait_ns",
                    "idle_ns", "busy_share", "did_work"]
PER_BLOCK_COLUMNS = ["rank", "kernel", "block", "warps", "working_warps", "busy_ns", "idle_ns", "busy_share", "did_work"]
IMBALANCE_COLUMNS = ["rank", "kernel", "role", "warps", "max_busy_ns", "median_busy_ns", "ratio"]
# a (rank, role) whose busiest warp does more than this multiple of the median is called out
IMBALANCE_CALL_OUT = 1.5
# A warp busy for less than this share of its kernel time did no work: what remains is the leaf
# time a container span keeps around its idle/wait children, i.e. the recorder's own bookkeeping
# (0.12% on the real traces/selftest-starved-warps, whose idle warps' `iteration` spans each hold
# one `idle` span; the working warps there are busy 99.7%).
NO_WORK_SHARE = 0.01


@dataclass
class IdleReport:
    per_warp: pd.DataFrame
    per_block: pd.DataFrame
    imbalance: pd.DataFrame
    verdict: str
    evidence: pd.DataFrame


def _empty(cols):
    return pd.DataFrame({c: pd.Series([], dtype="object") for c in cols})


def per_lane(g: G.Graph) -> pd.DataFrame:
    """One row per GPU lane (warp of one launch): busy / wait / kernel time."""
    L = g.lane
    dur = G.segment_durations(g)
    busy = G.lane_sums(g, (G.WORK,), dur)
    wait = G.lane_sums(g, (G.WAIT, G.IDLE, G.BARRIER), dur)
    df = L.assign(busy_ns=busy, wait_ns=wait, first_ns=g.pt_t[g.lane_first], last_ns=g.pt_t[g.lane_last])
    df = df[~df["host"]]
    launch_span = df.groupby(["rank", "launch"], sort=False).agg(b=("first_ns", "min"), e=("last_ns", "max"))
    k = launch_span["e"] - launch_span["b"]
    idx = pd.MultiIndex.from_arrays([df["rank"], df["launch"]])
    df = df.assign(kernel_ns=k.reindex(idx).to_numpy())
    return df


def _verdict(per_warp: pd.DataFrame, per_block: pd.DataFrame, imbalance: pd.DataFrame):
    statements, keys = [], []
    # a kernel in which no warp of any rank works (a pure barrier / clock-probe kernel) is not
    # starved: leave it out of the verdict
    working_kernels = set(per_warp.loc[per_warp["did_work"], "kernel"])
    for (rank, kernel), blk in per_block.groupby(["rank", "kernel"], sort=True, observed=True):
        if kernel not in working_kernels:
            continue
        warps = per_warp[(per_warp["rank"] == rank) & (per_warp["kernel"] == kernel)]
        working = int(warps["did_work"].sum())
        idle_blocks = blk.loc[~blk["did_work"], "block"]
        idle_w = warps[~warps["did_work"] & warps["block"].isin(blk.loc[blk["did_work"], "block"])]
        if working == 0:
            statements.append((len(warps), f"rank {rank} {kernel}: no warp did work ({len(warps)} warps; "
                                           f"other ranks' warps did)"))
            keys.append((rank, kernel))
            continue
        parts = []
        if len(idle_blocks):
            word = "block" if len(idle_blocks) == 1 else "blocks"
            parts.append(f"{word} {G.ranges(idle_blocks)} did no work")
        if len(idle_w):
            # group the idle warps of working blocks by their warp set: "warps 4–7 of blocks 0–15"
            sets = idle_w.groupby("block")["warp"].apply(lambda w: G.ranges(w))
            by_set = sets.groupby(sets).apply(lambda s: G.ranges(s.index))
            desc = "; ".join(f"warp{'s' if ('–' in ws or ',' in ws) else ''} {ws} of block{'s' if ('–' in bs or ',' in bs) else ''} {bs}"
                             for ws, bs in by_set.items())
            parts.append(f"{len(idle_w)} warp{'s' if len(idle_w) != 1 else ''} did no work ({desc})")
        if parts:
            n_idle = int((~warps["did_work"]).sum())
            statements.append((n_idle, f"rank {rank} {kernel}: " + "; ".join(parts)
                               + f"; {working} warp{'s' if working != 1 else ''} carried all work"))
            keys.append((rank, kernel))
    if statements:
        order = sorted(range(len(statements)), key=lambda i: -statements[i][0])
        shown = order[:4]
        text = ". ".join(statements[i][1] for i in shown)
        if len(order) > 4:
            text += f". ({len(order) - 4} more rank/kernel pairs with idle warps)"
        return text, [keys[i] for i in shown]
    lead = "every warp did work" if per_warp["did_work"].all() else "every warp of the kernels that record work did work"
    if not imbalance.empty:
        imbalance = imbalance[imbalance["kernel"].isin(working_kernels)]
        worst = imbalance.replace([np.inf], np.nan).dropna(subset=["ratio"]).sort_values("ratio", ascending=False)
        if not worst.empty and worst.iloc[0]["ratio"] > IMBALANCE_CALL_OUT:
            w = worst.iloc[0]
            return (f"{lead}; imbalance: on rank {w['rank']} {w['kernel']} the busiest {w['role']} "
                    f"warp is {w['ratio']:.2f}x the median"), [(w["rank"], w["kernel"])]
        if not worst.empty:
            return f"{lead}; busy time balanced (max/median <= {worst.iloc[0]['ratio']:.2f})", []
    if per_warp["did_work"].any():
        return "every warp of the working kernels did work", []
    return "no warp recorded any work (only waits, barriers or instants)", []


def idle_warps(events: pd.DataFrame, *, registry=None) -> IdleReport:
    """Busy/idle time per warp and block, imbalance, and a named verdict (columns: package docstring)."""
    g = G.build(events, registry)
    lanes = per_lane(g)
    if lanes.empty:
        return IdleReport(_empty(PER_WARP_COLUMNS), _empty(PER_BLOCK_COLUMNS), _empty(IMBALANCE_COLUMNS),
                          "no GPU warps in the run", _empty(PER_WARP_COLUMNS))
    pw = lanes.groupby(["rank", "kernel", "block", "warp"], sort=True, observed=True).agg(
        role=("role", "first"), launches=("launch", "size"), kernel_ns=("kernel_ns", "sum"),
        busy_ns=("busy_ns", "sum"), wait_ns=("wait_ns", "sum")).reset_index()
    pw["idle_ns"] = (pw["kernel_ns"] - pw["busy_ns"]).clip(lower=0)
    pw["busy_share"] = np.where(pw["kernel_ns"] > 0, pw["busy_ns"] / pw["kernel_ns"].where(pw["kernel_ns"] > 0, 1), 0.0)
    pw["did_work"] = np.where(pw["kernel_ns"] > 0, pw["busy_share"] >= NO_WORK_SHARE, pw["busy_ns"] > 0)
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

    verdict, keys = _verdict(pw, pb, im)
    if keys:
        kk = pd.MultiIndex.from_tuples(keys)
        ev_rows = pw[pd.MultiIndex.from_arrays([pw["rank"], pw["kernel"]]).isin(kk)]
    else:
        ev_rows = pw.iloc[0:0]
    return IdleReport(per_warp=pw, per_block=pb, imbalance=im, verdict=verdict, evidence=ev_rows.reset_index(drop=True))
