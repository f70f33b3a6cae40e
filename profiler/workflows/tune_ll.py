"""`epscope tune --ll`: the low-latency kernels' geometry and knobs, per T_max bucket, ranked and
re-checked exactly as the normal sweep (profiler/workflows/tune.py's `tune`), saved as ll_dispatch /
ll_combine entries of the tuned table.

    epscope tune --ll                                   # 2 ranks, hidden 7168, top-8 of 256, FP8
    epscope tune --ll --buckets 16,64,128,256 --blocks 32,64,96,128 --warps 8,16 \\
        --knobs "min_slice_groups=2,8" --rounds 4 --recheck-rounds 6 --iters 40
    epscope tune --ll --dry-run                         # the candidates, nothing run

The shape is the decode shape of issue 10 (benchmarks/gpu/ll_bench.py): uniform routing, FP8
dispatch (or --dtype bf16), BF16 combine. A bucket (`tuned.ll_buckets`: 1..16, 17..64, 65..128,
129..256 by default) is tuned at its top, num_max_dispatch_tokens_per_rank = tokens = the top (the
most work the bucket holds), and its entries govern T_max in the bucket only.

Candidates (why these): the grid (--blocks x --warps) with the knobs at their defaults, then each
--knobs value at the default grid; not the full product: the knobs act inside a grid, and the
cross product would multiply the rounds for pairs nothing suggests interact. The default sweep is
8 grids (32..128 blocks: 64 is the default, the GPU has 132 SMs and an "all" barrier needs the
whole grid resident; 8 or 16 warps) and min_slice_groups 2 and 8 (the neighbours of seed 002's
measured floor 4; 1 measured 2.4x slower at 128 tokens, benchmarks/results/
ll-stories-2xH200-2026-11-30-418ddf3.log). The old behaviours of split / barrier / loads measured
slower on every story and are left out by default (`--knobs "split=per_block;barrier=all"` adds
them). `host` is refused: it changes the host's per-call work, which the device latency ranked
here cannot see. A candidate equal to the incumbent is dropped (it would be an A/A pair).
With 9 candidates + the incumbent, 3 screening rounds, top 2 per kernel, 4 re-check rounds and 4
buckets: 4 x (30 + 2 x 2 x 8) = 248 rounds of ~45 iterations of a few hundred µs each (the lead
spin dominates): about 10 s of rounds after the workers start (~30 s).

Before ranking, every candidate runs once per bucket against the incumbent's results (ll_check:
the dispatch's valid rows, counts, handle and the combined rows, bit for bit: the knobs are
documented to give identical bits); a candidate that differs is dropped, and the output says so.
The incumbent is what ep_core uses today for the bucket: the table's entry, else LowLatencyConfig().
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .tune_sweep import NORMAL_DEFAULTS, TuneUsage, _int_list, check_common, enough_gpus
from ep_core.tuned import LL_KERNELS, TunedKey, TunedTableError, ll_buckets

LL_DEFAULTS = {"buckets": "16,64,128,256", "blocks": "32,64,96,128", "warps": "8,16",
               "knobs": "min_slice_groups=2,8"}
HOST_KNOB = "host"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("low-latency kernels (with --ll)")
    g.add_argument("--buckets", default=None, help="T_max bucket tops, increasing (each bucket is tuned at its top; "
                   f"default {LL_DEFAULTS['buckets']})")
    g.add_argument("--blocks", default=None, help=f"grid sizes to try (default {LL_DEFAULTS['blocks']})")
    g.add_argument("--warps", default=None, help=f"warps per block to try (default {LL_DEFAULTS['warps']})")
    g.add_argument("--knobs", default=None, help="knob values to try at the default grid, 'knob=v1,v2;knob=v' "
                   f"(knobs split, barrier, min_slice_groups, loads; default {LL_DEFAULTS['knobs']!r})")


def check_family(a) -> None:
    """Flags of the other kernel family are refused (they would be silently ignored)."""
    other = [k for k in (NORMAL_DEFAULTS if a.ll else LL_DEFAULTS) if getattr(a, k) is not None]
    if other:
        flags = ", ".join("--" + k.replace("_", "-") for k in other)
        raise TuneUsage(f"{flags}: {'the normal kernels' if a.ll else 'the low-latency kernels (--ll)'} "
                        f"only; {'--ll tunes per T_max bucket (--buckets)' if a.ll else 'add --ll'}")


@dataclass(frozen=True)
class LLShape:
    ranks: int
    hidden: int
    topk: int
    experts: int
    dtype: str       # the dispatch's payload ("fp8" or "bf16"); combine is BF16
    seed: int

    def dtype_of(self, kernel: str) -> str:
        return self.dtype if kernel == "ll_dispatch" else "bf16"


@dataclass(frozen=True)
class LLCandidate:
    name: str
    config: object   # LowLatencyConfig; the same for both kernels (they are ranked apart)

    def configs(self, ranks: int) -> dict:
        return {k: self.config.to_dict() for k in LL_KERNELS}


def _ints(text: str, flag: str) -> list[int]:
    out = _int_list(text, flag)
    if not out:
        raise TuneUsage(f"{flag}: give at least one value")
    if len(set(out)) != len(out):
        raise TuneUsage(f"{flag} lists a value twice: {text!r}")
    return out


def parse_knobs(text: str) -> dict[str, list]:
    """'min_slice_groups=2,8;split=per_block' -> {knob: [values]} (knob names and kinds checked)."""
    from ep_core.low_latency_layout import LowLatencyConfig

    out: dict[str, list] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, eq, values = part.partition("=")
        name = name.strip()
        if not eq or not values.strip():
            raise TuneUsage(f"--knobs: {part!r} is not 'knob=value[,value...]'")
        if name == HOST_KNOB:
            raise TuneUsage("--knobs: 'host' changes the host's per-call work, which the device latency tuned here "
                             "cannot see; it stays at LowLatencyConfig's default")
        if name not in LowLatencyConfig.KNOBS:
            raise TuneUsage(f"--knobs: no knob {name!r}; the knobs are "
                             f"{tuple(k for k in LowLatencyConfig.KNOBS if k != HOST_KNOB)}")
        if name in out:
            raise TuneUsage(f"--knobs: {name} given twice")
        kind = type(getattr(LowLatencyConfig(), name))
        vals = []
        for v in (v.strip() for v in values.split(",")):
            try:
                vals.append(kind(v))
            except ValueError:
                raise TuneUsage(f"--knobs: {name}={v!r} is not {'an integer' if kind is int else 'a value'}") from None
        out[name] = vals
    return out


def candidates(blocks_text: str, warps_text: str, knobs_text: str, ranks: int) -> list[LLCandidate]:
    """The grid with default knobs, then each knob value at the default grid (module docstring);
    the defaults themselves as the candidate 'defaults' (dropped per bucket when the incumbent is
    the defaults)."""
    from ep_core.low_latency_layout import LowLatencyConfig

    base = LowLatencyConfig()
    specs = [("defaults", {})]
    for nb in _ints(blocks_text, "--blocks"):
        for wpb in _ints(warps_text, "--warps"):
            if (nb, wpb) != (base.num_blocks, base.warps_per_block):
                specs.append((f"b{nb}-w{wpb}", {"num_blocks": nb, "warps_per_block": wpb}))
    for name, values in parse_knobs(knobs_text).items():
        for v in values:
            if v != getattr(base, name):
                specs.append((f"{name}-{v}", {name: v}))
    out = []
    for name, fields in specs:
        try:
            cfg = dataclasses.replace(base, **fields)
            cfg.check_geometry(ranks)
        except (TypeError, ValueError) as e:
            raise TuneUsage(f"candidate {name}: {e}") from None
        out.append(LLCandidate(name, cfg))
    return out


def check_settings(a, env=None) -> tuple:
    """(LLShape, Settings, [(tokens_min, tokens_max)], candidates); raises TuneUsage naming the bad
    setting. The shared settings (rounds, margin, ...) are the normal sweep's."""
    from ep_core.config import MAX_TOPK
    from ep_core.low_latency_layout import LowLatencyLayout

    env = dict(os.environ if env is None else env)
    check_family(a)
    s = check_common(a, env, geometry_env=())   # the EPSCOPE_*_SENDER_FRACTION overrides shape the normal kernels
    try:
        buckets = ll_buckets(_ints(a.buckets or LL_DEFAULTS["buckets"], "--buckets"))
    except TunedTableError as e:
        raise TuneUsage(f"--buckets: {e}") from None
    shape = LLShape(a.ranks, a.hidden, a.topk, a.experts, a.dtype or "fp8", a.seed)
    if not 1 <= shape.topk <= MAX_TOPK:
        raise TuneUsage(f"--topk must be in 1..{MAX_TOPK}, got {shape.topk}")
    try:
        LowLatencyLayout(buckets[-1][1], shape.hidden, shape.ranks, shape.experts)
    except (TypeError, ValueError) as e:
        raise TuneUsage(str(e)) from None
    if shape.ranks < 2:
        raise TuneUsage(f"--ranks must be >= 2 (the low-latency ops exchange between ranks), got {shape.ranks}")
    cands = candidates(a.blocks or LL_DEFAULTS["blocks"], a.warps or LL_DEFAULTS["warps"],
                       LL_DEFAULTS["knobs"] if a.knobs is None else a.knobs, shape.ranks)
    return shape, s, buckets, cands


