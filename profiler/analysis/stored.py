"""A run's analyses stored with it (RUN/analysis/) and read back instead of computed again.

Saving a run (profiler.record's session save) and `epscope analyze RUN...` compute the critical
path, idle, barriers and the time model once and write their full outputs here; the viewer reads
them on a cold open without reading the event table (10 M events: 35-73 s of analyses per cold
page before, issue 20). Layout, one directory placed in one rename (profiler.store.atomic):

    RUN/analysis/results.json                 the index below
    RUN/analysis/<report>.<field>.parquet     one DataFrame field of a report (zstd)
    RUN/analysis/<report>.<...>.evidence.parquet   a verdict's evidence rows

    {"format": "epscope-analysis-results", "format_version": 4,
     "analysis_version": summary.ANALYSIS_VERSION,
     "data": {"events.parquet": "<sha256>", "launches.parquet": "<sha256>"},   # summary.binding
     "registry": "sha256:<hex>",                                               # summary.binding
     "run": {"span_phases": ["copy_out", ...], "ranks": [0, 1]},
     "tables": {"critical_path.segments": {"file": "critical_path.segments.parquet",
                                           "sha256": "<hex>", "rows": 123, "bytes": 4567}, ...},
     "reports": {"critical_path": {"pacing_rank": 1, "verdict": {<Verdict fields by name>},
                                   "warnings": [{"type": "UndeclaredPhases", "count": 2, "detail": ""}]},
                 "idle": {"verdict": {...}, "warnings": [...], "findings": [{...}, ...]},
                 "barriers": {...}, "time_model": {"ranks": 8},
                 "compare": {"ranks": 8, "kernels": ["combine", ...], "path_total_ns": 123,
                             "waits": ["wait_recv", ...]}}}

`compare` is what Compare reads of the run (profiler.analysis.compare.RunInputs: its samples and
critical path per phase), so a comparison of many runs reads a few KB per run (format 2; format 1,
without it, reads as not current). `timeline` is the timeline's overview
(profiler.analysis.timeline_overview: {"meta": {...}, "tables": {"lanes": "timeline.lanes", ...}}),
so the viewer draws the whole run without reading events (format 3; older formats read as not
current and are computed again). `run_tables` is what `epscope report` prints beside the verdicts
(profiler.analysis.run_tables: events per kind, kernel times, per-phase span statistics, the
longest unfinished row), and `what_if` the exact what-if's re-timing inputs of a run analysed in
several chunks, one file a chunk (format 4, issue 31):

    RUN/analysis/whatif/whatif-00000.arrays   whatif.WhatIfInput.to_arrays of chunk 0 (spill.py's format:
                                              version 2, its fields of mostly one value packed; the
                                              version 1 files written before read the same)
    "what_if": {"phase_names": [...], "chunks": [{"file": "whatif-00000.arrays", "sha256": "<hex>",
                                                  "bytes": 123}, ...],
                "recorded": "what_if.recorded"} | null      # the table of whatif.recorded per chunk

so a what-if on a stored run re-times each chunk from its input (`Stored.what_if_summary`) instead
of reading the events and building their graphs (230 s and 8.9 GB at 100 M events before); null for
a run of one chunk, whose what-if builds its graph from its (at most chunked.MAX_EVENTS) events.

Format 4 (issue 32) is the envelope summary.py describes: `data` and `registry` are what the
analysed Run read (summary.binding, not the files when the results are written), the index
carries a `seal` over itself (validate.sealed) and each table its size; every file is read as a
regular file inside the caller's roots, bounded (MAX_INDEX_BYTES, each table's `bytes`).

Every object is read by name and checked (exactly the dataclass' fields, each of its type); a
verdict's evidence and a report's DataFrames name their table. A result of other data (the data
files' SHA-256 differ, or differ from what the reading Run read), of another registry, of another
analysis version, of another format, unsealed or damaged (its seal or a table's SHA-256 differs, a
field missing or of the wrong type) or half replaced is not served: `load` returns None and the
caller computes. `verify` says which (`epscope check`). The critical path comes back without its dependency graph
(`graph=None`): what needs the graph (the exact what-if) builds it again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler import errors
from profiler.errors import EpscopeError, RunExists
from profiler.groundtruth.expect import Cause, Direction
from profiler.store import atomic, hashcache, validate

from . import chunked
from . import heap
from . import summary
from . import timeline_overview as TLO
from .barriers import BarrierReport
from .critical_path import CriticalPath
from .idle import IdleReport
from .run_tables import RunTables
from . import spill
from .spill import Spill
from .timemodel import TimeModel
from .decision import from_json as decision_from_json, to_json as decision_json
from .verdict import Verdict
from .whatif import RECORDED_COLUMNS, WhatIfInput

CMP = importlib.import_module(".compare", __package__)   # the module (the package re-exports its function)

DIR = "analysis"
INDEX = "results.json"
FORMAT = "epscope-analysis-results"
FORMAT_VERSION = 4
# The bundled runs' indexes hold 13 kB at most; a 100 M-event run's overview meta some 100 kB.
MAX_INDEX_BYTES = 16 << 20
REPORTS = {"critical_path": CriticalPath, "idle": IdleReport, "barriers": BarrierReport, "time_model": TimeModel,
           "compare": CMP.RunInputs, "run_tables": RunTables}
WHAT_IF_DIR = "whatif"
# fields a report keeps in memory only: the critical path's dependency graph (rebuilt on demand);
# Compare's run name and manifest (the run's own, filled in by who reads it: `Stored.compare_inputs`)
NOT_STORED = {"critical_path": ("graph",), "compare": ("name", "manifest")}
# fields of names stored as JSON lists of strings: (report, field) -> the collection they come back as
NAME_LISTS = {("compare", "kernels"): tuple, ("compare", "waits"): frozenset}
OPTIONAL_INTS = {("compare", "ranks")}
ZSTD_LEVEL = 9


@dataclass
class Stored:
    """A run's analyses as stored: the same dataclasses the analyses return (critical.graph None)."""
    critical: CriticalPath
    idle: IdleReport
    barriers: BarrierReport
    time_model: TimeModel
    compare: object             # compare.RunInputs without the run's name and manifest
    span_phases: tuple          # names of the run's span phases (the what-if's choices)
    ranks: tuple                # the ranks that recorded events
    timeline: object = None     # timeline_overview.Overview: the timeline's zoomed-out views
    run_tables: RunTables | None = None     # what `epscope report` prints beside the verdicts
    what_if: "StoredWhatIf | None" = None    # the exact what-if's inputs (a run of several chunks)

    def what_if_summary(self, *, phase: str, speedup: float, rank) -> pd.DataFrame:
        """whatif.what_if(...).summary of the run, re-timed chunk by chunk from the stored inputs
        (one chunk's input in memory at a time); the same rows as chunked.Summaries.what_if_summary
        on the run's chunks. Raises LookupError when the run has no stored inputs (a run of one
        chunk: its what-if builds the graph of its events)."""
        if self.what_if is None:
            raise LookupError("no stored what-if inputs (a run analysed in one chunk)")
        return self.what_if.summary(phase=phase, speedup=speedup, rank=rank, path=self.critical,
                                    time_model=self.time_model)

    def compare_inputs(self, *, name: str, manifest: dict):
        """What Compare reads of the run, named as the run."""
        return dataclasses.replace(self.compare, name=name, manifest=dict(manifest or {}))


