"""Read a run directory: the one reader behind `load_run`, `check_run`, `epscope report/export/
check`, compare and the viewer (docs/design.md, "Run directory"). Writing lives one floor up,
in profiler.store.runstore (which re-exports all of this), so that the Perfetto export, which reads
runs and is called by the writer, imports only this module.

    RUN/manifest.json  RUN/events.parquet  RUN/launches.parquet  [RUN/trace.perfetto-trace]

Everything returned is checked (profiler.store.validate): the manifest field by field, the tables
column by column (types, nulls, ranges, categories). Parquet files are read with pyarrow and
converted without their pandas metadata (a `pandas` key in the schema metadata is what
pandas would use to rebuild index and dtypes; a damaged one raised untyped JSON, Unicode and
Key errors in 16 % of single-bit flips of launches.parquet, issue 19): the columns are taken
by name and cast to the schema here. Every problem is a RunError subclass naming the file.

Checksums: runs written since issue 19 carry `checksums` in their manifest, a sha256 per data
file (events.parquet, launches.parquet); a file whose bytes differ raises ChecksumMismatch
naming it, before its bytes are parsed (17 % of single-bit flips in events.parquet changed
values with no error before). The hash is taken through the same open file the data is then
read from. Runs written before carry none: they open as before and `Run.checksummed` is False.

Seals (format 3, issue 32): the manifest carries a digest of itself (validate.sealed), so no edit
of it passes unseen, and both data files' footers name the format they were written in
(validate.FOOTER_FORMAT_KEY), so a sealed run whose manifest was edited back to an older format
(seal and checksums deleted) is refused (DowngradedRun), never read as an unverified old run. The
rule: a run is "not verified" only when neither data file's footer names a sealed format.

Pinned bytes: a Run remembers the hash of each data file's bytes it read (`Run.data_hashes`: the
manifest's checksums, or for a run without them the hash taken when the file was first read), and
every later read of the file must give the same bytes (else RunChanged). Results computed from a
Run are bound to those hashes: the bytes analysed, not the file as it is when they are stored.

Every file is opened as a regular file, without blocking, inside the caller's roots
(atomic.open_regular); the tables are checked against each other (validate.events_match_launches,
no_duplicate_rows, unique_launches, manifest_matches_launches).
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import atomic, checks_fast, validate
from ..errors import (ChecksumMismatch, CorruptRun, DowngradedRun, EmptyRun, InvalidManifest, OutsideRoots,  # noqa: F401
                     RunChanged, RunError, RunNotFound, UnsupportedRunVersion)
from .schema import CATEGORICAL, COLUMNS, LAUNCH_COLUMNS, MAX_NAME_CHARS, MAX_NAMES

MANIFEST = "manifest.json"
EVENTS = "events.parquet"
LAUNCHES = "launches.parquet"
TRACE = "trace.perfetto-trace"
DATA_FILES = validate.DATA_FILES   # the files `checksums` covers (the trace is derived: export remakes it)
VERSION_KEY = b"epscope.version_id"   # parquet schema metadata key holding the write's version id
# Bytes hashed per read call: large enough that the calls cost nothing beside the hash (sha256 with
# the CPU's SHA extensions: 1.5 GB/s on the dev machine), small enough to stay in the CPU's cache
# between the read and the hash: 37.5 MB took 47 ms to read and hash in 8 MB pieces (each a fresh
# `bytes`), 28 ms in 1 MB pieces read into Arrow buffers (issue 31, session 5).
HASH_CHUNK = 1 << 20
# A reader that meets two versions retries this many times (a writer swaps a directory in one
# rename, so the second read sees one version unless another write lands in between).
READ_RETRIES = 3
# Rows of events a full check (check_events) reads at once: chunks of whole iterations, so every
# duplicated row meets its twin (they share rank and iteration).
CHECK_CHUNK_ROWS = 2_000_000
_PROC_FD = os.path.isdir("/proc/self/fd")


@dataclass(frozen=True)
class RunFiles:
    """The resolved paths of a run's files (symlinks followed once, at open time)."""
    manifest: Path
    events: Path | None     # None when missing (an error once the manifest has been read)
    launches: Path | None


def file_hash(f) -> str:
    """`sha256:<hex>` of an open binary file from its current position to its end."""
    h = hashlib.sha256()
    read = getattr(f, "read_buffer", None) or f.read   # an Arrow file: no copy into a `bytes`
    while True:
        b = read(HASH_CHUNK)
        if not len(b):
            return f"{validate.CHECKSUM_ALGO}:{h.hexdigest()}"
        h.update(b)


def arrow_file(p: Path, label: str, within=None) -> pa.NativeFile:
    """p opened as atomic.open_regular opens it (a regular file inside `within`, never blocking),
    as an Arrow file: on Linux through the open descriptor's /proc entry (the same file, whatever
    the path names now; pyarrow's own reads, 15 % less CPU than a Python file object), else a
    Python file object."""
    try:
        f = atomic.open_regular(p, label, within=within)
    except OSError as e:
        raise CorruptRun(f"{label}: cannot be read ({_line(e)})") from None
    with f:
        proc = f"/proc/self/fd/{f.fileno()}"
        if _PROC_FD:
            try:
                return pa.OSFile(proc)
            except (OSError, pa.ArrowException) as e:
                raise CorruptRun(f"{label}: cannot be read ({_line(e)})") from None
        return pa.PythonFile(os.fdopen(os.dup(f.fileno()), "rb"), mode="r")


def open_checked(p: Path, want: str | None, label: str, *, within=None, pin: dict | None = None,
                 name: str | None = None) -> pa.NativeFile:
    """p opened for reading (arrow_file); when `want` is given its bytes are hashed first and must
    match (ChecksumMismatch naming the file), then the file is rewound: the caller parses the very
    bytes that were hashed (one open file, whatever happens to the path meanwhile). pin: with no
    `want`, the bytes are hashed and the hash is put in pin[name] (what later reads must match)."""
    f = arrow_file(p, label, within)
    try:
        if want is not None or pin is not None:
            got = file_hash(f)
            if want is not None and got != want:
                raise ChecksumMismatch(f"{label}: content does not match the checksum in {MANIFEST} (the file was "
                                       f"damaged or changed after the run was written; expected {want[:23]}..., "
                                       f"got {got[:23]}...)", file=label)
            if want is None:
                pin[name] = got
            f.seek(0)
        return f
    except (OSError, pa.ArrowException) as e:
        f.close()
        raise CorruptRun(f"{label}: cannot be read ({_line(e)})") from None
    except BaseException:
        f.close()
        raise


