"""Are two code trees' stored analyses byte-identical? `epscope analyze` on copies of runs.

    python3 benchmarks/analyze_identity.py --base /tmp/base_tree --new . [--max-events N] RUN [RUN ...]

Each run is copied twice under a scratch directory (analyze writes into the run), its stored
results removed from the copies, and each copy analysed by one fresh process per tree
(PYTHONPATH=tree, `profiler.commands.cli.main`). Then every file of RUN/analysis/ and
RUN/analysis-summary.json is compared byte for byte. --max-events lowers chunked.MAX_EVENTS in both
processes, so small runs go through the chunked path too (1: one iteration a chunk). Exit status 1
when any file differs or is missing on one side.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = ("analysis", "analysis-summary.json")


def _copy(run: Path, dest: Path) -> Path:
    out = dest / run.name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns(*RESULTS))
    return out


def _analyze(tree: Path, runs: list[Path], max_events: int | None) -> None:
    code = "import sys\n"
    if max_events is not None:
        code += f"import profiler.analysis.chunked as c\nc.MAX_EVENTS = {max_events}\n"
    code += ("from profiler.commands.cli import main\n"
             "sys.argv = ['epscope', 'analyze', *sys.argv[1:]]\nsys.exit(main())\n")
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-c", code, *map(str, runs)], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def _files(run: Path) -> dict[str, Path]:
    out = {}
    for name in RESULTS:
        p = run / name
        if p.is_file():
            out[name] = p
        elif p.is_dir():
            out.update({str(f.relative_to(run)): f for f in sorted(p.rglob("*")) if f.is_file()})
    return out


def compare(a: Path, b: Path) -> list[str]:
    fa, fb = _files(a), _files(b)
    diffs = [f"{a.name}: only in {'base' if k in fa else 'new'}: {k}" for k in sorted(set(fa) ^ set(fb))]
    diffs += [f"{a.name}: differs: {k}" for k in sorted(set(fa) & set(fb))
              if fa[k].read_bytes() != fb[k].read_bytes()]
    if not fa:
        diffs.append(f"{a.name}: no stored results")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--max-events", type=int, default=None)
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("runs", type=Path, nargs="+")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="identity-", dir=args.scratch))
    try:
        sides = {}
        for side, tree in (("base", args.base), ("new", args.new)):
            (scratch / side).mkdir()
            copies = [_copy(r, scratch / side) for r in args.runs]
            _analyze(tree.resolve(), copies, args.max_events)
            sides[side] = copies
        diffs = [d for a, b in zip(sides["base"], sides["new"]) for d in compare(a, b)]
        n = sum(len(_files(a)) for a in sides["base"])
        print(f"{len(args.runs)} runs, {n} files compared, {len(diffs)} differences")
        for d in diffs:
            print("  " + d)
        return 1 if diffs else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
