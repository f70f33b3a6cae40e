"""Compare page: samples for the distribution plots and the figure; the statistics themselves
come from profiler.analysis.compare."""
from __future__ import annotations

import pandas as pd

from ... import theme

SIDE_COLOURS = {"A": "#4aa3ff", "B": "#ff9f43"}
VERDICT_TONE = {"within noise": "", "faster": "good", "slower": "bad", "only in A": "muted", "only in B": "muted"}


def side_samples(samples: pd.DataFrame, side: str) -> pd.DataFrame:
    """One side's samples of a Comparison (profiler.analysis.compare.samples), without the per-rank
    end-to-end rows, for the distribution plot."""
    s = samples[(samples["side"] == side) & ~samples["phase"].str.startswith("rank ")]
    return s[["run", "iteration", "kernel", "phase", "value_ns"]].reset_index(drop=True)


def distribution_figure(a: pd.DataFrame, b: pd.DataFrame, phases: list[tuple[str, str]]) -> dict:
    """Box plots of A and B per (kernel, phase), values normalised to A's median so phases of
    very different lengths share one axis."""
    traces = []
    for side, df in (("A", a), ("B", b)):
        xs, ys, texts = [], [], []
        for k, p in phases:
            ref = a[(a["kernel"] == k) & (a["phase"] == p)]["value_ns"]
            if ref.empty:
                ref = b[(b["kernel"] == k) & (b["phase"] == p)]["value_ns"]
            med = float(ref.median()) if len(ref) else 1.0
            v = df[(df["kernel"] == k) & (df["phase"] == p)]["value_ns"].to_numpy(float)
            label = (f"{k}/{p}" if p else f"{k} (kernel time)") if k else p
            xs += [label] * len(v)
            ys += (v / med if med else v).tolist()
            texts += [f"{x / 1e3:.3f} µs" for x in v]
        traces.append(dict(type="box", name=side, x=xs, y=ys, text=texts, boxpoints="all", jitter=0.4,
                           pointpos=0, marker=dict(color=SIDE_COLOURS[side], size=4, opacity=0.7),
                           line=dict(color=SIDE_COLOURS[side], width=1.5), offsetgroup=side,
                           hovertemplate="%{x}<br>%{text} (%{y:.3f}× A's median)<extra>" + side + "</extra>"))
    return dict(data=traces, layout=theme.figure_layout(
        boxmode="group", height=360, margin=dict(l=60, r=16, t=30, b=90),
        yaxis=dict(title=dict(text="per-iteration value / median of A"), gridcolor=theme.GRID),
        xaxis=dict(tickangle=-30, gridcolor=theme.GRID)))


def plot_phases(per_phase: pd.DataFrame, limit: int = 10) -> list[tuple[str, str]]:
    """End-to-end first, then the phases with the largest absolute relative difference."""
    out = [("", "end-to-end")]
    if per_phase.empty:
        return out
    pp = per_phase[per_phase["n_a"].gt(0) & per_phase["n_b"].gt(0)].copy()
    pp["mag"] = pp["diff_pct"].abs()
    for k, p in pp.sort_values("mag", ascending=False)[["kernel", "phase"]].head(limit - 1).itertuples(index=False):
        out.append((str(k), str(p)))
    return out


def sides_ok(a: list | None, b: list | None) -> str | None:
    """A message when the selection cannot be compared, else None."""
    if not a or not b:
        return "Pick at least one run for A and one for B."
    if set(a) & set(b):
        return "A run cannot be on both sides; each side is one group of runs."
    return None
