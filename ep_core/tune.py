"""`epscope tune`: sweep the dispatch/combine geometry of one shape, rank the candidates with the
Compare statistics, re-check the best against the incumbent, save the winners in the tuned table.

    epscope tune --tokens 4096 --hidden 7168 --sms 24,32,48,64 --chunks default,48 --copy-paths direct,tma:2
    epscope tune ... --dry-run        # validate the settings and print the candidates, run nothing
    epscope tune --ll                 # the low-latency kernels instead (ep_core/tune_ll.py)

1. Screening: every candidate (SMs x send chunk x copy path: direct, or the pipelined "tma" path
   with N staging buffers) and the incumbent run `--rounds` rounds each,
   interleaved (c0 c1 ... then again), in one set of worker processes (ep_core.rounds).
2. Ranking, per kernel (dispatch and combine are tuned apart, from the same rounds): each
   candidate against the incumbent with profiler.ab.compare_metric (rounds are the runs);
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
import datetime as _dt
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .tuned import DEFAULT_TABLE, NORMAL_KERNELS, Entry, TunedKey, bucket, save_entries

ENV_SETTINGS = {"rounds": "EPSCOPE_TUNE_ROUNDS", "recheck_rounds": "EPSCOPE_TUNE_RECHECK_ROUNDS",
                "top": "EPSCOPE_TUNE_TOP", "margin": "EPSCOPE_TUNE_MARGIN"}
DEFAULTS = {"rounds": 3, "recheck_rounds": 4, "top": 2, "margin": 0.02}
# geometry overrides read by ep_core.buffer at import (they would silently shape every candidate)
GEOMETRY_ENV = ("EPSCOPE_DISPATCH_SENDER_FRACTION", "EPSCOPE_COMBINE_SENDER_FRACTION",
                "EPSCOPE_CHUNKS_PER_SENDER_BLOCK")
INCUMBENT = "incumbent"
# the flags of one kernel family only (their defaults are filled in per family: None = not given)
NORMAL_DEFAULTS = {"tokens": 4096, "routing": "uniform", "sms": "24,32,48,64", "chunks": "default,48,96",
                   "copy_paths": "direct,tma:2,tma:3"}


class TuneUsage(ValueError):
    """A bad setting; the message names the flag or environment variable."""


@dataclass(frozen=True)
class Candidate:
    name: str
    num_sms: int
    chunk: int | None           # send chunk tokens; None = the recommended table's
    path: str = "direct"        # Config.path: "direct" or the pipelined "tma" copy
    tma_buffers: int | None = None   # Config.num_tma_buffers of the "tma" path (None: Config's default)

    def configs(self, ranks: int) -> dict:
        from .config import op_configs

        d, c = op_configs(ranks, self.num_sms, self.chunk)
        if self.path != "direct":
            d, c = d.with_path(self.path, self.tma_buffers), c.with_path(self.path, self.tma_buffers)
        return {"dispatch": d.to_dict(), "combine": c.to_dict()}


@dataclass(frozen=True)
class Settings:
    rounds: int
    recheck_rounds: int
    top: int
    margin: float
    iters: int
    warmup: int


def build_parser() -> argparse.ArgumentParser:
    from . import tune_ll

    ap = argparse.ArgumentParser(prog="epscope tune", description="Sweep the dispatch/combine geometry of a shape "
                                 "and save the winners in the tuned table (re-checked against the incumbent).")
    ap.add_argument("--ll", action="store_true", help="tune the low-latency kernels (ll_dispatch / ll_combine) "
                    "per T_max bucket instead; see ep_core/tune_ll.py")
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


def _setting(a, name: str, kind, env: dict):
    raw = getattr(a, name)
    src = f"--{name.replace('_', '-')}"
    if raw is None:
        var = ENV_SETTINGS[name]
        if var in env:
            raw, src = env[var], var
            if not raw.strip():
                raise TuneUsage(f"{var} is set but empty: unset it or give a value")
        else:
            return DEFAULTS[name]
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise TuneUsage(f"{src}: {raw!r} is not {'an integer' if kind is int else 'a number'}") from None


def check_settings(a, env=None) -> tuple:
    """(Problem, Settings, candidates); raises TuneUsage naming the bad setting."""
    from . import tune_ll
    from .config import Problem

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


def enough_gpus(ranks: int) -> bool:
    """Whether this machine has `ranks` GPUs to tune on; if not, says so on stderr (both sweeps)."""
    from .ab import gpu_count

    have = gpu_count()
    if have < ranks:
        print(f"epscope tune: tunes on {ranks} GPU(s) of this machine, and it has {have} (run it on the "
              f"GPU machine)", file=sys.stderr)
        return False
    return True


def check_common(a, env: dict, geometry_env=GEOMETRY_ENV) -> Settings:
    """The settings both kernel families share (rounds, re-check, top, margin, iterations) and the
    environment's geometry overrides of the kernels tuned, checked; raises TuneUsage naming the bad one."""
    for var in geometry_env:
        if var in env:
            what = "is set but empty" if not env[var].strip() else f"is set ({env[var]})"
            raise TuneUsage(f"{var} {what}: unset it; a table tuned under a geometry override would not hold "
                            f"without it")
    s = Settings(rounds=_setting(a, "rounds", int, env), recheck_rounds=_setting(a, "recheck_rounds", int, env),
                 top=_setting(a, "top", int, env), margin=_setting(a, "margin", float, env), iters=a.iters,
                 warmup=a.warmup)
    if s.rounds < 2:
        raise TuneUsage(f"rounds must be >= 2 (a ranking needs run-to-run spread), got {s.rounds}")
    if s.recheck_rounds < 2:
        raise TuneUsage(f"recheck rounds must be >= 2, got {s.recheck_rounds}")
    if s.top < 1:
        raise TuneUsage(f"top must be >= 1, got {s.top}")
    if not 0.0 <= s.margin < 1.0 or s.margin != s.margin:
        raise TuneUsage(f"margin must be a fraction in [0, 1) of the incumbent's latency, got {s.margin}")
    if s.iters < 3 or s.warmup < 0:
        raise TuneUsage(f"--iters must be >= 3 and --warmup >= 0, got {s.iters} and {s.warmup}")
    return s


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


