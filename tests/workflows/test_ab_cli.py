"""`epscope ab` on the CPU: argument checks, the refusal without GPUs, refs -> worktrees / exported
trees, and a whole run with stand-in workers whose answer is known (B 10 % faster; A against A)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.workflows import ab, rounds
from profiler.commands.ab import ComparisonRecord

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parent / "fake_round_worker.py"
SMALL = ["--tokens", "16", "--hidden", "256", "--topk", "2", "--experts", "8"]


def _main(args, capsys):
    rc = ab.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("args, msg", [
    (["main"], "give two refs"),
    (["a", "b", "--rounds", "1"], "--rounds must be >= 2"),
    (["a", "b", "--rounds", "3", "--profile-rounds", "0,1"], "leaves 1 timing round(s) of 3"),
    (["a", "b", "--profile-rounds", "x"], "'x' is not a round index"),
    (["a", "b", "--profile-rounds", "9"], "round 9 is outside 0..7"),
    (["a", "b", "--iters", "0"], "--iters must be >= 1"),
    (["a", "b", "--num-sms", "23"], "--num-sms must be even"),
    (["a", "b", "--hidden", "100"], "Problem.hidden"),
])
def test_bad_arguments_exit_2_with_the_reason(args, msg, capsys):
    rc, _, err = _main(args, capsys)
    assert rc == 2 and msg in err and err.startswith("epscope ab:")


def test_profile_rounds_are_normalised():
    assert ab.parse_profile_rounds("-1", 8) == [7]
    assert ab.parse_profile_rounds("0, -2", 8) == [0, 6]
    assert ab.parse_profile_rounds("", 2) == []


def test_refuses_without_gpus(capsys, monkeypatch):
    monkeypatch.setattr(ab, "gpu_count", lambda: 0)
    rc, _, err = _main(["main", "main"], capsys)
    assert rc == 2 and "this machine, and it has 0" in err and "--export" in err


def test_on_this_machine_the_refusal_is_real():
    have = ab.gpu_count()
    if have >= 2:
        pytest.skip(f"this machine has {have} GPUs: the command would run")
    r = subprocess.run([sys.executable, "-m", "profiler", "ab", "HEAD", "HEAD"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and f"it has {have}" in r.stderr


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "ep_core").mkdir(parents=True)
    (r / "profiler").mkdir()
    (r / "ep_core" / "knob.py").write_text("CHUNKS = 8\n")
    (r / "profiler" / "x.py").write_text("\n")
    (r / "pyproject.toml").write_text("[tool.epscope]\n")
    (r / "traces").mkdir()
    (r / "traces" / "big.bin").write_text("not exported\n")
    _git(r, "init", "-q")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a")
    (r / "ep_core" / "knob.py").write_text("CHUNKS = 4\n")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "b")
    return r


def test_a_ref_becomes_a_detached_worktree_at_its_commit(repo, tmp_path):
    t = ab.resolve_side("A", "HEAD~1", tmp_path / "work", repo)
    assert t.worktree and t.commit == _git(repo, "rev-parse", "HEAD~1")
    assert (t.tree / "ep_core" / "knob.py").read_text() == "CHUNKS = 8\n"
    ab.remove_worktree(t, repo)
    assert not t.tree.exists()
    with pytest.raises(ab.ABUsage, match="is not a commit"):
        ab.resolve_side("B", "no-such-branch", tmp_path / "work", repo)


def test_export_makes_a_stamped_tree_that_resolves_without_git(repo, tmp_path):
    dest = ab.export_tree("HEAD", tmp_path / "exp", repo)
    assert (dest / "ep_core" / "knob.py").read_text() == "CHUNKS = 4\n" and not (dest / "traces").exists()
    assert (dest / "pyproject.toml").exists()       # the registry search path of the tree's profiler
    t = ab.resolve_side("B", str(dest), tmp_path / "work", tmp_path / "not-a-repo")
    assert not t.worktree and t.commit == _git(repo, "rev-parse", "HEAD") and t.ref == "HEAD"
    with pytest.raises(ab.ABUsage, match="not empty"):
        ab.export_tree("HEAD", dest, repo)
    with pytest.raises(ab.ABUsage, match="not a git checkout"):
        ab.resolve_side("A", "main", tmp_path / "work", tmp_path / "not-a-repo")


def _tree(path, level, variant):
    (path / "ep_core").mkdir(parents=True)
    (path / "fake.json").write_text(json.dumps({"level": level, "sd": 0.3, "variant": variant}))
    (path / ab.REF_STAMP).write_text(json.dumps({"ref": f"ref-{variant}", "commit": variant * 40}))
    return path


@pytest.fixture
def fake_workers(monkeypatch):
    monkeypatch.setattr(rounds, "WORKER", FAKE)
    monkeypatch.setattr(rounds, "BUILDS", {k: "pass" for k in rounds.BUILDS})   # the stand-in trees build nothing
    monkeypatch.setattr(ab, "gpu_count", lambda: 2)
    monkeypatch.setenv("FAKE_TOOL_ROOT", str(ROOT))


def test_a_whole_run_finds_the_faster_side_and_writes_the_record(tmp_path, fake_workers, capsys):
    a, b = _tree(tmp_path / "a", 100.0, "a"), _tree(tmp_path / "b", 90.0, "b")
    out = tmp_path / "out"
    # three profiled rounds a side: the phase comparison needs run-to-run noise (issue 8: the run is
    # the unit of replication; one profiled round a side calls no phase)
    rc, text, err = _main([str(a), str(b), *SMALL, "--rounds", "6", "--profile-rounds", "3,4,5", "--iters", "10",
                           "--warmup", "0", "--out", str(out)], capsys)
    assert rc == 0, err
    assert text.rstrip().splitlines()[-1].startswith("host_combine")      # the verdict table is printed last
    assert "side B round 3 (profiled)" in text                             # progress while it ran
    rec = ComparisonRecord.read(out)
    assert rec.sides["A"]["commit"] == "a" * 40 and rec.sides["B"]["ref"] == "ref-b"
    assert [(r.side, r.round) for r in rec.rounds] == [(s, i) for i in range(6) for s in "AB"]
    v = {r.metric: r for r in rec.verdict}
    assert v["op"].verdict == "faster" and (v["op"].runs_a, v["op"].runs_b) == (3, 3)   # the profiled round is out
    assert v["op"].diff_pct == pytest.approx(-10, abs=1.5)
    # one run directory per side for the profiled round, tagged with ref, commit and round
    from profiler.store.runstore import load_run

    for side in "AB":
        m = load_run(out / f"ab-{side}-r3").manifest
        assert m["workload"]["ab"] == {"side": side, "ref": f"ref-{side.lower()}", "commit": side.lower() * 40,
                                       "round": 3}
    # the synthetic B runs are 1.2x slower in dispatch send_chunk: the phase comparison says so
    assert any(r.get("kernel") == "dispatch" and r.get("phase") == "send_chunk" and r.get("verdict") == "slower"
               for r in rec.critical_path), rec.critical_path


def test_a_against_a_is_within_noise(tmp_path, fake_workers, capsys):
    a, b = _tree(tmp_path / "a", 100.0, "a"), _tree(tmp_path / "b", 100.0, "a")
    rc, text, err = _main([str(a), str(b), *SMALL, "--rounds", "3", "--profile-rounds", "", "--iters", "10",
                           "--warmup", "0", "--out", str(tmp_path / "out")], capsys)
    assert rc == 0, err
    rec = ComparisonRecord.read(tmp_path / "out")
    assert all(r.verdict == "within noise" for r in rec.verdict), [(r.metric, r.verdict) for r in rec.verdict]
    assert "no profiled round on one side" in " ".join(rec.notes)


def test_a_failing_side_exits_nonzero_with_the_reason(tmp_path, fake_workers, capsys):
    a, b = _tree(tmp_path / "a", 100.0, "a"), _tree(tmp_path / "b", 100.0, "a")
    conf = json.loads((b / "fake.json").read_text())
    (b / "fake.json").write_text(json.dumps({**conf, "fail_round": 1}))
    rc, _, err = _main([str(a), str(b), *SMALL, "--rounds", "3", "--iters", "5", "--warmup", "0", "--out",
                        str(tmp_path / "out")], capsys)
    assert rc == 1 and err.startswith("epscope ab: side B rank 0") and "planted failure" in err


def test_this_checkout_as_a_side_is_named_by_its_commit(monkeypatch, tmp_path):
    monkeypatch.setenv("EPSCOPE_GIT_COMMIT", "0123abcd" * 5)   # what the GPU machine's copy gets
    t = ab.resolve_side("A", str(ROOT), tmp_path, ROOT)
    assert not t.worktree and t.tree == ROOT and t.commit == "0123abcd" * 5 and "working tree" in t.ref


def test_build_caches_are_per_commit_and_this_checkout_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("EPSCOPE_BUILD_DIR", str(tmp_path / "usual"))
    here = ab.SideTree("A", "main", "a" * 40, ROOT, False)
    other = ab.SideTree("B", "knob", "b" * 40, tmp_path / "knob", True)
    same = ab.SideTree("A", "knob", "b" * 40, tmp_path / "knob2", True)
    unknown = ab.SideTree("B", "dir", "unknown", tmp_path / "d", False)
    root = tmp_path / "builds"
    assert ab.build_dir(here, ROOT, root) == tmp_path / "usual"
    assert ab.build_dir(other, ROOT, root) == root / f"ab-{'b' * 16}" == ab.build_dir(same, ROOT, root)
    assert ab.build_dir(unknown, ROOT, root) == root / "ab-side-B"


def test_the_record_says_when_warm_up_was_set_aside(tmp_path, monkeypatch):
    # compare sets aside each run's warm-up iterations (profiler.analysis.compare.WARMUP_SHARE); the
    # profiled rounds' phase comparison in the record says so. A negative share makes every run's
    # leading iterations warm-up here: the wiring, not the rule, is under test
    import importlib
    from types import SimpleNamespace

    from profiler.commands.ab import RoundSamples
    from profiler.groundtruth.synthetic import make_run

    monkeypatch.setattr(importlib.import_module("profiler.analysis.compare"), "WARMUP_SHARE", -0.5)
    rs = []
    for side in "AB":
        for i in range(2):
            make_run(tmp_path / f"{side}{i}", ranks=2, events=3000, scenario="ab", variant=side.lower(), seed=i,
                     perfetto=False)
            rs.append(RoundSamples(side, i, True, {"op": [1.0]}, f"{side}{i}"))
    _, notes = ab.critical_path_changes(SimpleNamespace(rounds=rs), tmp_path)
    assert any(n.startswith("warm-up set aside: ") for n in notes), notes
