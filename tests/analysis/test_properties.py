"""Property tests: arbitrary (also malformed, also unfinished) event tables never crash the
analyses, the critical path covers each iteration exactly, and what-if never projects a saving
larger than the phase's own time on the path. Shrinking is off: on these tables it can run for
minutes; the raw failing example is reported."""
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from profiler.analysis import Verdict, barrier_contention, critical_path, idle_warps, what_if
from tests.analysis.tables import TEST_REGISTRY, table

PHASES = ["send_chunk", "wait_space", "wait_data", "copy_out", "reduce", "notify"]
INSTANTS = ["publish_tail", "publish_head"]
BARRIERS = ["grid", "rank_start", "block_sync"]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow],
                phases=[Phase.explicit, Phase.reuse, Phase.generate])


@st.composite
def rows(draw):
    out = []
    for _ in range(draw(st.integers(1, 40))):
        rank, block, warp = draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 2))
        it = draw(st.integers(0, 1))
        launch = it * 2 + draw(st.integers(0, 1))
        b = draw(st.integers(0, 1000))
        kind = draw(st.sampled_from(["span", "span", "instant", "arrive", "depart", "host"]))
        if kind == "span":
            e = b + draw(st.integers(0, 300))
            out.append((rank, launch, "dispatch", it, block, warp, "w", "span", draw(st.sampled_from(PHASES)), b, e,
                        draw(st.integers(-1, 3))))
        elif kind == "instant":
            out.append((rank, launch, "dispatch", it, block, warp, "w", "instant", draw(st.sampled_from(INSTANTS)), b, b,
                        draw(st.integers(-1, 3))))
        elif kind == "host":
            out.append((rank, launch, "dispatch", it, -1, -1, "host", "host", "enqueue", b, b + draw(st.integers(0, 300)), 0))
        else:
            out.append((rank, launch, "dispatch", it, block, warp, "w", kind, draw(st.sampled_from(BARRIERS)), b, b,
                        draw(st.integers(0, 1))))
    return out


def _table(r, opened):
    ev = table(r)
    # a few spans left open, as a timed-out kernel leaves them (end = begin: the warp's last record)
    spans = np.flatnonzero((ev["kind"] == "span").to_numpy())
    pick = spans[np.asarray(opened[: len(spans)] + [False] * max(0, len(spans) - len(opened)), bool)[: len(spans)]]
    ev.loc[pick, "open"] = True
    ev.loc[pick, "end_ns"] = ev.loc[pick, "begin_ns"]
    return ev


@settings(max_examples=25, **SETTINGS)
@given(rows(), st.booleans(), st.lists(st.booleans(), max_size=6))
def test_never_crash_and_path_invariants(r, with_registry, opened):
    ev = _table(r, opened)
    reg = TEST_REGISTRY if with_registry else None
    cp = critical_path(ev, registry=reg)
    tot = cp.total_ns.set_index("iteration")
    for it, seg in cp.segments.groupby("iteration"):
        b, e = seg["begin_ns"].to_numpy(), seg["end_ns"].to_numpy()
        assert np.all(e > b)
        assert np.all(b[1:] == e[:-1])
        # the path covers the whole iteration: from its begin to its end
        assert b[0] == tot.loc[it, "begin_ns"] and e[-1] == tot.loc[it, "end_ns"]
        assert seg["duration_ns"].sum() == tot.loc[it, "total_ns"]
    assert (cp.slack["slack_ns"] >= 0).all()
    assert isinstance(cp.verdict, Verdict) and cp.verdict.page == "critical_path"
    iw = idle_warps(ev, registry=reg)
    assert isinstance(iw.verdict, Verdict) and (iw.per_warp["busy_ns"] >= 0).all()
    bc = barrier_contention(ev, registry=reg)
    assert isinstance(bc.verdict, Verdict)
    assert (bc.occurrences["spread_ns"] >= 0).all() if len(bc.occurrences) else True
    if ev["open"].any():
        # an unfinished wait is a timeout on every page that sees one
        assert cp.verdict.cause.value in ("timeout", "none", "host_bound", "rank_imbalance")
    spans = ev.loc[ev["kind"] == "span", "phase"].astype(str)
    if len(spans):
        w = what_if(ev, phase=spans.iloc[0], speedup=0.5, registry=reg)
        assert (w.summary["change_ns"] <= 0).all()
        assert (w.retimed["end_ns"] >= w.retimed["begin_ns"]).all()


@settings(max_examples=40, **SETTINGS)
@given(rows(), st.booleans(), st.floats(0.01, 0.99), st.sampled_from(PHASES), st.sampled_from([None, 0, 1, 2]))
def test_what_if_saving_never_exceeds_the_phase_time_on_the_path(r, with_registry, speedup, phase, rank):
    ev = table(r)
    reg = TEST_REGISTRY if with_registry else None
    if phase not in set(ev["phase"].astype(str)):
        return
    s = what_if(ev, phase=phase, speedup=speedup, rank=rank, registry=reg).summary
    saving = -s["change_ns"].to_numpy()
    assert np.all(saving <= s["path_phase_ns"].to_numpy())
    assert np.all(saving >= 0)
