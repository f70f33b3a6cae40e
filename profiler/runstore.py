"""Read and write a run directory (docs/design.md, "Run directory").

    RUN/manifest.json  RUN/events.parquet (zstd)  RUN/launches.parquet  [RUN/trace.perfetto-trace]

Events are stored with dictionary-encoded (categorical) columns, zstd, in row groups of
ROW_GROUP_ROWS so readers can stream them (`iter_event_batches`) with flat memory.
No torch / perfetto / dash imports at module level: this runs on the recording path of the GPU
machine (the Perfetto export is imported lazily, only when asked for or importable).
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import CorruptRun, EmptyRun, RunNotFound, UnsupportedRunVersion
from .schema import COLUMNS, LAUNCH_COLUMNS, SchemaError, coerce_events, validate_events

FORMAT = "epscope-run"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EVENTS = "events.parquet"
LAUNCHES = "launches.parquet"
TRACE = "trace.perfetto-trace"
ROW_GROUP_ROWS = 1_000_000
ZSTD_LEVEL = 9
# Runs bundled under traces/ live in git and must stay a few MB. A Perfetto trace costs 25-40
# bytes per event (25 for plain spans, more for barrier events with flows: bench_profiler.py and
# traces/synthetic-compare) against ~7 in zstd parquet, so with perfetto=None the trace is kept
# only up to this many events (<= ~4 MB of trace); `epscope export RUN` regenerates it for any run.
TRACE_KEEP_MAX_EVENTS = 100_000


@dataclass
class Run:
    path: Path
    manifest: dict
    launches: pd.DataFrame
    num_events: int = 0
    _events: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def events(self) -> pd.DataFrame:
        """The whole event table (loaded on first access)."""
        if self._events is None:
            p = self.path / EVENTS
            try:
                df = pq.read_table(p).to_pandas()
                df = coerce_events(df[list(COLUMNS)])
                validate_events(df)
            except (OSError, pa.ArrowException, SchemaError, KeyError, ValueError) as e:
                raise CorruptRun(f"{p}: cannot read events: {e}") from None
            self._events = df
        return self._events

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.path.name)

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE


def _events_table(events: pd.DataFrame) -> pa.Table:
    df = coerce_events(events[list(COLUMNS)])
    validate_events(df)
    return pa.Table.from_pandas(df, preserve_index=False)


def _launches_frame(launches) -> pd.DataFrame:
    df = launches if isinstance(launches, pd.DataFrame) else pd.DataFrame(list(launches), columns=list(LAUNCH_COLUMNS))
    missing = [c for c in LAUNCH_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"launch table lacks columns {missing}")
    return df[list(LAUNCH_COLUMNS)].astype(LAUNCH_COLUMNS)


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


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_run(path, events: pd.DataFrame, launches, manifest: dict, *, perfetto: bool | None = None) -> Path:
    """Write a run directory; returns its path.

    Every file is written to a temporary name and renamed; manifest.json comes after the tables,
    so an interrupted write never leaves a directory that reads as a complete run. The manifest
    gets `format`, `format_version`, `created` and (from the launches) `drops` when absent. perfetto=True writes trace.perfetto-trace; None writes it when the perfetto package
    imports and the run has at most TRACE_KEEP_MAX_EVENTS events (and removes a stale one).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    table = _events_table(events)
    launches = _launches_frame(launches)
    man = dict(manifest)
    man["format"] = FORMAT
    man["format_version"] = FORMAT_VERSION
    man.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    if "drops" not in man:
        per_rank = launches.groupby("rank")["dropped"].sum() if len(launches) else pd.Series(dtype="int64")
        nr = int(per_rank.index.max()) + 1 if len(per_rank) else 0
        man["drops"] = {"total": int(launches["dropped"].sum()),
                        "per_rank": [int(per_rank.get(r, 0)) for r in range(nr)]}
    man["num_events"] = table.num_rows
    _atomic_write_bytes(path / EVENTS, lambda p: pq.write_table(
        table, p, compression="zstd", compression_level=ZSTD_LEVEL, row_group_size=ROW_GROUP_ROWS))
    _atomic_write_bytes(path / LAUNCHES, lambda p: pq.write_table(
        pa.Table.from_pandas(launches, preserve_index=False), p, compression="zstd"))
    text = json.dumps(man, indent=1, default=_json_default, sort_keys=False) + "\n"
    _atomic_write_bytes(path / MANIFEST, lambda p: p.write_text(text))
    if perfetto is None:
        perfetto = importlib.util.find_spec("perfetto") is not None and table.num_rows <= TRACE_KEEP_MAX_EVENTS
        if not perfetto and (path / TRACE).exists():
            (path / TRACE).unlink()  # stale: it described the previous contents
    if perfetto:
        from .perfetto_export import export_perfetto
        export_perfetto(path, path / TRACE)
    return path


