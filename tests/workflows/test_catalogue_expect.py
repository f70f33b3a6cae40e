"""The catalogue's measurements and expect blocks, on hand-built runs whose numbers are known
(tests/workflows/catalogue_runs.py): each planted cause passes its checks when the recording shows
it and fails them when it does not; finalize writes blocks that profiler.groundtruth.expect reads back."""
import json
from pathlib import Path

import pytest

from profiler.workflows import catalogue as C
from profiler.workflows import catalogue_expect as X
from profiler.groundtruth.expect import Cause, Direction, from_manifest
from profiler.store.runstore import load_run

from .catalogue_runs import fake_run

BALANCED_ROWS = (8163, 8157)


def _facts(name, rows=BALANCED_ROWS, **per_rank):
    out = []
    for r in (0, 1):
        kw = {k: v[r] for k, v in per_rank.items()}
        out.append(C.RankFacts(name, r, recv_rows=rows[r], **kw))
    return out


def _run(key):
    return C.plan([key])[0]


# -- measurements --------------------------------------------------------------------------------
def test_kernel_times_and_op_latency_take_the_slowest_rank(tmp_path):
    rec = load_run(fake_run(tmp_path / "r", kernel_us={"combine": (250, 300)}))
    lat = X.op_latency_us(rec.launches, "combine")
    assert lat.to_dict() == {2: 300.0, 3: 300.0}
    assert X.kernel_median_us(rec.launches)["combine"] == [250.0, 300.0]


def test_idle_warp_share_counts_warps_without_a_work_span(tmp_path):
    rec = load_run(fake_run(tmp_path / "r", dispatch_blocks=24, working_blocks=3))
    waits = X.wait_phases(rec.manifest)
    # from the run's registry: a wait is not work (stage_wait: a stall on the warp's own copy)
    assert waits == {"wait_data", "wait_hook", "stage_wait"}
    assert X.idle_warp_share(rec.events, rec.launches, waits, "dispatch") == pytest.approx(21 / 24)
    with pytest.raises(ValueError, match="no reduce_kernel launch"):
        X.idle_warp_share(rec.events, rec.launches, waits, "reduce_kernel")


def test_host_entry_lag_per_iteration(tmp_path):
    rec = load_run(fake_run(tmp_path / "r", host_lag_ms={1: 10.0}))
    assert X.host_entry_lag_ms(rec.launches, "layout", 1) == [10.0, 10.0]
    assert X.host_entry_lag_ms(rec.launches, "layout", 0) == [-10.0, -10.0]
    assert X.host_entry_lag_ms(rec.launches, "layout", 5) == []


def test_last_arrivals_name_the_late_rank_and_its_lead(tmp_path):
    rec = load_run(fake_run(tmp_path / "r", late_rank=0, late_us=2000.0))
    a = X.last_arrivals(rec.events, "notify", "rank_start")
    assert a["last_rank"].tolist() == [0, 0] and a["lead_us"].tolist() == [2000.0, 2000.0]
    assert a["occurrence"].tolist() == [5, 7]


# -- one expect block per planted cause ----------------------------------------------------------
def _expect(run, facts, rec):
    return X.build_expect(run, facts, rec, "python -m profiler.workflows.catalogue --out x")


def _failed(checks):
    return [c.what for c in checks if not c.ok]


def test_balanced(tmp_path):
    run = _run("balanced")
    e, checks = _expect(run, _facts(run.name), load_run(fake_run(tmp_path / "r")))
    assert e.cause is Cause.NONE and not e.alarm and e.effect is None and _failed(checks) == []
    # an accidental host lag (first-call costs) must not pass for a balanced run
    _, checks = _expect(run, _facts(run.name), load_run(fake_run(tmp_path / "lag", host_lag_ms={0: 92.0})))
    assert _failed(checks) == ["largest host entry lag between ranks (ms, layout)"]


