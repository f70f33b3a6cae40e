"""Small run directories for the viewer tests: synthetic runs from profiler.groundtruth.synthetic and
hand-broken ones (missing events, corrupt manifest, newer format, empty table, wrong field
types, a 5,000-deep manifest, files linked out of the root, a timeout, a copy of a run)."""
from __future__ import annotations

import json
from pathlib import Path

from profiler.groundtruth.synthetic import make_run


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
    # valid JSON, wrong field types (issue 13): each one alone broke the Runs page for every run
    for name, field, value in (("git-string", "git", "abc"), ("clock-list", "clock", [1, 2]),
                               ("drops-many", "drops", {"total": "many"})):
        out[name] = _copy_with(root / name, good, {field: value})
    d = root / "deep-manifest"
    d.mkdir()
    (d / "manifest.json").write_text('{"format": "epscope-run", "format_version": 1, "x": '
                                     + "[" * 5000 + "]" * 5000 + "}")
    for f in ("events.parquet", "launches.parquet"):
        (d / f).write_bytes((good / f).read_bytes())
    out["deep"] = d
    # the manifest says more events than events.parquet holds (a copy gone wrong)
    out["short"] = _copy_with(root / "row-count-mismatch", good, {"num_events": 3})
    return out


def _copy_with(d: Path, good: Path, changes: dict) -> Path:
    """A copy of the run with its manifest changed and sealed again (as a writer would leave it:
    what the changed field says decides, not the seal)."""
    from profiler.store import validate

    d.mkdir(parents=True)
    m = json.loads((good / "manifest.json").read_text())
    m.update(changes)
    (d / "manifest.json").write_text(json.dumps(validate.sealed(m) if validate.SEAL in m else m))
    for f in ("events.parquet", "launches.parquet"):
        (d / f).write_bytes((good / f).read_bytes())
    return d


def timeout_run(root: Path, good: Path) -> Path:
    """A copy of a good run whose recording says it timed out (as ep_core's forced timeout does)."""
    return _copy_with(root / "timed-out", good, {"status": "timeout",
                                                 "error": "rank 0: dispatch timed out waiting for rank 1"})


def same_name_copy(root: Path, good: Path) -> Path:
    """A byte-for-byte copy of a run in another directory: same manifest name."""
    return _copy_with(root / "copy-of-balanced", good, {})


def linked_out(root: Path, outside: Path) -> dict[str, Path]:
    """Runs under the root whose files are symlinks to files outside it (issue 13)."""
    import os

    secret = outside / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    good = outside / "good-run"
    out = {}
    for f in ("trace.perfetto-trace", "manifest.json", "events.parquet"):
        d = root / f"link-{f.split('.')[0]}"
        d.mkdir(parents=True)
        for g in ("manifest.json", "events.parquet", "launches.parquet"):
            os.symlink(good / g, d / g) if g == f else (d / g).write_bytes((good / g).read_bytes())
        if f == "trace.perfetto-trace":
            os.symlink(secret, d / f)
        out[f] = d
    return out


def empty_run(root: Path, good: Path) -> Path:
    from profiler.store import runstore
    from profiler.store.schema import empty_events

    run = runstore.load_run(good)
    return runstore.write_run(root / "empty-run", empty_events(), run.launches.iloc[0:0], dict(run.manifest),
                              perfetto=False)
