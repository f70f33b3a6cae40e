"""A run's analyses in chunks of whole iterations: memory bounded by the largest chunk, not the run.

Dependencies never cross iterations (graph.py), so the dependency graph of a chunk of whole
iterations is the whole run's graph restricted to them, and every per-iteration table an analysis
computes from it (path segments, slack, iteration totals, the time model's rows, barrier
arrivals, waits, per-warp sums) is the whole run's restricted to those iterations. So each chunk's
graph is built, its tables are computed and kept (they are small: per warp and launch, per
occurrence, per op), and the graph and the chunk's events are dropped before the next chunk.

The verdicts then read the combined tables through the same memoised accessors they read on one
graph (graph.memo keys): `Summaries` stands where a Graph stands, holding only `derived` (the
combined tables), the warnings and the semantics. The few quantities that are reductions over the
whole run are combined as such, before anything reads them:
  - each kernel's busiest warp (rendezvous.kernel_busy_top: NO_WORK_SHARE's reference): max, then
    the arrivals are classified useless or not against the run's maximum (rendezvous.classify);
  - each kernel's first start (imbalance.kernel_first: the op's order): min;
  - busy time per (kernel, phase, rank) (imbalance.phase_busy): summed, then the ratio to the
    median rank is taken over the sums (imbalance.phase_ratios);
  - the time model (timemodel.launch_rows per chunk, concatenated, then timemodel.from_rows: a
    late rank's GPU may still run the previous iteration's kernels when the others enter);
  - the run's rank count (the time model's missing ranks): from the whole table's ranks.
Only the idle page's balancing projection (a what-if) needs more than tables after the chunks are
done: it re-times each chunk (`Summaries.what_if_summary`) from the chunk's whatif.WhatIfInput,
made in the first pass (the re-timing input at the scale of the graph's targets, and the segments
a what-if can shorten: 61 MB a 2.5 M-event chunk, 33 MB packed as spilled) and left in `Spills.what_if`
(profiler.analysis.spill): on disk for `epscope analyze`, one chunk's input read back at a time and
stored with the results for the exact what-if of a stored run (issue 31); in memory (a viewer
analysing a run it does not store) only while the chunks so far leave a balancing what-if possible
(WHAT_IF_KEEP_RATIO), a chunk without one being read and built again. The report's tables
(profiler.analysis.run_tables) are summed over the chunks, their medians selected from the span
durations each chunk leaves in `Spills.durations`.

Each chunk's pass is `chunk_pass` (its graph, tables, timeline tiles, report share, what-if
input: a `ChunkOut`); `_finish` makes the run's results of the chunks' outputs. `analyze(events,
...)` splits a table in memory; `analyze_chunks(chunks, ...)` takes any iterable of event tables
of whole iterations (a reader of a run laid out by iteration feeds it without ever holding the
run); `analyze_run(run)` reads a run directory chunk by chunk (runreader.EventReader: row groups
chosen by their `iteration` statistics), or has a distributed engine's workers run the chunks'
passes (profiler.analysis.distributed: the same outputs, combined here). The results equal
critical_path / idle_warps / barrier_contention / time_model on the whole table
(tests/analysis/test_chunked.py holds them equal on every bundled run and on synthetic runs).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import importlib
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from . import barriers as B
from . import graph as G
from . import heap
from . import run_tables as RT
from . import idle as I
from . import imbalance as IM
from . import path_verdict as PV
from . import rendezvous as RV
from . import retime_fast
from . import timemodel as TM
from . import timeline_overview as TLO
from . import timeouts
from . import unfinished
from .semantics import semantics
from .spill import Spill
from .timemodel import TimeModel
from .whatif import WhatIfInput, what_if

# the module (the package re-exports its function under the module's name)
CP = importlib.import_module(".critical_path", __package__)
CMP = importlib.import_module(".compare", __package__)

# Events per chunk by default. The analyses peak near 230-270 bytes per event of a chunk above the
# table itself (RSS and tracemalloc, 1 M-event synthetic run, benchmarks/bench_analysis_memory.py),
# so a 2 M-event chunk keeps their own peak near 0.5 GB. Smaller chunks cost CPU: 1 M events in
# 4 chunks of 250 k took 2.0x the whole table's CPU (read passes and the balancing what-if's
# second pass), one chunk of 1 M 1.1x.
MAX_EVENTS = 2_000_000


@dataclass
class Spills:
    """Where a run's chunks leave what is needed after their pass (profiler.analysis.spill): the
    what-if's re-timing inputs and the report's span durations. In memory by default; in
    directories for `epscope analyze` (memory bounded by a chunk; the what-if inputs are then
    stored with the results: profiler.analysis.stored) and for a distributed run (workers write
    there, the driver reads)."""
    what_if: Spill = field(default_factory=Spill)
    durations: Spill = field(default_factory=Spill)

    @property
    def on_disk(self) -> bool:
        return self.what_if.on_disk and self.durations.on_disk


class LocalMap:
    """Runs a function over items here, in order (a distributed engine's `map` sends them to its
    workers instead: profiler.analysis.distributed)."""

    @staticmethod
    def map(fn, items, **shared) -> list:
        return [fn(x, **shared) for x in items]


LOCAL = LocalMap()


def _recorded_one(name: str, *, spill: Spill, tm) -> pd.DataFrame:
    """whatif.recorded of the chunk whose what-if input is `name` (it reads the input's lanes: its
    packed arrays are not expanded)."""
    return WhatIfInput.recorded_from_arrays(spill.get(name, packed=True), tm)


@dataclass
class WhatIfPart:
    """One chunk's what-if summary and its whatif.recorded, made from one read of its input."""
    summary: pd.DataFrame
    recorded: pd.DataFrame