def test_rank_skew(tmp_path):
    run = _run("rank-skew")
    rec = load_run(fake_run(tmp_path / "r"))
    e, checks = _expect(run, _facts(run.name, rows=(8192, 2600)), rec)
    assert (e.cause, e.rank, e.kernel, e.phase) == (Cause.RANK_IMBALANCE, 0, "dispatch", "copy_out")
    assert e.effect.metric == "rows_received_max_over_median"
    assert e.effect.value == pytest.approx(8192 / 5396, abs=1e-3)
    assert e.extra["waiting_ranks"] == [1] and e.extra["recv_rows"] == [8192, 2600] and _failed(checks) == []
    _, checks = _expect(run, _facts(run.name, rows=(2600, 8192)), rec)   # the other rank got the rows
    assert _failed(checks) == ["the planted rank receives the most rows"]
    _, checks = _expect(run, _facts(run.name), rec)                       # no skew at all
    assert _failed(checks) == ["rows received, max / median"]


def test_zero_rank_names_the_starved_rank(tmp_path):
    run = _run("zero-rank")
    rec = load_run(fake_run(tmp_path / "r"))
    e, checks = _expect(run, _facts(run.name, rows=(0, 8192)), rec)
    assert (e.cause, e.rank) == (Cause.RANK_IMBALANCE, 1) and e.extra["starved_rank"] == 0
    assert e.effect.value == 2.0 and _failed(checks) == []
    _, checks = _expect(run, _facts(run.name, rows=(10, 8192)), rec)
    assert _failed(checks) == ["the starved rank 0 receives no row"]


def test_few_tokens(tmp_path):
    run = _run("few-tokens")
    e, checks = _expect(run, _facts(run.name, rows=(64, 64)), load_run(fake_run(tmp_path / "r", working_blocks=4)))
    assert (e.cause, e.rank, e.kernel) == (Cause.STARVED_WARPS, None, "dispatch")
    assert e.effect.metric == "idle_warp_share" and e.effect.value == pytest.approx(20 / 24, abs=1e-3)
    assert _failed(checks) == []
    _, checks = _expect(run, _facts(run.name), load_run(fake_run(tmp_path / "busy")))
    assert _failed(checks) == ["share of dispatch warps with no work span"]


def test_host_late_records_the_delay_as_slept_and_as_recorded(tmp_path):
    run = _run("host-late")
    rec = load_run(fake_run(tmp_path / "r", host_lag_ms={1: 10.1}))
    facts = _facts(run.name, host_delays_ms=([], [10.08, 10.12]))
    e, checks = _expect(run, facts, rec)
    assert (e.cause, e.rank, e.kernel) == (Cause.HOST_BOUND, 1, "layout")
    assert (e.effect.metric, e.effect.value, e.effect.unit) == ("host_delay_ms", 10.1, "ms")
    assert e.extra["entry_lag_ms"] == [10.1, 10.1] and _failed(checks) == []
    # the sleep happened but the recording shows no lag: not ground truth
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "none")))
    assert _failed(checks) == ["recorded host entry lag of rank 1 (ms, per profiled op)"]


def test_barrier_straggler_is_a_device_delay_with_the_host_on_time(tmp_path):
    run = _run("barrier-straggler")
    facts = _facts(run.name, device_delays_us=([5003.0, 5001.0], []))
    e, checks = _expect(run, facts, load_run(fake_run(tmp_path / "r", late_rank=0, late_us=4990.0)))
    assert (e.cause, e.rank, e.kernel, e.phase) == (Cause.BARRIER_STRAGGLER, 0, "notify", "rank_start")
    assert (e.effect.metric, e.effect.value) == ("device_delay_us", 5002.0)
    assert e.extra["last_arrivals"]["last_rank"] == [0, 0] and _failed(checks) == []
    # the same arrivals with the straggler's host late: that is host_bound, not this scenario
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "host", late_rank=0, late_us=4990.0,
                                                      host_lag_ms={0: 2.0})))
    assert _failed(checks) == ["host entry lag of rank 0 (ms)"]
    # the other rank arrived last
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "other", late_rank=1, late_us=4990.0)))
    assert "last arriver at notify rank_start, per occurrence" in _failed(checks)


