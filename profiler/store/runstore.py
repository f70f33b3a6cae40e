"""Write a run directory (docs/design.md, "Run directory"); reading is profiler.store.runreader,
one floor down, re-exported here (`from profiler.store.runstore import load_run` keeps working).

    RUN/manifest.json  RUN/events.parquet (zstd)  RUN/launches.parquet  [RUN/trace.perfetto-trace]

Events are stored with dictionary-encoded (categorical) columns, zstd, rows ordered as given
(by rank, launch), in row groups cut where the (rank, iteration) pair changes
(`row_group_bounds`: small consecutive segments merged up to ROW_GROUP_MIN_ROWS, none above
ROW_GROUP_ROWS), so a reader picks one iteration's or rank's rows from the row groups' min/max
statistics (`runreader.EventReader`) and streams the table (`iter_event_batches`) with flat memory.

Writes are atomic and never replace a run unasked: a run is written into a hidden, locked
temporary directory beside its destination (profiler.store.atomic) and renamed into place (an
existing name gets a suffixed one, `NAME-2`, unless overwrite=True, which swaps the
directories in one step). Every write gets a version id, in the manifest and in both parquet
files' metadata, and the manifest records a sha256 of each data file (`checksums`), so a
reader tells a damaged file from a good one. Temporaries of writes that died are removed by
the next write to the same run. Runs written before version ids or checksums still open.

No torch / perfetto / dash imports at module level: this runs on the recording path of the GPU
machine (the Perfetto export is imported lazily, only when asked for or importable).
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import importlib.util
import io
import json
import os
import shutil
import struct
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import atomic, validate
from ..errors import CorruptRun, EmptyRun, RunChanged, RunError, RunExists, RunNotFound  # noqa: F401 (re-exported)
from .runreader import (DATA_FILES, EVENTS, LAUNCHES, MANIFEST, NO_CHECKSUMS, READ_RETRIES, TRACE,  # noqa: F401
                        VERSION_KEY, NOT_SEALED, OutsideRoots, Run, RunCheck, RunFiles, check_events, check_run, file_hash,
                        iter_event_batches, list_runs, load_run, read_manifest, _files, _read_manifest,
                        _version_of)
from .schema import COLUMNS, LAUNCH_COLUMNS  # noqa: F401
from .validate import FORMAT, FORMAT_VERSION

ROW_GROUP_ROWS = 1_000_000
# Consecutive (rank, iteration) segments are merged into one row group until it holds at least
# this many rows: a bundled run of 50-320 k events (traces/) keeps 1-5 row groups instead of one
# per rank and iteration (up to 8 x 100 here), and a filtered read of one iteration of a big run
# reads at most this many rows of its neighbours per rank.
ROW_GROUP_MIN_ROWS = 65_536
ZSTD_LEVEL = 9
# Runs bundled under traces/ live in git and must stay a few MB. A Perfetto trace costs 25-40
# bytes per event (25 for plain spans, more for barrier events with flows: bench_profiler.py and
# traces/synthetic-compare) against ~7 in zstd parquet, so with perfetto=None the trace is kept
# only up to this many events (<= ~4 MB of trace); `epscope export RUN` regenerates it for any run.
TRACE_KEEP_MAX_EVENTS = 100_000
MAX_SUFFIX = 10_000
# Manifest fields that describe the files on disk: set by the writer only.
FILE_FIELDS = ("format", "format_version", "version_id", "num_events", "checksums", validate.SEAL)
# What a seal in place leaves out of the sealed run: results computed from the unsealed files'
# bytes (their footers change, so would their hashes: `epscope analyze` stores them again).
DERIVED_STALE = ("analysis", "analysis-summary.json")


# -- writing ----------------------------------------------------------------------------------
def _events_table(events: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(validate.events(events, "events to write"), preserve_index=False)


def row_group_bounds(rank: np.ndarray, iteration: np.ndarray, *, floor: int | None = None,
                     ceiling: int | None = None) -> np.ndarray:
    """Row numbers where the event table's row groups start, and its length last.

    A segment is a maximal run of consecutive rows of one (rank, iteration); row groups end on
    segment ends only: consecutive segments are merged until the group holds at least `floor`
    rows, and a group never holds more than `ceiling` (a longer segment is cut into pieces of
    `ceiling`; defaults: ROW_GROUP_MIN_ROWS, ROW_GROUP_ROWS). One binary search per row group, so
    a table whose segments are tiny costs no Python loop over them."""
    floor = ROW_GROUP_MIN_ROWS if floor is None else floor
    ceiling = ROW_GROUP_ROWS if ceiling is None else ceiling
    if not 0 < floor <= ceiling:
        raise ValueError(f"row_group_bounds: need 0 < floor ({floor}) <= ceiling ({ceiling})")
    n = len(rank)
    if n == 0:
        return np.zeros(1, np.int64)
    change = (rank[1:] != rank[:-1]) | (iteration[1:] != iteration[:-1])
    ends = np.append(np.flatnonzero(change) + 1, n).astype(np.int64)   # segment ends, ascending
    cuts, s = [0], 0
    while s < n:
        nxt = int(ends[min(np.searchsorted(ends, s + floor, "left"), len(ends) - 1)])
        if nxt - s > ceiling:
            j = int(np.searchsorted(ends, s + ceiling, "right")) - 1
            nxt = int(ends[j]) if j >= 0 and ends[j] > s else s + ceiling
        cuts.append(nxt)
        s = nxt
    return np.asarray(cuts, np.int64)


def _write_events(f, table: pa.Table) -> int:
    return _write_event_parts(f, [table])


def _event_writer(f, schema: pa.Schema) -> pq.ParquetWriter:
    # min/max statistics of every column (pyarrow's default): rank and iteration prune row groups.
    # The int64 columns (times, payload) delta-encoded instead of dictionary-encoded: in row groups
    # of one rank's iteration their 1 MB dictionary covers more of the rows, which made the file
    # 37 % larger than with 1 M-row groups (57 against 42 MB at 10 M events); delta-encoded, 2.5 M
    # rows take 9.3 instead of 14.3 MB and read in 0.18 instead of 0.46 s (benchmarks/NOTES.md).
    wide = [c for c, t in COLUMNS.items() if t == "int64"]
    return pq.ParquetWriter(f, schema, compression="zstd", compression_level=ZSTD_LEVEL,
                            use_dictionary=[c for c in COLUMNS if c not in wide],
                            column_encoding={c: "DELTA_BINARY_PACKED" for c in wide})


def _dictionaries(table: pa.Table) -> dict:
    """Each dictionary-encoded column's values (one list: a table from pandas has one per column)."""
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            ds = {tuple(c.dictionary.to_pylist()) for c in col.chunks}
            out[name] = ds.pop() if len(ds) == 1 else tuple(sorted(ds))
    return out


