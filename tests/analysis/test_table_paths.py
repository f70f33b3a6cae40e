"""The per-chunk tables' numpy paths held equal, to the bit, to the pandas group-bys they replace
(issue 31: the stored results must not change by a byte). Random tables with the awkward cases:
missing names, names that are not categorical, values that are not integral (pandas answers
then), keys a search must miss."""
from __future__ import annotations

import importlib

import numpy as np
import pandas as pd
import pytest

C = importlib.import_module("profiler.analysis.compare")   # the package re-exports the function


def _table(rng, n: int, categorical: bool, missing: bool) -> pd.DataFrame:
    kernels = np.array(["dispatch", "combine", "notify"], dtype=object)[rng.integers(0, 3, n)]
    phases = np.array(["copy", "wait_data", "send", "recv"], dtype=object)[rng.integers(0, 4, n)]
    if missing:
        kernels[rng.random(n) < 0.05] = None
        phases[rng.random(n) < 0.05] = None
    df = pd.DataFrame({"iteration": rng.integers(3, 9, n), "kernel": kernels, "phase": phases})
    if categorical:
        # categories unused and out of order, as a run's tables carry the registry's names
        df["kernel"] = pd.Categorical(df["kernel"], categories=["notify", "unused", "dispatch", "combine"])
        df["phase"] = pd.Categorical(df["phase"], categories=["send", "recv", "copy", "wait_data", "idle"])
    return df


@pytest.mark.parametrize("categorical", [True, False])
@pytest.mark.parametrize("missing", [True, False])
@pytest.mark.parametrize("integral", [True, False])
@pytest.mark.parametrize("by_phase", [True, False])
def test_mean_samples_is_pandas_groupby_mean(categorical, missing, integral, by_phase):
    rng = np.random.default_rng(7)
    ev = _table(rng, 5000, categorical, missing)
    rows = np.flatnonzero(rng.random(len(ev)) < 0.7)
    v = rng.integers(0, 10**9, rows.size).astype(float)
    if not integral:
        v += rng.random(rows.size)
    cols = ["kernel", "phase"] if by_phase else ["kernel"]
    got = C._frame([C._mean_samples(ev, rows, by_phase, v)])
    want = C._frame([C._mean_samples_pandas(ev, rows, cols, v)])
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_mean_samples_large_sums_go_to_pandas():
    """Magnitudes adding up past 2**53: float sums could round, so pandas' compensated sum answers."""
    rng = np.random.default_rng(3)
    ev = _table(rng, 200, True, False)
    rows = np.arange(len(ev))
    v = rng.integers(2**50, 2**52, rows.size).astype(float)
    got = C._frame([C._mean_samples(ev, rows, True, v)])
    want = C._frame([C._mean_samples_pandas(ev, rows, ["kernel", "phase"], v)])
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_cut_of_is_reindex():
    rng = np.random.default_rng(5)
    ranks, launches = rng.integers(0, 8, 300), rng.integers(100, 100_000, 300)
    keys = pd.MultiIndex.from_arrays([ranks, launches]).drop_duplicates()
    cuts = pd.Series(rng.random(len(keys)) * 1e9, index=keys)
    cuts.iloc[::7] = np.nan
    # asked: known pairs, unknown pairs and ranks and launches outside the keys' range
    r = np.concatenate([keys.get_level_values(0).to_numpy(), rng.integers(-2, 11, 500)])
    la = np.concatenate([keys.get_level_values(1).to_numpy(), rng.integers(0, 200_000, 500)])
    want = cuts.reindex(pd.MultiIndex.from_arrays([r, la])).to_numpy(float)
    np.testing.assert_array_equal(C._cut_of(cuts, r, la), want)


def test_cut_of_duplicate_labels_refused_as_reindex_does():
    cuts = pd.Series([1.0, 2.0], index=pd.MultiIndex.from_arrays([[0, 0], [5, 5]]))
    with pytest.raises(ValueError):
        C._cut_of(cuts, np.array([0]), np.array([5]))


@pytest.mark.parametrize("integral", [True, False])
def test_lane_peer_sums_is_pandas_groupby_sum(integral):
    LT = importlib.import_module("profiler.analysis.lane_totals")
    rng = np.random.default_rng(11)
    n = 20_000
    lane, peer = rng.integers(0, 300, n), rng.integers(0, 8, n)
    w = rng.integers(1, 10**9, n).astype(float)
    if not integral:
        w += rng.random(n)
    got = pd.DataFrame(dict(zip(["lane", "rank", "w"], LT.lane_peer_sums(lane, peer, w, 300))))
    want = pd.DataFrame({"lane": lane, "rank": peer, "w": w}).groupby(["lane", "rank"], sort=False)["w"].sum().reset_index()
    key = ["lane", "rank"]
    pd.testing.assert_frame_equal(got.sort_values(key, ignore_index=True).astype({"lane": np.int64, "rank": np.int64}),
                                  want.sort_values(key, ignore_index=True).astype({"lane": np.int64, "rank": np.int64}),
                                  check_exact=True)


def test_exact_sum_says_when():
    from profiler.analysis.exactsum import exact_sum
    assert exact_sum(np.array([1.0, 2.0, 3.0]))
    assert not exact_sum(np.array([1.5, 2.0]))
    assert not exact_sum(np.array([2.0 ** 52, 2.0 ** 52]))
    assert not exact_sum(np.array([1.0, np.nan]))
    assert exact_sum(np.zeros(0))


