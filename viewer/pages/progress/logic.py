"""What a page waiting for background jobs says about them (Dash-free).

One line per result the page needs: queued (and behind how many), what it is doing now and for
how long, done in how long, or failed with the error's sentence.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ... import jobs as J


@dataclass(frozen=True)
class Step:
    label: str
    state: str        # viewer.jobs: queued, running, done, failed
    detail: str       # what it is doing now ("reading 10,217,232 events") or the error
    seconds: float


@dataclass(frozen=True)
class Progress:
    steps: tuple[Step, ...]

    @property
    def error(self) -> str | None:
        return next((f"{s.label}: {s.detail}" for s in self.steps if s.state == J.FAILED), None)

    @property
    def done(self) -> bool:
        return all(s.state == J.DONE for s in self.steps)


def progress(wanted: list[J.Job], active: list[J.Job], now: float | None = None) -> Progress:
    """wanted: the page's jobs; active: every queued or running job (Jobs.active(), in the order
    they will run), to say how many a queued one waits behind."""
    now = time.monotonic() if now is None else now
    steps = []
    for j in wanted:
        if j.state == J.QUEUED:
            ahead = sum(1 for a in active if a.state == J.RUNNING or (a.state == J.QUEUED and
                                                                     (a.priority, a.seq) < (j.priority, j.seq)))
            detail = f"waiting for {ahead} computation{'s' if ahead != 1 else ''} ahead of it" if ahead else "starting"
        elif j.state == J.RUNNING:
            detail = j.step or "computing"
        elif j.state == J.FAILED:
            detail = j.error or "failed"
        else:
            detail = "done"
        steps.append(Step(j.label, j.state, detail, j.elapsed(now)))
    return Progress(tuple(steps))


def line(s: Step) -> str:
    if s.state == J.DONE:
        return f"{s.label}: done in {s.seconds:.1f} s"
    if s.state == J.FAILED:
        return f"{s.label}: failed: {s.detail}"
    return f"{s.label}: {s.detail}… {s.seconds:.1f} s"


def run_summary(entry) -> str:
    """What is known of a run before it is loaded: its size and shape, from the manifest."""
    m = entry.manifest or {}
    bits = []
    if entry.num_events:
        bits.append(f"{entry.num_events:,} events")
    ranks = (m.get("config") or {}).get("ranks") or (m.get("gpu") or {}).get("count")
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        bits.append(f"{ranks} rank{'s' if ranks != 1 else ''}")
    its = (m.get("headline") or {}).get("iterations")
    if isinstance(its, int) and not isinstance(its, bool):
        bits.append(f"{its} iteration{'s' if its != 1 else ''}")
    return " · ".join(bits)
