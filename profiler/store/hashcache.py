"""The SHA-256 of a run's data files, remembered across processes (issue 20).

Stored results and the analysis summary are current only for the data they were computed from
(profiler.analysis.summary.data_hashes): each cold open of a run hashed its events.parquet again,
0.2 s of a cold page at 10 M events (43 MB) and ~1 s at 100 M (383 MB) on the 2-core development
VM. A file's hash is remembered here under its real path with the file's identity and change
times, `(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`, in memory and in a small JSON file
in the user's cache directory (never in a run directory or a checkout):

    $EPSCOPE_HASH_CACHE, else $XDG_CACHE_HOME/epscope/file-hashes.json, else
    ~/.cache/epscope/file-hashes.json

and trusted only when every one of those fields matches the file now. Writing to the file changes
its mtime and ctime; replacing it (a new file renamed over it) changes its inode or, if the inode
number is reused, its ctime; and a user cannot set ctime (utime sets it to now), so a file put
back with the old size and mtime still misses. Not caught (docs/design.md, "Stored results"):
bytes that change under identical metadata without a write through the file system (bit rot, a
raw write to the block device); the hash is then of the file as it was when remembered.

A hash is remembered only when nothing about the file changed while it was read (fstat before
and after) and its last change is more than RACY_S before the hashing began: timestamps are only
as fine as the file system's clock tick, so a write in the same tick as the change the hash saw
would leave the same times (git's "racily clean" entries are the same problem). Such a file is
hashed again next time. The cache file is a cache: unreadable, malformed or unwritable, it is
ignored, and the hash is computed.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from pathlib import Path
from .cachedir import cache_root

ENV = "EPSCOPE_HASH_CACHE"
FORMAT = "epscope-file-hashes"
VERSION = 1
MAX_ENTRIES = 4096     # files remembered (oldest dropped): a few hundred bytes each
RACY_S = 2.0           # coarser than any Linux file system's timestamps (FAT's 2 s included)
BLOCK = 8 << 20
_HEX = re.compile(r"[0-9a-f]{64}")

# The cache file is written at most once per WRITE_EVERY_S (and at exit): a fresh viewer's Runs
# page hashing a few thousand runs' files must not rewrite a growing file once per file.
WRITE_EVERY_S = 1.0

_lock = threading.Lock()
_mem: dict[str, tuple] = {}          # real path -> (dev, ino, size, mtime_ns, ctime_ns, hex)
_unsaved: set[str] = set()           # paths remembered here and not yet in the cache file
_disk_seen: tuple | None = None      # (ino, size, mtime_ns) of the cache file when last read
_writer: threading.Timer | None = None


def cache_path() -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    return cache_root() / "file-hashes.json"


def _ident(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _valid(v) -> bool:
    return (isinstance(v, list) and len(v) == 6 and all(type(x) is int for x in v[:5])
            and isinstance(v[5], str) and _HEX.fullmatch(v[5]) is not None)


def _read_disk() -> None:
    """Merge the cache file into memory when it changed since last read (caller holds _lock)."""
    global _disk_seen
    p = cache_path()
    try:
        st = os.stat(p)
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == _disk_seen or not stat.S_ISREG(st.st_mode) or st.st_size > (MAX_ENTRIES + 16) << 10:
            return
        with open(p, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return
    _disk_seen = seen
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == VERSION
            and isinstance(doc.get("files"), dict)):
        return
    for path, v in doc["files"].items():   # the file's entry wins, but for ours not yet written
        if isinstance(path, str) and _valid(v) and path not in _unsaved:
            _mem[path] = tuple(v)


def _write_disk() -> None:
    """The memory's entries (the newest MAX_ENTRIES) to the cache file in one rename (caller holds
    _lock); another process writing at the same time may win: one of the two sets is kept."""
    global _disk_seen
    p = cache_path()
    while len(_mem) > MAX_ENTRIES:
        del _mem[next(iter(_mem))]
    _unsaved.clear()
    doc = {"format": FORMAT, "version": VERSION, "files": {k: list(v) for k, v in _mem.items()}}
    tmp = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, p)
        tmp = None
        st = os.stat(p)
        _disk_seen = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def sha256(path, within=None) -> str | None:
    """The SHA-256 (hex) of the regular file at `path` as it is now; None when there is none (or
    it resolves outside the resolved roots `within`)."""
    real = os.path.realpath(path)
    if within is not None and not any(Path(real) == r or r in Path(real).parents for r in within):
        return None
    try:
        st = os.stat(real)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    ident = _ident(st)
    with _lock:
        got = _mem.get(real)
        if got is None or got[:5] != ident:
            _read_disk()
            got = _mem.get(real)
        if got is not None and got[:5] == ident:
            _mem[real] = _mem.pop(real)          # most recently used last
            return got[5]
    began = time.time_ns()
    h = hashlib.sha256()
    try:
        # never blocking, never through a link put in place since the stat (issue 32: FIFOs)
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            before = _ident(os.fstat(f.fileno()))
            if before != ident:
                return None
            for block in iter(lambda: f.read(BLOCK), b""):
                h.update(block)
            after = _ident(os.fstat(f.fileno()))
    except OSError:
        return None
    hexd = h.hexdigest()
    settled = max(after[3], after[4]) < began - int(RACY_S * 1e9)
    if before == after == ident and settled:
        with _lock:
            _mem.pop(real, None)
            _mem[real] = (*ident, hexd)
            _unsaved.add(real)
            _schedule_write()
    return hexd


def _schedule_write() -> None:
    """Write what is unsaved WRITE_EVERY_S from now, once (caller holds _lock)."""
    global _writer
    if _writer is None:
        _writer = threading.Timer(WRITE_EVERY_S, flush)
        _writer.daemon = True
        _writer.start()


def flush() -> None:
    """Merge the remembered hashes into the cache file now (also run at exit)."""
    global _writer
    with _lock:
        if _writer is not None:
            _writer.cancel()   # a no-op when it is the timer itself calling
            _writer = None
        if _unsaved:
            _read_disk()
            _write_disk()


atexit.register(flush)


def forget() -> None:
    """Write what is unsaved, then drop what this process remembers (tests: the next lookup reads
    the cache file again, as a new process would)."""
    global _disk_seen
    flush()
    with _lock:
        _mem.clear()
        _disk_seen = None
