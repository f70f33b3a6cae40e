"""Compare A vs B: the run as the unit of replication, kernel time end to end, refused workloads,
phase sets, path changes, the verdict."""
import numpy as np
import pandas as pd

from profiler.analysis import compare
from profiler.analysis import stats as S
from profiler.expect import Cause, Direction
from profiler.synthetic import make_events
from tests.analysis.tables import TEST_REGISTRY, host, span, table


def _run(durations, phase="copy_out", extra=None, host_gap=0):
    """One span of `phase` per iteration with the given durations (one warp, back to back); a host
    span of `host_gap` ns before each iteration's kernel when asked."""
    rows, t = [], 0
    for it, d in enumerate(durations):
        if host_gap:
            rows.append(host(0, "dispatch", t, t + host_gap, iteration=it, launch=it))
        t0 = t + host_gap
        rows.append(span(0, 0, 0, phase, t0, t0 + int(d), iteration=it, launch=it))
        if extra:
            rows.append(span(0, 0, 0, extra, t0 + int(d), t0 + int(d) + 50, iteration=it, launch=it))
        t += 10_000 + host_gap
    return table(rows)


class _Rec:
    """A run as the viewer hands it over: events plus a manifest with its workload."""

    def __init__(self, events, **workload):
        self.events, self.launches = events, None
        self.manifest = {"name": "r", "workload": {"kind": "ep", "ranks": 1, "dtype": "bf16", **workload}}
        self.name = "r"


def test_same_distribution_is_within_noise():
    rng = np.random.default_rng(0)
    a = [_run(1000 + rng.normal(0, 30, 20)) for _ in range(3)]
    b = [_run(1000 + rng.normal(0, 30, 20)) for _ in range(3)]
    c = compare(a, b, registry=TEST_REGISTRY)
    row = c.per_phase.set_index(["kernel", "phase"]).loc[("dispatch", "copy_out")]
    assert row["verdict"] == S.WITHIN_NOISE and row["ci_low_ns"] < 0 < row["ci_high_ns"]
    assert (row["runs_a"], row["n_a"], row["n_b"]) == (3, 60, 60)
    assert c.end_to_end.iloc[0]["verdict"] == S.WITHIN_NOISE
    v = c.verdict
    assert (v.page, v.alarm, v.cause) == ("compare", False, Cause.SAME_CODE)


def test_shift_is_detected_with_its_direction():
    rng = np.random.default_rng(1)
    a = [_run(1000 + rng.normal(0, 20, 30)) for _ in range(3)]
    b = [_run(1200 + rng.normal(0, 20, 30)) for _ in range(3)]
    c = compare(a, b)
    row = c.per_phase.set_index(["kernel", "phase"]).loc[("dispatch", "copy_out")]
    assert row["verdict"] == S.SLOWER and 150 < row["ci_low_ns"] < row["diff_ns"] < row["ci_high_ns"] < 250
    assert np.isclose(row["diff_pct"], 100 * row["diff_ns"] / row["median_a_ns"])
    v = c.verdict
    assert (v.alarm, v.cause, v.direction) == (True, Cause.KNOB_CHANGE, Direction.SLOWER)
    assert v.names("dispatch", "copy_out") and v.where[0] == ("", "end-to-end")
    assert compare(b, a).verdict.direction is Direction.FASTER


def test_one_run_per_side_calls_nothing():
    rng = np.random.default_rng(1)
    c = compare(_run(1000 + rng.normal(0, 20, 30)), _run(1500 + rng.normal(0, 20, 30)))
    assert set(c.per_phase["verdict"]) == {S.NO_NOISE_ESTIMATE}
    v = c.verdict
    assert (v.alarm, v.cause, v.direction) == (False, Cause.NONE, None)
    assert "noise cannot be estimated" in v.detail


def test_end_to_end_is_kernel_time_not_host_gaps():
    # A and B run the same kernel; B's host waits 5 us before each launch: not kernel time
    rng = np.random.default_rng(2)
    a = [_run(1000 + rng.normal(0, 10, 10)) for _ in range(3)]
    b = [_run(1000 + rng.normal(0, 10, 10), host_gap=5000) for _ in range(3)]
    e = compare(a, b).end_to_end.iloc[0]
    assert e["verdict"] == S.WITHIN_NOISE and abs(e["diff_ns"]) < 30
    pr = compare(a, b).per_rank
    assert pr["rank"].tolist() == [0] and pr.iloc[0]["verdict"] == S.WITHIN_NOISE