class Invalid(ValueError):
    """A stored result that does not read as one (a field missing, of the wrong type, a damaged table)."""


# -- computing ---------------------------------------------------------------------------------
def span_phases(events: pd.DataFrame) -> list[str]:
    """Names of the span phases of an event table, read from category codes (no string per row: a
    10 M-event table would take seconds)."""
    kind = events["kind"].astype("category")
    phase = events["phase"].astype("category")
    cats = list(kind.cat.categories)
    if "span" not in cats:
        return []
    m = kind.cat.codes.to_numpy() == cats.index("span")
    codes = np.unique(phase.cat.codes.to_numpy()[m])
    names = phase.cat.categories
    return sorted(str(names[c]) for c in codes if c >= 0)


def ranks_of(events: pd.DataFrame) -> list[int]:
    return sorted(int(r) for r in pd.unique(events["rank"]))


@dataclass
class StoredWhatIf:
    """The exact what-if's inputs stored with a run analysed in several chunks (RUN/analysis/whatif/)."""
    directory: Path
    phase_names: frozenset
    chunks: tuple                # ({"file", "sha256", "bytes"}, ...) in chunk order
    recorded: tuple              # per chunk: whatif.recorded (what its what-ifs compare against)

    def summary(self, *, phase: str, speedup: float, rank, path: CriticalPath, time_model) -> pd.DataFrame:
        name = phase.split("/", 1)[-1]
        if name not in self.phase_names:
            raise ValueError(f"what_if: the run records no phase {name!r}")
        # the chunks' inputs and temporaries are alike in size: freed blocks kept for the next
        # chunk (heap.kept) instead of faulted in again (10 M events, 4 chunks: 13 k page faults
        # instead of 50 k, system time 0.02-0.10 s instead of 0.10-0.14 a what-if)
        with heap.kept():
            return chunked.what_if_rows(self._parts(phase=phase, speedup=speedup, rank=rank, path=path,
                                                    time_model=time_model))

    def _parts(self, *, phase: str, speedup: float, rank, path: CriticalPath, time_model) -> list[pd.DataFrame]:
        parts = []
        for c, rec in zip(self.chunks, self.recorded):
            p = self.directory / c["file"]
            # checked against the SHA-256 written in the index, which profiler.store.hashcache remembers
            # by the file's identity and change times (as it remembers the data files' for
            # `current`): 2.3 GB of inputs at 100 M events took 4 s to hash on every what-if
            if hashcache.sha256(p) != c["sha256"]:
                raise Invalid(f"what-if input {c['file']}: content differs from its checksum")
            try:
                a = spill.read(p)
            except (OSError, ValueError) as e:     # spill.Damaged included
                raise Invalid(f"what-if input {c['file']}: {e}") from None
            inp = WhatIfInput.from_arrays(a, time_model)
            del a
            parts.append(inp.summary(phase=phase, speedup=speedup, rank=rank, path=path, rec=rec))
            del inp
        return parts


