"""What a rank was doing before it entered an op: the op that made it late, named.

Two windows, attributed the same way on one rank's merged PyTorch trace (store.RankTrace):
* late entry (scope `late_entry`): for each op occurrence the time model found a late rank for,
  the window from the first rank's entry to the late rank's (timemodel ops: first_entry_ns,
  last_entry_ns, late_rank, late_cause), on the late rank;
* lead-in (scope `lead_in`): for each profiled launch of a rank, from the end of the rank's
  previous profiled launch to this launch's first warp: the "launch and queue" time before a
  kernel, which one rank alone shows.

In a window [a, b] of launch L (its host launch call at h, from the trace's join):
* GPU side: the kernels, copies and memsets on the rank's GPU (any stream) overlapping [a, b], each
  with the time it overlaps, its launching PyTorch op (the innermost cpu_op around its launch
  call) and the Python frame it was launched from (the innermost python_function around the call
  that is not PyTorch's own code, or the op's "Call stack");
* host side: [a, min(h, b)], when L's host had not launched it yet: the CPU ops and
  record_function ranges on L's launching thread, each instant given to the innermost one; time
  inside none is `(no op)` (Python between ops), with the Python frame there.
The window's side is the time model's `late_cause` for a late entry; for a lead-in, the larger of
host time (host window not covered by GPU work) and GPU-busy time. The sentence names the largest
item of that side, grouped by op: "rank 1 entered dispatch 480 µs late: its GPU was running
aten::mm (470 µs), launched from moe.py:112".
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analysis.verdict import fmt_ns
from . import kineto as K
from .labels import parse_label

LATE, LEAD = "late_entry", "lead_in"
GPU, HOST = "gpu", "host"
NO_OP = "(no op)"
COLUMNS = ["scope", "iteration", "kernel", "occurrence", "rank", "launch", "window_begin_ns", "window_end_ns",
           "cause", "side", "item", "name", "op", "stack", "begin_ns", "end_ns", "in_window_ns"]
CLAUSE_COLUMNS = ["scope", "iteration", "kernel", "occurrence", "rank", "launch", "window_ns", "cause", "host_ns",
                  "gpu_ns", "name", "op", "stack", "top_ns", "clause"]
_FRAME = re.compile(r"(?P<file>[^()]+)\((?P<line>\d+)\):")
# Python frames of PyTorch's own machinery (module __call__ plumbing, the profiler) say nothing
# about the user's step; the innermost frame outside them is the one a user recognises.
_LIBRARY = ("torch/", "<built-in", "contextlib.py", "threading.py", "profiler", "ep_core/")


@dataclass(frozen=True)
class Blame:
    """items: COLUMNS, one row per (window, attributed item); clauses: CLAUSE_COLUMNS, one per
    window with its sentence."""
    items: pd.DataFrame
    clauses: pd.DataFrame

    def late_entry_clauses(self) -> pd.DataFrame:
        return self.clauses[self.clauses["scope"] == LATE].reset_index(drop=True)


def frame_of(name: str) -> str:
    """'moe.py:112' from a Kineto python_function name 'path/to/moe.py(112): forward' ('' if none)."""
    m = _FRAME.match(name)
    return f"{os.path.basename(m['file'].strip())}:{m['line']}" if m else ""


def _user_frame(names) -> str:
    """The first frame of `names` (innermost first) outside PyTorch's machinery, else the first."""
    frames = [n for n in names if n]
    for n in frames:
        if not any(s in n for s in _LIBRARY) and frame_of(n):
            return frame_of(n)
    return frame_of(frames[0]) if frames else ""


