"""Barriers page: contention per barrier, who arrived last, spread per occurrence."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ... import theme
from ...format import axis_title, ns, share, time_unit

_PALETTE = ("#c77dff", "#4aa3ff", "#ff9f43", "#2ec4b6", "#ff6b6b", "#ffd166", "#7bd389")


def who(rank, block, warp) -> str:
    parts = []
    if rank is not None and int(rank) >= 0:
        parts.append(f"rank {int(rank)}")
    if block is not None and int(block) >= 0:
        parts.append(f"block {int(block)}")
    if warp is not None and int(warp) >= 0:
        parts.append(f"warp {int(warp)}")
    return " ".join(parts) or "?"


def sentences(report) -> list[str]:
    """One line per (kernel, barrier) naming the last arriver and the cost."""
    out = []
    summary = report.summary.sort_values(["last_share", "total_wait_ns"], ascending=False, kind="stable")
    for r in summary.to_dict("records"):
        line = (f"{r['barrier']} ({r['kernel']}, {r['scope']} scope): last arriver {who(r['last_rank'], r['last_block'], r['last_warp'])} "
                f"in {share(r['last_share'], 0)} of {int(r['occurrences'])} occurrence(s); "
                f"mean spread {ns(r['mean_spread_ns'])}, wait {ns(r['total_wait_ns'])} summed over the warps "
                f"of all occurrences")
        if r.get("useless_arrivals"):
            line += f", {int(r['useless_arrivals'])} useless arrival(s) ({share(r['useless_share'], 0)})"
        out.append(line + ".")
    pr = report.per_rank
    if len(pr):
        for (k, b), g in pr.groupby(["kernel", "barrier"], observed=True):
            top = g.sort_values("times_last", ascending=False).iloc[0]
            out.append(f"{b} ({k}) across ranks: rank {int(top['rank'])} arrived last {int(top['times_last'])} time(s) "
                       f"({share(top['last_share'], 0)}), on average {ns(top['mean_lateness_ns'])} after the first.")
    return out


def occurrences_figure(report, limit: int = 4000) -> dict:
    """Spread against when the occurrence began, in time since its iteration's first barrier
    arrival (iterations fold onto one axis; a position in the run says nothing: issue 29)."""
    occ = report.occurrences
    if occ.empty:
        return dict(data=[], layout=theme.figure_layout(height=200, title=dict(text="no barrier occurrences")))
    occ = occ.sort_values("first_arrive_ns")
    occ = occ.assign(since_ns=occ["first_arrive_ns"] - occ.groupby("iteration")["first_arrive_ns"].transform("min"))
    if len(occ) > limit:
        occ = occ.iloc[np.linspace(0, len(occ) - 1, limit).astype(int)]
    ux, uy = time_unit(occ["since_ns"].to_numpy()), time_unit(occ["spread_ns"].to_numpy())
    traces = []
    for i, ((k, b), g) in enumerate(occ.groupby(["kernel", "barrier"], observed=True, sort=True)):
        lab = [f"iteration {it}, last: {who(r, bl, w)}"
               for it, r, bl, w in zip(g["iteration"], g["last_rank"], g["last_block"], g["last_warp"])]
        traces.append(dict(
            type="scatter", mode="markers", name=f"{k}/{b}", x=ux.of(g["since_ns"].to_numpy()),
            y=uy.of(g["spread_ns"].to_numpy()), text=lab,
            marker=dict(color=_PALETTE[i % len(_PALETTE)], size=np.clip(4 + np.sqrt(g["arrivals"].to_numpy()), 4, 16).tolist(),
                        line=dict(width=0), opacity=0.85),
            hovertemplate=f"%{{text}}<br>first arrival %{{x:.4g}} {ux.name} into the iteration<br>spread "
                          f"%{{y:.3g}} {uy.name}<extra>{k}/{b}</extra>"))
    return dict(data=traces, layout=theme.figure_layout(
        height=320, xaxis=dict(title=dict(text=axis_title("first arrival, since the iteration's first barrier arrival",
                                                          ux)), gridcolor=theme.GRID),
        yaxis=dict(title=dict(text=axis_title("first → last arrival", uy)), gridcolor=theme.GRID, rangemode="tozero")))


def wait_by_arriver_figure(report) -> dict:
    """Total wait caused per last arriver: who holds everyone up."""
    occ = report.occurrences
    if occ.empty:
        return dict(data=[], layout=theme.figure_layout(height=200))
    key = [who(r, b, w) for r, b, w in zip(occ["last_rank"], occ["last_block"], occ["last_warp"])]
    s = pd.Series(occ["total_wait_ns"].to_numpy(float), index=key).groupby(level=0).sum().sort_values().tail(20)
    unit = time_unit(s.to_numpy())
    # total_wait_ns is each waiting warp's own wait, summed over the warps (barriers: "wait (sum over
    # warps)"): warp time, larger than the wall time when many warps wait at once
    return dict(data=[dict(type="bar", orientation="h", x=unit.of(s.to_numpy()), y=list(s.index),
                           marker=dict(color=theme.PHASE_COLOURS["barrier"]),
                           hovertemplate=f"%{{y}}: %{{x:.3g}} {unit.name} of warp time spent waiting, summed "
                                         "over warps<extra></extra>")],
                layout=theme.figure_layout(height=int(min(420, 90 + 22 * len(s))), margin=dict(l=170, r=16, t=30, b=36),
                                           xaxis=dict(title=dict(text=axis_title("wait caused as last arriver", unit,
                                                                                 "summed over warps")),
                                                      gridcolor=theme.GRID)))
