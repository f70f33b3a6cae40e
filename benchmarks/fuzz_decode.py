"""The long differential fuzz run of the decoder (issue 13): >= 1 M inputs through profiler.decode.decode
and the record-by-record reference decoder (tests/profiler/reference_decoder.py), which must
agree on every table, launch, warning count and error; the result names inputs tried and
failures (0 expected), with the machine, commit and date.

    python3 benchmarks/fuzz_decode.py --inputs 1000000 [--workers 2] [--seed 1] --out benchmarks/results/fuzz-decode-DATE.md

Inputs come from tests/profiler/differential.random_case (valid buffers with byte flips and
cuts, buffers built field by field with extreme values, random bytes), one launch each, seeded
per block of inputs so any failure can be replayed with --replay SEED:INDEX. Launches that
decode are checked in batches of --batch through one decode_launches call (the reference decodes
the same batch: one time base, summed warnings); a batch that differs is re-checked input by
input, and inputs that raise are checked one by one.
"""
from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.machine import commit as machine_commit, cpu_name  # noqa: E402
from tests.profiler.differential import ENGINES  # noqa: E402

BLOCK = 1000  # inputs per seed


def _inputs(seed: int, block: int):
    from profiler.decode.decode import LaunchInfo
    from tests.profiler.differential import random_case
    rng = np.random.default_rng([seed, block])
    for i in range(BLOCK):
        buf = random_case(rng)[0][0]
        yield i, (buf, LaunchInfo(i % 3, block * BLOCK + i, f"k{i % 2}", i, "selftest"))


def run_block(args) -> tuple[int, list[str]]:
    """Check one block of inputs; (inputs tried, failure descriptions)."""
    seed, block, batch = args
    from tests.profiler import reference_decoder as R
    from tests.profiler.differential import REGISTRIES, check
    failures, ok_items, tried = [], [], 0

    def one(i, item):
        try:
            check([item])
        except AssertionError as e:
            failures.append(f"--replay {seed}:{block * BLOCK + i}: {str(e)[:2000]}")

    def flush():
        if not ok_items:
            return
        try:
            check([item for _, item in ok_items])
        except AssertionError:
            for i, item in ok_items:  # find which input of the batch it was
                one(i, item)
        ok_items.clear()

    for i, item in _inputs(seed, block):
        tried += 1
        if isinstance(R.decode_one(item[0], item[1], REGISTRIES["selftest"]), R.RefError):
            one(i, item)
        else:
            ok_items.append((i, item))
            if len(ok_items) >= batch:
                flush()
    flush()
    return tried, failures


def replay(spec: str) -> None:
    from tests.profiler.differential import check
    seed, index = (int(x) for x in spec.split(":"))
    block, i = divmod(index, BLOCK)
    for j, item in _inputs(seed, block):
        if j == i:
            check([item])
            print(f"input {spec} agrees")
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--replay", help="SEED:INDEX of one input to check again")
    a = ap.parse_args()
    if a.replay:
        return replay(a.replay)
    blocks = -(-a.inputs // BLOCK)
    commit, t0, load0 = machine_commit(("profiler", "tests/profiler", "benchmarks")), time.time(), os.getloadavg()
    tried, failures, cpu = 0, [], time.process_time()
    with mp.Pool(a.workers) as pool:
        for k, (n, f) in enumerate(pool.imap_unordered(run_block, [(a.seed, b, a.batch) for b in range(blocks)]), 1):
            tried += n
            failures += f
            if k % 50 == 0 or k == blocks:
                print(f"{tried:,} inputs, {len(failures)} failures, {time.time() - t0:.0f} s", flush=True)
    wall = time.time() - t0
    for f in failures[:20]:
        print(f)
    if a.out:
        now = dt.datetime.now(dt.timezone.utc)
        lines = [f"# Decoder differential fuzz run ({now:%Y-%m-%d})", "",
                 f"- CPU: {cpu_name()} ({os.cpu_count()} cores), {a.workers} worker processes",
                 f"- commit: {commit}, date: {now:%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, numpy {np.__version__}",
                 f"- command: `python3 benchmarks/fuzz_decode.py --inputs {a.inputs} --workers {a.workers} --seed {a.seed} "
                 f"--batch {a.batch} --out ...`",
                 f"- load average at start / end: {load0[0]:.1f} / {os.getloadavg()[0]:.1f}; wall {wall:.0f} s", "",
                 f"**inputs tried: {tried:,}; failures: {len(failures)}**", "",
                 "Each input is one launch buffer from tests/profiler/differential.random_case, decoded by profiler.decode.decode "
                 f"with each of its record loops ({', '.join(ENGINES)}) and by tests/profiler/reference_decoder.py; tables, launches, warning counts and errors (type and byte "
                 "offset) must be equal, with no numpy warning, every time inside its launch's bounds.", ""]
        lines += [f"- {f}" for f in failures[:50]]
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {a.out}")
    del cpu
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
