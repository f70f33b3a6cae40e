"""The per-run results every page shares, computed once per loaded run (Dash-free).

Each accessor caches its result on the LoadedRun (catalog.LoadedRun.cached), so switching pages
or zooming never recomputes an analysis. Pages do not compute them in the request: they `request`
the results they need as background jobs (viewer.jobs, one per run and result), draw a progress
state until `ready` says all are in the cache, and `warm` asks for the rest ahead of the user.
Every page sees the same table: the run's events with unfinished waits ended where their kernel
stopped (profiler.analysis.unfinished, using the run's launch table), so a timed-out run's waits
are drawn, counted and named the same way everywhere.

Stored results first (issue 20): a run saved or analysed by `epscope analyze` carries its
analyses (profiler.analysis.stored, RUN/analysis/); when they are current (this analysis version,
the run's data unchanged) the critical path, idle and barriers accessors return them without
reading the event table. Only what needs the dependency graph (the exact what-if) builds it from
the events then. A run without them (issue 31) is analysed as `epscope analyze` analyses it
(summary.analyze: a big run chunk by chunk from its file), in the background job that first needs
a result, and what was computed is kept (viewer.results: in the run, else in the viewer's cache),
so the next start reads them as an analysed run's.
"""
from __future__ import annotations

import dataclasses
import threading

import pandas as pd

from profiler import analysis
from profiler.analysis import chunked, stored, summary, unfinished
from profiler.analysis.whatif import saving_bound
from profiler.store.runreader import EventReader

from . import jobs, results
from .cache import MISSING
from .catalog import LoadedRun
from .pages.timeline import logic as timeline_logic


def registry(run: LoadedRun):
    """The run's phase registries as the profiler parses them (profiler.store.runstore.Run.registries)."""
    return run.cached("registries", lambda: run.run.registries) or None


def events(run: LoadedRun):
    """The run's event table with unfinished waits closed (the same object on every call)."""
    job = jobs.current()
    if job is not None and not run.events_read:
        job.step = f"reading {run.run.num_events:,} events"
    try:
        return run.cached("events_closed", lambda: unfinished.close(run.events, run.launches))
    finally:
        if job is not None:
            job.step = ""


def stored_results(run: LoadedRun) -> stored.Stored | None:
    """The run's stored analyses when they are current (in the run, else in the viewer's cache:
    viewer.results), else None (read once per loaded run: a run rewritten on disk is loaded
    again, with a new cache)."""
    return run.cached("stored", lambda: results.load(run.entry.path, run=run.run))   # bound to what the run read


def _analysed(run: LoadedRun) -> chunked.Results:
    """The run's analyses as `epscope analyze` computes them (summary.analyze), kept where the
    next start finds them (viewer.results.save)."""
    def compute():
        if not _big(run):
            run.events                      # read through the catalog (damage shows in the Runs list)
        job = jobs.current()
        if job is not None:
            job.step = f"analysing {run.run.num_events:,} events"
        res = summary.analyze(run.run)
        if job is not None:
            job.step = "keeping the results"
        results.save(run.run, res)         # bound to the bytes the analysis read (summary.binding)
        if job is not None:
            job.step = ""
        return res
    return run.cached("analysed", compute)


def _results(run: LoadedRun):
    """What the pages read: the stored results, else the analyses computed now (the same fields:
    critical, idle, barriers, compare; a computed critical path keeps its graph)."""
    s = stored_results(run)
    return s if s is not None else _analysed(run)


def span_phases(run: LoadedRun) -> list[str]:
    """The run's span phases (the what-if's choices): stored, else read from the events."""
    s = stored_results(run)
    return run.cached("span_phases", lambda: list(s.span_phases) if s is not None else stored.span_phases(run.events))


def ranks(run: LoadedRun) -> list[int]:
    s = stored_results(run)
    return run.cached("ranks", lambda: list(s.ranks) if s is not None else stored.ranks_of(run.events))


def _overview_backed(run: LoadedRun) -> bool:
    """Whether the run's timeline is drawn from its stored overview (a big run with current stored
    results) rather than from a full index of its events."""
    if run.run.num_events <= timeline_logic.FULL_INDEX_EVENTS:
        return False
    s = stored_results(run)
    return s is not None and s.timeline is not None


def timeline_index(run: LoadedRun) -> timeline_logic.TimelineIndex:
    """The timeline's index: of a big run with stored results, its lanes and phases from the stored
    overview (no events read: views read their window's row groups, timeline_window); else built
    from the whole event table (47 bytes an event and 0.3 GB of grid at 10 M events, issue 20)."""
    def get():
        if _overview_backed(run):
            return timeline_logic.index_from_overview(stored_results(run).timeline, run.manifest)
        return timeline_logic.add_base(timeline_logic.build_index(events(run), run.manifest))
    return run.cached("timeline_index", get)


