"""A run's headline numbers, computed once and stored beside its data (RUN/analysis-summary.json).

The Runs page lists every run under its roots and must not analyse them all on each visit, so it
reads what `epscope analyze RUN...` stored: per kernel the op latency after entry and the entry
skew (profiler.analysis.timemodel, medians over iterations of the per-iteration sums), the late
entry, and each page's verdict.

Its envelope (issue 32; shared with RUN/analysis/, profiler.analysis.stored): what it was computed
from, taken from the Run that was analysed (`binding`), not from the files when it is written: the
SHA-256 of the exact bytes read (runreader.Run.data_hashes: a run re-recorded while `epscope
analyze` ran got the old run's verdicts marked current in 2 of 3 trials before), the digest of the
manifest's registry (a registry changed through update_manifest left results "current"), the
analysis version; and a seal over the whole file (validate.sealed: 179 of 750 bit flips of stored
results were served as current before). A summary whose seal, envelope or format does not match
the run as it is now is never shown (`load` returns None and the page says the run is not
analysed); `mismatch` says why (`epscope check`). It is read as a regular file of at most
MAX_BYTES, inside the caller's roots.

    {"format": "epscope-analysis-summary", "format_version": 2, "analysis_version": 2,
     "data": {"events.parquet": "<sha256>", "launches.parquet": "<sha256>"}, "registry": "sha256:<hex>",
     "iterations": 2, "op_latency_ns": 561000.0, "entry_skew_ns": 20000000.0,
     "kernels": {"dispatch": {"op_latency_ns": ..., "entry_skew_ns": ...}, ...},
     "late_entry": {"rank": 1, "side": "host", "state": "alarm" | "borderline" | "none",
                    "late_in": {"0": 0, "1": 2}, "decision": {<decision.to_json>}, "notes": ["..."]} | null,
     "verdicts": {"critical_path": {"alarm": true, "cause": "host_bound", "rank": 1, "kernel": ..., "phase": ...,
                                    "headline": "...", "facts": [...], "notes": [...],
                                    "decisions": [{<decision.to_json>}, ...]}, "idle": {...}, "barriers": {...}},
     "op_before_entry": {...} | null, "seal": "sha256:<hex>"}

The late entry and every verdict are the pages' own objects (profiler.analysis.late_entry, the
reports' verdicts): the Runs page shows the same sentences and numbers as the pages.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from profiler.store import atomic, hashcache, validate
from profiler.errors import EpscopeError

from . import chunked
from . import decision as D
from . import late_entry as LE
from .critical_path import iteration_totals

FILE = "analysis-summary.json"
FORMAT = "epscope-analysis-summary"
# bump when anything a summary holds is computed differently (its stored copies then read as stale)
ANALYSIS_VERSION = 2
DATA_FILES = ("events.parquet", "launches.parquet")
# the envelope's format (1: no seal, no registry, data hashes taken when written: never current)
FORMAT_VERSION = 2
# The bundled runs' summaries hold 2.5 kB at most; a run of a hundred kernels ~12 kB. A 90 MB one
# added 2.2 GB kept by the Runs page's cache (issue 32).
MAX_BYTES = 1 << 20


class Stale(ValueError):
    """A stored result of another format than this epscope writes: not current, not damaged."""


def _file_hash(p: Path, within=None) -> str | None:
    # remembered across processes by the file's identity and change times (profiler.store.hashcache:
    # a 10 M-event events.parquet took 0.1-0.3 s to hash on each cold open, issue 20)
    return hashcache.sha256(p, within=within)


def data_hashes(run_dir: Path, within=None) -> dict:
    """{data file: SHA-256 hex} of the run's data files that exist, as they are now (regular
    files inside `within` only)."""
    out = {}
    for name in DATA_FILES:
        h = _file_hash(Path(run_dir) / name, within)
        if h is not None:
            out[name] = h
    return out


def registry_digest(manifest: dict) -> str:
    """The digest of the manifest's phase registries (what the analyses read of it)."""
    return validate.digest(manifest.get("registry") or {})


def binding(run) -> dict:
    """What results computed from the loaded run (runreader.Run) are bound to: the hashes of the
    bytes it read (pinned by the reads: the data analysed, whatever the files hold now), its
    registry, this analysis version."""
    return {"analysis_version": ANALYSIS_VERSION, "data": run.data_hashes(), "registry": registry_digest(run.manifest)}


def mismatch(doc: dict, run_dir: Path, *, run=None, manifest: dict | None = None, within=None,
             check_data: bool = True) -> str | None:
    """Why a stored result's envelope (`binding` in doc) does not fit the run now, or None when it
    does: another analysis version, another registry than the manifest's (`manifest`, else the
    Run's, else read), other data than the files hold now and than `run` read (check_data=False
    skips the files: the caller compared them)."""
    if doc.get("analysis_version") != ANALYSIS_VERSION:
        return f"of analysis version {doc.get('analysis_version')!r}, this epscope computes {ANALYSIS_VERSION}"
    if manifest is None:
        if run is not None:
            manifest = run.manifest
        else:
            from profiler.store.runreader import read_manifest
            try:
                manifest = read_manifest(run_dir, within=within)
            except EpscopeError as e:
                return f"the run's manifest cannot be read ({type(e).__name__})"
    if doc.get("registry") != registry_digest(manifest):
        return "computed with another phase registry than the manifest's"
    if run is not None and doc.get("data") != run.data_hashes():
        return "computed from other data than the run holds"
    if check_data and doc.get("data") != data_hashes(run_dir, within):
        return "computed from other data than the run's files hold now"
    return None


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def analyze(run, *, spills: chunked.Spills | None = None, engine=None) -> chunked.Results:
    """The analyses of a loaded run (profiler.store.runstore.Run), as `epscope analyze` and the session
    save compute them: a run of more than chunked.MAX_EVENTS events in chunks of iterations read
    one at a time (profiler.analysis.chunked: the same results, memory bounded by a chunk), on a
    distributed engine's workers when one is given. spills: where the chunks leave their what-if
    inputs and span durations (chunked.Spills; default memory)."""
    if run.num_events > chunked.MAX_EVENTS:
        # max_events read now, not bound at definition (tests lower chunked.MAX_EVENTS)
        return chunked.analyze_run(run, max_events=chunked.MAX_EVENTS, spills=spills, engine=engine)
    return chunked.analyze(run.events, registry=run.manifest.get("registry"), launches=run.launches, spills=spills)


