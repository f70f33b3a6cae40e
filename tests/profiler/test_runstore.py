"""profiler.store.runstore: round trip, typed errors for missing / corrupt / malformed / newer / empty
runs, streaming, atomic writes that never replace unasked, one consistent version per read,
confinement of symlinked files, old runs still opening."""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from profiler.store import runstore as RS
from profiler.store import validate
from profiler.decode.decode import LaunchInfo, decode_launches
from profiler.errors import (CorruptRun, EmptyRun, InvalidEvents, InvalidManifest, RunChanged, RunError, RunExists,
                             RunNotFound, UnsupportedRunVersion)
from profiler.registry.registry import load_all
from profiler.store.schema import COLUMNS, empty_events

from tests.needs import needs_module

from .bufbuild import random_buffer
from .damage import reseal

REG = load_all()["selftest"]
TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.fixture(scope="module")
def decoded():
    rng = np.random.default_rng(5)
    items = [(random_buffer(rng, REG, n_regions=8, capacity=48), LaunchInfo(r, l, "selftest.imbalance", l, "selftest"))
             for r in range(2) for l in range(3)]
    return decode_launches(items, {"selftest": REG})


def write_ok(tmp_path, decoded, name="c", **kw):
    return RS.write_run(tmp_path / name, decoded.events, decoded.launches, kw.pop("manifest", {}), perfetto=False, **kw)


def leftovers(d: Path) -> list[str]:
    """Temporary directories a write left behind."""
    return [p.name for p in d.iterdir() if p.name.startswith(".")]


def test_round_trip(tmp_path, decoded):
    man = {"name": "rt", "registry": {"selftest": REG.to_json()}, "workload": {"kind": "synthetic"}}
    p = write_ok(tmp_path, decoded, "run", manifest=man)
    run = RS.load_run(p)
    assert run.manifest["format"] == "epscope-run" and run.manifest["format_version"] == RS.FORMAT_VERSION
    assert run.manifest["drops"] == {"total": 0, "per_rank": [0, 0]} and "created" in run.manifest
    assert run.num_events == len(decoded.events) and run.name == "rt" and run.status == "ok"
    assert len(run.version_id) == 32
    pd.testing.assert_frame_equal(run.events, decoded.events, check_categorical=False)
    assert [str(t) for t in run.events.dtypes] == list(COLUMNS.values())
    pd.testing.assert_frame_equal(run.launches, decoded.launches, check_categorical=False)
    assert run.registries["selftest"].hash == REG.hash
    assert not (p / RS.TRACE).exists()
    assert RS.list_runs(tmp_path) == [p] and leftovers(tmp_path) == []


def test_trace_written_when_asked_or_small(tmp_path, decoded):
    needs_module("perfetto", "pip install -e . (a base dependency)")
    p = RS.write_run(tmp_path / "r", decoded.events, decoded.launches, {}, perfetto=True)
    assert (p / RS.TRACE).stat().st_size > 0
    # perfetto=None keeps a trace only for small runs; a rewrite over the threshold has none
    RS.write_run(p, decoded.events, decoded.launches, {}, perfetto=None, overwrite=True)
    assert (p / RS.TRACE).exists()
    old = RS.TRACE_KEEP_MAX_EVENTS
    try:
        RS.TRACE_KEEP_MAX_EVENTS = 10
        RS.write_run(p, decoded.events, decoded.launches, {}, perfetto=None, overwrite=True)
    finally:
        RS.TRACE_KEEP_MAX_EVENTS = old
    assert not (p / RS.TRACE).exists()


def test_iter_event_batches_streams(tmp_path, decoded):
    p = write_ok(tmp_path, decoded, "b")
    batches = list(RS.iter_event_batches(p, batch_rows=100))
    assert all(len(b) <= 100 for b in batches) and sum(map(len, batches)) == len(decoded.events)
    assert batches[0]["phase"].dtype == "category"
    got = pd.concat([b[["begin_ns", "end_ns"]] for b in batches], ignore_index=True)
    pd.testing.assert_frame_equal(got, decoded.events[["begin_ns", "end_ns"]].reset_index(drop=True))


