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
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = ("analysis", "analysis-summary.json")
WHAT_IF = "analysis/whatif/"
INDEX = "analysis/results.json"
# run by the --new tree's Python path: prints each pair of what-if inputs (base, new) that differ
SAME_ARRAYS = """
import sys, numpy as np
from profiler.analysis import spill, whatif
for a, b in zip(sys.argv[1::2], sys.argv[2::2]):
    x, y = spill.read(a), spill.read(b)
    bad = sorted(set(x) ^ set(y)) + [k for k in x if k in y and not (np.array_equal(x[k], y[k])
           and (x[k].dtype == y[k].dtype or k in whatif.NARROW))]
    if bad:
        print(b, *bad)
"""


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


def _index_content(p: Path) -> dict:
    """The stored index less its seal and its what-if inputs' checksums and sizes."""
    i = json.loads(p.read_text())
    i.pop("seal", None)
    for c in (i.get("what_if") or {}).get("chunks", []):
        c.pop("sha256", None), c.pop("bytes", None)
    return i


def _what_if_differs(tree: Path, pairs: list[tuple[Path, Path]]) -> set[str]:
    """The new sides of the (base, new) what-if inputs whose contents differ."""
    if not pairs:
        return set()
    out = subprocess.run([sys.executable, "-c", SAME_ARRAYS, *(str(p) for pair in pairs for p in pair)], cwd=tree,
                         env=dict(os.environ, PYTHONPATH=str(tree)), check=True, capture_output=True, text=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def compare(a: Path, b: Path, what_if_tree: Path | None = None) -> list[str]:
    """The differences of two copies' stored results; what_if_tree: the tree that compares the
    what-if inputs by content (and the index less their checksums), None: byte for byte."""
    fa, fb = _files(a), _files(b)
    diffs = [f"{a.name}: only in {'base' if k in fa else 'new'}: {k}" for k in sorted(set(fa) ^ set(fb))]
    by_content = set()
    if what_if_tree is not None:
        by_content = {k for k in set(fa) & set(fb) if k.startswith(WHAT_IF) or k == INDEX}
        pairs = [(fa[k], fb[k]) for k in sorted(by_content) if k.startswith(WHAT_IF)]
        bad = _what_if_differs(what_if_tree, pairs)
        diffs += [f"{a.name}: content differs: {k}" for k in sorted(by_content)
                  if (k == INDEX and _index_content(fa[k]) != _index_content(fb[k])) or str(fb[k]) in bad]
    diffs += [f"{a.name}: differs: {k}" for k in sorted(set(fa) & set(fb) - by_content)
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
    ap.add_argument("--what-if-by-content", action="store_true")
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
        tree = args.new.resolve() if args.what_if_by_content else None
        diffs = [d for a, b in zip(sides["base"], sides["new"]) for d in compare(a, b, tree)]
        n = sum(len(_files(a)) for a in sides["base"])
        print(f"{len(args.runs)} runs, {n} files compared, {len(diffs)} differences")
        for d in diffs:
            print("  " + d)
        return 1 if diffs else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