def _open_of_version(p: Path, want: str | None, label: str, version_id: str | None, changed: str, *,
                     within=None, pin: dict | None = None, name: str | None = None):
    """open_checked, except that a file whose checksum differs because it belongs to another
    write of the run (its footer's version id is another one) raises RunChanged: the run was
    rewritten under the reader, it is not damaged."""
    try:
        return open_checked(p, want, label, within=within, pin=pin, name=name)
    except ChecksumMismatch:
        got = _file_version(p, within)
        if version_id is not None and got is not None and got != version_id:
            raise RunChanged(f"{changed} ({Path(label).name} of version {got}, manifest of {version_id}); "
                             "open it again") from None
        raise


def to_frame(data: pa.Table | pa.RecordBatch, columns, label: str) -> pd.DataFrame:
    """The named columns as a DataFrame, converted by pyarrow from their Arrow types alone (the
    file's pandas metadata is not read: see the module docstring)."""
    names = data.schema.names
    dup = sorted({c for c in columns if names.count(c) > 1})
    if dup:
        raise CorruptRun(f"{label}: columns {dup} appear more than once")
    table = pa.table({c: data.column(names.index(c)) for c in columns})   # no schema metadata comes along
    return table.to_pandas(split_blocks=True, self_destruct=True, ignore_metadata=True)


@dataclass
class Run:
    path: Path
    manifest: dict
    launches: pd.DataFrame
    num_events: int = 0
    files: RunFiles | None = None
    _events: pd.DataFrame | None = field(default=None, repr=False)
    within: tuple | None = None          # resolved roots every file of the run must lie in (None: anywhere)
    # {data file: "sha256:<hex>"} of the bytes read: the manifest's checksums, or what the first
    # read of a file without them hashed (every later read must give the same bytes)
    pins: dict = field(default_factory=dict, repr=False)
    _pin_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    checked: bool = False                # the whole event table was read and checked (events, check_events)

    def __post_init__(self):
        self.pins = {**(self.checksums or {}), **self.pins}

    @property
    def sealed(self) -> bool:
        """The manifest carries a seal that matched when it was read (format 3)."""
        return self.manifest.get(validate.SEAL) is not None

    @property
    def verified(self) -> str | None:
        """What is not verified about this run (None: everything is: a sealed manifest and the
        data files' checksums); what `epscope check` and the viewer say."""
        if not self.checksummed:
            return NO_CHECKSUMS
        if not self.sealed:
            return NOT_SEALED
        return None

    def open_events(self) -> pa.NativeFile:
        """events.parquet opened and checked against its pinned hash (pinned now when it has none)."""
        p = self.files.events if self.files else self.path / EVENTS
        label = str(self.path / EVENTS)
        with self._pin_lock:
            want = self.pins.get(EVENTS)
            pin = {} if want is None else None
            f = _open_of_version(p, want, label, self.version_id,
                                 f"{self.path}: the run was rewritten since it was opened", within=self.within,
                                 pin=pin, name=EVENTS)
            if pin:
                self.pins[EVENTS] = pin[EVENTS]
        return f

    def data_hashes(self) -> dict:
        """{data file: SHA-256 hex} of the bytes this Run reads (the manifest's checksums, else
        pinned by the first read; events.parquet is hashed now if no read has pinned it yet): what
        results computed from this Run are bound to."""
        if EVENTS not in self.pins:
            self.open_events().close()
        return {k: v.split(":", 1)[1] for k, v in sorted(self.pins.items()) if k in DATA_FILES}

    @property
    def version_id(self) -> str | None:
        """Id of the write this run came from (None for runs written before version ids)."""
        return self.manifest.get("version_id")

    @property
    def checksums(self) -> dict | None:
        """{data file: "sha256:<hex>"}, or None for runs written before checksums."""
        return self.manifest.get("checksums")

    @property
    def checksummed(self) -> bool:
        return self.checksums is not None

    @property
    def events(self) -> pd.DataFrame:
        """The whole event table (loaded on first access, checked against the manifest's
        version and checksum, then against the schema)."""
        if self._events is None:
            label = str(self.path / EVENTS)
            # one open file for checksum, footer and data: pq.read_table(path) opens the path
            # twice, and a rewrite between the two opens would pair one write's footer with
            # another's rows
            with self.open_events() as f:
                try:
                    pf = events_file(f)
                    got = _version_of(pf.schema_arrow)
                    if self.version_id is not None and got != self.version_id:
                        raise RunChanged(f"{self.path}: the run was rewritten since it was opened (events of "
                                         f"version {got}, manifest of {self.version_id}); open it again")
                    missing = [c for c in COLUMNS if c not in pf.schema_arrow.names]
                    if missing:
                        raise CorruptRun(f"{label}: lacks event columns {missing}")
                    df, _ = _read_event_columns(pf, label)
                except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
                    # ValueError and friends: what pyarrow raises for some malformed footers
                    # and schema metadata besides its own exception types
                    if isinstance(e, RunError):
                        raise
                    raise CorruptRun(f"{label}: cannot read events: {type(e).__name__}: {_line(e)}") from None
                except MemoryError:   # a damaged footer's row count, or a run too big for this machine
                    raise CorruptRun(f"{label}: {self.num_events:,} events do not fit in memory here") from None
            df = validate.events(df, label)
            validate.events_match_launches(df, self.launches, label)
            validate.no_duplicate_rows(df, label)
            self._events, self.checked = df, True
        return self._events

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.path.name)

    @property
    def status(self) -> str:
        """What the recording said about itself: "ok", or e.g. "timeout" (manifest `status`)."""
        return str(self.manifest.get("status") or "ok")

    @property
    def registries(self) -> dict:
        """The phase registries the run was recorded with, as profiler.registry.registry.Registry objects."""
        from ..registry.registry import Registry
        return {fam: Registry.from_dict(d) for fam, d in (self.manifest.get("registry") or {}).items()}

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE


_ARROW_TYPES = {"int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_()}


_POOL_LOCK = threading.Lock()


def events_file(f: pa.NativeFile) -> pq.ParquetFile:
    """events.parquet's reader. A file that stores the categorical columns as write_run does
    (dictionaries of strings) has them decoded with int32 indices, as parquet holds them: the
    Arrow schema's int8 costs a cast per row group and column (0.07 s of pyarrow's 0.6 s at 10 M
    events); the codes are narrowed once, by _categorical.

    Its reads allocate from the system allocator (a reader takes the default Arrow pool when it is
    made): the columns become the frame's arrays without a copy (_read_event_columns), so they
    live where numpy's arrays and the analyses' temporaries do, and the memory a chunk frees serves
    the next one (profiler.analysis.heap). From Arrow's own pool (mimalloc) its freed pages stayed
    beside those the process heap kept: peak RSS of `epscope analyze` at 10 M events 0.99 GB
    instead of 0.83 GB (issue 31, session 5)."""
    pf = pq.ParquetFile(f)
    if not _stored_as_written(pf.schema_arrow):
        return pf
    with _POOL_LOCK:
        default = pa.default_memory_pool()
        pa.set_memory_pool(pa.system_memory_pool())
        try:
            return pq.ParquetFile(f, metadata=pf.metadata, read_dictionary=list(CATEGORICAL))
        finally:
            pa.set_memory_pool(default)


def _stored_as_written(schema: pa.Schema) -> bool:
    """The file holds exactly the types write_run writes (integers of the schema's widths,
    dictionary-encoded strings for the categorical columns)."""
    for c, t in COLUMNS.items():
        a = schema.field(c).type
        if t == "category":
            if not (pa.types.is_dictionary(a) and pa.types.is_string(a.value_type)):
                return False
        elif a != _ARROW_TYPES[t]:
            return False
    return True


def _read_event_columns(pf: pq.ParquetFile, file: str, groups: Sequence[int] | None = None,
                        keep: RowFilter | None = None, stats: Sequence[GroupStats] | None = None
                        ) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The event columns of the row groups `groups` (None: all) as a DataFrame, of each the rows
    `keep` selects (checked against the groups' `stats`), and the rows' numbers in the whole table
    (second value; None for the whole table, no filter).

    One pyarrow read of the row groups (pq.ParquetFile.read_row_groups, one thread: CPU time, not
    wall, is what a user pays on a shared box), whose integer and bool columns come as one Arrow
    array each, taken by numpy without a copy (a column that comes in several pieces is copied
    into one); the dictionary columns' indices are the Categoricals' codes. Reading the groups one
    at a time and concatenating them copied every byte once more: 0.1 s of the 0.75 s a 10 M-event
    run's chunks took (benchmarks/NOTES.md, "Issue 31 (session 5): reading the events"). A file
    of other types (nulls, other widths, plain strings) takes the general path, and
    profiler.store.validate then says what is wrong with it."""
    names = pf.schema_arrow.names
    dup = sorted({c for c in COLUMNS if names.count(c) > 1})
    if dup:
        raise CorruptRun(f"{file}: event columns {dup} appear more than once")
    offsets = _row_group_offsets(pf.metadata, file)
    whole = groups is None and keep is None
    groups = list(range(pf.num_row_groups) if groups is None else groups)
    if not _stored_as_written(pf.schema_arrow):
        return _read_other_types(pf, file, groups, keep, offsets, whole)
    sizes = [int(offsets[i + 1] - offsets[i]) for i in groups]
    t = pf.read_row_groups(groups, columns=list(COLUMNS), use_threads=False) if groups else \
        pf.schema_arrow.empty_table().select(list(COLUMNS))
    _check_rows(t, groups, sizes, file)
    sel = _selection(t, groups, sizes, keep, stats, file)
    out: dict[str, object] = {}
    for c, ty in COLUMNS.items():
        col = t.column(c)
        if ty == "category":
            out[c] = col if sel is None else col.take(sel)
            continue
        if col.null_count:
            raise validate.InvalidEvents(f"{file}: column {c!r}: {col.null_count:,} rows are missing")
        v = _numpy(col)
        out[c] = (v if sel is None else v[sel]).astype(ty, copy=False)
    if not groups and pf.num_row_groups:
        # nothing selected: the categories still come from the file (as the whole table's do)
        first = pf.read_row_group(0, columns=[c for c, ty in COLUMNS.items() if ty == "category"])
        out.update({c: pa.chunked_array([ch.slice(0, 0) for ch in first.column(c).chunks], type=first.schema.field(c).type)
                    for c in first.column_names})
    del t
    for c, ty in COLUMNS.items():
        if ty == "category":
            out[c] = _categorical(c, out[c], file)
    df = pd.DataFrame(out, copy=False)[list(COLUMNS)]
    if whole:
        return df, None
    rows = _rows(offsets, groups, sizes)
    return df, rows if sel is None else rows[sel]


def _rows(offsets: np.ndarray, groups: list, sizes: list) -> np.ndarray:
    """The whole table's row numbers of the row groups `groups` (sizes: their rows), in order."""
    if all(b == a + 1 for a, b in zip(groups, groups[1:])):     # consecutive groups: one range
        return np.arange(offsets[groups[0]], offsets[groups[0]] + sum(sizes), dtype=np.int64) if groups else \
            np.zeros(0, np.int64)
    rows = np.empty(sum(sizes), np.int64)
    o = 0
    for i, k in zip(groups, sizes):
        rows[o:o + k] = np.arange(offsets[i], offsets[i] + k)
        o += k
    return rows


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    """A column without nulls as a writable numpy array: a view of the one Arrow buffer a column of
    fixed width read in one piece has (its memory is this array's alone once the table is dropped;
    pyarrow's own to_numpy views are read-only, and a frame over them refuses `df.loc[...] = x`),
    else a copy (bools are bits in Arrow; a column in several pieces is joined)."""
    if col.num_chunks == 1:
        a = col.chunk(0)
        buf = a.buffers()[1]
        width = a.type.bit_width // 8 if pa.types.is_integer(a.type) else 0
        if width and buf is not None and buf.is_mutable:
            return np.frombuffer(buf, a.type.to_pandas_dtype(), count=len(a), offset=a.offset * width)
        a = a.to_numpy(zero_copy_only=False)
        return a if a.flags.writeable else a.copy()
    return col.to_numpy()


def _check_rows(t: pa.Table, groups: list, sizes: list, file: str) -> None:
    """The rows read are the rows the footer counts: in all, and per row group where a column
    comes in one piece per row group (the dictionary columns do)."""
    if t.num_rows != sum(sizes):
        raise CorruptRun(f"{file}: row groups hold {t.num_rows:,} rows, the footer says {sum(sizes):,}")
    for c in t.column_names:
        col = t.column(c)
        if col.num_chunks != len(groups):
            continue
        for i, ch, k in zip(groups, col.chunks, sizes):
            if len(ch) != k:
                raise CorruptRun(f"{file}: row group {i} holds {len(ch):,} rows, the footer says {k:,}")


def _selection(t: pa.Table, groups: list, sizes: list, keep: RowFilter | None,
               stats: Sequence[GroupStats] | None, file: str) -> np.ndarray | None:
    """The rows of `t` that `keep` selects (None: all of them), after each row group's `iteration`
    and `rank` were checked against the footer statistics that chose it to be read."""
    for c in ("iteration", "rank"):
        if t.column(c).null_count:
            raise validate.InvalidEvents(f"{file}: column {c!r}: {t.column(c).null_count:,} rows are missing")
    if keep is None:
        return None
    it, rk = (_numpy(t.column(c)) for c in ("iteration", "rank"))
    if stats is not None:
        o = 0
        for i, k in zip(groups, sizes):
            stats[i].check(i, it[o:o + k], rk[o:o + k], file)
            o += k
    if stats is not None and _all_kept(keep, stats, groups):
        return None                      # the statistics just checked say every row is wanted
    m = keep.mask(it, rk)
    return None if m.all() else np.flatnonzero(m)


def _all_kept(keep: RowFilter, stats: Sequence[GroupStats], groups: list) -> bool:
    """Does `keep` select every row of the row groups by their footer statistics (each group's
    [min, max] of iteration and rank within the wanted values: a chunk of whole iterations of a run
    written since issue 20 reads no other group)? The mask's passes over the rows are then not made."""
    for i in groups:
        st = stats[i]
        for want, lo, hi in ((keep.iterations, st.iteration_min, st.iteration_max),
                             (keep.ranks, st.rank_min, st.rank_max)):
            if want is None:
                continue
            if lo is None:
                return False
            # want: sorted distinct integers; all of lo..hi are in it when it holds hi - lo + 1 of them
            if int(np.searchsorted(want, hi, "right") - np.searchsorted(want, lo, "left")) != hi - lo + 1:
                return False
    return True


def _categorical(c: str, col: pa.ChunkedArray, file: str) -> pd.Categorical:
    """A dictionary-encoded column as a pandas Categorical, its dictionary and indices checked.
    Row groups written by write_run share one dictionary: their indices are the codes as they come
    (int8 for a column of up to 127 names: what pandas keeps); others are unified first."""
    first = col.chunk(0).dictionary if col.num_chunks else pa.array([], pa.string())
    if not all(ch.dictionary.equals(first) for ch in col.chunks[1:]):
        col = col.unify_dictionaries()
        first = col.chunk(0).dictionary
    d = first
    longest = int(pc.max(pc.utf8_length(d)).as_py() or 0) if len(d) else 0
    if len(d) > MAX_NAMES or longest > MAX_NAME_CHARS:   # before a Python string is made of each
        raise validate.InvalidEvents(f"{file}: column {c!r}: {len(d):,} names of up to {longest:,} characters "
                                     f"(at most {MAX_NAMES:,} of {MAX_NAME_CHARS} characters)")
    cats = d.to_pylist()
    if len(set(cats)) != len(cats) or any(x is None for x in cats):
        raise validate.InvalidEvents(f"{file}: column {c!r}: its dictionary holds repeated or missing values")
    parts = [_numpy(pa.chunked_array([ch.indices.fill_null(-1) if ch.null_count else ch.indices]))
             for ch in col.chunks]
    codes = checks_fast.codes8(parts, len(cats)) if checks_fast.enabled(sum(map(len, parts))) else None
    if codes is not None:         # checked and narrowed in one pass
        return pd.Categorical.from_codes(codes, categories=cats, validate=False)
    for p in parts:
        if len(p) and (int(p.min()) < -1 or int(p.max()) >= len(cats)):
            # parquet readers do not check dictionary indices: a damaged page can point past the end
            raise validate.InvalidEvents(f"{file}: column {c!r}: dictionary indices outside its {len(cats)} values")
    # the codes' width pandas keeps for this many categories (pandas.core.dtypes.cast.coerce_indexer_dtype)
    width = next(t for t in (np.int8, np.int16, np.int32, np.int64) if len(cats) < np.iinfo(t).max)
    codes = np.concatenate(parts, dtype=width, casting="unsafe") if parts else np.zeros(0, width)   # checked above
    return pd.Categorical.from_codes(codes, categories=cats, validate=False)


def _read_other_types(pf: pq.ParquetFile, file: str, groups, keep: RowFilter | None, offsets: np.ndarray,
                      whole: bool) -> tuple[pd.DataFrame, np.ndarray | None]:
    """_read_event_columns for a file of other types than write_run's: through pyarrow's own
    conversion (profiler.store.validate then says what is wrong with it)."""
    t = pf.read_row_groups(list(groups), columns=list(COLUMNS)) if len(groups) else \
        pf.schema_arrow.empty_table().select(list(COLUMNS))
    df = to_frame(t, list(COLUMNS), file)
    if whole:
        return df, None
    rows = np.concatenate([np.arange(offsets[g], offsets[g + 1]) for g in groups]) if len(groups) else \
        np.zeros(0, np.int64)
    if keep is not None:
        m = keep.mask(df["iteration"].to_numpy(), df["rank"].to_numpy())
        df, rows = df[m], rows[m]
    return df.reset_index(drop=True), rows


def _row_group_offsets(meta: pq.FileMetaData, file: str) -> np.ndarray:
    """Each row group's first row in the whole table, and the table's length last."""
    sizes = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], np.int64)
    if (sizes < 0).any() or int(sizes.sum()) != meta.num_rows:
        raise CorruptRun(f"{file}: row groups hold {int(sizes.sum()):,} rows, the footer says {meta.num_rows:,}")
    return np.concatenate([[0], np.cumsum(sizes)])