# -- writes -----------------------------------------------------------------------------------
def test_an_existing_name_gets_a_suffix_not_replaced(tmp_path, decoded):
    a = write_ok(tmp_path, decoded, "same", manifest={"name": "first"})
    b = write_ok(tmp_path, decoded, "same", manifest={"name": "second"})
    c = write_ok(tmp_path, decoded, "same", manifest={"name": "third"})
    assert (a.name, b.name, c.name) == ("same", "same-2", "same-3")
    assert RS.load_run(a).name == "first" and RS.load_run(b).name == "second"
    assert RS.free_path(tmp_path / "same") == tmp_path / "same-4"
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_a_run_in_one_step(tmp_path, decoded):
    a = write_ok(tmp_path, decoded, "o", manifest={"name": "first"})
    v1 = RS.load_run(a).version_id
    b = write_ok(tmp_path, decoded, "o", manifest={"name": "second"}, overwrite=True)
    assert b == a
    run = RS.load_run(a)
    assert run.name == "second" and run.version_id != v1
    assert leftovers(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["o"]


def test_overwrite_refuses_what_is_not_a_run(tmp_path, decoded):
    d = tmp_path / "home"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    with pytest.raises(RunExists, match="not a run directory"):
        write_ok(tmp_path, decoded, "home", overwrite=True)
    assert (d / "precious.txt").read_text() == "keep me" and leftovers(tmp_path) == []
    run = write_ok(tmp_path, decoded, "target")
    os.symlink(run, tmp_path / "link")
    with pytest.raises(RunExists):
        write_ok(tmp_path, decoded, "link", overwrite=True)


def test_a_save_that_fails_halfway_leaves_the_old_run(tmp_path, decoded, monkeypatch):
    p = write_ok(tmp_path, decoded, "f", manifest={"name": "old"})
    old = RS.load_run(p)
    real = RS._write_file
    calls = []

    def fail_second(path, write):   # the events are written, then the launches fail
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, write)
    monkeypatch.setattr(RS, "_write_file", fail_second)
    half = decoded.events.assign(payload=decoded.events["payload"] + 1)
    with pytest.raises(OSError, match="No space"):
        RS.write_run(p, half, decoded.launches, {"name": "new"}, perfetto=False, overwrite=True)
    monkeypatch.undo()
    again = RS.load_run(p)
    assert again.name == "old" and again.version_id == old.version_id
    pd.testing.assert_frame_equal(again.events, old.events)
    assert leftovers(tmp_path) == []


def test_writing_bad_events_writes_nothing(tmp_path, decoded):
    bad = decoded.events.assign(end_ns=decoded.events["begin_ns"] - 1)
    with pytest.raises(InvalidEvents, match="end before they begin"):
        RS.write_run(tmp_path / "x", bad, decoded.launches, {}, perfetto=False)
    assert os.listdir(tmp_path) == []


# -- one version per read ------------------------------------------------------------------
def _mix(tmp_path, decoded):
    """A run whose manifest is from one write and whose events are from another."""
    a = write_ok(tmp_path, decoded, "mix-a")
    b = write_ok(tmp_path, decoded, "mix-b")
    shutil.copy(b / RS.EVENTS, a / RS.EVENTS)
    return a


def test_files_of_two_writes_are_never_read_as_one_run(tmp_path, decoded):
    with pytest.raises(CorruptRun, match="events.parquet and manifest.json come from different writes"):
        RS.load_run(_mix(tmp_path, decoded))


def test_events_read_after_a_rewrite_raise_run_changed(tmp_path, decoded):
    p = write_ok(tmp_path, decoded, "lazy")
    run = RS.load_run(p)                      # events not read yet
    write_ok(tmp_path, decoded, "lazy", overwrite=True)
    with pytest.raises(RunChanged, match="open it again"):
        run.events
    assert len(RS.load_run(p).events) == len(decoded.events)


def test_a_reader_racing_a_writer_sees_one_version(tmp_path, decoded):
    """Each write stamps its number into the manifest and into every event's payload: a read
    that returns must show the same number in both (the issue saw 433 mixes in 1,279 reads)."""
    def write(i, overwrite=True):
        ev = decoded.events.assign(payload=np.int64(i))
        return RS.write_run(tmp_path / "race", ev, decoded.launches, {"headline": {"i": i}}, perfetto=False,
                            overwrite=overwrite)
    p = write(0, overwrite=False)
    stop = threading.Event()

    def writer():
        i = 1
        while not stop.is_set() and i < 120:
            write(i)
            i += 1
    th = threading.Thread(target=writer)
    th.start()
    reads = errors = 0
    try:
        while th.is_alive() and reads < 120:
            try:
                run = RS.load_run(p)
                got = set(run.events["payload"].unique().tolist())
            except RunChanged:            # a clear error is allowed; a mix is not
                errors += 1
                continue
            assert got == {run.manifest["headline"]["i"]}, (got, run.manifest["headline"])
            reads += 1
    finally:
        stop.set()
        th.join()
    assert reads > 0 and leftovers(tmp_path) == []


