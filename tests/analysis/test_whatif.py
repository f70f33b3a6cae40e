"""What-if: re-timing with a phase made faster, and the share of the saving a rendezvous absorbs."""
import numpy as np
import pytest

from profiler.analysis import critical_path, what_if
from profiler.groundtruth.synthetic import make_events
from tests.analysis.tables import TEST_REGISTRY, barrier, instant, span, table


def _rendezvous(work):
    """Each rank: copy_out [0, work[r]], then the cross-rank barrier, then a 10 ns reduce."""
    rows = []
    last = max(work)
    for r, w in enumerate(work):
        rows.append(span(r, 0, 0, "copy_out", 0, w))
        rows += barrier(r, 0, 0, "rank_start", w, last + 5)
        rows.append(span(r, 0, 0, "reduce", last + 5, last + 15))
    return table(rows)


def test_saving_on_the_pacing_rank_is_partly_absorbed_by_the_rendezvous():
    ev = _rendezvous([100, 90, 90, 90])
    w = what_if(ev, phase="copy_out", speedup=0.2, rank=0, registry=TEST_REGISTRY)
    s = w.summary.iloc[0]
    assert s["before_ns"] == 115 and s["local_saving_ns"] == 20
    assert s["after_ns"] == 105          # the next-slowest rank (90) now paces
    assert s["change_ns"] == -10 and np.isclose(s["absorbed_pct"], 50.0)
    # the retimed table is consistent: every departure after every arrival of its occurrence
    rt = w.retimed
    assert rt.loc[rt["kind"] == "depart", "begin_ns"].min() >= rt.loc[rt["kind"] == "arrive", "begin_ns"].max()
    assert (rt["end_ns"] >= rt["begin_ns"]).all()


def test_saving_off_the_path_is_fully_absorbed():
    w = what_if(_rendezvous([100, 90, 90, 90]), phase="copy_out", speedup=0.5, rank=[1, 2], registry=TEST_REGISTRY)
    s = w.summary.iloc[0]
    # ranks 1 and 2 each lose 45 ns of copy_out; the local saving is one warp's, not their sum
    assert s["change_ns"] == 0 and s["local_saving_ns"] == 45 and np.isclose(s["absorbed_pct"], 100.0)


def test_everywhere_speedup_passes_through_and_moves_the_path():
    w = what_if(_rendezvous([100, 90, 90, 90]), phase="copy_out", speedup=0.5, registry=TEST_REGISTRY)
    s = w.summary.iloc[0]
    assert s["change_ns"] == -50
    assert w.new_path.total_ns["total_ns"].tolist() == [65]


def test_wait_shrinks_to_the_new_release():
    ev = table([span(0, 0, 0, "send_chunk", 0, 100), instant(0, 0, 0, "publish_tail", 100, 1),
                span(1, 0, 0, "wait_data", 10, 120, 0), span(1, 0, 0, "copy_out", 120, 150)])
    w = what_if(ev, phase="send_chunk", speedup=0.5, registry=TEST_REGISTRY)
    rt = w.retimed.set_index("phase")
    assert rt.loc["publish_tail", "begin_ns"] == 50
    assert rt.loc["wait_data", "end_ns"] == 70            # release + the recorded 20 ns latency
    assert w.summary.iloc[0]["after_ns"] == 100


def test_slowdown_and_kernel_qualified_phase():
    ev = _rendezvous([100, 90, 90, 90])
    w = what_if(ev, phase="dispatch/copy_out", speedup=-0.5, rank=1, registry=TEST_REGISTRY)
    assert w.summary.iloc[0]["change_ns"] == 35           # rank 1: 135 ns of copy_out, now last
    assert what_if(ev, phase="combine/copy_out", speedup=0.5, registry=TEST_REGISTRY).summary.iloc[0]["local_saving_ns"] == 0


def test_rejects_a_speedup_of_100_percent():
    with pytest.raises(ValueError, match="speedup"):
        what_if(_rendezvous([1, 2]), phase="copy_out", speedup=1.0)