@dataclass(frozen=True)
class RowFilter:
    """Which events a filtered read keeps: those of the given iterations and ranks (None: all).
    Row groups whose min/max statistics of `iteration` and `rank` exclude them are not read."""
    iterations: np.ndarray | None = None
    ranks: np.ndarray | None = None

    @classmethod
    def of(cls, iterations=None, ranks=None) -> "RowFilter":
        """From any iterables of integers (sorted and deduplicated here)."""
        def arr(x):
            return None if x is None else np.unique(np.fromiter(x, np.int64))
        return cls(arr(iterations), arr(ranks))

    def mask(self, iteration: np.ndarray, rank: np.ndarray) -> np.ndarray:
        m = np.ones(len(iteration), bool)
        for want, v in ((self.iterations, iteration), (self.ranks, rank)):
            if want is None:
                continue
            lo, hi = int(want[0]) if len(want) else 0, int(want[-1]) if len(want) else -1
            if len(want) == hi - lo + 1:   # a range (a chunk of consecutive iterations): two compares
                m &= (v >= lo) & (v <= hi)
            else:
                m &= np.isin(v, want)
        return m

    def may_hold(self, stats: GroupStats) -> bool:
        for want, lo, hi in ((self.iterations, stats.iteration_min, stats.iteration_max),
                             (self.ranks, stats.rank_min, stats.rank_max)):
            if want is None or lo is None:
                continue
            i = np.searchsorted(want, lo, "left")
            if i == len(want) or want[i] > hi:
                return False
        return True