def test_old_runs_without_version_ids_open(tmp_path, decoded):
    bundled = sorted(TRACES.rglob("manifest.json"))
    assert bundled
    for m in bundled:       # recorded before version ids, or after: all open
        run = RS.load_run(m.parent)
        assert len(run.launches) >= 0 and run.num_events > 0
    # a run as epscope wrote them before version ids: no version_id, no parquet metadata key (and
    # no checksums, which came later still)
    p = write_ok(tmp_path, decoded, "v1")
    man = json.loads((p / "manifest.json").read_text())
    del man["version_id"], man["checksums"], man["seal"]
    man["format_version"] = 1
    (p / "manifest.json").write_text(json.dumps(man))
    for f in ("events.parquet", "launches.parquet"):
        t = pq.read_table(p / f)
        meta = {k: v for k, v in t.schema.metadata.items() if k not in (RS.VERSION_KEY, validate.FOOTER_FORMAT_KEY)}
        pq.write_table(t.replace_schema_metadata(meta), p / f)
    run = RS.load_run(p)
    assert run.version_id is None
    pd.testing.assert_frame_equal(run.events, decoded.events, check_categorical=False)


# -- errors -----------------------------------------------------------------------------------
def test_missing_run(tmp_path):
    with pytest.raises(RunNotFound, match="no such run directory"):
        RS.load_run(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RunNotFound, match="no manifest.json"):
        RS.load_run(tmp_path / "plain")


def _manifest(p, **changes):
    """Edit the manifest and seal it again (a writer's mistake, not damage: the field checks must
    catch it, not the seal)."""
    m = json.loads((p / "manifest.json").read_text())
    m.update(changes)
    (p / "manifest.json").write_text(json.dumps(m))
    reseal(p)


@pytest.mark.parametrize("breakage, err, match", [
    (lambda p: (p / "manifest.json").write_text("{not json"), InvalidManifest, "not valid JSON"),
    (lambda p: (p / "manifest.json").write_text('{"format": "other"}'), InvalidManifest, "not an epscope-run manifest"),
    (lambda p: reseal((p / "events.parquet").write_bytes(b"PAR1garbage") and p), CorruptRun, "not a readable parquet"),
    (lambda p: (p / "events.parquet").write_bytes(b"PAR1garbage"), CorruptRun, "events.parquet: content does not match"),
    (lambda p: (p / "events.parquet").unlink(), CorruptRun, "events.parquet missing"),
    (lambda p: (p / "manifest.json").unlink(), CorruptRun, "no manifest.json"),
    (lambda p: reseal((p / "launches.parquet").write_bytes(b"xx") and p), CorruptRun, "cannot read launches"),
    (lambda p: (p / "launches.parquet").write_bytes(b"xx"), CorruptRun, "launches.parquet: content does not match"),
    (lambda p: (p / "launches.parquet").unlink(), CorruptRun, "launches.parquet missing"),
    (lambda p: _manifest(p, git="abc"), InvalidManifest, "field 'git' must be an object"),
    (lambda p: _manifest(p, clock=[1, 2]), InvalidManifest, "field 'clock' must be an object"),
    (lambda p: _manifest(p, drops={"total": "many"}), InvalidManifest, "field 'drops.total' must be an integer"),
    (lambda p: _manifest(p, format_version=True), InvalidManifest, "format_version"),
    (lambda p: _manifest(p, format_version=0), InvalidManifest, "format_version"),
    (lambda p: _manifest(p, format_version=-5), InvalidManifest, "format_version"),
    (lambda p: _manifest(p, num_events=3), CorruptRun, "'num_events' says 3 events"),
    (lambda p: (p / "manifest.json").write_text('{"x": ' + "[" * 5000 + "]" * 5000 + "}"), InvalidManifest,
     "nested deeper"),
])
def test_corrupt_runs(tmp_path, decoded, breakage, err, match):
    p = write_ok(tmp_path, decoded)
    breakage(p)
    with pytest.raises(err, match=match) as e:
        RS.load_run(p)
    assert "\n" not in str(e.value)


