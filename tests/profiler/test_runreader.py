"""profiler.store.runreader: every finding of issue 19 about reading a run, each with the damage that
exposed it: damaged pandas metadata, tables load_run accepted but export or report crashed on
(and the reverse), manifests with null fields, a missing launches.parquet, checksums."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq
import pytest

from profiler.store import runstore as RS
from profiler.errors import ChecksumMismatch, CorruptRun, EpscopeError, InvalidEvents, InvalidManifest
from profiler.export.perfetto import export_perfetto
from profiler.commands.report import report
from profiler.groundtruth.synthetic import make_run

from .damage import as_written_before_checksums, reseal

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("rr") / "good", ranks=2, events=1500, perfetto=False)


@pytest.fixture()
def run(good, tmp_path):
    import shutil
    return Path(shutil.copytree(good, tmp_path / "run"))


def _rewrite(p: Path, name: str, change) -> None:
    """Rewrite a data file through change(table, metadata) -> (table, metadata), then reseal."""
    f = p / name
    t = pq.read_table(f)
    t, meta = change(t, dict(t.schema.metadata or {}))
    pq.write_table(t.replace_schema_metadata(meta), f)
    reseal(p)


def _set_column(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.column_names.index(name), name, values)


def outcomes(p: Path) -> dict[str, str]:
    """What each reader makes of a run: 'ok', or the typed error's class; an untyped error fails."""
    out = {}
    for what, fn in (("load", lambda: RS.load_run(p).events), ("report", lambda: report(p)),
                     ("export", lambda: export_perfetto(p, p.parent / f"{p.name}.pftrace", force=True))):
        try:
            fn()
            out[what] = "ok"
        except EpscopeError as e:
            out[what] = type(e).__name__
            assert "\n" not in str(e)
    c = RS.check_run(p, deep=True)
    out["check"] = "ok" if not c.damaged else "damaged"
    return out


def agree(p: Path) -> dict[str, str]:
    """The readers accept exactly the same runs (issue 19: export accepted tables load_run
    refused, and crashed on tables it accepted)."""
    o = outcomes(p)
    accepted = {k: v == "ok" for k, v in o.items()}
    assert len(set(accepted.values())) == 1, o
    return o


# -- pandas metadata ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", [RS.LAUNCHES, RS.EVENTS])
@pytest.mark.parametrize("damage", [b'{"index_columns": [', b"\xff\xfe not utf-8", b'{"columns": 5}',
                                    b'{"index_columns": ["nope"], "columns": []}', b"[]"])
def test_damaged_pandas_metadata_is_ignored(run, name, damage):
    """16 % of single-bit flips in launches.parquet damage its pandas metadata: JSONDecodeError,
    UnicodeDecodeError, KeyError and TypeError out of load_run and check_run, and check_run is
    documented never to raise. The columns are read by name: the run opens, values intact."""
    before = RS.load_run(run)
    want_ev, want_la = before.events, before.launches
    _rewrite(run, name, lambda t, m: (t, {**m, b"pandas": damage}))
    got = RS.load_run(run)
    assert got.events.equals(want_ev) and got.launches.equals(want_la)
    assert agree(run)["load"] == "ok"


# -- tables: what one reader accepts, all accept -------------------------------------------------
def _null_first(t, col):
    arr = t.column(col).combine_chunks()
    mask = np.zeros(len(arr), bool)
    mask[0] = True
    return _set_column(t, col, pa.array(arr.to_pylist(), type=arr.type, mask=mask))


