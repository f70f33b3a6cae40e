"""The critical path's verdict: who holds the others up, and whether it is the host or the GPU.

Ranks rendezvous: at cross-rank barriers (every rank arrives, the last one releases them) and
where the path crosses from one rank to another at a data wait (a rank waiting for a peer's
rows, released by the peer's publish). At each rendezvous the waiting rank sat idle for `held`:
at a barrier the last rank's arrival minus the arrival before it, at a data wait the release
minus the wait's begin. Had the releasing rank been as quick as the waiter, the iteration would
have been up to that much shorter: that is the effect size. It is 0-few % of an iteration when
ranks are balanced, whichever rank the path happens to run through, and it is what a straggler
costs even when the path never leaves the straggler (the others' waits are off the path).

Why was the releaser late? If it carries extra work (a role busy >= 1.2x the median rank's,
profiler.analysis.imbalance.straggler), that is the cause: RANK_IMBALANCE (extra rows also make
extra work between the recorded kernels, which the timing alone would take for host time).
Otherwise, over the stretch since the previous rendezvous (or the iteration's begin), each rank's
time splits into GPU time (some recorded kernel of the rank running) and host time (none running:
host code, launch latency, unrecorded work, a late entry into the op). The side where the
releaser spent more than the waiter is the cause: host time -> HOST_BOUND, GPU -> RANK_IMBALANCE.

Per (rank, cause) the held time is summed per iteration and its median over iterations decides
(medians state their n); an alarm needs ALARM_SHARE of the median iteration. A timed-out run
leads with its stall (profiler.analysis.timeouts).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.expect import Cause

from . import graph as G
from . import timeouts
from . import imbalance as IM
from .imbalance import busy_excess
from .rendezvous import rank_lateness
from . import late_entry as LE
from .path_walk import path_points
from .verdict import ALARM_SHARE, HOST_MAJORITY, Verdict, decide_share, fmt_ns, fmt_pct, size

CROSSING_COLUMNS = ["iteration", "rank", "peer", "kernel", "phase", "wait_begin_ns", "release_ns", "held_ns",
                    "window_begin_ns", "host_excess_ns", "gpu_excess_ns", "cause", "work_kernel", "work_phase"]


def launch_spans(g: G.Graph) -> pd.DataFrame:
    """[rank, launch, b, e]: per launch its GPU lanes' first to last point (memoised)."""
    def compute():
        L = g.lane
        gl = ~L["host"].to_numpy()
        df = pd.DataFrame({"rank": L["rank"].to_numpy()[gl], "launch": L["launch"].to_numpy()[gl],
                           "b": g.pt_t[g.lane_first[gl]], "e": g.pt_t[g.lane_last[gl]]})
        return df.groupby(["rank", "launch"], sort=False).agg(b=("b", "min"), e=("e", "max")).reset_index()
    return G.memo(g, "launch_spans", compute)


def _gpu_intervals(g: G.Graph) -> dict[int, np.ndarray]:
    """Per rank: merged [start, end] of its kernels (GPU lanes' first to last point per launch)."""
    k = launch_spans(g)
    out = {}
    for r, s in k.groupby("rank"):
        s = s.sort_values("b")
        merged = []
        for b, e in zip(s["b"].to_numpy(), s["e"].to_numpy()):
            if merged and b <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([b, e])
        out[int(r)] = np.asarray(merged, np.int64).reshape(-1, 2)
    return out