def _events(p, **cols):
    """Rewrite RUN/events.parquet with some columns replaced, keeping the write's version id."""
    t = pq.read_table(p / "events.parquet")
    for name, values in cols.items():
        t = t.set_column(t.column_names.index(name), name, values if isinstance(values, pa.Array) else pa.array(values))
    pq.write_table(t.replace_schema_metadata(pq.read_schema(p / "events.parquet").metadata), p / "events.parquet")
    reseal(p)


@pytest.mark.parametrize("col, make, match", [
    ("begin_ns", lambda n, ev: [str(v) for v in ev["begin_ns"]], "begin_ns"),
    ("begin_ns", lambda n, ev: [float("nan")] * n, "not finite"),
    ("end_ns", lambda n, ev: (ev["begin_ns"] - 1).tolist(), "end before they begin"),
    ("kind", lambda n, ev: ["bogus"] * n, "outside"),
    ("rank", lambda n, ev: [1 << 40] * n, "do not fit int16"),
    # stored as write_run stores them (the row-group reader), with bad values
    ("begin_ns", lambda n, ev: pa.array([None] + ev["begin_ns"].tolist()[1:], pa.int64()), "rows are missing"),
    ("kind", lambda n, ev: pa.array(["bogus"] * n).dictionary_encode(), "outside"),
])
def test_malformed_events_are_typed_errors(tmp_path, decoded, col, make, match):
    p = write_ok(tmp_path, decoded)
    _events(p, **{col: make(len(decoded.events), decoded.events)})
    run = RS.load_run(p)                           # the footer is fine: the full read finds it
    with pytest.raises(InvalidEvents, match=match):
        run.events
    if col in ("begin_ns", "end_ns", "kind"):     # what export checks without loading the table
        with pytest.raises(InvalidEvents, match=match):
            RS.check_events(run)


def test_newer_format_version(tmp_path, decoded):
    p = write_ok(tmp_path, decoded)
    _manifest(p, format_version=RS.FORMAT_VERSION + 1)
    with pytest.raises(UnsupportedRunVersion, match="newer"):
        RS.load_run(p)


def test_empty_run(tmp_path, decoded):
    p = RS.write_run(tmp_path / "e", empty_events(), decoded.launches.iloc[:0], {}, perfetto=False)
    with pytest.raises(EmptyRun, match="no events"):
        RS.load_run(p)


def test_events_with_missing_columns_are_corrupt(tmp_path, decoded):
    p = write_ok(tmp_path, decoded)
    pq.write_table(pa.table({"rank": [0]}), p / "events.parquet")
    reseal(p)
    with pytest.raises(CorruptRun, match="lacks event columns"):
        RS.load_run(p)


def test_all_run_errors_share_a_base():
    assert all(issubclass(c, RunError) for c in (RunNotFound, CorruptRun, UnsupportedRunVersion, EmptyRun,
                                                 InvalidManifest, InvalidEvents, RunChanged, RunExists))


# -- confinement and the cheap check -----------------------------------------------------------
def test_files_resolving_outside_the_roots_are_refused(tmp_path, decoded):
    root = tmp_path / "root"
    p = write_ok(root, decoded, "r")
    outside = write_ok(tmp_path / "elsewhere", decoded, "o")
    assert RS.load_run(p, within=[root]).num_events > 0
    for name in (RS.EVENTS, RS.MANIFEST, RS.LAUNCHES):
        q = write_ok(root, decoded, f"link-{name}")
        (q / name).unlink()
        os.symlink(outside / name, q / name)
        with pytest.raises(RS.OutsideRoots, match="outside the allowed roots"):
            RS.load_run(q, within=[root])
    os.symlink(outside, root / "dirlink")
    with pytest.raises(RS.OutsideRoots):
        RS.load_run(root / "dirlink", within=[root])


def test_check_run_reads_footers_only(tmp_path, decoded):
    ok = write_ok(tmp_path, decoded, "ok")
    assert RS.check_run(ok).ok and RS.check_run(ok).num_events == len(decoded.events)
    t = write_ok(tmp_path, decoded, "t", manifest={"status": "timeout"})
    assert RS.check_run(t).status == "timeout" and not RS.check_run(t).ok
    bad = write_ok(tmp_path, decoded, "bad")
    (bad / "events.parquet").write_bytes(b"PAR1 nope")
    c = RS.check_run(bad)
    assert c.status == "corrupt" and "parquet" in c.problem and c.manifest is not None
    short = write_ok(tmp_path, decoded, "short")
    _manifest(short, num_events=1)
    assert RS.check_run(short).status == "corrupt"
    wrong = write_ok(tmp_path, decoded, "wrong")
    _manifest(wrong, git="abc")
    c = RS.check_run(wrong)
    assert c.status == "unreadable" and "git" in c.problem and c.manifest is None
    assert RS.check_run(_mix(tmp_path, decoded)).status == "corrupt"


