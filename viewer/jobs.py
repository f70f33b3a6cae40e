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
    state and error message for the page; the results themselves live in the run's cache);
  * at most `max_queued` jobs a page waits for (WANTED) are queued at once: one more raises
    Busy, which the page shows as "busy, try again" (a 30 s flood of distinct what-ifs kept
    the server busy 75 s after its clients left, issue 19);
  * a queued WANTED job nobody has asked for in `abandon_s` (its page stopped polling: the tab
    closed, the user picked another value) is dropped before it runs. A running job is not
    interrupted (the analyses have no cancellation points); it finishes and is kept.
Jobs run in priority order (WANTED: a page is waiting for it; AHEAD: computed ahead of the user),
then in the order asked; asking again with a higher priority moves a queued job up. With two or
more workers, at most workers - 1 run AHEAD jobs: one is always free for the page the user opens
(the critical path of a 10 M-event run, computed ahead, takes 16 s of CPU).

Threads, not processes: the jobs read the run's event table in memory (0.5 GB for 10 M events);
a process would load the run again and send its results back. numpy, pandas and pyarrow release
the interpreter lock for most of their work, so the server keeps answering while a job runs.
"""
from __future__ import annotations

import gc
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

WANTED, AHEAD = 0, 1          # priorities: lower runs first
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
# 2 workers: a page's job is not stuck behind one computed ahead (the critical path of 10 M
# events takes 16 s of CPU), and the 2-core machine is not oversubscribed.
WORKERS = 2
KEEP_FINISHED = 256
# Queued jobs a page waits for, all runs together: two per worker keeps both workers busy while
# a flood of new values is refused instead of queued for minutes.
MAX_QUEUED = 8
# A waiting page asks again every 0.4 s and waits up to 0.3 s (pages.progress.layout TICK_MS,
# POLL_WAIT_S): 3 s without an ask is ~4 missed polls.
ABANDON_S = 3.0
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
    last_asked: float = field(default_factory=time.monotonic)   # the latest submit of this key
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


def _malloc_trim():
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):   # not glibc: nothing to hand back this way
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Hand the heap's free pages back to the system (glibc malloc_trim). A what-if's temporaries
    (the re-timed graph: tens of MB on a 200 k-event run) are freed when it ends, but glibc keeps
    freed pages in its arenas (with viewer.server's arena cap, a 30 s what-if flood's memory
    went from +50-57 % to +3-9 % of the start once idle: benchmarks/bench_whatif_flood.py).
    Called when a worker runs out of work and when the server's last connection closes."""
    gc.collect()   # cyclic garbage first (a Dash answer's component tree), then the pages it held
    if _TRIM is not None:
        _TRIM(0)


def current() -> Job | None:
    """The job the calling thread runs (None outside a job): lets a job report its step."""
    return getattr(_local, "job", None)


class Busy(Exception):
    """Too many computations are queued; the page says so and the user asks again later."""


def describe_error(e: BaseException) -> str:
    msg = " ".join(str(e).split())[:600]
    return msg if type(e).__name__ == "ViewerError" else f"{type(e).__name__}: {msg}"


class Jobs:
    """submit(key, fn, label, priority) -> Job; get(key); wait(keys, timeout)."""

    def __init__(self, workers: int = WORKERS, keep: int = KEEP_FINISHED, wait_s: float = READY_WAIT_S,
                 max_queued: int = MAX_QUEUED, abandon_s: float = ABANDON_S):
        assert workers >= 1 and keep >= 0 and wait_s >= 0 and max_queued >= 1 and abandon_s > 0
        self.workers = workers
        self.keep = keep
        self.max_queued = max_queued
        self.abandon_s = abandon_s
        self.cancelled = 0         # queued jobs dropped because nobody asked for them any more
        self.wait_s = wait_s       # what a page request waits for its jobs (pages.progress)
        self._jobs: dict[Hashable, Job] = {}          # queued and running
        self._finished: "OrderedDict[Hashable, Job]" = OrderedDict()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # -- asking ---------------------------------------------------------------------------------
    def submit(self, key: Hashable, fn: Callable[[], Any], label: str = "", priority: int = WANTED) -> Job:
        """The active job of `key`, or a new one running fn() (its return value is dropped: fn
        stores its result where the page reads it). Asking again keeps a queued job alive
        (abandon_s); Busy when max_queued WANTED jobs are queued already."""
        with self._cond:
            now = time.monotonic()
            job = self._jobs.get(key)
            if job is not None:
                job.last_asked = now
                if job.state == QUEUED and priority < job.priority:
                    job.priority = priority
                    self._cond.notify_all()
                return job
            self._drop_abandoned(now)
            if priority == WANTED and sum(j.state == QUEUED and j.priority == WANTED
                                          for j in self._jobs.values()) >= self.max_queued:
                raise Busy(f"the viewer is busy: {self.max_queued} computations are waiting already; "
                           "try again in a moment")
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
    def _drop_abandoned(self, now: float) -> None:
        """Forget queued WANTED jobs nobody asked for within abandon_s (lock held)."""
        dropped = False
        for key, j in list(self._jobs.items()):
            if j.state == QUEUED and j.priority == WANTED and now - j.last_asked > self.abandon_s:
                j.state, j.finished = CANCELLED, now
                del self._jobs[key]
                self.cancelled += 1
                dropped = True
        if dropped:
            self._cond.notify_all()   # waiters on a dropped key stop waiting

    def _next(self) -> Job:
        with self._cond:
            while True:
                self._drop_abandoned(time.monotonic())
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
            with self._cond:
                idle = not any(j.state == QUEUED for j in self._jobs.values())
            if idle:
                release_memory()
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