def test_zero_speedup_changes_nothing_on_a_synthetic_run():
    ev, _, man = make_events(ranks=4, blocks=3, chunks=5, iterations=2, seed=5)
    w = what_if(ev, phase="send_chunk", speedup=0.0, registry=man["registry"])
    assert (w.summary["change_ns"] == 0).all()
    assert (w.retimed["begin_ns"].to_numpy() == ev["begin_ns"].to_numpy()).all()


def test_synthetic_speedup_never_lengthens_and_waits_follow_releases():
    ev, _, man = make_events(ranks=4, blocks=3, chunks=6, iterations=2, scenario="slow_rank", slow_rank=2, seed=6)
    w = what_if(ev, phase="send_chunk", speedup=0.3, rank=2, registry=man["registry"])
    assert (w.summary["change_ns"] <= 0).all() and (w.summary["change_ns"] < 0).any()
    rt = w.retimed
    assert (rt["end_ns"] >= rt["begin_ns"]).all()
    # the re-timed run is itself a consistent run: its critical path ends at its iteration ends
    cp = critical_path(rt, registry=man["registry"])
    assert (cp.total_ns["total_ns"].to_numpy() == w.summary["after_ns"].to_numpy()).all()


def test_eight_rank_rendezvous_absorbs_a_one_rank_saving():
    # seed 002 (/work/shared/seeds): a rendezvous of 8 GPUs absorbed ~85% of one rank's saving.
    # Here every rank sends to every other and meets at cross-rank barriers: speeding up one rank
    # alone buys (almost) nothing end-to-end, speeding up all of them does.
    ev, _, man = make_events(ranks=8, blocks=2, chunks=6, iterations=2, seed=8)
    one = what_if(ev, phase="send_chunk", speedup=0.2, rank=0, registry=man["registry"]).summary
    assert (one["local_saving_ns"] > 0).all() and (one["absorbed_pct"] >= 80).all()
    everywhere = what_if(ev, phase="send_chunk", speedup=0.2, registry=man["registry"]).summary
    assert (everywhere["change_ns"] < 0).all() and (everywhere["absorbed_pct"] < 80).all()


def test_unknown_phase_is_a_clear_error():
    with pytest.raises(ValueError, match="no phase 'nope'"):
        what_if(_rendezvous([1, 2]), phase="nope", speedup=0.1)


def test_one_iteration_matches_the_whole_run():
    ev, _, man = make_events(ranks=3, blocks=2, chunks=4, iterations=3, scenario="slow_rank", slow_rank=1, seed=9)
    whole = what_if(ev, phase="send_chunk", speedup=0.3, rank=1, registry=man["registry"])
    one = what_if(ev, phase="send_chunk", speedup=0.3, rank=1, iteration=1, registry=man["registry"])
    assert one.summary["iteration"].tolist() == [1]
    assert one.summary.iloc[0].equals(whole.summary.iloc[1])
    seg_whole = whole.new_path.segments[whole.new_path.segments["iteration"] == 1].reset_index(drop=True)
    assert one.new_path.segments.equals(seg_whole)
    other = ev["iteration"] != 1
    assert (one.retimed.loc[other, "begin_ns"] == ev.loc[other, "begin_ns"]).all()
    assert (one.retimed.loc[~other, "begin_ns"] == whole.retimed.loc[~other, "begin_ns"]).all()


def test_a_what_if_on_the_critical_path_s_graph_without_a_new_path_has_the_same_summary():
    ev, _, manifest = make_events(ranks=4, events=20_000, scenario="slow_rank", seed=3)
    reg = manifest["registry"]
    full = what_if(ev, phase="copy_out", speedup=0.3, rank=1, registry=reg)
    g = critical_path(ev, registry=reg).graph
    quick = what_if(ev, phase="copy_out", speedup=0.3, rank=1, registry=reg, graph=g, new_path=False)
    assert quick.new_path is None and full.new_path is not None
    assert quick.summary.equals(full.summary) and quick.retimed.equals(full.retimed)


