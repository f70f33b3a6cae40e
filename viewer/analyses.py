"""The per-run results every page shares, computed once per loaded run (Dash-free).

Each accessor caches its result on the LoadedRun (catalog.LoadedRun.cached), so switching pages
or zooming never recomputes an analysis. Pages do not compute them in the request: they `request`
the results they need as background jobs (viewer.jobs, one per run and result), draw a progress
state until `ready` says all are in the cache, and `warm` asks for the rest ahead of the user.
Every page sees the same table: the run's events with unfinished waits ended where their kernel
stopped (profiler.analysis.unfinished, using the run's launch table), so a timed-out run's waits
are drawn, counted and named the same way everywhere.
"""
from __future__ import annotations

import pandas as pd

from profiler import analysis
from profiler.analysis import unfinished

from . import jobs
from .catalog import LoadedRun
from .pages.timeline import logic as timeline_logic


def registry(run: LoadedRun):
    """The run's phase registries as the profiler parses them (profiler.runstore.Run.registries)."""
    return run.cached("registries", lambda: run.run.registries) or None


def events(run: LoadedRun):
    """The run's event table with unfinished waits closed (the same object on every call)."""
    return run.cached("events_closed", lambda: unfinished.close(run.events, run.launches))


def timeline_index(run: LoadedRun) -> timeline_logic.TimelineIndex:
    return run.cached("timeline_index", lambda: timeline_logic.add_base(
        timeline_logic.build_index(events(run), run.manifest)))


# Every analysis of a run is given the same table, registry and launch table, so they share one
# dependency graph and one time model (graph.build caches on those three; issue 20 found the
# critical path and idle building two graphs because only idle was given the launches).
def critical(run: LoadedRun) -> analysis.CriticalPath:
    return run.cached("critical_path", lambda: analysis.critical_path(events(run), registry=registry(run),
                                                                      launches=run.launches))


def idle(run: LoadedRun) -> analysis.IdleReport:
    return run.cached("idle", lambda: analysis.idle_warps(events(run), registry=registry(run), launches=run.launches))


def barriers(run: LoadedRun) -> analysis.BarrierReport:
    return run.cached("barriers", lambda: analysis.barrier_contention(events(run), registry=registry(run),
                                                                      launches=run.launches))


def what_if_key(phase: str, speedup: float, rank) -> tuple:
    return ("what_if", phase, round(float(speedup), 6), tuple(rank) if isinstance(rank, list) else rank)


def what_if(run: LoadedRun, phase: str, speedup: float, rank) -> pd.DataFrame:
    """The what-if's summary per iteration (what the page shows), re-timing the graph the
    critical path was found on, without the re-timed run's own path. Only the summary is kept:
    the full result carries the re-timed event table (a copy of the run's, 0.5 GB at 10 M events)."""
    return run.cached(what_if_key(phase, speedup, rank), lambda: analysis.what_if(
        events(run), phase=phase, speedup=speedup, rank=rank, registry=registry(run), graph=critical(run).graph,
        new_path=False).summary)


# name -> (what the progress state calls it, the accessor, its key in the run's cache)
RESULTS = {
    "timeline_index": ("timeline index", timeline_index, "timeline_index"),
    "critical": ("critical path", critical, "critical_path"),
    "idle": ("idle warps", idle, "idle"),
    "barriers": ("barrier contention", barriers, "barriers"),
}


def ready(catalog, run_id: str, names) -> LoadedRun | None:
    """The loaded run when every result in `names` is computed, else None (never computes)."""
    run = catalog.loaded(run_id)
    if run is None or not all(run.has(RESULTS[n][2]) for n in names):
        return None
    return run


def _compute(catalog, run_id: str, accessor) -> None:
    job = jobs.current()
    if job is not None and catalog.loaded(run_id) is None:
        n = catalog.entry(run_id).num_events
        job.step = f"reading {n:,} events" if n else "reading the events"
    run = catalog.load(run_id)
    if job is not None:
        job.step = ""
    accessor(run)


def request(catalog, run_id: str, names, priority: int = jobs.WANTED, retry: bool = False) -> list[jobs.Job]:
    """Ask for `names` as background jobs (one per run and result: asking again returns the job
    in flight). retry: a failed job is tried again (a new visit of the page) instead of reported."""
    out = []
    for n in names:
        label, accessor, _ = RESULTS[n]
        key = (run_id, n)
        if retry:
            old = catalog.jobs.get(key)
            if old is not None and old.state == jobs.FAILED:
                catalog.jobs.forget(key)
        old = catalog.jobs.get(key)
        if old is not None and old.state == jobs.FAILED:
            out.append(old)
            continue
        out.append(catalog.jobs.submit(key, lambda a=accessor: _compute(catalog, run_id, a), label, priority))
    return out


def request_what_if(catalog, run_id: str, phase: str, speedup: float, rank) -> jobs.Job:
    """A what-if as a background job (it re-times the whole dependency graph: 24 s of CPU on a
    10 M-event run); its result lands in the run's bounded parameter cache (what_if)."""
    key = (run_id,) + what_if_key(phase, speedup, rank)
    return catalog.jobs.submit(key, lambda: _compute(catalog, run_id, lambda run: what_if(run, phase, speedup, rank)),
                               f"what-if: {phase} {100 * speedup:g}% faster")


def warm(catalog, run_id: str) -> None:
    """Ask for every result of the run ahead of the user (after what the page needs)."""
    run = catalog.loaded(run_id)
    names = [n for n, (_, _, ck) in RESULTS.items() if run is None or not run.has(ck)]
    if names:
        request(catalog, run_id, names, priority=jobs.AHEAD)
