"""Damaging runs on purpose, for the tests of the reader and the corruption harness.

`reseal(run)` recomputes a run's checksums after a test rewrote a data file: the run then looks
as a buggy or hostile writer would leave it (checksums that match malformed tables), so the
schema checks, not the checksum, must catch it. `flip_bit` and `MANIFEST_MUTATIONS` are the
harness's single-bit flips and manifest edits (tests/profiler/test_corruption.py,
benchmarks/fuzz_runs.py)."""
from __future__ import annotations

import json
import random
from pathlib import Path

from profiler.runreader import DATA_FILES, MANIFEST, file_hash


def reseal(run: Path) -> Path:
    run = Path(run)
    m = json.loads((run / MANIFEST).read_text())
    if "checksums" in m:
        sums = {}
        for name in DATA_FILES:
            with open(run / name, "rb") as f:
                sums[name] = file_hash(f)
        m["checksums"] = sums
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
