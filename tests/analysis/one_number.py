"""The check that every page states one number per quantity (issue 29, style.md rule 16), shared by
the decision tests (synthetic runs) and the one-time-model tests (every bundled run).

A verdict carries every decision its headline, facts and notes state (`Verdict.decisions`). Across
the pages of one run, the same quantity about the same subject must be the same decision: the same
mean per iteration, and against the same reference the same share, interval and band."""
from __future__ import annotations

import math

from profiler.analysis.decision import Decision


def _eq(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or (math.isfinite(a) and math.isfinite(b)
                                                           and abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b)))


def same_decision(a: Decision, b: Decision) -> bool:
    return (a.quantity, a.subject, a.reference, a.threshold, a.band, a.iterations) == \
        (b.quantity, b.subject, b.reference, b.threshold, b.band, b.iterations) and \
        all(_eq(x, y) for x, y in zip((a.mean_ns, a.share, a.low, a.high), (b.mean_ns, b.share, b.low, b.high)))


def check(verdicts) -> dict:
    """Asserts that the verdicts (of one run's pages) agree on every quantity; returns
    {(quantity, subject): Decision}."""
    by_ref: dict = {}
    by_q: dict = {}
    for v in verdicts:
        for d in v.decisions:
            key = (d.quantity, d.subject, d.reference)
            if key in by_ref:
                assert same_decision(by_ref[key], d), (v.page, by_ref[key], d)
            by_ref[key] = d
            q = (d.quantity, d.subject)
            if q in by_q:
                assert _eq(by_q[q].mean_ns, d.mean_ns), (v.page, q, by_q[q].mean_ns, d.mean_ns)
            by_q[q] = d
    return by_q