def _what_if_one(item: tuple, *, spill: Spill, tm, path, phase: str, speedup: float, rank) -> WhatIfPart:
    """One chunk's what-if summary from its input (item: its name and its whatif.recorded, None when
    not made yet: made here from the same input, whose op-latency plan (timemodel.OpPlan, memoised
    on the input's lanes) then serves both, instead of a second read and plan in _recorded)."""
    name, rec = item
    inp = WhatIfInput.from_arrays(spill.get(name), tm)
    rec = inp.recorded() if rec is None else rec
    return WhatIfPart(inp.summary(phase=phase, speedup=speedup, rank=rank, path=path, rec=rec), rec)


def _path_only(cp) -> "CP.CriticalPath":
    """What a chunk's what-if reads of the run's critical path (its segments: path_phase_ns), to
    send to a worker without the rest."""
    return dataclasses.replace(cp, slack=cp.slack.iloc[:0], total_ns=cp.total_ns.iloc[:0],
                               path_ns=cp.path_ns.iloc[:0], verdict=None, graph=None)


@dataclass
class Summaries:
    """What the verdicts read of a dependency graph, combined over the chunks of a run.

    Stands where a graph.Graph stands for the accessors that read through graph.memo (the keys of
    `derived`); it has no points, lanes or intervals, so an accessor that would read them fails
    loudly instead of answering for a part of the run."""
    derived: dict
    warnings: tuple
    sem: object
    graph: G.Graph | None = field(default=None, repr=False)   # the graph of a run of one chunk
    # the whole run's recorded critical path (what-if's path_phase_ns reads it, not a new walk)
    path: object = field(default=None, repr=False)
    # per chunk of a run of several: the name of its what-if input in `spills.what_if` (None for a
    # chunk kept without one: _what_if_possible)
    what_if_inputs: list = field(default_factory=list, repr=False)
    spills: Spills | None = field(default=None, repr=False)
    # per input name: whatif.recorded of its chunk (the same for every what-if: made once, by the first
    # what-if that re-times the chunk or else by _finish's _recorded)
    what_if_recorded: dict = field(default_factory=dict, repr=False)
    mapper: object = field(default=LOCAL, repr=False)     # where the chunks' what-ifs run
    # to read and build again a chunk without an input (analyze_chunks's `chunks`, launch table)
    rechunk: Callable[[], Iterable] | None = field(default=None, repr=False)
    launches: pd.DataFrame | None = field(default=None, repr=False)

    def what_if_summary(self, *, phase: str, speedup: float, rank) -> pd.DataFrame:
        """whatif.what_if(...).summary over the whole run, chunk by chunk (iterations are
        independent: each chunk's rows are the whole run's for its iterations). A run of one chunk
        re-times the graph it kept; a run of several re-times each chunk's WhatIfInput (made in
        the first pass: reading and building each chunk's graph again was a quarter of the CPU of
        `epscope analyze` at 10 M events, benchmarks/NOTES.md), read back from the spill one chunk
        at a time, and reads and builds again only the chunks kept without one."""
        name = phase.split("/", 1)[-1]
        if name not in self.derived["phase_names"]:
            raise ValueError(f"what_if: the run records no phase {name!r}")
        if self.graph is not None:
            g = self.graph
            return what_if(g.events, phase=phase, speedup=speedup, rank=rank, graph=g, new_path=False,
                           missing_ok=True, keep_retimed=False, path=self.path).summary
        again = self._graphs({i for i, w in enumerate(self.what_if_inputs) if w is None})
        names = [w for w in self.what_if_inputs if w is not None]
        with retime_fast.kept_scratch():      # the chunks' solves here reuse one scratch (a worker's: its own)
            done = iter(self.mapper.map(_what_if_one, [(w, self.what_if_recorded.get(w)) for w in names],
                                        spill=self.spills.what_if, tm=self.derived["time_model"],
                                        path=_path_only(self.path), phase=phase, speedup=speedup, rank=rank))
        parts = []
        for w in self.what_if_inputs:
            if w is not None:
                part = next(done)
                self.what_if_recorded.setdefault(w, part.recorded)
                parts.append(part.summary)
                continue
            g = next(again)
            parts.append(what_if(g.events, phase=phase, speedup=speedup, rank=rank, graph=g, new_path=False,
                                 missing_ok=True, keep_retimed=False, path=self.path).summary)
            del g            # before the next chunk is read (as in analyze_chunks)
        return what_if_rows(parts)

    def _graphs(self, which: set) -> Iterator[G.Graph]:
        """The graphs of the chunks numbered `which`, in order (read and built again)."""
        if not which:
            return
        i = -1
        for item in self.rechunk():       # not enumerate(): see _analyze_chunks
            i += 1
            if i not in which:
                del item
                continue
            ev, la = _split(item)
            del item
            g = _graph(ev, self.sem, self.launches if la is None else la, self.derived["run_ranks"])
            del ev
            # the run's time model serves every chunk (what_if reads its rows of the chunk's launches)
            g.derived["time_model"] = self.derived["time_model"]
            yield g
            del g