@dataclass(frozen=True)
class GroupStats:
    """A row group of events.parquet: its first row in the whole table, its rows, and the
    footer's min/max of `iteration` and `rank` (None where the file carries no statistics)."""
    first_row: int
    rows: int
    iteration_min: int | None
    iteration_max: int | None
    rank_min: int | None
    rank_max: int | None

    def check(self, group: int, iteration: np.ndarray, rank: np.ndarray, file: str) -> None:
        """The rows read agree with the statistics that chose them to be read (those that pruned
        the other row groups are then as trustworthy as the file; a run with checksums verified it)."""
        if not len(iteration):
            return
        for name, v, lo, hi in (("iteration", iteration, self.iteration_min, self.iteration_max),
                                ("rank", rank, self.rank_min, self.rank_max)):
            if lo is not None and (int(v.min()) < lo or int(v.max()) > hi):
                raise CorruptRun(f"{file}: row group {group}: {name} values outside the footer's statistics "
                                 f"[{lo}, {hi}]")


def _group_stats(meta: pq.FileMetaData, file: str) -> list[GroupStats]:
    offsets = _row_group_offsets(meta, file)
    names = [meta.schema.column(j).name for j in range(meta.num_columns)]
    where = {c: names.index(c) for c in ("iteration", "rank") if names.count(c) == 1}
    out = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        mm = {}
        for c in ("iteration", "rank"):
            st = rg.column(where[c]).statistics if c in where else None
            ok = st is not None and st.has_min_max and isinstance(st.min, int) and isinstance(st.max, int) \
                and st.min <= st.max
            mm[c] = (int(st.min), int(st.max)) if ok else (None, None)
        out.append(GroupStats(int(offsets[i]), int(offsets[i + 1] - offsets[i]), *mm["iteration"], *mm["rank"]))
    return out


def _file_version(p: Path, within=None) -> str | None:
    """The version id in a parquet file's footer, None when it has none or cannot be read."""
    try:
        with arrow_file(p, str(p), within) as f:
            return _version_of(pq.read_schema(f))
    except Exception:   # a damaged file: the caller reports the damage, not this
        return None


def _footer_format(schema: pa.Schema) -> int | None:
    """The format version a data file's footer names (validate.FOOTER_FORMAT_KEY; None: written
    before format 3, or not a number)."""
    v = (schema.metadata or {}).get(validate.FOOTER_FORMAT_KEY)
    try:
        return int(v.decode("ascii")) if v is not None else None
    except (UnicodeDecodeError, ValueError):
        return -1


def check_not_downgraded(path: Path, man: dict, found: dict) -> None:
    """The manifest's format agrees with what the data files' footers say they were written in
    (found: {file: footer format or None}). A footer naming a sealed format under a manifest of an
    older one (or without a seal) is a sealed run whose seal and checksums were removed: refused,
    never read as a run written before sealing. A sealed manifest whose files do not name its
    format is refused too (files of another writer)."""
    version = man.get("format_version")
    for name, got in found.items():
        if got is not None and got >= validate.SEALED_SINCE and (version < got or man.get(validate.SEAL) is None):
            raise DowngradedRun(f"{path / MANIFEST}: says format {version}"
                                f"{' without a seal' if man.get(validate.SEAL) is None else ''}, but {name} was "
                                f"written in sealed format {got}: the manifest was edited back (its seal or "
                                "checksums removed); not read as an unverified old run")
        if version >= validate.SEALED_SINCE and got != version:
            raise CorruptRun(f"{path / name}: its footer names format {got}, the manifest {version}: files of "
                             "another writer")


def _version_of(schema: pa.Schema) -> str | None:
    v = (schema.metadata or {}).get(VERSION_KEY)
    return v.decode("ascii", "replace") if v is not None else None


