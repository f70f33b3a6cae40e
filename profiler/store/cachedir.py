"""The one directory epscope keeps its caches and default outputs in, outside any checkout.

$EPSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/epscope (an absolute XDG_CACHE_HOME only: the XDG base
directory spec says a relative one is invalid and must be ignored), else ~/.cache/epscope. Each
user of it keeps its own, narrower override (EPSCOPE_BUILD_DIR, EPSCOPE_CALIBRATION, ...): this
only decides where things go when none is set. Six places computed it before, two of them reading
XDG_CACHE_HOME and one EPSCOPE_CACHE_DIR, so one setting moved some caches and not others.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "EPSCOPE_CACHE_DIR"


def cache_root() -> Path:
    """Where epscope's caches live when no narrower override is set."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "epscope"
