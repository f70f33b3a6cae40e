"""Do two checkouts store the same analysis results? Byte for byte, on copies of runs.

    python3 benchmarks/same_stored.py --a /tmp/base-checkout --b . RUN [RUN ...]

Each checkout analyses its own copy of every RUN (one `python -m profiler analyze` process per
checkout, PYTHONPATH set to it, so an editable install of another tree is not what runs), then
every file under the copies' analysis/ and their analysis-summary.json are compared byte for byte.
Exits 1 and names the files that differ (or exist on one side only). Made for issue 31's graph
build work (branch i31g): a change of the build must leave every stored result as it was.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _stored(run: Path) -> dict[str, bytes]:
    """Relative path -> bytes of what `epscope analyze` stored in `run`."""
    out = {}
    summary = run / "analysis-summary.json"
    if summary.exists():
        out[summary.name] = summary.read_bytes()
    for p in sorted((run / "analysis").rglob("*")):
        if p.is_file():
            out[str(p.relative_to(run))] = p.read_bytes()
    return out


def analyse(checkout: Path, runs: list[Path], into: Path) -> list[Path]:
    """Copies of `runs` (without their stored results) under `into`, analysed by `checkout`."""
    copies = []
    for i, r in enumerate(runs):
        c = into / f"{i:03d}-{r.name}"
        shutil.copytree(r, c, ignore=shutil.ignore_patterns("analysis", "analysis-summary.json", ".epscope*"))
        copies.append(c)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-m", "profiler", "analyze", *map(str, copies)], cwd=checkout, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return copies


def differences(a: list[Path], b: list[Path]) -> list[str]:
    bad = []
    for ra, rb in zip(a, b):
        sa, sb = _stored(ra), _stored(rb)
        if not sa:
            bad.append(f"{ra.name}: nothing stored")
        for k in sorted(set(sa) | set(sb)):
            if sa.get(k) != sb.get(k):
                bad.append(f"{ra.name}/{k}: " + ("differs" if k in sa and k in sb else "on one side only"))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="one checkout (e.g. main's tree)")
    ap.add_argument("--b", type=Path, required=True, help="the other")
    ap.add_argument("--work", type=Path, default=None, help="where the copies go (default: a temporary directory)")
    ap.add_argument("runs", type=Path, nargs="+")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="same-stored-", dir=args.work))
    a = analyse(args.a.resolve(), args.runs, work / "a")
    b = analyse(args.b.resolve(), args.runs, work / "b")
    bad = differences(a, b)
    files = sum(len(_stored(r)) for r in a)
    print(f"{len(args.runs)} runs, {files} stored files compared: " + ("identical" if not bad else f"{len(bad)} differ"))
    for line in bad:
        print("  " + line)
    if not bad:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
