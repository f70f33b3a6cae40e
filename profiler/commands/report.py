"""A text summary of a run: what ran, where the time went per phase and rank, what was lost.

Shares are "% of warp time": a phase's summed span time over the summed active time (first to
last record) of the warps of that kernel on that rank, so a phase that keeps every warp busy all
kernel long reads 100% however many warps there are. Nested phases count in their parent too.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from ..analysis import late_entry as LE
from ..analysis import stored, summary
from ..analysis.run_tables import KINDS, RunTables
from ..analysis.timemodel import TimeModel
from ..analysis.verdict import fmt_ns
from ..store.runstore import Run, load_run
from ..torchtrace.report import with_steps

PER_RANK_ROWS_MAX_RANKS = 4  # above this many ranks, one row per phase names the slowest rank


def _us(ns) -> str:
    return f"{ns / 1e3:,.1f}"


def _table(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    cells = [[str(c) for c in cols]] + [[str(v) for v in row] for row in df.itertuples(index=False)]
    w = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    num = [c not in ("kernel", "phase") for c in cols]  # names left, numbers right
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join((v.rjust(w[i]) if num[i] and j else v.ljust(w[i])) for i, v in enumerate(r)).rstrip())
        if j == 0:
            out.append("  ".join("-" * x for x in w))
    return out


def _header(run: Run) -> list[str]:
    m = run.manifest
    git = m.get("git") or {}
    gpu = m.get("gpu") or {}
    wl = m.get("workload") or {}
    lines = [f"run {run.name}  ({run.path})"]
    if m.get("description"):
        lines.append(f"  {m['description']}")
    bits = []
    if git:
        commit = str(git.get("commit") or "")[:10]
        bits.append(f"git {git.get('branch') or '?'}{'@' + commit if commit else ''}{' (dirty)' if git.get('dirty') else ''}")
    if gpu:
        bits.append(f"{gpu.get('count', '?')} x {gpu.get('name', '?')}")
    if wl:
        bits.append(f"workload {wl.get('kind', '?')}")
    if m.get("created"):
        bits.append(f"created {m['created']}")
    if bits:
        lines.append("  " + ", ".join(bits))
    if run.status != "ok":   # e.g. a timed-out recording: say so before any number
        lines.append(f"STATUS: {run.status.upper()}" + (f" -- {str(m['error'])[:300]}" if m.get("error") else ""))
    return lines


def _clock(run: Run) -> list[str]:
    c = run.manifest.get("clock") or {}
    ranks = c.get("ranks") or []
    if not c:
        return ["clock: no calibration in the manifest (times are per-rank globaltimer)"]
    worst = max(ranks, key=lambda r: r.get("uncertainty_ns", 0), default=None)
    s = f"clock: {c.get('source', 'globaltimer')}, step {c.get('step_ns', '?')} ns"
    if worst is not None:
        s += f", rank alignment ±{worst.get('uncertainty_ns', 0):.0f} ns (worst: rank {worst.get('rank')})"
        drifts = [abs(r.get("drift_ppm", 0.0)) for r in ranks]
        if any(drifts):
            s += f", drift up to {max(drifts):.1f} ppm"
    h = c.get("host") or {}
    if "uncertainty_ns" in h:
        s += f", host ±{h['uncertainty_ns'] / 1e3:.1f} us"
    return [s]


def _losses(run: Run) -> list[str]:
    la = run.launches
    total = int(la["dropped"].sum()) if len(la) else int((run.manifest.get("drops") or {}).get("total", 0))
    lines = []
    if total:
        per = la.groupby("rank")["dropped"].sum()
        worst = la.loc[la["dropped"].idxmax()]
        lines.append(f"DROPPED RECORDS: {total:,} (per rank: " + ", ".join(f"{r}: {int(v):,}" for r, v in per.items())
                     + f"; worst launch: rank {int(worst['rank'])} launch {int(worst['launch'])} {worst['kernel']}"
                     " -- raise the region capacity)")
    else:
        lines.append("dropped records: 0")
    for w in run.manifest.get("warnings") or []:
        if w.get("type") != "DroppedRecords" and w.get("count"):
            lines.append(f"warning {w['type']}: {w['count']:,}" + (f" ({w['detail'][:160]})" if w.get("detail") else ""))
    return lines


def _kernels(t: RunTables) -> list[str]:
    if not len(t.kernels):
        return []
    rows = []
    for k in t.kernels.itertuples(index=False):
        med = t.kernel_ranks[t.kernel_ranks["kernel"] == k.kernel].set_index("rank")["median_ns"]
        slow = int(med.idxmax())
        spread = med.max() / med.min() if med.min() > 0 else float("nan")
        row = {"kernel": str(k.kernel), "launches": int(k.launches), "median us": _us(k.median_ns),
               "per rank median us": " ".join(_us(v) for v in med.to_numpy()),
               "slowest rank": slow, "slowest/fastest": f"{spread:.2f}x" if np.isfinite(spread) else "-"}
        if not np.isnan(k.host_start_ns):  # host call start -> first warp start: large values mean the host paces the GPU
            row["host->GPU start us"] = _us(k.host_start_ns)
        rows.append(row)
    return ["", "kernels (GPU time per launch: first warp start to last warp finish; medians)",
            *_table(pd.DataFrame(rows).fillna("-"))]


def _time_model(tm: TimeModel) -> list[str]:
    """Per kernel, medians over its op occurrences: entry skew (first rank's first warp to the
    last rank's), op latency after entry (the last rank's entry to the last warp end), who entered
    last and from which side (profiler.analysis.timemodel: the numbers every page reads)."""
    ops = tm.ops
    if ops.empty:
        return []
    rows = []
    for k, o in ops.groupby("kernel", sort=False):
        late = o[o["late_rank"] >= 0]
        top = late.groupby(["late_rank", "late_cause"])["late_wait_ns"].sum().sort_values() if len(late) else None
        who = (f"rank {int(top.index[-1][0])} ({top.index[-1][1]})" if top is not None and len(top) and top.iloc[-1] > 0
               else "-")
        rows.append({"kernel": str(k), "occurrences": len(o), "entry skew us": _us(o["entry_skew_ns"].median()),
                     "op latency after entry us": _us(o["op_latency_ns"].median()) if o["op_latency_ns"].notna().any() else "-",
                     "late-entry wait us (median per occurrence)": _us(o["late_wait_ns"].median()), "late entry (side)": who,
                     "unfinished": int(o["unfinished"].sum())})
    return ["", "time model per kernel (medians over op occurrences; wall time, not summed over warps)",
            *_table(pd.DataFrame(rows))]


def verdict_lines(page: str, v) -> list[str]:
    """A page's verdict as the viewer's box states it, word for word: the headline, then its facts,
    further findings (notes) and warnings, one line each."""
    out = [f"  {page}: {'ALARM ' if v.alarm else ''}{v.headline}"]
    out += [f"    - {f}" for f in v.facts]
    out += [f"    note: {n}" for n in v.notes]
    out += [f"    warning: {w}" for w in v.warnings]
    return out


def _verdicts(run: Run, res, le) -> list[str]:
    """The pages' verdicts as the analyses stored them (stored.Stored), or as computed for a run
    without current stored results (chunked.Results), printed whole; with the op before a late
    entry named from the run's PyTorch traces, as the pages name it (torchtrace.report.with_steps)."""
    out = ["", "verdicts (what the viewer's pages say, word for word)"]
    vs = {"critical path": res.critical.verdict, "idle warps": res.idle.verdict, "barriers": res.barriers.verdict}
    for page, v in with_steps(run, res.time_model, vs, le).items():
        out += verdict_lines(page, v)
    return out


