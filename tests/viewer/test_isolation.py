"""Issue 19: one damaged run never takes anything else down. A run whose launches.parquet has
damaged pandas metadata stopped `epscope view` from starting and made a running viewer answer
HTTP 500 on every page; one unreadable directory under a root did the same; error pages
showed absolute paths, symlink targets outside the roots included."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from viewer.app import NAV, PAGE, PAGES, RUN_SELECT, URL, create_app
from viewer.catalog import Catalog, ViewerError

from . import runs
from .dashclient import call, runs_text, text_of

ROUTE_OUT = [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")]


def _damage_pandas_metadata(run: Path) -> None:
    """What 16 % of single-bit flips of launches.parquet do (checksums resealed: the reader's
    parsing, not the checksum, must cope)."""
    from tests.profiler.damage import reseal
    t = pq.read_table(run / "launches.parquet")
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b"pandas": b'{"index_columns": ['}),
                   run / "launches.parquet")
    reseal(run)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    runs.synthetic(root, "good-a")
    runs.synthetic(root, "good-b")
    bad = runs.synthetic(root, "pandas-meta")
    _damage_pandas_metadata(bad)
    flipped = runs.synthetic(root, "flipped")
    b = bytearray((flipped / "events.parquet").read_bytes())
    b[len(b) // 2] ^= 4
    (flipped / "events.parquet").write_bytes(bytes(b))
    no_launches = runs.synthetic(root, "no-launches")
    (no_launches / "launches.parquet").unlink()
    (root / "unreadable").mkdir()
    runs.synthetic(root / "unreadable", "hidden-run")
    return root


@pytest.fixture()
def unreadable(monkeypatch, root):
    """A directory the server may not list (tests run as root, where chmod 000 does not stop
    reading: the permission error is raised where the walk lists it)."""
    target = root / "unreadable"

    def denied(real):
        def method(self, *a, **k):
            if self.parent == target or self == target:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **k)
        return method
    for name in ("is_file", "lstat"):   # the walk asks whether a manifest is there with lstat
        monkeypatch.setattr(Path, name, denied(getattr(Path, name)))


def route(app, path, run=None):
    search = f"?run={run}" if run else ""
    return call(app, ROUTE_OUT, [(URL, "pathname", path), (URL, "search", search), (RUN_SELECT, "value", None)],
                changed=["url.pathname"])


def test_the_viewer_starts_and_serves_every_other_run(root, unreadable, tmp_path):
    app = create_app([root], cache_dir=tmp_path, ready_wait_s=600)
    cat = app.catalog
    ids = set(cat.ids())
    assert {"good-a", "good-b", "pandas-meta", "flipped", "no-launches"} <= ids and "unreadable~hidden-run" not in ids
    assert cat.notes and cat.notes[0].startswith("unreadable: skipped") and str(root) not in cat.notes[0]
    assert cat.entry("pandas-meta").problem is None             # damaged metadata ignored: the run opens
    assert "launches.parquet missing" in cat.entry("no-launches").problem
    for rid in ("good-a", "good-b", "pandas-meta"):
        assert cat.load(rid).events.shape[0] > 0
    with pytest.raises(ViewerError, match="flipped/events.parquet: content does not match"):
        cat.load("flipped").events        # read (and checked) on first use, not on opening the run
    runs_page = text_of(route(app, "/")[PAGE]["children"])
    assert "Skipped (could not be read): unreadable" in runs_page and "no-launches" in runs_text(app)
    for path in PAGES:
        for rid in ("good-a", "flipped", "no-launches"):
            page = text_of(route(app, path, rid)[PAGE]["children"])
            assert "Traceback" not in page, (path, rid, page[:300])
            if path != "/":   # the Runs page's header names the configured roots; no error page does
                assert str(root) not in page, (path, rid, page[:300])
    # a run found damaged on loading is listed so from then on
    assert "corrupt: flipped/events.parquet: content does not match" in runs_text(app)


def test_error_messages_name_paths_relative_to_their_root(root, tmp_path):
    """A run whose file links outside the roots: the message names neither the root's absolute
    path nor the link's target."""
    outside = tmp_path / "secret-place"
    good = runs.synthetic(outside, "o")
    r2 = tmp_path / "root2"
    linked = Path(shutil.copytree(root / "good-a", r2 / "linked"))
    (linked / "events.parquet").unlink()
    os.symlink(good / "events.parquet", linked / "events.parquet")
    cat = Catalog([r2, root])
    problem = cat.entry("linked").problem
    assert "outside the allowed roots" in problem and "linked/events.parquet" in problem
    assert str(r2) not in problem and "secret-place" not in problem
    with pytest.raises(ViewerError) as e:
        cat.load("flipped").events
    assert str(root) not in str(e.value) and "flipped/events.parquet" in str(e.value)
