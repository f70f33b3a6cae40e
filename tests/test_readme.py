"""The README works as written. Every command of its ```bash blocks either runs here, in a copy of
the checkout (tests/as_user.py), or is named in NOT_RUN with the reason; after them the copy's
`git status` is clean, as .ci/run requires of the checkout after the tests.

The first line makes a venv and installs epscope into it. On CI it runs as written (pip reaches
the package index there). Elsewhere (a development machine without the index, like the one this
was written on) it runs with pip's offline flags in a venv that sees the system's packages
(`--system-site-packages --without-pip`, `python -m pip install --no-deps --no-build-isolation
--no-index -e .`): the same
install of the same tree, without downloads. `epscope view` gets a free port (8050 may be taken on
a shared machine) and is probed over HTTP, then stopped; `~` is a fresh home directory."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.as_user import REPO, copy_checkout, free_port, git_status, serve_and_probe
from tests.needs import needs

# commands of the README that this test does not run, and why
NOT_RUN = {
    "pip install torch==": "GPU machines: the torch CUDA build and the kernels' extra",
    "bash .ci/run": "runs this test suite (and installs Debian's chromium): it is the test command itself",
    "epscope trace ": "records on the local GPUs",
    "epscope selftest ": "records on a GPU",
    "epscope calibrate": "measures the local GPU's clocks",
    "python examples/moe_step.py": "records on the local GPUs (issue 30's example)",
    "epscope merge runs/moe-step": "merges the traces the example recorded on GPUs (tests/torchtrace/test_cli_merge.py "
                                   "merges hand-made ones)",
    "epscope report runs/moe-step": "the example's run, recorded on GPUs",
    "pip install -e '.[fast]'": "an optional extra (numba, the compiled decode loop); CI's dev extra installs it "
                                "and tests/profiler/test_decode_fast.py covers both loops",
}
FIRST_LINE = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && epscope view"
# the venv takes pip and setuptools from the system too (--without-pip): the venv's own setuptools
# (ensurepip's) cannot build an editable wheel with the system's wheel 0.46, which left bdist_wheel
# to setuptools >= 70.1; `python -m pip` then installs into the venv, never into the system
OFFLINE = {"python3 -m venv .venv": "python3 -m venv --system-site-packages --without-pip .venv",
           "pip install -e .": "python -m pip install -q --no-deps --no-build-isolation --no-index -e ."}


def readme_commands() -> list[str]:
    """The command lines of the README's ```bash blocks, comments stripped."""
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            cmd = line.split("  #")[0].split(" # ")[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


def _skipped(cmd: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if cmd.startswith(prefix)), None)


def test_every_readme_command_is_run_or_named_with_its_reason():
    cmds = readme_commands()
    assert cmds[0] == FIRST_LINE, "the first line changed: update FIRST_LINE and how this test runs it"
    run = [c for c in cmds[1:] if _skipped(c) is None]
    assert all(c.startswith("epscope ") for c in run), f"a command this test does not know how to run: {run}"
    assert {"epscope view", "epscope report traces/ep-host-late"} <= set(run)


def _bash(cmd: str, cwd, env, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_readme_runs_in_a_copy_of_the_checkout_and_leaves_it_clean(tmp_path):
    needs(subprocess.run(["python3", "-c", "import ensurepip, venv"], capture_output=True).returncode == 0,
          "python3's venv module", "sudo apt-get install -y python3-venv", tool="venv")
    repo = copy_checkout(tmp_path / "epscope", as_git=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    # the first line: set-up, then the viewer
    setup, view = FIRST_LINE.rsplit(" && ", 1)
    if not os.environ.get("CI"):
        for written, offline in OFFLINE.items():
            setup = setup.replace(written, offline)
    p = _bash(setup + " && python -c 'import profiler; print(profiler.__file__)'", repo, env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1].startswith(str(repo)), "the venv's epscope is not this copy's"
    venv_env = {**env, "PATH": f"{repo / '.venv' / 'bin'}:{env['PATH']}", "VIRTUAL_ENV": str(repo / ".venv")}
    port = free_port()
    serve_and_probe(f"{view} --port {port}", cwd=repo, env=venv_env, port=port, expect_run="ep-balanced")
    # the rest of the README's commands, in the venv the first line activated; `epscope view`, the
    # first line's own last command, ran there already in this venv (a second server start cost
    # 1.6-2 s of the test's ~13 s: issue 34)
    for cmd in readme_commands()[1:]:
        if _skipped(cmd):
            continue
        if cmd == view:
            continue
        p = _bash(cmd, repo, venv_env)
        assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert (home / "grid-barrier.perfetto-trace").stat().st_size > 1000, "export wrote nowhere the user said"
    assert git_status(repo) == "", f"the README's commands changed the checkout:\n{git_status(repo)}"