@dataclass
class Results:
    critical: CP.CriticalPath
    idle: I.IdleReport
    barriers: B.BarrierReport
    time_model: TimeModel
    chunks: int                       # how many chunks the run was analysed in
    largest_chunk: int                # events in the largest
    compare: object = None            # compare.RunInputs (no name, no manifest): what Compare reads of the run
    timeline: object = None           # timeline_overview.Overview: what the viewer's timeline draws zoomed out
    run_tables: object = None         # run_tables.RunTables: what `epscope report` prints beside the verdicts
    span_phases: tuple = ()           # names of the run's span phases (the what-if's choices)
    ranks: tuple = ()                 # the ranks that recorded events
    # the what-if inputs of a run of several chunks, by chunk (names in spills.what_if; empty for a
    # run of one chunk, whose what-if re-times its graph): what stored.store writes beside the results
    what_if: tuple = ()
    spills: Spills | None = field(default=None, repr=False)
    what_if_recorded: dict = field(default_factory=dict, repr=False)   # Summaries.what_if_recorded


# -- chunking ----------------------------------------------------------------------------------
def iteration_chunks(counts: pd.Series, max_events: int) -> list[np.ndarray]:
    """Consecutive iterations grouped so that each group holds at most max_events events (an
    iteration larger than that is a chunk of its own). counts: events per iteration."""
    counts = counts.sort_index()
    out, cur, n = [], [], 0
    for it, c in zip(counts.index.to_numpy(), counts.to_numpy()):
        if cur and n + c > max_events:
            out.append(np.asarray(cur))
            cur, n = [], 0
        cur.append(it)
        n += int(c)
    if cur:
        out.append(np.asarray(cur))
    return out