def test_timeout_checks_the_kernels_error_report(tmp_path):
    run = _run("timeout")
    rep0 = {"kind": "timeout", "rank": 0, "kernel": "dispatch", "phase": "wait_data", "is_barrier": False,
            "chunk": 3, "peer": 1, "epoch": 1}
    rep1 = {"kind": "timeout", "rank": 1, "kernel": "barrier", "phase": "rank_start", "is_barrier": True,
            "chunk": 0, "peer": 0, "epoch": 2}
    facts = _facts(run.name, error_report=(rep0, rep1), error=("EPTimeoutError: a", "EPTimeoutError: b"))
    rec = load_run(fake_run(tmp_path / "r", status="timeout"))
    e, checks = _expect(run, facts, rec)
    assert (e.cause, e.rank, e.peer, e.kernel, e.phase) == (Cause.TIMEOUT, 0, 1, "dispatch", "wait_data")
    assert (e.effect.metric, e.effect.value) == ("wait_bound_s", 1.0)
    assert e.extra["error_reports"]["1"]["kernel"] == "barrier" and _failed(checks) == []
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "ok")))
    assert _failed(checks) == ["run status"]
    swapped = _facts(run.name, error_report=(rep1, rep0))
    _, checks = _expect(run, swapped, rec)
    assert _failed(checks) == ["rank 0's first device error"]


# -- comparisons ---------------------------------------------------------------------------------
def _record_group(tmp_path, key, b_combine_us):
    runs = C.plan([key])
    recorded = {}
    for r in runs:
        us = 250 if r.side == "A" else b_combine_us
        recorded[r.name] = load_run(fake_run(tmp_path / r.name, kernel_us={"combine": (us - 5, us + r.replicate)}))
    return runs, recorded


def test_ab_group_effect_and_its_check(tmp_path):
    runs, recorded = _record_group(tmp_path, "ab-sms", 200)
    g = X.group_effect(recorded, runs)
    assert g.median_a_us["combine"] == 251.0 and g.median_b_us["combine"] == 201.0
    assert g.change["combine"] == pytest.approx(201 / 251 - 1, abs=1e-4) and g.change["dispatch"] == 0.0
    b1 = next(r for r in runs if r.name == "ep-ab-sms-b1")
    e, checks = X.build_expect(b1, _facts(b1.name), recorded[b1.name], "cmd", g)
    c = e.comparison
    assert e.cause is Cause.NONE and (c.group, c.side, c.replicate, c.knob, c.value) == ("ab-sms", "B", 1, "num_sms", 64)
    assert (c.outcome, c.kernel, c.direction) == (Cause.KNOB_CHANGE, "combine", Direction.FASTER)
    assert e.effect.metric == "op_latency_change" and _failed(checks) == []
    # a knob that moved nothing (or the wrong way) is not an A/B ground truth
    runs, recorded = _record_group(tmp_path / "flat", "ab-sms", 245)
    g = X.group_effect(recorded, runs)
    _, checks = X.build_expect(b1, _facts(b1.name), recorded[b1.name], "cmd", g)
    assert _failed(checks) == ["combine op latency B / A - 1 over the group's runs"]


def test_aa_sides_carry_same_code_and_no_knob(tmp_path):
    runs, recorded = _record_group(tmp_path, "aa", 250)
    g = X.group_effect(recorded, runs)
    e, checks = X.build_expect(runs[3], _facts(runs[3].name), recorded[runs[3].name], "cmd", g)
    c = e.comparison
    assert (c.outcome, c.knob, c.value, c.direction, c.side, c.replicate) == (Cause.SAME_CODE, None, None, None, "B", 1)
    assert e.effect is None and not e.alarm and _failed(checks) == []
    assert e.extra["group_measured"]["runs"] == {"A": ["ep-aa-a0", "ep-aa-a1", "ep-aa-a2"],
                                                 "B": ["ep-aa-b0", "ep-aa-b1", "ep-aa-b2"]}