# -- writing -----------------------------------------------------------------------------------
def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _num(x):
    """A JSON number of a numpy or Python scalar (NaN and inf kept: json writes them)."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    return float(x)


def _warning_json(w) -> dict:
    return w.to_json()


class _Writer:
    def __init__(self, where: Path):
        self.where = where
        self.tables: dict = {}
        self._by_id: dict = {}

    def table(self, name: str, df: pd.DataFrame, share: bool = False) -> str:
        """Write df as table `name`; returns the name it is stored under. share: a DataFrame
        already written (a verdict's evidence is often rows its report holds) is named, not
        written twice. A report's own field is always written under its own name (the reader
        finds it there)."""
        if share and id(df) in self._by_id:
            return self._by_id[id(df)]
        buf = io.BytesIO()
        # no column statistics and no copy of the Arrow schema (the pandas metadata restores the
        # dtypes): a bundled run's 19 small tables took 192 KB with them, mostly footers
        pq.write_table(pa.Table.from_pandas(df), buf, compression="zstd", compression_level=ZSTD_LEVEL,
                       write_statistics=False, store_schema=False)
        b = buf.getvalue()
        file = f"{name}.parquet"
        with atomic.create_exclusive(self.where / file) as f:
            f.write(b)
        self.tables[name] = {"file": file, "sha256": _sha(b), "rows": int(len(df)), "bytes": len(b)}
        self._by_id.setdefault(id(df), name)
        return name

    def verdict(self, name: str, v: Verdict) -> dict:
        out = {}
        for f in dataclasses.fields(Verdict):
            x = getattr(v, f.name)
            if f.name == "evidence":
                out[f.name] = None if x is None else self.table(f"{name}.evidence", x, share=True)
            elif f.name in ("cause", "direction"):
                out[f.name] = None if x is None else x.value
            elif f.name == "where":
                out[f.name] = [{"kernel": None if k is None else str(k), "phase": None if p is None else str(p)}
                               for k, p in x]
            elif f.name in ("notes", "facts"):
                out[f.name] = [str(n) for n in x]
            elif f.name == "decisions":
                out[f.name] = [decision_json(d) for d in x]
            elif f.name == "warnings":
                out[f.name] = [_warning_json(w) for w in x]
            elif f.name in ("page", "reference", "detail", "kernel", "phase", "late_entry"):
                out[f.name] = None if x is None else str(x)
            else:
                out[f.name] = _num(x)
        return out

    def report(self, name: str, rep) -> dict:
        out = {}
        for f in dataclasses.fields(rep):
            if f.name in NOT_STORED.get(name, ()):
                continue
            x = getattr(rep, f.name)
            if isinstance(x, pd.DataFrame):
                self.table(f"{name}.{f.name}", x)
            elif f.name == "verdict":
                out[f.name] = None if x is None else self.verdict(f"{name}.verdict", x)
            elif f.name == "findings":
                out[f.name] = [self.verdict(f"{name}.findings.{i}", v) for i, v in enumerate(x)]
            elif f.name == "warnings":
                out[f.name] = [_warning_json(w) for w in x]
            elif (name, f.name) in NAME_LISTS:
                out[f.name] = sorted(str(v) for v in x)
            else:
                out[f.name] = _num(x)
        return out


def _place_dir(tmp: Path, dest: Path) -> None:
    """Rename the finished directory tmp to dest in one step: a new one, or swapped with the
    stored results there (renameat2 RENAME_EXCHANGE; else the old one moved aside first)."""
    if atomic.rename_noreplace(tmp, dest):
        return
    if dest.is_symlink() or not dest.is_dir():
        raise RunExists(f"{dest}: exists and is not a directory of stored results; not replacing it")
    if not atomic.rename_exchange(tmp, dest):
        old = atomic.temp_name(dest)
        os.rename(dest, old)
        os.rename(tmp, dest)
        tmp = old
    shutil.rmtree(tmp, ignore_errors=True)     # the results replaced


def _what_if_files(results: chunked.Results, where: Path, w: "_Writer") -> dict | None:
    """The what-if inputs of a run of several chunks, put in where/ (hard links to the spilled
    files when they are on this file system, written from memory otherwise), and what each
    chunk's what-ifs compare against (whatif.recorded, one table); their index entry."""
    if not results.what_if:
        return None
    where.mkdir()
    sp = results.spills.what_if
    out = Spill(where)
    chunks = []
    for name in results.what_if:
        file = f"{name}{spill.SUFFIX}"
        if sp.on_disk and name in sp.sha256:
            try:
                os.link(sp.path(name), where / file)
            except OSError:
                shutil.copyfile(sp.path(name), where / file)
            chunks.append({"file": file, "sha256": sp.sha256[name], "bytes": sp.sizes[name]})
            continue
        out.put(name, sp.get(name, packed=True))      # as put: packed as the files of a directory spill
        chunks.append({"file": file, "sha256": out.sha256[name], "bytes": out.sizes[name]})
    names = sorted(set(str(p) for p in results.critical.graph.derived["phase_names"]))
    rec = pd.concat([results.what_if_recorded[n].assign(chunk=i) for i, n in enumerate(results.what_if)],
                    ignore_index=True)
    return {"phase_names": names, "chunks": chunks, "recorded": w.table("what_if.recorded", rec)}


