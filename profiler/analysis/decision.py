"""A decision is a band of one measured interval (style.md rule 18; issue 29).

Every alarm the pages raise is decided here, the same way: one quantity measured per iteration
(an effect in ns), a reference per iteration (the iteration's span, or the op's latency after
entry), the per-iteration share effect / reference, the interval of its mean over iterations, and
a threshold on the share. The interval's band is the decision:

    alarm       the whole interval is at or above the threshold
    borderline  the interval straddles it (no alarm; the verdict states the share and the interval)
    none        the whole interval is below it

Two runs whose intervals overlap can therefore never get "alarm" and "none". Runs of one config
keep overlapping intervals only when each interval is honest about the run-to-run spread: the
interval is Student's t interval of the mean share over iterations at LEVEL, so it is as wide as
the iterations disagree (a run whose late rank alternates gets a wide interval, one whose planted
delay repeats a narrow one), and with a single iteration it is unbounded (one iteration says
nothing about the next: never an alarm; borderline when its share reaches the threshold).

The mean, not the median: the interval is the mean's, and a stated figure must be the one the
interval is about ("per iteration, mean over n iterations").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .stats import t_quantile

# Two-sided level of the interval: each end is a 90% one-sided bound, so a run whose true share
# sits exactly at the threshold is called an alarm (or none) in at most 10% of runs. Where it came
# from (benchmarks/NOTES.md, issue 29): at 80% the catalogue's planted late entries with 2
# profiled iterations (ep-host-late: 77% and 89% of the iteration; ep-barrier-straggler: 63% and
# 79%) stay alarms; at 90% the second straddles 25% (t with one degree of freedom is 6.3). On the
# synthetic host jitter of profiler.groundtruth.synthetic (a random late rank per op, 40 seeds a size, 6
# iterations) the net late-entry wait raised no alarm at any size up to half the iteration.
LEVEL = 0.80
ALARM, BORDERLINE, NONE = "alarm", "borderline", "none"
BANDS = (ALARM, BORDERLINE, NONE)


@dataclass(frozen=True)
class Decision:
    """One quantity's decision. Times in ns; shares as fractions; per-iteration arrays aligned."""
    quantity: str            # the glossary term of what was measured ("net late-entry wait", ...)
    subject: str             # who or where it is about ("rank 1", "dispatch/grid", ""): part of its identity
    reference: str           # what the share is of ("the iteration", "the op latency after entry")
    threshold: float         # the share at which it is an alarm
    iterations: tuple        # iteration numbers
    values_ns: tuple         # the quantity per iteration
    references_ns: tuple     # the reference per iteration
    mean_ns: float           # mean of values_ns: the figure a sentence states
    share: float             # mean of the per-iteration shares
    low: float               # the interval of the mean share (LEVEL, t)
    high: float
    band: str                # ALARM | BORDERLINE | NONE

    def __post_init__(self):
        if self.band not in BANDS:
            raise ValueError(f"decision band must be one of {BANDS}, got {self.band!r}")
        if not (len(self.iterations) == len(self.values_ns) == len(self.references_ns)):
            raise ValueError("decision: iterations, values and references must align")

    @property
    def alarm(self) -> bool:
        return self.band == ALARM

    @property
    def borderline(self) -> bool:
        return self.band == BORDERLINE

    @property
    def n(self) -> int:
        return len(self.values_ns)

    @property
    def reference_mean_ns(self) -> float:
        r = np.asarray(self.references_ns, float)
        return float(r.mean()) if len(r) else float("nan")

    def interval(self) -> str:
        """'31–45%' (or 'unbounded: one iteration')."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "unbounded: one iteration"
        return f"{_pct(self.low)}–{_pct(self.high)}"

    def describe(self) -> str:
        """The decision in one clause: share, interval, over what, threshold and band."""
        n = self.n
        return (f"{_pct(self.share)} of {self.reference} ({int(round(100 * LEVEL))}% interval {self.interval()}, "
                f"mean over {n} iteration{'s' if n != 1 else ''}; alarm from {_pct(self.threshold)}: {self.band})")


def _pct(x: float) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%".replace("-0%", "0%")


def mean_interval(x, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean of x at `level` (two-sided); unbounded
    with fewer than 2 finite values, a point when they are all equal."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(x.mean())
    if len(x) < 2:
        return m, -math.inf, math.inf
    hw = t_quantile(0.5 + level / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, m - hw, m + hw


def band(low: float, high: float, threshold: float, share: float = math.nan) -> str:
    """The band of an interval; an unbounded one (a single iteration) is borderline when its one
    share reaches the threshold and none below it: one iteration cannot make an alarm, and a share
    under the threshold is not turned into doubt."""
    if math.isnan(low) or math.isnan(high):
        return NONE
    if math.isinf(low) and math.isinf(high):
        return BORDERLINE if share >= threshold else NONE
    if low >= threshold:
        return ALARM
    if high >= threshold:
        return BORDERLINE
    return NONE


def decide(quantity: str, subject: str, values_ns, references_ns, iterations, *, threshold: float,
           reference: str = "the iteration") -> Decision:
    """The decision on per-iteration `values_ns` against `threshold` x `references_ns` (aligned
    arrays; an iteration whose reference is not positive has no share and is left out of the
    interval)."""
    v = np.asarray(values_ns, float)
    r = np.asarray(references_ns, float)
    its = np.asarray(iterations)
    if not (len(v) == len(r) == len(its)):
        raise ValueError("decide: values, references and iterations must align")
    with np.errstate(divide="ignore", invalid="ignore"):
        sh = np.where(r > 0, v / np.where(r > 0, r, 1), np.nan)
    m, lo, hi = mean_interval(sh)
    return Decision(quantity=quantity, subject=subject, reference=reference, threshold=float(threshold),
                    iterations=tuple(int(i) for i in its), values_ns=tuple(float(x) for x in v),
                    references_ns=tuple(float(x) for x in r),
                    mean_ns=float(v.mean()) if len(v) else float("nan"), share=m, low=lo, high=hi,
                    band=band(lo, hi, threshold, m))


# -- stored form (profiler.analysis.stored, the stored summary) ---------------------------------
_FLOATS = ("threshold", "mean_ns", "share", "low", "high")


def to_json(d: Decision) -> dict:
    """A JSON-safe dict of the decision (non-finite numbers as strings 'inf', '-inf', 'nan')."""
    out = {"quantity": d.quantity, "subject": d.subject, "reference": d.reference, "band": d.band,
           "iterations": list(d.iterations), "values_ns": [_jnum(x) for x in d.values_ns],
           "references_ns": [_jnum(x) for x in d.references_ns]}
    out.update({k: _jnum(getattr(d, k)) for k in _FLOATS})
    return out


def from_json(x, where: str = "decision") -> Decision:
    """The decision to_json wrote; ValueError naming the first field that is not as written."""
    keys = {"quantity", "subject", "reference", "band", "iterations", "values_ns", "references_ns", *_FLOATS}
    if not isinstance(x, dict) or set(x) != keys:
        raise ValueError(f"{where}: a decision's fields")
    for k in ("quantity", "subject", "reference", "band"):
        if not isinstance(x[k], str):
            raise ValueError(f"{where}.{k}: not a string")
    if not isinstance(x["iterations"], list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                         for i in x["iterations"]):
        raise ValueError(f"{where}.iterations: not a list of integers")
    nums = {k: _fnum(x[k], f"{where}.{k}") for k in _FLOATS}
    vals = tuple(_fnum(v, f"{where}.values_ns") for v in _list(x["values_ns"], f"{where}.values_ns"))
    refs = tuple(_fnum(v, f"{where}.references_ns") for v in _list(x["references_ns"], f"{where}.references_ns"))
    return Decision(quantity=x["quantity"], subject=x["subject"], reference=x["reference"], band=x["band"],
                    iterations=tuple(x["iterations"]), values_ns=vals, references_ns=refs, **nums)


def _jnum(v):
    v = float(v)
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def _fnum(v, where: str) -> float:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise ValueError(f"{where}: not a number")


def _list(v, where: str) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{where}: not a list")
    return v
