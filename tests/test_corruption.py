"""The differential corruption harness (issue 19), the CI-sized part; benchmarks/fuzz_runs.py
runs the long one (>= 1,000 single-bit flips per data file, every manifest field) and records it.

Damage, seeded: single-bit flips of each data file, in a run that carries checksums and in the
same run as written before checksums (format version 1); every top-level field of the manifest
missing and null, and a sample of every field (nested ones included) missing, null,
wrong-typed and out of range. For each case every reader runs
(load_run + events, report, export, check_run deep) and must give: no traceback, no untyped
error, one-line messages, the same verdict in every reader, and, in a run that carries
checksums, either an error or exactly the original data. For a sample of cases the viewer's
catalog must start on a root holding the damaged run, list it, and serve a good run beside it.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from profiler.groundtruth.synthetic import make_run
from tests.profiler.damage import (Reference, as_written_before_checksums, failures, flip_bit, manifest_mutations, readers,
                                   viewer_serves_the_others)

SEED = 19
# CI sizes: ~110 cases at ~0.3 s of CPU each (each through load, report with its analyses, export
# and a deep check): 35-39 s of CPU for the module on the shared 2-core dev machine (load 4). The
# benchmark (benchmarks/fuzz_runs.py) runs 1,000 flips per file and every manifest mutation.
FLIPS_PER_FILE = 12          # per data file and per kind of run
MANIFEST_SAMPLE = 30         # of the ~900 nested-field mutations, beside every top-level field missing and null
VIEWER_EVERY = 10            # every 10th case also starts a viewer catalog


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("corruption")
    new = make_run(d / "with-checksums", ranks=2, events=800, perfetto=False)
    old = as_written_before_checksums(Path(shutil.copytree(new, d / "before-checksums")))
    good = make_run(d / "good", ranks=2, events=800, perfetto=False)
    return {"new": (new, Reference.of(new)), "old": (old, Reference.of(old)), "good": good}


def _case(base: Path, tmp: Path, n: int) -> tuple[Path, Path]:
    root = tmp / f"root{n}"
    run = Path(shutil.copytree(base, root / "damaged"))
    return root, run


def _check(root, run, res, ref, checksummed, n, good):
    bad = failures(res, ref, checksummed)
    if n % VIEWER_EVERY == 0:
        shutil.copytree(good, root / "good")
        bad += viewer_serves_the_others(root, "damaged", "good")
    return bad


@pytest.mark.parametrize("kind", ["new", "old"])
@pytest.mark.parametrize("name", ["events.parquet", "launches.parquet"])
def test_single_bit_flips(bases, tmp_path, kind, name):
    base, ref = bases[kind]
    rng = random.Random(f"{SEED}-{kind}-{name}")
    problems, refused = [], 0
    for n in range(FLIPS_PER_FILE):
        root, run = _case(base, tmp_path, n)
        bit = flip_bit(run / name, rng)
        res = readers(run, tmp_path / "out.pftrace")
        refused += res["load"][0] != "ok"
        problems += [f"bit {bit}: {p}" for p in _check(root, run, res, ref, kind == "new", n, bases["good"])]
        shutil.rmtree(root)
    assert not problems, problems[:10]
    if kind == "new":   # a run with checksums refuses every flip, naming the file
        assert refused == FLIPS_PER_FILE


def test_manifest_fields(bases, tmp_path):
    base, ref = bases["new"]
    m = json.loads((base / "manifest.json").read_text())
    cases = list(manifest_mutations(m))
    top = [c for c in cases if "." not in c[0].split("=")[0] and c[0].endswith(("=missing", "=null"))]
    rng = random.Random(SEED)
    sample = top + rng.sample([c for c in cases if c not in top], min(MANIFEST_SAMPLE, len(cases) - len(top)))
    problems = []
    for n, (label, mm) in enumerate(sample):
        root, run = _case(base, tmp_path, n)
        (run / "manifest.json").write_text(json.dumps(mm))
        res = readers(run, tmp_path / "out.pftrace")
        problems += [f"{label}: {p}" for p in _check(root, run, res, ref, True, n, bases["good"])]
        shutil.rmtree(root)
    assert not problems, problems[:10]


# -- issue 32: what surrounds the data files (benchmarks/damage_classes.py runs >= 100 a class) -------
CLASS_SAMPLE = {"resealed tables": 7, "lying manifests": 10, "downgrades": 8, "stored analyses": 9,
                "analyze against a rewrite": 3}


@pytest.mark.parametrize("name", list(CLASS_SAMPLE))
def test_damage_around_the_data_files_is_never_silent(tmp_path, name):
    from tests.profiler.damage import run_class
    r = run_class(name, CLASS_SAMPLE[name], SEED + 13, tmp_path)
    assert r.cases == CLASS_SAMPLE[name]
    assert not r.silent and not r.tracebacks, (r.silent[:5], r.tracebacks[:5])


def test_special_files_hang_no_reader_and_are_served_by_no_one(tmp_path):
    """A sample of the 48 special-file cases (every file a run holds once, the kinds in turn); the
    benchmark runs them all."""
    import tests.profiler.damage as D
    cases = list(D.special_file_cases(tmp_path / "outside"))
    sample = [cases[i * len(D.SPECIAL_KINDS) + i % len(D.SPECIAL_KINDS)] for i in range(len(D.SPECIAL_TARGETS))]
    (tmp_path / "outside").mkdir()
    base = D.make_base(tmp_path / "bases")
    for i, (label, damage) in enumerate(sample):
        root = tmp_path / f"case{i}"
        run = Path(shutil.copytree(base, root / "damaged"))
        damage(run)
        silent, bad = D._special_served(label, run, root)
        res = D.readers32(run, tmp_path / "out.pftrace", timeout_s=60)
        s2, b2 = D._special_outcome(label, run, root, res, base)
        assert not (silent or s2) and not (bad or b2), (label, bad + b2, res)