def _stretch_begins(allrv: pd.DataFrame, total_ns: pd.DataFrame, it: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """Per crossing: the latest release of a rendezvous of its iteration before its wait began,
    else its iteration's start (else its wait's begin), never after the wait's begin."""
    a_it, a_rel = allrv["iteration"].to_numpy(np.int64), allrv["release_ns"].to_numpy(np.int64)
    order = np.lexsort((a_rel, a_it))
    a_it, a_rel = a_it[order], a_rel[order]
    start = dict(zip(total_ns["iteration"].to_numpy(np.int64).tolist(),
                     total_ns["begin_ns"].to_numpy(np.int64).tolist()))
    out = wb.copy()
    for i in np.unique(it):
        q = it == i
        lo, hi = np.searchsorted(a_it, i, "left"), np.searchsorted(a_it, i, "right")
        k = np.searchsorted(a_rel[lo:hi], wb[q], "left")   # rendezvous released before wb: [lo, lo + k)
        prev = a_rel[lo + np.maximum(k - 1, 0)] if hi > lo else wb[q]
        out[q] = np.where(k > 0, prev, start.get(int(i), wb[q]))
    return np.minimum(out, wb)


def _gpu_times(gpu: dict, ranks: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per window: its rank's GPU-busy time within [a, b) (0 where b <= a), from the running total
    of the rank's merged (disjoint, sorted) intervals."""
    out = np.zeros(len(ranks), np.int64)
    for r in np.unique(ranks):
        iv = gpu.get(int(r))
        q = (ranks == r) & (b > a)
        if iv is None or len(iv) == 0 or not q.any():
            continue
        starts, ends = iv[:, 0], iv[:, 1]
        before = np.concatenate([[0], np.cumsum(ends - starts)])

        def covered(t):   # busy time before t
            k = np.searchsorted(starts, t, "right")   # intervals starting at or before t: [0, k)
            last = np.maximum(k - 1, 0)
            return np.where(k > 0, before[last] + np.clip(np.minimum(t, ends[last]) - starts[last], 0, None), 0)
        out[q] = covered(b[q]) - covered(a[q])
    return out


def path_crossings(g: G.Graph) -> pd.DataFrame:
    """The data waits where the critical path crosses from one rank to another (_rendezvous's
    columns), per iteration; memoised."""
    return G.memo(g, "path_crossings", lambda: _path_crossings(g))


def _path_crossings(g: G.Graph) -> pd.DataFrame:
    cols = ["iteration", "rank", "peer", "kernel", "phase", "wait_begin_ns", "release_ns", "held_ns"]
    pts, its = path_points(g)
    if len(pts):
        rank_of = g.lane["rank"].to_numpy()
        cross = (g.src[pts] >= 0) & g.binding[pts] & (g.seg_owner[pts] >= 0) & (g.seg_kind[pts] == G.WAIT)
        cross &= rank_of[g.pt_lane[np.maximum(g.src[pts], 0)]] != rank_of[g.pt_lane[pts]]
        if cross.any():
            p, own = pts[cross], g.seg_owner[pts[cross]]
            wb, rel = g.pt_t[g.iv_pb[own]], g.rel_t[p]
            return pd.DataFrame({"iteration": its[cross], "rank": rank_of[g.pt_lane[g.src[p]]],
                                 "peer": rank_of[g.pt_lane[p]],
                                 "kernel": g.lane["kernel"].to_numpy()[g.pt_lane[p]].astype(str),
                                 "phase": g.phase_names[g.iv_phase[own]].astype(str), "wait_begin_ns": wb,
                                 "release_ns": rel, "held_ns": np.maximum(rel - wb, 0)}, columns=cols)
    return pd.DataFrame(columns=cols)


def _rendezvous(cp) -> pd.DataFrame:
    """[iteration, rank, peer, kernel, phase, wait_begin_ns, release_ns, held_ns]: every cross-rank
    barrier occurrence (rank = its last arriver), and every data wait where the path crosses ranks."""
    g: G.Graph = cp.graph
    cols = ["iteration", "rank", "peer", "kernel", "phase", "wait_begin_ns", "release_ns", "held_ns"]
    parts = []
    late = rank_lateness(g)
    late = late[late["peer"] >= 0]
    if len(late):
        parts.append(pd.DataFrame({"iteration": late["iteration"], "rank": late["rank"], "peer": late["peer"],
                                   "kernel": late["kernel"], "phase": late["barrier"], "wait_begin_ns": late["prev_ns"],
                                   "release_ns": late["last_ns"], "held_ns": late["lateness_ns"]}))
    pc = path_crossings(g)
    if len(pc):
        parts.append(pc)
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True)[cols]
    return out.sort_values(["iteration", "release_ns"], kind="stable").reset_index(drop=True)


def crossings(cp) -> pd.DataFrame:
    """Every rendezvous where a rank waited on another: who, for how long, and why (host or GPU)."""
    g: G.Graph = cp.graph
    seg = cp.segments
    if seg.empty or g is None:
        return pd.DataFrame(columns=CROSSING_COLUMNS)
    allrv = _rendezvous(cp)
    rv = allrv[allrv["held_ns"] > 0]
    if rv.empty:
        return pd.DataFrame(columns=CROSSING_COLUMNS)
    gpu = _gpu_intervals(g)
    # each crossing's stretch starts at the previous rendezvous of its iteration (every rendezvous,
    # held or not: all ranks had got there), else at the iteration's start; numpy over all rows at
    # once (a pandas filter per row cost ~1 s at 1.7 k crossings, 10 M events)
    it_all = rv["iteration"].to_numpy(np.int64)
    wb_all, rel_all = rv["wait_begin_ns"].to_numpy(np.int64), rv["release_ns"].to_numpy(np.int64)
    ws_all = _stretch_begins(allrv, cp.total_ns, it_all, wb_all)
    r_all, q_all = rv["rank"].to_numpy(np.int64), rv["peer"].to_numpy(np.int64)
    gr_all = _gpu_times(gpu, r_all, ws_all, rel_all)
    gq_all = _gpu_times(gpu, q_all, ws_all, wb_all)
    # the path's work segments, grouped by (iteration, rank), for the releaser's top (kernel, phase)
    w = seg[seg["kind"] == "work"]
    w_b, w_e, w_d = w["begin_ns"].to_numpy(), w["end_ns"].to_numpy(), w["duration_ns"].to_numpy()
    w_kp = (w["kernel"].astype(str) + "\0" + w["phase"].astype(str)).to_numpy()
    w_rows = pd.Series(np.arange(len(w))).groupby([w["iteration"].to_numpy(), w["rank"].to_numpy()]).indices
    rows = []
    for i, x in enumerate(rv.itertuples(index=False)):
        it, r, q, wb, rel = int(x.iteration), int(x.rank), int(x.peer), int(x.wait_begin_ns), int(x.release_ns)
        ws, gr, gq = int(ws_all[i]), int(gr_all[i]), int(gq_all[i])
        host_ex = ((rel - ws) - gr) - ((wb - ws) - gq)
        gpu_ex = gr - gq
        top = ("", "")
        k = w_rows.get((it, r))
        if k is not None:
            k = k[(w_e[k] > ws) & (w_b[k] < rel)]
        if k is not None and len(k):
            u, inv = np.unique(w_kp[k], return_inverse=True)
            top = tuple(u[int(np.argmax(np.bincount(inv, weights=w_d[k])))].split("\0", 1))
        rows.append({"iteration": it, "rank": r, "peer": q, "kernel": str(x.kernel), "phase": str(x.phase),
                     "wait_begin_ns": wb, "release_ns": rel, "held_ns": int(x.held_ns), "window_begin_ns": ws,
                     "host_excess_ns": host_ex, "gpu_excess_ns": gpu_ex,
                     "cause": Cause.HOST_BOUND.value if host_ex > gpu_ex else Cause.RANK_IMBALANCE.value,
                     "work_kernel": str(top[0]), "work_phase": str(top[1])})
    return pd.DataFrame(rows, columns=CROSSING_COLUMNS)


def _path_mix(cp) -> str:
    seg = cp.segments
    tot = float(seg["duration_ns"].sum()) or 1.0
    by = seg.groupby("kind")["duration_ns"].sum() / tot
    gpu = by.reindex(["work", "gap"]).fillna(0).sum()
    host = by.reindex(["host"]).fillna(0).sum()
    launch = by.reindex(["launch"]).fillna(0).sum()
    wait = by.reindex(["wait", "barrier"]).fillna(0).sum()
    return (f"the path is {fmt_pct(gpu)} GPU work, {fmt_pct(host)} host, {fmt_pct(launch)} launch and queue "
            f"(a host call or earlier GPU work before a kernel's first warp), {fmt_pct(wait)} waiting")


HOST_KINDS = ("host",)


def _host_share(cp):
    """(per-iteration host and launch ns on the path, iteration spans, the decision at HOST_MAJORITY)."""
    seg, tot = cp.segments, cp.total_ns
    t = tot.set_index("iteration")["total_ns"].astype(float)
    host = seg[seg["kind"].isin(HOST_KINDS)].groupby("iteration")["duration_ns"].sum().reindex(t.index).fillna(0.0)
    return host.to_numpy(float), t.to_numpy(float), decide_share(host.to_numpy(float), t.to_numpy(float), HOST_MAJORITY)


def _every_host(cp, warns) -> Verdict | None:
    """HOST_BOUND with no rank when host time (host calls and the host between them) is the
    majority of the path: the interval of its median share of the iteration is
    past verdict.HOST_MAJORITY (verdict.decide_share); None otherwise."""
    seg, tot = cp.segments, cp.total_ns
    if seg.empty or tot.empty:
        return None
    host, t, d = _host_share(cp)
    if not d.alarm:
        return None
    n = len(t)
    return Verdict(page="critical_path", alarm=True, cause=Cause.HOST_BOUND, rank=None,
                   magnitude_ns=float(np.median(host)), reference_ns=float(np.median(t)), n=n,
                   detail=f"host calls and the host between them are {fmt_pct(d.median)} of the "
                          f"critical path (interval {fmt_pct(d.low)}-{fmt_pct(d.high)} over {n} iteration"
                          f"{'s' if n != 1 else ''}), no one rank later than the others; {_path_mix(cp)}",
                   warnings=warns)


def _host_note(cp) -> str:
    """The host share as a note when it is borderline ('' otherwise)."""
    if cp.segments.empty or cp.total_ns.empty:
        return ""
    _, _, d = _host_share(cp)
    return d.describe("borderline host-bound: host time is") if d.state == "borderline" else ""


def _late_entry_verdict(le: LE.LateEntry, n_it: int, warns) -> Verdict:
    sz = le.size
    return Verdict(page="critical_path", alarm=True, cause=le.cause, rank=le.rank, peer=le.waiter, kernel=le.kernel,
                   phase=le.phase, magnitude_ns=sz.magnitude_ns, reference_ns=sz.reference_ns, n=n_it,
                   iteration=sz.iteration, late_entry=le.side, detail=le.clause(),
                   notes=(sz.note,) if sz.note else (), warnings=warns, evidence=le.evidence)


def _quiet_notes(cp, le) -> tuple:
    """What stays under an alarm but a reader should see: a borderline host share or late entry."""
    out = []
    h = _host_note(cp)
    if h:
        out.append(h)
    if le is not None and le.size.borderline:
        out.append(f"borderline late entry: {le.clause()}; {le.size.note}")
    return tuple(out)


def headline(cp) -> Verdict:
    g: G.Graph = cp.graph
    warns = tuple(cp.warnings)
    if g is not None:
        tv = timeouts.verdict(g, "critical_path")
        if tv is not None:
            return tv
    tot = cp.total_ns
    if tot.empty:
        return Verdict(page="critical_path", alarm=False, cause=Cause.NONE, detail="the run has no spans",
                       warnings=warns)
    n_it = len(tot)
    med_it = float(tot["total_ns"].median())
    le = LE.decision(g, tot) if g is not None else None
    if le is not None and le.alarm:
        return _late_entry_verdict(le, n_it, warns)
    x = crossings(cp)
    # a late host is the late-entry decision's (late_entry.py, shared with the other pages): the
    # crossings keep what happens once both ranks are in
    x = x[x["cause"] != Cause.HOST_BOUND.value].reset_index(drop=True) if len(x) else x
    # a releaser that carries extra work is a straggler, whatever side its lateness showed on
    st = (IM.straggler(IM.per_rank(IM.per_lane(g), IM.waited_on(g), IM.phase_busy(g)), IM.phase_busy(g),
                       IM.kernel_order(g)) if len(x) else None)
    if st is not None:
        x.loc[x["rank"] == st["rank"], "cause"] = Cause.RANK_IMBALANCE.value
        x.loc[x["rank"] == st["rank"], ["work_kernel", "work_phase"]] = [st["where"][0][0], st["where"][0][1] or ""]
    its = tot["iteration"].to_numpy()
    cands = []
    if len(x):
        per_it = x.groupby(["rank", "cause", "iteration"])["held_ns"].sum()
        for (r, c), s_ in per_it.groupby(level=[0, 1]):
            v = s_.droplevel([0, 1]).reindex(its).fillna(0).to_numpy(float)
            cands.append((float(np.median(v)), int(r), c, v))
    # a straggler keeps the path on itself, so the others' waits are off the path: its busiest
    # warps working longer than the median rank's is the time it adds, when that work is on the path
    ex = busy_excess(g)
    if len(ex):
        seg = cp.segments
        on_path = seg[seg["kind"] == "work"].groupby(["rank", "iteration"])["duration_ns"].sum()
        for r, s_ in ex.groupby("rank"):
            v = s_.groupby("iteration")["excess_ns"].sum().reindex(its).fillna(0).to_numpy(float)
            pw = on_path.loc[r].reindex(its).fillna(0).to_numpy(float) if r in on_path.index.get_level_values(0) \
                else np.zeros(len(its))
            v = np.minimum(v, pw)
            if v.max() > 0:
                cands.append((float(np.median(v)), int(r), "busy", v))
    if not cands:
        every = _every_host(cp, warns)
        if every is not None:
            return every
        return Verdict(page="critical_path", alarm=False, cause=Cause.NONE, n=n_it, reference_ns=med_it,
                       detail=f"no rank waits on another; {_path_mix(cp)} "
                              f"(median iteration {fmt_ns(med_it)}, n = {n_it})",
                       notes=_quiet_notes(cp, le), warnings=warns)
    cands.sort(key=lambda t: -t[0])
    med, r, c, v = cands[0]
    totals = tot["total_ns"].to_numpy(float)
    sz = size(v, its, totals)
    notes = [sz.note] if sz.note else []
    notes += list(_quiet_notes(cp, le))
    for m2, r2, c2, v2 in cands[1:] if sz.iteration is not None else cands:
        k2 = int(np.argmax(v2))
        if v2[k2] >= ALARM_SHARE * totals[k2] and v2[k2] > 2 * max(m2, 1.0):
            what = {Cause.HOST_BOUND.value: "host entered late"}.get(c2, "GPU work ran long")
            notes.append(f"iteration {int(its[k2])} stands out: rank {r2}'s {what}, the others waited "
                         f"{fmt_ns(v2[k2])} on it ({fmt_pct(v2[k2] / totals[k2])} of that iteration)")
    xs = x[(x["rank"] == r) & (x["cause"] == c)] if len(x) else x
    common = dict(page="critical_path", rank=r, magnitude_ns=sz.magnitude_ns, reference_ns=sz.reference_ns,
                  n=n_it, iteration=sz.iteration, notes=tuple(notes[:3]), warnings=warns)
    if not sz.alarm:
        every = _every_host(cp, warns)
        if every is not None:
            return every
        return Verdict(alarm=False, cause=Cause.NONE, **{**common, "rank": None}, evidence=x,
                       detail=f"no rank holds the others up: the most any rank makes the others wait is "
                              f"{fmt_ns(med)} per iteration (rank {r}, median over {n_it} iteration"
                              f"{'s' if n_it != 1 else ''}, {fmt_pct(med / med_it)} of the median iteration "
                              f"{fmt_ns(med_it)}); {_path_mix(cp)}")
    if c == "busy":
        exr = ex[ex["rank"] == r].groupby("kernel")["excess_ns"].sum().sort_values(ascending=False)
        kernels = [str(k) for k, e in exr.items() if e > 0]
        seg = cp.segments
        w = seg[(seg["rank"] == r) & (seg["kind"] == "work") & (seg["kernel"] == kernels[0])]
        wp = str(w.groupby("phase")["duration_ns"].sum().idxmax()) if len(w) else None
        where = ((kernels[0], wp),) + tuple((k, None) for k in kernels[1:])
        waiters = x[(x["rank"] == r)] if len(x) else x
        peer = int(waiters.groupby("peer")["held_ns"].sum().idxmax()) if len(waiters) else None
        return Verdict(alarm=True, cause=Cause.RANK_IMBALANCE, kernel=kernels[0], phase=wp, where=where, peer=peer,
                       detail=f"its busiest warps work {fmt_ns(float(exr.iloc[0]) / n_it)} per iteration longer "
                              f"than the median rank's in {kernels[0]}, on the critical path",
                       evidence=ex[ex["rank"] == r].reset_index(drop=True), **common)
    big = xs.loc[xs["held_ns"].idxmax()]
    if c == Cause.HOST_BOUND.value:
        return Verdict(alarm=True, cause=Cause.HOST_BOUND, kernel=str(big["kernel"]), phase=str(big["phase"]),
                       peer=int(big["peer"]), evidence=xs.reset_index(drop=True),
                       detail=f"its host (or work outside the recorded kernels) took "
                              f"{fmt_ns(float(big['host_excess_ns']))} more than rank {int(big['peer'])}'s before "
                              f"that rendezvous", **common)
    wk = str(big["work_kernel"]) or str(big["kernel"])
    wp = str(big["work_phase"]) or None
    where = tuple(dict.fromkeys([(wk, wp)] + [(str(k), str(p) or None) for k, p in
                                              xs[["work_kernel", "work_phase"]].itertuples(index=False) if k]))
    return Verdict(alarm=True, cause=Cause.RANK_IMBALANCE, kernel=wk, phase=wp, where=where, peer=int(big["peer"]),
                   evidence=xs.reset_index(drop=True),
                   detail=f"its GPU time ran {fmt_ns(float(big['gpu_excess_ns']))} longer than rank "
                          f"{int(big['peer'])}'s before {big['kernel']}/{big['phase']}", **common)