class _Thread:
    """One host thread's ranges sorted by begin, for 'which ranges cover time t' (nesting: a range
    covering t has begin <= t; walking back from the last such begin finds them, innermost first)."""

    def __init__(self, ev: pd.DataFrame):
        ev = ev.sort_values(["begin_ns", "end_ns"], ascending=[True, False], kind="stable")
        self.b = ev["begin_ns"].to_numpy(np.int64)
        self.e = ev["end_ns"].to_numpy(np.int64)
        self.name = ev["name"].astype(str).to_numpy()
        self.stack = ev["stack"].astype(str).to_numpy() if "stack" in ev else np.full(len(ev), "")
        # the longest end among ranges before each index bounds how far back a covering range can be
        self.reach = np.maximum.accumulate(self.e) if len(self.e) else self.e

    def covering(self, t: int, limit: int = 256) -> list[int]:
        """Indices of the ranges with begin <= t < end, innermost (latest begin) first."""
        i = int(np.searchsorted(self.b, t, "right")) - 1
        out = []
        while i >= 0 and len(out) < limit:
            if self.e[i] > t:
                out.append(i)
            if i > 0 and self.reach[i - 1] <= t:
                break
            i -= 1
        return out


@dataclass
class _RankIndex:
    """A rank's merged trace indexed for the attribution."""
    gpu: pd.DataFrame            # kernels, copies, memsets: begin_ns, end_ns, name, correlation, kind
    calls: pd.DataFrame          # launch calls by correlation: pid, tid, begin_ns
    ops: dict                    # (pid, tid) -> _Thread of cpu_op + user ranges (epscope labels excluded)
    py: dict                     # (pid, tid) -> _Thread of python_function
    joined: pd.DataFrame         # launch -> call_begin_ns, pid, tid, kernel_begin_ns

    @classmethod
    def of(cls, rt) -> "_RankIndex":
        ev = rt.events
        gpu = ev[ev["kind"].isin([K.KERNEL, K.MEMCPY, K.MEMSET])].sort_values("begin_ns")
        calls = ev[(ev["kind"] == K.RUNTIME) & (ev["correlation"] >= 0)].drop_duplicates("correlation")
        host = ev[ev["kind"].isin([K.CPU_OP, K.USER])]
        host = host[[parse_label(n) is None for n in host["name"].astype(str)]]
        py = ev[ev["kind"] == K.PYTHON]
        return cls(gpu.reset_index(drop=True), calls.set_index("correlation"),
                   {k: _Thread(g) for k, g in host.groupby(["pid", "tid"], sort=False)},
                   {k: _Thread(g) for k, g in py.groupby(["pid", "tid"], sort=False)},
                   rt.joined.set_index("launch"))

    def launched_by(self, correlation: int) -> tuple[str, str]:
        """(innermost cpu_op, user Python frame) around the launch call of `correlation`."""
        if correlation not in self.calls.index:
            return "", ""
        c = self.calls.loc[correlation]
        key, t = (int(c["pid"]), int(c["tid"])), int(c["begin_ns"])
        th = self.ops.get(key)
        op, stack = "", ""
        if th is not None:
            cov = th.covering(t)
            if cov:
                op = th.name[cov[0]]
                stack = _user_frame(th.stack[i].split(";")[0] for i in cov if th.stack[i])
        pt = self.py.get(key)
        if pt is not None:
            stack = _user_frame(pt.name[i] for i in pt.covering(t)) or stack
        return op, stack


def _gpu_items(ix: _RankIndex, a: int, b: int, skip_corr: set) -> list[dict]:
    g = ix.gpu
    if g.empty or b <= a:
        return []
    hi = int(np.searchsorted(g["begin_ns"].to_numpy(), b, "left"))
    cand = g.iloc[:hi]
    cand = cand[(cand["end_ns"] > a) & ~cand["correlation"].isin(skip_corr)]
    out = []
    for r in cand.itertuples(index=False):
        op, stack = ix.launched_by(int(r.correlation))
        out.append({"side": GPU, "item": str(r.kind), "name": str(r.name), "op": op, "stack": stack,
                    "begin_ns": int(r.begin_ns), "end_ns": int(r.end_ns),
                    "in_window_ns": int(min(r.end_ns, b) - max(r.begin_ns, a))})
    return out


