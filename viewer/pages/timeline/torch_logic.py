"""The step's PyTorch ops beside the warp lanes (issue 30), Dash-free: per rank with a merged
PyTorch trace, its CPU threads (one row per nesting depth of cpu_op / record_function / Python
frames) and CUDA streams (kernels, copies, memsets; the instrumented kernels are the warp lanes'
launches, named by their launch), in the time window the timeline shows, and the sentences naming
the op before each late entry (profiler.torchtrace.blame).

Drawn as one horizontal bar trace per kind, at most LIMIT bars (the longest in the window): the
same time axis (µs of the run timeline) as the warp lanes above it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.torchtrace import kineto as K

LIMIT = 1500
MAX_DEPTH = 6           # CPU nesting depths drawn per thread (deeper ranges go on the last row)
COLOURS = {"cpu": "#4c78a8", "python": "#b8c7dc", "kernel": "#f58518", "epscope": "#e45756", "copy": "#72b7b2"}


def depths(begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each range of one thread (ranges sorted by begin, longer first on ties)."""
    order = np.lexsort((-(end - begin), begin))
    out = np.zeros(len(begin), np.int64)
    stack: list[int] = []
    for i in order.tolist():
        while stack and end[stack[-1]] <= begin[i]:
            stack.pop()
        out[i] = len(stack)
        stack.append(i)
    return out


def rows(merged, t0: float, t1: float, limit: int = LIMIT) -> pd.DataFrame:
    """[row, label, begin_ns, end_ns, name, group] of the bars in [t0, t1] (ns), rows numbered top to
    bottom: per rank, its threads' depths then its streams."""
    out, labels, n = [], [], 0
    for r, rt in sorted(merged.ranks.items()):
        ev = rt.events
        inst = {int(c): int(la) for c, la in zip(rt.joined["correlation"], rt.joined["launch"])}
        host = ev[ev["kind"].isin([K.CPU_OP, K.USER, K.PYTHON])]
        for (pid, tid), g in host.groupby(["pid", "tid"], sort=True):
            d = np.minimum(depths(g["begin_ns"].to_numpy(), g["end_ns"].to_numpy()), MAX_DEPTH - 1)
            for k in range(int(d.max()) + 1 if len(d) else 0):
                s = g[d == k]
                s = s[(s["end_ns"] >= t0) & (s["begin_ns"] <= t1)]
                out.append(pd.DataFrame({"row": n, "begin_ns": s["begin_ns"], "end_ns": s["end_ns"],
                                         "name": s["name"].astype(str),
                                         "group": np.where(s["kind"] == K.PYTHON, "python", "cpu")}))
                labels.append(f"rank {r} · thread {tid}" + (f" · {k}" if k else ""))
                n += 1
        gpu = ev[ev["kind"].isin([K.KERNEL, K.MEMCPY, K.MEMSET])]
        for s_id, s in gpu.groupby("tid", sort=True):
            s = s[(s["end_ns"] >= t0) & (s["begin_ns"] <= t1)]
            launch = s["correlation"].map(inst)
            name = np.where(launch.notna(), "epscope launch " + launch.fillna(-1).astype(int).astype(str) + " · "
                            + s["name"].astype(str), s["name"].astype(str))
            grp = np.where(launch.notna(), "epscope", np.where(s["kind"] == K.KERNEL, "kernel", "copy"))
            out.append(pd.DataFrame({"row": n, "begin_ns": s["begin_ns"], "end_ns": s["end_ns"], "name": name,
                                     "group": grp}))
            labels.append(f"rank {r} · stream {s_id}")
            n += 1
    df = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["row", "begin_ns", "end_ns", "name", "group"])
    if len(df) > limit:
        df = df.assign(d=df["end_ns"] - df["begin_ns"]).nlargest(limit, "d").drop(columns="d")
    df.attrs["labels"] = labels
    return df


def figure(df: pd.DataFrame, t0: float, t1: float) -> dict:
    """The bars (µs on x, as the warp lanes), one trace per group."""
    labels = df.attrs.get("labels", [])
    traces = []
    for grp, colour in COLOURS.items():
        s = df[df["group"] == grp]
        if s.empty:
            continue
        dur = np.maximum((s["end_ns"] - s["begin_ns"]).to_numpy(float), 1.0) / 1e3
        traces.append({"type": "bar", "orientation": "h", "name": grp, "marker": {"color": colour},
                       "base": (s["begin_ns"].to_numpy(float) / 1e3).tolist(), "x": dur.tolist(),
                       "y": s["row"].tolist(), "hovertext": [f"{n} ({d:,.1f} µs)" for n, d in zip(s["name"], dur)],
                       "hoverinfo": "text", "width": 0.8})
    return {"data": traces, "layout": {
        "barmode": "overlay", "height": 60 + 22 * max(len(labels), 1), "margin": {"l": 190, "r": 10, "t": 10, "b": 30},
        "xaxis": {"range": [t0 / 1e3, t1 / 1e3], "title": "µs (run timeline)"},
        "yaxis": {"tickvals": list(range(len(labels))), "ticktext": labels, "autorange": "reversed"},
        "legend": {"orientation": "h"}, "uirevision": "torch"}}


def sentences(blame, limit: int = 8) -> list[str]:
    """The late entries' sentences, longest first, then the longest lead-ins (>= 10 µs)."""
    if blame is None:
        return []
    c = blame.clauses
    late = c[c["scope"] == "late_entry"].sort_values("window_ns", ascending=False).head(limit)
    lead = c[(c["scope"] == "lead_in") & (c["window_ns"] >= 10_000)].sort_values("window_ns", ascending=False)
    return ([f"iteration {r.iteration}: {r.clause}" for r in late.itertuples()]
            + [f"iteration {r.iteration}: {r.clause}" for r in lead.head(max(limit - len(late), 0)).itertuples()])