def _event_reader(run: LoadedRun) -> tuple[EventReader, threading.Lock]:
    """One open reader of the run's events (its checksum checked once: 0.9 s for 400 MB) and the
    lock its reads take turns on (one open file)."""
    return run.cached("event_reader", lambda: (EventReader(run.run), threading.Lock()))


# the event columns the timeline's index reads (profiler.store.schema.COLUMNS less launch, kernel, sm, iteration)
_TIMELINE_COLUMNS = ["rank", "block", "warp", "role", "kind", "phase", "begin_ns", "end_ns", "payload", "open"]


def _window_events(run: LoadedRun, iterations: tuple, ranks: tuple) -> pd.DataFrame:
    """The events of some iterations of some ranks (their row groups only), unfinished waits closed
    as the whole table's are (a launch's events are all in its rank's iteration); kept in the
    catalog's bounded parameter cache, so the next zoom inside them reads nothing."""
    def build():
        reader, lock = _event_reader(run)
        with lock:
            ev = reader.read(iterations=iterations, ranks=ranks)
        return unfinished.close(ev, run.launches)[_TIMELINE_COLUMNS]
    return run.cached(("timeline_events", iterations, ranks), build)


def timeline_window(run: LoadedRun, iterations, ranks, t0: float, t1: float) -> timeline_logic.TimelineIndex:
    """The timeline index of the events of [t0, t1] of some iterations of some ranks, numbered as
    the run's index (a window's index holds its own events only: building it costs what is on
    screen, not the iteration's 2.5 M events of a 10 M-event run)."""
    ev = _window_events(run, tuple(int(i) for i in iterations), tuple(int(r) for r in ranks))
    m = (ev["end_ns"].to_numpy() >= t0) & (ev["begin_ns"].to_numpy() <= t1)
    return timeline_logic.conform(timeline_logic.build_index(ev[m], run.manifest), timeline_index(run))


def timeline_view(run: LoadedRun, level: str, ranks, blocks, t0, t1) -> timeline_logic.View:
    """The timeline's view of a window (what the page draws), from whichever index the run has."""
    return timeline_logic.compute_view(timeline_index(run), level, ranks, blocks, t0, t1,
                                       read=lambda its, rks, a, b: timeline_window(run, its, rks, a, b))


# Every analysis of a run is given the same table, registry and launch table, so they share one
# dependency graph and one time model (graph.build caches on those three; issue 20 found the
# critical path and idle building two graphs because only idle was given the launches).
# A run of more than chunked.MAX_EVENTS events is analysed in chunks of whole iterations
# (profiler.analysis.chunked: the same results; the analyses hold one chunk's graph at a time
# instead of the run's, which cost about 260 bytes per event on top of the table, issue 20).
def _big(run: LoadedRun) -> bool:
    return run.run.num_events > chunked.MAX_EVENTS


def _chunked(run: LoadedRun) -> chunked.Results:
    return run.cached("chunked", lambda: chunked.analyze(events(run), registry=registry(run), launches=run.launches,
                                                         max_events=chunked.MAX_EVENTS))


def run_chunks(run: LoadedRun) -> int:
    """How many chunks of iterations the run's analyses were computed in here (1: the whole run,
    or read from storage)."""
    return _analysed(run).chunks if run.has("analysed") else 1


def _computed_critical(run: LoadedRun) -> analysis.CriticalPath:
    """The critical path with its dependency graph, for the exact what-if of a run whose path came
    from storage (the graph is not stored)."""
    if _big(run):
        return run.cached("computed_critical_path", lambda: _chunked(run).critical)
    return run.cached("computed_critical_path", lambda: analysis.critical_path(
        events(run), registry=registry(run), launches=run.launches))


def critical(run: LoadedRun) -> analysis.CriticalPath:
    """The critical path: stored (without its graph), else computed (with it)."""
    return run.cached("critical_path", lambda: _results(run).critical)


def graph(run: LoadedRun):
    """The dependency graph the critical path was found on (a chunked.Summaries for a run analysed
    in chunks); built from the events when the critical path came from storage."""
    g = critical(run).graph
    return g if g is not None else _computed_critical(run).graph


def idle(run: LoadedRun) -> analysis.IdleReport:
    return run.cached("idle", lambda: _results(run).idle)


def barriers(run: LoadedRun) -> analysis.BarrierReport:
    return run.cached("barriers", lambda: _results(run).barriers)


def what_if_key(phase: str, speedup: float, rank) -> tuple:
    return ("what_if", phase, round(float(speedup), 6), tuple(rank) if isinstance(rank, list) else rank)


