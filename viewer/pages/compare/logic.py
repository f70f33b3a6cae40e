"""Compare page: samples for the distribution plots and the figure; the statistics themselves
come from profiler.analysis.compare."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profiler.analysis import stats as S
from profiler.analysis.compare import E2E, relative_shown
from profiler.torchtrace.report import NONE_NAMED, sides_differ

from ... import theme
from ...format import in_unit, ns, pct, time_unit, times

SIDE_COLOURS = {"A": "#4aa3ff", "B": "#ff9f43"}


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
            label = (f"{k}/{p}" if p else f"{k} (op latency after entry)") if k else p
            xs += [label] * len(v)
            ys += (v / med if med else v).tolist()
            texts += [ns(x) for x in v]
        traces.append(dict(type="box", name=side, x=xs, y=ys, text=texts, boxpoints="all", jitter=0.4,
                           pointpos=0, marker=dict(color=SIDE_COLOURS[side], size=4, opacity=0.7),
                           line=dict(color=SIDE_COLOURS[side], width=1.5), offsetgroup=side,
                           hovertemplate="%{x}<br>%{text} (%{y:.3f}× A's median)<extra>" + side + "</extra>"))
    return dict(data=traces, layout=theme.figure_layout(
        boxmode="group", height=360, margin=dict(l=60, r=16, t=30, b=90),
        yaxis=dict(title=dict(text="per-iteration value / median of A"), gridcolor=theme.GRID),
        xaxis=dict(tickangle=-30, gridcolor=theme.GRID)))


def plot_phases(where, per_phase: pd.DataFrame, limit: int = 10) -> list[tuple[str, str]]:
    """The rows that decided: end-to-end first, then the rows the verdict called (its `where`, in
    its order: what it leads with, what moved with it, the rest); when it called none, the kernels'
    op latency rows (what the verdict read as within noise). Never the largest |B - A %| rows,
    which are the noisiest (entry skew, host calls; issue 29)."""
    out = [("", E2E)]
    called = [(str(k), str(p or "")) for k, p in where if (k, p or "") != ("", E2E)]
    if not called and not per_phase.empty:
        kern = per_phase[(per_phase["phase"] == "") & per_phase["n_a"].gt(0) & per_phase["n_b"].gt(0)]
        called = [(str(k), "") for k in kern["kernel"]]
    for kp in called:
        if kp not in out:
            out.append(kp)
    return out[:limit]


def phase_table(per_phase: pd.DataFrame, op_ns) -> pd.DataFrame:
    """per_phase as the table shows it: B − A % blank ("—") where A's median is a near-zero base
    (compare.relative_shown: a percentage of it reads huge while the op hardly moves; B − A
    states the change in time)."""
    t = per_phase.copy()
    if len(t):
        near = [not relative_shown(b, op_ns) for b in t["median_a_ns"]]
        t.loc[near, "diff_pct"] = float("nan")
    return t


def runs_needed(v) -> str:
    """A row's runs needed for a 10 % MDE: '' when enough already, 'more than 100' past the search."""
    if v != v or int(v) <= 0:
        return ""
    return f"more than {S.MAX_RUNS_NEEDED}" if int(v) > S.MAX_RUNS_NEEDED else str(int(v))


@dataclass(frozen=True)
class Cards:
    """The end-to-end row's cards as the page shows them, each in one unit."""
    median_a: str
    median_b: str
    diff: str
    ci: str
    spread: str
    mde: str
    mde_sub: str


def cards(e2e: dict) -> Cards:
    g = e2e.get
    ab = time_unit(g("median_a_ns"), g("median_b_ns"))       # both sides in one unit, to compare by eye
    diff = g("diff_ns")
    mde, med = g("mde_ns"), g("median_a_ns")
    return Cards(
        median_a=f"{in_unit(g('median_a_ns'), ab)} {ab.name}", median_b=f"{in_unit(g('median_b_ns'), ab)} {ab.name}",
        diff=f"{times(diff, signed=True)} ({pct(g('diff_pct'), 1, True)})",
        ci=times(g("ci_low_ns"), g("ci_high_ns"), signed=True), spread=times(g("noise_ns")), mde=times(mde),
        mde_sub=(f"{pct(100 * mde / med, 1)} of A's median, {100 * S.POWER:.0f}% power under the rule that decides"
                 if mde == mde and mde is not None and med else "one run a side: unknown"))


def warmup_table(warm: pd.DataFrame | None) -> pd.DataFrame:
    """The iterations set aside as warm-up, as the page lists them."""
    if warm is None or warm.empty:
        return pd.DataFrame(columns=["side", "name", "iteration", "value_ns", "rest_median_ns", "excess_pct"])
    return warm[["side", "name", "iteration", "value_ns", "rest_median_ns", "excess_pct"]].reset_index(drop=True)


def sides_ok(a: list | None, b: list | None) -> str | None:
    """A message when the selection cannot be compared, else None."""
    if not a or not b:
        return "Pick at least one run for A and one for B."
    if set(a) & set(b):
        return "A run cannot be on both sides; each side is one group of runs."
    return None


@dataclass(frozen=True)
class BeforeEntryView:
    """The 'Before entry' list under the verdict: per side ('A', 'B') one line per run, the sentence
    every page states (profiler.torchtrace.report.BeforeEntry.sentence) or 'none named'; differ:
    profiler.torchtrace.report.sides_differ's line, None when the sides name the same ops."""
    sides: dict
    differ: str | None


def before_entry_view(a: list[tuple[str, object]], b: list[tuple[str, object]]) -> BeforeEntryView | None:
    """a, b: (run name, its BeforeEntry or None) per run of each side; None (nothing to show) when
    no run names an op (no PyTorch traces, or no late entry on them)."""
    if all(x is None for _, x in a + b):
        return None
    lines = {side: [f"{name}: {x.sentence if x is not None else NONE_NAMED}" for name, x in runs]
             for side, runs in (("A", a), ("B", b))}
    return BeforeEntryView(sides=lines, differ=sides_differ([x for _, x in a], [x for _, x in b]))