def _write_event_parts(f, tables) -> int:
    """Write the tables one after the other (row groups never span two); returns the rows written.
    Every table must have the first one's schema: the categorical columns' dictionaries included
    (a reader takes one dictionary per column)."""
    w, n, cats = None, 0, None
    try:
        for table in tables:
            if w is None:
                w, cats = _event_writer(f, table.schema), _dictionaries(table)
            elif not table.schema.equals(w.schema, check_metadata=False) or _dictionaries(table) != cats:
                raise ValueError("write_run_parts: a part's columns differ from the first part's (types or "
                                 "categories: give every part the same categories)")
            bounds = row_group_bounds(table.column("rank").to_numpy(), table.column("iteration").to_numpy())
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                w.write_table(table.slice(a, b - a), row_group_size=b - a)
            n += table.num_rows
    finally:
        if w is not None:
            w.close()
    if w is None:
        raise ValueError("write_run_parts: no parts")
    return n


def _launches_frame(launches, file: str = "launches") -> pd.DataFrame:
    df = launches if isinstance(launches, pd.DataFrame) else pd.DataFrame(list(launches), columns=list(LAUNCH_COLUMNS))
    return validate.launches(df, file)[list(LAUNCH_COLUMNS)]


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_json"):
        return o.to_json()
    raise TypeError(f"manifest value of type {type(o).__name__} is not JSON-serialisable")