def update_manifest(path, updates: dict) -> dict:
    """Set top-level fields of an existing run's manifest (e.g. the `expect` block a planting
    command writes once it has measured its runs); atomic like write_run. Returns the manifest.
    The format fields are not updatable: a run's format is what wrote its tables."""
    path = Path(path)
    frozen = sorted({"format", "format_version"} & set(updates))
    if frozen:
        raise ValueError(f"update_manifest: {frozen} describe the files on disk and cannot be updated")
    man = _read_manifest(path)
    man.update(updates)
    text = json.dumps(man, indent=1, default=_json_default, sort_keys=False) + "\n"
    _atomic_write_bytes(path / MANIFEST, lambda p: p.write_text(text))
    return man


def _read_manifest(path: Path) -> dict:
    if not path.exists():
        raise RunNotFound(f"{path}: no such run directory")
    if not path.is_dir():
        raise RunNotFound(f"{path}: not a directory")
    mp = path / MANIFEST
    if not mp.exists():
        if (path / EVENTS).exists():
            raise CorruptRun(f"{path}: has {EVENTS} but no {MANIFEST}")
        raise RunNotFound(f"{path}: not a run directory (no {MANIFEST})")
    try:
        man = json.loads(mp.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptRun(f"{mp}: not valid JSON ({e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise CorruptRun(f"{mp}: not an {FORMAT} manifest (format={man.get('format') if isinstance(man, dict) else None!r})")
    v = man.get("format_version")
    if not isinstance(v, int):
        raise CorruptRun(f"{mp}: format_version {v!r} is not an integer")
    if v > FORMAT_VERSION:
        raise UnsupportedRunVersion(f"{path}: run format version {v} is newer than this epscope's {FORMAT_VERSION}; "
                                    "upgrade epscope to read it")
    return man


def load_run(path) -> Run:
    """Open a run directory. Events load lazily; errors are RunError subclasses naming the path."""
    path = Path(path)
    man = _read_manifest(path)
    ep = path / EVENTS
    if not ep.exists():
        raise CorruptRun(f"{path}: manifest present but {EVENTS} missing")
    try:
        meta = pq.ParquetFile(ep).metadata
        names = set(meta.schema.names)
    except (OSError, pa.ArrowException) as e:
        raise CorruptRun(f"{ep}: not a readable parquet file ({e})") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise CorruptRun(f"{ep}: lacks event columns {missing}")
    if meta.num_rows == 0:
        raise EmptyRun(f"{path}: the run has no events")
    lp = path / LAUNCHES
    try:
        launches = pq.read_table(lp).to_pandas() if lp.exists() else pd.DataFrame(columns=list(LAUNCH_COLUMNS))
        launches = _launches_frame(launches)
    except (OSError, pa.ArrowException, SchemaError, ValueError, TypeError) as e:
        raise CorruptRun(f"{lp}: cannot read launches ({e})") from None
    return Run(path, man, launches, int(meta.num_rows))


def list_runs(root) -> list[Path]:
    """Run directories (those holding manifest.json) under root, sorted; root itself counts."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.rglob(MANIFEST))


def iter_event_batches(path, batch_rows: int = 1_000_000, columns: list[str] | None = None):
    """Stream RUN/events.parquet as DataFrames of at most batch_rows rows (categoricals kept)."""
    path = Path(path)
    ep = path / EVENTS if path.is_dir() else path
    try:
        pf = pq.ParquetFile(ep)
    except (OSError, pa.ArrowException) as e:
        raise CorruptRun(f"{ep}: not a readable parquet file ({e})") from None
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        yield batch.to_pandas()
