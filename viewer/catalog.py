"""The runs the viewer may show: found only under the configured roots, named by opaque ids.

The browser never sends a path. It sends a run id, which is only ever a key into the dict built
here by walking the roots; an id that is not a key is "unknown run", whatever it contains. Every
file the viewer reads is resolved first and refused when its real path lies outside the roots
(a symlinked trace.perfetto-trace pointing at /etc/passwd is not served), and every run is read
through the profiler's run store (`profiler.store.runstore`: the same validation as `epscope report`).

Loaded runs (their event tables and per-run derived results) are cached, LRU; a run rewritten on
disk since it was loaded is loaded again (its files' identity is compared on every access).
Results computed for values a client chose (what-if parameters, a kernel name) share one
byte-bounded LRU (viewer.cache.SizedLRU).

Isolation: a damaged run is an entry with its problem (runstore.check_run never raises), a
directory under a root that cannot be read is skipped with a note (`Catalog.notes`), so
neither blocks the start, the other runs or any page. Messages shown to the browser name paths
relative to the root they were found under (`Catalog.shown`), never the server's absolute paths.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from profiler.store import runstore
from profiler.errors import RunChanged
from profiler.commands.progress import Activity

from .cache import MISSING, SizedLRU
from .jobs import READY_WAIT_S, WORKERS, Jobs

MANIFEST = runstore.MANIFEST
# Deep enough for traces/<scenario>/<run>/ and a user's results/<date>/<run>/.
MAX_DEPTH = 4
# Results keyed by client values, all runs together. One what-if on the 8-rank 1 M-event
# synthetic run holds ~40 MB (its retimed graph); 256 MB keeps the last few per run.
PARAM_CACHE_BYTES = 256 << 20
MAX_NAME = 200   # characters of a run's name shown (a manifest may hold a longer one)
EVENTS_KEY = "events"   # LoadedRun's cache key of the event table


class ViewerError(Exception):
    """A run cannot be shown; str(e) is the message the page displays (no stack trace)."""


def _signature(path: Path) -> tuple:
    """Identity of a run's files: changes when the run is rewritten (a new directory, new inodes)."""
    out = []
    for name in (MANIFEST, runstore.EVENTS, runstore.LAUNCHES):
        try:
            st = os.stat(path / name)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


@dataclass(frozen=True)
class RunEntry:
    run_id: str
    path: Path
    root: Path
    manifest: dict | None   # checked by profiler.store.validate; None when it cannot be read (`problem`)
    problem: str | None = None
    status: str = "ok"       # runstore.RunCheck.status: ok, timeout, corrupt, unreadable, newer format, empty
    num_events: int | None = None
    signature: tuple = ()
    note: str | None = None  # what is not verified (runstore.RunCheck.note: no checksums, no seal), as `epscope check` says

    @property
    def name(self) -> str:
        if self.manifest and self.manifest.get("name"):
            return str(self.manifest["name"])[:MAX_NAME]
        return self.path.name[:MAX_NAME]

    @property
    def directory(self) -> str:
        """The run's directory relative to its root (what tells runs of one name apart)."""
        rel = self.path.relative_to(self.root).as_posix()
        return rel if rel != "." else self.path.name


@dataclass
class LoadedRun:
    """A run whose manifest and launch table are in memory, its event table read on first use
    (`events`: a page drawn from stored results never reads it, issue 20), and a cache of things
    derived from it.

    cached(key, compute): a str key names one fixed result per run (an analysis, a built page)
    and is kept while the run is loaded; any other key carries parameters, often a client's
    (("what_if", phase, speedup, rank)), and lives in the catalog's byte-bounded LRU."""
    entry: RunEntry
    run: Any                      # profiler.store.runstore.Run
    launches: pd.DataFrame | None
    signature: tuple = ()
    params: SizedLRU | None = None
    read_events: Callable[[], pd.DataFrame] | None = field(default=None, repr=False)
    _token: object = field(default_factory=object)   # this load's part of its keys in `params`
    _derived: dict = field(default_factory=dict)
    _locks: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def events(self) -> pd.DataFrame:
        """The run's event table, read (and checked) on first access; ViewerError when it cannot be."""
        return self.cached(EVENTS_KEY, self.read_events or (lambda: self.run.events))

    @property
    def events_read(self) -> bool:
        """Whether the event table has been read into memory."""
        return self.has(EVENTS_KEY)

    @property
    def manifest(self) -> dict:
        return self.entry.manifest or {}

    def _get(self, key):
        if isinstance(key, str):
            return self._derived.get(key, MISSING)
        return self.params.get((self._token, key), MISSING) if self.params is not None else MISSING

    def _put(self, key, value) -> None:
        if isinstance(key, str):
            self._derived[key] = value
        elif self.params is not None:
            self.params.put((self._token, key), value)

    def has(self, key: Any) -> bool:
        """Whether `key`'s result is computed (a page draws it now or shows progress)."""
        return self._get(key) is not MISSING

    def cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        """compute() once per key while cached; concurrent callers of one key wait for it."""
        got = self._get(key)
        if got is not MISSING:
            return got
        with self._lock:                       # one lock per key in flight, dropped when done
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                got = self._get(key)
                if got is MISSING:
                    got = compute()
                    self._put(key, got)
                return got
        finally:
            with self._lock:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


