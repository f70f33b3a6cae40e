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
  spread); the t quantile can (df = 4: 2.78 s-units at 95%). The t-test alone is not enough
  either: with 3 iterations a run, host-jitter rows (entry skew) have run medians that cluster by
  chance, and the t-test on them called an A/A pair (ep-aa, layout entry skew, p = 0.0009) that the
  bootstrap over the iterations keeps within noise.
  Each comparison also has a p-value: the larger of the t-test's on the run medians (the spread
  above is its critical difference) and the bootstrap's (twice the share of resampled
  differences on the far side of 0), since B is called different only when both reject.
  Its power is that rule's (rule_power: the noncentral t, with the bootstrap's half-width as a
  floor), not the t-test's alone (issue 29: the MDE stated was the t-test's normal approximation,
  and the rule that decided had 69-77 % power at it, not 80 %).
* many rows at once (every kernel and phase of a run, every metric of `epscope ab`):
  `compare_family` decides all of them at one level found by Benjamini-Hochberg over their
  p-values: the largest k with p_(k) <= k * alpha / m gives the level k * alpha / m (alpha / m,
  Bonferroni's, when no row passes). When A and B run the same code (every row's null true) this
  keeps P(any row called) <= alpha, as Bonferroni did, so an A/A pair stays within noise on every
  row at once; when a knob moves many rows, each true change raises the level for the others.
  Bonferroni alone had made a real change invisible: ab-tma-buffers (3 runs a side) moved the
  dispatch kernel by -30% with p = 0.007 on 4 degrees of freedom, which is not < 0.05 / 15 rows,
  while 10 of its rows had p < 0.001. (BH assumes the rows' tests are independent or positively
  dependent, as kernel, phase and end-to-end times of one op are.) `tests` (one comparison with
  Bonferroni's level alpha / tests) remains for a caller with one row at a time.

A heavy-tail warning is raised when a side's mean and median disagree by more than
HEAVY_TAIL_SHARE of the median: a few slow outliers then drive means, and medians are the
statistic to read. `compare_samples` is the reusable entry point (`epscope ab` calls it on its own
samples; profiler.analysis.compare on the samples of recorded runs).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from profiler.groundtruth.expect import Direction

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
CANNOT_TELL = "cannot tell"
# Power. The smallest change a comparison could have detected (its minimum detectable effect,
# MDE): the true difference the deciding rule (both tests, module docstring) calls at its level
# with POWER probability (rule_power), in ns. A change the project would act on is DETECT_SHARE of
# A's median (the catalogue counts a knob as having an effect at 10 %: verdict.MATERIAL_SHARE's
# note); a row within noise whose MDE is larger cannot tell. tests/analysis/test_stats.py checks
# the stated power by simulation.
POWER = 0.80
DETECT_SHARE = 0.10
MAX_RUNS_NEEDED = 100


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
    p_value: float = float("nan")  # max(t-test on run medians, bootstrap); NaN without a noise estimate
    level: float = float("nan")    # the decision's level (alpha / tests, or compare_family's)
    mde: float = float("nan")      # the smallest |diff| detectable at `level` with POWER (NaN: one run a side)
    runs_needed: int = 0           # runs a side for an MDE of DETECT_SHARE of A's median (0: enough now)

    @property
    def powered(self) -> bool:
        """Whether the comparison could have seen a DETECT_SHARE change of A's median."""
        return bool(math.isfinite(self.mde) and self.mde <= DETECT_SHARE * abs(self.median_a))

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


def t_cdf(t: float, df: int) -> float:
    """CDF of Student's t with integer df (closed form, Abramowitz & Stegun 26.7.3-4; numpy only, so
    the recording machines need no scipy)."""
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


# Pure and asked again and again with the same few (p, df): every row of a comparison asks for its
# level's and POWER's quantiles, and power() for those of each candidate run count (issue 20: 2.9 of
# 3.3 s of a 3-a-side compare were t_cdf calls before the cache).
@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with integer df (t_cdf inverted by bisection)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def _run_medians(ra, rb):
    ma = np.array([np.median(r) for r in ra])
    mb = np.array([np.median(r) for r in rb])
    df = len(ma) + len(mb) - 2
    s = math.sqrt((((ma - ma.mean()) ** 2).sum() + ((mb - mb.mean()) ** 2).sum()) / df)
    return ma, mb, df, s * math.sqrt(1 / len(ma) + 1 / len(mb))


def a_vs_a_spread(ra: Sequence[np.ndarray], rb: Sequence[np.ndarray], alpha: float) -> float:
    """How far apart the pooled medians of two groups of runs of the same code fall at level
    1 - alpha (module docstring); NaN with fewer than two runs on a side."""
    if len(ra) < 2 or len(rb) < 2:
        return float("nan")
    _, _, df, se = _run_medians(ra, rb)
    return t_quantile(1 - alpha / 2, df) * se


def _t_p(ra, rb) -> float:
    """Two-sided p of the t-test on the run medians (pooled sd; the spread's test)."""
    ma, mb, df, se = _run_medians(ra, rb)
    d = abs(float(mb.mean() - ma.mean()))
    if se == 0:
        return 0.0 if d > 0 else 1.0
    return float(min(1.0, 2 * (1 - t_cdf(d / se, df))))


@dataclass(frozen=True)
class _Prepared:
    """What a decision at any level needs: the runs, the base fields, the bootstrap differences."""
    ra: list
    rb: list
    base: dict
    d: np.ndarray | None          # bootstrap of median(B) - median(A); None: too few / one side empty
    final: str | None             # a verdict no level changes (ONLY_A, ONLY_B, TOO_FEW)
    p: float


def _prepare(a, b, n_boot: int, seed: int, alpha: float) -> _Prepared:
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
        return _Prepared(ra, rb, base, None, ONLY_B if not len(xa) else ONLY_A, nan)
    if min(len(xa), len(xb)) < MIN_SAMPLES:
        return _Prepared(ra, rb, base, None, TOO_FEW, nan)
    rng = np.random.default_rng(seed)
    d = boot_medians(rb, n_boot, rng) - boot_medians(ra, n_boot, rng)
    p = nan
    if len(ra) >= 2 and len(rb) >= 2:
        p_boot = min(1.0, 2 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0))))
        p = max(_t_p(ra, rb), p_boot)
    return _Prepared(ra, rb, base, d, None, p)


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF (Abramowitz & Stegun 7.1.26 for erf, |error| < 1.5e-7; numpy only)."""
    z = np.abs(x) / math.sqrt(2)
    t = 1 / (1 + 0.3275911 * z)
    erf = 1 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) \
        * np.exp(-z * z)
    return 0.5 * (1 + np.sign(x) * erf)


@functools.lru_cache(maxsize=256)
def _s_grid(df: int) -> tuple[np.ndarray, np.ndarray]:
    """Points and weights for E[g(S)], S = sqrt(V / df), V chi-square with df degrees of freedom
    (density of S proportional to s^(df-1) exp(-df s^2 / 2); trapezoid on a grid covering it)."""
    hi = 1 + 14 / math.sqrt(df)
    s = np.linspace(0, hi, 2001)[1:]
    logf = (df - 1) * np.log(s) - df * s * s / 2
    w = np.exp(logf - logf.max())
    return s, w / w.sum()


def _rule_power_slope(delta: float, df: int, level: float, floor: float) -> tuple[float, float]:
    """rule_power and its derivative in delta."""
    c = t_quantile(1 - level / 2, df)
    s, w = _s_grid(df)
    thr = np.maximum(c * s, floor)
    up, down = delta - thr, -delta - thr
    p = float(np.sum(w * (_phi(up) + _phi(down))))
    dens = float(np.sum(w * (np.exp(-up * up / 2) - np.exp(-down * down / 2)))) / math.sqrt(2 * math.pi)
    return p, dens


def rule_power(delta: float, df: int, level: float, floor: float = 0.0) -> float:
    """Probability that the deciding rule (module docstring) calls a true difference of delta
    standard errors: the estimate D = delta + Z (in standard errors) must pass the t-test, |D| >
    t(1 - level/2, df) * S with S = sqrt(V / df) (the noncentral t), and the bootstrap, whose
    interval at `level` excludes 0 when |D| > floor: its half-width, in standard errors, taken as
    fixed (a shift moves the bootstrap's distribution, not its width). Integrated over S
    (_s_grid). With no floor: the t-test's power. Checked by simulation in
    tests/analysis/test_stats.py (with run-to-run or within-run noise dominating)."""
    return _rule_power_slope(delta, df, level, floor)[0]


@functools.lru_cache(maxsize=4096)
def mde_units(level: float, df: int, floor: float = 0.0) -> float:
    """The MDE in standard errors: the delta at which rule_power(delta, ...) = POWER. Newton steps
    from the normal approximation (threshold + z(POWER)), kept inside the bracket of the deltas seen
    below and above POWER (the power rises with delta): bisection when a step leaves it."""
    lo, hi = 0.0, math.inf
    x = max(t_quantile(1 - level / 2, df), floor) + 0.8416      # z(0.80)
    for _ in range(100):
        p, slope = _rule_power_slope(x, df, level, floor)
        if abs(p - POWER) < 1e-10:
            break
        lo, hi = (x, hi) if p < POWER else (lo, x)
        if hi - lo < 1e-12 * x:
            break
        step = x + (POWER - p) / slope if slope > 0 else math.nan
        x = step if lo < step < hi else (0.5 * (lo + hi) if math.isfinite(hi) else 2 * x)
    return x


def power(ra, rb, level: float, median_a: float, boot_half: float = 0.0) -> tuple[float, int]:
    """(MDE at `level` with POWER, runs a side needed for an MDE of DETECT_SHARE of median_a; 0
    when the runs at hand suffice, MAX_RUNS_NEEDED + 1 (shown "more than MAX_RUNS_NEEDED") when no
    count up to it does). NaN, 0 with one run on a side. boot_half: the bootstrap interval's
    half-width at `level` (ns; rule_power's floor); with more runs it is taken to shrink as the
    standard error does."""
    if len(ra) < 2 or len(rb) < 2:
        return float("nan"), 0
    _, _, df, se = _run_medians(ra, rb)
    if se == 0:           # identical run medians: the bootstrap alone limits what is seen
        return max(0.0, float(boot_half)), 0
    # the floor in standard errors, rounded so that rows with similar floors share mde_units' cache
    floor = round(max(float(boot_half), 0.0) / se, 3)
    mde = mde_units(level, df, floor) * se
    target = DETECT_SHARE * abs(median_a)
    if not math.isfinite(target) or mde <= target:
        return mde, 0
    s = se / math.sqrt(1 / len(ra) + 1 / len(rb))        # the pooled run-to-run sd

    def enough(n: int) -> bool:
        return mde_units(level, 2 * n - 2, floor) * s * math.sqrt(2 / n) <= target
    # the MDE with n runs a side falls as n grows (the t quantile falls with the degrees of
    # freedom, and sqrt(2/n)): the smallest n that suffices is found by bisection
    lo, hi = max(len(ra), len(rb)) + 1, MAX_RUNS_NEEDED
    if lo > hi or not enough(hi):
        return mde, MAX_RUNS_NEEDED + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return mde, lo


def _decide(pr: _Prepared, alpha: float, level: float) -> SampleComparison:
    nan = float("nan")
    noise_ok = len(pr.ra) >= 2 and len(pr.rb) >= 2
    noise = a_vs_a_spread(pr.ra, pr.rb, level)
    if pr.final is not None:
        return SampleComparison(**pr.base, ci_low=nan, ci_high=nan, noise=noise if pr.final == TOO_FEW else nan,
                                noise_estimable=noise_ok and pr.final == TOO_FEW, verdict=pr.final, p_value=nan,
                                level=level)
    lo, hi = (float(q) for q in np.quantile(pr.d, [alpha / 2, 1 - alpha / 2]))
    dlo, dhi = (float(q) for q in np.quantile(pr.d, [level / 2, 1 - level / 2]))
    diff = pr.base["diff"]
    if not noise_ok:
        verdict = NO_NOISE_ESTIMATE
    elif dlo <= 0 <= dhi or abs(diff) <= noise:
        verdict = WITHIN_NOISE
    else:
        verdict = SLOWER if diff > 0 else FASTER
    mde, need = power(pr.ra, pr.rb, level, pr.base["median_a"], (dhi - dlo) / 2)
    return SampleComparison(**pr.base, ci_low=lo, ci_high=hi, noise=noise, noise_estimable=noise_ok, verdict=verdict,
                            p_value=pr.p, level=level, mde=mde, runs_needed=need)


def compare_samples(a: Sequence[np.ndarray], b: Sequence[np.ndarray], *, n_boot: int = N_BOOT, seed: int = SEED,
                    alpha: float = ALPHA, tests: int = 1) -> SampleComparison:
    """Compare per-run samples of A and B (a list of 1-D arrays per side, one array per run).

    The verdict: B is FASTER / SLOWER only with two or more runs per side, a bootstrap interval
    (over runs, then samples; level 1 - alpha / tests; fixed seed) that excludes 0, and |diff| above
    the A-vs-A spread; otherwise WITHIN_NOISE (or NO_NOISE_ESTIMATE with one run on a side).
    ci_low / ci_high: the interval at level 1 - alpha. mde: that rule's (rule_power). Several rows
    at once: compare_family.
    """
    return _decide(_prepare(a, b, n_boot, seed, alpha), alpha, alpha / max(int(tests), 1))


def family_level(p_values: Sequence[float], alpha: float = ALPHA) -> float:
    """The level at which every row of a family is decided (module docstring): Benjamini-Hochberg's
    k * alpha / m for the largest k with p_(k) <= k * alpha / m, else alpha / m. m counts the rows
    with a p-value (two or more runs a side)."""
    p = np.sort(np.asarray([x for x in p_values if np.isfinite(x)], float))
    m = len(p)
    if m == 0:
        return alpha
    ok = np.flatnonzero(p <= np.arange(1, m + 1) * alpha / m)
    k = int(ok[-1]) + 1 if len(ok) else 1
    return k * alpha / m


def compare_family(pairs: Sequence[tuple[Sequence[np.ndarray], Sequence[np.ndarray]]], *, n_boot: int = N_BOOT,
                   seed: int = SEED, alpha: float = ALPHA) -> list[SampleComparison]:
    """compare_samples over many rows (A runs, B runs) decided together at family_level."""
    prepared = [_prepare(a, b, n_boot, seed, alpha) for a, b in pairs]
    level = family_level([pr.p for pr in prepared], alpha)
    return [_decide(pr, alpha, level) for pr in prepared]
