"""profiler.store.hashcache: a data file's SHA-256 remembered across processes by its identity and change
times; a rewritten or replaced file (same size, same mtime put back) is hashed again, a file that
changed too recently to be told apart by its timestamps is not remembered, and a damaged cache
file is ignored."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from profiler.store import hashcache

_REAL_SHA256 = hashlib.sha256   # the test's own hashing, not counted


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    p = tmp_path / "cache" / "file-hashes.json"
    hashcache.forget()          # what earlier tests' lookups remembered goes to their cache, not this one
    monkeypatch.setenv(hashcache.ENV, str(p))
    monkeypatch.setattr(hashcache, "RACY_S", 0.0)   # files written by the test count as settled
    hashcache.forget()
    yield p
    hashcache.forget()


@pytest.fixture()
def hashes(monkeypatch):
    """How many files hashcache hashed (its calls of hashlib.sha256)."""
    n = [0]

    def counting(*a):
        n[0] += 1
        return _REAL_SHA256(*a)
    monkeypatch.setattr(hashcache.hashlib, "sha256", counting)
    return n


def _sha(b: bytes) -> str:
    return _REAL_SHA256(b).hexdigest()


def test_a_hash_is_remembered_across_processes(cache, tmp_path, hashes):
    f = tmp_path / "events.parquet"
    f.write_bytes(b"x" * 100_000)
    assert hashcache.sha256(f) == _sha(b"x" * 100_000) and hashes[0] == 1
    assert hashcache.sha256(f) == _sha(b"x" * 100_000) and hashes[0] == 1     # memory
    hashcache.forget()                                                         # a new process
    assert hashcache.sha256(f) == _sha(b"x" * 100_000) and hashes[0] == 1     # the cache file
    doc = json.loads(cache.read_text())
    assert doc["format"] == hashcache.FORMAT and list(doc["files"]) == [os.path.realpath(f)]


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_a_file_with_the_same_size_and_mtime_but_other_bytes_is_hashed_again(cache, tmp_path, hashes, how):
    f = tmp_path / "events.parquet"
    f.write_bytes(b"a" * 4096)
    assert hashcache.sha256(f) == _sha(b"a" * 4096)
    st = f.stat()
    if how == "replaced":
        new = tmp_path / "new"
        new.write_bytes(b"b" * 4096)
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(new, f)
    else:
        with open(f, "r+b") as w:
            w.write(b"b" * 4096)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    for _ in range(2):                   # this process, then a new one reading the cache file
        assert hashcache.sha256(f) == _sha(b"b" * 4096)
        hashcache.forget()


def test_a_file_changed_within_the_timestamp_granularity_is_not_remembered(cache, tmp_path, hashes, monkeypatch):
    monkeypatch.setattr(hashcache, "RACY_S", 3600.0)   # every file here changed "just now"
    f = tmp_path / "events.parquet"
    f.write_bytes(b"z" * 10)
    assert hashcache.sha256(f) == _sha(b"z" * 10)
    assert hashcache.sha256(f) == _sha(b"z" * 10) and hashes[0] == 2
    assert not cache.exists()


@pytest.mark.parametrize("text", ["{", "[]", '{"format": "other", "version": 1, "files": {}}',
                                  '{"format": "epscope-file-hashes", "version": 1, "files": {"%s": [1, 2, 3]}}'])
def test_a_damaged_cache_file_is_ignored_and_replaced(cache, tmp_path, hashes, text):
    f = tmp_path / "events.parquet"
    f.write_bytes(b"q" * 10)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(text.replace("%s", os.path.realpath(f)))
    assert hashcache.sha256(f) == _sha(b"q" * 10) and hashes[0] == 1
    hashcache.forget()
    assert hashcache.sha256(f) == _sha(b"q" * 10) and hashes[0] == 1          # remembered now


def test_a_forged_entry_for_other_file_metadata_is_not_used(cache, tmp_path):
    f = tmp_path / "events.parquet"
    f.write_bytes(b"r" * 10)
    st = f.stat()
    cache.parent.mkdir(parents=True, exist_ok=True)
    wrong = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns - 1, "0" * 64]
    cache.write_text(json.dumps({"format": hashcache.FORMAT, "version": hashcache.VERSION,
                                 "files": {os.path.realpath(f): wrong}}))
    assert hashcache.sha256(f) == _sha(b"r" * 10)


def test_no_file_or_not_a_regular_file_has_no_hash(cache, tmp_path):
    assert hashcache.sha256(tmp_path / "missing") is None
    assert hashcache.sha256(tmp_path) is None


def test_an_unwritable_cache_directory_still_gives_the_hash(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    hashcache.forget()
    monkeypatch.setenv(hashcache.ENV, str(blocker / "sub" / "file-hashes.json"))   # parent is a file
    monkeypatch.setattr(hashcache, "RACY_S", 0.0)
    hashcache.forget()
    f = tmp_path / "events.parquet"
    f.write_bytes(b"s")
    assert hashcache.sha256(f) == _sha(b"s")


def test_the_cache_lives_in_the_users_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(hashcache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hashcache.cache_path() == tmp_path / "xdg" / "epscope" / "file-hashes.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hashcache.cache_path() == tmp_path / "home" / ".cache" / "epscope" / "file-hashes.json"


def test_the_cache_keeps_at_most_max_entries(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(hashcache, "MAX_ENTRIES", 3)
    files = []
    for i in range(5):
        f = tmp_path / f"f{i}"
        f.write_bytes(bytes([i]))
        hashcache.sha256(f)
        files.append(os.path.realpath(f))
    hashcache.flush()
    assert list(json.loads(cache.read_text())["files"]) == files[2:]


def test_the_cache_file_is_written_once_for_many_files_not_once_per_file(cache, tmp_path, monkeypatch):
    """A fresh viewer's Runs page hashes every run's files: the cache file is written at most once
    per WRITE_EVERY_S (and at exit), not rewritten whole once per file."""
    monkeypatch.setattr(hashcache, "WRITE_EVERY_S", 3600.0)
    files = []
    for i in range(5):
        f = tmp_path / f"g{i}"
        f.write_bytes(bytes([i]) * 10)
        hashcache.sha256(f)
        files.append(os.path.realpath(f))
    assert not cache.exists()
    hashcache.flush()
    assert list(json.loads(cache.read_text())["files"]) == files
    # a write by another process meanwhile is merged, not lost
    other = dict(json.loads(cache.read_text()))
    other["files"]["/elsewhere/events.parquet"] = [1, 2, 3, 4, 5, "a" * 64]
    cache.write_text(json.dumps(other))
    f = tmp_path / "g5"
    f.write_bytes(b"x")
    hashcache.sha256(f)
    hashcache.flush()
    assert set(json.loads(cache.read_text())["files"]) == {*files, os.path.realpath(f), "/elsewhere/events.parquet"}
