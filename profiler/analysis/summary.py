"""A run's headline numbers, computed once and stored beside its data (RUN/analysis-summary.json).

The Runs page lists every run under its roots and must not analyse them all on each visit, so it
reads what `epscope analyze RUN...` stored: per kernel the op latency after entry and the entry
skew (profiler.analysis.timemodel, medians over iterations of the per-iteration sums), the late
entry, and each page's verdict. The file names the analysis version and the SHA-256 of the data
files it was computed from: a summary of other data, or of an older analysis, is stale and never
shown as current (`load` returns None and the page says the run is not analysed).

    {"format": "epscope-analysis-summary", "analysis_version": 1,
     "data": {"events.parquet": "<sha256>", "launches.parquet": "<sha256>"},
     "iterations": 2, "op_latency_ns": 561000.0, "entry_skew_ns": 20000000.0,
     "kernels": {"dispatch": {"op_latency_ns": ..., "entry_skew_ns": ...}, ...},
     "late_entry": {"rank": 1, "side": "host", "state": "alarm"} | null,
     "verdicts": {"critical_path": {"alarm": true, "cause": "host_bound", "rank": 1, "kernel": ..., "phase": ...,
                                    "headline": "..."}, "idle": {...}, "barriers": {...}}}
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from profiler import atomic, hashcache

from . import chunked
from . import late_entry as LE
from .critical_path import iteration_totals

FILE = "analysis-summary.json"
FORMAT = "epscope-analysis-summary"
# bump when anything a summary holds is computed differently (its stored copies then read as stale)
ANALYSIS_VERSION = 1
DATA_FILES = ("events.parquet", "launches.parquet")


def _file_hash(p: Path) -> str | None:
    # remembered across processes by the file's identity and change times (profiler.hashcache:
    # a 10 M-event events.parquet took 0.1-0.3 s to hash on each cold open, issue 20)
    return hashcache.sha256(p)


def data_hashes(run_dir: Path) -> dict:
    """{data file: SHA-256 hex} of the run's data files that exist."""
    out = {}
    for name in DATA_FILES:
        h = _file_hash(Path(run_dir) / name)
        if h is not None:
            out[name] = h
    return out


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def analyze(run, *, spills: chunked.Spills | None = None, engine=None) -> chunked.Results:
    """The analyses of a loaded run (profiler.runstore.Run), as `epscope analyze` and the session
    save compute them: a run of more than chunked.MAX_EVENTS events in chunks of iterations read
    one at a time (profiler.analysis.chunked: the same results, memory bounded by a chunk), on a
    distributed engine's workers when one is given. spills: where the chunks leave their what-if
    inputs and span durations (chunked.Spills; default memory)."""
    if run.num_events > chunked.MAX_EVENTS:
        return chunked.analyze_run(run, spills=spills, engine=engine)
    return chunked.analyze(run.events, registry=run.manifest.get("registry"), launches=run.launches, spills=spills)


def summarize(run, res: chunked.Results | None = None) -> dict:
    """The summary of a loaded run (profiler.runstore.Run), computed by the functions the pages
    call; res: its analyses when computed already (`analyze(run)`: their graph is read)."""
    res = analyze(run) if res is None else res
    g = res.critical.graph
    tm = res.time_model
    ki = tm.kernel_iterations()
    kernels = {str(k): {"op_latency_ns": _num(s["op_latency_ns"].median()), "entry_skew_ns": _num(s["entry_skew_ns"].median())}
               for k, s in ki.groupby("kernel", sort=False)} if len(ki) else {}
    it = tm.iterations
    le = LE.decision(g, iteration_totals(g))
    verdicts = {}
    for page, rep in (("critical_path", res.critical), ("idle", res.idle), ("barriers", res.barriers)):
        v = rep.verdict
        verdicts[page] = {"alarm": bool(v.alarm), "cause": v.cause.value, "rank": v.rank, "kernel": v.kernel,
                          "phase": v.phase, "late_entry": v.late_entry, "headline": v.headline}
    return {
        "format": FORMAT, "analysis_version": ANALYSIS_VERSION, "data": data_hashes(run.path),
        "iterations": int(len(it)),
        "op_latency_ns": _num(np.nanmedian(it["op_latency_ns"].to_numpy(float))) if len(it) and
        it["op_latency_ns"].notna().any() else None,
        "entry_skew_ns": _num(it["entry_skew_ns"].median()) if len(it) else None,
        "kernels": kernels,
        "late_entry": None if le is None else {
            "rank": le.rank, "side": le.side,
            "state": "alarm" if le.alarm else ("borderline" if le.size.borderline else "none")},
        "verdicts": verdicts,
    }


def store(run, res: chunked.Results | None = None) -> Path:
    """Compute (or take `res`, analyze(run)) and write RUN/analysis-summary.json atomically (profiler.atomic: an exclusive,
    locked temporary beside it, renamed into place; never through a link, never over a file that
    is not a regular one); returns its path."""
    data = summarize(run, res)
    dest = Path(run.path) / FILE
    with atomic.TempFile(dest) as t:
        t.file.write((json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
        t.place(replace=True)
    return dest


def load(run_dir: Path, *, check_data: bool = True) -> dict | None:
    """The stored summary when it is current (this analysis version, the run's data unchanged),
    else None. check_data=False skips hashing the data files (the caller checked them)."""
    p = Path(run_dir) / FILE
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("analysis_version") != ANALYSIS_VERSION:
        return None
    if check_data and data.get("data") != data_hashes(run_dir):
        return None
    return data
