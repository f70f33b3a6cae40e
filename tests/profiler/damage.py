"""Damaging runs on purpose, for the tests of the reader and the corruption harness.

`reseal(run)` recomputes a run's checksums after a test rewrote a data file: the run then looks
as a buggy or hostile writer would leave it (checksums that match malformed tables), so the
schema checks, not the checksum, must catch it. `flip_bit` and `MANIFEST_MUTATIONS` are the
harness's single-bit flips and manifest edits (tests/profiler/test_corruption.py,
benchmarks/fuzz_runs.py)."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from profiler import validate
from profiler.runreader import DATA_FILES, MANIFEST, file_hash


def reseal(run: Path) -> Path:
    """Recompute the run's checksums (where it has them) and its manifest's seal (where it has
    one): what a buggy or hostile writer that knows the format leaves."""
    run = Path(run)
    m = json.loads((run / MANIFEST).read_text())
    if "checksums" in m:
        sums = {}
        for name in DATA_FILES:
            with open(run / name, "rb") as f:
                sums[name] = file_hash(f)
        m["checksums"] = sums
    if validate.SEAL in m:
        m = validate.sealed(m)
    (run / MANIFEST).write_text(json.dumps(m))
    return run


def flip_bit(path: Path, rng: random.Random) -> int:
    """Flip one random bit of the file; returns the bit's index."""
    b = bytearray(path.read_bytes())
    bit = rng.randrange(len(b) * 8)
    b[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(b))
    return bit


# Replacement values of a manifest field: null, a value of the wrong type, one out of range.
WRONG_VALUES = {"null": None, "string": "x", "number": -1.5, "list": [1, "a"], "object": {"a": None},
                "bool": True, "huge": 1 << 70, "negative": -7}


def _paths(v, prefix=()):
    """Every path (tuple of keys / list indices) into a JSON value, containers included."""
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v[:3]):   # the first items of a list stand for the rest
            yield from _paths(x, prefix + (i,))


def _set(m, path, value, delete=False):
    m = json.loads(json.dumps(m))
    d = m
    for k in path[:-1]:
        d = d[k]
    if delete:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return m


def manifest_mutations(m: dict):
    """(label, manifest) for every field of m (nested ones included): missing, and set to each
    of WRONG_VALUES."""
    for path in _paths(m):
        if not path:
            continue
        label = ".".join(map(str, path))
        yield f"{label}=missing", _set(m, path, None, delete=True)
        for name, v in WRONG_VALUES.items():
            yield f"{label}={name}", _set(m, path, v)


# -- the differential corruption harness ------------------------------------------------------------
READERS = ("load", "report", "export", "check")


@dataclass
class Reference:
    """What the undamaged run holds (the data a damaged copy must either equal or refuse)."""
    events: "object"
    launches: "object"

    @classmethod
    def of(cls, run: Path) -> "Reference":
        from profiler.runreader import load_run
        r = load_run(run)
        return cls(r.events, r.launches)


def readers(run: Path, out: Path) -> dict[str, tuple[str, object]]:
    """Each reader on the run: ("ok", value), (typed error class name, message) or
    ("UNTYPED", "<class>: <message>") for anything else (a traceback a user would see)."""
    from profiler.errors import EpscopeError
    from profiler.perfetto_export import export_perfetto
    from profiler.report import report
    from profiler.runreader import check_run, load_run

    def load():
        r = load_run(run)
        return r.events, r.launches
    res = {}
    for name, fn in (("load", load), ("report", lambda: report(run)),
                     ("export", lambda: export_perfetto(run, out, force=True)),
                     ("check", lambda: check_run(run, deep=True))):
        try:
            v = fn()
            if name == "check" and v.damaged:
                res[name] = ("damaged", v.problem)
            else:
                res[name] = ("ok", v)
        except EpscopeError as e:
            res[name] = (type(e).__name__, str(e))
        except Exception as e:   # noqa: BLE001 -- what the harness is looking for
            res[name] = ("UNTYPED", f"{type(e).__name__}: {e}")
    return res


def failures(res: dict, ref: Reference | None, checksummed: bool) -> list[str]:
    """What is wrong with one case's results: tracebacks, untyped errors, multi-line messages,
    readers that disagree on whether the run is readable, data changed without an error in a
    run that carries checksums."""
    bad = []
    for name, (state, detail) in res.items():
        if state == "UNTYPED":
            bad.append(f"{name}: untyped {detail[:300]}")
        elif state not in ("ok", "damaged") and "\n" in str(detail):
            bad.append(f"{name}: message of several lines")
    # TooWideToAnalyse: the run was read, its analyses cannot index it (lanes x time range past
    # 62 bits: a flipped timestamp far from the rest); a typed refusal of the analysis, not of the run
    accepted = {name: state in ("ok", "TooWideToAnalyse") for name, (state, _) in res.items()}
    if len(set(accepted.values())) != 1:
        bad.append("readers disagree: " + ", ".join(f"{n}={s}" for n, (s, _) in res.items()))
    if checksummed and ref is not None and res["load"][0] == "ok":
        ev, la = res["load"][1]
        if not (ev.equals(ref.events) and la.equals(ref.launches)):
            bad.append("silent change: the damaged run opened with other data")
    return bad


def viewer_serves_the_others(root: Path, damaged: str, good: str) -> list[str]:
    """The viewer's catalog starts on a root holding the damaged run and a good one, lists the
    damaged run (with its problem when it has one), loads the good one, and the Runs and
    progress pages' logic reads every entry."""
    bad = []
    try:
        from viewer.catalog import Catalog, ViewerError
        from viewer.pages.progress import logic as progress_logic
        from viewer.pages.runs import logic as runs_logic
        cat = Catalog([root], workers=1)
        ids = set(cat.ids())
        if damaged not in ids or good not in ids:
            bad.append(f"viewer: runs missing from the list ({sorted(ids)})")
        if cat.load(good).events.empty:
            bad.append("viewer: the good run loads empty")
        runs_logic.runs_table(cat.entries())
        for e in cat.entries():
            progress_logic.run_summary(e)
        try:
            cat.load(damaged)
        except ViewerError:
            pass
    except Exception as e:   # noqa: BLE001
        bad.append(f"viewer: {type(e).__name__}: {str(e)[:300]}")
    return bad