# -- opening ----------------------------------------------------------------------------------
def _roots(within: Sequence[Path] | None) -> tuple | None:
    return None if within is None else tuple(Path(os.path.realpath(r)) for r in within)


def _resolve(p: Path, within: Sequence[Path] | None) -> Path:
    real = Path(os.path.realpath(p))
    if not atomic.inside(real, within):
        raise OutsideRoots(f"{p}: resolves outside the allowed roots; not read")
    return real


def _files(path: Path, within: Sequence[Path] | None) -> RunFiles:
    try:
        return _files_unchecked(path, within)
    except OSError as e:   # a directory or file that cannot be listed or stat'ed (permissions, I/O)
        raise RunNotFound(f"{path}: cannot be read ({e.strerror or e})") from None


def _files_unchecked(path: Path, within: Sequence[Path] | None) -> RunFiles:
    if not path.exists():
        raise RunNotFound(f"{path}: no such run directory")
    if not path.is_dir():
        raise RunNotFound(f"{path}: not a directory")
    within = _roots(within)
    _resolve(path, within)
    mp, ep, lp = path / MANIFEST, path / EVENTS, path / LAUNCHES
    if not mp.exists():
        if ep.exists():
            raise CorruptRun(f"{path}: has {EVENTS} but no {MANIFEST}")
        raise RunNotFound(f"{path}: not a run directory (no {MANIFEST})")
    files = RunFiles(_resolve(mp, within), _resolve(ep, within) if ep.exists() else None,
                     _resolve(lp, within) if lp.exists() else None)
    for f, name in ((files.manifest, MANIFEST), (files.events, EVENTS), (files.launches, LAUNCHES)):
        if f is not None and not f.is_file():
            raise CorruptRun(f"{path / name}: not a regular file")
    return files


def _need(path: Path, p: Path | None, name: str) -> Path:
    if p is None:
        raise CorruptRun(f"{path}: manifest present but {name} missing")
    return p


def read_manifest(path, *, within: Sequence[Path] | None = None) -> dict:
    """The run's manifest, checked (profiler.store.validate); RunError subclasses naming the path."""
    return _read_manifest(_files(Path(path), within).manifest, Path(path) / MANIFEST, _roots(within))


def _read_manifest(mp: Path, label: Path, within=None) -> dict:
    try:
        return validate.manifest_file(mp, str(label), within=within)
    except OSError as e:
        raise CorruptRun(f"{label}: cannot be read ({e.strerror or e})") from None


def _footer(f: pa.NativeFile, label: str) -> pq.FileMetaData:
    try:
        meta = pq.ParquetFile(f).metadata
        names = set(meta.schema.names)
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
        raise CorruptRun(f"{label}: not a readable parquet file ({type(e).__name__}: {_line(e)})") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise CorruptRun(f"{label}: lacks event columns {missing}")
    return meta


def _footer_schema(meta: pq.FileMetaData, label: str) -> pa.Schema:
    try:
        return meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
        raise CorruptRun(f"{label}: its schema cannot be read ({type(e).__name__}: {_line(e)})") from None


@dataclass(frozen=True)
class _Launches:
    """launches.parquet as read: the table, its footer's version id and format, the hash of its bytes."""
    table: pd.DataFrame
    version: str | None
    format: int | None
    pins: dict


def _read_launches(lp: Path, want: str | None, label: str, version_id: str | None, within=None) -> _Launches:
    pins: dict = {}
    with _open_of_version(lp, want, label, version_id, f"{lp.parent}: {LAUNCHES} and {MANIFEST} come from different writes",
                          within=within, pin=None if want is not None else pins, name=LAUNCHES) as f:
        try:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            missing = [c for c in LAUNCH_COLUMNS if c not in names]
            if missing:
                raise validate.InvalidEvents(f"{label}: launch table lacks columns {missing}")
            t = pf.read(columns=list(LAUNCH_COLUMNS))
            df = to_frame(t, list(LAUNCH_COLUMNS), label)
            version, fmt = _version_of(pf.schema_arrow), _footer_format(pf.schema_arrow)
        except RunError:
            raise
        except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
            raise CorruptRun(f"{label}: cannot read launches ({type(e).__name__}: {_line(e)})") from None
    return _Launches(validate.launches(df, label), version, fmt, pins)


def _one_version(path: Path, man: dict, *found: tuple[str, str | None]) -> None:
    vid = man.get("version_id")
    if vid is None:
        return
    for what, got in found:
        if got is not None and got != vid:
            raise RunChanged(f"{path}: {what} and {MANIFEST} come from different writes ({got} and {vid})")
        if got is None:
            raise CorruptRun(f"{path}: manifest.json names write {vid} but {what} carries no version id")


def load_run(path, *, within: Sequence[Path] | None = None) -> Run:
    """Open a run directory. Events load lazily; errors are RunError subclasses naming the path.

    The manifest and launches are read and checked now (launches against their checksum when
    the run has checksums, else their hash is pinned), the events' footer is read now and their
    rows (checksum, schema, against the launches) on first access to `Run.events`. A run without
    launches.parquet is corrupt (every writer since the first format version writes it).

    within: roots the run's files must resolve into (a symlinked file pointing elsewhere raises
    OutsideRoots). A run being rewritten while it is opened is read again (READ_RETRIES)."""
    path = Path(path)
    roots = _roots(within)
    for attempt in range(READ_RETRIES):
        files = _files(path, within)
        man = _read_manifest(files.manifest, path / MANIFEST, roots)
        try:
            meta, ever, efmt = _events_footer(path, man, _need(path, files.events, EVENTS), roots)
            la = _read_launches(_need(path, files.launches, LAUNCHES), (man.get("checksums") or {}).get(LAUNCHES),
                                str(path / LAUNCHES), man.get("version_id"), roots)
            _one_version(path, man, (EVENTS, ever), (LAUNCHES, la.version))
        except RunChanged as e:
            if attempt + 1 == READ_RETRIES:   # not a rewrite in progress: files copied across runs
                raise CorruptRun(str(e)) from None
            time.sleep(0.01 * (attempt + 1))
            continue
        break
    check_not_downgraded(path, man, {EVENTS: efmt, LAUNCHES: la.format})
    if meta.num_rows == 0:
        raise EmptyRun(f"{path}: the run has no events")
    n = man.get("num_events")
    if n is not None and n != meta.num_rows:
        raise CorruptRun(f"{path / MANIFEST}: field 'num_events' says {n:,} events, {EVENTS} holds {meta.num_rows:,}")
    validate.manifest_matches_launches(man, la.table, str(path / MANIFEST))
    return Run(path, man, la.table, int(meta.num_rows), files, within=roots, pins=la.pins)