def test_list_runs_nested_missing_root_and_writes_in_progress(tmp_path, decoded):
    a = write_ok(tmp_path / "x", decoded, "a")
    b = write_ok(tmp_path / "y" / "z", decoded, "b")
    shutil.copytree(a, tmp_path / "x" / ".a.1234.tmp")      # what a killed writer leaves
    assert RS.list_runs(tmp_path) == sorted([a, b])
    assert RS.list_runs(tmp_path / "none") == []


def test_manifest_accepts_numpy_values(tmp_path, decoded):
    p = RS.write_run(tmp_path / "n", decoded.events, decoded.launches,
                     {"headline": {"x": np.float32(1.5), "n": np.int64(3)}}, perfetto=False)
    assert RS.load_run(p).manifest["headline"] == {"x": 1.5, "n": 3}


def test_a_manifest_that_would_not_read_back_is_not_written(tmp_path, decoded):
    with pytest.raises(InvalidManifest, match="git"):
        RS.write_run(tmp_path / "w", decoded.events, decoded.launches, {"git": "abc"}, perfetto=False)
    assert os.listdir(tmp_path) == []


def test_update_manifest_sets_fields_and_keeps_the_rest(tmp_path, decoded):
    p = RS.write_run(tmp_path / "r", decoded.events, decoded.launches, {"name": "r", "workload": {"kind": "ep"}},
                     perfetto=False)
    before = json.loads((p / RS.MANIFEST).read_text())
    block = {"schema": 1, "cause": "none", "effect": {"metric": "x", "value": np.float64(1.5), "unit": "x"}}
    after = RS.update_manifest(p, {"expect": block})
    assert after == json.loads((p / RS.MANIFEST).read_text())
    assert after["expect"]["effect"]["value"] == 1.5
    assert {k: after[k] for k in before if k != "seal"} == {k: v for k, v in before.items() if k != "seal"}
    run = RS.load_run(p)
    assert run.manifest["expect"]["cause"] == "none" and run.version_id == before["version_id"]
    assert leftovers(p) == []
    for frozen in ("format_version", "version_id", "num_events"):
        with pytest.raises(ValueError, match=frozen):
            RS.update_manifest(p, {frozen: 9})
    with pytest.raises(InvalidManifest, match="expect"):           # what would not read back is not written
        RS.update_manifest(p, {"expect": {"schema": 1, "cause": "gremlins"}})
    assert RS.load_run(p).manifest["expect"]["cause"] == "none"
    with pytest.raises(RunNotFound):
        RS.update_manifest(tmp_path / "missing", {"expect": None})


# -- layout: row groups at (rank, iteration) boundaries (issue 20) ------------------------------
def _segments(rank, iteration) -> np.ndarray:
    change = (rank[1:] != rank[:-1]) | (iteration[1:] != iteration[:-1])
    return np.append(np.flatnonzero(change) + 1, len(rank))