TABLES = {
    # accepted by load_run before, crashed export and two viewer callbacks
    "null-phase": (lambda t, m: (_null_first(t, "phase"), m), "InvalidEvents"),
    "null-role": (lambda t, m: (_null_first(t, "role"), m), "InvalidEvents"),
    "null-kernel": (lambda t, m: (_null_first(t, "kernel"), m), "InvalidEvents"),
    "plain-string-kind": (lambda t, m: (_set_column(t, "kind", pa.array(t.column("kind").to_pylist())), m), "ok"),
    "begin-at-int64-min": (lambda t, m: (_set_column(t, "begin_ns", pa.array(
        [np.iinfo(np.int64).min] + t.column("begin_ns").to_pylist()[1:], pa.int64())), m), "InvalidEvents"),
    "negative-rank": (lambda t, m: (_set_column(t, "rank", pa.array([-3] * t.num_rows, pa.int16())), m),
                      "InvalidEvents"),
    "int-phase-names": (lambda t, m: (_set_column(t, "phase", pa.array(list(range(t.num_rows)))), m), "InvalidEvents"),
    # accepted by load_run, refused by export (ExportError: ids past its track id scheme)
    # (warps moved up by 100, not all set to 100: that would make rows repeat, which is refused)
    "warp-100": (lambda t, m: (_set_column(t, "warp", pa.compute.if_else(
        pa.compute.equal(t.column("warp"), -1), -1, pa.compute.add(t.column("warp"), 100)).cast(pa.int16())), m), "ok"),
    "block-300000": (lambda t, m: (_set_column(t, "block", pa.compute.if_else(
        pa.compute.equal(t.column("block"), -1), -1, 300_000).cast(pa.int32())), m), "ok"),
    # what a bit flip made of a host row's kind: a GPU row without a block
    "gpu-row-without-block": (lambda t, m: (_set_column(t, "block", pa.compute.if_else(
        pa.compute.not_equal(t.column("kind").cast(pa.string()), "host"), -1, t.column("block")).cast(pa.int32())), m),
        "InvalidEvents"),
    # refused by load_run before, written by export all the same
    "null-warp": (lambda t, m: (_null_first(t, "warp"), m), "InvalidEvents"),
    "fractional-payload": (lambda t, m: (_set_column(t, "payload", pa.array(
        [0.5] * t.num_rows, pa.float64())), m), "InvalidEvents"),
}


@pytest.mark.parametrize("case", list(TABLES))
def test_every_reader_accepts_the_same_event_tables(run, case):
    change, want = TABLES[case]
    _rewrite(run, RS.EVENTS, change)
    o = agree(run)
    assert o["load"] == want, o


@pytest.mark.parametrize("case, change", [
    ("null-kernel", lambda t, m: (_null_first(t, "kernel"), m)),
    ("string-times", lambda t, m: (_set_column(t, "gpu_begin_ns", pa.array([str(x) for x in
                                                                           t.column("gpu_begin_ns").to_pylist()])), m)),
    ("huge-times", lambda t, m: (_set_column(t, "gpu_end_ns", pa.array([1 << 62] * t.num_rows, pa.int64())), m)),
    ("negative-dropped", lambda t, m: (_set_column(t, "dropped", pa.array([-1] * t.num_rows, pa.int64())), m)),
    ("no-dropped-column", lambda t, m: (t.drop_columns(["dropped"]), m)),
])
def test_damaged_launch_tables_are_typed_errors_everywhere(run, case, change):
    _rewrite(run, RS.LAUNCHES, change)
    with pytest.raises(InvalidEvents, match="launches.parquet"):
        RS.load_run(run)
    assert agree(run)["load"] == "InvalidEvents"


def test_a_missing_launch_table_is_a_typed_error(run):
    """It was accepted silently (an empty launch table: no kernels, no drops)."""
    (run / RS.LAUNCHES).unlink()
    with pytest.raises(CorruptRun, match="launches.parquet missing"):
        RS.load_run(run)
    assert RS.check_run(run).problem and agree(run)["load"] == "CorruptRun"


# -- manifests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    {"clock": None}, {"warnings": None}, {"clock": {"ranks": None}}, {"clock": {"ranks": [{"rank": 0, "uncertainty_ns": None}]}},
    {"clock": {"host": None, "ranks": [{"rank": 0, "drift_ppm": None}]}}, {"warnings": [{"type": "X", "count": None}]},
    {"registry": None}, {"drops": None}, {"gpu": {"count": None, "name": None}}, {"git": {"commit": None}},
])
def test_null_manifest_fields_read_as_absent(run, change):
    """7 manifests that passed validation (null or missing clock and warning fields) crashed
    report or export."""
    m = json.loads((run / RS.MANIFEST).read_text())
    m.update(change)
    (run / RS.MANIFEST).write_text(json.dumps(m))
    reseal(run)   # as a writer would leave them: the field checks, not the seal, decide
    assert agree(run)["load"] == "ok"


@pytest.mark.parametrize("change, field", [
    ({"clock": {"ranks": [{"uncertainty_ns": 5}]}}, "clock.ranks[0].rank"),
    ({"warnings": [{"count": 3}]}, "warnings[0].type"),
    ({"drops": {"per_rank": [1]}}, "drops.total"),
    ({"checksums": None}, "checksums"),
    ({"checksums": {"events.parquet": "sha256:00"}}, "checksums"),
])
def test_fields_readers_index_are_required(run, change, field):
    m = json.loads((run / RS.MANIFEST).read_text())
    m.update(change)
    (run / RS.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InvalidManifest) as e:
        RS.load_run(run)
    assert e.value.field == field and "manifest.json" in str(e.value)
    assert agree(run)["load"] == "InvalidManifest"


