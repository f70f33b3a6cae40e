"""Runs page: one row per run directory, from manifests and parquet footers only (no event table
is read): status from the catalog's cheap validation, so corrupt and timed-out runs say so.

The page is one grid (dash-ag-grid, infinite row model) whose rows the server sends a block at a
time (query.py): `Table` keeps the runs table of the catalog's entries until one of them, or a
run's stored summary, changes; `grid_rows` turns rows of it into what the grid's cells read."""
from __future__ import annotations

import functools
import json
import math
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode

import pandas as pd

from profiler.analysis import summary as stored

from ... import results
from ...catalog import RunEntry
from ...format import ns
from . import query

MAX_TEXT = 300   # characters of a description or config summary shown in a cell

COLUMNS = {
    "name": "run", "workload": "workload", "sms": "SMs", "chunk": "chunk", "path": "path", "buffers": "buffers",
    "dtype": "dtype", "op_latency": "op latency after entry", "entry_skew": "entry skew", "verdict": "verdict",
    "branch": "branch", "commit": "commit", "gpu": "GPU", "drops": "dropped records", "clock": "clock uncertainty",
    "status": "status",
}
NOT_ANALYSED = "not analysed (epscope analyze)"


def _compact(d, limit: int = 8) -> str:
    if not isinstance(d, dict):
        return "" if d is None else str(d)[:MAX_TEXT]
    items = [(k, v) for k, v in d.items() if not isinstance(v, (dict, list))]
    out = ", ".join(f"{k}={_num(v)}" for k, v in items[:limit])
    return out[:MAX_TEXT] + (", …" if len(items) > limit else "")


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def clock_uncertainty_ns(manifest: dict) -> float | None:
    """The largest per-rank clock uncertainty of the run (what cross-rank timing can trust)."""
    clock = manifest.get("clock") or {}
    vals = [r.get("uncertainty_ns") for r in clock.get("ranks", []) or [] if isinstance(r, dict)]
    vals = [float(v) for v in vals if isinstance(v, (int, float))]
    return max(vals) if vals else None


def status(entry: RunEntry) -> str:
    """The run's state from the catalog's cheap validation (manifest and parquet footers): ok,
    the recording's own status (timeout), or what is wrong with it, in one line."""
    if entry.status == "newer format":
        return f"newer format: {entry.problem}"
    if entry.problem:
        return f"{entry.status}: {entry.problem}"
    m = entry.manifest or {}
    warnings = m.get("warnings") or []
    n = sum(int(w.get("count") or 0) for w in warnings)
    head = entry.status if entry.status == "ok" else f"{entry.status.upper()}"
    if entry.status != "ok" and m.get("error"):
        head += f": {str(m['error'])[:200]}"
    if entry.note:   # as `epscope check` says it: never a plain "ok" for a run whose content is not verified
        head += f" · {entry.note}"
    return f"{head} · warnings: {n:,} events ({len(warnings)} kinds)" if warnings else head


def knobs(manifest: dict) -> dict:
    """The config knobs a reader compares runs by: SMs, chunk, path, buffers, dtype (from the
    recorder's config and workload; '' where the run does not say)."""
    cfg = manifest.get("config") or {}
    wl = manifest.get("workload") or {}
    d = cfg.get("dispatch") if isinstance(cfg.get("dispatch"), dict) else {}
    ll = cfg.get("low_latency") if isinstance(cfg.get("low_latency"), dict) else {}

    def first(*vals):
        return next((str(v) for v in vals if v is not None and v != ""), "")
    return {"sms": first(d.get("num_sms"), wl.get("num_sms")),
            "chunk": first(d.get("num_max_nvl_chunked_send_tokens"), wl.get("chunk")),
            "path": first(d.get("path"), ll.get("split")),
            "buffers": first(d.get("num_tma_buffers") if d.get("path") == "tma" else None),
            "dtype": first(wl.get("dtype"))}


def _signature(path: Path, manifest: dict | None) -> tuple:
    """What a stored summary's currency depends on: the manifest's registry (as JSON: the summary
    is bound to it), its file and the data files (identity, size and change times: summary.load
    hashes them through profiler.store.hashcache under the same key)."""
    out = [json.dumps((manifest or {}).get("registry") or {}, sort_keys=True)]
    for name in (stored.FILE,) + stored.DATA_FILES:
        try:
            st = (path / name).stat()
            out.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((name, None))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _headline(path: str, root: str, signature: tuple, kept: int) -> tuple:
    """The cells of a run's stored summary when it is current (profiler.analysis.summary: sealed,
    bound to the manifest's registry and the data files as they are; the run's own, else the one
    the viewer kept in its cache, viewer.results), cached per state and results kept: the cells
    only (a few short strings), never the document (a 90 MB summary kept 2.2 GB here)."""
    sm = results.load_summary(Path(path), manifest={"registry": json.loads(signature[0])}, within=(Path(root),))
    return tuple(_cells(sm).items())