def _events_footer(path: Path, man: dict, ep: Path, roots) -> tuple[pq.FileMetaData, str | None, int | None]:
    """events.parquet's footer: its metadata, version id and format (a damaged footer of a run with
    checksums names the file whose checksum differs)."""
    label = str(path / EVENTS)
    want = (man.get("checksums") or {}).get(EVENTS)
    try:
        with open_checked(ep, None, label, within=roots) as f:
            meta = _footer(f, label)
            schema = _footer_schema(meta, label)
            return meta, _version_of(schema), _footer_format(schema)
    except CorruptRun:
        if want:
            open_checked(ep, want, label, within=roots).close()
        raise


@dataclass(frozen=True)
class RunCheck:
    """A run's state: what a list of runs shows and `epscope check` prints. `problem` is one
    line when the run cannot be opened; `status` is "ok", the recording's own status (e.g.
    "timeout"), or the kind of problem; `note` says what was not verified (a run written
    before checksums)."""
    path: Path
    manifest: dict | None
    status: str
    problem: str | None = None
    num_events: int | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.status == "ok"

    @property
    def damaged(self) -> bool:
        """The run cannot be read as written (a problem other than "recorded as timed out")."""
        return self.problem is not None


NO_CHECKSUMS = ("NOT VERIFIED: no checksums and no seal (written before epscope recorded them; "
                "`epscope seal RUN` verifies nothing but seals it from now on)")
NOT_SEALED = "data checksums verified; manifest NOT VERIFIED: not sealed (format 2; `epscope seal RUN` seals it)"


def check_run(path, *, within: Sequence[Path] | None = None, deep: bool = False) -> RunCheck:
    """Validation that never raises: the problem is in the result. Cheap by default (manifest,
    launches, the events' footer, row counts and version ids: what a list of runs shows);
    deep=True also reads the whole event table (its checksum and every row: `epscope check`)."""
    path = Path(path)
    man = None
    try:
        try:
            files = _files(path, within)
            man = _read_manifest(files.manifest, path / MANIFEST, _roots(within))
            run = load_run(path, within=within)
            if deep:
                run.events
        except UnsupportedRunVersion as e:
            return RunCheck(path, None, "newer format", _line(e))
        except EmptyRun as e:
            return RunCheck(path, man, "empty", _line(e), 0)
        except (InvalidManifest, OutsideRoots, RunNotFound) as e:
            return RunCheck(path, None, "unreadable", _line(e))
        except OSError as e:   # a file that cannot be opened after it was listed (permissions, I/O)
            return RunCheck(path, man, "unreadable", f"{path}: {e.strerror or type(e).__name__}")
        except RunError as e:
            return RunCheck(path, man, "corrupt", _line(e))
        except MemoryError:
            return RunCheck(path, man, "unreadable", f"{path}: too large to read into memory")
    except Exception as e:   # a bug of the reader must not take a list of runs down with it
        return RunCheck(path, man, "unreadable", f"{path}: {type(e).__name__}: {_line(e)}")
    return RunCheck(path, run.manifest, run.status, None, run.num_events, run.verified)


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:1000]


