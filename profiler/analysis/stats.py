"""Is B different from A? Statistics on per-run samples, where the run is the unit of replication.

Timings of one recording share its clocks, placement, warm-up and neighbours, so iterations of one
run are not independent replicates: two recordings of the same code differ by more than their
iterations vary (issue 8: an A/A pair called "+76% slower"). Hence:

* one run per side: run-to-run noise cannot be estimated, and nothing is called faster or slower
  (the difference and its within-run interval are still reported, marked as such);
* several runs per side: a hierarchical bootstrap (resample runs, then samples within each drawn
  run) gives the interval of the difference of medians, and B is called different only when that
  interval excludes 0 AND the difference exceeds the A-vs-A spread.
  The A-vs-A spread is how far apart two groups of runs of the same code fall: from the spread of
  the per-run medians within each side (their pooled standard deviation s over runs_a + runs_b - 2
  degrees of freedom), t(1 - alpha/2, df) * s * sqrt(1/runs_a + 1/runs_b). With 3 runs a side the
  bootstrap alone is too narrow (it cannot see that 3 runs are 3 samples of the run-to-run
  spread); the t quantile can (df = 4: 2.78 s-units at 95%).
  A comparison that tests many phases at once passes `tests`: the decision then uses level
  1 - alpha / tests (Bonferroni) for both, so an A/A pair stays within noise on every phase with
  probability >= 1 - alpha; the interval reported stays at 1 - alpha.

A heavy-tail warning is raised when a side's mean and median disagree by more than
HEAVY_TAIL_SHARE of the median: a few slow outliers then drive means, and medians are the
statistic to read. `compare_samples` is the reusable entry point (`epscope ab` calls it on its own
samples; profiler.analysis.compare on the samples of recorded runs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from profiler.expect import Direction

SEED = 0                  # fixed: the same samples always give the same interval
N_BOOT = 2000
ALPHA = 0.05
MIN_SAMPLES = 3           # fewer samples per side cannot support an interval
# |mean - median| above this share of the median on either side: a heavy tail (a few outliers
# several times the median move the mean by this much; on normal-ish data the two agree to ~1%)
HEAVY_TAIL_SHARE = 0.10
# per-run samples are thinned above this many (evenly spaced order statistics keep the distribution)
# to bound the bootstrap's (n_boot x n) work
MAX_RUN_SAMPLES = 4000

WITHIN_NOISE, FASTER, SLOWER = "within noise", "faster", "slower"
NO_NOISE_ESTIMATE = "noise unknown (one run per side)"
TOO_FEW, ONLY_A, ONLY_B = "too few samples", "only in A", "only in B"


@dataclass(frozen=True)
class SampleComparison:
    runs_a: int
    runs_b: int
    n_a: int                      # samples, all runs of the side
    n_b: int
    median_a: float
    median_b: float
    diff: float                   # median(B) - median(A)
    diff_pct: float               # 100 * diff / median(A)
    ci_low: float                 # bootstrap interval of diff (runs, then samples); NaN when too few
    ci_high: float
    noise: float                  # A-vs-A spread (module docstring); NaN with one run on a side
    noise_estimable: bool         # two or more runs on each side
    heavy_tail: bool              # a side's mean and median disagree by > HEAVY_TAIL_SHARE
    verdict: str                  # WITHIN_NOISE | FASTER | SLOWER | NO_NOISE_ESTIMATE | TOO_FEW | ONLY_A | ONLY_B

    @property
    def direction(self) -> Direction | None:
        return direction_of(self.verdict)

    @property
    def within_noise(self) -> bool:
        return self.verdict not in (FASTER, SLOWER)


def direction_of(verdict: str) -> Direction | None:
    """B against A for a FASTER / SLOWER verdict, else None."""
    return {FASTER: Direction.FASTER, SLOWER: Direction.SLOWER}.get(verdict)


def _thin(x: np.ndarray) -> np.ndarray:
    if len(x) <= MAX_RUN_SAMPLES:
        return x
    return np.sort(x)[np.linspace(0, len(x) - 1, MAX_RUN_SAMPLES).round().astype(int)]


def boot_medians(runs: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap distribution of the pooled median: draw len(runs) runs with replacement, then
    each drawn run's samples with replacement (a run drawn twice contributes two resamples)."""
    groups = [_thin(np.asarray(r, float)) for r in runs if len(r)]
    m = len(groups)
    sizes = np.array([len(g) for g in groups])
    if len(set(sizes.tolist())) == 1:
        # runs of one length (the usual case: same iterations per run): all draws at once, in
        # chunks of ~4 M values
        s = int(sizes[0])
        stacked = np.stack(groups)
        out = np.empty(n_boot)
        step = max(1, 4_000_000 // (m * s))
        for lo in range(0, n_boot, step):
            k = min(step, n_boot - lo)
            pick = rng.integers(0, m, (k, m, 1))
            idx = rng.integers(0, s, (k, m, s))
            out[lo:lo + k] = np.median(stacked[pick, idx].reshape(k, m * s), axis=1)
        return out
    out = np.empty(n_boot)
    for i in range(n_boot):
        pick = rng.integers(0, m, m)
        pool = np.concatenate([groups[j][rng.integers(0, sizes[j], sizes[j])] for j in pick])
        out[i] = np.median(pool)
    return out


def _heavy(x: np.ndarray) -> bool:
    med = float(np.median(x))
    return bool(med and abs(float(np.mean(x)) - med) > HEAVY_TAIL_SHARE * abs(med))


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with integer df (closed-form CDF, Abramowitz & Stegun 26.7.3-4,
    inverted by bisection; numpy only, so the recording machines need no scipy)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")

    def cdf(t: float) -> float:
        th = math.atan(t / math.sqrt(df))
        c2, sn = math.cos(th) ** 2, math.sin(th)
        if df % 2 == 0:
            term, acc = 1.0, 1.0
            for k in range(1, df // 2):
                term *= c2 * (2 * k - 1) / (2 * k)
                acc += term
            a = sn * acc
        elif df == 1:
            a = 2 * th / math.pi
        else:
            term, acc = math.cos(th), math.cos(th)
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                acc += term
            a = 2 / math.pi * (th + sn * acc)
        return 0.5 + 0.5 * a

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return 0.5 * (lo + hi)


def a_vs_a_spread(ra: Sequence[np.ndarray], rb: Sequence[np.ndarray], alpha: float) -> float:
    """How far apart the pooled medians of two groups of runs of the same code fall at level
    1 - alpha (module docstring); NaN with fewer than two runs on a side."""
    if len(ra) < 2 or len(rb) < 2:
        return float("nan")
    ma = np.array([np.median(r) for r in ra])
    mb = np.array([np.median(r) for r in rb])
    df = len(ma) + len(mb) - 2
    s = math.sqrt((((ma - ma.mean()) ** 2).sum() + ((mb - mb.mean()) ** 2).sum()) / df)
    return t_quantile(1 - alpha / 2, df) * s * math.sqrt(1 / len(ma) + 1 / len(mb))


def compare_samples(a: Sequence[np.ndarray], b: Sequence[np.ndarray], *, n_boot: int = N_BOOT, seed: int = SEED,
                    alpha: float = ALPHA, tests: int = 1) -> SampleComparison:
    """Compare per-run samples of A and B (a list of 1-D arrays per side, one array per run).

    The verdict: B is FASTER / SLOWER only with two or more runs per side, a bootstrap interval
    (over runs, then samples; level 1 - alpha / tests; fixed seed) that excludes 0, and |diff| above
    the A-vs-A spread; otherwise WITHIN_NOISE (or NO_NOISE_ESTIMATE with one run on a side).
    ci_low / ci_high: the interval at level 1 - alpha.
    """
    ra = [np.asarray(r, float) for r in a if len(r)]
    rb = [np.asarray(r, float) for r in b if len(r)]
    xa = np.concatenate(ra) if ra else np.zeros(0)
    xb = np.concatenate(rb) if rb else np.zeros(0)
    nan = float("nan")
    med_a = float(np.median(xa)) if len(xa) else nan
    med_b = float(np.median(xb)) if len(xb) else nan
    diff = med_b - med_a
    base = dict(runs_a=len(ra), runs_b=len(rb), n_a=len(xa), n_b=len(xb), median_a=med_a, median_b=med_b,
                diff=diff, diff_pct=100.0 * diff / med_a if med_a else nan,
                heavy_tail=bool((len(xa) and _heavy(xa)) or (len(xb) and _heavy(xb))))
    if not len(xa) or not len(xb):
        return SampleComparison(**base, ci_low=nan, ci_high=nan, noise=nan, noise_estimable=False,
                                verdict=ONLY_B if not len(xa) else ONLY_A)
    noise_ok = len(ra) >= 2 and len(rb) >= 2
    a_dec = alpha / max(int(tests), 1)
    noise = a_vs_a_spread(ra, rb, a_dec)
    if min(len(xa), len(xb)) < MIN_SAMPLES:
        return SampleComparison(**base, ci_low=nan, ci_high=nan, noise=noise, noise_estimable=noise_ok,
                                verdict=TOO_FEW)
    rng = np.random.default_rng(seed)
    d = boot_medians(rb, n_boot, rng) - boot_medians(ra, n_boot, rng)
    lo, hi = (float(q) for q in np.quantile(d, [alpha / 2, 1 - alpha / 2]))
    dlo, dhi = (float(q) for q in np.quantile(d, [a_dec / 2, 1 - a_dec / 2]))
    if not noise_ok:
        verdict = NO_NOISE_ESTIMATE
    elif dlo <= 0 <= dhi or abs(diff) <= noise:
        verdict = WITHIN_NOISE
    else:
        verdict = SLOWER if diff > 0 else FASTER
    return SampleComparison(**base, ci_low=lo, ci_high=hi, noise=noise, noise_estimable=noise_ok, verdict=verdict)
