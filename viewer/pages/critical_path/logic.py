"""Critical path page: the analysis' segments and slack as tables and figures; what-if text."""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis.stored import span_phases

from ... import theme
from ...format import axis_title, ns, pct, signed_ns, time_unit

KIND_COLOURS = {"work": "#4aa3ff", "wait": "#ff6b6b", "barrier": "#c77dff", "gap": "#5c6b7a",
                "launch": "#ffd166", "host": "#8d99ae"}


def headline(cp) -> dict:
    tot = cp.total_ns
    total = int(tot["total_ns"].sum()) if len(tot) else 0
    seg = cp.segments
    waits = int(seg.loc[seg["kind"].isin(["wait", "barrier"]), "duration_ns"].sum()) if len(seg) else 0
    return {
        "iterations": int(len(tot)),
        "total_ns": total,
        "median_iteration_ns": float(tot["total_ns"].median()) if len(tot) else float("nan"),
        "pacing_rank": int(cp.pacing_rank),
        "wait_share": waits / total if total else 0.0,
        "segments": int(len(seg)),
        "warps_on_path": int(cp.slack["on_path"].sum()) if len(cp.slack) else 0,
        "unfinished_ns": int(seg.loc[seg["unfinished"], "duration_ns"].sum()) if len(seg) else 0,
    }


def median_label(h: dict) -> str:
    """The median iteration card's label: a median states its n."""
    return f"median iteration (n = {h['iterations']})"


def largest_segments(cp, n: int = 3) -> str:
    """The path's largest (rank, phase or kind) totals, summed over iterations, for the page's info line."""
    seg = cp.segments
    if seg.empty:
        return ""
    top = (seg.groupby(["rank", "phase", "kind"], observed=True)["duration_ns"].sum()
           .sort_values(ascending=False).head(n))
    return "Largest on the path (summed over iterations): " + ", ".join(
        f"rank {r} {p or k} {ns(d)}" for (r, p, k), d in top.items()) + "."


def path_by_rank_figure(cp) -> dict:
    p = cp.path_ns.groupby(["rank", "kind"], observed=True)["duration_ns"].sum().reset_index()
    unit = time_unit(p.groupby("rank")["duration_ns"].sum().to_numpy() if len(p) else [])
    traces = []
    for kind in [k for k in KIND_COLOURS if k in set(p["kind"])]:
        s = p[p["kind"] == kind]
        traces.append(dict(type="bar", orientation="h", name=kind, y=[f"rank {r}" for r in s["rank"]],
                           x=unit.of(s["duration_ns"].to_numpy()), marker=dict(color=KIND_COLOURS[kind]),
                           hovertemplate=f"{kind}: %{{x:.3g}} {unit.name}<extra>%{{y}}</extra>"))
    n = max(p["rank"].nunique(), 1)
    return dict(data=traces, layout=theme.figure_layout(
        barmode="stack", height=int(min(420, 80 + 26 * n)), margin=dict(l=70, r=16, t=30, b=36),
        xaxis=dict(title=dict(text=axis_title("time on the critical path", unit, "summed over iterations")),
                   gridcolor=theme.GRID),
        yaxis=dict(autorange="reversed", gridcolor=theme.GRID)))


def iteration_starts(seg: pd.DataFrame) -> pd.Series:
    """Each iteration's start: its first path segment's begin (the segments tile the iteration)."""
    return seg.groupby("iteration")["begin_ns"].min()


def path_gantt_figure(cp, iteration=None, limit: int = 600) -> dict:
    """The path of one iteration as a staircase of segments (rank/warp lanes on y), in time since
    the iteration began (its position in the run says nothing: issue 29's '25,151,000 µs')."""
    seg = cp.segments
    if seg.empty:
        return dict(data=[], layout=theme.figure_layout(height=200))
    it = seg["iteration"].iloc[0] if iteration is None else iteration
    s = seg[seg["iteration"] == it]
    t0 = float(s["begin_ns"].min())
    unit = time_unit(float((s["begin_ns"] + s["duration_ns"]).max()) - t0)
    if len(s) > limit:
        s = s.nlargest(limit, "duration_ns").sort_values("begin_ns")
    lane = [f"r{r} b{b} w{w}" if b >= 0 else f"r{r} host" for r, b, w in zip(s["rank"], s["block"], s["warp"])]
    traces = []
    for phase in pd.unique(s["phase"].astype(str)):
        m = (s["phase"].astype(str) == phase).to_numpy()
        ss = s[m]
        name = phase or "(gap)"
        colour = theme.phase_colour(phase) if phase else KIND_COLOURS["gap"]
        traces.append(dict(type="bar", orientation="h", name=name, y=[l for l, k in zip(lane, m) if k],
                           base=unit.of(ss["begin_ns"].to_numpy() - t0),
                           x=unit.of(np.maximum(ss["duration_ns"].to_numpy(float), 1.0)),
                           marker=dict(color=colour),
                           customdata=np.stack([ss["kind"].astype(str), ss["share"] * 100], 1).tolist(),
                           hovertemplate=f"{name} (%{{customdata[0]}})<br>%{{base:.4g}} {unit.name} + "
                                         f"%{{x:.3g}} {unit.name}<br>%{{customdata[1]:.1f}}% of the iteration"
                                         "<extra>%{y}</extra>"))
    n = len(set(lane))
    return dict(data=traces, layout=theme.figure_layout(
        barmode="overlay", height=int(min(520, 90 + 20 * n)), margin=dict(l=110, r=16, t=30, b=36),
        xaxis=dict(title=dict(text=axis_title(f"iteration {it}: time since it began", unit)), gridcolor=theme.GRID),
        yaxis=dict(type="category", categoryorder="category ascending", gridcolor=theme.GRID)))


