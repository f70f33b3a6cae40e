"""Runs page: one row per run directory, from manifests and parquet footers only (no event table
is read): status from the catalog's cheap validation, so corrupt and timed-out runs say so."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd

from profiler.analysis import summary as stored

from ...catalog import RunEntry
from ...format import ns

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
    hashes them through profiler.hashcache under the same key)."""
    out = [json.dumps((manifest or {}).get("registry") or {}, sort_keys=True)]
    for name in (stored.FILE,) + stored.DATA_FILES:
        try:
            st = (path / name).stat()
            out.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((name, None))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _headline(path: str, root: str, signature: tuple) -> tuple:
    """The three cells of a run's stored summary when it is current (profiler.analysis.summary:
    sealed, bound to the manifest's registry and the data files as they are), cached per state:
    the cells only (a few short strings), never the document (a 90 MB summary kept 2.2 GB here)."""
    sm = stored.load(Path(path), manifest={"registry": json.loads(signature[0])}, within=(Path(root),))
    return tuple(_cells(sm).items())


def headline(entry: RunEntry) -> dict:
    """op latency after entry, entry skew and the verdict's cause from the run's stored summary."""
    if entry.problem is not None:
        return _cells(None)
    return dict(_headline(str(entry.path), str(entry.root), _signature(entry.path, entry.manifest)))


def _cells(sm: dict | None) -> dict:
    if sm is None:
        return {"op_latency": NOT_ANALYSED, "entry_skew": "", "verdict": ""}
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
            "verdict": verdict}


def runs_table(entries: list[RunEntry]) -> pd.DataFrame:
    names: dict[str, int] = {}
    for e in entries:
        names[e.name] = names.get(e.name, 0) + 1
    rows = []
    for e in entries:
        m = e.manifest or {}   # checked by profiler.validate: every field has its declared type
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
            **knobs(m), **headline(e),
            "gpu": f"{gpu.get('count', '')}× {gpu['name']}" if gpu.get("name") else "",
            "headline": _compact(m.get("headline")),
            "drops": int(drops.get("total") or 0),
            "clock": clock_uncertainty_ns(m),
            "status": status(e),
            "ok": e.problem is None and e.status == "ok",
        })
    cols = ["run_id", "name", "directory", "shared_name", "description", *[c for c in COLUMNS if c != "name"],
            "config", "headline", "ok"]
    return pd.DataFrame(rows, columns=cols)