def _exists(p: Path) -> bool:
    """Whether anything is at p (not followed if a link); a directory that cannot be read raises
    (PermissionError: the walk notes it), unlike os.path.lexists, which says False."""
    try:
        p.lstat()
        return True
    except FileNotFoundError:
        return False


def _slug(parts: tuple[str, ...]) -> str:
    s = "~".join(parts) if parts else "run"
    return re.sub(r"[^A-Za-z0-9_.~-]+", "_", s)


def describe_load_error(name: str, exc: BaseException) -> str:
    """One readable sentence for the page, for each typed error of the run store."""
    kind = type(exc).__name__
    detail = " ".join((str(exc).strip() or kind).split())[:600]
    if kind == "RunNotFound" or isinstance(exc, FileNotFoundError):
        return f"Run '{name}' was not found: {detail}"
    if kind == "UnsupportedRunVersion":
        return (f"Run '{name}' was written by a newer epscope than this viewer reads ({detail}). "
                "Update epscope to view it.")
    if kind == "EmptyRun":
        return f"Run '{name}' has no events to show ({detail})."
    if kind == "OutsideRoots":
        return f"Run '{name}' is not shown: {detail}"
    if kind == "RunChanged":
        return f"Run '{name}' was rewritten while it was being read; reload the page. ({detail})"
    if isinstance(exc, runstore.CorruptRun):
        return f"Run '{name}' is corrupt and cannot be read: {detail}"
    return f"Run '{name}' could not be loaded ({kind}: {detail})"


