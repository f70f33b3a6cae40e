"""profiler.store.atomic: exclusive temporaries that never follow a link, unique names, removal on
failure, leftovers of dead writers cleaned (live ones kept), placing that replaces only
regular files."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from profiler.store import atomic
from profiler.errors import RunExists


def test_temporaries_are_unique_exclusive_and_removed_on_failure(tmp_path):
    dest = tmp_path / "out.bin"
    with atomic.TempFile(dest) as a, atomic.TempFile(dest) as b:
        assert a.path != b.path and a.path.name.startswith(".out.bin.") and a.path.parent == tmp_path
    assert os.listdir(tmp_path) == []            # left unplaced: removed
    with pytest.raises(RuntimeError):
        with atomic.TempFile(dest) as t:
            t.file.write(b"x")
            raise RuntimeError("disk full")
    assert os.listdir(tmp_path) == []
    with atomic.TempFile(dest) as t:
        t.file.write(b"data")
        t.place()
    assert dest.read_bytes() == b"data" and os.listdir(tmp_path) == ["out.bin"]


def test_a_link_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    dest = tmp_path / "out"
    name = tmp_path / ".out.000000000000.tmp"
    os.symlink(victim, name)
    monkeypatch.setattr(atomic, "temp_name", lambda d: name)
    with pytest.raises(FileExistsError):
        atomic.TempFile(dest)
    assert victim.read_bytes() == b"keep me" and name.is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink"])
def test_replace_replaces_only_regular_files(tmp_path, kind):
    dest = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(dest)
    elif kind == "dir":
        dest.mkdir()
    else:
        (tmp_path / "target").write_bytes(b"t")
        os.symlink(tmp_path / "target", dest)
    with atomic.TempFile(dest) as t:
        with pytest.raises(RunExists, match="not a regular file"):
            t.place(replace=True)
    assert os.path.lexists(dest) and not atomic.is_regular(dest)
    assert sorted(os.listdir(tmp_path)) == sorted(["out"] + (["target"] if kind == "symlink" else []))


def test_place_without_replace_refuses_an_existing_file(tmp_path):
    dest = tmp_path / "out"
    dest.write_bytes(b"mine")
    with atomic.TempFile(dest) as t:
        with pytest.raises(RunExists, match="exists"):
            t.place()
    assert dest.read_bytes() == b"mine"
    with atomic.TempFile(dest) as t:
        t.file.write(b"new")
        t.place(replace=True)
    assert dest.read_bytes() == b"new"


def test_leftovers_of_dead_writers_are_cleaned_live_ones_kept(tmp_path):
    dest = tmp_path / "run"
    dead_dir = tmp_path / ".run.0123456789ab.tmp"
    dead_dir.mkdir()
    (dead_dir / "events.parquet").write_bytes(b"half")
    dead_file = tmp_path / ".run.aaaaaaaaaaaa.tmp"
    dead_file.write_bytes(b"half")
    other = tmp_path / ".other.0123456789ab.tmp"      # another destination's: not ours to touch
    other.write_bytes(b"x")
    live, fd = atomic.make_temp_dir(dest)              # a writer in progress holds its lock
    # a writer in another process, killed before it finished, left its directory unlocked
    code = ("import sys; sys.path.insert(0, %r); from pathlib import Path; from profiler.store import atomic; "
            "import os; atomic.make_temp_dir(Path(%r)); os._exit(0)") % (os.getcwd(), str(dest))
    subprocess.run([sys.executable, "-c", code], check=True)
    try:
        removed = atomic.clean_leftovers(dest)
        assert dead_dir.name in removed and dead_file.name in removed and len(removed) == 3
        assert live.is_dir() and other.exists() and not dead_dir.exists() and not dead_file.exists()
    finally:
        os.close(fd)
    assert atomic.clean_leftovers(dest) == [live.name]   # its writer gone: a leftover now


def test_a_crashed_run_write_is_cleaned_by_the_next_write(tmp_path):
    from profiler.groundtruth.synthetic import make_run
    first = make_run(tmp_path / "r", ranks=1, events=200, perfetto=False)
    crashed = tmp_path / ".r.00000000abcd.tmp"
    crashed.mkdir()
    (crashed / "events.parquet").write_bytes(b"partial")
    make_run(tmp_path / "r", ranks=1, events=200, perfetto=False)
    assert sorted(os.listdir(tmp_path)) == ["r", "r-2"] and first.is_dir()
