"""A/B bookkeeping: rounds of latency samples per side -> the comparison record and its verdict.

`epscope ab` (profiler/workflows/ab.py) and `epscope tune` (profiler/workflows/tune.py) collect, per side and round,
the per-iteration latencies of each metric (the slowest rank's, profiler.workflows.rounds.slowest_rank).
This module turns them into verdicts and keeps the record; it holds no statistics of its own:
`compare_metric` hands the samples, grouped by round (the round is the run, the unit of
replication), to `profiler.analysis.stats.compare_samples` (bootstrap over runs, then over the
samples of the drawn runs; the A-vs-A spread; one round a side calls nothing) and reads its fields
by name. That is the one place to rewire when the Compare statistics change.

The comparison record (RUN_ROOT/comparison.json):
    {"format": "epscope-ab", "format_version": 1, "created": ISO-8601, "command": "...",
     "sides": {"A": {"ref": "main", "commit": "...", "tree": "..."}, "B": {...}},
     "workload": {...}, "gpu": "...",
     "rounds": [{"side": "A", "round": 0, "profiled": false, "run_dir": null,
                 "samples": {metric: [µs per iteration]}}, ...],
     "verdict": [MetricVerdict as dict, ...], "critical_path": [...], "notes": [...]}
Profiled rounds name their run directory (next to the record); their samples are kept but the
verdict uses the timing rounds only (profiling perturbs the latencies it would be judging).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "epscope-ab"
FORMAT_VERSION = 1
RECORD = "comparison.json"
# GPU time of each call and of the op, then host time per call (profiler/workflows/ab_worker.py)
GPU_METRICS = ("op", "layout", "dispatch", "combine")
HOST_METRICS = ("host_layout", "host_dispatch", "host_combine")
METRICS = GPU_METRICS + HOST_METRICS


class ABError(ValueError):
    """A record or a set of rounds that cannot be compared; the message says why."""


@dataclass(frozen=True)
class RoundSamples:
    """One side's one round: per metric, the per-iteration latency (µs) of the slowest rank."""

    side: str
    round: int
    profiled: bool
    samples: dict
    run_dir: str | None = None

    def __post_init__(self):
        unknown = sorted(set(self.samples) - set(METRICS))
        if unknown:
            raise ABError(f"round {self.side}{self.round}: unknown metrics {unknown}")


@dataclass(frozen=True)
class MetricVerdict:
    """B against A for one metric, from timing rounds only. `runs_*`: rounds, `n_*`: samples."""

    metric: str
    runs_a: int
    runs_b: int
    n_a: int
    n_b: int
    median_a_us: float
    median_b_us: float
    diff_us: float
    diff_pct: float
    ci_low_us: float
    ci_high_us: float
    verdict: str                       # profiler.analysis.stats: faster | slower | within noise | noise unknown
                                       # (one run per side) | too few samples
    heavy_tail: bool | None = None     # None: the statistics in use do not say
    notes: tuple = ()

    @property
    def moved(self) -> bool:
        return self.verdict in ("faster", "slower")


def compare_metric(metric: str, a_rounds: list, b_rounds: list, *, n_boot: int = 2000, seed: int = 0,
                   alpha: float = 0.05) -> MetricVerdict:
    """B - A of one metric; a_rounds / b_rounds: per round, the per-iteration samples (µs)."""
    from profiler.analysis import stats

    c = stats.compare_samples([np.asarray(r, float) * 1e3 for r in a_rounds],
                              [np.asarray(r, float) * 1e3 for r in b_rounds], n_boot=n_boot, seed=seed, alpha=alpha)
    return _metric_verdict(metric, a_rounds, b_rounds, c)


def _metric_verdict(metric: str, a_rounds: list, b_rounds: list, c) -> MetricVerdict:
    notes = []
    if len(a_rounds) < 2 or len(b_rounds) < 2:
        notes.append("one round on a side: run-to-run noise cannot be estimated")
    return MetricVerdict(
        metric=metric, runs_a=len(a_rounds), runs_b=len(b_rounds), n_a=int(c.n_a), n_b=int(c.n_b),
        median_a_us=_us(c.median_a), median_b_us=_us(c.median_b), diff_us=_us(c.diff),
        diff_pct=_round(c.diff_pct, 2), ci_low_us=_us(c.ci_low), ci_high_us=_us(c.ci_high),
        verdict=str(c.verdict), heavy_tail=bool(c.heavy_tail), notes=tuple(notes))


