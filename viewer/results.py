"""Where the viewer finds a run's analyses, and keeps those it computes (Dash-free; issue 31).

A run analysed by `epscope analyze` carries them (RUN/analysis/ and RUN/analysis-summary.json:
profiler.analysis.stored and .summary). A run nobody analysed was analysed again by every viewer
start: 13-21 s a page at 10 M events, 9-16 s of server CPU and ~2 GB each time. The viewer now
computes them as `epscope analyze` does (summary.analyze) and writes them with the same writers,
by default into its results cache, one directory per run's data (a viewer writes where the user
said, issue 34: `epscope view` on the checkout's traces/ must not rewrite tracked files),

        $EPSCOPE_RESULTS_CACHE, else $XDG_CACHE_HOME/epscope/results, else ~/.cache/epscope/results
            /<SHA-256 of the run's data files' SHA-256s, 32 hex>/analysis/ and analysis-summary.json

    read back only for a run whose data files hash the same now (the results' own `data`
    hashes are compared with the run's, as in a run's directory).

EPSCOPE_VIEWER_STORE chooses: `cache` (the default, as above), `run` (into the run's directory when
it may write there, else the cache: the next start, the Runs page and `epscope report` then see an
analysed run, as after `epscope analyze`), `off` (nothing written: every start computes again).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from profiler.analysis import chunked, stored, summary
from profiler.store import cachedir

CACHE_ENV = "EPSCOPE_RESULTS_CACHE"
STORE_ENV = "EPSCOPE_VIEWER_STORE"
MODES = ("run", "cache", "off")
KEY_HEX = 32          # 128 bits of the data files' hashes name a run's cache directory

_log = logging.getLogger("epscope.viewer")
_lock = threading.Lock()
_generation = 0       # results written by this process (the Runs page rereads headlines when it moves)


def mode() -> str:
    m = os.environ.get(STORE_ENV, "cache")
    return m if m in MODES else "cache"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return cachedir.cache_root() / "results"


def _key(hashes: dict) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()[:KEY_HEX]


def cache_dir(run_dir, within=None) -> Path | None:
    """The cache directory of the run's data as it is now (None: the run has no data files)."""
    hashes = summary.data_hashes(Path(run_dir), within)
    return cache_root() / _key(hashes) if hashes else None


def load(run_dir, *, run=None) -> stored.Stored | None:
    """The run's current stored results: in its directory, else in the cache; None if neither.
    run: the loaded runreader.Run (the results must be bound to what it read)."""
    got = stored.load(run_dir, run=run)
    if got is not None:
        return got
    d = cache_dir(run_dir, None if run is None else run.within)
    return None if d is None or not d.is_dir() else stored.load(run_dir, run=run, results_dir=d / stored.DIR)


def load_summary(run_dir, *, manifest: dict | None = None, within=None) -> dict | None:
    """The run's current headline summary (what the Runs page shows): its own, else the cache's."""
    got = summary.load(Path(run_dir), manifest=manifest, within=within)
    if got is not None:
        return got
    d = cache_dir(run_dir, within)
    return None if d is None or not d.is_dir() else summary.load(Path(run_dir), manifest=manifest, within=within,
                                                                 where=d / summary.FILE)


def generation() -> int:
    return _generation


def save(run, res: chunked.Results) -> Path | None:
    """Write res (summary.analyze(run), run: profiler.store.runreader.Run) as `epscope analyze` does,
    where `mode()` says (bound to the bytes the analysis read: summary.binding; the cache keyed
    by them). Returns the results' directory, or None when nothing was written (a failure is
    logged, never raised: the page has its results)."""
    global _generation
    m = mode()
    if m == "off":
        return None
    out = None
    if m == "run" and os.access(run.path, os.W_OK | os.X_OK):
        out = _write(run, res, None)
    if out is None:
        hashes = run.data_hashes()
        out = _write(run, res, cache_root() / _key(hashes)) if hashes else None
    if out is not None:
        with _lock:
            _generation += 1
    return out


def _write(run, res, d: Path | None) -> Path | None:
    """stored.store and summary.store into the run (d None) or into the cache directory d."""
    try:
        if d is None:
            summary.store(run, res)
            return stored.store(run, res)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        summary.store(run, res, dest=d / summary.FILE)
        return stored.store(run, res, dest=d / stored.DIR)
    except Exception as e:   # a full disk, a read-only run, a race with another writer: computed, not kept
        _log.warning("could not keep the analyses of %s in %s: %s: %s", run.path, d or "the run",
                     type(e).__name__, e)
        return None