@pytest.mark.parametrize("scenario,rank", [("slow_rank", 3), ("slow_rank", 0), ("late_arriver", 0)])
def test_the_instant_bound_is_never_below_the_exact_saving(scenario, rank):
    from profiler.analysis.whatif import saving_bound
    ev, la, man = make_events(ranks=4, events=40_000, scenario=scenario, iterations=3, seed=3)
    reg = man["registry"]
    cp = critical_path(ev, registry=reg, launches=la)
    for phase, s in (("send_chunk", 0.3), ("dispatch/copy_out", 0.5), ("wait_data", 0.9)):
        b = saving_bound(cp, phase=phase, speedup=s, rank=rank).set_index("iteration")
        w = what_if(ev, phase=phase, speedup=s, rank=rank, registry=reg, launches=la, graph=cp.graph,
                    new_path=False).summary.set_index("iteration")
        saving = -w["change_ns"].reindex(b.index).to_numpy()
        assert (saving <= b["max_saving_ns"].to_numpy() + 1).all(), (phase, saving, b["max_saving_ns"].to_numpy())
        np.testing.assert_array_equal(b["path_phase_ns"].to_numpy(), w["path_phase_ns"].reindex(b.index).to_numpy())


@pytest.mark.parametrize("scenario,rank", [("slow_rank", 3), ("late_arriver", None)])
def test_what_if_input_kept_without_the_graph_gives_the_graphs_summary(scenario, rank):
    """whatif.WhatIfInput (what chunked.py keeps a chunk instead of the graph) answers as what_if
    on the graph, for several phases and speedups (a negative one: slower)."""
    from profiler.analysis.timemodel import time_model
    from profiler.analysis.whatif import WhatIfInput
    ev, la, man = make_events(ranks=4, events=40_000, scenario=scenario, iterations=3, seed=5)
    reg = man["registry"]
    cp = critical_path(ev, registry=reg, launches=la)
    g = cp.graph
    inp = WhatIfInput.from_graph(g, time_model(g))
    for phase, s in (("send_chunk", 0.3), ("dispatch/copy_out", 0.5), ("wait_data", 0.9), ("combine/send_chunk", -0.4)):
        w = what_if(ev, phase=phase, speedup=s, rank=rank, registry=reg, launches=la, graph=g, new_path=False,
                    keep_retimed=False, path=cp).summary
        got = inp.summary(phase=phase, speedup=s, rank=rank, path=cp)
        assert got.equals(w), (phase, s)


def _local_saving_by_groupby(lane, tgt_lane, shorter, iterations):
    """The group-by chain _local_saving replaced: per lane the sum, the largest per launch, summed per
    rank, the largest per iteration."""
    import pandas as pd
    lanes = lane.iloc[tgt_lane]
    per = pd.DataFrame({"it": lanes["iteration"].to_numpy(), "rank": lanes["rank"].to_numpy(),
                        "launch": lanes["launch"].to_numpy(), "lane": tgt_lane, "s": shorter})
    saving = (per.groupby(["it", "rank", "launch", "lane"])["s"].sum()
              .groupby(level=[0, 1, 2]).max().groupby(level=[0, 1]).sum().groupby(level=0).max())
    return saving.reindex(iterations).fillna(0).to_numpy().astype(np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_local_saving_is_the_group_by_chain(seed):
    """whatif._local_saving (sorted reductions) against the pandas group-bys it replaced, on random
    lanes (launches of several warps, ranks, iterations, some iterations without a shortened
    segment, empty selections)."""
    import pandas as pd
    from profiler.analysis.whatif import _local_saving
    rng = np.random.default_rng(seed)
    n_lanes = int(rng.integers(1, 60))
    lane = pd.DataFrame({"iteration": rng.integers(0, 5, n_lanes), "rank": rng.integers(0, 4, n_lanes),
                         "launch": rng.integers(0, 6, n_lanes)})
    n = int(rng.integers(0, 200)) if seed % 7 else 0
    tgt_lane = rng.integers(0, n_lanes, n).astype(np.int64)
    shorter = rng.integers(0, 10_000, n).astype(np.int64)
    iterations = np.arange(-1, 7, dtype=np.int64)
    got = _local_saving(lane, tgt_lane, shorter, iterations)
    want = _local_saving_by_groupby(lane, tgt_lane, shorter, iterations)
    assert got.dtype == want.dtype and np.array_equal(got, want)
