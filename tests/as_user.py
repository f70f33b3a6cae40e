"""epscope as a user meets it: a copy of the checkout (its working tree's files, never the
checkout itself: nothing a test runs may write there), and `epscope view` started as a process
serving on loopback, probed over HTTP, stopped. Used by the README test and the wheel test."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_checkout(dest: Path, *, as_git: bool = False) -> Path:
    """The working tree's files (tracked, and untracked but not ignored: what a commit would
    hold) copied to dest; with as_git, dest is also a git repository with them committed, so
    `git status` there says what the commands run in it changed."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():   # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    if as_git:
        git = ["git", "-c", "user.name=epscope-test", "-c", "user.email=test@epscope", "-c", "commit.gpgsign=false"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy of the checkout"]):
            subprocess.run(git + args, cwd=dest, check=True, capture_output=True)
    return dest


def git_status(repo: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError):
        return 0, ""


def serve_and_probe(cmd: list[str] | str, *, cwd, env: dict, port: int, expect_run: str,
                    start_timeout_s: float = 180.0) -> str:
    """Run `cmd` (a list, or a shell line for bash), wait until http://127.0.0.1:port/ answers 200,
    check the app's layout names `expect_run` (a run it serves), stop the process group, and return
    what the server printed. Raises AssertionError with the server's output otherwise."""
    shell = isinstance(cmd, str)
    p = subprocess.Popen(["bash", "-c", cmd] if shell else cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        status = 0
        while time.monotonic() < deadline and p.poll() is None:
            status, _ = _get(base + "/")
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, f"epscope view did not answer on {base} (exit {p.poll()})"
        status, layout = _get(base + "/_dash-layout", timeout=60.0)
        assert status == 200 and expect_run in json.dumps(json.loads(layout)), \
            f"the app's layout does not name {expect_run}"
    except AssertionError as e:
        out = _stop(p)
        raise AssertionError(f"{e}; server output:\n{out[-3000:]}") from None
    return _stop(p)


def _stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)   # the session we started: bash and the server under it
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=20)
    return p.stdout.read() if p.stdout else ""
