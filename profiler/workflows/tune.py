"""`epscope tune`: sweep the dispatch/combine geometry of one shape, rank the candidates with the
Compare statistics, re-check the best against the incumbent, save the winners in the tuned table.

    epscope tune --tokens 4096 --hidden 7168 --sms 24,32,48,64 --chunks default,48 --copy-paths direct,tma:2
    epscope tune ... --dry-run        # validate the settings and print the candidates, run nothing
    epscope tune --ll                 # the low-latency kernels instead (profiler/workflows/tune_ll.py)

1. Screening: every candidate (SMs x send chunk x copy path: direct, or the pipelined "tma" path
   with N staging buffers) and the incumbent run `--rounds` rounds each,
   interleaved (c0 c1 ... then again), in one set of worker processes (profiler.workflows.rounds).
2. Ranking, per kernel (dispatch and combine are tuned apart, from the same rounds): each
   candidate against the incumbent with profiler.commands.ab.compare_metric (rounds are the runs);
   candidates that came out faster are ranked by their median difference.
3. Re-check: the `--top` best of each kernel run `--recheck-rounds` rounds interleaved with the
   incumbent; a candidate replaces the incumbent only if it is faster beyond noise AND by at
   least `--margin` (a fraction of the incumbent's median). Otherwise the incumbent is saved, and
   the output says so.
4. The table (ep_core.tuned, `--table`) gets one entry per kernel for this GPU, rank count, dtype,
   hidden and token bucket, with latency, spread (p10-p90) and sample count.

The incumbent is what ep_core would use today for this shape: the table's matching entry, else
the recommended table (ep_core.config) at DeepEP's default SM count. Settings come from the flags,
else from EPSCOPE_TUNE_ROUNDS / _RECHECK_ROUNDS / _TOP / _MARGIN; every one is checked before any
GPU work (rounds >= 2, a margin in [0, 1), no environment variable set but empty), and the
kernel-geometry overrides of ep_core.buffer (EPSCOPE_*_SENDER_FRACTION, ...) must be unset: a
table tuned under an override would not hold without it.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ep_core.tuned import DEFAULT_TABLE, TunedKey, bucket, save_entries

from . import tune_ll
from .tune_sweep import (DEFAULTS, ENV_SETTINGS, INCUMBENT, NORMAL_DEFAULTS, Settings, TuneUsage,  # noqa: F401
                         _int_list, check_common, enough_gpus, entries_for, print_results, tune)


@dataclass(frozen=True)
class Candidate:
    name: str
    num_sms: int
    chunk: int | None           # send chunk tokens; None = the recommended table's
    path: str = "direct"        # Config.path: "direct" or the pipelined "tma" copy
    tma_buffers: int | None = None   # Config.num_tma_buffers of the "tma" path (None: Config's default)

    def configs(self, ranks: int) -> dict:
        from ep_core.config import op_configs

        d, c = op_configs(ranks, self.num_sms, self.chunk)
        if self.path != "direct":
            d, c = d.with_path(self.path, self.tma_buffers), c.with_path(self.path, self.tma_buffers)
        return {"dispatch": d.to_dict(), "combine": c.to_dict()}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epscope tune", description="Sweep the dispatch/combine geometry of a shape "
                                 "and save the winners in the tuned table (re-checked against the incumbent).")
    ap.add_argument("--ll", action="store_true", help="tune the low-latency kernels (ll_dispatch / ll_combine) "
                    "per T_max bucket instead; see profiler/workflows/tune_ll.py")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=None,
                    help=f"tokens per rank (the entry covers tokens/2 .. tokens; default {NORMAL_DEFAULTS['tokens']})")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--routing", default=None, choices=("uniform", "skewed", "zipf", "zero-rank"))
    ap.add_argument("--dtype", default=None, choices=("bf16", "fp8"),
                    help="payload dtype (default bf16; with --ll the dispatch's, default fp8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sms", default=None, help=f"SM counts to try (even; default {NORMAL_DEFAULTS['sms']})")
    ap.add_argument("--chunks", default=None, help="send chunk tokens to try ('default': the table's; default "
                    f"{NORMAL_DEFAULTS['chunks']})")
    ap.add_argument("--copy-paths", default=None,
                    help="copy paths to try: 'direct', or 'tma:N' (the pipelined path with N staging buffers; "
                         f"default {NORMAL_DEFAULTS['copy_paths']})")
    tune_ll.add_arguments(ap)
    for k, env in ENV_SETTINGS.items():
        ap.add_argument(f"--{k.replace('_', '-')}", default=None,
                        help=f"(env {env}; default {DEFAULTS[k]})")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations before each round")
    ap.add_argument("--table", type=Path, default=DEFAULT_TABLE, help=f"tuned table to update (default {DEFAULT_TABLE})")
    ap.add_argument("--dry-run", action="store_true", help="check the settings, print the candidates, run nothing")
    ap.add_argument("--round-timeout", type=float, default=600.0)
    return ap


def check_settings(a, env=None) -> tuple:
    """(Problem, Settings, candidates); raises TuneUsage naming the bad setting."""
    from ep_core.config import Problem

    env = dict(os.environ if env is None else env)
    tune_ll.check_family(a)
    for k, v in NORMAL_DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.dtype is None:
        a.dtype = "bf16"
    s = check_common(a, env)
    try:
        p = Problem(a.tokens, a.hidden, a.topk, a.experts, a.ranks, a.dtype)
    except (TypeError, ValueError) as e:
        raise TuneUsage(str(e)) from None
    return p, s, candidates(a.sms, a.chunks, p.ranks, a.copy_paths)


def _paths(text: str) -> list[tuple[str, int | None]]:
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        if tok == "direct":
            out.append(("direct", None))
        elif tok.startswith("tma:"):
            out.append(("tma", _int_list(tok[4:], "--copy-paths")[0] if tok[4:].strip() else None))
            if out[-1][1] is None:
                raise TuneUsage(f"--copy-paths: {tok!r} needs a buffer count (tma:N)")
        else:
            raise TuneUsage(f"--copy-paths: {tok!r} is not 'direct' or 'tma:N'")
    return out


def candidates(sms_text: str, chunks_text: str, ranks: int, paths_text: str = "direct") -> list[Candidate]:
    sms = _int_list(sms_text, "--sms")
    chunks = []
    for tok in (t.strip() for t in chunks_text.split(",")):
        if tok == "default":
            chunks.append(None)
        elif tok:
            chunks.extend(_int_list(tok, "--chunks"))
    paths = _paths(paths_text)
    if not sms or not chunks or not paths:
        raise TuneUsage("--sms, --chunks and --copy-paths need at least one value each")
    out = []
    for n in sms:
        for c in chunks:
            for path, nb in paths:
                name = f"sms{n}-chunk{c or 'default'}" + ("" if path == "direct" else f"-tma{nb}")
                cand = Candidate(name, n, c, path, nb)
                try:
                    cand.configs(ranks)
                except (TypeError, ValueError) as e:
                    raise TuneUsage(f"candidate {cand.name}: {e}") from None
                out.append(cand)
    if len({c.name for c in out}) != len(out):
        raise TuneUsage("--sms / --chunks list a value twice")
    return out


def incumbent_configs(ranks: int, key_for: Callable[[str], TunedKey], table: Path) -> tuple[dict, dict]:
    """{kernel: Config dict} ep_core would use today for this shape, and {kernel: why}."""
    from ep_core.config import DEFAULT_NUM_SMS, op_configs
    from ep_core.tuned import load_table, lookup

    entries = load_table(table) if table.exists() else []
    d, c = op_configs(ranks, DEFAULT_NUM_SMS)
    defaults = {"dispatch": d.to_dict(), "combine": c.to_dict()}
    configs, why = {}, {}
    for k in ("dispatch", "combine"):
        m = lookup(entries, k, key_for(k), str(table))
        configs[k] = m.entry.config if m.entry else defaults[k]
        why[k] = m.reason if m.entry else f"recommended table ({m.reason})"
    return configs, why


# -- the command -----------------------------------------------------------------------------------
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = build_parser().parse_args(argv)
    if a.ll:
            return tune_ll.main(a, argv)
    try:
        problem, s, cands = check_settings(a)
    except TuneUsage as e:
        print(f"epscope tune: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(f"epscope tune: {len(cands)} candidates x {s.rounds} rounds, then the top {s.top} per kernel x "
              f"{s.recheck_rounds} re-check rounds; margin {100 * s.margin:.1f}%")
        for c in cands:
            print(f"  {c.name}: {c.configs(problem.ranks)}")
        return 0
    if not enough_gpus(problem.ranks):
        return 2
    return _run(a, argv, problem, s, cands)


def _run(a, argv, problem, s: Settings, cands) -> int:
    from profiler.record.session import git_info

    from .ab import repo_root
    from .rounds import WorkerSet, slowest_rank, write_inputs

    work = Path(tempfile.mkdtemp(prefix="epscope-tune-"))
    inputs = write_inputs(work / "inputs", problem, a.routing, a.seed)
    ws = WorkerSet("tune", repo_root(), problem.ranks, inputs, work / "logs",
                   env={"EPSCOPE_TUNED_TABLE": "off"}, profile=False)   # every round passes its configs
    t0 = time.time()
    with ws:
        gpu = ws.start()[0]["gpu"]

        def key_for(kernel):
            return TunedKey(gpu, problem.ranks, problem.dtype if kernel == "dispatch" else "bf16", problem.hidden,
                            problem.tokens)

        incumbent, why = incumbent_configs(problem.ranks, key_for, a.table)
        for k, w in why.items():
            print(f"epscope tune: incumbent {k}: {incumbent[k]} ({w})")

        def run_round(name, i, configs):
            cmd = {"cmd": "round", "round": i, "warmup": s.warmup, "iters": s.iters, "num_sms": None,
                   "configs": configs, "profile": None}
            return slowest_rank(ws.request(cmd, a.round_timeout))

        results = tune(cands, incumbent, s, run_round, problem.ranks,
                       say=lambda m: print(f"[epscope tune {time.strftime('%H:%M:%S')}] {m}", flush=True))
    configs = {c.name: c.configs(problem.ranks) for c in cands}
    configs[INCUMBENT] = incumbent
    command = "epscope tune " + " ".join(map(shlex.quote, argv))
    entries = entries_for(results, configs, key_for, s, git_info()["commit"], command)
    path = save_entries(a.table, entries)
    print(f"\nepscope tune: done in {time.time() - t0:.0f} s; wrote {len(entries)} entries to {path}")
    print_results(results, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