def _round(x, nd):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


def _us(ns):
    return _round(None if ns is None else float(ns) / 1e3, 3)


def timing_rounds(rounds: list[RoundSamples], side: str, metric: str) -> list[list[float]]:
    return [list(r.samples.get(metric, [])) for r in sorted(rounds, key=lambda r: r.round)
            if r.side == side and not r.profiled and r.samples.get(metric)]


def verdict_table(rounds: list[RoundSamples], sides=("A", "B"), metrics=METRICS, **kw) -> list[MetricVerdict]:
    from profiler.analysis import stats

    a, b = sides
    rows = []
    for m in metrics:
        ra, rb = timing_rounds(rounds, a, m), timing_rounds(rounds, b, m)
        if ra or rb:
            rows.append((m, ra, rb))
    # the metrics are one family, decided at one level as the Compare page decides its rows
    # (stats.compare_family): a same-code pair stays within noise on every metric at once
    fam = stats.compare_family([([np.asarray(r, float) * 1e3 for r in ra], [np.asarray(r, float) * 1e3 for r in rb])
                                for _, ra, rb in rows], **kw)
    return [_metric_verdict(m, ra, rb, c) for (m, ra, rb), c in zip(rows, fam)]


def format_table(rows: list[MetricVerdict], title: str = "") -> str:
    """The verdict table as text (the last thing `epscope ab` prints)."""
    head = f"{'metric':<14} {'rounds A/B':>10} {'median A µs':>12} {'median B µs':>12} {'B - A':>9} " \
           f"{'95% CI of B - A (µs)':>24}  verdict"
    lines = ([title] if title else []) + [head, "-" * len(head)]
    for r in rows:
        ci = "-" if r.ci_low_us is None else f"{r.ci_low_us:+.1f} .. {r.ci_high_us:+.1f}"
        pct = "-" if r.diff_pct is None else f"{r.diff_pct:+.1f}%"
        flag = "" if not r.heavy_tail else "  (heavy tail: mean and median disagree)"
        lines.append(f"{r.metric:<14} {r.runs_a:>4}/{r.runs_b:<5} {_f(r.median_a_us):>12} {_f(r.median_b_us):>12} "
                     f"{pct:>9} {ci:>24}  {r.verdict}{flag}")
        for n in r.notes:
            lines.append(f"{'':<14} note: {n}")
    return "\n".join(lines)


def _f(x):
    return "-" if x is None else f"{x:.1f}"


# -- the record ----------------------------------------------------------------------------------
@dataclass
class ComparisonRecord:
    sides: dict
    workload: dict
    rounds: list[RoundSamples] = field(default_factory=list)
    verdict: list[MetricVerdict] = field(default_factory=list)
    critical_path: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    command: str = ""
    gpu: str = ""
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": self.created, "command": self.command,
                "sides": self.sides, "workload": self.workload, "gpu": self.gpu,
                "rounds": [asdict(r) for r in self.rounds], "verdict": [asdict(v) for v in self.verdict],
                "critical_path": self.critical_path, "notes": self.notes}

    def write(self, root) -> Path:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        path = root / RECORD
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, root) -> "ComparisonRecord":
        path = Path(root)
        path = path / RECORD if path.is_dir() else path
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ABError(f"{path}: not a readable comparison record ({e})") from None
        if d.get("format") != FORMAT:
            raise ABError(f"{path}: not an {FORMAT} record (format={d.get('format')!r})")
        if not isinstance(d.get("format_version"), int) or d["format_version"] > FORMAT_VERSION:
            raise ABError(f"{path}: record version {d.get('format_version')!r} is newer than this epscope's "
                          f"{FORMAT_VERSION}")
        return cls(sides=d["sides"], workload=d["workload"], rounds=[RoundSamples(**r) for r in d["rounds"]],
                   verdict=[MetricVerdict(**{**v, "notes": tuple(v.get("notes", ()))}) for v in d["verdict"]],
                   critical_path=d.get("critical_path", []), notes=d.get("notes", []), command=d.get("command", ""),
                   gpu=d.get("gpu", ""), created=d.get("created", ""))
