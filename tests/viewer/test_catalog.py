"""viewer.catalog: discovery under the roots, opaque ids, no escape from the roots (directories
or files), messages, a rewritten run reloaded, byte-bounded caches of client-keyed results."""
from __future__ import annotations

import os

import numpy as np
import pytest

from profiler.store import runstore
from viewer.cache import SizedLRU, sizeof
from viewer.catalog import Catalog, ViewerError

from . import runs


def test_discovers_runs_and_ids_are_keys(run_root):
    cat = Catalog([run_root])
    ids = set(cat.ids())
    assert {"balanced", "starved", "late", "ab~a1", "ab~b1"} <= ids
    assert cat.entry("ab~a1").path == (run_root / "ab" / "a1").resolve()
    for bad in ("../balanced", str(run_root / "balanced"), "/etc/passwd", "balanced/..", None, 3):
        with pytest.raises(ViewerError, match="Unknown run"):
            cat.entry(bad)


def test_symlink_out_of_root_is_not_followed(run_root, tmp_path):
    outside = tmp_path / "outside-run"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "escape")
    os.symlink(run_root / "balanced", root / "inside-link")   # resolves outside `root` too
    assert Catalog([root]).ids() == []


def test_root_may_be_a_run_directory(run_root):
    cat = Catalog([run_root / "late"])
    assert cat.ids() == ["late"]
    assert cat.load("late").events.shape[0] > 0


def test_load_is_cached_and_lru(run_root):
    cat = Catalog([run_root], max_loaded=2)
    a = cat.load("balanced")
    assert cat.load("balanced") is a
    assert a.cached("k", lambda: 1) == 1 and a.cached("k", lambda: 2) == 1
    cat.load("late"), cat.load("starved")
    assert cat.load("balanced") is not a     # evicted, loaded again


@pytest.mark.parametrize("rid, words", [
    ("bad~corrupt-events", ["corrupt"]),
    ("bad~from-the-future", ["newer", "Update epscope"]),
    ("bad~bad-manifest", ["corrupt", "manifest"]),
    ("bad~no-events", ["corrupt"]),
    ("bad~git-string", ["corrupt", "field 'git' must be an object"]),
    ("bad~deep-manifest", ["corrupt", "nested deeper"]),
    ("links~link-events", ["not shown", "outside the allowed roots"]),
])
def test_bad_runs_give_one_clear_sentence(run_root, rid, words):
    cat = Catalog([run_root])
    with pytest.raises(ViewerError) as e:
        cat.load(rid)
    msg = str(e.value)
    assert "Traceback" not in msg
    for w in words:
        assert w.lower() in msg.lower()


def test_empty_run_message(run_root):
    cat = Catalog([run_root])
    assert cat.entry("bad~empty-run").status == "empty"
    with pytest.raises(ViewerError, match="no events"):
        cat.load("bad~empty-run")


def test_perfetto_trace_exported_on_demand_into_cache(run_root, tmp_path):
    cat = Catalog([run_root], cache_dir=tmp_path / "cache")
    p = cat.perfetto_trace("late")
    assert p.parent == tmp_path / "cache" and p.stat().st_size > 0
    assert not (run_root / "late" / "trace.perfetto-trace").exists()   # run dirs stay untouched
    assert cat.perfetto_trace("late") == p


def test_files_linked_out_of_the_roots_are_not_read(run_root):
    """issue 13: symlinked manifest.json / events.parquet / trace.perfetto-trace were followed."""
    cat = Catalog([run_root])
    assert cat.entry("links~link-manifest").manifest is None
    assert "outside" in cat.entry("links~link-manifest").problem
    assert "outside" in cat.entry("links~link-events").problem
    for rid in ("links~link-manifest", "links~link-events"):
        with pytest.raises(ViewerError, match="outside"):
            cat.load(rid)
    with pytest.raises(ViewerError, match="outside the viewer's roots"):
        cat.perfetto_trace("links~link-trace")
    assert cat.load("links~link-trace").events.shape[0] > 0    # the rest of that run is fine


def test_a_trace_linked_inside_the_roots_is_served(tmp_path):
    root = tmp_path / "root"
    a = runs.synthetic(root, "a")
    b = runs.synthetic(root, "b")
    (a / "elsewhere.bin").write_bytes(b"trace bytes")
    os.symlink(a / "elsewhere.bin", b / "trace.perfetto-trace")
    assert Catalog([root]).perfetto_trace("b").read_bytes() == b"trace bytes"


def test_a_rewritten_run_is_reloaded_not_served_stale(tmp_path):
    """issue 13: the viewer kept serving the cached run after a rewrite."""
    root = tmp_path / "root"
    p = runs.synthetic(root, "r", events=3000)
    cat = Catalog([root], cache_dir=tmp_path / "cache")
    first = cat.load("r")
    trace1 = cat.perfetto_trace("r")
    assert cat.load("r") is first
    old = runstore.load_run(p)
    ev = old.events.iloc[: len(old.events) // 2]
    runstore.write_run(p, ev, old.launches, {**old.manifest, "name": "rewritten"}, perfetto=False, overwrite=True)
    again = cat.load("r")
    assert again is not first and len(again.events) == len(ev) and again.entry.name == "rewritten"
    assert cat.entry("r").name == "rewritten"              # the Runs list learns of it too
    trace2 = cat.perfetto_trace("r")
    assert trace2 != trace1 and not trace1.exists()         # a new export; the stale one is gone


def test_parameter_results_live_in_a_byte_bounded_lru(run_root):
    cat = Catalog([run_root], param_cache_bytes=1 << 20)
    run = cat.load("late")
    big = np.zeros(200_000)   # 1.6 MB: larger than the whole budget, never kept
    assert run.cached(("fig", "huge"), lambda: big) is big
    assert ("fig", "huge") not in [k[1] for k in cat._params._items]
    for i in range(100):
        run.cached(("what_if", i), lambda: np.zeros(10_000))   # 80 kB each
    assert cat._params.nbytes <= 1 << 20 and len(cat._params) < 100
    assert run.cached(("what_if", 99), lambda: "recomputed") is not None
    assert run.cached(("what_if", 0), lambda: "recomputed") == "recomputed"   # evicted long ago
    assert run.cached("fixed", lambda: big) is big and run.cached("fixed", lambda: 0) is big
    assert run._locks == {}                                   # no lock left behind per key


def test_sizeof_counts_arrays_frames_and_nested_figures():
    import pandas as pd
    assert sizeof(np.zeros(1000)) == 8000
    assert sizeof(pd.DataFrame({"a": np.zeros(1000)})) >= 8000
    fig = {"data": [{"x": list(range(100_000)), "y": list(range(100_000))}]}
    assert sizeof(fig) > 1_000_000
    lru = SizedLRU(100)
    lru.put("k", "x" * 1000)
    assert "k" not in lru and lru.nbytes == 0


def test_runs_of_one_name_get_their_directory_in_labels(run_root):
    cat = Catalog([run_root])
    labels, name = cat.labels(), cat.entry("balanced").name
    assert labels["balanced"] == f"{name} (balanced)"
    assert labels["copy-of-balanced"] == f"{name} (copy-of-balanced)"
    assert labels["late"] == cat.entry("late").name