class Catalog:
    """Runs under the roots. At most `max_loaded` runs stay in memory (a 10 M-event run holds
    0.47 GB of event table plus 0.31 GB of timeline index, measured on the benchmark's run),
    least recently used evicted first."""

    def __init__(self, roots: list[Path] | list[str], cache_dir: Path | None = None, max_loaded: int = 4,
                 param_cache_bytes: int = PARAM_CACHE_BYTES, workers: int = WORKERS,
                 ready_wait_s: float = READY_WAIT_S):
        self.roots = [Path(r).expanduser().resolve() for r in roots]
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._max_loaded = max_loaded
        self._entries: dict[str, RunEntry] = {}
        self._loaded: "OrderedDict[str, LoadedRun]" = OrderedDict()
        self._params = SizedLRU(param_cache_bytes)
        # results of one run kept whether or not it is loaded, keyed by (what, run id, the run's file
        # signature): small per-run tables Compare reads of many runs at once (viewer.analyses)
        self.per_run = SizedLRU(param_cache_bytes)
        self._lock = threading.Lock()
        self._load_locks: dict[str, threading.Lock] = {}
        # loads and analyses computed in the background (viewer.jobs); ready_wait_s: how long a page
        # request waits for them before it draws a progress state
        self.jobs = Jobs(workers, wait_s=ready_wait_s)
        self.notes: list[str] = []   # directories under the roots that could not be read (last refresh)
        self.refresh()

    # -- discovery ----------------------------------------------------------------------------
    def _check(self, run_id: str, path: Path, root: Path, previous: RunEntry | None) -> RunEntry:
        """The entry of a run: the cheap validation again only when its files changed."""
        sig = _signature(path)
        if previous is not None and previous.path == path and previous.signature == sig:
            return previous
        c = runstore.check_run(path, within=self.roots)
        return RunEntry(run_id, path, root, c.manifest, self.shown(c.problem), c.status, c.num_events, sig, c.note)

    def shown(self, msg: str | None) -> str | None:
        """msg with the roots' absolute paths taken out: a path under a root reads relative to
        it (`ep-balanced/events.parquet`), the root itself by its name."""
        if msg is None:
            return None
        for r in sorted(self.roots, key=lambda r: -len(str(r))):   # the longest first: nested roots
            if r == Path(r.anchor):
                continue            # a root of "/": its paths are already relative to it, less the slash
            for form in {str(r), os.path.realpath(r)}:
                msg = msg.replace(form + os.sep, "").replace(form, r.name or ".")
        return msg

    def refresh(self) -> None:
        with self._lock:
            before = dict(self._entries)
        found: dict[str, RunEntry] = {}
        notes: list[str] = []
        for ri, root in enumerate(self.roots):
            for path in self._walk(root, notes):
                rel = path.relative_to(root).parts
                base = _slug(rel if rel else (root.name,))
                rid = base if base not in found else _slug((f"root{ri}",) + (rel or (root.name,)))
                n = 2
                while rid in found:
                    rid, n = f"{base}~{n}", n + 1
                found[rid] = self._check(rid, path, root, before.get(rid))
        with self._lock:
            self._entries = found
            self.notes = notes
            for rid in list(self._loaded):
                if rid not in found:
                    del self._loaded[rid]

    def _inside(self, p: Path) -> bool:
        real = Path(os.path.realpath(p))
        return any(real == r or r in real.parents for r in self.roots)

    def _walk(self, root: Path, notes: list[str]):
        """Run directories under root; a directory that cannot be read adds a note and is skipped."""
        try:
            if not root.is_dir():
                return
        except OSError as e:
            notes.append(f"{root.name}: skipped, cannot be read ({e.strerror or type(e).__name__})")
            return
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                if not self._inside(d):             # symlinks out of the roots are not followed
                    continue
                if _exists(d / MANIFEST):   # whatever it is (a FIFO too): the run's check says what is wrong
                    is_run = True
                else:
                    is_run = False
                    if depth >= MAX_DEPTH:
                        continue
                    children = sorted((c for c in d.iterdir() if not c.name.startswith((".", "_")) and c.is_dir()),
                                      reverse=True)
            except OSError as e:
                rel = d.relative_to(root).as_posix() if d != root else root.name
                notes.append(f"{rel}: skipped, cannot be read ({e.strerror or type(e).__name__})")
                continue
            if is_run:
                yield d                             # a run directory holds no further runs
            else:
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
            shown = run_id if isinstance(run_id, str) and len(run_id) <= 80 else "(not a run id)"
            raise ViewerError(f"Unknown run '{shown}'. Pick a run from the Runs page.")
        return e

    def default_id(self) -> str | None:
        """The first run that has a readable manifest (what pages show before the user picks)."""
        for e in self.entries():
            if e.manifest is not None and e.problem is None:
                return e.run_id
        return None

    def labels(self) -> dict[str, str]:
        """Run id -> the name a picker shows; runs sharing a name get their directory too."""
        entries = self.entries()
        counts: dict[str, int] = {}
        for e in entries:
            counts[e.name] = counts.get(e.name, 0) + 1
        return {e.run_id: e.name if counts[e.name] == 1 else f"{e.name} ({e.directory})" for e in entries}

    # -- loading ------------------------------------------------------------------------------
    def loaded(self, run_id: str | None) -> LoadedRun | None:
        """The run if it is in memory and current on disk, else None: never loads (a page asks
        this to know whether it can draw now)."""
        with self._lock:
            hit = self._loaded.get(run_id) if isinstance(run_id, str) else None
            e = self._entries.get(run_id) if isinstance(run_id, str) else None
        if hit is None or e is None or hit.signature != _signature(e.path):
            return None
        return hit

    def load(self, run_id: str | None) -> LoadedRun:
        """The run, its event table read when first used (cached, LRU, reloaded when rewritten on disk);
        ViewerError with a clear message."""
        entry = self.entry(run_id)
        sig = _signature(entry.path)
        with self._lock:
            hit = self._loaded.get(run_id)
            if hit is not None and hit.signature == sig:
                self._loaded.move_to_end(run_id)
                return hit
            lock = self._load_locks.setdefault(run_id, threading.Lock())
        with lock:
            sig = _signature(entry.path)
            with self._lock:
                hit = self._loaded.get(run_id)
                if hit is not None and hit.signature == sig:
                    return hit
                self._loaded.pop(run_id, None)    # stale: the run was rewritten
            if entry.signature != sig:          # the Runs list learns of the rewrite too
                entry = self._check(run_id, entry.path, entry.root, None)
                with self._lock:
                    if run_id in self._entries:
                        self._entries[run_id] = entry
            loaded = self._load_uncached(entry)
            with self._lock:
                self._loaded[run_id] = loaded
                while len(self._loaded) > self._max_loaded:
                    self._loaded.popitem(last=False)
            return loaded

    def _load_uncached(self, entry: RunEntry) -> LoadedRun:
        """The run's manifest and launches now (and its events' footer: their count); the event
        table itself when a page first reads `LoadedRun.events`."""
        with Activity(f"epscope view: loading {entry.name}"):
            for attempt in (1, 2):   # a rewrite racing this read: once more, then say so
                sig = _signature(entry.path)
                try:
                    run = runstore.load_run(entry.path, within=self.roots)
                    break
                except RunChanged as e:
                    if attempt == 2:
                        raise ViewerError(self.shown(describe_load_error(entry.name, e))) from e
                except Exception as e:  # every failure becomes a sentence in the page, never a traceback
                    self._mark_damaged(entry, e)
                    raise ViewerError(self.shown(describe_load_error(entry.name, e))) from e
        if run.num_events == 0:
            raise ViewerError(f"Run '{entry.name}' has no events to show (the event table is empty).")
        if run.manifest is not entry.manifest:
            entry = RunEntry(entry.run_id, entry.path, entry.root, run.manifest, None, run.status,
                             run.num_events, entry.signature, run.verified)
        return LoadedRun(entry, run, run.launches, sig, self._params,
                         read_events=lambda: self._read_events(entry, run))

    def _read_events(self, entry: RunEntry, run) -> pd.DataFrame:
        """run.events, its failures as the sentence a page shows (the Runs list learns of damage)."""
        with Activity(f"epscope view: reading {run.num_events:,} events of {entry.name}"):
            try:
                events = run.events
            except RunChanged as e:
                raise ViewerError(self.shown(describe_load_error(entry.name, e))) from e
            except Exception as e:
                self._mark_damaged(entry, e)
                raise ViewerError(self.shown(describe_load_error(entry.name, e))) from e
        if len(events) == 0:
            raise ViewerError(f"Run '{entry.name}' has no events to show (the event table is empty).")
        return events

    def _mark_damaged(self, entry: RunEntry, e: BaseException) -> None:
        """The Runs list shows what loading found (the list's own check reads footers only: a
        damaged row of events is found when the run is loaded)."""
        if entry.problem is not None:   # the list says so already, in its own words
            return
        problem = self.shown(" ".join(str(e).split())[:1000]) or type(e).__name__
        status = "corrupt" if isinstance(e, runstore.CorruptRun) else "unreadable"
        with self._lock:
            if self._entries.get(entry.run_id) is not None and self._entries[entry.run_id].signature == entry.signature:
                self._entries[entry.run_id] = dataclasses.replace(entry, problem=problem, status=status)

    # -- perfetto download ----------------------------------------------------------------------
    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            self._cache_dir = Path(tempfile.mkdtemp(prefix="epscope-viewer-"))
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        return self._cache_dir

    def perfetto_trace(self, run_id: str) -> Path:
        """The run's .perfetto-trace: the one in the run directory when its real path is inside
        the roots, else exported once per version of the run into the viewer's cache directory
        (run directories stay untouched)."""
        entry = self.entry(run_id)
        p = entry.path / runstore.TRACE
        if os.path.lexists(p):
            if not self._inside(p):
                raise ViewerError(f"Run '{entry.name}': its {runstore.TRACE} resolves outside the viewer's "
                                  "roots and is not served.")
            real = Path(os.path.realpath(p))
            if real.is_file():
                return real
        try:
            run = runstore.load_run(entry.path, within=self.roots)   # its files are confined too
        except Exception as e:
            raise ViewerError(self.shown(describe_load_error(entry.name, e))) from e
        token = run.version_id or "%x" % (hash(_signature(entry.path)) & 0xFFFFFFFF)
        # named by a digest of the run id: a run id is as long as its directory's path under the root
        # (a 250-character name made the file name too long for the file system: HTTP 500, issue 32)
        stem = hashlib.sha256(entry.run_id.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        out = self.cache_dir / f"{stem}~{token[:32]}.perfetto-trace"
        if out.is_file():
            return out
        with self._lock:
            lock = self._load_locks.setdefault("perfetto:" + run_id, threading.Lock())
        with lock:
            if not out.is_file():
                from profiler.export.perfetto import export_perfetto
                try:
                    export_perfetto(run, out, force=True)   # atomic: a temporary renamed into place
                except Exception as e:
                    raise ViewerError(self.shown(f"Could not export run '{entry.name}' to Perfetto: "
                                                 f"{type(e).__name__}: {e}")) from e
                for old in self.cache_dir.glob(f"{stem}~*.perfetto-trace"):   # earlier versions
                    if old != out:
                        old.unlink(missing_ok=True)
        return out