# -- checksums ---------------------------------------------------------------------------------------
def test_checksums_are_written_and_a_changed_byte_names_its_file(run):
    """17 % of single-bit flips in events.parquet changed values with no error."""
    m = json.loads((run / RS.MANIFEST).read_text())
    assert set(m["checksums"]) == {RS.EVENTS, RS.LAUNCHES} and m["format_version"] == RS.FORMAT_VERSION
    r = RS.load_run(run)
    assert r.checksummed and RS.check_run(run, deep=True).note is None
    for name in (RS.EVENTS, RS.LAUNCHES):
        b = bytearray((run / name).read_bytes())
        b[len(b) // 2] ^= 0x10                       # a value in the middle of the data
        (run / name).write_bytes(bytes(b))
        with pytest.raises(ChecksumMismatch, match=name) as e:
            RS.load_run(run).events
        assert e.value.file.endswith(name)
        c = RS.check_run(run, deep=True)
        assert c.damaged and name in c.problem
        (run / name).write_bytes(bytes(b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 0x10]) + b[len(b) // 2 + 1:]))
    assert RS.check_run(run, deep=True).ok


def test_runs_written_before_checksums_open_and_say_so(tmp_path):
    """The bundled runs are sealed now; copies of a few, as epscope wrote runs before checksums."""
    import shutil
    for m in sorted(TRACES.rglob(RS.MANIFEST))[:3]:
        old = as_written_before_checksums(shutil.copytree(m.parent, tmp_path / m.parent.name))
        c = RS.check_run(old, deep=True)
        assert c.ok and c.note == RS.NO_CHECKSUMS, c
        assert not RS.load_run(old).checksummed


def test_update_manifest_keeps_the_checksums(run):
    before = json.loads((run / RS.MANIFEST).read_text())["checksums"]
    RS.update_manifest(run, {"description": "renamed"})
    assert RS.load_run(run).checksums == before and RS.check_run(run, deep=True).ok
    with pytest.raises(ValueError, match="checksums"):
        RS.update_manifest(run, {"checksums": before})


# -- the import circle -------------------------------------------------------------------------------
def test_perfetto_export_and_runstore_import_no_circle():
    """perfetto_export imported runstore, which imported perfetto_export (deferred) to write a
    run's trace: the shared reader now lives one floor down (profiler.store.runreader)."""
    import ast
    def imports(path):   # the modules a file imports relatively, by their last name
        tree = ast.parse((ROOT / "profiler" / path).read_text())
        return {n.module.rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and n.module}
    assert "runstore" not in imports("export/perfetto.py") and "runstore" not in imports("store/runreader.py")
    assert "perfetto" not in imports("store/runreader.py")


# -- filtered reads (EventReader, issue 20) -----------------------------------------------------
def _filtered(full, iterations=None, ranks=None):
    m = np.ones(len(full), bool)
    if iterations is not None:
        m &= full["iteration"].isin(iterations).to_numpy()
    if ranks is not None:
        m &= full["rank"].isin(ranks).to_numpy()
    return full[m]


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """a equals b: index, columns, dtypes (categories in their order) and values (pandas'
    assert_frame_equal takes over a second per 300 k rows with an integer index)."""
    assert list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes)
    np.testing.assert_array_equal(a.index.to_numpy(), b.index.to_numpy())
    for c in a.columns:
        x, y = a[c], b[c]
        if isinstance(x.dtype, pd.CategoricalDtype):
            assert list(x.cat.categories) == list(y.cat.categories), c
            x, y = x.cat.codes, y.cat.codes
        np.testing.assert_array_equal(x.to_numpy(), y.to_numpy(), err_msg=c)


BUNDLED = sorted(p.parent.name for p in TRACES.glob("*/events.parquet"))


@pytest.mark.parametrize("name", BUNDLED)
def test_a_filtered_read_of_a_bundled_run_equals_the_full_read_filtered(name):
    from profiler.store.runreader import EventReader
    run = RS.load_run(TRACES / name)
    full = run.events
    its = np.unique(full["iteration"].to_numpy())
    ranks = np.unique(full["rank"].to_numpy())
    with EventReader(run) as r:
        for want_it, want_rk in ((its[:1], None), (its[1:3], None), (None, ranks[-1:]), (its[-1:], ranks[:1]),
                                 ([int(its.max()) + 1], None)):
            _same(r.read(iterations=want_it, ranks=want_rk), _filtered(full, want_it, want_rk))


def test_a_filtered_read_opens_only_the_row_groups_of_its_iterations(tmp_path, monkeypatch):
    from profiler.store.runreader import EventReader, RowFilter
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=4, events=30_000, scenario="late_host", iterations=5, seed=7)
    monkeypatch.setattr(RS, "ROW_GROUP_MIN_ROWS", 100)
    monkeypatch.setattr(RS, "ROW_GROUP_ROWS", 1000)
    run = RS.load_run(RS.write_run(tmp_path / "r", ev, la, man, perfetto=False))
    full = run.events
    read = []
    with EventReader(run) as r:
        assert len(r.groups) > 5 * 4
        orig, orig_one = r._pf.read_row_groups, r._pf.read_row_group
        monkeypatch.setattr(r._pf, "read_row_groups", lambda gs, **kw: read.extend(gs) or orig(gs, **kw))
        monkeypatch.setattr(r._pf, "read_row_group", lambda i, **kw: read.append(i) or orig_one(i, **kw))
        for want_it, want_rk in (([0], None), ([1, 3], None), ([2, 3, 4], [1, 2]), (None, [3]), ([4], [0])):
            read.clear()
            got = r.read(iterations=want_it, ranks=want_rk)
            _same(got, _filtered(full, want_it, want_rk))
            # exactly the row groups holding those rows were decoded
            held = sorted({int(np.searchsorted([g.first_row for g in r.groups], row, "right")) - 1
                           for row in got.index.to_numpy()})
            assert read == held == r.row_groups(RowFilter.of(want_it, want_rk))