def _int_list(text: str, flag: str) -> list[int]:
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        try:
            out.append(int(tok))
        except ValueError:
            raise TuneUsage(f"{flag}: {tok!r} is not an integer") from None
    return out


def incumbent_configs(ranks: int, key_for: Callable[[str], TunedKey], table: Path) -> tuple[dict, dict]:
    """{kernel: Config dict} ep_core would use today for this shape, and {kernel: why}."""
    from .config import DEFAULT_NUM_SMS, op_configs
    from .tuned import load_table, lookup

    entries = load_table(table) if table.exists() else []
    d, c = op_configs(ranks, DEFAULT_NUM_SMS)
    defaults = {"dispatch": d.to_dict(), "combine": c.to_dict()}
    configs, why = {}, {}
    for k in ("dispatch", "combine"):
        m = lookup(entries, k, key_for(k), str(table))
        configs[k] = m.entry.config if m.entry else defaults[k]
        why[k] = m.reason if m.entry else f"recommended table ({m.reason})"
    return configs, why


# -- the tuning logic (no GPU: it gets a round runner) ---------------------------------------------
RoundRunner = Callable[[str, int, dict], dict]   # (side name, round, configs) -> {metric: [µs per iteration]}


@dataclass
class KernelResult:
    kernel: str
    screened: list          # (candidate, MetricVerdict vs incumbent) in rank order
    rechecked: list         # (candidate, MetricVerdict vs incumbent)
    winner: str             # candidate name, or INCUMBENT
    why: str
    samples: list           # the saved config's per-round samples (µs)