def what_if(run: LoadedRun, phase: str, speedup: float, rank) -> pd.DataFrame:
    """The what-if's summary per iteration (what the page shows), re-timing the graph the
    critical path was found on, without the re-timed run's own path or a re-timed copy of the table
    (0.5 GB at 10 M events): only the summary is kept. A run stored in several chunks re-times
    each chunk from its stored what-if input (stored.Stored.what_if_summary: no event read, one
    chunk's input in memory at a time); another critical path read from storage has no graph: it
    is built here (in the what-if's background job)."""
    s = stored_results(run)
    if s is not None and s.what_if is not None:
        return run.cached(what_if_key(phase, speedup, rank), lambda: s.what_if_summary(
            phase=phase, speedup=speedup, rank=rank))
    g = graph(run)
    if isinstance(g, chunked.Summaries):      # a run analysed in chunks re-times chunk by chunk
        return run.cached(what_if_key(phase, speedup, rank), lambda: g.what_if_summary(
            phase=phase, speedup=speedup, rank=rank))
    return run.cached(what_if_key(phase, speedup, rank), lambda: analysis.what_if(
        events(run), phase=phase, speedup=speedup, rank=rank, registry=registry(run), graph=g,
        new_path=False, keep_retimed=False).summary)


def what_if_bound(run: LoadedRun, phase: str, speedup: float, rank) -> pd.DataFrame:
    """The what-if's instant first answer (profiler.analysis.whatif.saving_bound) from the critical
    path already computed: per iteration the most the faster phase can save."""
    return saving_bound(critical(run), phase=phase, speedup=speedup, rank=rank)


def _compare_inputs(run: LoadedRun):
    """What Compare reads of the run (profiler.analysis.compare.RunInputs): stored with its
    analyses, else computed with them (and kept: _analysed). Each run is read with its own registry."""
    name = run.entry.name
    s = stored_results(run)
    if s is not None:
        return s.compare_inputs(name=name, manifest=run.manifest)
    return dataclasses.replace(_analysed(run).compare, name=name, manifest=dict(run.manifest))


def _inputs_key(catalog, run_id: str) -> tuple:
    return ("compare_inputs", run_id, catalog.entry(run_id).signature)


def compare_inputs(catalog, run_id: str):
    """The run's RunInputs, kept in the catalog's per-run cache (not the loaded run's: Compare
    asks for more runs than the catalog keeps loaded)."""
    key = _inputs_key(catalog, run_id)
    got = catalog.per_run.get(key, MISSING)
    if got is MISSING:
        got = _compare_inputs(catalog.load(run_id))
        catalog.per_run.put(key, got)
    return got


def compare_inputs_ready(catalog, run_ids) -> bool:
    """Every run's compare inputs computed, and the op before entry of those with PyTorch traces."""
    return all(catalog.per_run.get(_inputs_key(catalog, r), MISSING) is not MISSING and
               (not _traced(catalog, r) or catalog.per_run.get(_before_entry_key(catalog, r), MISSING) is not MISSING)
               for r in run_ids)


def request_compare_inputs(catalog, run_ids, retry: bool = False) -> list[jobs.Job]:
    """Each run's RunInputs as a background job (one per run not computed yet; asking again returns
    the job in flight; runs beyond the queue's room are asked for on a later call, so a comparison
    of many runs fills the queue, never overflows it). retry: a failed job is tried again (a new
    click) instead of reported."""
    out = []
    for r in run_ids:
        if compare_inputs_ready(catalog, [r]):
            continue          # nothing to compute (a finished job's record may be gone: never re-run it)
        try:
            out.append(_ask(catalog, (r, "compare_inputs"), lambda r=r: _compare_side(catalog, r), "compare samples",
                            jobs.WANTED, retry))
        except jobs.Busy:
            break             # the queue is full: the rest are asked for by the page's next poll
    return out


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
        job.step = "opening the run"
    run = catalog.load(run_id)
    if job is not None:
        job.step = ""
    accessor(run)


def _ask(catalog, key, fn, label: str, priority: int, retry: bool) -> jobs.Job:
    """The job of `key`: the one in flight, a failed one (reported, or with retry forgotten and
    tried again), or a new one running fn()."""
    old = catalog.jobs.get(key)
    if old is not None and old.state == jobs.FAILED:
        if not retry:
            return old
        catalog.jobs.forget(key)
    return catalog.jobs.submit(key, fn, label, priority)


def request(catalog, run_id: str, names, priority: int = jobs.WANTED, retry: bool = False) -> list[jobs.Job]:
    """Ask for `names` as background jobs (one per run and result: asking again returns the job
    in flight). retry: a failed job is tried again (a new visit of the page) instead of reported."""
    out = []
    for n in names:
        label, accessor, _ = RESULTS[n]
        out.append(_ask(catalog, (run_id, n), lambda a=accessor: _compute(catalog, run_id, a), label, priority, retry))
    return out


