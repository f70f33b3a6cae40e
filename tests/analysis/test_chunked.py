"""The analyses of a run in chunks of iterations (profiler.analysis.chunked) equal the analyses of
the whole table: every table and every verdict, on every bundled run and on synthetic runs, with
chunks of one iteration (the most chunks a run can be cut into)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import barrier_contention, chunked, critical_path, idle_warps
from profiler.analysis import graph as G
from profiler.analysis.timemodel import time_model
from profiler.store.runstore import load_run, write_run
from profiler.groundtruth.synthetic import make_events

TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = sorted(p.parent.name for p in TRACES.glob("*/events.parquet"))


def _frame_equal(a: pd.DataFrame, b: pd.DataFrame, what: str):
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    assert list(a.columns) == list(b.columns), what
    assert len(a) == len(b), f"{what}: {len(a)} rows whole, {len(b)} chunked"
    for c in a.columns:
        x, y = a[c], b[c]
        if x.dtype.kind in "fiub" and y.dtype.kind in "fiub":
            np.testing.assert_array_equal(x.to_numpy(float), y.to_numpy(float), err_msg=f"{what}.{c}")
        else:
            assert x.astype(str).tolist() == y.astype(str).tolist(), f"{what}.{c}"


def _verdict_equal(a, b, what):
    fa = {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if f.name != "evidence"}
    fb = {f.name: getattr(b, f.name) for f in dataclasses.fields(b) if f.name != "evidence"}
    assert fa == fb, what
    assert a.headline == b.headline, what
    ea, eb = a.evidence, b.evidence
    if isinstance(ea, pd.DataFrame) and isinstance(eb, pd.DataFrame):
        _frame_equal(ea, eb, what + ".evidence")
    else:
        assert (ea is None) == (eb is None), what


def _check(ev, reg, la, max_events=1):
    cp = critical_path(ev, registry=reg, launches=la)
    iw = idle_warps(ev, registry=reg, launches=la)
    bc = barrier_contention(ev, registry=reg, launches=la)
    tm = time_model(G.build(ev, reg, la))
    res = chunked.analyze(ev, registry=reg, launches=la, max_events=max_events)
    assert res.chunks == ev["iteration"].nunique()
    for name in ("segments", "slack", "total_ns", "path_ns"):
        _frame_equal(getattr(cp, name), getattr(res.critical, name), f"critical_path.{name}")
    assert cp.pacing_rank == res.critical.pacing_rank
    _verdict_equal(cp.verdict, res.critical.verdict, "critical_path.verdict")
    for name in ("per_warp", "per_block", "imbalance", "ranks", "phases", "waited", "evidence"):
        _frame_equal(getattr(iw, name), getattr(res.idle, name), f"idle.{name}")
    _verdict_equal(iw.verdict, res.idle.verdict, "idle.verdict")
    assert [v.headline for v in iw.findings] == [v.headline for v in res.idle.findings]
    for name in ("occurrences", "summary", "per_rank"):
        _frame_equal(getattr(bc, name), getattr(res.barriers, name), f"barriers.{name}")
    _verdict_equal(bc.verdict, res.barriers.verdict, "barriers.verdict")
    assert [v.headline for v in bc.findings] == [v.headline for v in res.barriers.findings]
    for name in ("per_rank", "ops", "iterations"):
        _frame_equal(getattr(tm, name), getattr(res.time_model, name), f"time_model.{name}")
    assert tm.ranks == res.time_model.ranks


@pytest.mark.parametrize("name", RUNS)
def test_chunked_equals_whole_on_bundled_runs(name):
    r = load_run(TRACES / name)
    _check(r.events, r.manifest.get("registry"), r.launches)


@pytest.mark.parametrize("scenario", ["slow_rank", "starvation", "late_arriver", "late_host"])
def test_chunked_equals_whole_on_synthetic_runs(scenario):
    ev, la, man = make_events(ranks=4, events=60_000, scenario=scenario, iterations=5, seed=1)
    _check(ev, man["registry"], la)


def test_chunks_hold_whole_iterations_within_the_budget():
    counts = pd.Series({0: 5, 1: 5, 2: 12, 3: 1, 4: 1})
    got = [g.tolist() for g in chunked.iteration_chunks(counts, 10)]
    assert got == [[0, 1], [2], [3, 4]]


def test_run_read_in_chunks_equals_whole(tmp_path):
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", iterations=4, seed=2)
    run = load_run(write_run(tmp_path / "r", ev, la, man, perfetto=False))
    res = chunked.analyze_run(run, max_events=len(ev) // 3)
    assert res.chunks >= 3 and res.largest_chunk <= len(ev) // 3
    whole = chunked.analyze(run.events, registry=man["registry"], launches=run.launches, max_events=len(ev))
    assert whole.chunks == 1
    _verdict_equal(whole.critical.verdict, res.critical.verdict, "critical_path.verdict")
    _verdict_equal(whole.idle.verdict, res.idle.verdict, "idle.verdict")
    _verdict_equal(whole.barriers.verdict, res.barriers.verdict, "barriers.verdict")
    _frame_equal(whole.critical.segments, res.critical.segments, "segments")
    _frame_equal(whole.time_model.ops, res.time_model.ops, "ops")


def test_epscope_analyze_of_a_big_run_reads_it_in_chunks_and_stores_the_same_summary(tmp_path, monkeypatch):
    from profiler.analysis import summary
    ev, la, man = make_events(ranks=4, events=40_000, scenario="late_host", iterations=4, seed=4)
    run = load_run(write_run(tmp_path / "r", ev, la, man, perfetto=False))
    whole = summary.summarize(run)
    read = []
    orig = chunked.analyze_run
    monkeypatch.setattr(chunked, "analyze_run", lambda r, **kw: read.append(1) or orig(r, max_events=len(ev) // 4))
    monkeypatch.setattr(chunked, "MAX_EVENTS", len(ev) // 4)
    assert summary.summarize(load_run(tmp_path / "r")) == whole
    assert read == [1]


@pytest.mark.parametrize("keep_ratio,kept", [(chunked.WHAT_IF_KEEP_RATIO, None), (0.0, 5), (np.inf, 0)])
def test_what_if_over_chunks_equals_the_whole_table_what_if(keep_ratio, kept, monkeypatch):
    """Chunks re-timed from the inputs kept in the first pass, read and built again (none kept),
    or as the run's ratios decide: the same summary as the whole table's what-if."""
    from profiler.analysis.whatif import what_if
    monkeypatch.setattr(chunked, "WHAT_IF_KEEP_RATIO", keep_ratio)
    ev, la, man = make_events(ranks=4, events=60_000, scenario="slow_rank", iterations=5, seed=3)
    reg = man["registry"]
    res = chunked.analyze(ev, registry=reg, launches=la, max_events=1)
    assert res.chunks == 5
    s = res.critical.graph
    if kept is not None:
        assert sum(w is not None for w in s.what_if_inputs) == kept
    phase = next(p for p in ("dispatch/send_chunk", "combine/send_chunk") if p.split("/")[1] in s.derived["phase_names"])
    for rank in (None, 3):
        whole = what_if(ev, phase=phase, speedup=0.3, rank=rank, registry=reg, launches=la, new_path=False,
                        keep_retimed=False).summary
        _frame_equal(whole, s.what_if_summary(phase=phase, speedup=0.3, rank=rank), f"what_if {phase} rank {rank}")


@pytest.mark.parametrize("floor", [1, 1_000_000])
def test_chunks_are_planned_from_row_group_statistics_as_from_the_columns(tmp_path, monkeypatch, floor):
    """runreader.EventReader.counts (footer statistics where a row group holds one iteration of
    one rank, its columns otherwise) counts what the whole iteration column holds; floor 1 M:
    every row group merged into one (the ceiling), several iterations and ranks each (the older layout); 1: one
    row group a (rank, iteration)."""
    from profiler.store import runstore
    monkeypatch.setattr(runstore, "ROW_GROUP_MIN_ROWS", floor)
    ev, la, man = make_events(ranks=3, events=30_000, scenario="late_host", iterations=4, seed=9)
    run = load_run(write_run(tmp_path / "r", ev, la, man, perfetto=False))
    from profiler.store.runreader import EventReader
    with EventReader(run) as r:
        counts, ranks = r.counts()
        assert len(r.groups) == (12 if floor == 1 else 1)
    want = run.events["iteration"].value_counts().sort_index()
    assert counts.to_dict() == {int(k): int(v) for k, v in want.items()}
    assert ranks.tolist() == sorted(run.events["rank"].unique().tolist())
    groups, n = chunked.plan_run(run, len(ev) // 3)
    assert n == 3 and [g.tolist() for g in groups] == [g.tolist() for g in chunked.iteration_chunks(want, len(ev) // 3)]


def test_a_run_on_disk_spills_to_files_and_keeps_nothing_of_the_chunks_in_memory(tmp_path):
    """Spills in directories (what `epscope analyze` uses): the same results as in memory, every
    chunk's what-if input written, the span durations' files removed once the medians are taken."""
    from profiler.analysis.spill import Spill
    ev, la, man = make_events(ranks=4, events=60_000, scenario="slow_rank", iterations=5, seed=3)
    mem = chunked.analyze(ev, registry=man["registry"], launches=la, max_events=1)
    spills = chunked.Spills(what_if=Spill(tmp_path / "w"), durations=Spill(tmp_path / "d"))
    disk = chunked.analyze(ev, registry=man["registry"], launches=la, max_events=1, spills=spills)
    assert disk.what_if == tuple(f"whatif-{i:05d}" for i in range(5))
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [f"{w}.arrays" for w in disk.what_if]
    assert not list((tmp_path / "d").iterdir())
    _verdict_equal(mem.idle.verdict, disk.idle.verdict, "idle.verdict")
    for f in dataclasses.fields(disk.run_tables):
        pd.testing.assert_frame_equal(getattr(mem.run_tables, f.name), getattr(disk.run_tables, f.name))
    for rank in (None, 2):
        _frame_equal(mem.critical.graph.what_if_summary(phase="copy_out", speedup=0.5, rank=rank),
                     disk.critical.graph.what_if_summary(phase="copy_out", speedup=0.5, rank=rank), "what_if")


@pytest.mark.parametrize("count", [None, 4])
def test_a_chunk_is_freed_before_the_next_is_read_and_the_heap_trimmed_between(count, monkeypatch):
    """Nothing holds a chunk's events (nor its graph) once its pass is done: the next chunk is read
    with the previous one gone (enumerate() over the chunks held it, issue 31), and between two
    chunks heap.between_chunks may give the freed pages back."""
    import gc
    import weakref
    from profiler.analysis import heap
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", iterations=4, seed=2)
    its = ev["iteration"].to_numpy()
    refs, alive_at_read, trims = [], [], []
    monkeypatch.setattr(heap, "between_chunks", lambda: trims.append(len(refs)) or False)

    def chunks():
        for it in np.unique(its):
            gc.collect()
            alive_at_read.append(sum(r() is not None for r in refs))
            rows = np.flatnonzero(its == it)
            part = ev.iloc[rows].copy()
            part.index = rows
            refs.append(weakref.ref(part))
            yield part
            del part
    res = chunked.analyze_chunks(chunks, registry=man["registry"], launches=la, ranks=4, count=count)
    assert res.chunks == 4
    if count is None:       # count unknown: the last chunk's graph is kept until the next chunk comes
        assert alive_at_read[1:] == [1, 1, 1] and trims == [4]
    else:
        assert alive_at_read == [0, 0, 0, 0] and trims == [1, 2, 3, 4]


def test_a_run_read_in_chunks_hashes_its_events_once_and_names_its_span_phases_and_ranks(tmp_path, monkeypatch):
    """analyze_run plans the chunks and reads them through one open file (events.parquet hashed
    against its checksum once, not once more for the plan); each chunk's span phases and ranks
    (from its span groups and its graph's lanes) are the whole table's."""
    from profiler.analysis import stored
    from profiler.analysis.spill import Spill
    from profiler.store import runreader
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", iterations=4, seed=2)
    run = load_run(write_run(tmp_path / "r", ev, la, man, perfetto=False))
    assert run.checksummed
    hashed = []
    real = runreader.file_hash
    monkeypatch.setattr(runreader, "file_hash", lambda f: hashed.append(1) or real(f))
    spills = chunked.Spills(what_if=Spill(tmp_path / "w"), durations=Spill(tmp_path / "d"))
    res = chunked.analyze_run(run, max_events=len(ev) // 3, spills=spills)   # every what-if input kept: no re-read
    assert res.chunks >= 3 and len(hashed) == 1
    assert list(res.span_phases) == stored.span_phases(run.events)
    assert list(res.ranks) == sorted(run.events["rank"].unique().tolist())
