"""The ground-truth catalogue: EP runs whose cause is planted and known (issue 8, section 1).

    python -m profiler.workflows.catalogue --out DIR [--only balanced,host-late,...] [--replicates 3]
    python -m profiler.workflows.catalogue --readme traces     # rewrite traces/README.md's catalogue section

The scenarios, the plan and the facts each rank reports are profiler/workflows/catalogue_plan.py;
the recording is catalogue_record.py, the measurements and expect blocks catalogue_expect.py.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .catalogue_plan import (BY_KEY, CAPACITY, DEFAULT_REPLICATES, DEFAULT_TIMEOUT_S, RANKS, SCENARIOS,  # noqa: F401
                             CatalogueError, Pair, PlannedRun, RankFacts, parse_only, plan)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m profiler.workflows.catalogue", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="directory that receives the run directories")
    ap.add_argument("--only", default=None, help="comma-separated scenario keys (default: all): "
                    + ", ".join(s.key for s in SCENARIOS))
    ap.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES,
                    help=f"runs per side of each comparison (default {DEFAULT_REPLICATES}, at least 2)")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"device wait bound of the scenarios that must not time out (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--overwrite", action="store_true", help="replace run directories that already exist")
    ap.add_argument("--launch-timeout", type=float, default=600.0, help="seconds before the ranks are killed")
    ap.add_argument("--readme", type=Path, default=None, metavar="DIR",
                    help="record nothing: rewrite DIR/README.md's catalogue section from the runs in DIR")
    return ap


def check_args(a) -> list[PlannedRun]:
    if a.readme is not None:
        return []
    if a.out is None:
        raise CatalogueError("--out is required (or --readme DIR)")
    if not a.timeout_s > 0:
        raise CatalogueError(f"--timeout-s must be > 0, got {a.timeout_s}")
    runs = plan(parse_only(a.only), a.replicates)
    if not a.overwrite:
        there = [r.name for r in runs if (a.out / r.name).exists()]
        if there:
            raise CatalogueError(f"{a.out} already holds {', '.join(there)}; pass --overwrite to replace them")
    return runs


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = build_parser().parse_args(argv)
    try:
        runs = check_args(a)
    except CatalogueError as e:
        print(f"profiler.workflows.catalogue: {e}", file=sys.stderr)
        return 2
    if a.readme is not None:
        from .catalogue_expect import rewrite_readme

        path = rewrite_readme(a.readme)
        print(f"profiler.workflows.catalogue: rewrote the catalogue section of {path}")
        return 0
    have = gpu_count()
    if have < RANKS:
        print(f"profiler.workflows.catalogue: the catalogue is recorded on {RANKS} GPUs, this machine has {have} "
              f"(run it on the 2-GPU machine)", file=sys.stderr)
        return 2
    import tempfile

    from .catalogue_expect import finalize
    from .catalogue_record import catalogue_rank
    from ep_core.launch import run_ranks

    a.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="epscope-catalogue-warmup-"))
    opts = {"runs": runs, "out": str(a.out), "scratch": str(scratch), "timeout_s": a.timeout_s,
            "capacity": CAPACITY, "overwrite": a.overwrite}   # runstore replaces a run only when asked
    print(f"profiler.workflows.catalogue: {len(runs)} runs -> {a.out}: " + " ".join(r.name for r in runs), flush=True)
    t0 = time.time()
    try:
        per_rank = run_ranks(catalogue_rank, RANKS, opts, timeout_s=a.launch_timeout)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    print(f"profiler.workflows.catalogue: recorded in {time.time() - t0:.0f} s; measuring and writing the expect blocks",
          flush=True)
    planted_by = " ".join(["python -m profiler.workflows.catalogue", *map(shlex.quote, argv)])
    report = finalize(runs, per_rank, a.out, planted_by)
    print(report.text, flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
