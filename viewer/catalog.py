"""The runs the viewer may show: found only under the configured roots, named by opaque ids.

The browser never sends a path. It sends a run id, which is only ever a key into the dict built
here by walking the roots; an id that is not a key is "unknown run", whatever it contains. A
symlink under a root that resolves outside that root is skipped, so nothing outside the roots is
reachable. Loaded runs (their event tables and per-run derived indices) are cached: the timeline
and analysis pages recompute nothing when the user switches between them.
"""
from __future__ import annotations

import json
import re
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

MANIFEST = "manifest.json"
# Deep enough for traces/<scenario>/<run>/ and a user's results/<date>/<run>/.
MAX_DEPTH = 4


class ViewerError(Exception):
    """A run cannot be shown; str(e) is the message the page displays (no stack trace)."""


@dataclass(frozen=True)
class RunEntry:
    run_id: str
    path: Path
    root: Path
    manifest: dict | None   # None when manifest.json cannot be read; `problem` says why
    problem: str | None = None

    @property
    def name(self) -> str:
        if self.manifest and self.manifest.get("name"):
            return str(self.manifest["name"])
        return self.path.name


@dataclass
class LoadedRun:
    """A run with its event table in memory and a cache of things derived from it."""
    entry: RunEntry
    run: Any                      # profiler.runstore.Run
    events: pd.DataFrame
    launches: pd.DataFrame | None
    _derived: dict = field(default_factory=dict)
    _locks: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def manifest(self) -> dict:
        return self.entry.manifest or {}

    def cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        """compute() once per key per loaded run; concurrent callers of one key wait for it."""
        if key in self._derived:
            return self._derived[key]
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._derived:
                self._derived[key] = compute()
            return self._derived[key]


def _slug(parts: tuple[str, ...]) -> str:
    s = "~".join(parts) if parts else "run"
    return re.sub(r"[^A-Za-z0-9_.~-]+", "_", s)