def segments_table(cp, limit: int = 200) -> pd.DataFrame:
    """The longest segments; begin_ns from the segment's iteration's start (iteration_starts)."""
    seg = cp.segments
    cols = ["iteration", "rank", "kernel", "block", "warp", "role", "phase", "kind", "begin_ns", "duration_ns", "share",
            "peer", "unfinished"]
    out = seg.sort_values("duration_ns", ascending=False, kind="stable").head(limit)[cols].copy()
    if len(out):
        out["begin_ns"] = out["begin_ns"] - out["iteration"].map(iteration_starts(seg)).to_numpy()
    return out


def slack_table(cp, limit: int = 100) -> pd.DataFrame:
    s = cp.slack
    if s.empty:
        return s
    agg = (s.groupby(["rank", "kernel", "block", "warp", "role"], observed=True)
           .agg(busy_ns=("busy_ns", "sum"), slack_ns=("slack_ns", "min"), on_path=("on_path", "any"))
           .reset_index())
    return agg.sort_values(["on_path", "slack_ns"], ascending=[False, False]).head(limit)


def phase_options(events: pd.DataFrame) -> list[str]:
    """Names of the span phases of a run (profiler.analysis.stored.span_phases: what stored results hold)."""
    return span_phases(events)


def what_if_sentence(summary: pd.DataFrame, phase: str, rank, percent: float) -> str:
    """The what-if's answer per iteration (means over its iterations, as the table beside it and the
    idle page's what-if fact state them)."""
    where = "every rank" if rank is None else f"rank {rank}"
    if summary.empty:
        return f"No iteration contains {phase} on {where}."
    n = len(summary)
    before = float(summary["before_ns"].mean())
    change = float(summary["change_ns"].mean())
    saving = float(summary["local_saving_ns"].mean())
    verb = "faster" if percent >= 0 else "slower"
    op_b = float(summary["op_before_ns"].mean()) if "op_before_ns" in summary else float("nan")
    op_c = float(summary["op_change_ns"].mean()) if "op_change_ns" in summary else float("nan")
    op = (f"the op latency after entry {signed_ns(op_c)} ({pct(100 * op_c / op_b if op_b else 0, 2, signed=True)}); "
          if op_b == op_b and op_c == op_c else "")
    s = (f"If {phase} on {where} were {abs(percent):g}% {verb}, per iteration (mean over {n} iteration"
         f"{'s' if n != 1 else ''}): {op}the iteration (wall time, host included) {signed_ns(change)} "
         f"({pct(100 * change / before if before else 0, 2, signed=True)}); the phase's own time changes by "
         f"{signed_ns(-saving)}.")
    if saving > 0:
        absorbed = 100 * (1 - (-change) / saving)
        if absorbed > 100:
            s += (f" The whole local saving is absorbed and the projected run ends {signed_ns(change)} later "
                  "than recorded: the re-timed dependencies, not this phase, set the end.")
        else:
            s += f" {pct(max(0.0, absorbed))} of the local saving is absorbed by waits and rendezvous."
    return s


def bound_sentence(bound: pd.DataFrame, phase: str, rank, percent: float) -> str:
    """The what-if's first answer while the exact one is computed (profiler.analysis.whatif.saving_bound)."""
    where = "every rank" if rank is None else f"rank {rank}"
    if bound.empty or not bound["path_phase_ns"].any():
        return (f"{phase} on {where} is not on the critical path: making it faster cannot shorten an iteration "
                "by itself (the exact re-timing follows).")
    return (f"At most {ns(float(bound['max_saving_ns'].sum()))} shorter over {len(bound)} iteration(s) "
            f"(largest {ns(float(bound['max_saving_ns'].max()))}): {phase} on {where} holds "
            f"{ns(float(bound['path_phase_ns'].sum()))} of the critical path, and {abs(percent):g}% of that is "
            "the most it can save; the exact re-timing follows.")
