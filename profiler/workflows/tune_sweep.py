"""The sweep both `epscope tune` families share: the settings (rounds, re-check, top, margin, each
from its flag or environment variable, checked), the screen-rank-re-check loop over any
candidates (`tune`, given a round runner: no GPU here), and the table entries of its result.
The commands are profiler/workflows/tune.py (normal kernels) and tune_ll.py (--ll); this module is
the floor below both, so neither imports the other's internals.
"""
from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ep_core.tuned import NORMAL_KERNELS, Entry, TunedKey, bucket


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
class Settings:
    rounds: int
    recheck_rounds: int
    top: int
    margin: float
    iters: int
    warmup: int


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
    from profiler.commands.ab import compare_metric

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
