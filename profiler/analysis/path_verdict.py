"""The critical path's verdict: who holds the others up, and whether it is the host or the GPU.

The page reads the decisions every page shares (issue 29: one decision per cause, one object,
the same sentences everywhere), in this order:

  timeout        a wait that never ended (profiler.analysis.timeouts);
  late entry     a rank the others wait for before it enters the op, net of its own waits for
                 them (profiler.analysis.late_entry);
  straggler      a rank carrying more work than the others, at what it costs the op after entry
                 (profiler.analysis.straggler);
  host-bound     no rank named: host time (host calls and the host between them) is the majority
                 of every iteration's path (HOST_MAJORITY), the GPUs wait for their hosts.

Otherwise no alarm: the sentence states the most any rank held the others once every rank was in
(net held after entry, imbalance.held_after_entry) and the path's mix; the decisions under their
thresholds follow as notes (a borderline or step-level late entry, an immaterial imbalance, a
borderline host share).
"""
from __future__ import annotations

import math

from profiler.groundtruth.expect import Cause

from . import graph as G
from . import imbalance as IM
from . import late_entry as LE
from . import straggler as ST
from . import timeouts
from .decision import Decision, decide
from .verdict import HOST_MAJORITY, Verdict, fmt_ns, fmt_pct

HOST_SHARE = "host time on the path"


def path_mix(cp) -> str:
    seg = cp.segments
    tot = float(seg["duration_ns"].sum()) or 1.0
    by = seg.groupby("kind")["duration_ns"].sum() / tot
    gpu = by.reindex(["work", "gap"]).fillna(0).sum()
    host = by.reindex(["host"]).fillna(0).sum()
    launch = by.reindex(["launch"]).fillna(0).sum()
    wait = by.reindex(["wait", "barrier"]).fillna(0).sum()
    return (f"the path is {fmt_pct(gpu)} GPU work, {fmt_pct(host)} host, {fmt_pct(launch)} launch and queue "
            f"(a host call or earlier GPU work before a kernel's first warp), {fmt_pct(wait)} waiting")


def host_decision(cp) -> Decision | None:
    """HOST_SHARE per iteration (host segments of the path: host calls and the host between them)
    against HOST_MAJORITY of the iteration; None without a path."""
    seg, tot = cp.segments, cp.total_ns
    if seg.empty or tot.empty:
        return None
    t = tot.set_index("iteration")["total_ns"].astype(float)
    host = seg[seg["kind"] == "host"].groupby("iteration")["duration_ns"].sum().reindex(t.index).fillna(0.0)
    return decide(HOST_SHARE, "every rank", host.to_numpy(float), t.to_numpy(float), t.index.to_numpy(),
                  threshold=HOST_MAJORITY)


def most_held(g, totals) -> Decision | None:
    """The rank whose net held after entry (imbalance.held_after_entry: what the others were held on
    it once every rank was in, minus what it was held on them) is the largest on average."""
    its = totals["iteration"].to_numpy()
    held = IM.held_after_entry(g)
    if held.empty or not len(its):
        return None
    ranks = sorted(set(held["rank"].astype(int)) | set(held["waiter"].astype(int)))
    on, own = IM.net_held(held, its, ranks)
    net = on - own
    r = int(net.mean().idxmax())
    return decide(ST.HELD, f"rank {r}", net[r].to_numpy(float), totals["total_ns"].to_numpy(float), its,
                  threshold=math.inf)


def _late_entry(le: LE.LateEntry, warns, notes) -> Verdict:
    return Verdict(page="critical_path", alarm=True, cause=le.cause, rank=le.rank, peer=le.waiter,
                   kernel=le.kernel or None, phase=le.phase, magnitude_ns=le.waited.mean_ns,
                   reference_ns=le.waited.reference_mean_ns, n=le.n, late_entry=le.side, detail=le.headline(),
                   facts=le.facts(), notes=tuple(notes), decisions=le.decisions(), warnings=warns,
                   evidence=le.evidence)


