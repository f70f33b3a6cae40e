"""profiler/analysis/stored.py: a run's analyses stored with it read back equal to the in-memory
ones (every table with its dtypes, every verdict and finding with its evidence, the warnings), on
every bundled run; a stored result of other data, another analysis version or format, damaged or
half-written is never served as current."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from profiler.analysis import stored, summary
from profiler.analysis.verdict import Verdict
from profiler.store.runstore import load_run
from tests.analysis.test_run_tables import assert_tables_match
from tests.analysis.test_timeline_overview import assert_overviews_equal

TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = sorted(p.name for p in TRACES.iterdir() if (p / "manifest.json").is_file())


def _warnings(ws) -> list:
    return [w.to_json() for w in ws]


def assert_verdicts_equal(a: Verdict | None, b: Verdict | None, where: str) -> None:
    if a is None or b is None:
        assert a is b, where
        return
    # warnings are exceptions (equal only to themselves): compared by their fields
    assert dataclasses.replace(a, warnings=()) == dataclasses.replace(b, warnings=()), where
    assert _warnings(a.warnings) == _warnings(b.warnings), where
    assert (a.evidence is None) == (b.evidence is None), where
    if a.evidence is not None:
        pd.testing.assert_frame_equal(a.evidence, b.evidence, obj=f"{where}.evidence")


def assert_reports_equal(a, b, where: str) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        if f.name in stored.NOT_STORED.get(where, ()):
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        w = f"{where}.{f.name}"
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(x, y, obj=w)          # dtypes and categories included
        elif f.name == "verdict":
            assert_verdicts_equal(x, y, w)
        elif f.name == "findings":
            assert len(x) == len(y), w
            for i, (u, v) in enumerate(zip(x, y)):
                assert_verdicts_equal(u, v, f"{w}.{i}")
        elif f.name == "warnings":
            assert _warnings(x) == _warnings(y), w
        else:
            assert x == y, w


def assert_results_equal(res, got: stored.Stored, run=None) -> None:
    assert got.critical.graph is None
    for name, a, b in (("critical_path", res.critical, got.critical), ("idle", res.idle, got.idle),
                       ("barriers", res.barriers, got.barriers), ("time_model", res.time_model, got.time_model),
                       ("run_tables", res.run_tables, got.run_tables)):
        assert_reports_equal(a, b, name)
    assert (got.what_if is None) == (not res.what_if)       # inputs stored for a run of several chunks only
    assert (got.span_phases, got.ranks) == (res.span_phases, res.ranks)
    assert_overviews_equal(got.timeline, res.timeline)     # the timeline's overview (format 3)
    if run is not None:     # what Compare reads of the run, computed from the same analyses
        assert_reports_equal(res.compare, got.compare, "compare")
        assert got.compare_inputs(name=run.name, manifest=run.manifest) == dataclasses.replace(
            got.compare, name=run.name, manifest=run.manifest)


@pytest.mark.parametrize("name", RUNS)
def test_every_bundled_run_carries_current_stored_results_equal_to_the_analyses(name):
    got = stored.load(TRACES / name)
    assert got is not None, f"{name}: stale or missing {stored.DIR}/: run `epscope analyze traces/{name}`"
    run = load_run(TRACES / name)
    res = summary.analyze(run)
    assert_results_equal(res, got, run)
    # the report's tables: as the whole table computes them (the reference of test_run_tables)
    assert_tables_match(run.events, run.launches, res.run_tables)
    assert list(got.span_phases) == stored.span_phases(run.events)
    assert list(got.ranks) == stored.ranks_of(run.events)


@pytest.fixture
def run_copy(tmp_path):
    """A bundled run with a timeout (unfinished waits, warnings) copied, its results stored."""
    d = tmp_path / "run"
    shutil.copytree(TRACES / "ep-timeout", d, ignore=shutil.ignore_patterns(stored.DIR, "*.perfetto-trace"))
    assert stored.load(d) is None                      # a run without stored results
    stored.store_run(d)
    return d


def test_store_run_writes_the_results_and_the_summary_and_they_read_back(run_copy):
    got = stored.load(run_copy)
    assert got is not None and summary.load(run_copy) is not None
    assert_results_equal(summary.analyze(load_run(run_copy)), got)
    # nothing but the two results is left beside the run's files (no temporaries)
    assert sorted(p.name for p in run_copy.iterdir()) == sorted(
        ["manifest.json", "events.parquet", "launches.parquet", summary.FILE, stored.DIR])


def test_storing_again_replaces_the_results_in_one_piece(run_copy):
    before = json.loads((run_copy / stored.DIR / stored.INDEX).read_text())
    stored.store_run(run_copy)
    after = json.loads((run_copy / stored.DIR / stored.INDEX).read_text())
    assert after == before
    assert [p.name for p in run_copy.iterdir() if p.name.startswith(".")] == []
    assert stored.load(run_copy) is not None


def test_results_of_other_data_are_stale(run_copy):
    with open(run_copy / "launches.parquet", "ab") as f:     # any change of a data file's bytes
        f.write(b"\0")
    assert stored.load(run_copy) is None and not stored.current(run_copy)


def test_results_of_another_analysis_version_or_format_are_stale(run_copy, monkeypatch):
    assert stored.current(run_copy)
    monkeypatch.setattr(summary, "ANALYSIS_VERSION", summary.ANALYSIS_VERSION + 1)
    assert stored.load(run_copy) is None and not stored.current(run_copy)
    monkeypatch.undo()
    monkeypatch.setattr(stored, "FORMAT_VERSION", stored.FORMAT_VERSION + 1)
    assert stored.load(run_copy) is None


def _edit_index(d: Path, edit) -> None:
    p = d / stored.DIR / stored.INDEX
    index = json.loads(p.read_text())
    edit(index)
    p.write_text(json.dumps(index))


@pytest.mark.parametrize("edit", [
    lambda i: i["reports"]["critical_path"].pop("pacing_rank"),                       # a field missing
    lambda i: i["reports"]["critical_path"].update(extra=1),                           # a field unknown
    lambda i: i["reports"]["idle"]["verdict"].update(rank="1"),                        # a field's type
    lambda i: i["reports"]["idle"]["verdict"].update(cause="no such cause"),
    lambda i: i["reports"]["barriers"]["verdict"].update(where=[["k", "p"]]),          # a list read by position
    lambda i: i["reports"]["critical_path"]["verdict"].update(warnings=[{"type": "OSError", "count": 1,
                                                                         "detail": ""}]),
    lambda i: i["tables"].pop("idle.per_warp"),                                        # a table missing
    lambda i: i["tables"]["idle.per_warp"].update(file="../events.parquet"),           # a file elsewhere
    lambda i: i["run"].update(ranks=["0"]),
    lambda i: i.pop("data"),
])
def test_a_stored_result_that_does_not_validate_is_not_served(run_copy, edit):
    _edit_index(run_copy, edit)
    assert stored.load(run_copy) is None


def test_a_damaged_or_replaced_table_is_not_served(run_copy):
    p = run_copy / stored.DIR / "critical_path.segments.parquet"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x10
    p.write_bytes(bytes(b))
    assert stored.load(run_copy) is None


def test_a_linked_results_directory_is_not_followed(run_copy, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (run_copy / stored.DIR).rename(elsewhere)
    os.symlink(elsewhere, run_copy / stored.DIR)
    assert stored.load(run_copy) is None


def test_store_analyses_after_a_save_warns_instead_of_losing_the_run(tmp_path):
    from profiler.record.session_save import store_analyses
    d = tmp_path / "run"
    shutil.copytree(TRACES / "ep-balanced", d, ignore=shutil.ignore_patterns(stored.DIR, "*.perfetto-trace"))
    assert store_analyses(d) == d / stored.DIR and stored.load(d) is not None
    (d / "events.parquet").write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="could not store its analyses"):
        assert store_analyses(d) is None
    assert (d / "manifest.json").is_file()


def test_a_table_shared_by_a_report_and_its_verdict_reads_back_in_both_places(run_copy):
    run = load_run(run_copy)
    res = summary.analyze(run)
    v = next(x for x in (res.idle.verdict, res.barriers.verdict, res.critical.verdict) if x.evidence is not None)
    res.idle.evidence = v.evidence                 # one object in two places (written once per field)
    stored.store(run, res)
    assert_results_equal(res, stored.load(run_copy))


def test_a_data_file_replaced_with_the_same_size_and_mtime_is_hashed_again(run_copy, monkeypatch):
    """The data files' hashes are remembered across processes (profiler.store.hashcache) by their
    identity and change times: a file put back with the old size and mtime still makes the stored
    results stale (its ctime moved), whatever the cache held."""
    from profiler.store import hashcache
    monkeypatch.setattr(hashcache, "RACY_S", 0.0)   # remember the just-written files
    hashcache.forget()
    assert stored.load(run_copy) is not None        # hashed, remembered (in the cache file too)
    hashcache.forget()                               # a new process: from the cache file
    assert stored.load(run_copy) is not None
    p = run_copy / "events.parquet"
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF                     # other bytes, the same length
    tmp = run_copy / "events.new"
    tmp.write_bytes(bytes(data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, p)
    assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert stored.load(run_copy) is None and not stored.current(run_copy)


@pytest.fixture
def chunked_run(tmp_path, monkeypatch):
    """A synthetic run with a straggler analysed in chunks of one iteration, its results stored."""
    from profiler.analysis import chunked
    from profiler.store.runstore import write_run
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", iterations=4, seed=5)
    d = write_run(tmp_path / "r", ev, la, man, perfetto=False)
    monkeypatch.setattr(chunked, "MAX_EVENTS", len(ev) // 4)
    stored.store_run(d)
    return d, ev, la, man


def test_a_run_of_several_chunks_stores_its_what_if_inputs_and_answers_from_them(chunked_run):
    from profiler.analysis import what_if
    d, ev, la, man = chunked_run
    got = stored.load(d)
    assert got.what_if is not None and len(got.what_if.chunks) == 4
    assert sorted(p.name for p in (d / stored.DIR / stored.WHAT_IF_DIR).iterdir()) == \
        sorted(c["file"] for c in got.what_if.chunks)
    # the work directory of the spills is gone, no temporary left beside the run
    assert sorted(p.name for p in d.iterdir()) == sorted(
        ["manifest.json", "events.parquet", "launches.parquet", summary.FILE, stored.DIR])
    for phase, rank in (("dispatch/send_chunk", 3), ("copy_out", None), ("combine/wait_data", [0, 1])):
        whole = what_if(ev, phase=phase, speedup=0.4, rank=rank, registry=man["registry"], launches=la).summary
        pd.testing.assert_frame_equal(got.what_if_summary(phase=phase, speedup=0.4, rank=rank), whole)
    with pytest.raises(ValueError, match="no phase"):
        got.what_if_summary(phase="no_such_phase", speedup=0.4, rank=None)


def test_a_damaged_what_if_input_is_never_answered_from(chunked_run):
    d = chunked_run[0]
    got = stored.load(d)
    p = got.what_if.directory / got.what_if.chunks[2]["file"]
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))
    with pytest.raises(stored.Invalid, match="checksum"):
        got.what_if_summary(phase="send_chunk", speedup=0.2, rank=None)


def test_a_run_of_one_chunk_stores_no_what_if_inputs(run_copy):
    got = stored.load(run_copy)
    assert got.what_if is None and not (run_copy / stored.DIR / stored.WHAT_IF_DIR).exists()
    with pytest.raises(LookupError):
        got.what_if_summary(phase="send_chunk", speedup=0.2, rank=None)


@pytest.mark.parametrize("edit", [
    lambda i: i["what_if"]["chunks"][0].update(file="../../events.parquet"),
    lambda i: i["what_if"]["chunks"][0].pop("sha256"),
    lambda i: i["what_if"].update(phase_names="send_chunk"),
    lambda i: i.pop("what_if"),
])
def test_a_what_if_index_that_does_not_validate_is_not_served(chunked_run, edit):
    _edit_index(chunked_run[0], edit)
    assert stored.load(chunked_run[0]) is None


def _to_arrays_before_packing(self) -> dict:
    """whatif.WhatIfInput.to_arrays as main wrote it before issue 31 packed the inputs (3e89dcf):
    every field as it is in memory (spill version 1)."""
    import numpy as np
    out = {f"retime.{k}": v for k, v in vars(self.retime).items()}
    lane = self.ends.lane
    kernel = pd.Categorical(lane["kernel"].astype(str))
    out.update({"lane.rank": lane["rank"].to_numpy(), "lane.launch": lane["launch"].to_numpy(),
                "lane.iteration": lane["iteration"].to_numpy(), "lane.host": lane["host"].to_numpy(bool),
                "lane.kernel": kernel.codes.astype(np.int32),
                "lane.kernel_names": np.asarray([str(k) for k in kernel.categories], dtype=str),
                "n_points": np.asarray(self.ends.n_points, np.int64), "lane_t": self.lane_t,
                "phase_names": np.asarray([str(p) for p in self.phase_names], dtype=str),
                "seg_pt": self.seg_pt, "seg_d": self.seg_d, "seg_phase": self.seg_phase, "seg_lane": self.seg_lane})
    return out


def test_what_if_inputs_stored_before_their_packing_answer_the_same(tmp_path, monkeypatch):
    """A run stored by an epscope that wrote the what-if inputs as they are (spill version 1) keeps
    opening and answers the exact what-if as one stored packed: the same rows, the same as the
    whole run's what_if. The packed inputs expand to the same arrays (of a narrower dtype only
    where whatif.NARROW says), in fewer bytes (>= 30 % at 75 k events a chunk, ~36 a lane; 46 % at
    the 10 M-event run's 2.5 M, ~600 a lane: benchmarks/NOTES.md); every other stored file is the
    same byte for byte, the index differing only in the inputs' checksums and sizes (and its seal)."""
    import numpy as np
    from profiler.analysis import chunked, spill, what_if, whatif
    from profiler.groundtruth.synthetic import make_events
    from profiler.store.runstore import write_run
    ev, la, man = make_events(ranks=4, events=300_000, scenario="slow_rank", iterations=4, seed=5)
    old = write_run(tmp_path / "old", ev, la, man, perfetto=False)
    new = tmp_path / "new"
    shutil.copytree(old, new)
    monkeypatch.setattr(chunked, "MAX_EVENTS", len(ev) // 4)
    with monkeypatch.context() as m:
        m.setattr(whatif.WhatIfInput, "to_arrays", _to_arrays_before_packing)
        stored.store_run(old)
    stored.store_run(new)
    a, b = stored.load(old), stored.load(new)
    for c, d in zip(a.what_if.chunks, b.what_if.chunks):
        po, pn = a.what_if.directory / c["file"], b.what_if.directory / d["file"]
        assert spill._PRE.unpack_from(po.read_bytes())[1] == 1 and spill._PRE.unpack_from(pn.read_bytes())[1] == 2
        assert d["bytes"] <= 0.7 * c["bytes"], (c, d)
        xo, xn = spill.read(po), spill.read(pn)
        assert list(xo) == list(xn)
        for k in xo:
            assert np.array_equal(xo[k], xn[k]), k
            assert xo[k].dtype == xn[k].dtype or k in whatif.NARROW, k
        # in memory: the same input, the durations only in their stored dtype (summary casts them)
        io, inew = (whatif.WhatIfInput.from_arrays(x, None) for x in (xo, xn))
        for k, v in vars(io.retime).items():
            assert v.dtype == getattr(inew.retime, k).dtype and np.array_equal(v, getattr(inew.retime, k)), k
        for k in ("lane_t", "seg_pt", "seg_d", "seg_phase", "seg_lane"):
            assert np.array_equal(getattr(io, k), getattr(inew, k)), k
            assert getattr(io, k).dtype == getattr(inew, k).dtype or k == "seg_d", k
    for phase, rank in (("dispatch/send_chunk", 3), ("copy_out", None), ("combine/wait_data", [0, 1])):
        got = a.what_if_summary(phase=phase, speedup=0.4, rank=rank)
        pd.testing.assert_frame_equal(got, b.what_if_summary(phase=phase, speedup=0.4, rank=rank))
        whole = what_if(ev, phase=phase, speedup=0.4, rank=rank, registry=man["registry"], launches=la).summary
        pd.testing.assert_frame_equal(got, whole)
    files = sorted(p.relative_to(old) for p in (old / stored.DIR).rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(new) for p in (new / stored.DIR).rglob("*") if p.is_file())
    for f in files:
        if f.parts[1] not in (stored.WHAT_IF_DIR, stored.INDEX):
            assert (old / f).read_bytes() == (new / f).read_bytes(), f
    io, inew = (json.loads((r / stored.DIR / stored.INDEX).read_text()) for r in (old, new))
    for i in (io, inew):
        i.pop("seal")
        for c in i["what_if"]["chunks"]:
            c.pop("sha256"), c.pop("bytes")
    assert io == inew


def test_a_run_analysed_in_memory_stores_its_what_if_inputs_packed_as_a_directory_spill_does(chunked_run):
    """stored.store of a run whose spills were in memory (the viewer's analysis) writes the same
    files byte for byte as store_run, whose spills are files: the what-if inputs packed alike."""
    d = chunked_run[0]
    want = {p.relative_to(d / stored.DIR): p.read_bytes() for p in sorted((d / stored.DIR).rglob("*")) if p.is_file()}
    run = load_run(d)
    mem = stored.store(run, summary.analyze(run), dest=d / "in-memory")
    assert {p.relative_to(mem): p.read_bytes() for p in sorted(mem.rglob("*")) if p.is_file()} == want