def tune(cands: list, incumbent: dict, s: Settings, run_round: RoundRunner, ranks: int,
         say=print, kernels=NORMAL_KERNELS) -> dict[str, KernelResult]:
    """Screen, rank, re-check (see the module docstring); returns the result per kernel. A candidate
    is anything with a `name` and `configs(ranks)` -> {kernel: config dict} (Candidate, tune_ll's);
    the rounds' samples are keyed by the kernel names."""
    from profiler.ab import compare_metric

    from .rounds import interleave

    configs = {c.name: c.configs(ranks) for c in cands}
    configs[INCUMBENT] = incumbent
    names = [INCUMBENT] + [c.name for c in cands]
    screen: dict[str, list[dict]] = {n: [] for n in names}
    order = interleave(names, s.rounds)
    for k, (n, i) in enumerate(order):
        screen[n].append(run_round(n, i, configs[n]))
        say(f"screening {k + 1}/{len(order)}: {n} round {i}")
    out = {}
    for kernel in kernels:
        inc = [r[kernel] for r in screen[INCUMBENT]]
        ranked = [(n, compare_metric(kernel, inc, [r[kernel] for r in screen[n]])) for n in names[1:]]
        ranked.sort(key=lambda t: (t[1].verdict != "faster", t[1].diff_us if t[1].diff_us is not None else 0.0))
        top = [(n, v) for n, v in ranked if v.verdict == "faster"][: s.top]
        rechecked = []
        best_samples = {INCUMBENT: inc}
        for n, _ in top:
            a_rounds, b_rounds = [], []
            for side, i in interleave([INCUMBENT, n], s.recheck_rounds):
                r = run_round(side, s.rounds + i, configs[side])
                (a_rounds if side == INCUMBENT else b_rounds).append(r[kernel])
                say(f"re-check {kernel}: {side} round {i}")
            v = compare_metric(kernel, a_rounds, b_rounds)
            rechecked.append((n, v))
            best_samples[n] = b_rounds
            best_samples[f"{INCUMBENT}:{n}"] = a_rounds
        winners = [(n, v) for n, v in rechecked
                   if v.verdict == "faster" and v.diff_pct is not None and -v.diff_pct / 100.0 >= s.margin]
        if winners:
            n, v = min(winners, key=lambda t: t[1].diff_pct)
            why = (f"{n} beat the incumbent on re-check by {-v.diff_pct:.1f}% (95% CI {v.ci_low_us:+.1f} .. "
                   f"{v.ci_high_us:+.1f} µs; margin {100 * s.margin:.1f}%)")
            out[kernel] = KernelResult(kernel, ranked, rechecked, n, why, best_samples[n])
        else:
            if not top:
                why = "no candidate was faster than the incumbent beyond noise in screening"
            else:
                why = ("no candidate beat the incumbent on re-check beyond noise and by the margin "
                       f"{100 * s.margin:.1f}%: " + "; ".join(f"{n} {v.verdict} {v.diff_pct:+.1f}%"
                                                              for n, v in rechecked))
            out[kernel] = KernelResult(kernel, ranked, rechecked, INCUMBENT, why, inc)
    return out


def entries_for(results: dict, configs: dict, key_for: Callable[[str], TunedKey], s: Settings, commit: str,
                command: str, tokens_range: tuple[int, int] | None = None, about: dict | None = None) -> list[Entry]:
    """The table entries of one tuning: per kernel, the saved config with its latency (median),
    spread (p10-p90) and samples. tokens_range: the bucket (default (T/2, T] of the key's tokens);
    about: more of what the tuning ran with, kept in the entry's `tune`."""
    out = []
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for kernel, r in results.items():
        key = key_for(kernel)
        lo, hi = tokens_range or bucket(key.tokens)
        flat = np.concatenate([np.asarray(x, float) for x in r.samples])
        p10, p50, p90 = np.percentile(flat, [10, 50, 90])
        rv = dict(r.rechecked).get(r.winner)
        rv = None if rv is None else {**asdict(rv), "notes": list(rv.notes)}   # as JSON gives it back
        out.append(Entry(kernel=kernel, gpu=key.gpu, ranks=key.ranks, dtype=key.dtype, hidden=key.hidden,
                         tokens_min=lo, tokens_max=hi, config=configs[r.winner][kernel], latency_us=round(float(p50), 2),
                         spread_us=round(float(p90 - p10), 2), samples=int(flat.size), runs=len(r.samples),
                         incumbent={"config": configs[INCUMBENT][kernel], "kept": r.winner == INCUMBENT},
                         verdict={"winner": r.winner, "why": r.why, **(rv or {})},
                         commit=commit, created=now, tune={**asdict(s), **(about or {}), "command": command}))
    return out


# -- the command -----------------------------------------------------------------------------------
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = build_parser().parse_args(argv)
    if a.ll:
        from . import tune_ll

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


def print_results(results: dict, entries: list[Entry], say=print) -> None:
    for r in results.values():
        say("")
        say(f"{r.kernel}: screening (vs incumbent, rounds are the runs):")
        for n, v in r.screened:
            say(f"  {n:<28} {v.verdict:<14} {'' if v.diff_pct is None else f'{v.diff_pct:+.1f}%'}")
        for n, v in r.rechecked:
            say(f"  re-check {n:<19} {v.verdict:<14} {'' if v.diff_pct is None else f'{v.diff_pct:+.1f}%'}")
        say(f"{r.kernel}: saved {r.winner}: {r.why}")
    for e in entries:
        say(f"entry {e.describe()}: {e.config} latency {e.latency_us} µs, spread {e.spread_us} µs, "
            f"{e.samples} samples over {e.runs} rounds")


if __name__ == "__main__":
    sys.exit(main())