def _late_entry(le, tm: TimeModel, totals: pd.DataFrame) -> list[str]:
    """Per rank, the late-entry decision's quantities (profiler.analysis.late_entry: the numbers
    every page states), means per iteration."""
    if le is None:
        return []
    its = totals["iteration"].to_numpy()
    waited, own = LE.per_rank_waits(tm, its)
    rows = [{"rank": int(r), f"{LE.LATE_WAIT} us": _us(waited[r].mean()), "its own wait for the others us": _us(own[r].mean()),
             f"{LE.NET_WAIT} us": _us((waited[r] - own[r]).mean()),
             "late in iterations": f"{le.late_in.get(int(r), 0)} of {len(its)}"} for r in waited.columns]
    return ["", f"late entry per rank (means per iteration over {len(its)} iterations; the decision: {le.decision.band}, "
                f"rank {le.rank}, {le.side} side)", *_table(pd.DataFrame(rows))]


def _unfinished(t: RunTables) -> list[str]:
    """The spans no kernel ended (a timed-out wait), as the pages draw them: until the kernel stopped."""
    if not len(t.unfinished):
        return []
    w = t.unfinished.iloc[0]
    return [f"OPEN SPANS: {int(w['count']):,} (unfinished: a kernel aborted or ENDs were dropped; as on every page they end "
            f"where their kernel stopped); longest: rank {int(w['rank'])} "
            f"{w['kernel']}/{w['phase']} {fmt_ns(float(w['duration_ns']))} (block {int(w['block'])} warp {int(w['warp'])}, "
            f"unfinished)"]