RUNS = ["ep-host-late", "ep-barrier-straggler", "ep-rank-skew", "ep-timeout", "ep-zero-rank", "ll-host-b1",
        "ll-barrier-a0", "selftest-starved-warps", "torch-host-before-dispatch"]


@pytest.mark.parametrize("name", RUNS)
def test_op_plan_is_op_latency_pandas(name):
    """timemodel.op_latency's plan (grouping made once) against its pandas group-bys, at the recorded
    times and at times moved by a random amount per point (a what-if's re-timed graph)."""
    from pathlib import Path
    from profiler.analysis import graph as G
    from profiler.analysis import timemodel as TM
    from profiler.store.runstore import load_run
    run = load_run(Path(__file__).resolve().parents[2] / "traces" / name)
    g = G.build(run.events, run.manifest.get("registry"), run.launches)
    tm = TM.time_model(g)
    if tm.ops.empty:
        pytest.skip("no op occurrences")
    plan = TM.OpPlan.of(g, tm)
    assert plan is not None
    rng = np.random.default_rng(1)
    for times in (g.pt_t, g.pt_t + rng.integers(-5000, 5000, g.pt_t.size)):
        pd.testing.assert_frame_equal(plan.latency(g, times), TM._op_latency_pandas(g, times, tm), check_exact=True)


def test_op_plan_with_a_rank_that_never_launches():
    """An occurrence a rank never launched: its op latency is NaN, and so is its iteration's."""
    from profiler.analysis import graph as G
    from profiler.analysis import timemodel as TM
    from tests.analysis.tables import TEST_REGISTRY, span, table
    rows = [span(0, 0, 0, "send_chunk", 0, 100), span(1, 0, 0, "send_chunk", 0, 100)]
    rows += [span(0, 0, 0, "wait_data", 200, 900, 1, launch=1, iteration=1),
             span(1, 0, 0, "send_chunk", 150, 190, kernel="combine", launch=1, iteration=1),
             span(0, 0, 0, "send_chunk", 1000, 1300, launch=2, iteration=2),
             span(1, 0, 0, "send_chunk", 1100, 1200, launch=2, iteration=2)]
    g = G.build(table(rows), TEST_REGISTRY)
    tm = TM.time_model(g)
    assert (tm.ops["missing"] > 0).any()
    plan = TM.OpPlan.of(g, tm)
    got = plan.latency(g, g.pt_t)
    pd.testing.assert_frame_equal(got, TM._op_latency_pandas(g, g.pt_t, tm), check_exact=True)
    assert np.isnan(got["op_latency_ns"].to_numpy()[1]) and not np.isnan(got["op_latency_ns"].to_numpy()).all()


@pytest.mark.parametrize("keep", [None, 0, 5, 40])
def test_select_adjacent_ranks_in_one_pass(monkeypatch, keep):
    """run_tables.select's last pass for adjacent ranks (a median's two middle values: one pass over
    the windows' union) against the sorted durations, with the windows narrowed to single values,
    to a few values, or sorted at once; even counts whose two middle values differ widely."""
    RT = importlib.import_module("profiler.analysis.run_tables")
    from profiler.analysis.spill import Spill
    from tests.analysis.test_run_tables import _part
    if keep is not None:
        monkeypatch.setattr(RT, "SELECT_KEEP", keep)
    rng = np.random.default_rng(9)
    spill, parts, whole = Spill(), [], {0: [], 1: [], 2: []}
    for c in range(3):
        d0 = rng.lognormal(8, 4, 500 + 2 * c).astype(np.int64)            # even counts, skewed
        d1 = np.r_[np.full(20, 7), np.full(20, 10**9)]                       # two middle values far apart
        d2 = rng.integers(0, 4, 11 + c)
        parts.append(_part([0, 1, 2], [d0, d1, d2], f"a{c}", spill))
        for k, d in enumerate((d0, d1, d2)):
            whole[k].append(d)
    g = RT._groups(parts)
    n = g["count"].to_numpy()
    ks = [(n - 1) // 2, n // 2]
    for k, got in zip(ks, RT.select(parts, spill, g, ks)):
        np.testing.assert_array_equal(got, [np.sort(np.concatenate(whole[i]))[k[i]] for i in range(3)])


@pytest.mark.parametrize("integral", [True, False])
@pytest.mark.parametrize("kernel_as", ["object", "unicode"])
def test_max_then_sum_is_pandas_groupby(integral, kernel_as):
    """imbalance.max_then_sum (sorted segments) against the group-bys it replaces: same frame,
    dtypes and order; pandas answers for values that are not integral."""
    IM = importlib.import_module("profiler.analysis.imbalance")
    rng = np.random.default_rng(3)
    n = 5000
    kernel = np.array(["dispatch", "combine", "notify"], dtype=object)[rng.integers(0, 3, n)]
    cols = {"iteration": rng.integers(3, 9, n).astype(np.int32),
            "kernel": kernel if kernel_as == "object" else kernel.astype(str),
            "rank": rng.integers(0, 8, n), "waiter": rng.integers(0, 8, n).astype(np.int16),
            "launch": rng.integers(0, 40, n).astype(np.int32)}
    w = rng.integers(1, 10**9, n).astype(float) + (0 if integral else rng.random(n))
    inner = ["iteration", "kernel", "rank", "waiter", "launch"]
    for outer in (inner[:3], inner[:4]):
        want = (pd.DataFrame({**cols, "w": w}).groupby(inner, sort=True)["w"].max().groupby(level=outer).sum()
                .rename("x").reset_index())
        got = IM.max_then_sum(cols, w, inner, outer, "x")
        assert list(got.dtypes) == list(want.dtypes)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
