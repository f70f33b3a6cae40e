"""profiler.runstore: round trip, typed errors for missing / corrupt / newer / empty runs, streaming."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from profiler import runstore as RS
from profiler.decode import LaunchInfo, decode_launches
from profiler.errors import CorruptRun, EmptyRun, RunError, RunNotFound, UnsupportedRunVersion
from profiler.registry import load_all
from profiler.schema import COLUMNS, empty_events

from .bufbuild import random_buffer

REG = load_all()["selftest"]


@pytest.fixture(scope="module")
def decoded():
    rng = np.random.default_rng(5)
    items = [(random_buffer(rng, REG, n_regions=8, capacity=48), LaunchInfo(r, l, "selftest.imbalance", l, "selftest"))
             for r in range(2) for l in range(3)]
    return decode_launches(items, {"selftest": REG})


def test_round_trip(tmp_path, decoded):
    man = {"name": "rt", "registry": {"selftest": REG.to_json()}, "workload": {"kind": "synthetic"}}
    p = RS.write_run(tmp_path / "run", decoded.events, decoded.launches, man, perfetto=False)
    run = RS.load_run(p)
    assert run.manifest["format"] == "epscope-run" and run.manifest["format_version"] == RS.FORMAT_VERSION
    assert run.manifest["drops"] == {"total": 0, "per_rank": [0, 0]} and "created" in run.manifest
    assert run.num_events == len(decoded.events) and run.name == "rt"
    pd.testing.assert_frame_equal(run.events, decoded.events, check_categorical=False)
    assert [str(t) for t in run.events.dtypes] == list(COLUMNS.values())
    pd.testing.assert_frame_equal(run.launches, decoded.launches, check_categorical=False)
    assert not (p / RS.TRACE).exists()
    assert RS.list_runs(tmp_path) == [p]


def test_trace_written_when_asked_and_stale_one_removed(tmp_path, decoded):
    pytest.importorskip("perfetto", reason="perfetto package not installed")
    p = RS.write_run(tmp_path / "r", decoded.events, decoded.launches, {}, perfetto=True)
    assert (p / RS.TRACE).stat().st_size > 0
    # perfetto=None keeps a trace only for small runs; a larger threshold miss removes the stale file
    RS.write_run(p, decoded.events, decoded.launches, {}, perfetto=None)
    assert (p / RS.TRACE).exists()
    old = RS.TRACE_KEEP_MAX_EVENTS
    try:
        RS.TRACE_KEEP_MAX_EVENTS = 10
        RS.write_run(p, decoded.events, decoded.launches, {}, perfetto=None)
    finally:
        RS.TRACE_KEEP_MAX_EVENTS = old
    assert not (p / RS.TRACE).exists()


def test_iter_event_batches_streams(tmp_path, decoded):
    p = RS.write_run(tmp_path / "b", decoded.events, decoded.launches, {}, perfetto=False)
    batches = list(RS.iter_event_batches(p, batch_rows=100))
    assert all(len(b) <= 100 for b in batches) and sum(map(len, batches)) == len(decoded.events)
    assert batches[0]["phase"].dtype == "category"
    got = pd.concat([b[["begin_ns", "end_ns"]] for b in batches], ignore_index=True)
    pd.testing.assert_frame_equal(got, decoded.events[["begin_ns", "end_ns"]].reset_index(drop=True))


def test_missing_run(tmp_path):
    with pytest.raises(RunNotFound, match="no such run directory"):
        RS.load_run(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RunNotFound, match="no manifest.json"):
        RS.load_run(tmp_path / "plain")


def write_ok(tmp_path, decoded, name="c"):
    return RS.write_run(tmp_path / name, decoded.events, decoded.launches, {}, perfetto=False)


@pytest.mark.parametrize("breakage, err, match", [
    (lambda p: (p / "manifest.json").write_text("{not json"), CorruptRun, "not valid JSON"),
    (lambda p: (p / "manifest.json").write_text('{"format": "other"}'), CorruptRun, "not an epscope-run manifest"),
    (lambda p: (p / "events.parquet").write_bytes(b"PAR1garbage"), CorruptRun, "not a readable parquet"),
    (lambda p: (p / "events.parquet").unlink(), CorruptRun, "events.parquet missing"),
    (lambda p: (p / "manifest.json").unlink(), CorruptRun, "no manifest.json"),
    (lambda p: (p / "launches.parquet").write_bytes(b"xx"), CorruptRun, "cannot read launches"),
])
def test_corrupt_runs(tmp_path, decoded, breakage, err, match):
    p = write_ok(tmp_path, decoded)
    breakage(p)
    with pytest.raises(err, match=match):
        RS.load_run(p)


def test_newer_format_version(tmp_path, decoded):
    p = write_ok(tmp_path, decoded)
    m = json.loads((p / "manifest.json").read_text())
    m["format_version"] = RS.FORMAT_VERSION + 1
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UnsupportedRunVersion, match="newer"):
        RS.load_run(p)


def test_empty_run(tmp_path, decoded):
    p = RS.write_run(tmp_path / "e", empty_events(), decoded.launches.iloc[:0], {}, perfetto=False)
    with pytest.raises(EmptyRun, match="no events"):
        RS.load_run(p)


def test_events_with_missing_columns_are_corrupt(tmp_path, decoded):
    import pyarrow as pa
    import pyarrow.parquet as pq
    p = write_ok(tmp_path, decoded)
    pq.write_table(pa.table({"rank": [0]}), p / "events.parquet")
    with pytest.raises(CorruptRun, match="lacks event columns"):
        RS.load_run(p)


def test_all_run_errors_share_a_base():
    assert all(issubclass(c, RunError) for c in (RunNotFound, CorruptRun, UnsupportedRunVersion, EmptyRun))


def test_list_runs_nested_and_missing_root(tmp_path, decoded):
    a = write_ok(tmp_path / "x", decoded, "a")
    b = write_ok(tmp_path / "y" / "z", decoded, "b")
    assert RS.list_runs(tmp_path) == sorted([a, b])
    assert RS.list_runs(tmp_path / "none") == []


def test_manifest_accepts_numpy_values(tmp_path, decoded):
    p = RS.write_run(tmp_path / "n", decoded.events, decoded.launches, {"headline": {"x": np.float32(1.5), "n": np.int64(3)}},
                     perfetto=False)
    assert RS.load_run(p).manifest["headline"] == {"x": 1.5, "n": 3}


def test_update_manifest_sets_fields_and_keeps_the_rest(tmp_path, decoded):
    p = RS.write_run(tmp_path / "r", decoded.events, decoded.launches, {"name": "r", "workload": {"kind": "ep"}},
                     perfetto=False)
    before = json.loads((p / RS.MANIFEST).read_text())
    after = RS.update_manifest(p, {"expect": {"schema": 1, "cause": "none", "value": np.float64(1.5)}})
    assert after == json.loads((p / RS.MANIFEST).read_text())
    assert after["expect"]["value"] == 1.5 and {k: after[k] for k in before} == before
    assert RS.load_run(p).manifest["expect"]["cause"] == "none"
    assert list(p.glob("*.tmp")) == []
    with pytest.raises(ValueError, match="format_version"):
        RS.update_manifest(p, {"format_version": 9})
    with pytest.raises(RunNotFound):
        RS.update_manifest(tmp_path / "missing", {"expect": None})