# -- issue 11's measured comparisons ------------------------------------------------------------
def _tma_group(tmp_path, a_dispatch_us, b_dispatch_us, a_stall_us, b_stall_us):
    runs = C.plan(["ab-tma-buffers"])
    recorded = {}
    for r in runs:
        us, st = (a_dispatch_us, a_stall_us) if r.side == "A" else (b_dispatch_us, b_stall_us)
        recorded[r.name] = load_run(fake_run(tmp_path / r.name, kernel_us={"dispatch": (us, us + r.replicate)},
                                             stall_us={"dispatch": (st, st), "combine": (40, 40)}))
    return runs, recorded


def test_measured_group_names_the_op_and_phase_that_moved(tmp_path):
    runs, recorded = _tma_group(tmp_path, 250, 200, 900, 300)
    g = X.group_effect(recorded, runs)
    assert g.median_a_us["dispatch/stage_wait"] == 900 and g.change["combine/stage_wait"] == 0.0
    b2 = next(r for r in runs if r.name == "ep-ab-tma-buffers-b2")
    e, checks = X.build_expect(b2, _facts(b2.name), recorded[b2.name], "cmd", g)
    c = e.comparison
    assert (c.knob, c.value, c.kernel, c.phase, c.direction) == ("num_tma_buffers", 3, "dispatch", "stage_wait",
                                                                  Direction.FASTER)
    assert e.effect.metric == "op_latency_change" and e.effect.value == g.change["dispatch"] and _failed(checks) == []


def test_measured_group_falls_back_to_the_phase_when_no_op_moved(tmp_path):
    runs, recorded = _tma_group(tmp_path, 250, 245, 900, 300)
    g = X.group_effect(recorded, runs)
    e, checks = X.build_expect(runs[1], _facts(runs[1].name), recorded[runs[1].name], "cmd", g)
    c = e.comparison
    assert (c.kernel, c.phase, c.direction) == ("dispatch", "stage_wait", Direction.FASTER)
    assert e.effect.metric == "phase_time_change" and e.effect.value == pytest.approx(-2 / 3, abs=1e-3)
    assert _failed(checks) == []


def test_measured_group_where_nothing_moved_fails_and_says_what_it_measured(tmp_path):
    runs, recorded = _tma_group(tmp_path, 250, 247, 900, 880)
    g = X.group_effect(recorded, runs)
    e, checks = X.build_expect(runs[1], _facts(runs[1].name), recorded[runs[1].name], "cmd", g)
    failed = [c for c in checks if not c.ok]
    assert len(failed) == 1 and failed[0].what.startswith("what moved most")
    assert abs(failed[0].measured) < X.MIN_KNOB_EFFECT
    assert e.extra["group_measured"]["change"]["dispatch/stage_wait"] == pytest.approx(880 / 900 - 1, abs=1e-4)


def test_hook_group_measures_the_halves_and_the_blocks_during_the_copies(tmp_path):
    runs = C.plan(["ab-hook"])
    recorded, facts = {}, {}
    for r in runs:
        hook = r.side == "B"
        recorded[r.name] = load_run(fake_run(tmp_path / r.name, hook=hook))
        facts[r.name] = _facts(r.name, gemm_us=([1500.0, 1510.0], [1502.0, 1505.0]) if hook else
                               ([1600.0, 1620.0], [1610.0, 1590.0]))
    g = X.group_effect(recorded, runs, facts=facts)
    # dispatch: 200 µs whole (A) against 60 + 3 + 50 µs of send, signal, receive (B); combine 250 against 73
    assert g.median_b_us["dispatch"] == 113 and g.median_b_us["combine"] == 73
    assert g.facts["gemm_us"] == {"A": 1605.0, "B": 1503.5}
    b0 = next(r for r in runs if r.name == "ep-ab-hook-b0")
    e, checks = X.build_expect(b0, facts[b0.name], recorded[b0.name], "cmd", g)
    c = e.comparison
    assert (c.knob, c.value, c.kernel, c.phase, c.direction) == ("return_recv_hook", True, "combine", None,
                                                                  Direction.FASTER)
    assert e.extra["blocks_during_copies"] == 0 and _failed(checks) == []
    assert e.extra["gemm_us"] == {"0": [1500.0, 1510.0], "1": [1502.0, 1505.0]}
    a0 = next(r for r in runs if r.name == "ep-ab-hook-a0")
    e, checks = X.build_expect(a0, facts[a0.name], recorded[a0.name], "cmd", g)
    assert "blocks_during_copies" not in e.extra and e.comparison.value is False


