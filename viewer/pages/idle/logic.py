"""Idle warps page: busy share per rank × block × warp as a heatmap, the analysis' verdict."""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis.idle import RANK_IMBALANCE_RATIO  # noqa: F401 (the table's row colour)
from profiler.groundtruth.expect import Cause

from ... import theme
from ...format import time_unit

# busy share 0 -> the idle colour, 1 -> the work colour; a warp that did nothing stands out
COLORSCALE = [[0.0, "#3a1d24"], [0.001, "#7a2f3a"], [0.25, "#b5533c"], [0.5, "#c9a227"],
              [0.75, "#5fb36b"], [1.0, "#3ecf8e"]]


def working_kernels(per_warp: pd.DataFrame) -> pd.DataFrame:
    """per_warp restricted to kernels in which some warp did work: a kernel that only records
    barriers (no spans of work at all) has no warps to starve."""
    if per_warp.empty:
        return per_warp
    any_work = per_warp.groupby("kernel", observed=True)["did_work"].transform("any")
    return per_warp[any_work.to_numpy(bool)]


def kernels(report) -> list[str]:
    """Kernels for the heatmap picker: those with work first, lowest median busy share first
    (where starvation shows), then kernels without any work."""
    pw = report.per_warp
    if pw.empty:
        return []
    g = pw.groupby("kernel", observed=True)
    order = pd.DataFrame({"work": g["did_work"].any(), "med": g["busy_share"].median()})
    order = order.sort_values(["work", "med"], ascending=[False, True])
    out = [str(k) for k in order.index]
    # the kernel the verdict names is drawn first
    v = getattr(report, "verdict", None)
    if v is not None and v.kernel in out:
        out.remove(v.kernel)
        out.insert(0, v.kernel)
    return out


def heatmap_figure(report, kernel: str | None) -> dict:
    pw = report.per_warp
    if kernel is not None:
        pw = pw[pw["kernel"].astype(str) == str(kernel)]
    if pw.empty:
        return dict(data=[], layout=theme.figure_layout(height=200, title=dict(text="no warps")))
    rows = pw[["rank", "block"]].drop_duplicates().sort_values(["rank", "block"]).reset_index(drop=True)
    row_of = {(int(r), int(b)): i for i, (r, b) in enumerate(zip(rows["rank"], rows["block"]))}
    warps = np.sort(pw["warp"].unique())
    col_of = {int(w): j for j, w in enumerate(warps)}
    z = np.full((len(rows), len(warps)), np.nan)
    busy = np.full_like(z, np.nan)
    ri = np.array([row_of[(int(r), int(b))] for r, b in zip(pw["rank"], pw["block"])])
    ci = np.array([col_of[int(w)] for w in pw["warp"]])
    z[ri, ci] = pw["busy_share"].to_numpy(float)
    unit = time_unit(pw["busy_ns"].to_numpy(float))
    busy[ri, ci] = pw["busy_ns"].to_numpy(float) / unit.ns
    labels = [f"r{r} b{b}" for r, b in zip(rows["rank"], rows["block"])]
    zl = z.astype(object)
    zl[np.isnan(z)] = None
    custom = np.dstack([np.broadcast_to(np.asarray(labels, dtype=object)[:, None], z.shape),
                        np.where(np.isnan(busy), 0, np.round(busy, 3))]).tolist()
    n = len(rows)
    tick_step = max(1, n // 40)
    return dict(data=[dict(
        type="heatmap", z=zl.tolist(), x=[int(w) for w in warps], y=list(range(n)), zmin=0, zmax=1,
        colorscale=COLORSCALE, xgap=1, ygap=1 if n < 200 else 0, customdata=custom,
        colorbar=dict(title=dict(text="busy share"), thickness=10, tickformat=".0%"),
        hovertemplate=f"%{{customdata[0]}} w%{{x}}<br>busy %{{z:.1%}} (%{{customdata[1]:.3g}} {unit.name}, summed "
                      "over launches)<extra></extra>",
    )], layout=theme.figure_layout(
        height=int(min(900, max(260, 14 * n + 90))), margin=dict(l=80, r=16, t=30, b=40),
        xaxis=dict(title=dict(text="warp"), dtick=1 if len(warps) <= 48 else None, gridcolor=theme.GRID),
        yaxis=dict(tickmode="array", tickvals=list(range(0, n, tick_step)), ticktext=labels[::tick_step],
                   autorange="reversed", gridcolor=theme.GRID),
        title=dict(text=f"busy share per warp · {kernel}" if kernel else "busy share per warp", font=dict(size=11))))


def headline(report) -> dict:
    """Counts over the kernels that record work (see working_kernels)."""
    pw = working_kernels(report.per_warp)
    if pw.empty:
        return {"warps": 0, "idle_warps": 0, "blocks": 0, "idle_blocks": 0, "worst_ratio": float("nan")}
    pb = report.per_block
    if len(pb):
        pb = pb[pb["kernel"].isin(set(pw["kernel"]))]
    imb = report.imbalance["ratio"].replace([np.inf], np.nan) if len(report.imbalance) else pd.Series(dtype=float)
    inf = bool(np.isinf(report.imbalance["ratio"]).any()) if len(report.imbalance) else False
    return {
        "warps": int(len(pw)),
        "idle_warps": int((~pw["did_work"]).sum()),
        "blocks": int(len(pb)),
        "idle_blocks": int((~pb["did_work"]).sum()) if len(pb) else 0,
        "worst_ratio": float("inf") if inf else (float(imb.max()) if imb.notna().any() else float("nan")),
    }


def imbalance_first(report) -> bool:
    """Cross-rank imbalance leads the page when it is the verdict (the largest effect)."""
    return report.verdict is not None and report.verdict.cause is Cause.RANK_IMBALANCE


def ranks_table(report) -> pd.DataFrame:
    """The across-ranks table, the most unequal (kernel, role) first."""
    r = report.ranks
    if r.empty:
        return r
    spread = r.groupby(["kernel", "role"])["busy_ratio"].transform(lambda x: x.replace([np.inf], np.nan).max())
    return (r.assign(_s=spread.fillna(0)).sort_values(["_s", "kernel", "role", "rank"], ascending=[False, True, True, True])
            .drop(columns="_s").reset_index(drop=True))


def evidence(report) -> pd.DataFrame:
    ev = report.evidence
    if ev.empty or "did_work" not in ev:
        return ev
    return ev.sort_values(["did_work", "busy_ns", "rank", "block", "warp"])


def evidence_columns(report, warp_cols: dict, rank_cols: dict) -> dict:
    """The evidence holds warps (starvation, timeout) or ranks (imbalance): its columns."""
    return rank_cols if "busy_ratio" in report.evidence.columns else warp_cols