def _read_manifest(path: Path) -> tuple[dict | None, str | None]:
    try:
        with open(path / MANIFEST, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"manifest.json unreadable: {e}"
    if not isinstance(m, dict):
        return None, "manifest.json is not a JSON object"
    return m, None


def describe_load_error(name: str, exc: BaseException) -> str:
    """One readable sentence for the page, for each typed error of the run store."""
    kind = type(exc).__name__
    detail = str(exc).strip() or kind
    if kind == "RunNotFound" or isinstance(exc, FileNotFoundError):
        return f"Run '{name}' was not found: {detail}"
    if kind == "UnsupportedRunVersion":
        return (f"Run '{name}' was written by a newer epscope than this viewer reads ({detail}). "
                "Update epscope to view it.")
    if kind == "EmptyRun":
        return f"Run '{name}' has no events to show ({detail})."
    if kind == "CorruptRun":
        return f"Run '{name}' is corrupt and cannot be read: {detail}"
    return f"Run '{name}' could not be loaded ({kind}: {detail})"


class Catalog:
    """Runs under the roots. At most `max_loaded` runs stay in memory (a 10 M-event run holds
    0.47 GB of event table plus 0.31 GB of timeline index, measured on the benchmark's run), least recently used evicted first."""

    def __init__(self, roots: list[Path] | list[str], cache_dir: Path | None = None, max_loaded: int = 4):
        self.roots = [Path(r).expanduser().resolve() for r in roots]
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._max_loaded = max_loaded
        self._entries: dict[str, RunEntry] = {}
        self._loaded: "OrderedDict[str, LoadedRun]" = OrderedDict()
        self._lock = threading.Lock()
        self._load_locks: dict[str, threading.Lock] = {}
        self.refresh()

    # -- discovery ----------------------------------------------------------------------------
    def refresh(self) -> None:
        found: dict[str, RunEntry] = {}
        for ri, root in enumerate(self.roots):
            for path in self._walk(root):
                rel = path.relative_to(root).parts
                base = _slug(rel if rel else (root.name,))
                rid = base if base not in found else _slug((f"root{ri}",) + (rel or (root.name,)))
                n = 2
                while rid in found:
                    rid, n = f"{base}~{n}", n + 1
                manifest, problem = _read_manifest(path)
                found[rid] = RunEntry(rid, path, root, manifest, problem)
        with self._lock:
            self._entries = found
            for rid in list(self._loaded):
                if rid not in found:
                    del self._loaded[rid]

    @staticmethod
    def _walk(root: Path):
        if not root.is_dir():
            return
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                real = d.resolve()
                real.relative_to(root)          # symlinks out of the root are not followed
            except (OSError, ValueError):
                continue
            if (d / MANIFEST).is_file():
                yield d
                continue                        # a run directory holds no further runs
            if depth >= MAX_DEPTH:
                continue
            try:
                children = sorted((c for c in d.iterdir() if c.is_dir() and not c.name.startswith((".", "_"))),
                                  reverse=True)
            except OSError:
                continue
            stack.extend((c, depth + 1) for c in children)

    def entries(self) -> list[RunEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.run_id)

    def ids(self) -> list[str]:
        return [e.run_id for e in self.entries()]

    def entry(self, run_id: str | None) -> RunEntry:
        with self._lock:
            e = self._entries.get(run_id) if isinstance(run_id, str) else None
        if e is None:
            raise ViewerError(f"Unknown run '{run_id}'. Pick a run from the Runs page.")
        return e

    def default_id(self) -> str | None:
        """The first run that has a readable manifest (what pages show before the user picks)."""
        for e in self.entries():
            if e.manifest is not None:
                return e.run_id
        return None

    # -- loading ------------------------------------------------------------------------------
    def load(self, run_id: str | None) -> LoadedRun:
        """The run with its events in memory (cached, LRU); ViewerError with a clear message."""
        entry = self.entry(run_id)
        with self._lock:
            if run_id in self._loaded:
                self._loaded.move_to_end(run_id)
                return self._loaded[run_id]
            lock = self._load_locks.setdefault(run_id, threading.Lock())
        with lock:
            with self._lock:
                if run_id in self._loaded:
                    return self._loaded[run_id]
            loaded = self._load_uncached(entry)
            with self._lock:
                self._loaded[run_id] = loaded
                while len(self._loaded) > self._max_loaded:
                    self._loaded.popitem(last=False)
            return loaded

    def _load_uncached(self, entry: RunEntry) -> LoadedRun:
        from profiler import runstore  # the viewer's only route to run files

        if entry.problem:
            raise ViewerError(f"Run '{entry.name}' is corrupt and cannot be read: {entry.problem}")
        try:
            run = runstore.load_run(entry.path)
            events = run.events
            if callable(events):
                events = events()
            if not isinstance(events, pd.DataFrame):
                events = pd.DataFrame(events)
            launches = getattr(run, "launches", None)
            if callable(launches):
                launches = launches()
        except ViewerError:
            raise
        except Exception as e:  # every failure becomes a sentence in the page, never a traceback
            raise ViewerError(describe_load_error(entry.name, e)) from e
        if len(events) == 0:
            raise ViewerError(f"Run '{entry.name}' has no events to show (the event table is empty).")
        manifest = getattr(run, "manifest", None)
        if isinstance(manifest, dict) and manifest is not entry.manifest:
            entry = RunEntry(entry.run_id, entry.path, entry.root, manifest, None)
        return LoadedRun(entry, run, events, launches if isinstance(launches, pd.DataFrame) else None)

    # -- perfetto download ----------------------------------------------------------------------
    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            self._cache_dir = Path(tempfile.mkdtemp(prefix="epscope-viewer-"))
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        return self._cache_dir

    def perfetto_trace(self, run_id: str) -> Path:
        """The run's .perfetto-trace: the one in the run directory, else exported once on demand
        into the viewer's cache directory (run directories under traces/ stay untouched)."""
        entry = self.entry(run_id)
        for name in ("trace.perfetto-trace",):
            p = entry.path / name
            if p.is_file():
                return p
        out = self.cache_dir / f"{entry.run_id}.perfetto-trace"
        if out.is_file():
            return out
        with self._lock:
            lock = self._load_locks.setdefault("perfetto:" + run_id, threading.Lock())
        with lock:
            if not out.is_file():
                from profiler.perfetto_export import export_perfetto
                tmp = out.with_suffix(".partial")
                try:
                    export_perfetto(entry.path, tmp)
                except Exception as e:
                    tmp.unlink(missing_ok=True)
                    raise ViewerError(f"Could not export run '{entry.name}' to Perfetto: "
                                      f"{type(e).__name__}: {e}") from e
                tmp.replace(out)
        return out