def test_blocks_during_copies_counts_kernels_overlapping_the_copy_window(tmp_path):
    rec = load_run(fake_run(tmp_path / "h", hook=True))
    assert X.blocks_during_copies(rec.events, rec.launches) == 0
    la = rec.launches.copy()
    # rank 0's first dispatch: send, signal, receive; a receive (1 recorded block) that started
    # while the copies flew, before the signal, is counted
    d = la[(la["rank"] == 0) & (la["kernel"].astype(str) == "dispatch")].sort_values("gpu_begin_ns")
    send, sig, recv = d.index[:3]
    la.loc[recv, "gpu_begin_ns"] = int(la.loc[sig, "gpu_begin_ns"]) - 2_000
    assert X.blocks_during_copies(rec.events, la) == 1
    ev = rec.events
    assert X.blocks_during_copies(ev[ev["phase"].astype(str) != "publish_hook"], rec.launches) is None
    assert int(la.loc[send, "gpu_end_ns"]) < int(la.loc[sig, "gpu_begin_ns"])


# -- the whole catalogue -------------------------------------------------------------------------
def test_finalize_writes_readable_expect_blocks_and_reports_problems(tmp_path):
    runs = C.plan(["balanced", "host-late", "ab-sms"])
    per_rank = [[], []]
    for r in runs:
        if r.name == "ep-host-late":
            fake_run(tmp_path / r.name, host_lag_ms={1: 10.2})
            facts = _facts(r.name, host_delays_ms=([], [10.2, 10.2]))
        elif r.scenario.pair is not None:
            us = 250 if r.side == "A" else 200
            fake_run(tmp_path / r.name, kernel_us={"combine": (us, us)})
            facts = _facts(r.name)
        else:
            fake_run(tmp_path / r.name)
            facts = _facts(r.name)
        per_rank[0].append(facts[0])
        per_rank[1].append(facts[1])
    rep = X.finalize(runs, per_rank, tmp_path, "python -m profiler.workflows.catalogue --out t")
    assert rep.ok, rep.text
    for r in runs:
        m = json.loads((tmp_path / r.name / "manifest.json").read_text())
        e = from_manifest(m)
        assert e.cause is r.scenario.truth.cause and e.planted_by == "python -m profiler.workflows.catalogue --out t"
        assert all(c["ok"] for c in e.extra["checks"])
        assert load_run(tmp_path / r.name).manifest["expect"]["schema"] == 1   # the run still opens
    assert "ep-host-late" in rep.text and "host_delay_ms=10.2 ms" in rep.text
    # a run that was not recorded, and one whose plant did not show, make the report fail
    runs2 = C.plan(["balanced", "rank-skew"])
    fake_run(tmp_path / "again" / "ep-rank-skew")
    rep = X.finalize(runs2, [[f] for f in _facts("ep-rank-skew")], tmp_path / "again", "cmd")
    assert not rep.ok
    assert "PROBLEM ep-balanced: not recorded" in rep.text
    assert "PROBLEM ep-rank-skew: check failed: rows received, max / median" in rep.text