def summarize(run, res: chunked.Results | None = None) -> dict:
    """The summary of a loaded run (profiler.store.runstore.Run), computed by the functions the pages
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
    pages = {"critical_path": res.critical.verdict, "idle": res.idle.verdict, "barriers": res.barriers.verdict}
    for page, v in _with_steps(run, tm, pages, le).items():
        verdicts[page] = {"alarm": bool(v.alarm), "cause": v.cause.value, "rank": v.rank, "kernel": v.kernel,
                          "phase": v.phase, "late_entry": v.late_entry, "headline": v.headline,
                          "facts": list(v.facts), "notes": list(v.notes),
                          "decisions": [D.to_json(d) for d in v.decisions]}
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, **binding(run),
        "iterations": int(len(it)),
        "op_latency_ns": _num(np.nanmedian(it["op_latency_ns"].to_numpy(float))) if len(it) and
        it["op_latency_ns"].notna().any() else None,
        "entry_skew_ns": _num(it["entry_skew_ns"].median()) if len(it) else None,
        "kernels": kernels,
        "late_entry": None if le is None else {
            "rank": le.rank, "side": le.side, "state": le.decision.band, "late_in": {str(r): k for r, k in le.late_in.items()},
            "decision": D.to_json(le.decision), "notes": list(le.notes())},
        "verdicts": verdicts,
        "op_before_entry": _op_before_entry(run, tm),
    }


def _with_steps(run, tm, verdicts: dict, le) -> dict:
    """The pages' verdicts with the op before a late entry named from the run's PyTorch traces
    (profiler.torchtrace.report.with_steps: the pages and `epscope report` call the same)."""
    from profiler.torchtrace.report import with_steps
    try:
        return with_steps(run, tm, verdicts, le)
    except Exception:  # noqa: BLE001 (a trace that cannot be read: _op_before_entry says why)
        return verdicts


def _op_before_entry(run, tm) -> dict | None:
    """The op the PyTorch-trace blame names (profiler.torchtrace.report.summary_field; issue 30),
    None without attached traces. A trace that cannot be read costs the field, not the summary."""
    from profiler.torchtrace.report import summary_field
    try:
        return summary_field(run, tm)
    except Exception as e:  # noqa: BLE001 (the headline numbers matter more; say why the field is missing)
        return {"error": f"{type(e).__name__}: {e}"}


def store(run, res: chunked.Results | None = None, *, dest: Path | None = None) -> Path:
    """Compute (or take `res`, analyze(run)) and write RUN/analysis-summary.json atomically (profiler.store.atomic: an exclusive,
    locked temporary beside it, renamed into place; never through a link, never over a file that
    is not a regular one); returns its path. dest: another file to write (the viewer's cache of a
    run it cannot write; `load(run_dir, where=dest)`)."""
    data = validate.sealed(json.loads(json.dumps(summarize(run, res))))   # sealed as it reads back
    dest = Path(run.path) / FILE if dest is None else Path(dest)
    with atomic.TempFile(dest) as t:
        t.file.write((json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
        t.place(replace=True)
    return dest


def read(run_dir: Path, *, within=None, where: Path | None = None) -> dict:
    """The stored summary as a sealed document of this format (bounded read of a regular file
    inside `within`; `where`: another file, read inside its own directory); ValueError or OSError
    saying what is wrong, EpscopeError for a special or outside file."""
    p = Path(run_dir) / FILE if where is None else Path(where)
    doc = json.loads(atomic.read_regular(p, MAX_BYTES, within=within if where is None else (p.parent,)))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not an analysis summary")
    check_sealed(doc, FORMAT_VERSION, FILE)
    return doc


def check_sealed(doc: dict, version: int, name: str) -> None:
    """A stored result's seal and format: a seal that does not match is damage (ValueError), even
    when the damage hit the format's version; without a seal, a result of an older format is Stale
    (written before seals), one claiming this format is damage."""
    sealed = validate.seal_matches(doc)
    if sealed is False:
        raise ValueError(f"{name}: its content does not match its seal")
    if doc.get("format_version", 1) != version:
        raise Stale(f"of format {doc.get('format_version', 1)!r}, this epscope reads {version}")
    if sealed is None:
        raise ValueError(f"{name}: carries no seal (this format seals every result)")


def load(run_dir: Path, *, check_data: bool = True, run=None, manifest: dict | None = None, within=None,
         where: Path | None = None) -> dict | None:
    """The stored summary when it is current (sealed, this format and analysis version, bound to
    the run's registry and data as they are now, and to what `run` read when given), else None.
    check_data=False skips hashing the data files (the caller checked them). where: the summary's
    file when not RUN/analysis-summary.json (`store(..., dest=)`)."""
    try:
        data = read(run_dir, within=within, where=where)
    except (OSError, ValueError, EpscopeError):
        return None
    if mismatch(data, Path(run_dir), run=run, manifest=manifest, within=within, check_data=check_data):
        return None
    return data
