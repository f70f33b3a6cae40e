"""The structured verdict each analysis page leads with.

A verdict names what made the run slow in the vocabulary of profiler.groundtruth.expect (`Cause`, rank, peer,
kernel, phase, `Direction`) plus the size of the effect, so a test can check it against a
recording's planted `expect` block field by field, never by sentence. The sentence a page shows
(`headline`) is built here from the fields; `detail` carries the one clause only the analysis
can phrase (which blocks and warps, who waited where).

`alarm` is the page saying "act on this": a timeout, a rank others wait on, starved warps, a
barrier straggler, a real difference between A and B. A run with nothing planted (and an A/A
pair) must raise none: thresholds below are chosen so ordinary run-to-run jitter stays under
them, and each one says where it came from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from profiler.groundtruth.expect import Cause, Direction

from .decision import decide

PAGES = ("critical_path", "idle", "barriers", "compare")

# A wait at a rendezvous (the net late-entry wait, a barrier's lateness after entry) is an alarm when the
# interval of its mean share of the iteration is at or past this (decision.decide). Host entry and
# launch jitter between ranks reaches 0.4 ms per op in the ground-truth catalogue's balanced and
# A/A runs (~22% of a 1.8 ms iteration in one of their two profiled iterations, 11% as a median;
# the catalogue itself accepts host lags < 1 ms as nothing planted), while its planted host delay
# costs 85% and its barrier straggler 49%.
ALARM_SHARE = 0.25
# An effect inside the op (a rank's extra work, warps held at a barrier they bring nothing to) is
# an alarm when it costs at least this share of the op's latency: the slowest rank's kernel time
# per iteration (imbalance.op_latency; the iteration span would measure host gaps instead, which
# dominate the low-latency runs: 38 µs of kernels in a 540 µs iteration). Where 5% comes from: the
# catalogue counts an A/B knob as having an effect when it moves the op by >= 10% (its A/B
# checks); a cost under half of that is below what the project would call a change, and is stated
# as a note instead.
MATERIAL_SHARE = 0.05
# The critical path is host-bound on every rank (no one rank late) when host time is the majority
# of it: more of each iteration's path is host calls and the host between them than GPU work,
# launch latency and waits together, so the GPUs wait for their hosts more than they work. A
# majority and not ALARM_SHARE: host time between ops is normal in every recorded run (the
# catalogue's balanced and A/A runs: 3-5% of the path; few-tokens, whose 32-token kernels are
# shorter than the host calls that launch them, 57%), while a share under half still leaves the
# GPU the larger part of the path. Measured at 5ab00a2: ll-host A (per-call host work) 97-98%,
# B (cached) 4-44%; every low-latency kernel story <= 3%.
HOST_MAJORITY = 0.5


def fmt_ns(v) -> str:
    """A duration for a sentence: ns, µs, ms or s with 3 significant digits."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    a = abs(float(v))
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if a >= scale:
            x = v / scale
            return f"{x:.3g} {unit}" if abs(x) < 100 else f"{x:.0f} {unit}"
    return f"{v:.0f} ns"


def fmt_pct(v) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{100 * v:.0f}%"


def size(per_iteration, iterations, references, threshold: float = ALARM_SHARE, *, quantity: str,
         subject: str = "", reference: str = "the iteration"):
    """The decision (decision.decide) on a per-iteration effect against `threshold` x `references`
    (aligned arrays: effect ns, iteration number, iteration span or other reference)."""
    return decide(quantity, subject, per_iteration, references, iterations, threshold=threshold,
                  reference=reference)