def _graph(ev: pd.DataFrame, sem, launches, run_ranks: int) -> G.Graph:
    """The graph of one chunk (not cached: it lives while its chunk is analysed)."""
    return _graph_of_closed(unfinished.close(ev, launches), sem, run_ranks)


def _graph_of_closed(closed: pd.DataFrame, sem, run_ranks: int) -> G.Graph:
    g = G._build(closed, sem)
    g.table_ref = closed
    g.derived["run_ranks"] = run_ranks
    return g


# per-chunk tables that the combined run reads through graph.memo, and how they combine
_CONCAT = ("iteration_totals", "rank_lateness", "waited_on", "held_after_entry", "critical_busy", "per_lane")


def _tables(g: G.Graph, rows: np.ndarray) -> dict:
    """rows: the chunk's row numbers in the whole table (to order occurrences as it does)."""
    # the time model's rows first: their cut of each lane's waits lets lane_totals sum the points for
    # the entry totals and the critical path's busy time in one pass
    rows_tm = TM.launch_rows(g)
    cp = CP.from_graph(g, verdict=False)
    cp.graph = None                       # keep the chunk's tables, not its graph
    out = {"cp": cp}
    out["iteration_totals"] = CP.iteration_totals(g)
    out["time_model_rows"] = rows_tm
    # Compare's host-call and phase samples: means within an iteration, the waits clipped at their
    # occurrence's last entry, which the chunk's own launch rows give (timemodel.launch_rows)
    out["compare"] = CMP.event_samples(g.table_ref, g.sem, CMP.entry_cuts(out["time_model_rows"]))
    out["rank_lateness"] = RV.rank_lateness(g)
    out["arrivals"] = RV.arrivals(g)
    oi = RV.occurrence_info(g)
    # occurrences are numbered by their first arrival's row in the whole table (_combine): kept as
    # that row number, not with the chunk's row numbers (8 bytes an event: 0.8 GB at 100 M events)
    out["occurrence_info"] = oi.assign(order_row=rows[oi["order_row"].to_numpy()]) if len(oi) else oi
    out["kernel_busy_top"] = RV.kernel_busy_top(g)
    out["waited_on"] = IM.waited_on(g)
    out["held_after_entry"] = IM.held_after_entry(g)
    out["critical_busy"] = IM.critical_busy(g)
    out["per_lane"] = IM.per_lane(g)
    out["ran"] = pd.DataFrame({"kernel": out["per_lane"]["kernel"].to_numpy(),
                               "rank": out["per_lane"]["rank"].to_numpy()}).drop_duplicates()
    # the sums only: _phase_busy takes the ratios over the chunks' sums (a chunk's were never read)
    out["phase_busy"] = IM.phase_sums(g)
    out["kernel_first"] = IM.kernel_first(g)
    out["stalls"] = timeouts.stalls(g).table
    out["phase_names"] = set(map(str, g.phase_names))
    out["lanes"] = int(len(g.lane))
    out["warnings"] = tuple(g.warnings)
    return out


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    full = [p for p in parts if len(p)]
    if not full:
        return parts[0] if parts else pd.DataFrame()
    return full[0].copy() if len(full) == 1 else pd.concat(full, ignore_index=True)


