"""Read and write a run directory (docs/design.md, "Run directory").

    RUN/manifest.json  RUN/events.parquet (zstd)  RUN/launches.parquet  [RUN/trace.perfetto-trace]

Events are stored with dictionary-encoded (categorical) columns, zstd, in row groups of
ROW_GROUP_ROWS so readers can stream them (`iter_event_batches`) with flat memory.

Writes are atomic and never replace a run unasked: a run is written into a hidden temporary
directory beside its destination and renamed into place (an existing name gets a suffixed one,
`NAME-2`, unless overwrite=True, which swaps the directories in one step). Every write gets a
version id, in the manifest and in both parquet files' metadata; a reader whose files carry
different ids read across a rewrite, and says so (RunChanged / a retry) instead of mixing two
versions. Runs written before version ids (format_version 1 without `version_id`) still open.

No torch / perfetto / dash imports at module level: this runs on the recording path of the GPU
machine (the Perfetto export is imported lazily, only when asked for or importable).
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import errno
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import validate
from .errors import CorruptRun, EmptyRun, RunChanged, RunError, RunExists, RunNotFound
from .schema import COLUMNS, LAUNCH_COLUMNS
from .validate import FORMAT, FORMAT_VERSION

MANIFEST = "manifest.json"
EVENTS = "events.parquet"
LAUNCHES = "launches.parquet"
TRACE = "trace.perfetto-trace"
VERSION_KEY = b"epscope.version_id"   # parquet schema metadata key holding the write's version id
ROW_GROUP_ROWS = 1_000_000
ZSTD_LEVEL = 9
# Runs bundled under traces/ live in git and must stay a few MB. A Perfetto trace costs 25-40
# bytes per event (25 for plain spans, more for barrier events with flows: bench_profiler.py and
# traces/synthetic-compare) against ~7 in zstd parquet, so with perfetto=None the trace is kept
# only up to this many events (<= ~4 MB of trace); `epscope export RUN` regenerates it for any run.
TRACE_KEEP_MAX_EVENTS = 100_000
# A reader that meets two versions retries this many times (a writer swaps a directory in one
# rename, so the second read sees one version unless another write lands in between).
READ_RETRIES = 3
MAX_SUFFIX = 10_000


class OutsideRoots(RunError):
    """A run file resolves (through a symlink) to a path outside the roots the reader allows."""


@dataclass(frozen=True)
class RunFiles:
    """The resolved paths of a run's files (symlinks followed once, at open time)."""
    manifest: Path
    events: Path | None     # None when missing (an error once the manifest has been read)
    launches: Path | None


@dataclass
class Run:
    path: Path
    manifest: dict
    launches: pd.DataFrame
    num_events: int = 0
    files: RunFiles | None = None
    _events: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def version_id(self) -> str | None:
        """Id of the write this run came from (None for runs written before version ids)."""
        return self.manifest.get("version_id")

    @property
    def events(self) -> pd.DataFrame:
        """The whole event table (loaded on first access, checked against the manifest's version)."""
        if self._events is None:
            p = self.files.events if self.files else self.path / EVENTS
            try:
                # one open file for footer and data: pq.read_table(path) opens the path twice, and
                # a rewrite between the two opens would pair one write's footer with another's rows
                with pa.OSFile(str(p)) as f:
                    pf = pq.ParquetFile(f)
                    got = _version_of(pf.schema_arrow)
                    if self.version_id is not None and got != self.version_id:
                        raise RunChanged(f"{self.path}: the run was rewritten since it was opened (events of "
                                         f"version {got}, manifest of {self.version_id}); open it again")
                    missing = [c for c in COLUMNS if c not in pf.schema_arrow.names]
                    if missing:
                        raise CorruptRun(f"{p}: lacks event columns {missing}")
                    df = _read_event_columns(pf, str(p))
            except (OSError, pa.ArrowException) as e:
                raise CorruptRun(f"{p}: cannot read events: {e}") from None
            self._events = validate.events(df, str(p))
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
        """The phase registries the run was recorded with, as profiler.registry.Registry objects."""
        from .registry import Registry
        return {fam: Registry.from_dict(d) for fam, d in (self.manifest.get("registry") or {}).items()}

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE


_ARROW_TYPES = {"int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "bool": pa.bool_()}


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


def _read_event_columns(pf: pq.ParquetFile, file: str) -> pd.DataFrame:
    """The event columns as a DataFrame, read one row group at a time into arrays allocated once.

    Against pq.read_table(...).to_pandas() on 10 M events (benchmarks/bench_load.py): half the
    CPU time and 0.7 instead of 1.1 GB peak, since only one row group of Arrow buffers is alive
    at a time. A file of other types (nulls, other widths, plain strings) takes the general
    path, and profiler.validate then says what is wrong with it."""
    if not _stored_as_written(pf.schema_arrow):
        table = pf.read(columns=list(COLUMNS))
        return table.to_pandas(split_blocks=True, self_destruct=True)
    n = pf.metadata.num_rows
    out: dict[str, object] = {c: np.empty(n, t) for c, t in COLUMNS.items() if t != "category"}
    dict_chunks: dict[str, list] = {c: [] for c, t in COLUMNS.items() if t == "category"}
    off = 0
    for i in range(pf.num_row_groups):
        rg = pf.read_row_group(i, columns=list(COLUMNS))
        for c in COLUMNS:
            col = rg.column(c)
            if c in dict_chunks:
                dict_chunks[c].extend(col.chunks)
                continue
            if col.null_count:
                raise validate.InvalidEvents(f"{file}: column {c!r}: {col.null_count:,} rows are missing")
            o = off
            for ch in col.chunks:
                out[c][o:o + len(ch)] = ch.to_numpy(zero_copy_only=False)
                o += len(ch)
        off += rg.num_rows
        del rg
    for c, chunks in dict_chunks.items():
        arr = pa.chunked_array(chunks, type=pf.schema_arrow.field(c).type).unify_dictionaries()
        cats = arr.chunk(0).dictionary.to_pylist() if arr.num_chunks else []
        codes = [ch.indices.fill_null(-1).to_numpy(zero_copy_only=False) for ch in arr.chunks]
        codes = np.concatenate(codes).astype(np.int32, copy=False) if codes else np.zeros(0, np.int32)
        out[c] = pd.Categorical.from_codes(codes, categories=cats, validate=False)
    return pd.DataFrame(out, copy=False)[list(COLUMNS)]


# -- writing ----------------------------------------------------------------------------------
def _events_table(events: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(validate.events(events, "events to write"), preserve_index=False)


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
    return table.replace_schema_metadata({**(table.schema.metadata or {}), VERSION_KEY: version_id.encode()})


def _version_of(schema: pa.Schema) -> str | None:
    v = (schema.metadata or {}).get(VERSION_KEY)
    return v.decode("ascii", "replace") if v is not None else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_run(path, events: pd.DataFrame, launches, manifest: dict, *, perfetto: bool | None = None,
              overwrite: bool = False) -> Path:
    """Write a run directory; returns its path, which is `path` or, when `path` exists and
    overwrite is False, the first free `path-2`, `path-3`, ...

    The run is written into a temporary directory beside `path` and renamed into place, so a
    reader sees the old run or the new one, never a half-written one, and a write that fails
    leaves the old run as it was. overwrite=True replaces an existing run directory (refused for
    anything else). The manifest gets `format`, `format_version`, `version_id`, `created`,
    `num_events` and (from the launches) `drops` when absent. perfetto=True writes
    trace.perfetto-trace; None writes it when the perfetto package imports and the run has at
    most TRACE_KEEP_MAX_EVENTS events.
    """
    path = Path(path)
    table = _events_table(events)
    launches = _launches_frame(launches, "launches to write")
    man = dict(manifest)
    man["format"] = FORMAT
    man["format_version"] = FORMAT_VERSION
    man["version_id"] = vid = uuid.uuid4().hex
    man.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    if "drops" not in man:
        per_rank = launches.groupby("rank")["dropped"].sum() if len(launches) else pd.Series(dtype="int64")
        nr = int(per_rank.index.max()) + 1 if len(per_rank) else 0
        man["drops"] = {"total": int(launches["dropped"].sum()),
                        "per_rank": [int(per_rank.get(r, 0)) for r in range(nr)]}
    man["num_events"] = table.num_rows
    text = json.dumps(man, indent=1, default=_json_default, sort_keys=False) + "\n"
    validate.manifest_text(text, f"manifest of {path}")   # what we write must read back

    path.parent.mkdir(parents=True, exist_ok=True)
    # hidden (list_runs and the viewer skip it), beside the destination (one file system: the
    # rename is atomic); os.mkdir applies the umask as for any directory the user makes
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    os.mkdir(tmp)
    try:
        pq.write_table(_with_version(table, vid), tmp / EVENTS, compression="zstd",
                       compression_level=ZSTD_LEVEL, row_group_size=ROW_GROUP_ROWS)
        pq.write_table(_with_version(pa.Table.from_pandas(launches, preserve_index=False), vid), tmp / LAUNCHES,
                       compression="zstd")
        (tmp / MANIFEST).write_text(text)
        if perfetto is None:
            perfetto = importlib.util.find_spec("perfetto") is not None and table.num_rows <= TRACE_KEEP_MAX_EVENTS
        if perfetto:
            from .perfetto_export import export_perfetto
            export_perfetto(tmp, tmp / TRACE)
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        final = _place(tmp, path, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(path.parent)
    return final


# renameat2(2) flags (linux/fs.h): fail if the target exists; swap source and target atomically.
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2 on Linux; False where the system or file system lacks it (the caller falls back)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(e, os.strerror(e), str(dst))


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Move src to dst unless dst exists; False when it does."""
    try:
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return True
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    if os.path.lexists(dst):   # fallback: a writer racing between this check and the rename loses
        return False
    os.rename(src, dst)
    return True


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and ((p / MANIFEST).is_file() or not any(p.iterdir()))


def _place(tmp: Path, path: Path, overwrite: bool) -> Path:
    if overwrite and os.path.lexists(path):
        if not _is_run_dir(path):
            raise RunExists(f"{path} exists and is not a run directory; not replacing it")
        if _renameat2(tmp, path, _RENAME_EXCHANGE):   # one step: readers see old or new
            shutil.rmtree(tmp)                          # tmp now holds the old run
            return path
        old = tmp.with_name(tmp.name + ".old")         # two steps: a reader between them gets RunNotFound
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
        return path
    if _rename_noreplace(tmp, path):
        return path
    for n in range(2, MAX_SUFFIX):
        cand = path.with_name(f"{path.name}-{n}")
        if _rename_noreplace(tmp, cand):
            return cand
    raise RunExists(f"{path}: {MAX_SUFFIX} runs of this name already exist")


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
    old one in one rename. Returns the manifest. Fields that describe the files on disk (format,
    format_version, version_id, num_events) are not updatable."""
    path = Path(path)
    frozen = sorted({"format", "format_version", "version_id", "num_events"} & set(updates))
    if frozen:
        raise ValueError(f"update_manifest: {frozen} describe the files on disk and cannot be updated")
    files = _files(path, None)
    man = _read_manifest(files.manifest)
    man.update(updates)
    text = json.dumps(man, indent=1, default=_json_default, sort_keys=False) + "\n"
    validate.manifest_text(text, str(path / MANIFEST))
    tmp = path / f".{MANIFEST}.{uuid.uuid4().hex}.tmp"
    try:
        tmp.write_text(text)
        _fsync(tmp)
        os.replace(tmp, path / MANIFEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return man


# -- reading ----------------------------------------------------------------------------------
def _resolve(p: Path, within: Sequence[Path] | None) -> Path:
    real = Path(os.path.realpath(p))
    if within is not None and not any(real == r or r in real.parents for r in within):
        raise OutsideRoots(f"{p}: resolves to {real}, outside the allowed roots; not read")
    return real


def _files(path: Path, within: Sequence[Path] | None) -> RunFiles:
    if not path.exists():
        raise RunNotFound(f"{path}: no such run directory")
    if not path.is_dir():
        raise RunNotFound(f"{path}: not a directory")
    within = [Path(os.path.realpath(r)) for r in within] if within is not None else None
    _resolve(path, within)
    mp, ep, lp = path / MANIFEST, path / EVENTS, path / LAUNCHES
    if not mp.exists():
        if ep.exists():
            raise CorruptRun(f"{path}: has {EVENTS} but no {MANIFEST}")
        raise RunNotFound(f"{path}: not a run directory (no {MANIFEST})")
    files = RunFiles(_resolve(mp, within), _resolve(ep, within) if ep.exists() else None,
                     _resolve(lp, within) if lp.exists() else None)
    for f in (files.manifest, files.events, files.launches):
        if f is not None and not f.is_file():
            raise CorruptRun(f"{f}: not a regular file")
    return files


def _need_events(path: Path, files: RunFiles) -> Path:
    if files.events is None:
        raise CorruptRun(f"{path}: manifest present but {EVENTS} missing")
    return files.events


def read_manifest(path, *, within: Sequence[Path] | None = None) -> dict:
    """The run's manifest, checked (profiler.validate); RunError subclasses naming the path."""
    return _read_manifest(_files(Path(path), within).manifest)


def _read_manifest(mp: Path) -> dict:
    try:
        return validate.manifest_file(mp)
    except OSError as e:
        raise CorruptRun(f"{mp}: cannot be read ({e.strerror or e})") from None


def _events_footer(ep: Path) -> pq.FileMetaData:
    try:
        with pa.OSFile(str(ep)) as f:
            meta = pq.ParquetFile(f).metadata
    except (OSError, pa.ArrowException) as e:
        raise CorruptRun(f"{ep}: not a readable parquet file ({e})") from None
    missing = [c for c in COLUMNS if c not in set(meta.schema.names)]
    if missing:
        raise CorruptRun(f"{ep}: lacks event columns {missing}")
    return meta


def _read_launches(lp: Path | None) -> tuple[pd.DataFrame, str | None]:
    if lp is None:
        return _launches_frame(pd.DataFrame(columns=list(LAUNCH_COLUMNS))), None
    try:
        with pa.OSFile(str(lp)) as f:
            t = pq.read_table(f)
        return _launches_frame(t.to_pandas(), str(lp)), _version_of(t.schema)
    except (OSError, pa.ArrowException) as e:
        raise CorruptRun(f"{lp}: cannot read launches ({e})") from None
    except CorruptRun as e:
        raise CorruptRun(f"{lp}: cannot read launches ({str(e).removeprefix(str(lp) + ': ')})") from None


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

    within: roots the run's files must resolve into (a symlinked file pointing elsewhere raises
    OutsideRoots). A run being rewritten while it is opened is read again (READ_RETRIES)."""
    path = Path(path)
    for attempt in range(READ_RETRIES):
        files = _files(path, within)
        man = _read_manifest(files.manifest)
        meta = _events_footer(_need_events(path, files))
        launches, lver = _read_launches(files.launches)
        try:
            _one_version(path, man, (EVENTS, _version_of(meta.schema.to_arrow_schema())),
                         *([(LAUNCHES, lver)] if files.launches is not None else []))
        except RunChanged as e:
            if attempt + 1 == READ_RETRIES:   # not a rewrite in progress: files copied across runs
                raise CorruptRun(str(e)) from None
            time.sleep(0.01 * (attempt + 1))
            continue
        break
    if meta.num_rows == 0:
        raise EmptyRun(f"{path}: the run has no events")
    n = man.get("num_events")
    if n is not None and n != meta.num_rows:
        raise CorruptRun(f"{path}: manifest.json says {n:,} events, {EVENTS} holds {meta.num_rows:,}")
    return Run(path, man, launches, int(meta.num_rows), files)


@dataclass(frozen=True)
class RunCheck:
    """A run's state from its manifest and parquet footers only (no table read): what a list of
    runs shows. `problem` is one line when the run cannot be opened; `status` is "ok", the
    recording's own status (e.g. "timeout"), or the kind of problem."""
    path: Path
    manifest: dict | None
    status: str
    problem: str | None = None
    num_events: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.status == "ok"


def check_run(path, *, within: Sequence[Path] | None = None) -> RunCheck:
    """Cheap validation: manifest checked, both parquet footers readable, row counts and version
    ids agreeing. Never raises for a bad run (the problem is in the result)."""
    from .errors import InvalidManifest, UnsupportedRunVersion

    path = Path(path)
    man = None
    try:
        files = _files(path, within)
        man = _read_manifest(files.manifest)
        run = load_run(path, within=within)
    except UnsupportedRunVersion as e:
        return RunCheck(path, None, "newer format", str(e))
    except EmptyRun as e:
        return RunCheck(path, man, "empty", str(e), 0)
    except (InvalidManifest, OutsideRoots, RunNotFound) as e:
        return RunCheck(path, None, "unreadable", str(e))
    except RunError as e:
        return RunCheck(path, man, "corrupt", str(e))
    return RunCheck(path, run.manifest, run.status, None, run.num_events)


def list_runs(root) -> list[Path]:
    """Run directories (those holding manifest.json) under root, sorted; root itself counts.
    Hidden directories (a write in progress is one) are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.rglob(MANIFEST)
                  if not any(part.startswith(".") for part in p.parent.relative_to(root).parts))


def iter_event_batches(path, batch_rows: int = 1_000_000, columns: list[str] | None = None):
    """Stream RUN/events.parquet as DataFrames of at most batch_rows rows (categoricals kept;
    with all columns, each batch is checked as load_run checks the whole table)."""
    path = Path(path)
    ep = path / EVENTS if path.is_dir() else path
    try:
        pf = pq.ParquetFile(ep)
        for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
            df = batch.to_pandas()
            yield validate.events(df, str(ep)) if columns is None else df
    except (OSError, pa.ArrowException) as e:
        raise CorruptRun(f"{ep}: not a readable parquet file ({e})") from None


def check_events(run: Run) -> None:
    """Stream the columns every reader relies on (kind, begin_ns, end_ns) and check them as
    load_run's full read does, with flat memory: what `epscope export` runs before it writes."""
    for df in iter_event_batches(run.files.events if run.files else run.path,
                                 columns=["kind", "begin_ns", "end_ns"]):
        validate.event_times(df, str(run.path / EVENTS))
