"""profiler.analysis.stats: known answers for the run-level comparison of samples."""
import numpy as np
import pytest

from profiler.analysis import stats as S
from profiler.expect import Direction


def _runs(rng, n_runs, n, loc, sd, level_sd=0.0):
    """n_runs arrays of n samples: each run has its own level (sd level_sd) plus sample noise."""
    return [loc + rng.normal(0, level_sd) + rng.normal(0, sd, n) for _ in range(n_runs)]


def test_equal_distributions_are_within_noise():
    # a statistical known answer: over 60 draws of two equal sides, a difference is called at most
    # twice (the rule's false-positive rate measured on such draws: 0.5%, 1 in 200)
    calls = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        c = S.compare_samples(_runs(rng, 3, 50, 1000, 30), _runs(rng, 3, 50, 1000, 30), n_boot=500)
        calls += not c.within_noise
        assert c.noise_estimable and (c.runs_a, c.runs_b, c.n_a) == (3, 3, 150) and not c.heavy_tail
    assert calls <= 2
    rng = np.random.default_rng(7)
    c = S.compare_samples(_runs(rng, 3, 50, 1000, 30), _runs(rng, 3, 50, 1000, 30))
    assert c.verdict == S.WITHIN_NOISE and c.direction is None and c.ci_low < 0 < c.ci_high


def test_many_phases_at_once_are_corrected_for_multiple_tests():
    # seed 0 is one of the rare equal-sides draws whose 95% interval excludes 0: as one of 20
    # phases tested together it is not called
    rng = np.random.default_rng(0)
    a, b = _runs(rng, 3, 50, 1000, 30), _runs(rng, 3, 50, 1000, 30)
    assert S.compare_samples(a, b).verdict == S.FASTER
    c = S.compare_samples(a, b, tests=20)
    assert c.verdict == S.WITHIN_NOISE and not (c.ci_low <= 0 <= c.ci_high)


def test_a_shift_is_called_with_its_direction_and_size():
    rng = np.random.default_rng(1)
    a, b = _runs(rng, 3, 50, 1000, 30), _runs(rng, 3, 50, 1200, 30)
    c = S.compare_samples(a, b)
    assert c.verdict == S.SLOWER and c.direction is Direction.SLOWER and not c.within_noise
    assert 170 < c.ci_low < c.diff < c.ci_high < 230 and abs(c.diff_pct - 20) < 3
    assert abs(c.diff) > c.noise
    assert S.compare_samples(b, a).direction is Direction.FASTER


def test_a_heavy_tail_is_flagged():
    rng = np.random.default_rng(2)
    # 8% of the iterations take 8x longer (a preempted host, a page fault): the mean moves ~55%
    tail = [np.where(rng.random(60) < 0.08, 8000.0, 1000.0) + rng.normal(0, 20, 60) for _ in range(3)]
    c = S.compare_samples(tail, _runs(rng, 3, 60, 1000, 20))
    assert c.heavy_tail
    assert not S.compare_samples(_runs(rng, 3, 60, 1000, 20), _runs(rng, 3, 60, 1000, 20)).heavy_tail


def test_run_to_run_spread_larger_than_within_run_spread_is_noise():
    # each run has its own level (sd 30 ns) and little noise inside (sd 2 ns): two sides drawn from
    # the same levels differ by tens of ns between medians, which must not count as a change
    rng = np.random.default_rng(3)
    a, b = _runs(rng, 5, 30, 1000, 2, level_sd=30), _runs(rng, 5, 30, 1000, 2, level_sd=30)
    grouped = S.compare_samples(a, b, n_boot=1000)
    assert grouped.verdict == S.WITHIN_NOISE
    # the same samples pooled into one run per side: the interval only sees within-run noise,
    # and with one run nothing may be called
    pooled = S.compare_samples([np.concatenate(a)], [np.concatenate(b)], n_boot=1000)
    assert pooled.verdict == S.NO_NOISE_ESTIMATE and pooled.direction is None
    assert (grouped.ci_high - grouped.ci_low) > 2 * (pooled.ci_high - pooled.ci_low)


def test_a_difference_below_the_a_vs_a_spread_is_noise():
    # runs of A differ by 60 ns between themselves; B is 30 ns above A's pooled median
    a = [np.full(40, 970.0), np.full(40, 1000.0), np.full(40, 1030.0)]
    b = [np.full(40, 1030.0), np.full(40, 1030.0), np.full(40, 1030.0)]
    c = S.compare_samples(a, b)
    # pooled sd of the run medians: sqrt((900 + 0 + 900) / 4) = 21.2 ns; t(0.975, 4) = 2.776
    assert np.isclose(c.noise, 2.776 * np.sqrt(450) * np.sqrt(2 / 3), rtol=1e-3)
    assert c.diff == 30 and c.verdict == S.WITHIN_NOISE


@pytest.mark.parametrize("p,df,t", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 10, 2.228),
                                    (0.995, 3, 5.841), (0.9975, 4, 5.598), (0.95, 30, 1.697)])
def test_t_quantiles_match_the_tables(p, df, t):
    assert abs(S.t_quantile(p, df) - t) < 1e-3


def test_one_run_per_side_calls_nothing():
    rng = np.random.default_rng(4)
    c = S.compare_samples([rng.normal(1000, 5, 50)], [rng.normal(2000, 5, 50)])
    assert c.verdict == S.NO_NOISE_ESTIMATE and c.direction is None and not c.noise_estimable
    assert np.isnan(c.noise) and c.ci_low > 900          # the within-run interval is still reported


@pytest.mark.parametrize("a,b,verdict", [([], [np.ones(5)], S.ONLY_B), ([np.ones(5)], [], S.ONLY_A),
                                         ([np.ones(2)], [np.ones(2)], S.TOO_FEW)])
def test_missing_or_too_few_samples(a, b, verdict):
    assert S.compare_samples(a, b).verdict == verdict


def test_the_seed_is_fixed_and_unequal_run_lengths_work():
    rng = np.random.default_rng(5)
    a, b = [rng.normal(1000, 30, n) for n in (20, 35, 50)], [rng.normal(1010, 30, n) for n in (25, 40)]
    c1, c2 = S.compare_samples(a, b), S.compare_samples(a, b)
    assert (c1.ci_low, c1.ci_high) == (c2.ci_low, c2.ci_high)