def test_readme_section_is_generated_from_the_expect_blocks(tmp_path):
    run = _run("host-late")
    fake_run(tmp_path / run.name, host_lag_ms={1: 10.0})
    facts = _facts(run.name, host_delays_ms=([], [10.0, 10.0]))
    X.finalize([run], [[f] for f in facts], tmp_path, "python -m profiler.workflows.catalogue")
    fake_run(tmp_path / "ep-not-catalogue")     # no expect block: not listed
    (tmp_path / "README.md").write_text("# Bundled traces\n\nintro\n")
    X.rewrite_readme(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# Bundled traces\n\nintro\n") and text.count(X.README_BEGIN) == 1
    line = next(l for l in text.splitlines() if l.startswith("- `ep-host-late`"))
    assert "host_bound (rank 1, kernel layout)" in line and "host_delay_ms = 10 ms" in line and "abcdef0" in line
    assert "ep-not-catalogue" not in text
    assert "No Perfetto trace bundled" in line     # fake_run writes none
    X.rewrite_readme(tmp_path)   # idempotent: the section is replaced, not appended again
    assert (tmp_path / "README.md").read_text() == text


def _group(a: dict, b: dict) -> "X.GroupEffect":
    change = {k: (b[k] / a[k] - 1.0 if a[k] and b.get(k) is not None else None) for k in a}
    return X.GroupEffect(a, b, change, {"A": ["a0", "a1"], "B": ["b0", "b1"]})


def test_what_moved_names_the_phase_only_when_both_sides_have_it():
    # the 2xH200 recording of ab-tma-buffers at d2eb966: B's stage_wait spans vanished (0 µs), the
    # op moved -25 %: Compare has no B samples of that phase, so the op carries the comparison
    gone = _group({"dispatch": 313.1, "combine": 275.3, "dispatch/stage_wait": 14.0, "combine/stage_wait": 1.0},
                  {"dispatch": 235.2, "combine": 304.0, "dispatch/stage_wait": 0.0, "combine/stage_wait": 0.0})
    kernel, phase, ch = X.what_moved(gone, phase="stage_wait")
    assert (kernel, phase) == ("dispatch", None) and ch == pytest.approx(235.2 / 313.1 - 1)
    # both sides stall, the phase moved with the op: it is named
    kept = _group({"dispatch": 313.1, "combine": 275.3, "dispatch/stage_wait": 14.0, "combine/stage_wait": 1.0},
                  {"dispatch": 235.2, "combine": 276.0, "dispatch/stage_wait": 3.0, "combine/stage_wait": 1.0})
    assert X.what_moved(kept, phase="stage_wait")[:2] == ("dispatch", "stage_wait")


def _story_manifest(group: str, side: str, replicate: int, cause: str = "none") -> dict:
    return {"git": {"commit": "abcdef0123"},
            "expect": {"cause": cause, "note": "24 SMs (A) against 64 SMs (B)", "planted_by": "python -m ep_core.catalogue",
                       "effect": {"metric": "op_latency_change", "value": -0.25, "unit": "fraction"},
                       "comparison": {"group": group, "side": side, "replicate": replicate, "outcome": "knob_change"}}}


def test_a_comparison_story_is_one_line_naming_both_sides_runs():
    runs = [(f"ep-ab-sms-{s.lower()}{i}", _story_manifest("ab-sms", s, i), False) for s in "AB" for i in range(3)]
    line = X._story_line(runs)
    assert line.startswith("- `ep-ab-sms-a0..2` vs `ep-ab-sms-b0..2` (ab-sms: knob_change, 6 runs): none: 24 SMs")
    assert "op_latency_change = -0.25 fraction" in line and "abcdef0" in line and "No Perfetto trace" in line
    runs[4] = (runs[4][0], _story_manifest("ab-sms", "B", 1, "starved_warps"), True)
    assert "A: none; B: none, starved_warps" in X._story_line(runs)
    assert X._span(["ep-x-a0", "ep-x-a2"]) == "`ep-x-a0`, `ep-x-a2`"   # not a range: named one by one


def test_the_bundled_readme_holds_the_catalogue_section_of_the_bundled_runs():
    traces = Path(__file__).resolve().parents[2] / "traces"
    assert X.readme_section(traces) in (traces / "README.md").read_text(), \
        "traces/README.md is stale: python -m profiler.workflows.catalogue --readme traces"


# -- issue 24: late entry and upstream GPU work ----------------------------------------------------
def test_op_latency_after_entry_leaves_the_late_peers_wait_out(tmp_path):
    # rank 1 enters combine 100 µs late; rank 0's combine spins 350 µs (100 of them waiting for it)
    rec = load_run(fake_run(tmp_path / "r", kernel_us={"combine": (350, 250)}, entry_lag_us={(1, "combine"): 100}))
    assert X.op_latency_us(rec.launches, "combine").tolist() == [350.0, 350.0]
    assert X.op_after_entry_us(rec.launches, "combine").tolist() == [250.0, 250.0]
    lags = X.entry_lags_us(rec.launches, 1)
    assert set(lags["kernel"]) == {"notify", "dispatch", "barrier", "combine"}     # layout is local
    assert lags[lags["kernel"] == "combine"]["lag_us"].tolist() == [100.0, 100.0]


@pytest.mark.parametrize("shares, want", [
    ([0.40, 0.36, 0.50], (Cause.HOST_BOUND, "host")),        # past 1.25 x the 25 % alarm share: named
    ([0.10, 0.15, 0.05], (Cause.NONE, None)),                  # under 0.25 / 1.25: nothing called
    ([0.24, 0.27, 0.30], (Cause.NONE, "host")),                # between: a page may name it, nothing else
    ([], (Cause.NONE, None)),
])
def test_a_late_entry_is_material_by_its_measured_share(shares, want):
    assert X.late_entry_truth("host", shares) == want
    if want[1] is not None and want[0] is not Cause.NONE:
        assert X.late_entry_truth("gpu", shares) == (Cause.RANK_IMBALANCE, "gpu")


def _late_entry_run(tmp_path, name, run, scale=1.0, lag=True, sleeps=None):
    d = run.scenario.random_host_delay
    its = range(run.scenario.warm_iters, run.scenario.warm_iters + run.scenario.profile_iters)
    seq = d.sequence(run.replicate, its)
    first = {"dispatch": "notify", "combine": "barrier"}           # the op's first launch
    lags = {(d.rank, first[op], it): us * scale for it, op, us in seq} if lag else {}
    held = sleeps if sleeps is not None else [{"iteration": it, "op": op, "planned_us": us, "slept_us": us + 0.4}
                                              for it, op, us in seq]
    facts = _facts(run.name, host_sleeps=([], held) if d.rank == 1 else (held, []))
    return facts, load_run(fake_run(tmp_path / name, iterations=tuple(its), entry_lag_us=lags))


def _one_run_expect(run, facts, rec):
    """build_expect of one side's run alone; the group check (>= 2 runs a side) is left out."""
    e, checks = X.build_expect(run, facts, rec, "cmd", X.group_effect({run.name: rec}, [run]))
    return e, [c for c in checks if "over the group's runs" not in c.what]


def test_late_entry_ab_side_names_the_late_host_where_material(tmp_path):
    runs = C.plan(["late-entry-ab"])
    run = next(r for r in runs if r.name == "ep-late-entry-ab-a1")
    # 5x the planted delays (0.3-1.5 ms per op) on a ~0.55 ms iteration: far past the alarm share
    facts, rec = _late_entry_run(tmp_path, "big", run, scale=5.0)
    e, checks = _one_run_expect(run, facts, rec)
    assert (e.cause, e.rank, e.late_entry) == (Cause.HOST_BOUND, 1, "host") and _failed(checks) == []
    assert e.comparison.kernel == "combine" and e.extra["late_entry"]["late_entry_share_median"] > 0.3125
    back = Expect_from(e)
    assert back.late_entry == "host" and back == e
    # a tenth of them: under the share, nothing to name
    facts, rec = _late_entry_run(tmp_path, "small", run, scale=0.1)
    e, checks = _one_run_expect(run, facts, rec)
    assert (e.cause, e.rank, e.late_entry) == (Cause.NONE, None, None)
    assert _failed(checks) == ["rank 1's GPU entry lag per iteration (µs, median, cross-rank ops)"]


def test_late_entry_checks_fail_when_the_delay_did_not_happen(tmp_path):
    run = C.plan(["late-entry-aa"])[0]
    facts, rec = _late_entry_run(tmp_path, "nolag", run, lag=False)
    e, checks = _one_run_expect(run, facts, rec)
    assert _failed(checks) == ["rank 1's GPU entry lag per iteration (µs, median, cross-rank ops)"]
    assert e.cause is Cause.NONE and e.comparison.outcome is Cause.SAME_CODE
    facts, rec = _late_entry_run(tmp_path, "short", run, sleeps=[{"iteration": 2, "op": "dispatch",
                                                                  "planned_us": 100.0, "slept_us": 40.0}])
    _, checks = _one_run_expect(run, facts, rec)
    assert "rank 1's host held every planned delay (count, short ones)" in _failed(checks)


def test_upstream_gemm_is_a_gpu_side_late_entry_with_the_host_on_time(tmp_path):
    run = _run("upstream-gemm")
    facts = _facts(run.name, upstream_gemm_us=([1502.0, 1498.0], [25.0, 26.0]))
    rec = load_run(fake_run(tmp_path / "r", entry_lag_us={(0, "notify"): 1480.0}, gpu_side=True))
    e, checks = _expect(run, facts, rec)
    assert (e.cause, e.rank, e.late_entry, e.kernel) == (Cause.RANK_IMBALANCE, 0, "gpu", None)
    assert (e.effect.metric, e.effect.value, e.effect.unit) == ("upstream_gemm_extra_us", 1474.5, "us")
    assert e.extra["gpu_entry_lag_us"] == [1480.0, 1480.0] and _failed(checks) == []
    # the same lag from a late host is not this scenario
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "host", entry_lag_us={(0, "notify"): 1480.0})))
    assert _failed(checks) == ["host entry lag of rank 0 at dispatch (ms)"]
    # the GEMM ran but rank 0 was not late: not ground truth
    _, checks = _expect(run, facts, load_run(fake_run(tmp_path / "none")))
    assert _failed(checks) == ["rank 0's GPU entry lag at notify (µs, per profiled op)",
                               "the late entry is material (cause, side from the measured share)"]


def test_a_late_entry_group_compares_op_latency_after_entry(tmp_path):
    runs = C.plan(["late-entry-ab"])
    recorded = {}
    for r in runs:
        # A: rank 0's combine spins 300 µs waiting for rank 1 (entered 150 µs late), 200 after entry;
        # B: 260 µs, 110 after entry. First warp to last warp B is barely faster; after entry it is
        us = (350, 200) if r.side == "A" else (260, 110)
        recorded[r.name] = load_run(fake_run(tmp_path / r.name, kernel_us={"combine": us},
                                             entry_lag_us={(1, "combine"): 150.0}))
    g = X.group_effect(recorded, runs)
    assert (g.median_a_us["combine"], g.median_b_us["combine"]) == (200.0, 110.0)
    b0 = next(r for r in runs if r.name == "ep-late-entry-ab-b0")
    e, checks = X.build_expect(b0, _facts(b0.name, host_sleeps=([], [])), recorded[b0.name], "cmd", g)
    assert "combine op latency B / A - 1 over the group's runs" not in _failed(checks)
    assert e.comparison.direction is Direction.FASTER


def Expect_from(e):
    from profiler.groundtruth.expect import Expect
    return Expect.from_json(json.loads(json.dumps(e.to_json())))