def _host_items(ix: _RankIndex, key: tuple, a: int, h: int) -> list[dict]:
    """The host window [a, h] on thread `key`, cut at every range boundary, each piece given to the
    innermost range covering it (or NO_OP)."""
    if h <= a:
        return []
    th, pt = ix.ops.get(key), ix.py.get(key)
    cuts = {a, h}
    if th is not None and len(th.b):
        inside = (th.b < h) & (th.e > a)
        cuts.update(int(x) for x in th.b[inside] if a < x < h)
        cuts.update(int(x) for x in th.e[inside] if a < x < h)
    cuts = sorted(cuts)
    acc: dict = {}
    for s, e in zip(cuts[:-1], cuts[1:]):
        cov = th.covering(s) if th is not None else []
        i = cov[0] if cov else -1
        name = th.name[i] if i >= 0 else NO_OP
        k = (name, i)
        if k not in acc:
            stack = _user_frame(pt.name[j] for j in pt.covering((s + e) // 2)) if pt is not None else ""
            acc[k] = {"side": HOST, "item": "cpu_op" if i >= 0 else "none", "name": name, "op": name if i >= 0 else "",
                      "stack": stack, "begin_ns": int(th.b[i]) if i >= 0 else s,
                      "end_ns": int(th.e[i]) if i >= 0 else e, "in_window_ns": 0}
        acc[k]["in_window_ns"] += e - s
    return list(acc.values())


def _union(items: list[dict], a: int, b: int) -> int:
    iv = sorted((max(x["begin_ns"], a), min(x["end_ns"], b)) for x in items if x["side"] == GPU)
    tot, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return tot + (cur_e - cur_s if cur_e is not None else 0)


def _window(ix: _RankIndex, launch: int, a: int, b: int, scope: str) -> tuple[list[dict], int, int] | None:
    """(items, host_ns, gpu_ns) of launch's window [a, b]; None when the launch is not joined. A
    lead-in starts where the rank's previous profiled kernel ended, so the profiled kernels are
    left out of it (CUPTI's end of a kernel trails its last warp by a few hundred ns); a late
    entry keeps them (a previous op that ran long is a cause)."""
    if launch not in ix.joined.index:
        return None
    j = ix.joined.loc[launch]
    h = min(int(j["call_begin_ns"]), b)
    own = (set(ix.joined["correlation"].astype(int).tolist()) if scope == LEAD else {int(j["correlation"])})
    gpu = _gpu_items(ix, a, b, own)
    gpu_ns = _union(gpu, a, b)
    host = _host_items(ix, (int(j["pid"]), int(j["tid"])), a, h)
    host_ns = max((h - a) - _union(gpu, a, h), 0) if h > a else 0
    return gpu + host, host_ns, gpu_ns


def _top(items: list[dict], side: str) -> dict | None:
    """The side's largest item, grouped by its op (GPU: the launching op, else the kernel name)."""
    rows = [x for x in items if x["side"] == side and x["in_window_ns"] > 0]
    if not rows:
        return None
    groups: dict = {}
    for x in rows:
        k = (x["op"] or x["name"]) if side == GPU else x["name"]
        g = groups.setdefault(k, {"label": k, "ns": 0, "best": x})
        g["ns"] += x["in_window_ns"]
        if x["in_window_ns"] > g["best"]["in_window_ns"]:
            g["best"] = x
    top = max(groups.values(), key=lambda g: g["ns"])
    return {"label": top["label"], "ns": top["ns"], "name": top["best"]["name"], "op": top["best"]["op"],
            "stack": top["best"]["stack"]}


def clause(scope: str, rank: int, kernel: str, window_ns: float, side: str, top: dict | None,
           idle_ns: float = 0.0) -> str:
    """The sentence naming the op (module docstring)."""
    head = (f"rank {rank} entered {kernel} {fmt_ns(window_ns)} late" if scope == LATE
            else f"rank {rank}'s {kernel} started {fmt_ns(window_ns)} after its previous profiled kernel")
    if top is None:
        return f"{head}: no op recorded on its GPU or launching thread then ({fmt_ns(idle_ns)} idle)"
    where = "its GPU was running" if side == GPU else "its host was in"
    name = top["label"] if top["label"] != NO_OP else "Python code outside any op"
    tail = f", launched from {top['stack']}" if side == GPU and top["stack"] else (
        f", at {top['stack']}" if top["stack"] else "")
    return f"{head}: {where} {name} ({fmt_ns(top['ns'])}){tail}"


def _side(cause: str, host_ns: float, gpu_ns: float) -> str:
    if cause in (HOST, GPU):
        return cause
    return HOST if host_ns > gpu_ns else GPU


def blame(ops: pd.DataFrame, per_rank: pd.DataFrame, merged, *, lead_in: bool = True) -> Blame:
    """The attribution of every late entry of the time model (`ops`, `per_rank`: TimeModel.ops and
    .per_rank) and, with lead_in, of every profiled launch's lead-in, on the ranks `merged`
    (store.MergedTrace) has; windows of ranks without a trace are left out."""
    idx = {r: _RankIndex.of(rt) for r, rt in merged.ranks.items()}
    items, clauses = [], []
    entry = per_rank.set_index(["iteration", "kernel", "occurrence", "rank"])
    late = ops[(ops["late_rank"] >= 0) & (ops["missing"] == 0)] if len(ops) else ops
    for o in late.itertuples(index=False):
        ix = idx.get(int(o.late_rank))
        k = (int(o.iteration), str(o.kernel), int(o.occurrence), int(o.late_rank))
        if ix is None or k not in entry.index:
            continue
        launch = int(entry.loc[k, "launch"])
        _one(ix, items, clauses, LATE, k, launch, int(o.first_entry_ns), int(o.last_entry_ns), str(o.late_cause))
    if lead_in and len(per_rank):
        for r, s in per_rank.sort_values("entry_ns").groupby("rank", sort=True):
            ix = idx.get(int(r))
            if ix is None:
                continue
            prev_end = None
            for row in s.itertuples(index=False):
                if prev_end is not None and row.entry_ns > prev_end:
                    k = (int(row.iteration), str(row.kernel), int(row.occurrence), int(r))
                    _one(ix, items, clauses, LEAD, k, int(row.launch), int(prev_end), int(row.entry_ns), "")
                prev_end = max(prev_end or row.end_ns, row.end_ns)
    return Blame(pd.DataFrame(items, columns=COLUMNS), pd.DataFrame(clauses, columns=CLAUSE_COLUMNS))


def _one(ix: _RankIndex, items: list, clauses: list, scope: str, k: tuple, launch: int, a: int, b: int,
         cause: str) -> None:
    w = _window(ix, launch, a, b, scope)
    if w is None:
        return
    its, host_ns, gpu_ns = w
    side = _side(cause, host_ns, gpu_ns)
    top = _top(its, side)
    it, kernel, occ, rank = k
    for x in its:
        items.append({"scope": scope, "iteration": it, "kernel": kernel, "occurrence": occ, "rank": rank,
                      "launch": launch, "window_begin_ns": a, "window_end_ns": b, "cause": side, **x})
    idle = max((b - a) - gpu_ns - host_ns, 0)
    clauses.append({"scope": scope, "iteration": it, "kernel": kernel, "occurrence": occ, "rank": rank,
                    "launch": launch, "window_ns": b - a, "cause": side, "host_ns": host_ns, "gpu_ns": gpu_ns,
                    "name": top["label"] if top else "", "op": top["op"] if top else "",
                    "stack": top["stack"] if top else "", "top_ns": top["ns"] if top else 0,
                    "clause": clause(scope, rank, kernel, b - a, side, top, idle)})
