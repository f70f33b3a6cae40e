"""The long differential corruption run of the run reader (issue 19): single-bit flips of each
data file and every manifest field missing / null / wrong-typed / out of range, each case through
every reader (load_run + events, report, export, check_run deep), with the checks of the CI
harness (tests/test_corruption.py, tests/profiler/damage.py): no traceback, no untyped error,
one-line messages, one verdict in every reader, no silent change of data in runs that carry
checksums, and (every --viewer-every-th case) the viewer's catalog serving a good run beside the
damaged one. Writes a result file naming cases, failures (0 expected), machine, commit and date.

    nice python3 benchmarks/fuzz_runs.py --flips 1000 [--workers 2] [--seed 19] --out benchmarks/results/fuzz-runs-DATE.md

Runs damaged: a synthetic run as this epscope writes it (checksums, format version 2), the same
run as written before checksums (format version 1: flips may change data, which is what
checksums are for: counted, not failures), and the manifest of a bundled trace
(traces/ep-timeout: clock, registry, warnings, expect) for the manifest mutations.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402

BUNDLED = ROOT / "traces" / "ep-timeout"


def _bases(d: Path) -> dict[str, Path]:
    from profiler.groundtruth.synthetic import make_run
    new = make_run(d / "with-checksums", ranks=2, events=800, perfetto=False)
    from tests.profiler.damage import as_written_before_checksums
    old = as_written_before_checksums(Path(shutil.copytree(new, d / "before-checksums")))
    bundled = Path(shutil.copytree(BUNDLED, d / "bundled", ignore=shutil.ignore_patterns("*.perfetto-trace")))
    good = make_run(d / "good", ranks=2, events=800, perfetto=False)
    return {"new": new, "old": old, "bundled": bundled, "good": good}


def _cases(flips: int, seed: int, bases: dict[str, Path], manifests: bool = True):
    """(group, label, base kind, damage spec) for every case, in a fixed order."""
    from tests.profiler.damage import manifest_mutations
    for kind in ("new", "old"):
        for name in ("events.parquet", "launches.parquet"):
            for i in range(flips):
                yield f"flip {name} ({'checksums' if kind == 'new' else 'no checksums'})", f"{seed}:{kind}:{name}:{i}", kind, ("flip", name, i)
    for kind in ("new", "bundled") if manifests else ():
        m = json.loads((bases[kind] / "manifest.json").read_text())
        for label, _ in manifest_mutations(m):
            yield f"manifest field ({'synthetic' if kind == 'new' else BUNDLED.name})", label, kind, ("manifest", label)


def run_block(args) -> list[tuple[str, str, str, list[str]]]:
    """Worker: its share of the cases; returns (group, label, load verdict, failures) per case."""
    cases, seed, viewer_every, base_dir = args
    from tests.profiler.damage import (Reference, failures, manifest_mutations, readers,
                                       viewer_serves_the_others)
    bases = {k: Path(base_dir) / v for k, v in (("new", "with-checksums"), ("old", "before-checksums"),
                                                 ("bundled", "bundled"), ("good", "good"))}
    refs = {k: Reference.of(bases[k]) for k in ("new", "old", "bundled")}
    mutations = {k: dict(manifest_mutations(json.loads((bases[k] / "manifest.json").read_text())))
                 for k in ("new", "bundled")}
    out = []
    with tempfile.TemporaryDirectory(prefix="fuzz-runs-") as tmp:
        tmp = Path(tmp)
        for n, (group, label, kind, spec) in cases:
            root = tmp / f"c{n}"
            run = Path(shutil.copytree(bases[kind], root / "damaged"))
            if spec[0] == "flip":
                _, name, i = spec
                rng = random.Random(f"{seed}-{kind}-{name}-{i}")
                b = bytearray((run / name).read_bytes())
                bit = rng.randrange(len(b) * 8)
                b[bit // 8] ^= 1 << (bit % 8)
                (run / name).write_bytes(bytes(b))
            else:
                (run / "manifest.json").write_text(json.dumps(mutations[kind][spec[1]]))
            res = readers(run, tmp / "out.pftrace")
            bad = failures(res, refs[kind], kind == "new")
            if n % viewer_every == 0:
                shutil.copytree(bases["good"], root / "good")
                bad += viewer_serves_the_others(root, "damaged", "good")
            verdict = res["load"][0]
            if verdict == "ok" and kind == "old" and spec[0] == "flip":
                ev, la = res["load"][1]
                if not (ev.equals(refs[kind].events) and la.equals(refs[kind].launches)):
                    verdict = "ok, data changed"
            out.append((group, label, verdict, bad))
            shutil.rmtree(root)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flips", type=int, default=1000, help="single-bit flips per data file and kind of run")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--viewer-every", type=int, default=50)
    ap.add_argument("--no-manifest", action="store_true", help="flips only (the manifest mutations take most of the time)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    commit, t0, load0 = machine_commit(("profiler", "viewer", "tests", "benchmarks")), time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fuzz-runs-bases-") as base_dir:
        bases = _bases(Path(base_dir))
        cases = list(enumerate(_cases(a.flips, a.seed, bases, not a.no_manifest)))
        blocks = [(cases[w::a.workers], a.seed, a.viewer_every, base_dir) for w in range(a.workers)]
        with mp.get_context("spawn").Pool(a.workers) as pool:
            results = [r for block in pool.map(run_block, blocks) for r in block]
    took = time.time() - t0
    groups: dict[str, dict] = {}
    fails = []
    for group, label, verdict, bad in results:
        g = groups.setdefault(group, {"cases": 0, "verdicts": {}, "failures": 0})
        g["cases"] += 1
        g["verdicts"][verdict] = g["verdicts"].get(verdict, 0) + 1
        g["failures"] += bool(bad)
        fails += [f"{group} {label}: {b}" for b in bad]
    lines = [f"# Run reader corruption fuzz ({dt.date.today().isoformat()})", "",
             f"commit {commit}; {cpu_name()}, {os.cpu_count()} cores, {platform.python_version()}; "
             f"{a.workers} workers under nice; load average {load0[0]:.2f} at start; {took:.0f} s; seed {a.seed}",
             "", f"`nice python3 benchmarks/fuzz_runs.py --flips {a.flips} --workers {a.workers} --seed {a.seed}"
             f"{' --no-manifest' if a.no_manifest else ''} --out ...`",
             "", "Each case through load_run + events, report, export and check_run(deep); a failure is a traceback, "
             "an untyped error, a message of several lines, readers disagreeing on whether the run is readable, "
             "a run with checksums opening with other data, or (every "
             f"{a.viewer_every}th case) the viewer's catalog not serving a good run beside the damaged one.", "",
             "| damage | cases | verdict of load_run (error class or ok) | failures |", "|---|---:|---|---:|"]
    for group, g in groups.items():
        v = ", ".join(f"{k} {n}" for k, n in sorted(g["verdicts"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {group} | {g['cases']:,} | {v} | {g['failures']} |")
    total = sum(g["cases"] for g in groups.values())
    lines += ["", f"**{total:,} cases, {len(fails)} failures.**"]
    if fails:
        lines += ["", "First failures:", *[f"- {f}" for f in fails[:30]]]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
