"""profiler.workflows.catalogue on the CPU: the scenario table, the interleaved plan, argument checks and
the refusal without GPUs (the recording itself runs on 2xH200)."""
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.workflows import catalogue as C
from profiler.workflows import trace
from profiler.groundtruth.expect import Cause, ComparisonExpect, Direction, Expect

ROOT = Path(__file__).resolve().parents[2]


def test_every_key_of_the_brief_is_in_the_table_once():
    keys = [s.key for s in C.SCENARIOS]
    assert len(set(keys)) == len(keys)
    assert set(keys) == {"balanced", "rank-skew", "zero-rank", "few-tokens", "host-late", "barrier-straggler",
                         "aa", "ab-sms", "ab-tma-buffers", "ab-hook", "timeout",
                         "late-entry-ab", "late-entry-aa", "upstream-gemm"}   # issue 24


@pytest.mark.parametrize("s", C.SCENARIOS, ids=lambda s: s.key)
def test_each_truth_is_a_valid_expect_block(s):
    t = s.truth
    cmp_ = None
    if s.pair is not None:
        for side, value in (("A", s.pair.a), ("B", s.pair.b)):
            # a measured pair's direction comes from its recordings: either one must be writable
            for direction in ((Direction.FASTER, Direction.SLOWER) if s.pair.measured else (s.pair.direction,)):
                cmp_ = ComparisonExpect(group=s.pair.group, side=side, replicate=0, outcome=s.pair.outcome,
                                        knob=s.pair.knob, value=value if s.pair.knob else None,
                                        kernel=s.pair.kernel or "dispatch", phase=s.pair.phase, direction=direction)
    e = Expect(cause=t.cause, rank=t.rank, peer=t.peer, kernel=t.kernel, phase=t.phase, comparison=cmp_)
    assert Expect.from_json(e.to_json()) == e
    for r in (t.rank, t.peer):
        assert r is None or 0 <= r < C.RANKS


def test_planted_ranks_differ_between_scenarios_so_a_constant_answer_fails():
    # an analysis that always blames rank 0 (or rank 1) must fail at least one scenario
    blamed = {s.key: s.truth.rank for s in C.SCENARIOS if s.truth.rank is not None}
    assert set(blamed.values()) == {0, 1}
    assert blamed["rank-skew"] != blamed["zero-rank"]
    assert blamed["host-late"] != blamed["barrier-straggler"]


def test_delays_sit_on_the_rank_the_truth_names():
    s = C.BY_KEY["host-late"]
    assert s.truth.cause is Cause.HOST_BOUND and s.host_delay.rank == s.truth.rank and s.device_delay is None
    s = C.BY_KEY["barrier-straggler"]
    assert s.truth.cause is Cause.BARRIER_STRAGGLER and s.device_delay.rank == s.truth.rank and s.host_delay is None
    s = C.BY_KEY["timeout"]
    assert s.skip_send_rank == s.truth.peer != s.truth.rank and s.timeout_s < C.DEFAULT_TIMEOUT_S
    assert dict(C.BY_KEY["zero-rank"].routing_args)["zero_rank"] != C.BY_KEY["zero-rank"].truth.rank


def test_plan_order_singles_then_interleaved_pairs_then_the_timeout():
    runs = C.plan(C.parse_only(None))
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) == 7 + 6 * 2 * 3 + 1
    assert names[:7] == ["ep-balanced", "ep-rank-skew", "ep-zero-rank", "ep-few-tokens", "ep-host-late",
                         "ep-barrier-straggler", "ep-upstream-gemm"]
    assert names[-1] == "ep-timeout"
    pairs = runs[7:-1]
    for group in ("aa", "ab-sms", "ab-tma-buffers", "ab-hook", "late-entry-ab", "late-entry-aa"):
        g = [r for r in pairs if r.scenario.pair.group == group]
        assert [(r.side, r.replicate) for r in g] == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]
        assert [r.name for r in g] == [f"ep-{group}-{s}{i}" for i in range(3) for s in "ab"]
    # the two groups alternate too: no group's replicate i+1 before the other's replicate i
    assert [r.replicate for r in pairs] == sorted(r.replicate for r in pairs)


def test_ab_sides_differ_only_in_the_knob_and_aa_sides_not_at_all():
    runs = {r.name: r for r in C.plan(["aa", "ab-sms"])}
    a, b = runs["ep-ab-sms-a1"], runs["ep-ab-sms-b1"]
    assert (a.num_sms, b.num_sms) == (24, 64)
    wa, wb = a.workload(), b.workload()
    diff = {k for k in wa if wa[k] != wb[k]}
    assert diff == {"num_sms", "catalogue"}
    wa, wb = runs["ep-aa-a0"].workload(), runs["ep-aa-b0"].workload()
    assert {k for k in wa if wa[k] != wb[k]} == {"catalogue"}