def straggler_verdict(st: ST.Straggler, page: str, warns, notes, facts=()) -> Verdict:
    """The straggler decision as a page's verdict (the idle page adds its what-if as a fact)."""
    d = st.decision
    return Verdict(page=page, alarm=st.alarm, cause=Cause.RANK_IMBALANCE, rank=st.rank, kernel=st.kernel,
                   phase=st.phase, where=st.where, magnitude_ns=d.mean_ns, reference_ns=d.reference_mean_ns,
                   reference=d.reference, n=d.n, ratio=st.ratio, detail=st.clause(),
                   facts=st.facts() + tuple(facts), notes=tuple(notes), decisions=st.decisions(), warnings=warns,
                   evidence=st.group)


def _only_rank(g) -> int | None:
    """The run's rank when it has one (its lanes name one), else None."""
    ranks = IM.per_lane(g)["rank"].unique()
    return int(ranks[0]) if len(ranks) == 1 else None


def _every_host(d: Decision, cp, warns, notes) -> Verdict:
    # one rank: its host is the one the GPU waits for (named, as a planted host delay names it);
    # several: every rank's, none later than the others (a late one is the late entry's verdict)
    one = _only_rank(cp.graph)
    where = "one rank" if one is not None else "no one rank later than the others"
    return Verdict(page="critical_path", alarm=True, cause=Cause.HOST_BOUND, rank=one,
                   magnitude_ns=d.mean_ns, reference_ns=d.reference_mean_ns, n=d.n,
                   detail=f"host time is {fmt_pct(d.share)} of the critical path, {where}",
                   facts=(f"decision: {HOST_SHARE} {fmt_ns(d.mean_ns)} per iteration, {d.describe()}", path_mix(cp)),
                   notes=tuple(notes), decisions=(d,), warnings=warns)


def shared_notes(le: LE.LateEntry | None, st: ST.Straggler | None, host: Decision | None) -> list[str]:
    """The shared decisions under their thresholds, as every page states them."""
    out = []
    if le is not None and not le.alarm:
        out += le.notes()
    if st is not None and st.note():
        out.append(st.note())
    if host is not None and host.borderline:
        out.append(f"borderline host-bound: {HOST_SHARE} {fmt_ns(host.mean_ns)} per iteration, {host.describe()}")
    return out


def headline(cp) -> Verdict:
    g: G.Graph = cp.graph
    warns = tuple(cp.warnings)
    if g is not None:
        tv = timeouts.verdict(g, "critical_path")
        if tv is not None:
            return tv
    tot = cp.total_ns
    if tot.empty or g is None:
        return Verdict(page="critical_path", alarm=False, cause=Cause.NONE, detail="the run has no spans",
                       warnings=warns)
    le = LE.decision(g, tot)
    st = ST.decision(g)
    host = host_decision(cp)
    notes = shared_notes(le, st, host)
    if le is not None and le.alarm:
        return _late_entry(le, warns, notes)
    if st is not None and st.alarm:
        return straggler_verdict(st, "critical_path", warns, notes)
    if host is not None and host.alarm:
        return _every_host(host, cp, warns, notes)
    held = most_held(g, tot)
    decisions = tuple(x for x in [held] + [d for o in (le, st) if o is not None for d in o.decisions()]
                      + [host] if x is not None)
    n = len(tot)
    if held is not None and held.mean_ns > 0:
        what = (f"once every rank was in, no rank held the others up: the most is {fmt_ns(held.mean_ns)} per "
                f"iteration ({held.subject}, {ST.HELD}, {fmt_pct(held.share)} of the iteration)")
    else:
        what = "once every rank was in, no rank held another up"
    return Verdict(page="critical_path", alarm=False, cause=Cause.NONE, n=n,
                   reference_ns=float(tot["total_ns"].mean()), reference="the mean iteration",
                   detail=what, facts=(path_mix(cp),), notes=tuple(notes), decisions=decisions, warnings=warns)

