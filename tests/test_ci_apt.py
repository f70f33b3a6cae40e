""".ci/run's apt_get (.ci/apt.sh) waits for the package manager's lock, bounded, instead of failing
at once (issue 34: a CI run died with exit 100 because another process held it). Driven against a
fake apt-get on PATH that reports a held lock a given number of times, under .ci/run's own shell
options (set -euo pipefail)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELD = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 2023 (apt-get)"

FAKE = """#!/usr/bin/env bash
n=$(cat "$STATE/calls" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$STATE/calls"
echo "$*" >> "$STATE/args"
if [ "$n" -le "$FAKE_HELD_TIMES" ]; then echo "$FAKE_ERROR" >&2; exit 100; fi
echo "Reading package lists..."
"""


def _apt_get(tmp_path: Path, held_times: int, error: str = HELD, wait_s: str = "30"):
    """.ci/run's `apt_get update -qq` against the fake: (the shell's result, apt-get calls, their arguments)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state),
           "FAKE_HELD_TIMES": str(held_times), "FAKE_ERROR": error, "APT_LOCK_WAIT_S": wait_s,
           "APT_LOCK_POLL_S": "0.1"}
    p = subprocess.run(["bash", "-c", "set -euo pipefail; . .ci/apt.sh; apt_get update -qq; echo after"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    calls = int((state / "calls").read_text()) if (state / "calls").exists() else 0
    args = (state / "args").read_text().splitlines() if (state / "args").exists() else []
    return p, calls, args


def test_a_held_lock_is_waited_for_then_the_command_runs(tmp_path):
    p, calls, args = _apt_get(tmp_path, held_times=3)
    assert p.returncode == 0 and p.stdout.strip() == "after", p.stderr
    assert calls == 4
    assert "another process holds the package manager's lock; waiting for it (up to 30 s)" in p.stderr
    assert "held by process 2023" in p.stderr
    # dpkg's own lock wait is on too (install), bounded by what is left of the wait
    assert all(a.startswith("-o DPkg::Lock::Timeout=") and a.endswith(" update -qq") for a in args), args


def test_a_lock_held_past_the_bound_fails_saying_so(tmp_path):
    p, calls, _ = _apt_get(tmp_path, held_times=10_000, wait_s="1")
    assert p.returncode == 100 and "after" not in p.stdout
    assert "the package manager's lock was still held after 1 s (APT_LOCK_WAIT_S)" in p.stderr
    assert HELD in p.stderr
    assert calls >= 2


def test_other_failures_are_not_retried(tmp_path):
    p, calls, _ = _apt_get(tmp_path, held_times=1, error="E: Unable to locate package chromium")
    assert p.returncode == 100 and calls == 1
    assert "E: Unable to locate package chromium" in p.stderr and "waiting" not in p.stderr


def test_ci_run_installs_through_it():
    text = (REPO / ".ci" / "run").read_text()
    assert ". .ci/apt.sh" in text
    lines = [ln.strip() for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not any(ln.startswith("apt-get") or "(apt-get" in ln or "&& apt-get" in ln for ln in lines), \
        "every apt-get call of .ci/run goes through apt_get"
