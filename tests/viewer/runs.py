"""Small run directories for the viewer tests: synthetic runs from profiler.synthetic and
hand-broken ones (missing events, corrupt manifest, newer format, empty table)."""
from __future__ import annotations

import json
from pathlib import Path

from profiler.synthetic import make_run


def synthetic(root: Path, name: str, scenario: str = "balanced", events: int = 6000, **kw) -> Path:
    return make_run(root / name, ranks=2, events=events, scenario=scenario, perfetto=False, **kw)


def broken_runs(root: Path, good: Path) -> dict[str, Path]:
    """Run directories each of which must produce a clear message, never a traceback."""
    out = {}
    # corrupt: manifest is fine, events.parquet is garbage
    d = root / "corrupt-events"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text((good / "manifest.json").read_text())
    (d / "events.parquet").write_bytes(b"PAR1 this is not parquet")
    (d / "launches.parquet").write_bytes((good / "launches.parquet").read_bytes())
    out["corrupt"] = d
    # newer format
    d = root / "from-the-future"
    d.mkdir()
    m = json.loads((good / "manifest.json").read_text())
    m["format_version"] = 99
    (d / "manifest.json").write_text(json.dumps(m))
    for f in ("events.parquet", "launches.parquet"):
        (d / f).write_bytes((good / f).read_bytes())
    out["newer"] = d
    # unreadable manifest
    d = root / "bad-manifest"
    d.mkdir()
    (d / "manifest.json").write_text("{ not json")
    out["bad_manifest"] = d
    # missing events file
    d = root / "no-events"
    d.mkdir()
    (d / "manifest.json").write_text((good / "manifest.json").read_text())
    out["missing"] = d
    return out


def empty_run(root: Path, good: Path) -> Path:
    from profiler import runstore
    from profiler.schema import empty_events

    run = runstore.load_run(good)
    return runstore.write_run(root / "empty-run", empty_events(), run.launches.iloc[0:0], dict(run.manifest),
                              perfetto=False)