def headline(entry: RunEntry) -> dict:
    """op latency after entry, entry skew (as shown, and in ns: what the grid sorts and filters
    by) and the verdict's cause from the run's stored summary."""
    if entry.problem is not None:
        return _cells(None)
    return dict(_headline(str(entry.path), str(entry.root), _signature(entry.path, entry.manifest),
                          results.generation()))


def _cells(sm: dict | None) -> dict:
    if sm is None:
        return {"op_latency": NOT_ANALYSED, "entry_skew": "", "verdict": "", "op_latency_ns": None,
                "entry_skew_ns": None}
    vs = sm.get("verdicts") or {}
    alarms = [(p, vs[p]) for p in ("critical_path", "idle", "barriers") if (vs.get(p) or {}).get("alarm")]
    if alarms:
        p, v = alarms[0]
        rank = f" rank {v['rank']}" if v.get("rank") is not None else ""
        side = f" ({v['late_entry']} side late entry)" if v.get("late_entry") else ""
        verdict = f"{v['cause']}{rank}{side}"
    else:
        verdict = "no alarm"
    le = sm.get("late_entry") or {}
    if le.get("state") == "borderline":
        verdict += f"; borderline late entry rank {le['rank']} ({le['side']})"
    return {"op_latency": ns(sm.get("op_latency_ns")) if sm.get("op_latency_ns") is not None else "—",
            "entry_skew": ns(sm.get("entry_skew_ns")) if sm.get("entry_skew_ns") is not None else "—",
            "verdict": verdict, "op_latency_ns": _finite(sm.get("op_latency_ns")),
            "entry_skew_ns": _finite(sm.get("entry_skew_ns"))}