@pytest.mark.parametrize("floor,ceiling", [(1, 10), (3, 10), (7, 7), (12, 40), (1000, 1000)])
def test_row_groups_end_on_segment_ends_within_floor_and_ceiling(floor, ceiling):
    rng = np.random.default_rng(floor * 100 + ceiling)
    sizes = rng.integers(1, 25, 60)
    rank = np.repeat(np.arange(60) // 10, sizes)
    iteration = np.repeat(np.arange(60) % 10, sizes)
    b = RS.row_group_bounds(rank, iteration, floor=floor, ceiling=ceiling)
    ends = _segments(rank, iteration)
    n = len(rank)
    assert b[0] == 0 and b[-1] == n and (np.diff(b) > 0).all() and (np.diff(b) <= ceiling).all()
    for a, e in zip(b[:-1], b[1:]):
        seg_end = ends[np.searchsorted(ends, e, "left")]
        if e != seg_end:   # cut inside a segment: only a segment longer than the ceiling is
            assert e - a == ceiling
        # a group below the floor is the last one, or the next segment end lies past the ceiling
        if e - a < floor and e != n:
            assert ends[min(np.searchsorted(ends, a + floor, "left"), len(ends) - 1)] - a > ceiling


def test_write_run_cuts_row_groups_at_rank_iteration_boundaries(tmp_path, monkeypatch):
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=4, events=20_000, scenario="slow_rank", iterations=3, seed=3)
    monkeypatch.setattr(RS, "ROW_GROUP_MIN_ROWS", 1)
    monkeypatch.setattr(RS, "ROW_GROUP_ROWS", 2000)
    p = RS.write_run(tmp_path / "r", ev, la, man, perfetto=False)
    meta = pq.ParquetFile(p / RS.EVENTS).metadata
    segs = ev.groupby(["rank", "iteration"], sort=False).size()
    # every segment is cut into pieces of at most the ceiling, none shared with another segment
    assert meta.num_row_groups == int(sum(-(-s // 2000) for s in segs))
    names = [meta.schema.column(j).name for j in range(meta.num_columns)]
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        st = {c: rg.column(names.index(c)).statistics for c in ("rank", "iteration")}
        assert all(s.has_min_max and s.min == s.max for s in st.values()) and rg.num_rows <= 2000
    run = RS.load_run(p)   # the table reads back as written, rows in their order
    pd.testing.assert_frame_equal(run.events, RS.validate.events(ev.reset_index(drop=True)))
    # the default floor merges small segments: this 20 k-event run stays one row group
    monkeypatch.undo()
    p2 = RS.write_run(tmp_path / "r2", ev, la, man, perfetto=False)
    assert pq.ParquetFile(p2 / RS.EVENTS).metadata.num_row_groups == 1


def _parts_of(ev: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    cuts = np.linspace(0, len(ev), n + 1).astype(int)
    return [ev.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts[:-1], cuts[1:])]


def test_a_run_written_in_parts_reads_as_written_whole(tmp_path):
    """write_run_parts (a run too large to hold whole) writes the file write_run would: the same
    table, count and row groups by (rank, iteration); a filtered read works on it."""
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=4, events=30_000, scenario="slow_rank", seed=2)
    whole = RS.load_run(RS.write_run(tmp_path / "whole", ev, la, man, perfetto=False))
    parts = RS.load_run(RS.write_run_parts(tmp_path / "parts", _parts_of(ev, 5), la, man))
    assert parts.manifest["num_events"] == len(ev) == whole.manifest["num_events"]
    pd.testing.assert_frame_equal(parts.events, whole.events)
    assert RS.check_run(parts.path, deep=True).ok
    from profiler.store.runreader import EventReader
    with EventReader(parts) as r:
        got = r.read(iterations=[1])
    want = whole.events[whole.events["iteration"] == 1]
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))


def test_parts_with_other_categories_or_none_are_refused(tmp_path):
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=2, events=4_000, seed=1)
    a, b = _parts_of(ev, 2)
    b = b.assign(phase=b["phase"].cat.add_categories(["not_in_the_first_part"]))
    with pytest.raises(ValueError, match="same categories"):
        RS.write_run_parts(tmp_path / "mixed", [a, b], la, man)
    assert not (tmp_path / "mixed").exists()           # nothing placed
    with pytest.raises(ValueError, match="no parts"):
        RS.write_run_parts(tmp_path / "none", [], la, man)


def test_a_long_synthetic_run_written_one_iteration_at_a_time(tmp_path):
    """synthetic.make_long_run (the 100 M-event benchmark's run): its parts and launch table come as
    the iterations are simulated; it reads back as those iterations written whole."""
    from profiler.groundtruth.synthetic import make_iterations, make_long_run
    its = list(make_iterations(ranks=2, per_iteration=3_000, iterations=3, scenario="slow_rank"))
    ev = pd.concat([e for e, _, _ in its], ignore_index=True)
    la = pd.concat([x for _, x, _ in its], ignore_index=True)
    whole = RS.load_run(RS.write_run(tmp_path / "whole", ev, la, its[0][2], perfetto=False))
    long = RS.load_run(make_long_run(tmp_path / "long", ranks=2, per_iteration=3_000, iterations=3))
    pd.testing.assert_frame_equal(long.events, whole.events)
    pd.testing.assert_frame_equal(long.launches, whole.launches)
    assert sorted(long.events["iteration"].unique()) == [0, 1, 2]
    assert long.manifest["num_events"] == len(ev)
