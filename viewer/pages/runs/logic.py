"""Runs page: one row per run directory, from manifests and parquet footers only (no event table
is read): status from the catalog's cheap validation, so corrupt and timed-out runs say so."""
from __future__ import annotations

import pandas as pd

from ...catalog import RunEntry

MAX_TEXT = 300   # characters of a description or config summary shown in a cell

COLUMNS = {
    "name": "run", "workload": "workload", "branch": "branch", "commit": "commit", "config": "config",
    "gpu": "GPU", "headline": "headline", "drops": "dropped records", "clock": "clock uncertainty",
    "status": "status",
}


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
    return f"{head} · warnings: {n:,} events ({len(warnings)} kinds)" if warnings else head


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
            "gpu": f"{gpu.get('count', '')}× {gpu['name']}" if gpu.get("name") else "",
            "headline": _compact(m.get("headline")),
            "drops": int(drops.get("total") or 0),
            "clock": clock_uncertainty_ns(m),
            "status": status(e),
            "ok": e.problem is None and e.status == "ok",
        })
    cols = ["run_id", "name", "directory", "shared_name", "description", *[c for c in COLUMNS if c != "name"], "ok"]
    return pd.DataFrame(rows, columns=cols)
