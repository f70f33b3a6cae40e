"""`epscope trace` on the CPU: argument checks with clear messages, the GPU-count refusal, and
the summary of a run directory (a synthetic one; real runs are recorded on the H200)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.workflows import trace

ROOT = Path(__file__).resolve().parents[2]


def run_main(args, capsys):
    rc = trace.main([*args, "--out", "unused-runs"])   # every case stops before it writes
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("args, msg", [
    (["--hidden", "100"], "Problem.hidden"),
    (["--experts", "255"], "Problem.experts"),
    (["--topk", "17"], "Problem.topk"),
    (["--tokens", "-1"], "Problem.tokens"),
    (["--ranks", "9", "--experts", "288"], "Problem.ranks"),
    (["--num-sms", "23"], "--num-sms"),
    (["--chunk", "300"], "--chunk"),
    (["--iters", "2", "--profile-iters", "3"], "--profile-iters"),
    (["--force-timeout-rank", "2"], "--force-timeout-rank"),
    (["--ranks", "1", "--experts", "8", "--force-timeout-rank", "0"], "at least 2 ranks"),
    (["--ranks", "1", "--experts", "8", "--routing", "zero-rank"], "zero-rank needs"),
    (["--drop", "2"], "--drop"),
])
def test_bad_arguments_exit_2_with_the_reason(args, msg, capsys):
    rc, out, err = run_main(args, capsys)
    assert rc == 2
    assert msg in err and err.startswith("epscope trace:")


def test_refuses_without_enough_gpus(capsys, monkeypatch):
    monkeypatch.setattr(trace, "gpu_count", lambda: 1)
    rc, out, err = run_main(["--ranks", "2"], capsys)
    assert rc == 2
    assert "--ranks 2 needs 2 CUDA GPUs, this machine has 1" in err


def test_on_this_machine_the_refusal_is_real(tmp_path):
    # the real check (torch.cuda) through the module entry point, as a user runs it
    r = subprocess.run([sys.executable, "-m", "profiler.workflows.trace", "--ranks", "64", "--experts", "64",
                        "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Problem.ranks must be in 1..8" in r.stderr
    r = subprocess.run([sys.executable, "-m", "profiler.workflows.trace", "--ranks", "8", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    have = trace.gpu_count()
    if have >= 8:
        pytest.skip("this machine has 8 GPUs")
    assert r.returncode == 2 and f"needs 8 CUDA GPUs, this machine has {have}" in r.stderr


def test_help_lists_every_flag():
    text = trace.build_parser().format_help()
    for flag in ("--ranks", "--tokens", "--hidden", "--topk", "--experts", "--routing", "--dtype", "--num-sms",
                 "--chunk", "--iters", "--profile-iters", "--out", "--name", "--description",
                 "--force-timeout-rank"):
        assert flag in text
    for routing in ("uniform", "skewed", "zipf", "zero-rank"):
        assert routing in text


def test_default_names_and_workload():
    a = trace.build_parser().parse_args(["--routing", "skewed", "--dtype", "fp8", "--out", "runs"])
    assert trace.default_name(a) == "ep-2rank-skewed-fp8"
    w = trace.check_args(a)
    assert w["kind"] == "ep" and w["routing"] == "skewed" and w["dtype"] == "fp8" and w["ranks"] == 2
    b = trace.build_parser().parse_args(["--force-timeout-rank", "1", "--out", "runs"])
    assert trace.default_name(b) == "ep-2rank-uniform-bf16-timeout-rank1"


def test_summary_of_a_run_directory(tmp_path):
    from profiler.groundtruth.synthetic import make_run

    path = make_run(tmp_path / "run", ranks=2, events=2000, perfetto=False)
    results = [{"rank": 0, "recv_rows": 8190, "warm_us": [700.0, 650.0], "error": None},
               {"rank": 1, "recv_rows": 8170, "warm_us": [], "error": "EPTimeoutError: ... timed out"}]
    text = trace.summarize(path, results)
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["0", "8190", "675"]
    assert "timed out" in lines[2]
    assert "kernel time per launch" in text and "phases (count and total warp-µs per rank)" in text


def test_summary_says_when_the_run_is_unreadable(tmp_path):
    text = trace.summarize(tmp_path / "missing", [{"rank": 0, "recv_rows": 0, "warm_us": [], "error": None}])
    assert "could not be read back" in text


@pytest.mark.parametrize("module", ["profiler.workflows.trace", "profiler.record.selftest"])
def test_recording_commands_write_only_where_the_user_says(module, tmp_path):
    """No default --out: the old one (traces/) was the checkout's bundled runs (issue 34). The
    refusal comes before torch or a GPU is looked for, so it is the same on any machine."""
    r = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "the following arguments are required: --out" in r.stderr, r.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
