"""profiler.workflows.rounds on the CPU, with a stand-in worker (fake_round_worker.py): the protocol, the
slowest-rank merge, and failures that name the side, the rank and the log."""
import json
from pathlib import Path

import pytest

from profiler.workflows import rounds
from ep_core.config import Problem

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parent / "fake_round_worker.py"


@pytest.fixture
def inputs(tmp_path_factory):
    return rounds.write_inputs(tmp_path_factory.mktemp("inputs"), Problem(16, 256, 2, 8, 2), "uniform", 0)


def _tree(path, **conf):
    path.mkdir(parents=True, exist_ok=True)
    (path / "fake.json").write_text(json.dumps({"level": 100.0, **conf}))
    return path


def _set(tmp_path, inputs, **conf):
    tree = _tree(tmp_path / "tree", **conf)
    return rounds.WorkerSet("A", tree, 2, inputs, tmp_path / "logs", worker=FAKE,
                            env={"FAKE_TOOL_ROOT": str(ROOT), "EPSCOPE_GIT_COMMIT": "c0ffee"})


def _cmd(r, iters=5):
    return {"cmd": "round", "round": r, "warmup": 0, "iters": iters, "num_sms": None, "configs": None, "profile": None}


def test_inputs_are_written_per_rank_and_identical_for_a_seed(tmp_path, inputs):
    import torch

    again = rounds.write_inputs(tmp_path / "again", Problem(16, 256, 2, 8, 2), "uniform", 0)
    for r in range(2):
        x, y = torch.load(inputs / f"rank{r}.pt"), torch.load(again / f"rank{r}.pt")
        assert torch.equal(x["x"], y["x"]) and torch.equal(x["topk_idx"], y["topk_idx"])
        assert x["problem"]["tokens"] == 16 and x["x_scales"] is None


def test_rounds_answer_in_rank_order_and_the_slowest_rank_wins(tmp_path, inputs):
    with _set(tmp_path, inputs) as ws:
        ready = ws.start(timeout_s=120)
        assert [r["rank"] for r in ready] == [0, 1]
        assert ready[0]["commit"] == "c0ffee" and ready[0]["ep_core"] == str(tmp_path / "tree")
        replies = ws.request(_cmd(0), timeout_s=60)
        merged = rounds.slowest_rank(replies)
        assert set(merged) == set(rounds.METRICS) and len(merged["op"]) == 5
        assert merged["op"] == [max(a, b) for a, b in zip(replies[0]["samples"]["op"], replies[1]["samples"]["op"])]
        assert sum(merged["op"]) / 5 > 100.5     # rank 1 (level 101) paced every iteration
    log = (tmp_path / "logs" / "A-rank0.log").read_text()
    assert "a line of build output that is not a reply" in log   # non-protocol output goes to the log


def test_a_failing_round_names_side_rank_and_error(tmp_path, inputs):
    with _set(tmp_path, inputs, fail_round=1) as ws:
        ws.start(timeout_s=120)
        ws.request(_cmd(0), timeout_s=60)
        with pytest.raises(rounds.WorkerError, match="side A rank 0 .*planted failure"):
            ws.request(_cmd(1), timeout_s=60)


def test_a_dead_worker_is_reported_with_its_log(tmp_path, inputs):
    with _set(tmp_path, inputs, die_round=0) as ws:
        ws.start(timeout_s=120)
        with pytest.raises(rounds.WorkerError, match="exited with code 3"):
            ws.request(_cmd(0), timeout_s=60)


def test_a_worker_that_cannot_start_says_why(tmp_path, inputs):
    with _set(tmp_path, inputs, ready_error="ImportError: no ep_core here") as ws:
        with pytest.raises(rounds.WorkerError, match="no ep_core here"):
            ws.start(timeout_s=120)


def test_slowest_rank_refuses_ragged_iterations():
    reps = [{"samples": {m: [1.0, 2.0] for m in rounds.METRICS}}, {"samples": {m: [1.0] for m in rounds.METRICS}}]
    with pytest.raises(rounds.WorkerError, match="iterations"):
        rounds.slowest_rank(reps)


def test_interleave_alternates_sides_round_by_round():
    assert rounds.interleave(["A", "B"], 3) == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)]


def test_prebuild_runs_each_build_once_per_cache_and_reports_failures(tmp_path, inputs, monkeypatch):
    # stand-in builds: a line in a file per build; one of them fails
    monkeypatch.setattr(rounds, "BUILDS", {
        "noprof": "open('built.txt', 'a').write('noprof\\n')",
        "prof": "open('built.txt', 'a').write('prof\\n')",
        "record": "raise SystemExit(3)"})
    tree = _tree(tmp_path / "tree")
    env = {"EPSCOPE_BUILD_DIR": str(tmp_path / "cache")}
    a = rounds.WorkerSet("A", tree, 2, inputs, tmp_path / "logs", worker=FAKE, env=env)
    b = rounds.WorkerSet("B", tree, 2, inputs, tmp_path / "logs", worker=FAKE, env=env)   # same tree and cache
    c = rounds.WorkerSet("C", tree, 2, inputs, tmp_path / "logs", worker=FAKE, env=env, profile=False)
    failed = rounds.prebuild([a, b, c])
    assert sorted((tree / "built.txt").read_text().split()) == ["noprof", "prof"]
    assert len(failed) == 1 and failed[0].startswith("side A record: exit 3")
