"""Rounds of an EP workload run by worker processes, for `epscope ab` and `epscope tune`.

A side (one source tree: a git ref's worktree, or this checkout) is a WorkerSet: one process per
rank running profiler/workflows/ab_worker.py with the tree first on sys.path, its own build cache and its own
process group. Sides stay alive together and take turns on the same GPUs; the parent sends one
round command at a time to every rank of one side and waits for all of them, so rounds of two
sides never overlap (`interleave` builds the A B A B ... order).

Inputs: `write_inputs` makes every rank's tensors once (profiler.workflows.workload, seeded) and saves them;
each side's workers load the same files, so both sides move the same rows.
No GPU is needed to import this module: the CPU tests drive WorkerSet with a stand-in worker.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ab_worker import METRICS, REPLY_PREFIX
from ep_core.launch import NO_MULTICAST_ENV, free_port

WORKER = Path(__file__).resolve().parent / "ab_worker.py"
# `python -c BOOT WORKER args`: sys.path[0] is the working directory (the side's tree), not this
# file's directory, so `import ep_core` finds the side's copy; the worker file still runs by path.
BOOT = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class WorkerError(RuntimeError):
    """A worker failed, died or did not answer; the message names the side, the rank and its log."""


def write_inputs(directory, problem, routing: str, seed: int) -> Path:
    """Every rank's inputs (x, top-k) as DIR/rank<r>.pt, made on the CPU from the seed."""
    import torch

    from .workload import make_rank_inputs

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for r in range(problem.ranks):
        ins = make_rank_inputs(problem, routing, r, seed=seed)
        x, scales = (ins.x, None) if problem.dtype == "bf16" else ins.x_fp8
        torch.save({"problem": problem.to_dict(), "x": x, "x_scales": scales, "topk_idx": ins.topk_idx,
                    "topk_weights": ins.topk_weights}, d / f"rank{r}.pt")
    return d


@dataclass
class _Proc:
    rank: int
    popen: subprocess.Popen
    replies: "queue.Queue[dict]" = field(default_factory=queue.Queue)
    log: Path | None = None