def _finite(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


HEADLINE = ("op_latency", "entry_skew", "verdict", "op_latency_ns", "entry_skew_ns")   # headline()'s columns


def runs_table(entries: list[RunEntry]) -> pd.DataFrame:
    """One row per run: what the manifest and the catalog's check say, and the stored headline."""
    return with_headlines(_base_table(entries), {e.run_id: e for e in entries})


def with_headlines(df: pd.DataFrame, entries: dict) -> pd.DataFrame:
    """df (rows of _base_table) with each run's stored headline (entries: run id -> RunEntry):
    what reads a file per run, so the grid asks it only for the rows it sends (Table)."""
    heads = pd.DataFrame([headline(entries[r]) for r in df["run_id"]], columns=HEADLINE, index=df.index)
    return pd.concat([df.drop(columns=[c for c in HEADLINE if c in df.columns]), heads], axis=1)[_COLUMN_ORDER]


_COLUMN_ORDER = ["run_id", "name", "directory", "shared_name", "description", *[c for c in COLUMNS if c != "name"],
                 "config", "headline", "ok", "op_latency_ns", "entry_skew_ns"]


def _base_table(entries: list[RunEntry]) -> pd.DataFrame:
    """runs_table less the headline columns (from the manifests and the catalog's check only)."""
    names: dict[str, int] = {}
    for e in entries:
        names[e.name] = names.get(e.name, 0) + 1
    rows = []
    for e in entries:
        m = e.manifest or {}   # checked by profiler.store.validate: every field has its declared type
        git = m.get("git") or {}
        gpu = m.get("gpu") or {}
        drops = m.get("drops") or {}
        wl = m.get("workload") or {}
        rows.append({
            "run_id": e.run_id,
            "name": e.name,
            "directory": e.directory,
            "shared_name": names[e.name] > 1,
            "description": str(m.get("description") or "")[:MAX_TEXT],
            "workload": str(wl.get("kind") or ""),
            "branch": str(git.get("branch") or ""),
            "commit": str(git.get("commit") or "")[:10] + (" (dirty)" if git.get("dirty") else ""),
            "config": _compact(m.get("config")),
            **knobs(m),
            "gpu": f"{gpu.get('count', '')}× {gpu['name']}" if gpu.get("name") else "",
            "headline": _compact(m.get("headline")),
            "drops": int(drops.get("total") or 0),
            "clock": clock_uncertainty_ns(m),
            "status": status(e),
            "ok": e.problem is None and e.status == "ok",
        })
    return pd.DataFrame(rows, columns=[c for c in _COLUMN_ORDER if c not in HEADLINE])


# -- the grid ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GridColumn:
    """A column of the Runs grid: `column` a key of COLUMNS (its header); `by` the column of
    runs_table it sorts and filters by when that is not the text shown (a duration's ns beside
    its "561 µs"); `shown` the row field holding the text a cell shows; kind "text" | "number"
    (its filter); renderer: a cell renderer of assets/dashAgGridComponentFunctions.js."""
    column: str
    width: int
    kind: str = "text"
    by: str | None = None
    shown: str | None = None
    renderer: str | None = None
    tooltip: str | None = None       # the row field whose text is the cell's tooltip

    @property
    def field(self) -> str:
        return self.by or self.column

    @property
    def header(self) -> str:
        return COLUMNS[self.column]


GRID = (
    GridColumn("name", 260, renderer="RunName", tooltip="description"),
    GridColumn("workload", 110), GridColumn("sms", 80), GridColumn("chunk", 90), GridColumn("path", 90),
    GridColumn("buffers", 100), GridColumn("dtype", 90),
    GridColumn("op_latency", 190, "number", by="op_latency_ns", shown="op_latency"),
    GridColumn("entry_skew", 120, "number", by="entry_skew_ns", shown="entry_skew"),
    GridColumn("verdict", 240, tooltip="verdict"), GridColumn("branch", 110), GridColumn("commit", 130),
    GridColumn("gpu", 150), GridColumn("drops", 160, "number", shown="drops_t"),
    GridColumn("clock", 160, "number", shown="clock_t"), GridColumn("status", 280, tooltip="status"),
)
assert [c.column for c in GRID] == list(COLUMNS), "every column of the page is a column of the grid"
KINDS = {c.field: c.kind for c in GRID}     # what query.py filters and sorts


def _json(v):
    """A cell's value as JSON carries it: None for a missing number."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v.item() if hasattr(v, "item") else v


def grid_rows(df: pd.DataFrame, download_href: Callable[[str], str]) -> list[dict]:
    """Rows of runs_table as the grid's cells read them: the values it sorts and filters by, the
    text shown beside them, and each run's links (the pages' query, download_href(run id): the
    Perfetto download's)."""
    out = []
    for r in df.to_dict("records"):
        row = {c.field: _json(r[c.field]) for c in GRID}
        row.update(
            run_id=r["run_id"], q="?" + urlencode({"run": r["run_id"]}), download=download_href(r["run_id"]),
            # runs that share a name are told apart by where they live
            where=f"in {r['directory']}" if r["shared_name"] else "", description=r["description"],
            op_latency=r["op_latency"], entry_skew=r["entry_skew"], drops_t=f"{r['drops']:,}",
            clock_t=ns(r["clock"]) if r["clock"] is not None and r["clock"] == r["clock"] else "—", ok=bool(r["ok"]))
        out.append(row)
    return out


class Table:
    """The Runs grid's rows of the catalog's entries, kept until an entry or a run's stored
    summary changes (the grid asks for a block of rows at a time: each ask must not rebuild 500
    rows). The stored headlines (a file read per run: 0.14 s of 0.18 s for 500 runs) are read
    for the rows sent, or for every run once a sort or filter needs them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._base: pd.DataFrame | None = None
        self._full: pd.DataFrame | None = None
        self._entries: dict = {}

    def _current(self, entries: list[RunEntry]) -> tuple[pd.DataFrame, pd.DataFrame | None, dict]:
        key = (results.generation(),) + tuple(
            (e.run_id, str(e.path), str(e.root), e.signature, e.problem, e.status, _signature(e.path, e.manifest))
            for e in entries)
        with self._lock:
            if key == self._key:
                return self._base, self._full, self._entries
        base, by_id = _base_table(entries), {e.run_id: e for e in entries}
        with self._lock:
            self._key, self._base, self._full, self._entries = key, base, None, by_id
        return base, None, by_id

    def answer(self, entries: list[RunEntry], req: query.RowsRequest) -> tuple[pd.DataFrame, int]:
        """The rows req asks for, with their headlines, and how many rows pass its filters."""
        base, full, by_id = self._current(entries)
        if not query.uses(req) & set(HEADLINE):
            got, n = query.answer(base, req, KINDS)
            return with_headlines(got, by_id), n
        if full is None:
            full = with_headlines(base, by_id)
            with self._lock:
                if self._base is base:
                    self._full = full
        return query.answer(full, req, KINDS)

    def warm(self, entries: list[RunEntry]) -> None:
        """Read what the grid's first block needs (the table, the first rows' headlines)."""
        self.answer(entries, query.RowsRequest(0, query.BLOCK))


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def table_of(catalog) -> Table:
    """The catalog's one Table (the page that warms it and the callback that answers the grid share it)."""
    with _TABLES_LOCK:
        return _TABLES.setdefault(catalog, Table())