def _with_version(table: pa.Table, version_id: str) -> pa.Table:
    """The table with this write's version id and format in its schema metadata (both data files'
    footers: what tells a sealed run from one written before sealing, runreader.check_not_downgraded)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), VERSION_KEY: version_id.encode(),
                                          validate.FOOTER_FORMAT_KEY: str(FORMAT_VERSION).encode()})


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_files(d: Path) -> None:
    """Every file directly in d, then d itself, on disk (before d is renamed into place)."""
    for f in d.iterdir():
        if f.is_file():
            _fsync(f)
    _fsync(d)


def _manifest_text(man: dict, where: str) -> str:
    """The manifest's text, sealed when its format seals (or it carries a seal: update_manifest of a
    sealed run), checked as a reader checks it."""
    if man.get("format_version", 0) >= validate.SEALED_SINCE or validate.SEAL in man:
        # sealed as a reader will parse it (tuples as lists, numpy numbers as numbers)
        man = validate.sealed(json.loads(json.dumps(man, default=_json_default)))
    text = json.dumps(man, indent=1, default=_json_default, sort_keys=False) + "\n"
    validate.manifest_text(text, where)   # what we write must read back
    return text


def _write_file(path: Path, write) -> str:
    """Create path exclusively, write(f) into it, return its checksum (read back from disk:
    what was stored, not what was meant)."""
    with atomic.create_exclusive(path) as f:
        write(f)
    with open(path, "rb") as f:
        return file_hash(f)


def write_run(path, events: pd.DataFrame, launches, manifest: dict, *, perfetto: bool | None = None,
              overwrite: bool = False) -> Path:
    """Write a run directory; returns its path, which is `path` or, when `path` exists and
    overwrite is False, the first free `path-2`, `path-3`, ...

    The run is written into a temporary directory beside `path` and renamed into place, so a
    reader sees the old run or the new one, never a half-written one, and a write that fails
    leaves the old run as it was. overwrite=True replaces an existing run directory (refused for
    anything else). The manifest gets `format`, `format_version`, `version_id`, `created`,
    `num_events`, `checksums` and (from the launches) `drops` when absent. perfetto=True writes
    trace.perfetto-trace; None writes it when the perfetto package imports and the run has at
    most TRACE_KEEP_MAX_EVENTS events.
    """
    table = _events_table(events)
    if perfetto is None:
        perfetto = importlib.util.find_spec("perfetto") is not None and table.num_rows <= TRACE_KEEP_MAX_EVENTS
    return _write_run(Path(path), lambda f, vid: _write_events(f, _with_version(table, vid)), launches, manifest,
                      perfetto=perfetto, overwrite=overwrite)


def write_run_parts(path, parts, launches, manifest: dict, *, overwrite: bool = False) -> Path:
    """write_run for a run too large to hold whole: its events as consecutive parts in row order
    (an iterable of event tables, each validated as write_run validates a table, all with the same
    categories), written as they come; only one part is in memory at a time. launches: the launch
    table, or a callable returning it once the parts are written (parts made as they are written
    make their launches too; the manifest is then read after the parts as well). No Perfetto trace (`epscope export RUN` writes one). The file reads
    as write_run's would."""
    def events(f, vid):
        return _write_event_parts(f, (_with_version(_events_table(p), vid) for p in parts))
    return _write_run(Path(path), events, launches, manifest, perfetto=False, overwrite=overwrite)


def _new_manifest(manifest: dict, launches: pd.DataFrame, vid: str) -> dict:
    man = {k: v for k, v in manifest.items() if k != "checksums"}
    man["format"] = FORMAT
    man["format_version"] = FORMAT_VERSION
    man["version_id"] = vid
    man.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    if "drops" not in man:
        per_rank = launches.groupby("rank")["dropped"].sum() if len(launches) else pd.Series(dtype="int64")
        nr = int(per_rank.index.max()) + 1 if len(per_rank) else 0
        man["drops"] = {"total": int(launches["dropped"].sum()),
                        "per_rank": [int(per_rank.get(r, 0)) for r in range(nr)]}
    return man


