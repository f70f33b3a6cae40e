"""Runs page: one row per run directory, from manifests only (no event table is read)."""
from __future__ import annotations

import pandas as pd

from profiler.runstore import FORMAT_VERSION

from ...catalog import RunEntry

COLUMNS = {
    "name": "run", "workload": "workload", "branch": "branch", "commit": "commit", "config": "config",
    "gpu": "GPU", "headline": "headline", "drops": "dropped records", "clock": "clock uncertainty",
    "status": "status",
}


def _compact(d, limit: int = 8) -> str:
    if not isinstance(d, dict):
        return "" if d is None else str(d)
    items = [(k, v) for k, v in d.items() if not isinstance(v, (dict, list))]
    out = ", ".join(f"{k}={_num(v)}" for k, v in items[:limit])
    return out + (", …" if len(items) > limit else "")


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def clock_uncertainty_ns(manifest: dict) -> float | None:
    """The largest per-rank clock uncertainty of the run (what cross-rank timing can trust)."""
    clock = manifest.get("clock") or {}
    vals = [r.get("uncertainty_ns") for r in clock.get("ranks", []) or [] if isinstance(r, dict)]
    vals = [float(v) for v in vals if isinstance(v, (int, float))]
    return max(vals) if vals else None


def status(entry: RunEntry) -> str:
    if entry.problem:
        return f"unreadable: {entry.problem}"
    m = entry.manifest or {}
    v = m.get("format_version")
    if isinstance(v, int) and v > FORMAT_VERSION:
        return f"newer format v{v} (this viewer reads v{FORMAT_VERSION})"
    if m.get("format") not in (None, "epscope-run"):
        return f"not an epscope run (format {m.get('format')!r})"
    warnings = m.get("warnings") or []
    n = sum(int(w.get("count", 0) or 0) for w in warnings if isinstance(w, dict))
    return f"ok · warnings: {n:,} events ({len(warnings)} kinds)" if warnings else "ok"


def runs_table(entries: list[RunEntry]) -> pd.DataFrame:
    rows = []
    for e in entries:
        m = e.manifest or {}
        git = m.get("git") or {}
        gpu = m.get("gpu") or {}
        drops = m.get("drops") or {}
        unc = clock_uncertainty_ns(m)
        wl = m.get("workload") or {}
        rows.append({
            "run_id": e.run_id,
            "name": e.name,
            "description": str(m.get("description", "")),
            "workload": str(wl.get("kind", "")) if isinstance(wl, dict) else str(wl),
            "branch": str(git.get("branch", "")),
            "commit": str(git.get("commit", ""))[:10] + (" (dirty)" if git.get("dirty") else ""),
            "config": _compact(m.get("config")),
            "gpu": f"{gpu.get('count', '')}× {gpu.get('name')}" if gpu.get("name") else "",
            "headline": _compact(m.get("headline")),
            "drops": int(drops.get("total", 0) or 0) if isinstance(drops, dict) else 0,
            "clock": unc,
            "status": status(e),
            "ok": e.problem is None and status(e).startswith("ok"),
        })
    cols = ["run_id", "name", "description", *[c for c in COLUMNS if c != "name"], "ok"]
    return pd.DataFrame(rows, columns=cols)