def request_what_if(catalog, run_id: str, phase: str, speedup: float, rank) -> jobs.Job:
    """A what-if as a background job (it re-times the whole dependency graph: 24 s of CPU on a
    10 M-event run); its result lands in the run's bounded parameter cache (what_if)."""
    key = (run_id,) + what_if_key(phase, speedup, rank)
    return catalog.jobs.submit(key, lambda: _compute(catalog, run_id, lambda run: what_if(run, phase, speedup, rank)),
                               f"what-if: {phase} {100 * speedup:g}% faster")


# results that read the whole event table: not warmed for a run whose analyses are stored (opening
# it then reads no events at all: 10 M events are 0.5 GB of table and 0.3 GB of timeline index,
# read on the visit of the page that draws them); a big run's timeline index from its stored
# overview reads none, and is warmed
READS_EVENTS = ("timeline_index",)


def warm(catalog, run_id: str) -> None:
    """Ask for every result of the run ahead of the user (after what the page needs); for a run
    with stored results, only those that read no events."""
    run = catalog.loaded(run_id)
    stored_now = run is not None and run.has("stored") and stored_results(run) is not None
    skip = READS_EVENTS if stored_now and not _overview_backed(run) else ()
    names = [n for n, (_, _, ck) in RESULTS.items() if (run is None or not run.has(ck)) and n not in skip]
    if names:
        request(catalog, run_id, names, priority=jobs.AHEAD)


def has_torch_traces(manifest) -> bool:
    """Whether a run's manifest names attached PyTorch traces (profiler.torchtrace.store.FIELD)."""
    from profiler.torchtrace.store import FIELD
    return bool((manifest or {}).get(FIELD))


def torch_blame(run: LoadedRun):
    """(MergedTrace, Blame) of a run with attached PyTorch traces (profiler.torchtrace.report.run_blame,
    the function `epscope report` calls), (None, None) without; the time model stored, else the graph's."""
    def get():
        from profiler.analysis.timemodel import time_model
        from profiler.torchtrace.report import run_blame
        if not has_torch_traces(run.manifest):
            return None, None
        s = stored_results(run)
        return run_blame(run.run, s.time_model if s is not None else time_model(graph(run)))
    return run.cached("torch_blame", get)


def verdict(run: LoadedRun, page: str):
    """A page's verdict as every reader states it: the report's (critical_path, idle, barriers) with
    the op before a late entry named from the run's PyTorch traces when it has them
    (profiler.torchtrace.report.with_step, the function `epscope report` and the stored summary call)."""
    rep = {"critical_path": critical, "idle": idle, "barriers": barriers}[page](run)
    if not has_torch_traces(run.manifest):
        return rep.verdict

    def get():
        from profiler.torchtrace.report import with_step
        _, bl = torch_blame(run)
        return with_step(rep.verdict, bl, late_entry(run))
    return run.cached(f"verdict:{page}", get)


def late_entry(run: LoadedRun):
    """The run's late-entry decision (profiler.analysis.late_entry.decision on its graph), None
    when no rank ever entered late."""
    def get():
        from profiler.analysis import late_entry as LE
        from profiler.analysis.path_walk import iteration_totals
        g = graph(run)
        return LE.decision(g, iteration_totals(g))
    return run.cached("late_entry", get)


def _before_entry_key(catalog, run_id: str) -> tuple:
    return ("before_entry", run_id, catalog.entry(run_id).signature)


def _traced(catalog, run_id: str) -> bool:
    return has_torch_traces(catalog.entry(run_id).manifest)


def before_entry(catalog, run_id: str):
    """What Compare says the run's late rank ran before entry (profiler.torchtrace.report.BeforeEntry:
    the sentence every page adds to its verdict, from the same Blame and late entry), None for a run
    without PyTorch traces; kept in the catalog's per-run cache beside the run's compare inputs."""
    if not _traced(catalog, run_id):
        return None
    key = _before_entry_key(catalog, run_id)
    got = catalog.per_run.get(key, MISSING)
    if got is MISSING:
        from profiler.torchtrace.report import before_entry as named
        run = catalog.load(run_id)
        try:
            got = named(run.entry.name, torch_blame(run)[1], late_entry(run))
        except Exception:  # noqa: BLE001 (a trace that cannot be read names no op: Compare still compares,
            got = None     # as the stored summary does; the run's own pages and `epscope report` say why)
        catalog.per_run.put(key, got)
    return got


def _compare_side(catalog, run_id: str):
    """A run's part of a comparison, computed in one background job: its compare inputs, then (for
    a run with PyTorch traces) the op before entry."""
    compare_inputs(catalog, run_id)
    before_entry(catalog, run_id)
