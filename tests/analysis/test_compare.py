"""Compare A vs B: bootstrap interval of the median difference, verdicts, phase sets, path changes."""
import numpy as np
import pandas as pd

from profiler.analysis import compare
from profiler.analysis.compare import stats
from profiler.synthetic import make_events
from tests.analysis.tables import EP_REGISTRY, span, table


def _run(durations, phase="copy_out", extra=None):
    """One span of `phase` per iteration with the given durations (one warp, back to back)."""
    rows, t = [], 0
    for it, d in enumerate(durations):
        rows.append(span(0, 0, 0, phase, t, t + int(d), iteration=it, launch=it))
        if extra:
            rows.append(span(0, 0, 0, extra, t + int(d), t + int(d) + 50, iteration=it, launch=it))
        t += 10_000
    return table(rows)


def test_same_distribution_is_within_noise():
    rng = np.random.default_rng(0)
    a = [_run(1000 + rng.normal(0, 30, 20)) for _ in range(2)]
    b = [_run(1000 + rng.normal(0, 30, 20)) for _ in range(2)]
    c = compare(a, b, registry=EP_REGISTRY)
    row = c.per_phase.set_index("phase").loc["copy_out"]
    assert row["verdict"] == "within noise" and row["ci_low_ns"] < 0 < row["ci_high_ns"]
    assert row["n_a"] == 40 and row["n_b"] == 40
    assert c.end_to_end.iloc[0]["verdict"] == "within noise"
    assert c.verdict.startswith("end-to-end: within noise")


def test_shift_is_detected_with_its_direction():
    rng = np.random.default_rng(1)
    a = _run(1000 + rng.normal(0, 20, 30))
    b = _run(1200 + rng.normal(0, 20, 30))
    c = compare(a, b)
    row = c.per_phase.iloc[0]
    assert row["verdict"] == "slower" and 150 < row["ci_low_ns"] < row["diff_ns"] < row["ci_high_ns"] < 250
    assert np.isclose(row["diff_pct"], 100 * row["diff_ns"] / row["median_a_ns"])
    assert row["non_overlap_share"] == 1.0
    assert c.verdict.startswith("B is") and "slower end-to-end" in c.verdict
    assert compare(b, a).per_phase.iloc[0]["verdict"] == "faster"


def test_non_overlap_share_counts_ordered_pairs_and_half_ties():
    rng = np.random.default_rng(2)
    r = stats(np.array([1.0, 2, 3, 4]), np.array([2.0, 3, 4, 5]), n_boot=200, rng=rng, alpha=0.05)
    # pairs with b > a: 10 of 16, ties: 3 of 16
    assert np.isclose(r["non_overlap_share"], (10 + 1.5) / 16)


def test_phase_sets_may_differ():
    a = _run([1000] * 5, extra="wait_data")
    b = _run([1000] * 5, extra="reduce")
    pp = compare(a, b).per_phase.set_index("phase")
    assert pp.loc["wait_data", "verdict"] == "only in A" and pp.loc["reduce", "verdict"] == "only in B"
    assert np.isnan(pp.loc["reduce", "median_a_ns"])


def test_too_few_samples_gives_no_interval():
    c = compare(_run([1000, 1100]), _run([2000, 2100]))
    row = c.per_phase.iloc[0]
    assert row["verdict"] == "too few samples" and np.isnan(row["ci_low_ns"])


def test_critical_path_changes():
    a = _run([1000] * 4, extra="wait_data")
    b = _run([1000] * 4, extra="reduce")
    cpc = compare(a, b, registry=EP_REGISTRY).critical_path_changes.set_index("phase")
    assert cpc.loc["copy_out", "change"] == "stayed"
    assert cpc.loc["wait_data", "change"] == "left" and cpc.loc["reduce", "change"] == "entered"


def test_synthetic_groups_interleaved():
    kw = dict(ranks=2, blocks=2, chunks=6, iterations=6, scenario="ab")
    runs_a = [make_events(seed=s, variant="a", **kw)[0] for s in (1, 3)]
    runs_b = [make_events(seed=s, variant="b", ab_factor=1.3, **kw)[0] for s in (2, 4)]
    same = compare(runs_a, [make_events(seed=s, variant="a", **kw)[0] for s in (5, 6)], n_boot=500)
    assert same.end_to_end.iloc[0]["verdict"] == "within noise"
    diff = compare(runs_a, runs_b, n_boot=500)
    row = diff.per_phase.set_index(["kernel", "phase"]).loc[("dispatch", "send_chunk")]
    # send_chunk includes its wait_space, which shrinks as the copy slows: less than the planted 30%
    assert row["verdict"] == "slower" and 5 < row["diff_pct"] < 30
    assert diff.end_to_end.iloc[0]["verdict"] == "slower"


def test_run_to_run_variation_widens_the_interval():
    # five runs per side, each with its own level (sd 30 ns) and little noise inside a run (2 ns)
    rng = np.random.default_rng(3)
    levels_a, levels_b = 1000 + rng.normal(0, 30, 5), 1000 + rng.normal(0, 30, 5)
    a = [_run(lv + rng.normal(0, 2, 30)) for lv in levels_a]
    b = [_run(lv + rng.normal(0, 2, 30)) for lv in levels_b]
    grouped = compare(a, b, n_boot=1000).per_phase.iloc[0]
    assert grouped["verdict"] == "within noise"
    # the same samples as one run per side: only the within-run noise would count
    one = [pd.concat(x, ignore_index=True).assign(iteration=np.arange(150, dtype=np.int32)) for x in (a, b)]
    pooled = compare(one[0], one[1], n_boot=1000).per_phase.iloc[0]
    width = lambda r: r["ci_high_ns"] - r["ci_low_ns"]
    assert width(grouped) > 2 * width(pooled)
