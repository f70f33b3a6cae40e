"""profiler.commands.ab: verdicts from rounds of samples whose answer is known, and the comparison record."""
import json

import numpy as np
import pytest

from profiler.commands import ab

from profiler.analysis import stats


def _rounds(rng, centers, n=20, sd=0.5):
    """Per round, n samples around that round's center (µs)."""
    return [list(rng.normal(c, sd, n)) for c in centers]


def test_equal_distributions_are_within_noise():
    rng = np.random.default_rng(1)
    v = ab.compare_metric("op", _rounds(rng, [100] * 4), _rounds(rng, [100] * 4))
    assert v.verdict == "within noise" and v.ci_low_us < 0 < v.ci_high_us
    assert (v.runs_a, v.runs_b, v.n_a, v.n_b) == (4, 4, 80, 80) and not v.moved


def test_a_shifted_side_is_found_in_the_right_direction():
    rng = np.random.default_rng(2)
    faster = ab.compare_metric("dispatch", _rounds(rng, [100] * 4), _rounds(rng, [90] * 4))
    assert faster.verdict == "faster" and faster.ci_high_us < 0
    assert faster.diff_pct == pytest.approx(-10, abs=1.0) and faster.median_b_us == pytest.approx(90, abs=0.5)
    slower = ab.compare_metric("dispatch", _rounds(rng, [100] * 4), _rounds(rng, [110] * 4))
    assert slower.verdict == "slower" and slower.ci_low_us > 0


def test_run_to_run_spread_larger_than_within_run_spread_is_not_a_difference():
    # every round has its own level (warm-up, clocks, placement): 95, 100, 105 µs, while the samples
    # of a round lie within 0.1 µs. B is 2 µs above A in every round, inside the run-to-run spread.
    rng = np.random.default_rng(3)
    levels = [95, 100, 105]
    a, b = _rounds(rng, levels, sd=0.1), _rounds(rng, [x + 2 for x in levels], sd=0.1)
    v = ab.compare_metric("op", a, b)
    assert v.verdict == "within noise"
    # the rounds are what makes it so: pooled as one run, the within-run interval alone excludes 0
    pooled = stats.compare_samples([np.concatenate(a)], [np.concatenate(b)])
    assert pooled.ci_low > 0 and pooled.verdict == stats.NO_NOISE_ESTIMATE


def test_one_round_per_side_says_noise_cannot_be_estimated():
    rng = np.random.default_rng(4)
    v = ab.compare_metric("op", _rounds(rng, [100]), _rounds(rng, [100]))
    assert any("run-to-run noise cannot be estimated" in n for n in v.notes)


def test_heavy_tail_flag_comes_from_the_statistics(monkeypatch):
    def fake_stats(a, b, **kw):
        return stats.SampleComparison(runs_a=len(a), runs_b=len(b), n_a=6, n_b=6, median_a=1e5, median_b=1e5,
                                      diff=0.0, diff_pct=0.0, ci_low=-1.0, ci_high=1.0, noise=2.0,
                                      noise_estimable=True, heavy_tail=True, verdict=stats.WITHIN_NOISE)
    monkeypatch.setattr(stats, "compare_samples", fake_stats)
    v = ab.compare_metric("op", [[1.0, 2.0, 3.0]] * 2, [[1.0, 2.0, 3.0]] * 2)
    assert v.heavy_tail is True
    assert "heavy tail" in ab.format_table([v])


def _round(side, i, level, profiled=False, n=10):
    rng = np.random.default_rng(ord(side) * 100 + i)  # not hash(): str hashes change per process (PYTHONHASHSEED)
    samples = {m: list(rng.normal(level, 0.3, n)) for m in ab.METRICS}
    return ab.RoundSamples(side, i, profiled, samples, f"ab-{side}-r{i}" if profiled else None)


def test_verdict_table_uses_timing_rounds_only():
    rounds = [_round(s, i, 100) for i in range(3) for s in "AB"]
    rounds += [_round("B", 3, 500, profiled=True), _round("A", 3, 100, profiled=True)]   # profiling perturbs
    table = ab.verdict_table(rounds)
    assert [r.metric for r in table] == list(ab.METRICS)
    assert all(r.verdict == "within noise" and (r.runs_a, r.runs_b) == (3, 3) for r in table)
    text = ab.format_table(table, "title")
    assert text.splitlines()[0] == "title" and "within noise" in text


def test_unknown_metric_is_refused():
    with pytest.raises(ab.ABError, match="unknown metrics"):
        ab.RoundSamples("A", 0, False, {"wall": [1.0]})


def test_record_round_trip_and_refusals(tmp_path):
    rounds = [_round(s, i, 100 if s == "A" else 95) for i in range(2) for s in "AB"]
    rec = ab.ComparisonRecord(sides={"A": {"ref": "main", "commit": "a" * 40}, "B": {"ref": "x", "commit": "b" * 40}},
                              workload={"tokens": 4096}, rounds=rounds, verdict=ab.verdict_table(rounds),
                              command="epscope ab main x", gpu="NVIDIA H200")
    path = rec.write(tmp_path)
    back = ab.ComparisonRecord.read(tmp_path)
    assert back.to_json() == rec.to_json() and path.name == ab.RECORD
    d = json.loads(path.read_text())
    d["format_version"] = ab.FORMAT_VERSION + 1
    path.write_text(json.dumps(d))
    with pytest.raises(ab.ABError, match="newer"):
        ab.ComparisonRecord.read(path)
    path.write_text("{}")
    with pytest.raises(ab.ABError, match="not an epscope-ab record"):
        ab.ComparisonRecord.read(path)
