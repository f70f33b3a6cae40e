"""Arrays one chunk's analysis pass leaves for later, kept in memory or written to a directory.

A run analysed in chunks (profiler.analysis.chunked) keeps two things of each chunk past its pass,
both of the chunk's size rather than of its tables': the what-if's re-timing input (about 24 bytes
an event written as is, 13 packed: below) and the span durations the report's medians are
selected from (profiler.analysis.run_tables; 8 bytes a span). Held in memory they made a run's
peak grow with the run; in a directory (`Spill(path)`) the peak is one chunk's, and what a later
question needs (the exact what-if of a stored run) is already on disk.

One entry is one file of named arrays (`.arrays`), laid out so that a reader maps it and takes
each array as a view of the mapping (no parse, no copy):

    offset 0   MAGIC (8 bytes) | version (u32 LE) | header length H (u32 LE)
    offset 16  header: H bytes of JSON {"arrays": [entry, ...]}
    then       each stored array's bytes at its offset (64-byte aligned), C order

    entry      {"name", "dtype" (numpy str), "shape", "offset", "nbytes"}           an array as is
    (v2 also)  {"name", "codec": "sparse", "dtype", "shape": [n], "fill",
                "parts": {"index": part, "value": part}}        n values, `fill` but at `index`
               {"name", "codec": "runs", "dtype", "shape": [n],
                "parts": {"start": part, "value": part}}        value[i] from start[i] to the next
    part       {"dtype", "shape", "offset", "nbytes"}                                a stored array

Version 1 (the what-if inputs stored before issue 31's packing) holds arrays as is only; a file
is written as version 2 only when it holds a packed array (`Sparse`, `Runs`), so an entry with
none reads in any version's epscope and one with some is refused by a version-1 reader, by its
version, not taken for another layout. The reader checks the magic, the version, that every
stored array lies inside the file after the header and that its size is its dtype times its
shape, and of a packed array that its parts rebuild exactly one array of its dtype and shape
(positions ascending and inside it, values of its dtype): `Damaged` otherwise. Object dtypes are
refused (nothing is unpickled). `read` gives every packed array expanded (the arrays as they
were put), `read(..., packed=True)` as stored. Names are the caller's (`whatif-00003`): letters,
digits and dashes only, so an entry never leaves its directory. `Spill()` without a directory
keeps the same dicts in memory (a viewer analysing a run it does not store).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profiler.store import atomic

MAGIC = b"EPSARRS\x00"
VERSION = 2                            # written when a file holds a packed array, else 1
READS = (1, 2)
_PRE = struct.Struct("<8sII")          # magic, version, header length
ALIGN = 64
SUFFIX = ".arrays"
_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


class Damaged(ValueError):
    """A file of arrays that does not read as one (magic, version, header, sizes or checksum)."""


@dataclass(frozen=True)
class Sparse:
    """A 1-D integer or boolean array of mostly one value, `fill`: where it is not, and what it is
    there (index ascending; value of the array's dtype)."""
    index: np.ndarray
    value: np.ndarray
    fill: int | bool
    n: int

    codec = "sparse"
    part_names = ("index", "value")

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.value.nbytes

    def expand(self) -> np.ndarray:
        out = np.full(self.n, self.fill, self.dtype)
        out[self.index] = self.value
        return out


@dataclass(frozen=True)
class Runs:
    """A 1-D array stored as its runs of one value: where each starts (ascending, the first at
    0) and its value."""
    start: np.ndarray
    value: np.ndarray
    n: int

    codec = "runs"
    part_names = ("start", "value")

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def nbytes(self) -> int:
        return self.start.nbytes + self.value.nbytes

    def expand(self) -> np.ndarray:
        return np.repeat(self.value, np.diff(self.start, append=self.n))


PACKED = (Sparse, Runs)


def _positions(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _holds(dt: np.dtype, x: int) -> bool:
    """Whether dtype dt (integer or boolean) holds the Python int or bool x as it is."""
    if dt.kind == "b":
        return isinstance(x, bool)
    return not isinstance(x, bool) and np.iinfo(dt).min <= x <= np.iinfo(dt).max


def sparse(a: np.ndarray, fill) -> "Sparse | np.ndarray":
    """a (1-D, integer or boolean) as a Sparse of `fill`, or a itself where that is not smaller."""
    a = np.asarray(a)
    fill = fill.item() if isinstance(fill, np.generic) else fill
    if a.ndim != 1 or a.dtype.kind not in "iub" or not isinstance(fill, int) or not _holds(a.dtype, fill):
        raise ValueError(f"spill.sparse: a 1-D integer or boolean array and a fill of its dtype, got {a.dtype}")
    index = np.flatnonzero(a != fill).astype(_positions(len(a)), copy=False)
    out = Sparse(index=index, value=a[index], fill=fill, n=len(a))
    return out if out.nbytes < a.nbytes else a


def runs(a: np.ndarray) -> "Runs | np.ndarray":
    """a (1-D) as its Runs, or a itself where that is not smaller."""
    a = np.asarray(a)
    if a.ndim != 1 or a.dtype.hasobject:
        raise ValueError(f"spill.runs: a 1-D array of numbers, got {a.dtype} x {a.shape}")
    if not len(a):
        return a
    start = np.flatnonzero(a[1:] != a[:-1]).astype(_positions(len(a)), copy=False) + 1
    start = np.concatenate([np.zeros(1, start.dtype), start])
    out = Runs(start=start, value=a[start], n=len(a))
    return out if out.nbytes < a.nbytes else a


def narrowest(a):
    """A signed integer array in the narrowest signed dtype that holds its values (the same values;
    a itself where it is already that narrow, or not a signed integer array); of Runs, their
    values (what they expand to)."""
    if isinstance(a, Runs):
        return Runs(start=a.start, value=narrowest(a.value), n=a.n)
    if not isinstance(a, np.ndarray) or a.dtype.kind != "i" or not a.size:
        return a
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return a if np.dtype(dt).itemsize >= a.itemsize else a.astype(dt)
    return a


def expand(v) -> np.ndarray:
    """An array as it was put: a packed one expanded, any other as it is."""
    return v.expand() if isinstance(v, PACKED) else v


def _check(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"spill: bad entry name {name!r}")
    return name


def _data_start(hlen: int) -> int:
    return -(-(_PRE.size + hlen) // ALIGN) * ALIGN


def _stored(k: str, v) -> tuple[dict, list]:
    """(header entry without offsets, the arrays it stores) of one named value."""
    if isinstance(v, PACKED):
        parts = [np.require(getattr(v, p), requirements="C") for p in v.part_names]
        if any(x.ndim != 1 for x in parts):
            raise ValueError(f"spill: packed array {k!r} has parts that are not 1-D")
        e = {"name": k, "codec": v.codec, "dtype": v.dtype.str, "shape": [int(v.n)]}
        if isinstance(v, Sparse):
            e["fill"] = v.fill
        return e, parts
    v = np.require(v, requirements="C")      # 0-d stays 0-d
    return {"name": k, "dtype": v.dtype.str, "shape": list(v.shape)}, [v]


def encode(arrays: dict) -> list:
    """The file's pieces, to be written in order: preamble and header, then each stored array
    padded. A value is an array, or a Sparse or Runs (stored as its parts)."""
    entries, stored, off = [], [], 0
    for k, v in arrays.items():
        e, parts = _stored(k, v)
        placed = []
        for x in parts:
            if x.dtype.hasobject:
                raise ValueError(f"spill: array {k!r} holds Python objects")
            placed.append({"dtype": x.dtype.str, "shape": list(x.shape), "offset": off, "nbytes": x.nbytes})
            off += -(-x.nbytes // ALIGN) * ALIGN
        if "codec" in e:
            e["parts"] = dict(zip(v.part_names, placed))
        else:
            e.update(placed[0])
        entries.append(e)
        stored += parts
    version = VERSION if any(isinstance(v, PACKED) for v in arrays.values()) else 1
    header = json.dumps({"arrays": entries}, separators=(",", ":")).encode()
    head = _PRE.pack(MAGIC, version, len(header)) + header
    pieces = [head + b"\0" * (_data_start(len(header)) - len(head))]
    for v in stored:
        pieces.append(memoryview(v.reshape(-1)).cast("B") if v.nbytes else b"")
        pieces.append(b"\0" * (-v.nbytes % ALIGN))
    return pieces


def _view(buf, base: int, e: dict, where: str, name) -> np.ndarray:
    """A read-only view of one stored array (an entry or a packed array's part) of the file."""
    dt = np.dtype(e["dtype"])
    shape = tuple(int(x) for x in e["shape"])
    off, nbytes = base + int(e["offset"]), int(e["nbytes"])
    if dt.hasobject or not isinstance(name, str) or int(e["offset"]) < 0 or off + nbytes > len(buf) \
            or nbytes != dt.itemsize * int(np.prod(shape, dtype=np.int64)) or min(shape, default=0) < 0:
        raise Damaged(f"{where}: array {name!r} does not fit the file")
    count = nbytes // dt.itemsize if dt.itemsize else 0
    return np.frombuffer(buf, dtype=dt, count=count, offset=off).reshape(shape)


def _packed(buf, base: int, e: dict, where: str):
    """A packed array's Sparse or Runs, checked to rebuild exactly one array of its dtype and shape."""
    kind = {c.codec: c for c in PACKED}.get(e["codec"])
    name, dt, shape = e["name"], np.dtype(e["dtype"]), e["shape"]
    bad = Damaged(f"{where}: packed array {name!r} does not rebuild one")
    if kind is None or not isinstance(e["parts"], dict) or set(e["parts"]) != set(kind.part_names) \
            or not (isinstance(shape, list) and len(shape) == 1 and int(shape[0]) >= 0):
        raise bad
    n = int(shape[0])
    pos, value = (_view(buf, base, e["parts"][p], where, name) for p in kind.part_names)
    if pos.ndim != 1 or value.shape != pos.shape or value.dtype != dt or pos.dtype.kind not in "iu" \
            or (len(pos) and (int(pos[0]) < 0 or int(pos[-1]) >= n or not (np.diff(pos) > 0).all())):
        raise bad
    if kind is Runs:
        if (n > 0) != (len(pos) > 0) or (len(pos) and int(pos[0]) != 0):
            raise bad
        return Runs(start=pos, value=value, n=n)
    fill = e["fill"]
    if dt.kind not in "iub" or not isinstance(fill, int) or not _holds(dt, fill):
        raise bad
    return Sparse(index=pos, value=value, fill=fill, n=n)


def decode(buf, where: str, *, packed: bool = False) -> dict[str, np.ndarray]:
    """The arrays of a file's bytes (a mapping or bytes), as read-only views of them, a packed one
    expanded (a new array) or, with packed, its Sparse or Runs of views; offsets in the header
    count from the first array (the 64-byte boundary after the header)."""
    n = len(buf)
    if n < _PRE.size:
        raise Damaged(f"{where}: shorter than a file of arrays")
    magic, version, hlen = _PRE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise Damaged(f"{where}: not a file of arrays (magic)")
    if version not in READS:
        raise Damaged(f"{where}: file of arrays version {version}, this epscope reads {', '.join(map(str, READS))}")
    base = _data_start(hlen)
    if base > n:
        raise Damaged(f"{where}: header past the end of the file")
    try:
        out = {}
        for e in json.loads(bytes(buf[_PRE.size:_PRE.size + hlen]))["arrays"]:
            if "codec" not in e:
                out[e["name"]] = _view(buf, base, e, where, e["name"])
                continue
            if version < 2 or not isinstance(e["name"], str):
                raise Damaged(f"{where}: packed array {e.get('name')!r} in a file of version {version}")
            v = _packed(buf, base, e, where)
            out[e["name"]] = v if packed else v.expand()
    except (ValueError, KeyError, TypeError) as e:
        if isinstance(e, Damaged):
            raise
        raise Damaged(f"{where}: header: {type(e).__name__}: {e}") from None
    return out


def write(path: Path, arrays: dict, *, checksum: bool = True) -> tuple[str | None, int]:
    """Write the arrays (or Sparse, Runs) to a new file at path (never over an existing one);
    (SHA-256 hex, bytes), the checksum None when not asked for."""
    h, size = (hashlib.sha256() if checksum else None), 0
    with atomic.create_exclusive(path) as f:
        for piece in encode(arrays):
            f.write(piece)
            if h is not None:
                h.update(piece)
            size += len(piece)
    return (h.hexdigest() if h is not None else None), size


def read(path: Path, *, packed: bool = False) -> dict[str, np.ndarray]:
    """The arrays of the file at path, as read-only views of a private mapping of it (memory is
    taken only by the pages read), a packed one expanded unless `packed` (decode)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise Damaged(f"{path}: empty")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return decode(mm, str(path), packed=packed)


class Spill:
    """Named dicts of arrays: in memory (directory None) or one file each in `directory`."""

    def __init__(self, directory: Path | None = None, *, checksums: bool = True):
        """checksums: each file entry's SHA-256 made from its bytes as they are written, in
        `sha256` (the what-if inputs: the stored index states every one). False: none made (the
        report's span durations, read back by this process and dropped, whose checksums nobody
        asks for; hashing them was a third of their write: 25 MB a 2.5 M-event chunk, 0.017 s).
        Kept in memory instead of written (issue 31, session 6), the span durations saved no
        system time at 10 M events (0.945 s median against 0.91, 8 runs each): their pages were
        faulted in by the heap instead of the page cache, and the peak grew by 35 MB."""
        self.directory = None if directory is None else Path(directory)
        self.checksums = checksums
        self._mem: dict[str, dict] = {}
        self.sha256: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        if self.directory is not None:
            self.directory.mkdir(exist_ok=True)

    @property
    def on_disk(self) -> bool:
        return self.directory is not None

    def path(self, name: str) -> Path:
        return self.directory / f"{_check(name)}{SUFFIX}"

    def put(self, name: str, arrays: dict) -> None:
        """Keep the entry (arrays, or Sparse and Runs: kept packed in memory, written packed)."""
        _check(name)
        if self.directory is None:
            self._mem[name] = dict(arrays)
            return
        sha, self.sizes[name] = write(self.path(name), arrays, checksum=self.checksums)
        if sha is not None:
            self.sha256[name] = sha

    def adopt(self, name: str, sha256: str, size: int) -> None:
        """Know an entry another process wrote into this directory (a distributed run's worker)."""
        if self.directory is None:
            raise ValueError("spill: only a directory spill adopts another process's entries")
        _check(name)
        self.sha256[name], self.sizes[name] = sha256, int(size)

    def get(self, name: str, *, packed: bool = False) -> dict[str, np.ndarray]:
        """The entry's arrays as put (of a file: read-only views of its mapping), a packed one
        expanded unless `packed`. A spill is a temporary of the process that made it, read back
        by it: its files are not checked against their checksums here (stored ones are:
        profiler.analysis.stored)."""
        if self.directory is None:
            got = self._mem[_check(name)]
            return dict(got) if packed else {k: expand(v) for k, v in got.items()}
        return read(self.path(name), packed=packed)

    def drop(self, name: str) -> None:
        if self.directory is None:
            self._mem.pop(_check(name), None)
            return
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass
        self.sha256.pop(name, None)
        self.sizes.pop(name, None)