def test_different_workloads_are_refused_and_shape_differences_flagged():
    ev = _run([1000] * 6)
    other = ev.assign(kernel=pd.Categorical(["combine"] * len(ev)))
    c = compare([_Rec(ev)] * 2, [_Rec(other)] * 2)
    assert c.refused and "kernels" in c.refused[0] and c.per_phase.empty
    assert (c.verdict.alarm, c.verdict.cause) == (False, Cause.NONE) and c.verdict.detail.startswith("refused")
    c = compare([_Rec(ev)] * 2, [_Rec(ev, kind="selftest")] * 2)
    assert c.refused and "kind" in c.refused[0]
    c = compare([_Rec(ev)] * 2, [_Rec(ev, dtype="fp8")] * 2)
    assert not c.refused and c.flags == ("dtype: bf16 in A, fp8 in B",)
    assert "workloads differ" in c.verdict.detail


def test_phase_sets_may_differ():
    a = [_run([1000] * 5, extra="wait_data")] * 2
    b = [_run([1000] * 5, extra="reduce")] * 2
    pp = compare(a, b).per_phase.set_index("phase")
    assert pp.loc["wait_data", "verdict"] == S.ONLY_A and pp.loc["reduce", "verdict"] == S.ONLY_B
    assert np.isnan(pp.loc["reduce", "median_a_ns"])


def test_too_few_samples_gives_no_interval():
    c = compare([_run([1000])] * 2, [_run([2000])] * 2)
    row = c.per_phase.set_index("phase").loc["copy_out"]
    assert row["verdict"] == S.TOO_FEW and np.isnan(row["ci_low_ns"])


def test_critical_path_changes():
    a = _run([1000] * 4, extra="wait_data")
    b = _run([1000] * 4, extra="reduce")
    cpc = compare(a, b, registry=TEST_REGISTRY).critical_path_changes.set_index("phase")
    assert cpc.loc["copy_out", "change"] == "stayed"
    assert cpc.loc["wait_data", "change"] == "left" and cpc.loc["reduce", "change"] == "entered"


def test_synthetic_same_code_groups_stay_within_noise():
    # four A/A comparisons of 3 simulated runs a side (12 seeds, the runs differ by their seed as
    # recordings do): the family-wise level keeps each within noise on every phase with
    # probability >= 95%; at most one of the four may call something
    kw = dict(ranks=2, blocks=2, chunks=6, iterations=6, scenario="ab", variant="a")
    runs = [make_events(seed=s, **kw)[0] for s in range(1, 13)]
    called = 0
    for i in range(0, 12, 6):
        for a, b in ((runs[i:i + 3], runs[i + 3:i + 6]), (runs[i:i + 6:2], runs[i + 1:i + 6:2])):
            c = compare(a, b, n_boot=400)
            called += c.verdict.cause is not Cause.SAME_CODE
    assert called <= 1


def test_synthetic_groups_interleaved():
    kw = dict(ranks=2, blocks=2, chunks=6, iterations=6, scenario="ab")
    runs_a = [make_events(seed=s, variant="a", **kw)[0] for s in (1, 3, 5)]
    runs_b = [make_events(seed=s, variant="b", ab_factor=1.3, **kw)[0] for s in (2, 4, 6)]
    diff = compare(runs_a, runs_b, n_boot=500)
    row = diff.per_phase.set_index(["kernel", "phase"]).loc[("dispatch", "send_chunk")]
    # send_chunk includes its wait_space, which shrinks as the copy slows: less than the planted 30%
    assert row["verdict"] == S.SLOWER and 5 < row["diff_pct"] < 30
    assert diff.verdict.cause is Cause.KNOB_CHANGE and diff.verdict.direction is Direction.SLOWER
    assert diff.verdict.names("dispatch", "send_chunk")


def test_host_calls_are_their_own_row_and_do_not_count_as_kernel_time():
    # the same kernel (1000 ns) launched by host calls of 5000 ns (A) or 1000 ns (B): the host call
    # row moves, kernel time and end-to-end do not
    rng = np.random.default_rng(3)

    def run(host_ns):
        ev = _run(np.full(12, 1000.0), host_gap=host_ns)
        h = ev["kind"] == "host"
        ev.loc[h, "end_ns"] = ev.loc[h, "end_ns"] + rng.integers(-40, 40, int(h.sum()))
        return ev
    c = compare([run(5000) for _ in range(3)], [run(1000) for _ in range(3)], registry=TEST_REGISTRY)
    rows = c.per_phase.set_index(["kernel", "phase"])
    hc = rows.loc[("dispatch", "host call")]
    assert hc["verdict"] == S.FASTER and abs(hc["diff_ns"] + 4000) < 100
    assert rows.loc[("dispatch", "")]["diff_ns"] == 0 and c.end_to_end.iloc[0]["diff_ns"] == 0
    assert c.verdict.names("dispatch", "host call")