@dataclass(frozen=True)
class Verdict:
    page: str                                 # one of PAGES
    alarm: bool
    cause: Cause                              # NONE when nothing stands out
    rank: int | None = None                   # the rank the cause is about (straggler, late host, waiting rank)
    peer: int | None = None                   # the rank it involves (waited on / waiting for it)
    kernel: str | None = None
    phase: str | None = None
    direction: Direction | None = None        # compare: B against A
    magnitude_ns: float | None = None         # the size of the effect (see each analysis' headline)
    reference_ns: float | None = None         # what the magnitude is a share of (median iteration, A's median)
    reference: str = "the median iteration"   # what reference_ns is, for the sentence
    n: int = 0                                # how many iterations / occurrences / runs a median is over
    iteration: int | None = None              # the iteration the magnitude was seen in, when it is one
    ratio: float | None = None                # imbalance: max / median busy time; compare: B / A
    where: tuple = ()                         # every (kernel, phase) the verdict names, the main one first
    late_entry: str | None = None             # 'host' | 'gpu': the cause is a rank entering the op late (late_entry.py)
    detail: str = ""                          # the analysis' own clause for the sentence
    facts: tuple = ()                         # the evidence (and what-if) behind the headline, one line each
    notes: tuple = ()                         # further findings, one sentence each, largest first
    decisions: tuple = ()                     # decision.Decision of every quantity the headline, facts and notes state
    warnings: tuple = ()                      # typed AnalysisWarnings the analysis ran with
    evidence: pd.DataFrame | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        if self.page not in PAGES:
            raise ValueError(f"verdict page must be one of {PAGES}, got {self.page!r}")
        if not isinstance(self.cause, Cause):
            raise TypeError(f"verdict cause must be a profiler.groundtruth.expect.Cause, got {self.cause!r}")
        if self.where == () and self.kernel is not None:
            object.__setattr__(self, "where", ((self.kernel, self.phase),))

    @property
    def share(self) -> float | None:
        if self.magnitude_ns is None or not self.reference_ns:
            return None
        return float(self.magnitude_ns) / float(self.reference_ns)

    @property
    def headline(self) -> str:
        return sentence(self)

    def names(self, kernel: str | None = None, phase: str | None = None) -> bool:
        """Whether the verdict names (kernel, phase); None matches anything."""
        return any((kernel is None or k == kernel) and (phase is None or p == phase) for k, p in self.where)


def _kp(kernel, phase) -> str:
    if kernel and phase:
        return f"{kernel}/{phase}"
    return kernel or phase or "?"


def _over(v: Verdict) -> str:
    """How much, per iteration: the headline decision's mean and share (decision.Decision), one
    iteration's value when the verdict names one, else the bare magnitude."""
    d = v.decisions[0] if v.decisions else None
    if v.iteration is not None:
        share = v.share
        tail = f" ({fmt_pct(share)} of that iteration)" if share is not None else ""
        return f"{fmt_ns(v.magnitude_ns)} in iteration {v.iteration}{tail}"
    if d is not None:
        return f"{fmt_ns(d.mean_ns)} per iteration ({fmt_pct(d.share)} of {d.reference})"
    return fmt_ns(v.magnitude_ns)


def sentence(v: Verdict) -> str:
    """The headline: one short sentence (what, where, how much); the evidence is v.facts."""
    c = v.cause
    d = f"; {v.detail}" if v.detail else ""
    if v.late_entry and v.rank is not None and c not in (Cause.NONE,):
        return f"late entry: {v.detail}"
    if c is Cause.TIMEOUT:
        on = f" on rank {v.peer}" if v.peer is not None else ""
        return (f"timeout: rank {v.rank} waited {fmt_ns(v.magnitude_ns)} in {_kp(v.kernel, v.phase)}{on}, "
                f"which never released it (unfinished: the kernel gave up){d}")
    if c is Cause.HOST_BOUND and v.rank is None:
        return f"host-bound: the GPUs wait for every rank's host; {v.detail}" if v.detail else \
            "host-bound: the GPUs wait for every rank's host"
    if c is Cause.HOST_BOUND:   # one rank (path_verdict._every_host)
        return f"host-bound: the GPU waits for rank {v.rank}'s host{d}"
    if c is Cause.RANK_IMBALANCE:
        ratio = f" ({v.ratio:.2f}× the other ranks' busy time)" if v.ratio and math.isfinite(v.ratio) else (
            " (the other ranks did none of that work)" if v.ratio else "")
        cost = f"; it costs the op {_over(v)}" if v.magnitude_ns is not None else ""
        return f"rank {v.rank} is the straggler in {_kp(v.kernel, v.phase)}{ratio}{cost}"
    if c is Cause.STARVED_WARPS:
        return f"starved warps: {v.detail or _kp(v.kernel, v.phase)}"
    if c is Cause.BARRIER_STRAGGLER:
        who = f"rank {v.rank}" if v.detail.startswith("rank") or not v.detail else v.detail.split(" arrived")[0]
        return f"{who} arrives last at {_kp(v.kernel, v.phase)}: the others wait {_over(v)} on it"
    if c is Cause.USELESS_ARRIVALS:
        on = f" on rank {v.rank}" if v.rank is not None else ""
        return f"useless arrivals at {_kp(v.kernel, v.phase)}{on}: {v.detail}"
    if c is Cause.KNOB_CHANGE:
        word = v.direction.value if v.direction else "different"
        pct = f" ({100 * (v.ratio - 1):+.1f}%)" if v.ratio else ""
        return f"B is {word} in {_kp(v.kernel, v.phase)}{pct}{d}"
    if c is Cause.SAME_CODE:
        return f"within noise: no phase of B differs from A beyond run-to-run noise{d}"
    return f"no alarm: {v.detail}" if v.detail else "no alarm"