class WorkerSet:
    """One side's rank processes (see the module docstring)."""

    def __init__(self, side: str, tree, ranks: int, inputs, log_dir, *, env: dict | None = None,
                 worker=None, python: str = sys.executable, profile: bool = True):
        self.side, self.tree, self.ranks = side, Path(tree), int(ranks)
        self.inputs, self.log_dir = Path(inputs), Path(log_dir)
        self.env, self.python, self.profile = dict(env or {}), python, profile
        self.worker = Path(worker) if worker is not None else WORKER
        self.procs: list[_Proc] = []

    def _env(self) -> dict:
        e = dict(os.environ)
        e.update(NO_MULTICAST_ENV)
        e["PYTHONPATH"] = str(self.tree)   # the side's tree only: never this checkout's copy
        e["PYTHONUNBUFFERED"] = "1"
        e.update(self.env)
        return e

    def start(self, timeout_s: float = 1200.0) -> list[dict]:
        """Start the ranks and wait until each says it is ready (its Buffer exists: the JIT build
        of the side's extension is done). Returns the ready replies in rank order."""
        self.spawn()
        return self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 1200.0) -> list[dict]:
        return self._collect(timeout_s, "start")

    def spawn(self) -> None:
        """Start the rank processes without waiting (two sides build their extensions in parallel)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        for r in range(self.ranks):
            log = self.log_dir / f"{self.side}-rank{r}.log"
            p = subprocess.Popen([self.python, "-c", BOOT, str(self.worker), "--rank", str(r), "--world",
                                  str(self.ranks), "--port", str(port), "--inputs", str(self.inputs)]
                                 + ([] if self.profile else ["--no-profile"]),
                                 cwd=self.tree, env=self._env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1)
            proc = _Proc(r, p, log=log)
            threading.Thread(target=_pump, args=(p.stdout, proc.replies, log), daemon=True).start()
            self.procs.append(proc)

    def request(self, cmd: dict, timeout_s: float = 600.0) -> list[dict]:
        """Send one command to every rank; return their replies in rank order."""
        line = json.dumps(cmd) + "\n"
        for p in self.procs:
            try:
                p.popen.stdin.write(line)
                p.popen.stdin.flush()
            except (BrokenPipeError, OSError):
                raise WorkerError(self._died(p)) from None
        return self._collect(timeout_s, cmd.get("cmd", "?"))

    def _collect(self, timeout_s: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        out = []
        for p in self.procs:
            while True:
                try:
                    rep = p.replies.get(timeout=0.2)
                    break
                except queue.Empty:
                    if p.popen.poll() is not None and p.replies.empty():
                        raise WorkerError(self._died(p)) from None
                    if time.monotonic() > deadline:
                        raise WorkerError(f"side {self.side} rank {p.rank}: no answer to {what!r} within "
                                          f"{timeout_s:.0f} s (log: {p.log})") from None
            if not rep.get("ok"):
                raise WorkerError(f"side {self.side} rank {p.rank} ({self.tree}): {rep.get('error')}\n"
                                  f"{rep.get('traceback', '')}(log: {p.log})")
            out.append(rep)
        return out

    def _died(self, p: _Proc) -> str:
        tail = ""
        if p.log and p.log.exists():
            tail = "\n".join(p.log.read_text(errors="replace").splitlines()[-15:])
        return (f"side {self.side} rank {p.rank} ({self.tree}) exited with code {p.popen.poll()}; "
                f"last lines of {p.log}:\n{tail}")

    def close(self, timeout_s: float = 30.0) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                try:
                    p.popen.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                    p.popen.stdin.flush()
                    p.popen.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
        end = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.popen.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(timeout=10)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# The builds a side needs, as separate processes so they run in parallel (a worker would run them
# one after the other): the compiled-out and the instrumented ep_core extension, and the
# recorder's clock extension (profiled rounds). A tree without these loaders builds on first use.
BUILDS = {"noprof": "import ep_core._ext as X; X.load(False)",
          "prof": "import ep_core._ext as X; X.load(True)",
          "record": "from profiler.record.build import load_record_extension as L; L(profile=False)"}


def prebuild(sets: list["WorkerSet"], timeout_s: float = 1500.0) -> list[str]:
    """Build every side's extensions in parallel (one process per build and distinct cache; sides
    that share a cache build once). Returns what failed, for the log: a failed build is not fatal
    here, the side's workers then build on first use or report the error themselves."""
    jobs, seen = [], set()
    for ws in sets:
        ws.log_dir.mkdir(parents=True, exist_ok=True)
        names = ["noprof"] + (["prof", "record"] if ws.profile else [])
        for n in names:
            key = (str(ws.tree), ws.env.get("EPSCOPE_BUILD_DIR"), n)
            if key in seen:
                continue
            seen.add(key)
            log = open(ws.log_dir / f"{ws.side}-build-{n}.log", "w")
            jobs.append((f"side {ws.side} {n}", log, subprocess.Popen([ws.python, "-c", BUILDS[n]], cwd=ws.tree,
                                                                      env=ws._env(), stdout=log,
                                                                      stderr=subprocess.STDOUT)))
    failed = []
    end = time.monotonic() + timeout_s
    for what, log, p in jobs:
        try:
            rc = p.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            failed.append(f"{what}: exit {rc} (log {log.name})")
    return failed


def _pump(stream, replies: "queue.Queue[dict]", log: Path) -> None:
    with open(log, "a", buffering=1) as f:
        for line in stream:
            if line.startswith(REPLY_PREFIX):
                try:
                    replies.put(json.loads(line[len(REPLY_PREFIX):]))
                    continue
                except json.JSONDecodeError:
                    pass
            f.write(line)


def slowest_rank(replies: list[dict], metrics=METRICS) -> dict[str, list[float]]:
    """Per metric and iteration, the slowest rank's value (the op is as slow as its slowest rank)."""
    out = {}
    for m in metrics:
        cols = [r["samples"].get(m, []) for r in replies]
        n = min((len(c) for c in cols), default=0)
        if any(len(c) != n for c in cols):
            raise WorkerError(f"metric {m}: ranks returned {[len(c) for c in cols]} iterations")
        out[m] = [max(c[i] for c in cols) for i in range(n)]
    return out


def interleave(sides: list[str], rounds: int) -> list[tuple[str, int]]:
    """(side, round) in recording order: every side's round 0, then every side's round 1, ..."""
    return [(s, i) for i in range(rounds) for s in sides]