def _phases(t: RunTables) -> list[str]:
    if t.events - t.kind_count("host") == 0:
        return []
    g = t.phases
    if not len(g):
        return ["", "no spans recorded"]
    nranks = g["rank"].nunique()
    order = g.groupby(["kernel", "phase"], observed=True)["sum"].transform("sum")
    # kernels and phases in the event table's category order (its *_order columns)
    g = g.assign(order=order).sort_values(["kernel_order", "order", "phase_order", "rank"],
                                          ascending=[True, False, True, True])
    if nranks <= PER_RANK_ROWS_MAX_RANKS:
        t = pd.DataFrame({"kernel": g["kernel"].astype(str), "phase": g["phase"].astype(str), "rank": g["rank"],
                          "spans": g["count"], "total us": g["sum"].map(_us), "median us": g["median"].map(_us),
                          "max us": g["max"].map(_us), "% warp time": (100 * g["share"]).map(lambda v: f"{v:.1f}")})
    else:
        rows = []
        for (k, p), h in g.groupby(["kernel", "phase"], sort=False):
            s = h.loc[h["sum"].idxmax()]
            rows.append({"kernel": str(k), "phase": str(p), "spans": int(h["count"].sum()), "total us": _us(h["sum"].sum()),
                         "median us (rank median)": _us(h["median"].median()),
                         "% warp time (mean)": f"{100 * h['share'].mean():.1f}",
                         "slowest rank": int(s["rank"]), "its total us": _us(s["sum"])})
        t = pd.DataFrame(rows)
    return ["", "phases (span time summed over warps; nested phases also count in their parent)", *_table(t)]


def _results(run: Run, step: Callable[[str], None]):
    """The run's analyses: stored (RUN/analysis/, current for its data and this analysis version),
    else computed chunk by chunk as `epscope analyze` computes them (memory bounded by a chunk),
    not stored."""
    got = stored.load(run.path)
    if got is not None:
        step("reading the stored analyses")
        return got
    step(f"analysing {run.num_events:,} events (no current stored analyses: `epscope analyze RUN` stores them)")
    return summary.analyze(run)


def report(run, step: Callable[[str], None] | None = None) -> str:
    """Text summary of a run (a Run or a run directory). step(label), if given, hears which part
    is being computed (the CLI shows it as progress). Reads the run's stored analyses when they are
    current, else computes them (profiler.analysis.chunked); never reads the whole event table."""
    step = step or (lambda label: None)
    run = run if isinstance(run, Run) else load_run(run)
    res = _results(run, step)
    t = res.run_tables
    step("summarising")
    ranks = sorted(set(int(r) for r in res.ranks) | set(run.launches["rank"].unique().tolist()))
    lines = _header(run)
    lines.append(f"events: {t.events:,} ({', '.join(f'{t.kind_count(k):,} {k}' for k in KINDS if t.kind_count(k))}); "
                 f"launches: {len(run.launches):,}; ranks: {', '.join(map(str, ranks))}")
    lines += _unfinished(t)
    lines += _clock(run) + _losses(run) + _kernels(t)
    lines += _time_model(res.time_model)
    totals = res.critical.total_ns
    le = LE.from_time_model(res.time_model, totals)
    lines += _late_entry(le, res.time_model, totals)
    lines += _phases(t)
    step("verdicts")
    lines += _verdicts(run, res, le)
    step("PyTorch traces")
    from ..torchtrace.report import torch_lines   # the op inside the step (issue 30): its own section
    lines += torch_lines(run, res.time_model)
    return "\n".join(lines) + "\n"
