"""The per-run results every page shares, computed once per loaded run (Dash-free).

Each accessor caches its result on the LoadedRun (catalog.LoadedRun.cached), so switching pages
or zooming never recomputes an analysis; `warm` computes them ahead in a background thread.
Every page sees the same table: the run's events with unfinished waits ended where their kernel
stopped (profiler.analysis.unfinished, using the run's launch table), so a timed-out run's waits
are drawn, counted and named the same way everywhere.
"""
from __future__ import annotations

import threading

from profiler import analysis
from profiler.analysis import unfinished

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


def critical(run: LoadedRun) -> analysis.CriticalPath:
    return run.cached("critical_path", lambda: analysis.critical_path(events(run), registry=registry(run)))


def idle(run: LoadedRun) -> analysis.IdleReport:
    return run.cached("idle", lambda: analysis.idle_warps(events(run), registry=registry(run), launches=run.launches))


def barriers(run: LoadedRun) -> analysis.BarrierReport:
    return run.cached("barriers", lambda: analysis.barrier_contention(events(run), registry=registry(run)))


def what_if(run: LoadedRun, phase: str, speedup: float, rank) -> analysis.WhatIf:
    key = ("what_if", phase, round(float(speedup), 6), tuple(rank) if isinstance(rank, list) else rank)
    return run.cached(key, lambda: analysis.what_if(events(run), phase=phase, speedup=speedup, rank=rank,
                                                    registry=registry(run)))


_warm_lock = threading.Lock()


def warm(run: LoadedRun) -> threading.Thread | None:
    """Compute the timeline index and the analyses in the background, once per loaded run, so
    the next page the user opens is served from the cache (a failure is not cached: the page
    asking for that result computes it again and shows the error as a message)."""
    with _warm_lock:
        if run._derived.get("_warming"):
            return None
        run._derived["_warming"] = True

    def go():
        for f in (timeline_index, critical, idle, barriers):
            try:
                f(run)
            except Exception:   # the page calling f again shows the error as a message
                pass
    t = threading.Thread(target=go, name=f"warm-{run.entry.run_id}", daemon=True)
    t.start()
    return t