def what_if_rows(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The what-if summaries of chunks (in chunk order) as the run's: one table of their rows."""
    return _concat(parts).reset_index(drop=True)


def _phase_busy(per: list[dict]) -> pd.DataFrame:
    """imbalance.phase_busy of the chunks `per` together: busy time per (kernel, phase, rank)
    summed, its ratio to the median rank's (over the ranks that ran the kernel)."""
    pb = _concat([p["phase_busy"] for p in per])
    if not len(pb):
        return pb
    sums = pb.groupby(["kernel", "phase", "rank"], sort=True)[["busy_ns", "spans"]].sum().reset_index()
    sums = sums[sums["busy_ns"] > 0]
    ran = pd.concat([p["ran"] for p in per], ignore_index=True).drop_duplicates()
    return IM.phase_ratios(sums, ran)


# A chunk's what-if input is kept while the phase ratios of the chunks so far reach this: the idle
# page's balancing what-if needs a phase of the straggler at imbalance.RANK_IMBALANCE_RATIO (1.5)
# or more (imbalance.straggler's `where`), which the last chunk's ratios (the run's) decide
# exactly; the margin keeps the inputs of earlier chunks of a run whose imbalance grows late.
# A run that keeps none (a balanced one: 1.04 at most on the 10 M-event starvation run) saves
# 0.14 s and 61 MB a 2.5 M-event chunk.
WHAT_IF_KEEP_RATIO = 1.3


def _what_if_possible(per: list[dict]) -> bool:
    r = _phase_busy(per)
    return bool(len(r) and (r["busy_ratio"].to_numpy(float) >= WHAT_IF_KEEP_RATIO).any())


def _combine(per: list[dict], sem, run_ranks: int) -> tuple[Summaries, CP.CriticalPath]:
    d: dict = {"run_ranks": run_ranks, "phase_names": set().union(*(p["phase_names"] for p in per))}
    for k in _CONCAT:
        d[k] = _concat([p[k] for p in per]).reset_index(drop=True)
    rows = [p["time_model_rows"] for p in per if p["time_model_rows"] is not None]
    d["time_model"] = TM.from_rows(_concat(rows).reset_index(drop=True), run_ranks) if rows else TM._empty()
    # occurrences and lanes are numbered per chunk: shift them past the previous chunks', then
    # number the occurrences as one graph of the whole table does (by their first arrival row in
    # table order: the chunks' rows carry their row numbers in the whole table as index)
    arr, info, occ0, lane0 = [], [], 0, 0
    for p in per:
        a, oi = p["arrivals"], p["occurrence_info"]
        if len(a):
            arr.append(a.assign(occ=a["occ"].to_numpy() + occ0, lane=a["lane"].to_numpy() + lane0))
        info.append(oi)
        occ0 += len(oi)
        lane0 += p["lanes"]
    info = _concat(info).reset_index(drop=True)
    top = pd.concat([p["kernel_busy_top"] for p in per]).groupby(level=0).max()
    d["kernel_busy_top"] = top
    a = _concat(arr) if arr else per[0]["arrivals"]
    if len(info) and len(per) > 1:
        order = np.argsort(info["order_row"].to_numpy(), kind="stable")
        renumber = np.empty(len(order), np.int64)
        renumber[order] = np.arange(len(order))
        info = info.iloc[order].reset_index(drop=True)
        a = a.assign(occ=renumber[a["occ"].to_numpy()])
        a = a.iloc[np.argsort(a["occ"].to_numpy(), kind="stable")]
    d["occurrence_info"] = info
    d["arrivals"] = RV.classify(a.drop(columns=["useless", "idle_warp"]), top).reset_index(drop=True)
    d["kernel_first"] = pd.concat([p["kernel_first"] for p in per]).groupby(level=0).min()
    d["phase_busy"] = _phase_busy(per)
    st = _concat([p["stalls"] for p in per])
    d["stalls"] = st.sort_values(["begin_ns", "rank"], kind="stable").reset_index(drop=True) if len(st) else st
    warns = tuple(dict.fromkeys(w for p in per for w in p["warnings"]))
    s = Summaries(derived=d, warnings=warns, sem=sem)

    cps = [p["cp"] for p in per]
    seg = _concat([c.segments for c in cps]).reset_index(drop=True)
    slack = _concat([c.slack for c in cps]).reset_index(drop=True)
    totals = d["iteration_totals"].copy()
    pacing, path_ns = CP._pacing(seg, totals)
    cp = CP.CriticalPath(segments=seg, slack=slack, total_ns=totals, pacing_rank=pacing, path_ns=path_ns,
                         warnings=warns, graph=s)
    return s, cp


# -- one chunk's pass -----------------------------------------------------------------------------
@dataclass
class ChunkOut:
    """What one chunk's pass leaves for the run (small: per warp and launch, per occurrence, per op,
    a tile per iteration; what scales with the chunk's events went to the spills). Plain data: a
    distributed run's workers send it back pickled (profiler.analysis.distributed)."""
    index: int
    events: int
    tables: dict                      # _tables: what the verdicts read through graph.memo
    timeline: TLO.Builder             # this chunk's part of the timeline overview
    run_tables: RT.ChunkPart          # its part of the report's tables (its durations spilled)
    span_phases: frozenset
    ranks: frozenset
    what_if: str | None = None        # the name of its what-if input in the what-if spill
    what_if_sha256: str | None = None
    what_if_bytes: int = 0


def _span_phases_ranks(rt: RT.ChunkPart, g: G.Graph) -> tuple[frozenset, frozenset]:
    """The span phases and the ranks of a chunk, from what its pass made anyway: its report share's
    span groups (kernel, phase, rank) and its graph's lanes (every row lies on one; closing adds
    rows of existing lanes only). Two np.unique over the chunk's rows took 30 ms a 2.5 M-event chunk."""
    return rt.span_phases(), frozenset(int(r) for r in np.unique(g.lane["rank"].to_numpy()))


def chunk_pass(ev: pd.DataFrame, la, sem, run_ranks: int, index: int, spills: Spills,
               keep_what_if: Callable[[dict], bool]) -> tuple[ChunkOut, G.Graph]:
    """One chunk of whole iterations (ev indexed by its rows' numbers in the whole table): its
    graph, its tables, its part of the timeline and of the report's tables, and, when
    keep_what_if(its tables) says so, its what-if input written to spills.what_if. Returns the
    graph too (a run of one chunk keeps it)."""
    rows = ev.index.to_numpy()
    closed = unfinished.close(ev, la)
    # what reads the table only, before the graph is built: their temporaries and the graph are
    # never alive at once (the timeline's tiles were the peak of a 7.5 M-event chunk, issue 31)
    tl = TLO.Builder()                    # the timeline's overview, from the chunk's closed table
    tl.add(closed)
    rt = RT.chunk_part(closed, len(ev), rows, spills.durations, f"durations-{index:05d}")
    g = _graph_of_closed(closed, sem, run_ranks)
    sp, rk = _span_phases_ranks(rt, g)
    del closed
    tables = _tables(g, rows)
    out = ChunkOut(index=index, events=len(ev), tables=tables, timeline=tl, run_tables=rt, span_phases=sp, ranks=rk)
    if keep_what_if(tables):
        out.what_if = f"whatif-{index:05d}"
        spills.what_if.put(out.what_if, WhatIfInput.from_graph(g, None).to_arrays())
        out.what_if_sha256 = spills.what_if.sha256.get(out.what_if)
        out.what_if_bytes = spills.what_if.sizes.get(out.what_if, 0)
    return out, g


def _finish(outs: list[ChunkOut], *, sem, ranks: int, launches, spills: Spills, graph,
            rechunk, mapper=LOCAL) -> Results:
    """The run's results from its chunks' outputs (in chunk order): the tables combined, the
    verdicts, Compare's inputs, the timeline's overview and the report's tables."""
    if not outs:
        raise ValueError("analyze_chunks: no chunks")
    per = [o.tables for o in outs]
    s, cp = _combine(per, sem, ranks)
    several = len(outs) > 1
    wif = [o.what_if for o in outs] if several else []
    s.path, s.graph, s.what_if_inputs, s.spills, s.rechunk, s.launches = cp, graph, wif, spills, rechunk, launches
    s.derived["launches"] = launches      # the straggler decision's silent warps (imbalance.silent_lanes)
    s.mapper = mapper
    if graph is not None:
        # the run's time model serves the kept graph (what_if reads its rows of the chunk's launches)
        graph.derived["time_model"] = s.derived["time_model"]
    cp.verdict = PV.headline(cp)
    idle = I.from_graph(s, launches)
    bar = B.from_graph(s)
    cmp = CMP.inputs_from(tm=s.derived["time_model"], cp=cp, parts=[p["compare"] for p in per], sem=sem)
    tl = TLO.Builder()
    for o in outs:
        tl.merge(o.timeline)
    # after the verdicts: the balancing what-if (idle) made those of the chunks it re-timed
    s.what_if_recorded = _recorded(spills, wif, s.derived["time_model"], mapper, s.what_if_recorded)
    rt = RT.finish([o.run_tables for o in outs], spills.durations, launches)
    for o in outs:
        spills.durations.drop(o.run_tables.name)
    for o in outs if not several else ():
        if o.what_if is not None:
            spills.what_if.drop(o.what_if)
    return Results(critical=cp, idle=idle, barriers=bar, time_model=s.derived["time_model"], chunks=len(outs),
                   largest_chunk=max(o.events for o in outs), compare=cmp, timeline=tl.finish(), run_tables=rt,
                   span_phases=tuple(sorted(set().union(*(o.span_phases for o in outs)))),
                   ranks=tuple(sorted(set().union(*(o.ranks for o in outs)))),
                   what_if=tuple(w for w in wif if w is not None), spills=spills, what_if_recorded=s.what_if_recorded)


def _recorded(spills: Spills, names: list, tm, mapper, made: dict) -> dict:
    """whatif.recorded of every chunk kept with a what-if input, in chunk order (it reads the input's
    lanes only); made: those a what-if already made (Summaries.what_if_summary), not made again."""
    todo = [n for n in names if n is not None and n not in made]
    made = {**made, **dict(zip(todo, mapper.map(_recorded_one, todo, spill=spills.what_if, tm=tm)))}
    return {n: made[n] for n in names if n is not None}


# -- drivers ---------------------------------------------------------------------------------
def _split(item) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    return item if isinstance(item, tuple) else (item, None)


def analyze_chunks(chunks: Callable[[], Iterable], *, registry=None, launches=None, ranks: int,
                   count: int | None = None, spills: Spills | None = None) -> Results:
    """The analyses of a run given as chunks of whole iterations (no iteration in two chunks).

    chunks: a callable returning a fresh iterable of the chunks' event tables, each indexed by
    its rows' numbers in the whole table (barrier occurrences are numbered in that order), or of
    (events, the chunk's launch table) pairs when the run's launch table is made chunk by chunk
    too (then `launches` is None); called again only when the idle page's balancing what-if needs
    a chunk whose what-if input was not kept (_what_if_possible). ranks: the run's rank count.
    count: how many chunks `chunks` yields, when known (a run of several then drops each chunk's
    graph before the next chunk is read). spills: where the chunks' what-if inputs and span
    durations go (default: memory; on disk every chunk's what-if input is written, in memory
    only while a balancing what-if looks possible). Freed memory stays in the process while it
    runs (heap.kept: the chunks' temporaries are not faulted in again for each chunk), given back
    between chunks past heap.KEEP_RESIDENT (heap.between_chunks)."""
    spills = Spills() if spills is None else spills
    with heap.kept():
        return _analyze_chunks(chunks, registry=registry, launches=launches, ranks=ranks, count=count, spills=spills)


def _analyze_chunks(chunks, *, registry, launches, ranks: int, count, spills: Spills) -> Results:
    sem = semantics(registry)
    outs, la_parts, g = [], [], None
    per = []

    def keep_what_if(tables: dict) -> bool:
        # a run of one chunk re-times its graph; on disk every input is kept (stored for the
        # exact what-if of a stored run); in memory while the chunks so far leave a balancing
        # what-if possible
        if count == 1:
            return False
        return spills.what_if.on_disk or _what_if_possible(per + [tables])

    # a plain loop, not enumerate(): enumerate's result tuple, reused from one item to the next,
    # would hold the previous chunk's events alive while the next chunk is read (a chunk's table
    # more in memory during every read, and the heap fragmented by it: issue 31)
    i = -1
    for item in chunks():
        i += 1
        ev, la = _split(item)
        del item
        if la is not None:
            la_parts.append(la)
        # the previous chunk's graph is kept only for a run of one chunk: dropped before this one's is
        # built (held, it raised the peak by a graph and its events: 1.61 -> 1.2 GB at 4 x 2.5 M events)
        g = None
        out, g = chunk_pass(ev, launches if la is None else la, sem, ranks, i, spills, keep_what_if)
        del ev
        outs.append(out)
        per.append(out.tables)
        if count is not None and count > 1:
            g = None                      # before the next chunk is read
            heap.between_chunks()
    if len(outs) > 1 and g is not None:
        g = None
        heap.between_chunks()
    if la_parts:
        launches = pd.concat(la_parts, ignore_index=True)
    return _finish(outs, sem=sem, ranks=ranks, launches=launches, spills=spills, graph=g, rechunk=chunks)


def analyze(events: pd.DataFrame, *, registry=None, launches=None, max_events: int = MAX_EVENTS,
            spills: Spills | None = None) -> Results:
    """The analyses of an event table in memory, in chunks of at most max_events events (whole
    iterations). Bounds the analyses' own memory; the table itself is the caller's."""
    its = events["iteration"].to_numpy()
    groups = iteration_chunks(pd.Series(its).value_counts(), max_events)
    ranks = int(pd.unique(events["rank"]).size)

    def chunks():
        if len(groups) == 1:
            yield events
            return
        for grp in groups:
            rows = np.flatnonzero(np.isin(its, grp))
            ev = events.iloc[rows]
            ev.index = rows              # row numbers in the whole table (occurrence order)
            yield ev
            del ev
    return analyze_chunks(chunks, registry=registry, launches=launches, ranks=ranks, count=len(groups),
                          spills=spills)


def plan_run(run, max_events: int, reader=None) -> tuple[list[np.ndarray], int]:
    """(the chunks' iterations, the run's rank count) of a run directory, from its events per
    iteration (runreader.EventReader.counts: footer statistics, else one row group at a time).
    reader: an open EventReader of the run to ask (else one is opened and closed here)."""
    from profiler.store.runreader import EventReader

    if reader is None:
        with EventReader(run) as r:
            return plan_run(run, max_events, r)
    counts, rks = reader.counts()
    return iteration_chunks(counts, max_events), int(rks.size)


def analyze_run(run, *, max_events: int | None = None, spills: Spills | None = None, engine=None) -> Results:
    """The analyses of a run directory (profiler.store.runstore.Run) without reading its whole event
    table: the `iteration` and `rank` statistics cut the chunks, then each chunk's events are read
    through runreader.EventReader (row groups pruned on their iteration statistics, rows filtered,
    checked as a whole read is). A run written since issue 20 has row groups cut at (rank,
    iteration) boundaries, so each row group is decoded about once; an older run's bigger row
    groups are decoded once per chunk they hold rows of. Memory stays bounded by a chunk plus a
    row group. engine: a distributed engine (profiler.analysis.distributed) that runs the chunks'
    passes on its workers (spills on disk, where every worker and this process can read them);
    the results are the same. max_events: events a chunk holds at most (default MAX_EVENTS).

    One reader plans the chunks and reads them in the first pass: opening events.parquet hashes
    it against its checksum (28 ms at 10 M events), once, not once for the plan and again for the
    chunks; a later pass (a balancing what-if's chunk read again) opens and hashes it anew."""
    from profiler.store.runreader import EventReader

    first = [EventReader(run)]
    try:
        groups, ranks = plan_run(run, MAX_EVENTS if max_events is None else max_events, first[0])
        if engine is not None and len(groups) > 1:      # a run of one chunk keeps its graph: here
            first.pop().close()
            if spills is None or not spills.on_disk:
                raise ValueError("analyze_run: a distributed run needs spills on disk (profiler.analysis.spill)")
            with heap.kept():
                outs = engine.map_chunks(run, groups, ranks, spills)
                return _finish(outs, sem=semantics(run.manifest.get("registry")), ranks=ranks, launches=run.launches,
                               spills=spills, graph=None, rechunk=lambda: _read_chunks(run, groups), mapper=engine)

        def chunks():                   # the first pass takes the planning reader (on its first read)
            yield from _read_chunks(run, groups, first.pop() if first else None)
        return analyze_chunks(chunks, registry=run.manifest.get("registry"), launches=run.launches, ranks=ranks,
                              count=len(groups), spills=spills)
    finally:
        for r in first:                 # not handed to a pass
            r.close()


def _read_chunks(run, groups, reader=None):
    """The chunks' events, read through `reader` (closed at the end) or a reader opened here."""
    from profiler.store.runreader import EventReader

    with (EventReader(run) if reader is None else reader) as r:
        for grp in groups:
            yield read_chunk(r, grp)


def read_chunk(reader, iterations) -> pd.DataFrame:
    """One chunk's events (runreader.EventReader.read: indexed by row number in the whole table,
    the occurrences' order), the read's buffers given back before the chunk's pass
    (heap.release_read_buffers)."""
    ev = reader.read(iterations=iterations)
    heap.release_read_buffers()
    return ev