def _write_run(path: Path, write_events, launches, manifest: dict, *, perfetto: bool, overwrite: bool) -> Path:
    """The directory write of write_run / write_run_parts; write_events(file, version_id) writes
    events.parquet and returns its row count; launches: a table, or a callable that gives it after
    the events are written."""
    vid = uuid.uuid4().hex
    if not callable(launches):
        launches = _launches_frame(launches, "launches to write")
        # refused before anything is written (the checksums and the count, known once the files are, stand in)
        _manifest_text({**_new_manifest(manifest, launches, vid), "num_events": 0,
                        "checksums": {f: "sha256:" + "0" * 64 for f in DATA_FILES}}, f"manifest of {path}")

    path.parent.mkdir(parents=True, exist_ok=True)
    # hidden (list_runs and the viewer skip it), beside the destination (one file system: the
    # rename is atomic), locked while this write lives
    with atomic.staged_dir(path) as tmp:
        n = [0]
        sums = {EVENTS: _write_file(tmp / EVENTS, lambda f: n.__setitem__(0, write_events(f, vid)))}
        if callable(launches):
            launches = _launches_frame(launches(), "launches to write")
        man = _new_manifest(manifest, launches, vid)
        sums |= {
            LAUNCHES: _write_file(tmp / LAUNCHES, lambda f: pq.write_table(
                _with_version(pa.Table.from_pandas(launches, preserve_index=False), vid), f, compression="zstd")),
        }
        man["num_events"] = n[0]
        man["checksums"] = sums
        text = _manifest_text(man, f"manifest of {path}")
        with atomic.create_exclusive(tmp / MANIFEST) as f:
            f.write(text.encode())
        if perfetto:
            from ..export.perfetto import export_perfetto
            export_perfetto(load_run(tmp), tmp / TRACE)
        _fsync_files(tmp)
        final = _place(tmp, path, overwrite)
    _fsync(path.parent)
    return final


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and ((p / MANIFEST).is_file() or not any(p.iterdir()))


def _place(tmp: Path, path: Path, overwrite: bool) -> Path:
    if overwrite and os.path.lexists(path):
        if not _is_run_dir(path):
            raise RunExists(f"{path} exists and is not a run directory; not replacing it")
        if atomic.rename_exchange(tmp, path):   # one step: readers see old or new
            # tmp now holds the old run, unlocked: a concurrent writer's clean_leftovers may be
            # removing it too
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        _swap_in_two_steps(tmp, path)
        return path
    if atomic.rename_noreplace(tmp, path):
        return path
    for n in range(2, MAX_SUFFIX):
        cand = path.with_name(f"{path.name}-{n}")
        if atomic.rename_noreplace(tmp, cand):
            return cand
    raise RunExists(f"{path}: {MAX_SUFFIX} runs of this name already exist")


