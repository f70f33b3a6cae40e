"""Number formatting shared by pages (Dash-free)."""
from __future__ import annotations

import math


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
