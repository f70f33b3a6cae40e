"""Number formatting shared by pages (Dash-free).

Times: one unit per axis and per card (s, ms, µs or ns: the largest in which the axis's or card's
largest magnitude is at least 1, so its numbers read 1 to 999 and never "30,000,000 µs"); a value
alone (a table cell) picks its own (ns). Positions in a long run are stated relative to an origin
that means something (the iteration's or the window's start), since "25,151,000 µs since run
start" tells nothing (issue 29).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def _finite(v):
    """(float, None) for a finite number, else (None, the string shown instead: — or ∞)."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None, "—"
    if math.isnan(v):
        return None, "—"
    if math.isinf(v):
        return None, "∞"
    return v, None


def ns(v) -> str:
    """A duration in ns as a short human string: 850 ns, 12.3 µs, 4.56 ms, 1.20 s."""
    v, shown = _finite(v)
    if shown is not None:
        return shown
    a = abs(v)
    if a < 1e3:
        return f"{v:.0f} ns"
    if a < 1e6:
        return f"{v / 1e3:.3g} µs" if a < 1e4 else f"{v / 1e3:.1f} µs"
    if a < 1e9:
        return f"{v / 1e6:.3g} ms" if a < 1e7 else f"{v / 1e6:.1f} ms"
    return f"{v / 1e9:.3g} s"


def signed_ns(v) -> str:
    s = ns(v)
    try:
        return ("+" + s) if float(v) > 0 else s
    except (TypeError, ValueError):
        return s


def pct(v, digits: int = 1, signed: bool = False) -> str:
    v, shown = _finite(v)
    if shown is not None:
        return shown
    return f"{v:+.{digits}f}%" if signed else f"{v:.{digits}f}%"


def share(v, digits: int = 1) -> str:
    """A 0..1 share as a percentage."""
    try:
        return pct(float(v) * 100, digits)
    except (TypeError, ValueError):
        return "—"


def ratio(v) -> str:
    v, shown = _finite(v)
    if shown is not None:
        return shown
    return f"{v:.2f}×"


@dataclass(frozen=True)
class TimeUnit:
    """A unit for an axis or a card: its name and how many ns it holds."""
    name: str
    ns: float

    def of(self, values_ns):
        """Values in ns as floats in this unit (a list for a list or array, a float for one)."""
        if hasattr(values_ns, "__len__"):
            return [float(v) / self.ns for v in values_ns]
        return float(values_ns) / self.ns


UNITS = (TimeUnit("s", 1e9), TimeUnit("ms", 1e6), TimeUnit("µs", 1e3), TimeUnit("ns", 1.0))


def time_unit(*values_ns) -> TimeUnit:
    """The unit for an axis or a card showing `values_ns` (numbers or arrays of them): the largest
    in which the largest finite magnitude is >= 1; ns when there is none."""
    big = 0.0
    for v in values_ns:
        try:
            a = [abs(float(x)) for x in (v if hasattr(v, "__len__") else [v])]
        except (TypeError, ValueError):
            continue
        a = [x for x in a if math.isfinite(x)]
        big = max([big] + a)
    return next((u for u in UNITS if big >= u.ns), UNITS[-1])


def in_unit(v, unit: TimeUnit, digits: int = 3, signed: bool = False) -> str:
    """v (ns) in `unit` with `digits` significant digits for the unit's range (1-999: 12.3, 456),
    no unit name (the caller states it once)."""
    v, shown = _finite(v)
    if shown is not None:
        return shown
    x = v / unit.ns
    mag = abs(x)
    decimals = 0 if mag >= 10 ** (digits - 1) or mag == 0 else max(0, digits - 1 - int(math.floor(math.log10(mag))))
    text = f"{x:,.{decimals}f}"
    return ("+" + text) if signed and x > 0 else text


def times(*values_ns, sep: str = " … ", signed: bool = False) -> str:
    """Several times of one card in one unit, named once: '−124 … −110 µs'."""
    unit = time_unit(*values_ns)
    if all(_finite(v)[0] is None for v in values_ns):
        return "—"
    return sep.join(in_unit(v, unit, signed=signed) for v in values_ns) + f" {unit.name}"


def axis_title(what: str, unit: TimeUnit, summed: str = "") -> str:
    """An axis title naming its unit, and what a value is summed over when it is ('summed over
    warps': warp time, which exceeds wall time when many warps wait at once)."""
    return f"{what} ({unit.name}{', ' + summed if summed else ''})"


def position(t_ns, resolution_ns) -> str:
    """A time far from its origin (a window's start in a long run) in the unit of its own
    magnitude, with the decimals that resolve `resolution_ns` (25.15100 s for a 2 ms window 25 s
    in), instead of a long number of µs."""
    t, shown = _finite(t_ns)
    if shown is not None:
        return shown
    unit = time_unit(t)
    res = abs(float(resolution_ns)) / unit.ns if resolution_ns else 1.0
    decimals = max(0, min(9, int(math.ceil(-math.log10(res))) if 0 < res < 1 else 0))
    return f"{t / unit.ns:,.{decimals}f} {unit.name}"