@pytest.mark.parametrize("group, knob, a, b", [("ab-tma-buffers", "num_tma_buffers", 1, 3),
                                               ("ab-hook", "return_recv_hook", False, True)])
def test_issue_11_groups_change_one_knob_and_measure_what_moved(group, knob, a, b):
    runs = {r.name: r for r in C.plan([group])}
    ra, rb = runs[f"ep-{group}-a2"], runs[f"ep-{group}-b2"]
    assert (ra.settings[knob], rb.settings[knob]) == (a, b)
    assert {k for k in ra.settings if ra.settings[k] != rb.settings[k]} == {knob}
    pa, pb = ra.workload()["catalogue"], rb.workload()["catalogue"]
    assert {k for k in pa if pa[k] != pb[k]} == {"side", knob}
    assert pa["path"] == "tma" and f"{knob}={b}" in rb.description()
    p = ra.scenario.pair
    assert p.measured and p.direction is None and p.kernel is None  # never assumed: read from the recordings
    if group == "ab-hook":
        assert pa["gemm_n"] == 8192 and ra.scenario.num_tma_buffers == 3
    else:
        assert p.phase == "stage_wait" and pa["gemm_n"] == 0


def test_a_pair_only_takes_known_knobs():
    with pytest.raises(ValueError, match="Pair.knob must be one of"):
        C.Pair("x", "chunk", 1, 2)


def test_workload_has_every_key_of_epscope_trace():
    # the two tools' runs must compare on the same fields
    w = trace.check_args(trace.build_parser().parse_args(["--out", "runs"]))
    for r in C.plan(C.parse_only(None)):
        wl = r.workload()
        assert set(w) <= set(wl), set(w) - set(wl)
        assert wl["kind"] == "ep" and wl["ranks"] == C.RANKS and wl["catalogue"]["scenario"] == r.scenario.key
        assert wl["iters"] == r.scenario.warm_iters + r.scenario.profile_iters


def test_timeout_profiles_from_the_first_op():
    r = C.plan(["timeout"])[0]
    assert r.workload()["force_timeout_rank"] == 1 and r.scenario.warm_iters == 0