def _swap_in_two_steps(tmp: Path, path: Path) -> None:
    """Replace the run at path with tmp where renameat2 cannot swap them: the old run is moved
    aside to `<tmp>.old` (locked while this writer lives), tmp renamed into place, the old one
    removed. A reader between the two renames gets RunNotFound; a writer that dies between them
    leaves the old run aside, unlocked, and the next write to path puts it back
    (atomic.clean_leftovers) before anything else: the name is never left without its run by a
    later write, and the only complete copy is never deleted (issue 32: the next write deleted
    both)."""
    old = tmp.with_name(tmp.name + ".old")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # a concurrent writer's clean_leftovers leaves it alone
        os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            os.rename(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(fd)


def free_path(path) -> Path:
    """The path write_run(path) would use now without overwrite (for printing it ahead)."""
    path = Path(path)
    if not os.path.lexists(path):
        return path
    for n in range(2, MAX_SUFFIX):
        cand = path.with_name(f"{path.name}-{n}")
        if not os.path.lexists(cand):
            return cand
    raise RunExists(f"{path}: {MAX_SUFFIX} runs of this name already exist")


def update_manifest(path, updates: dict) -> dict:
    """Set top-level fields of an existing run's manifest (e.g. the `expect` block a planting
    command writes once it has measured its runs); the new manifest is checked, then replaces the
    old one in one rename. Returns the manifest. Fields that describe the files on disk
    (FILE_FIELDS) are not updatable."""
    path = Path(path)
    frozen = sorted(set(FILE_FIELDS) & set(updates))
    if frozen:
        raise ValueError(f"update_manifest: {frozen} describe the files on disk and cannot be updated")
    files = _files(path, None)
    man = _read_manifest(files.manifest, path / MANIFEST)
    man.update(updates)
    text = _manifest_text(man, str(path / MANIFEST))
    atomic.clean_leftovers(path / MANIFEST)
    with atomic.TempFile(path / MANIFEST) as t:
        t.file.write(text.encode())
        t.place(replace=True)
    return json.loads(text)   # as written (sealed again when the run is sealed)


# -- sealing a run written before format 3 ---------------------------------------------------------
def _footer_with_format(src: Path, dst, label: str) -> None:
    """Copy the parquet file src into the open file dst with FOOTER_FORMAT_KEY added to its footer's
    schema metadata: the data pages are copied byte for byte, only the footer is written again
    (pyarrow's own metadata writer, the row groups' metadata appended unchanged). A parquet file is
    `PAR1 <pages> <footer> <footer length: 4 bytes LE> PAR1`."""
    pf = pq.ParquetFile(src)
    schema = pf.schema_arrow
    schema = schema.with_metadata({**(schema.metadata or {}), validate.FOOTER_FORMAT_KEY: str(FORMAT_VERSION).encode()})
    buf = io.BytesIO()
    pq.write_metadata(schema, buf, metadata_collector=[pf.metadata])
    meta = buf.getvalue()
    if meta[:4] != b"PAR1" or meta[-4:] != b"PAR1":
        raise CorruptRun(f"{label}: pyarrow wrote an unexpected metadata file; not sealed")
    with open(src, "rb") as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
        end = f.tell()
        if tail[4:] != b"PAR1":
            raise CorruptRun(f"{label}: not a parquet file (no PAR1 at its end); not sealed")
        pages = end - 8 - struct.unpack("<I", tail[:4])[0]
        f.seek(0)
        left = pages
        while left:
            b = f.read(min(left, 8 << 20))
            if not b:
                raise CorruptRun(f"{label}: shorter than its footer says; not sealed")
            dst.write(b)
            left -= len(b)
    footer = meta[4:-8]
    dst.write(footer + struct.pack("<I", len(footer)) + b"PAR1")


def _same_tables(a: Path, b: Path, label: str) -> None:
    """The two parquet files hold the same rows, row group by row group (the footer rewrite kept
    every data page)."""
    pa_, pb = pq.ParquetFile(a), pq.ParquetFile(b)
    if pa_.num_row_groups != pb.num_row_groups or pa_.metadata.num_rows != pb.metadata.num_rows:
        raise CorruptRun(f"{label}: the rewritten footer changed the row groups; not sealed")
    for i in range(pa_.num_row_groups):
        if not pa_.read_row_group(i).equals(pb.read_row_group(i)):
            raise CorruptRun(f"{label}: row group {i} reads differently after the footer rewrite; not sealed")


def seal_run(path) -> bool:
    """Seal in place a run written before format 3 (`epscope seal`): its data are read and checked
    whole first (checksums where it has them, every row, the tables against each other); both data
    files get FOOTER_FORMAT_KEY in their footers (data pages unchanged, checked by reading them back),
    the manifest gets checksums of the new files, format_version 3 and its seal, and the sealed run
    replaces the old one in one directory swap. Stored analyses are left out (they were bound to the
    old bytes: `epscope analyze` stores them again); other files are kept. Returns False (nothing
    done) for a run sealed already. What it cannot do: tell whether a run without checksums was
    damaged before it is sealed (it seals what is there)."""
    path = Path(path)
    run = load_run(path)
    if run.sealed:
        return False
    check_events(run)
    with atomic.staged_dir(path) as tmp:
        sums = {}
        for name in DATA_FILES:
            src = run.files.events if name == EVENTS else run.files.launches
            sums[name] = _write_file(tmp / name, lambda f, src=src, name=name: _footer_with_format(src, f, str(path / name)))
            _same_tables(src, tmp / name, str(path / name))
        _keep_other_files(path, tmp)
        man = {**run.manifest, "format_version": FORMAT_VERSION, "num_events": run.num_events, "checksums": sums}
        with atomic.create_exclusive(tmp / MANIFEST) as f:
            f.write(_manifest_text(man, str(path / MANIFEST)).encode())
        _fsync_files(tmp)
        if run.version_id is not None and read_manifest(path).get("version_id") != run.version_id:
            raise RunChanged(f"{path}: rewritten while it was being sealed; not sealed")
        load_run(tmp).events   # the sealed run reads back, checked whole
        _place(tmp, path, overwrite=True)
    _fsync(path.parent)
    return True


def _keep_other_files(path: Path, tmp: Path) -> None:
    """Everything in the run directory but its data files, manifest and stale derived results,
    hard-linked (copied where links cannot be made) into the sealed run's directory."""
    for p in path.iterdir():
        if p.name in (MANIFEST, *DATA_FILES, *DERIVED_STALE) or p.name.startswith("."):
            continue
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            continue
        if p.is_dir():
            shutil.copytree(p, tmp / p.name, symlinks=True)
            continue
        try:
            os.link(p, tmp / p.name)
        except OSError:
            shutil.copy2(p, tmp / p.name)