def incumbent_configs(key_for, table: Path) -> tuple[dict, dict]:
    """{kernel: LowLatencyConfig dict} ep_core uses today for this bucket, and {kernel: why}."""
    from ep_core.low_latency_layout import LowLatencyConfig
    from ep_core.tuned import load_table, lookup

    entries = load_table(table) if table.exists() else []
    configs, why = {}, {}
    for k in LL_KERNELS:
        m = lookup(entries, k, key_for(k), str(table))
        configs[k] = m.entry.config if m.entry else LowLatencyConfig().to_dict()
        why[k] = m.reason if m.entry else f"LowLatencyConfig() defaults ({m.reason})"
    return configs, why


def for_bucket(cands: list[LLCandidate], incumbent: dict) -> list[LLCandidate]:
    """The candidates worth running against this incumbent: not one equal to it for both kernels."""
    return [c for c in cands if any(c.config.to_dict() != incumbent[k] for k in LL_KERNELS)]


def main(a, argv) -> int:
    try:
        shape, s, buckets, cands = check_settings(a)
    except TuneUsage as e:
        print(f"epscope tune: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(f"epscope tune --ll: {len(cands)} candidates (less any equal to a bucket's incumbent) x {s.rounds} "
              f"rounds, then the top {s.top} per kernel x {s.recheck_rounds} re-check rounds, per bucket "
              f"{', '.join(f'{lo}..{hi}' for lo, hi in buckets)} (T_max, tuned at the top); margin "
              f"{100 * s.margin:.1f}%")
        for c in cands:
            print(f"  {c.name}: {c.config.to_dict()}")
        return 0
    if not enough_gpus(shape.ranks):
        return 2
    return _run(a, argv, shape, s, buckets, cands)


def write_inputs(directory: Path, shape: LLShape, max_tokens: int) -> Path:
    """What every rank's worker builds its low-latency inputs from (profiler/workflows/ab_worker.py)."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    spec = {"hidden": shape.hidden, "topk": shape.topk, "experts": shape.experts, "max_tokens": max_tokens,
            "seed": shape.seed, "use_fp8": shape.dtype == "fp8"}
    for r in range(shape.ranks):
        torch.save({"low_latency": spec}, directory / f"rank{r}.pt")
    return directory


def _run(a, argv, shape: LLShape, s, buckets, cands) -> int:
    from profiler.record.session import git_info

    from .ab import repo_root
    from .ab_worker import LL_METRICS
    from .rounds import WorkerSet, slowest_rank
    from .tune_sweep import INCUMBENT, entries_for, print_results, tune
    from ep_core.tuned import save_entries

    work = Path(tempfile.mkdtemp(prefix="epscope-tune-ll-"))
    inputs = write_inputs(work / "inputs", shape, buckets[-1][1])
    ws = WorkerSet("tune-ll", repo_root(), shape.ranks, inputs, work / "logs",
                   env={"EPSCOPE_TUNED_TABLE": "off"}, profile=False)   # every round passes its configs
    command = "epscope tune " + " ".join(map(shlex.quote, argv))
    commit = git_info()["commit"]
    t0 = time.time()
    saved = []

    def say(m):
        print(f"[epscope tune --ll {time.strftime('%H:%M:%S')}] {m}", flush=True)

    with ws:
        gpu = ws.start()[0]["gpu"]
        say(f"workers ready on {gpu} in {time.time() - t0:.0f} s (logs {work / 'logs'})")
        for lo, hi in buckets:
            def key_for(kernel, hi=hi):
                return TunedKey(gpu, shape.ranks, shape.dtype_of(kernel), shape.hidden, hi)

            incumbent, why = incumbent_configs(key_for, a.table)
            for k, w in why.items():
                say(f"T_max {lo}..{hi}: incumbent {k}: {incumbent[k]} ({w})")
            bucket_cands = for_bucket(cands, incumbent)
            ref = incumbent["ll_dispatch"]
            differ = {}
            for r in ws.request({"cmd": "ll_check", "tokens": hi, "reference": ref,
                                 "configs": {c.name: c.config.to_dict() for c in bucket_cands}}, a.round_timeout):
                for n, what in r["differ"].items():
                    differ.setdefault(n, []).append(what)
            if incumbent["ll_combine"] != ref:   # the combine's incumbent is checked against the dispatch's
                for r in ws.request({"cmd": "ll_check", "tokens": hi, "reference": ref,
                                     "configs": {INCUMBENT: incumbent["ll_combine"]}}, a.round_timeout):
                    if r["differ"]:
                        raise RuntimeError(f"T_max {hi}: the two incumbents' results differ: {r['differ']}")
            for n, what in differ.items():
                say(f"T_max {lo}..{hi}: dropped {n}: its results differ from the incumbent's ({'; '.join(what)})")
            bucket_cands = [c for c in bucket_cands if c.name not in differ]
            if not bucket_cands:
                say(f"T_max {lo}..{hi}: no candidate left; nothing saved for this bucket")
                continue

            def run_round(name, i, configs, hi=hi):
                cmd = {"cmd": "ll_round", "round": i, "warmup": s.warmup, "iters": s.iters, "tokens": hi,
                       "configs": configs}
                return slowest_rank(ws.request(cmd, a.round_timeout), LL_METRICS)

            results = tune(bucket_cands, incumbent, s, run_round, shape.ranks,
                           say=lambda m, lo=lo, hi=hi: say(f"T_max {lo}..{hi}: {m}"), kernels=LL_KERNELS)
            configs = {c.name: c.configs(shape.ranks) for c in bucket_cands}
            configs[INCUMBENT] = incumbent
            about = {"t_max": hi, "tokens": hi, "experts": shape.experts, "topk": shape.topk, "routing": "uniform",
                     "seed": shape.seed, "dropped": {n: w for n, w in differ.items()}}
            entries = entries_for(results, configs, key_for, s, commit, command, tokens_range=(lo, hi), about=about)
            path = save_entries(a.table, entries)   # bucket by bucket: a later failure keeps what was tuned
            say(f"T_max {lo}..{hi}: wrote {len(entries)} entries to {path}")
            print_results(results, entries, say=lambda m, lo=lo, hi=hi: print(f"[T_max {lo}..{hi}] {m}"))
            saved += entries
    print(f"\nepscope tune --ll: done in {time.time() - t0:.0f} s; {len(saved)} entries in {a.table}")
    for e in saved:
        kept = "incumbent kept" if e.incumbent and e.incumbent.get("kept") else f"winner {e.verdict.get('winner')}"
        print(f"  {e.describe()}: {kept}, {e.latency_us} µs (spread {e.spread_us}, {e.samples} samples)")
    return 0
