"""Arrays one chunk's analysis pass leaves for later, kept in memory or written to a directory.

A run analysed in chunks (profiler.analysis.chunked) keeps two things of each chunk past its pass,
both of the chunk's size rather than of its tables': the what-if's re-timing input (about 24 bytes
an event: 2.3 GB at 100 M events, issue 31) and the span durations the report's medians are
selected from (profiler.analysis.run_tables; 12 bytes a span). Held in memory they made a run's
peak grow with the run; in a directory (`Spill(path)`) the peak is one chunk's, and what a later
question needs (the exact what-if of a stored run) is already on disk.

One entry is one file of named arrays (`.arrays`), laid out so that a reader maps it and takes
each array as a view of the mapping (no parse, no copy: a stored what-if reads 60 MB a chunk):

    offset 0   MAGIC (8 bytes) | version (u32 LE) | header length H (u32 LE)
    offset 16  header: H bytes of JSON {"arrays": [{"name", "dtype" (numpy str), "shape",
               "offset", "nbytes"}, ...]}
    then       each array's bytes at its offset (64-byte aligned), C order

The reader checks the magic, the version, that every array lies inside the file after the header
and that its size is its dtype times its shape (`Damaged` otherwise); object dtypes are refused
(nothing is unpickled). Names are the caller's (`whatif-00003`): letters, digits and dashes only,
so an entry never leaves its directory. `Spill()` without a directory keeps the same dicts in
memory (a viewer analysing a run it does not store).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
from pathlib import Path

import numpy as np

from profiler.store import atomic

MAGIC = b"EPSARRS\x00"
VERSION = 1
_PRE = struct.Struct("<8sII")          # magic, version, header length
ALIGN = 64
SUFFIX = ".arrays"
_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


class Damaged(ValueError):
    """A file of arrays that does not read as one (magic, version, header, sizes or checksum)."""


def _check(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"spill: bad entry name {name!r}")
    return name


def _data_start(hlen: int) -> int:
    return -(-(_PRE.size + hlen) // ALIGN) * ALIGN


def encode(arrays: dict[str, np.ndarray]) -> list:
    """The file's pieces, to be written in order: preamble and header, then each array padded."""
    arrs = {k: np.require(v, requirements="C") for k, v in arrays.items()}   # 0-d stays 0-d
    entries, off = [], 0
    for k, v in arrs.items():
        if v.dtype.hasobject:
            raise ValueError(f"spill: array {k!r} holds Python objects")
        entries.append({"name": k, "dtype": v.dtype.str, "shape": list(v.shape), "offset": off, "nbytes": v.nbytes})
        off += -(-v.nbytes // ALIGN) * ALIGN
    header = json.dumps({"arrays": entries}, separators=(",", ":")).encode()
    head = _PRE.pack(MAGIC, VERSION, len(header)) + header
    pieces = [head + b"\0" * (_data_start(len(header)) - len(head))]
    for v in arrs.values():
        pieces.append(memoryview(v.reshape(-1)).cast("B") if v.nbytes else b"")
        pieces.append(b"\0" * (-v.nbytes % ALIGN))
    return pieces


def decode(buf, where: str) -> dict[str, np.ndarray]:
    """The arrays of a file's bytes (a mapping or bytes), as read-only views of them; offsets in
    the header count from the first array (the 64-byte boundary after the header)."""
    n = len(buf)
    if n < _PRE.size:
        raise Damaged(f"{where}: shorter than a file of arrays")
    magic, version, hlen = _PRE.unpack_from(buf, 0)
    if magic != MAGIC:
        raise Damaged(f"{where}: not a file of arrays (magic)")
    if version != VERSION:
        raise Damaged(f"{where}: file of arrays version {version}, this epscope reads {VERSION}")
    base = _data_start(hlen)
    if base > n:
        raise Damaged(f"{where}: header past the end of the file")
    try:
        out = {}
        for e in json.loads(bytes(buf[_PRE.size:_PRE.size + hlen]))["arrays"]:
            dt = np.dtype(e["dtype"])
            shape = tuple(int(x) for x in e["shape"])
            off, nbytes = base + int(e["offset"]), int(e["nbytes"])
            if dt.hasobject or not isinstance(e["name"], str) or int(e["offset"]) < 0 or off + nbytes > n \
                    or nbytes != dt.itemsize * int(np.prod(shape, dtype=np.int64)) or min(shape, default=0) < 0:
                raise Damaged(f"{where}: array {e.get('name')!r} does not fit the file")
            count = nbytes // dt.itemsize if dt.itemsize else 0
            out[e["name"]] = np.frombuffer(buf, dtype=dt, count=count, offset=off).reshape(shape)
    except (ValueError, KeyError, TypeError) as e:
        if isinstance(e, Damaged):
            raise
        raise Damaged(f"{where}: header: {type(e).__name__}: {e}") from None
    return out


def write(path: Path, arrays: dict[str, np.ndarray], *, checksum: bool = True) -> tuple[str | None, int]:
    """Write the arrays to a new file at path (never over an existing one); (SHA-256 hex, bytes),
    the checksum None when not asked for."""
    h, size = (hashlib.sha256() if checksum else None), 0
    with atomic.create_exclusive(path) as f:
        for piece in encode(arrays):
            f.write(piece)
            if h is not None:
                h.update(piece)
            size += len(piece)
    return (h.hexdigest() if h is not None else None), size


def read(path: Path) -> dict[str, np.ndarray]:
    """The arrays of the file at path, as read-only views of a private mapping of it (memory is
    taken only by the pages read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise Damaged(f"{path}: empty")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    return decode(mm, str(path))


class Spill:
    """Named dicts of arrays: in memory (directory None) or one file each in `directory`."""

    def __init__(self, directory: Path | None = None, *, checksums: bool = True):
        """checksums: each file entry's SHA-256 made from its bytes as they are written, in
        `sha256` (the what-if inputs: the stored index states every one). False: none made (the
        report's span durations, read back by this process and dropped, whose checksums nobody
        asks for; hashing them was a third of their write: 25 MB a 2.5 M-event chunk, 0.017 s)."""
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

    def put(self, name: str, arrays: dict[str, np.ndarray]) -> None:
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

    def get(self, name: str) -> dict[str, np.ndarray]:
        """The entry's arrays (of a file: read-only views of its mapping). A spill is a temporary
        of the process that made it, read back by it: its files are not checked against their
        checksums here (stored ones are: profiler.analysis.stored)."""
        if self.directory is None:
            return self._mem[_check(name)]
        return read(self.path(name))

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