@pytest.mark.parametrize("only, msg", [
    ("bogus", "unknown scenario(s) bogus"),
    ("balanced,nope", "unknown scenario(s) nope"),
    (" , ", "at least one scenario"),
])
def test_only_rejects_what_is_not_a_scenario(only, msg):
    with pytest.raises(C.CatalogueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        C.parse_only(only)


def test_only_keeps_the_table_order():
    assert C.parse_only("timeout,balanced") == ["balanced", "timeout"]


def test_replicates_below_two_fail():
    with pytest.raises(C.CatalogueError, match="--replicates must be >= 2"):
        C.plan(["aa"], replicates=1)
    assert len(C.plan(["aa"], replicates=4)) == 8


def _main(args, capsys):
    rc = C.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("args, msg", [
    ([], "--out is required"),
    (["--out", "x", "--only", "nope"], "unknown scenario"),
    (["--out", "x", "--replicates", "1"], "--replicates must be >= 2"),
    (["--out", "x", "--timeout-s", "0"], "--timeout-s must be > 0"),
])
def test_bad_arguments_exit_2_with_the_reason(args, msg, capsys):
    rc, _, err = _main(args, capsys)
    assert rc == 2 and msg in err and err.startswith("profiler.workflows.catalogue:")


def test_existing_runs_are_not_overwritten_silently(tmp_path, capsys, monkeypatch):
    (tmp_path / "ep-balanced").mkdir()
    rc, _, err = _main(["--out", str(tmp_path), "--only", "balanced"], capsys)
    assert rc == 2 and "already holds ep-balanced" in err and "--overwrite" in err
    monkeypatch.setattr(C, "gpu_count", lambda: 0)
    rc, _, err = _main(["--out", str(tmp_path), "--only", "balanced", "--overwrite"], capsys)
    assert rc == 2 and "this machine has 0" in err   # past the check, stopped by the GPU count


def test_refuses_without_two_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(C, "gpu_count", lambda: 1)
    rc, _, err = _main(["--out", str(tmp_path)], capsys)
    assert rc == 2 and "recorded on 2 GPUs, this machine has 1" in err
    assert list(tmp_path.iterdir()) == []   # nothing written before the refusal


def test_on_this_machine_the_refusal_is_real(tmp_path):
    have = C.gpu_count()
    if have >= 2:
        pytest.skip(f"this machine has {have} GPUs: the command would record")
    r = subprocess.run([sys.executable, "-m", "profiler.workflows.catalogue", "--out", str(tmp_path / "cat")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"this machine has {have}" in r.stderr


# -- issue 24: late entry and upstream GPU work ----------------------------------------------------
def test_the_random_host_delay_is_seeded_per_op_and_shared_by_the_sides_of_a_replicate():
    runs = {r.name: r for r in C.plan(["late-entry-ab", "late-entry-aa"])}
    plants = {n: r.workload()["catalogue"]["random_host_delay"] for n, r in runs.items()}
    a1 = plants["ep-late-entry-ab-a1"]
    assert (a1["rank"], a1["max_us"], a1["ops"]) == (1, 300.0, ["dispatch", "combine"])
    seq = a1["planned_us"]
    # every profiled iteration, dispatch then combine, each its own draw in [0, 300)
    its = list(range(2, 7))
    assert [(it, op) for it, op, _ in seq] == [(it, op) for it in its for op in ("dispatch", "combine")]
    us = [x for _, _, x in seq]
    assert all(0 <= x < 300 for x in us) and len(set(us)) == len(us)
    # both sides (and both groups) of replicate 1 sleep the same sequence; replicate 0 another
    for name in ("ep-late-entry-ab-b1", "ep-late-entry-aa-a1", "ep-late-entry-aa-b1"):
        assert plants[name]["planned_us"] == seq
    assert plants["ep-late-entry-ab-a0"]["planned_us"] != seq
    # a rerun draws the same numbers (seeded, not time- or process-dependent)
    d = runs["ep-late-entry-ab-a1"].scenario.random_host_delay
    assert d.delay_us(1, 2, "dispatch") == seq[0][2] == C.RandomDelay(1, 300.0).delay_us(1, 2, "dispatch")
    assert C.RandomDelay(1, 300.0, seed=1).delay_us(1, 2, "dispatch") != seq[0][2]


def test_a_random_delay_names_real_ops_and_a_positive_bound():
    with pytest.raises(ValueError, match="ops"):
        C.RandomDelay(1, 300.0, ops=("notify",))
    with pytest.raises(ValueError, match="max_us"):
        C.RandomDelay(1, 0.0)


def test_late_entry_groups_compare_after_entry_and_sides_differ_only_in_the_knob():
    runs = {r.name: r for r in C.plan(["late-entry-ab", "late-entry-aa"])}
    a, b = runs["ep-late-entry-ab-a0"], runs["ep-late-entry-ab-b0"]
    assert (a.num_sms, b.num_sms) == (24, 64) and a.scenario.pair.after_entry
    wa, wb = a.workload(), b.workload()
    assert {k for k in wa if wa[k] != wb[k]} == {"num_sms", "catalogue"}
    assert {k for k in wa["catalogue"] if wa["catalogue"][k] != wb["catalogue"][k]} == {"side"}
    aa = runs["ep-late-entry-aa-b2"]
    assert aa.scenario.pair.outcome is Cause.SAME_CODE and aa.num_sms == 24


def test_upstream_gemm_plants_unequal_gemms_and_the_late_rank_is_the_larger():
    r = C.plan(["upstream-gemm"])[0]
    s = r.scenario
    assert r.name == "ep-upstream-gemm" and s.pair is None
    assert r.workload()["catalogue"]["upstream_gemm"] == {"0": 8192, "1": 2048}
    assert (s.upstream_n(0), s.upstream_n(1), s.upstream_n(5)) == (8192, 2048, 0)
    late = max(s.upstream_gemm, key=lambda x: x[1])[0]
    assert (s.truth.cause, s.truth.rank, s.truth.late_entry) == (Cause.RANK_IMBALANCE, late, "gpu")
    assert s.host_delay is None and s.device_delay is None and s.random_host_delay is None


def test_the_gpu_script_takes_the_late_entry_scenarios_with_one_flag(tmp_path):
    # the script's argument parsing only: everything after it needs the GPUs, so stop it there
    root = Path(__file__).resolve().parents[2]
    script = (root / "benchmarks/gpu/catalogue_gpu.sh").read_text()
    head = script.split("\n# the device copy has no .git", 1)[0] + '\necho "ONLY=${ONLY:-}"\n'
    stub = tmp_path / "head.sh"
    stub.write_text(head)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"   # the script calls `python`
    for args, want in ((["--late-entry"], ",".join(C.LATE_ENTRY)), (["--only", "aa,timeout"], "aa,timeout"),
                       (["--only=host-late"], "host-late")):
        out = subprocess.run(["bash", str(stub), *args], cwd=root, capture_output=True, text=True,
                             env={"PATH": path, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(root)})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == f"ONLY={want}"
    assert C.parse_only(",".join(C.LATE_ENTRY)) == list(C.LATE_ENTRY)
    bad = subprocess.run(["bash", str(stub), "--bogus"], cwd=root, capture_output=True, text=True,
                         env={"PATH": path, "OUT": str(tmp_path / "out")})
    assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr
