"""Property tests: arbitrary (also malformed) event tables never crash the analyses, and the
critical path keeps its invariants (contiguous, ends at the iteration's GPU end, shares <= 1).
Shrinking is off: on these tables it can run for minutes; the raw failing example is reported."""
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from profiler.analysis import barrier_contention, critical_path, idle_warps, what_if
from tests.analysis.tables import EP_REGISTRY, table

PHASES = ["send_chunk", "wait_space", "wait_data", "copy_out", "reduce", "notify"]
INSTANTS = ["publish_tail", "publish_head"]
BARRIERS = ["grid", "rank_start", "block_sync"]


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


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(rows(), st.booleans())
def test_never_crash_and_path_invariants(r, with_registry):
    ev = table(r)
    reg = EP_REGISTRY if with_registry else None
    cp = critical_path(ev, registry=reg)
    tot = cp.total_ns.set_index("iteration")
    for it, seg in cp.segments.groupby("iteration"):
        b, e = seg["begin_ns"].to_numpy(), seg["end_ns"].to_numpy()
        assert np.all(e > b)
        assert np.all(b[1:] == e[:-1])
        assert b[0] >= tot.loc[it, "begin_ns"] and e[-1] <= tot.loc[it, "end_ns"]
        assert seg["share"].sum() <= 1.0 + 1e-9
    assert (cp.slack["slack_ns"] >= 0).all()
    iw = idle_warps(ev, registry=reg)
    assert isinstance(iw.verdict, str) and (iw.per_warp["busy_ns"] >= 0).all()
    bc = barrier_contention(ev, registry=reg)
    assert (bc.occurrences["spread_ns"] >= 0).all() if len(bc.occurrences) else True
    spans = ev.loc[ev["kind"] == "span", "phase"].astype(str)
    if len(spans):
        w = what_if(ev, phase=spans.iloc[0], speedup=0.5, registry=reg)
        assert (w.summary["change_ns"] <= 0).all()
        assert (w.retimed["end_ns"] >= w.retimed["begin_ns"]).all()