def test_a_filtered_read_checks_the_checksum_and_the_rows(run):
    from profiler.store.runreader import EventReader
    ep = run / "events.parquet"
    data = bytearray(ep.read_bytes())
    data[len(data) // 2] ^= 0x10
    ep.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch):
        EventReader(RS.load_run(run))
    # a row the schema refuses (end before begin) is refused by a filtered read as by the full one
    _rewrite(run, "events.parquet", lambda t, m: (_set_column(t, "end_ns", pa.compute.subtract(
        t.column("begin_ns"), pa.scalar(1, pa.int64()))), m))
    r = RS.load_run(run)
    with pytest.raises(InvalidEvents):
        r.events
    with EventReader(r) as er, pytest.raises(InvalidEvents):
        er.read(iterations=[0])


def test_a_filtered_read_of_a_file_of_other_types_equals_the_full_read_filtered(run):
    """Plain strings instead of dictionaries (a file another writer made): pyarrow's own conversion,
    the same rows as the full read's."""
    from profiler.store.runreader import EventReader

    def plain(t, m):
        for c in ("kernel", "role", "kind", "phase"):
            t = _set_column(t, c, t.column(c).cast(pa.string()))
        return t, m
    _rewrite(run, "events.parquet", plain)
    r = RS.load_run(run)
    full = r.events
    with EventReader(r) as er:
        for it, rk in (([0], None), (None, [1]), ([1], [0])):
            got = er.read(iterations=it, ranks=rk)
            want = _filtered(full, it, rk)
            np.testing.assert_array_equal(got.index.to_numpy(), want.index.to_numpy())
            pd.testing.assert_frame_equal(got.astype({c: str for c in ("kernel", "role", "kind", "phase")}),
                                          want.astype({c: str for c in ("kernel", "role", "kind", "phase")}))


def test_all_kept_asks_every_value_of_each_groups_statistics():
    """A filtered read skips its row mask only where each row group's [min, max] of iteration and
    rank lies in the wanted values (sorted, distinct: RowFilter.of), and never without statistics."""
    from profiler.store.runreader import GroupStats, RowFilter, _all_kept
    st = [GroupStats(0, 10, 2, 2, 0, 0), GroupStats(10, 10, 3, 4, 1, 1), GroupStats(20, 5, None, None, 0, 0)]
    assert _all_kept(RowFilter.of([2, 3, 4]), st, [0, 1])
    assert _all_kept(RowFilter.of([2, 3, 4], [0, 1]), st, [0, 1])
    assert not _all_kept(RowFilter.of([2, 4]), st, [0, 1])          # 3 not wanted: rows of it may be there
    assert not _all_kept(RowFilter.of([3]), st, [1])
    assert not _all_kept(RowFilter.of([2, 3, 4], [1]), st, [0, 1])
    assert not _all_kept(RowFilter.of([2]), st, [2])                 # no iteration statistics
    assert _all_kept(RowFilter.of(None, [0]), st, [2])
    assert not _all_kept(RowFilter.of([]), st, [0])