def list_runs(root) -> list[Path]:
    """Run directories (those holding manifest.json) under root, sorted; root itself counts.
    Hidden directories (a write in progress is one) and directories that cannot be listed
    are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    out, stack = [], [root]
    while stack:
        d = stack.pop()
        try:
            if os.path.lexists(d / MANIFEST):   # a manifest that is not a regular file: a damaged run, listed
                out.append(d)
            stack.extend(c for c in d.iterdir() if c.is_dir() and not c.is_symlink() and not c.name.startswith("."))
        except OSError:
            continue
    return sorted(out)


def iter_event_batches(path, batch_rows: int = 1_000_000, columns: list[str] | None = None):
    """Stream RUN/events.parquet as DataFrames of at most batch_rows rows (categoricals kept;
    with all columns, each batch is checked as load_run checks the whole table, against the
    launches too, but for rows repeated across batches: check_events finds those; a Run is checked
    against its pinned hash first)."""
    run = path if isinstance(path, Run) else None
    if run is None:
        run = load_run(path)
    label = str(run.path / EVENTS)
    cols = list(COLUMNS) if columns is None else list(columns)
    with run.open_events() as f:
        try:
            pf = pq.ParquetFile(f)
            missing = [c for c in cols if c not in pf.schema_arrow.names]
            if missing:
                raise CorruptRun(f"{label}: lacks event columns {missing}")
            for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
                df = to_frame(batch, cols, label)
                if columns is None:
                    df = validate.events(df, label)
                    validate.events_match_launches(df, run.launches, label)
                yield df
        except RunError:
            raise
        except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
            raise CorruptRun(f"{label}: not a readable parquet file ({type(e).__name__}: {_line(e)})") from None


class EventReader:
    """A run's events read by iteration and/or rank, without reading the rest of the file.

        with EventReader(run) as r:
            ev = r.read(iterations=[3, 4])      # indexed by row number in the whole table

    Opened once: the file's checksum (runs that carry one) and version id are checked as
    `Run.events` checks them, and the one open file serves every read. A read keeps the row groups
    whose footer statistics may hold the wanted iterations and ranks (runs written since issue 20
    cut row groups at (rank, iteration) boundaries: runstore.row_group_bounds; older runs have
    fewer, bigger row groups, so less is pruned, and the result is the same), reads them one at a
    time, keeps the wanted rows and checks them as the whole table is checked (types, dictionary
    indices, profiler.store.validate). The frame equals `run.events` restricted to those rows (values,
    dtypes, categories: every row group of a run written by write_run holds the whole table's
    dictionaries), indexed by their row numbers in it."""

    def __init__(self, run: Run):
        self.run = run
        self.label = str(run.path / EVENTS)
        self._f = run.open_events()
        try:
            self._pf = events_file(self._f)
            got = _version_of(self._pf.schema_arrow)
            if run.version_id is not None and got != run.version_id:
                raise RunChanged(f"{run.path}: the run was rewritten since it was opened (events of "
                                 f"version {got}, manifest of {run.version_id}); open it again")
            missing = [c for c in COLUMNS if c not in self._pf.schema_arrow.names]
            if missing:
                raise CorruptRun(f"{self.label}: lacks event columns {missing}")
            self.groups = _group_stats(self._pf.metadata, self.label)
        except BaseException as e:
            self._f.close()
            if isinstance(e, (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError)) \
                    and not isinstance(e, RunError):
                raise CorruptRun(f"{self.label}: cannot read events: {type(e).__name__}: {_line(e)}") from None
            raise

    def __enter__(self) -> "EventReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole table's `iteration` and `rank` columns (what a reader cuts chunks by)."""
        try:
            t = self._pf.read(columns=["iteration", "rank"])
        except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
            raise CorruptRun(f"{self.label}: cannot read events: {type(e).__name__}: {_line(e)}") from None
        out = []
        for c in ("iteration", "rank"):
            col = t.column(c)
            if col.null_count:
                raise validate.InvalidEvents(f"{self.label}: column {c!r}: {col.null_count:,} rows are missing")
            v = col.to_numpy()
            if len(v) and int(v.min()) < 0:
                raise validate.InvalidEvents(f"{self.label}: column {c!r}: negative values")
            out.append(v)
        return out[0], out[1]

    def counts(self) -> tuple[pd.Series, np.ndarray]:
        """(events per iteration, the ranks that recorded events), with memory of one row group:
        a row group whose footer statistics say it holds one iteration (and one rank) is counted
        from them, any other from its `iteration` and `rank` columns (keys() read both columns of
        the whole table: 0.6 GB at 100 M events, issue 31)."""
        per: dict[int, int] = {}
        ranks: set[int] = set()
        for i, st in enumerate(self.groups):
            if st.rows == 0:
                continue
            one_it = st.iteration_min is not None and st.iteration_min == st.iteration_max
            one_rank = st.rank_min is not None and st.rank_min == st.rank_max
            if one_it and one_rank and st.iteration_min >= 0 and st.rank_min >= 0:
                per[st.iteration_min] = per.get(st.iteration_min, 0) + st.rows
                ranks.add(st.rank_min)
                continue
            try:
                t = self._pf.read_row_group(i, columns=["iteration", "rank"])
            except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
                raise CorruptRun(f"{self.label}: cannot read events: {type(e).__name__}: {_line(e)}") from None
            it, rk = t.column("iteration"), t.column("rank")
            for c, col in (("iteration", it), ("rank", rk)):
                if col.null_count:
                    raise validate.InvalidEvents(f"{self.label}: column {c!r}: {col.null_count:,} rows are missing")
            it, rk = it.to_numpy(), rk.to_numpy()
            st.check(i, it, rk, self.label)
            if len(it) and (int(it.min()) < 0 or int(rk.min()) < 0):
                raise validate.InvalidEvents(f"{self.label}: column 'iteration' or 'rank': negative values")
            u, c = np.unique(it, return_counts=True)
            for a, b in zip(u.tolist(), c.tolist()):
                per[a] = per.get(a, 0) + b
            ranks.update(np.unique(rk).tolist())
        counts = pd.Series(per, dtype=np.int64).sort_index()
        return counts, np.array(sorted(ranks), dtype=np.int64)

    def row_groups(self, keep: RowFilter) -> list[int]:
        """The row groups a read of `keep` opens."""
        return [i for i, st in enumerate(self.groups) if keep.may_hold(st)]

    def read(self, *, iterations=None, ranks=None) -> pd.DataFrame:
        """The events of the given iterations and ranks (None: all), in table order, indexed by
        their row numbers in the whole table."""
        keep = RowFilter.of(iterations, ranks)
        try:
            df, rows = _read_event_columns(self._pf, self.label, self.row_groups(keep), keep, self.groups)
        except (OSError, pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as e:
            if isinstance(e, RunError):
                raise
            raise CorruptRun(f"{self.label}: cannot read events: {type(e).__name__}: {_line(e)}") from None
        df = validate.events(df, self.label)
        validate.events_match_launches(df, self.run.launches, self.label, rows)
        validate.no_duplicate_rows(df, self.label, rows)   # a row's twin shares its rank and iteration: read with it
        df.index = pd.Index(rows, dtype=np.int64, copy=False)   # rows is this frame's own (a copy: 20 MB a 2.5 M-event chunk)
        return df


def read_events(run: Run, *, iterations=None, ranks=None) -> pd.DataFrame:
    """One filtered read (EventReader.read) of a run's events."""
    with EventReader(run) as r:
        return r.read(iterations=iterations, ranks=ranks)


def check_events(run: Run, chunk_rows: int = CHECK_CHUNK_ROWS) -> None:
    """Read the whole event table and check it as load_run's full read does (checksum, every
    column, against the launches, no repeated row), in chunks of whole iterations of about
    chunk_rows rows (a repeated row shares its twin's iteration): what `epscope export` runs before
    it writes. Memory: one chunk (an iteration larger than chunk_rows is read alone)."""
    with EventReader(run) as r:
        its, _ = r.keys()
        values, counts = np.unique(its, return_counts=True)
        del its
        chunk, rows = [], 0
        for it, n in zip(values.tolist(), counts.tolist()):
            if chunk and rows + n > chunk_rows:
                r.read(iterations=chunk)
                chunk, rows = [], 0
            chunk.append(it)
            rows += n
        if chunk or not r.groups:
            r.read(iterations=chunk or None)
    run.checked = True
