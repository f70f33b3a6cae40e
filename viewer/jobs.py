"""The viewer's background computations: a fixed pool of worker threads and a registry of jobs.

A page that needs a heavy result (a 10 M-event run's load, timeline index or critical path takes
seconds to a minute on the 2-core development machine) asks for it here and draws at once: the
run header and a progress state, filled in when the job is done (viewer.pages.progress polls).

Bounded by construction:
  * `workers` threads in all, started once (no thread per request or per run);
  * one job per key at a time: asking again for a queued or running key returns that job
    (a key names a run and a result, e.g. ("synthetic-10m", "critical")), so one computation per
    (run, analysis) runs at once, whoever asks;
  * the registry keeps the queued and running jobs and the last `keep` finished ones (their
    state and error message for the page; the results themselves live in the run's cache).
Jobs run in priority order (WANTED: a page is waiting for it; AHEAD: computed ahead of the user),
then in the order asked; asking again with a higher priority moves a queued job up. With two or
more workers, at most workers - 1 run AHEAD jobs: one is always free for the page the user opens
(the critical path of a 10 M-event run, computed ahead, takes 16 s of CPU).

Threads, not processes: the jobs read the run's event table in memory (0.5 GB for 10 M events);
a process would load the run again and send its results back. numpy, pandas and pyarrow release
the interpreter lock for most of their work, so the server keeps answering while a job runs.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

WANTED, AHEAD = 0, 1          # priorities: lower runs first
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
# 2 workers: a page's job is not stuck behind one computed ahead (the critical path of 10 M
# events takes 16 s of CPU), and the 2-core machine is not oversubscribed.
WORKERS = 2
KEEP_FINISHED = 256
# How long a page request waits for its jobs before it draws the progress state instead: the
# bundled runs' analyses take tens of ms and their pages come whole, a 10 M-event run's page
# comes as a progress state well within issue 14's 2 s to a first paint.
READY_WAIT_S = 0.25


@dataclass
class Job:
    key: Hashable
    label: str                     # what the progress state calls it: "critical path"
    fn: Callable[[], Any] = field(repr=False)
    priority: int
    seq: int
    state: str = QUEUED
    step: str = ""                 # what it is doing now, set by the job (`current().step = ...`)
    asked: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    error: str | None = None       # the sentence the page shows when it failed

    @property
    def active(self) -> bool:
        return self.state in (QUEUED, RUNNING)

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since asked (queued), since started (running), or the run time (finished)."""
        now = time.monotonic() if now is None else now
        if self.started is None:
            return now - self.asked
        return (self.finished if self.finished is not None else now) - self.started


_local = threading.local()


def current() -> Job | None:
    """The job the calling thread runs (None outside a job): lets a job report its step."""
    return getattr(_local, "job", None)


def describe_error(e: BaseException) -> str:
    msg = " ".join(str(e).split())[:600]
    return msg if type(e).__name__ == "ViewerError" else f"{type(e).__name__}: {msg}"


class Jobs:
    """submit(key, fn, label, priority) -> Job; get(key); wait(keys, timeout)."""

    def __init__(self, workers: int = WORKERS, keep: int = KEEP_FINISHED, wait_s: float = READY_WAIT_S):
        assert workers >= 1 and keep >= 0 and wait_s >= 0
        self.workers = workers
        self.keep = keep
        self.wait_s = wait_s       # what a page request waits for its jobs (pages.progress)
        self._jobs: dict[Hashable, Job] = {}          # queued and running
        self._finished: "OrderedDict[Hashable, Job]" = OrderedDict()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # -- asking ---------------------------------------------------------------------------------
    def submit(self, key: Hashable, fn: Callable[[], Any], label: str = "", priority: int = WANTED) -> Job:
        """The active job of `key`, or a new one running fn() (its return value is dropped: fn
        stores its result where the page reads it)."""
        with self._cond:
            job = self._jobs.get(key)
            if job is not None:
                if job.state == QUEUED and priority < job.priority:
                    job.priority = priority
                    self._cond.notify_all()
                return job
            job = Job(key, label or str(key), fn, priority, next(self._seq))
            self._jobs[key] = job
            self._finished.pop(key, None)
            if len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, name=f"epscope-job-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            self._cond.notify_all()
            return job

    def get(self, key: Hashable) -> Job | None:
        with self._cond:
            return self._jobs.get(key) or self._finished.get(key)

    def forget(self, key: Hashable) -> None:
        """Drop a finished job's record (a failed one is then tried again when next asked)."""
        with self._cond:
            self._finished.pop(key, None)

    def wait(self, keys, timeout: float) -> bool:
        """Block until none of `keys` has an active job, at most `timeout` seconds; True if so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(k in self._jobs for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def active(self) -> list[Job]:
        with self._cond:
            return sorted(self._jobs.values(), key=lambda j: (j.priority, j.seq))

    @property
    def threads(self) -> int:
        return len(self._threads)

    # -- working --------------------------------------------------------------------------------
    def _next(self) -> Job:
        with self._cond:
            while True:
                ahead_ok = self.workers == 1 or sum(
                    j.state == RUNNING and j.priority == AHEAD for j in self._jobs.values()) < self.workers - 1
                queued = [j for j in self._jobs.values() if j.state == QUEUED and (ahead_ok or j.priority < AHEAD)]
                if queued:     # a handful of jobs at most (runs in memory x results): a scan is enough
                    job = min(queued, key=lambda j: (j.priority, j.seq))
                    job.state, job.started = RUNNING, time.monotonic()
                    return job
                self._cond.wait()

    def _work(self) -> None:
        while True:
            job = self._next()
            _local.job = job
            error = None
            try:
                job.fn()
            except BaseException as e:   # a job's failure is the page's message, never the worker's end
                error = describe_error(e)
            finally:
                _local.job = None
            with self._cond:
                job.finished = time.monotonic()
                job.state, job.error = (FAILED, error) if error is not None else (DONE, None)
                del self._jobs[job.key]
                self._finished[job.key] = job
                while len(self._finished) > self.keep:
                    self._finished.popitem(last=False)
                self._cond.notify_all()