def store(run, results: chunked.Results, *, compare=None, dest: Path | None = None) -> Path:
    """Write the run's results (chunked.Results of `summary.analyze(run)`) into RUN/analysis/ in one rename;
    returns the directory. compare: the run's compare.RunInputs (default: the one `results`
    carries, computed with the analyses' chunks). dest: another directory to write them to (the
    viewer's cache of a run it cannot write; its parent must exist), bound to the run all the
    same (`load(run_dir, results_dir=dest)`)."""
    if compare is None:
        compare = results.compare
    dest = Path(run.path) / DIR if dest is None else Path(dest)
    index = {"format": FORMAT, "format_version": FORMAT_VERSION, **summary.binding(run),
             "run": {"span_phases": list(results.span_phases), "ranks": [int(r) for r in results.ranks]}}
    with atomic.staged_dir(dest) as tmp:
        w = _Writer(tmp)
        reports = {"critical_path": w.report("critical_path", results.critical),
                   "idle": w.report("idle", results.idle),
                   "barriers": w.report("barriers", results.barriers),
                   "time_model": w.report("time_model", results.time_model),
                   "compare": w.report("compare", compare),
                   "run_tables": w.report("run_tables", results.run_tables)}
        meta, tables = TLO.to_stored(results.timeline)
        index["timeline"] = {"meta": meta, "tables": {k: w.table(f"timeline.{k}", df) for k, df in tables.items()}}
        index["what_if"] = _what_if_files(results, tmp / WHAT_IF_DIR, w)
        index["tables"] = w.tables
        index["reports"] = reports
        index = validate.sealed(json.loads(json.dumps(index)))   # sealed as it reads back
        with atomic.create_exclusive(tmp / INDEX) as f:
            f.write((json.dumps(index, indent=1, sort_keys=True) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        _place_dir(tmp, dest)
    return dest


WORK = "analysis-work"       # beside RUN/analysis: the spills of an analysis in progress


def store_run(path, *, step=None, engine=None) -> Path:
    """Load the run at path, compute its analyses once and store them: RUN/analysis/ and the
    headline summary RUN/analysis-summary.json (the Runs page and earlier viewers read it).
    The chunks' what-if inputs and span durations are spilled to a work directory beside the
    results (a hidden temporary, removed after; the inputs become RUN/analysis/whatif/), so memory
    stays bounded by a chunk. engine: a distributed engine whose workers analyse the chunks
    (profiler.analysis.distributed; the run's directory must be readable and writable by them).
    step(label): progress. Returns the stored results' directory."""
    from profiler.store.runstore import load_run
    step = step or (lambda label: None)
    run = load_run(path)
    work_dest = Path(run.path) / WORK
    atomic.clean_leftovers(work_dest)
    work, fd = atomic.make_temp_dir(work_dest)
    try:
        spills = chunked.Spills(what_if=Spill(work / "whatif"), durations=Spill(work / "durations", checksums=False))
        try:
            step(f"analysing {run.num_events:,} events" + (f" on {engine.describe()}" if engine is not None else ""))
            res = summary.analyze(run, spills=spills, engine=engine)
            step("storing the results")
            summary.store(run, res)
            return store(run, res)
        except FileNotFoundError:   # the run's directory (the spills' work directory with it) went away:
            _raise_if_rewritten(run)   # re-recorded meanwhile?
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(fd)


def _raise_if_rewritten(run) -> None:
    """RunChanged when the run at run.path is no longer the one read (another write's manifest, or
    none while a rewrite swaps the directory): results of it were bound to the old bytes anyway."""
    from profiler.store.runreader import read_manifest
    try:
        now = read_manifest(run.path).get("version_id")
    except EpscopeError:
        now = None
    if now is None or now != run.version_id:
        raise errors.RunChanged(f"{run.path}: the run was rewritten while it was being analysed; its analyses "
                                "were not stored (`epscope analyze` it again)") from None


# -- reading -----------------------------------------------------------------------------------
def _need(cond: bool, what: str) -> None:
    if not cond:
        raise Invalid(what)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _opt(check):
    return lambda x: x is None or check(x)


def _str(x) -> bool:
    return isinstance(x, str)


def _warnings(items, where: str) -> tuple:
    _need(isinstance(items, list), f"{where}: not a list")
    out = []
    for w in items:
        _need(isinstance(w, dict) and set(w) == {"type", "count", "detail"}, f"{where}: a warning's fields")
        cls = getattr(errors, str(w["type"]), None)
        _need(isinstance(cls, type) and issubclass(cls, errors.CountedWarning)
              and cls.__init__ is errors.CountedWarning.__init__, f"{where}: unknown warning {w['type']!r}")
        _need(_is_int(w["count"]) and _str(w["detail"]), f"{where}: a warning's count or detail")
        out.append(cls(w["count"], w["detail"]))
    return tuple(out)


_VERDICT_CHECKS = {
    "page": _str, "alarm": lambda x: isinstance(x, bool), "cause": _str, "rank": _opt(_is_int),
    "peer": _opt(_is_int), "kernel": _opt(_str), "phase": _opt(_str), "direction": _opt(_str),
    "magnitude_ns": _opt(_is_num), "reference_ns": _opt(_is_num), "reference": _str, "n": _is_int,
    "iteration": _opt(_is_int), "ratio": _opt(_is_num), "late_entry": _opt(_str), "detail": _str,
}


class _Reader:
    def __init__(self, where: Path, tables: dict, within=None):
        _need(isinstance(tables, dict), "tables: not an object")
        self.where, self.tables, self._read, self.within = where, tables, {}, within

    def table(self, name) -> pd.DataFrame:
        _need(isinstance(name, str) and name in self.tables, f"no table {name!r}")
        if name in self._read:
            return self._read[name]
        t = self.tables[name]
        _need(isinstance(t, dict) and set(t) == {"file", "sha256", "rows", "bytes"}, f"table {name}: its fields")
        _need(isinstance(t["file"], str) and "/" not in t["file"] and not t["file"].startswith("."),
              f"table {name}: file name")
        _need(_is_int(t["bytes"]) and t["bytes"] >= 0, f"table {name}: its size")
        try:
            b = atomic.read_regular(self.where / t["file"], t["bytes"], within=self.within)
        except EpscopeError as e:
            raise Invalid(f"table {name}: {e}") from None
        _need(len(b) == t["bytes"] and _sha(b) == t["sha256"], f"table {name}: content differs from its checksum")
        df = pq.read_table(pa.BufferReader(b)).to_pandas()
        _need(len(df) == t["rows"], f"table {name}: rows")
        self._read[name] = df
        return df

    def verdict(self, d, where: str) -> Verdict:
        fields = {f.name for f in dataclasses.fields(Verdict)}
        _need(isinstance(d, dict) and set(d) == fields, f"{where}: a verdict's fields")
        for k, check in _VERDICT_CHECKS.items():
            _need(check(d[k]), f"{where}.{k}: type")
        _need(isinstance(d["where"], list) and all(
            isinstance(x, dict) and set(x) == {"kernel", "phase"} and _opt(_str)(x["kernel"]) and _opt(_str)(x["phase"])
            for x in d["where"]), f"{where}.where")
        _need(isinstance(d["notes"], list) and all(map(_str, d["notes"])), f"{where}.notes")
        _need(isinstance(d["facts"], list) and all(map(_str, d["facts"])), f"{where}.facts")
        _need(isinstance(d["decisions"], list), f"{where}.decisions")
        try:
            decisions = tuple(decision_from_json(x, f"{where}.decisions.{i}") for i, x in enumerate(d["decisions"]))
        except ValueError as e:
            raise Invalid(str(e)) from None
        kw = {k: d[k] for k in _VERDICT_CHECKS}
        kw["cause"] = Cause(d["cause"])
        kw["direction"] = None if d["direction"] is None else Direction(d["direction"])
        kw["where"] = tuple((x["kernel"], x["phase"]) for x in d["where"])
        kw["notes"] = tuple(d["notes"])
        kw["facts"] = tuple(d["facts"])
        kw["decisions"] = decisions
        kw["warnings"] = _warnings(d["warnings"], f"{where}.warnings")
        kw["evidence"] = None if d["evidence"] is None else self.table(d["evidence"])
        return Verdict(**kw)

    def report(self, name: str, d):
        cls = REPORTS[name]
        skip = NOT_STORED.get(name, ())
        fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
        kw = {}
        scalar = set()
        for f in fields:
            t = f"{name}.{f.name}"
            if t in self.tables:
                kw[f.name] = self.table(t)
            else:
                scalar.add(f.name)
        _need(isinstance(d, dict) and set(d) == scalar, f"{name}: its fields ({sorted(scalar)})")
        for k in scalar:
            x = d[k]
            if k == "verdict":
                kw[k] = None if x is None else self.verdict(x, f"{name}.verdict")
            elif k == "findings":
                _need(isinstance(x, list), f"{name}.findings")
                kw[k] = tuple(self.verdict(v, f"{name}.findings.{i}") for i, v in enumerate(x))
            elif k == "warnings":
                kw[k] = _warnings(x, f"{name}.warnings")
            elif (name, k) in NAME_LISTS:
                _need(isinstance(x, list) and all(map(_str, x)), f"{name}.{k}: not a list of names")
                kw[k] = NAME_LISTS[(name, k)](x)
            elif (name, k) in OPTIONAL_INTS:
                _need(_opt(_is_int)(x), f"{name}.{k}: not an integer or null")
                kw[k] = x
            else:
                _need(_is_int(x), f"{name}.{k}: not an integer")
                kw[k] = x
        if name == "compare":
            kw.update(name="", manifest={})
        return cls(**kw)


def read_index(d: Path, within=None) -> dict:
    """The index of the stored results in directory d: a regular file of at most MAX_INDEX_BYTES
    inside `within`, of this format, its seal intact; Invalid (or OSError) saying what is wrong."""
    try:
        index = json.loads(atomic.read_regular(d / INDEX, MAX_INDEX_BYTES, within=within))
    except EpscopeError as e:
        raise Invalid(str(e)) from None
    except ValueError as e:
        raise Invalid(f"{INDEX}: not JSON ({e})") from None
    _need(isinstance(index, dict) and index.get("format") == FORMAT, f"{INDEX}: not an index of stored results")
    summary.check_sealed(index, FORMAT_VERSION, INDEX)
    return index


def _read_index(d: Path, within=None) -> dict | None:
    try:
        return read_index(d, within)
    except (ValueError, OSError):   # Invalid, summary.Stale
        return None


def current(run_dir, *, check_data: bool = True, run=None, within=None) -> bool:
    """Whether RUN/analysis/ holds sealed results of this format, analysis version and registry
    for the run's data as it is now (reads the index only)."""
    index = _read_index(Path(run_dir) / DIR, within)
    return index is not None and summary.mismatch(index, Path(run_dir), run=run, within=within,
                                                  check_data=check_data) is None


def load(run_dir, *, check_data: bool = True, run=None, within=None, results_dir: Path | None = None) -> Stored | None:
    """The run's stored results when they are current (sealed, this format, analysis version and
    registry, bound to the run's data as it is now and to what `run` read when given) and read
    whole and intact; else None (the caller computes them). check_data=False skips comparing the
    data files' hashes (the caller did). within: the roots every file must lie in (default: the
    Run's). results_dir: where they were written when not RUN/analysis/ (`store(..., dest=)`),
    its files read inside its own parent; the envelope is compared with run_dir's run."""
    run_dir = Path(run_dir)
    within = within if within is not None or run is None else run.within
    d = run_dir / DIR if results_dir is None else Path(results_dir)
    read_within = within if results_dir is None else (d.parent,)
    if d.is_symlink():
        return None
    for _ in range(2):                  # a write swapping the directory mid-read: once more
        index = _read_index(d, read_within)
        if index is None or summary.mismatch(index, run_dir, run=run, within=within, check_data=check_data):
            return None
        try:
            return _load(d, index, read_within)
        except (Invalid, OSError, ValueError, TypeError, KeyError, pa.ArrowException):
            continue
    return None


def verify(run_dir, *, run=None, within=None) -> str | None:
    """What is wrong with the run's stored results, read whole (`epscope check`): None when there
    are none, or they are current and intact; else one line. A line starting "stale" names results
    that are intact but of other data, registry or analysis version (not shown; `epscope analyze`
    stores them again); any other line is damage."""
    run_dir = Path(run_dir)
    out = []
    d = run_dir / DIR
    if os.path.lexists(d):
        try:
            index = read_index(d, within)
            _load(d, index, within)
            why = summary.mismatch(index, run_dir, run=run, within=within)
            if why:
                out.append(f"stale: {DIR}/ {why}")
        except summary.Stale as e:
            out.append(f"stale: {DIR}/ {e}")
        except (Invalid, OSError, ValueError, TypeError, KeyError, pa.ArrowException) as e:
            out.append(f"{DIR}/: {' '.join(str(e).split())[:300]}")
    if os.path.lexists(run_dir / summary.FILE):
        try:
            doc = summary.read(run_dir, within=within)
            why = summary.mismatch(doc, run_dir, run=run, within=within)
            if why:
                out.append(f"stale: {summary.FILE} {why}")
        except summary.Stale as e:
            out.append(f"stale: {summary.FILE} {e}")
        except (EpscopeError, OSError, ValueError) as e:
            msg = " ".join(str(e).split())[:300]
            out.append(msg if msg.startswith(summary.FILE) else f"{summary.FILE}: {msg}")
    damaged = [x for x in out if not x.startswith("stale")]
    return "; ".join(damaged or out) or None


def _load(d: Path, index: dict, within=None) -> Stored:
    r = _Reader(d, index.get("tables"), within)
    reps = index.get("reports")
    _need(isinstance(reps, dict) and set(reps) == set(REPORTS), "reports")
    got = {name: r.report(name, reps[name]) for name in REPORTS}
    run = index.get("run")
    _need(isinstance(run, dict) and set(run) == {"span_phases", "ranks"}, "run")
    _need(isinstance(run["span_phases"], list) and all(map(_str, run["span_phases"])), "run.span_phases")
    _need(isinstance(run["ranks"], list) and all(map(_is_int, run["ranks"])), "run.ranks")
    tl = index.get("timeline")
    _need(isinstance(tl, dict) and set(tl) == {"meta", "tables"} and isinstance(tl["tables"], dict)
          and set(tl["tables"]) == set(TLO.TABLES), "timeline")
    try:
        timeline = TLO.from_stored(tl["meta"], {k: r.table(v) for k, v in tl["tables"].items()})
    except ValueError as e:
        raise Invalid(str(e)) from None
    return Stored(critical=got["critical_path"], idle=got["idle"], barriers=got["barriers"],
                  time_model=got["time_model"], compare=got["compare"], span_phases=tuple(run["span_phases"]),
                  ranks=tuple(run["ranks"]), timeline=timeline, run_tables=got["run_tables"],
                  what_if=_what_if_index(d, index.get("what_if", "missing"), r))


def _what_if_index(d: Path, w, r: "_Reader") -> StoredWhatIf | None:
    """The what-if inputs' index entry, checked (the files themselves are checked as read)."""
    if w is None:
        return None
    _need(isinstance(w, dict) and set(w) == {"phase_names", "chunks", "recorded"}, "what_if")
    _need(isinstance(w["phase_names"], list) and all(map(_str, w["phase_names"])), "what_if.phase_names")
    _need(isinstance(w["chunks"], list) and len(w["chunks"]) > 0, "what_if.chunks")
    for c in w["chunks"]:
        _need(isinstance(c, dict) and set(c) == {"file", "sha256", "bytes"}, "what_if.chunks: fields")
        _need(_str(c["file"]) and "/" not in c["file"] and not c["file"].startswith(".")
              and c["file"].endswith(spill.SUFFIX), "what_if.chunks: file name")
        _need(_str(c["sha256"]) and _is_int(c["bytes"]), "what_if.chunks: checksum or size")
    where = d / WHAT_IF_DIR
    _need(where.is_dir() and not where.is_symlink(), "what_if: no directory of inputs")
    rec = r.table(w["recorded"])
    _need(list(rec.columns) == RECORDED_COLUMNS + ["chunk"], "what_if.recorded: columns")
    by_chunk = {int(i): g.drop(columns="chunk").reset_index(drop=True) for i, g in rec.groupby("chunk")}
    _need(set(by_chunk) == set(range(len(w["chunks"]))), "what_if.recorded: chunks")
    return StoredWhatIf(directory=where, phase_names=frozenset(w["phase_names"]), chunks=tuple(w["chunks"]),
                        recorded=tuple(by_chunk[i] for i in range(len(w["chunks"]))))
