"""Colours and figure styling shared by every page, so a phase has one colour everywhere.

Known phases of the bundled registries get hand-picked colours grouped by what they mean (waits
are warm, data movement cool, compute green); any other phase name (a branch that added phases)
gets a stable colour from a hash of its name, so it is the same in every run and every page.
"""
from __future__ import annotations

import zlib

# Dark, dense, Perfetto/Nsight-like. Hex only: plotly and CSS both read it.
BG = "#14171c"
PANEL = "#1b1f26"
GRID = "#2a303a"
TEXT = "#d7dde6"
MUTED = "#8892a0"
ACCENT = "#4aa3ff"
CRITICAL = "#ff3b5c"   # the critical path, on every page
GOOD = "#3ecf8e"
BAD = "#ff6b6b"

PHASE_COLOURS: dict[str, str] = {
    # ep_intranode (ep_core/phases/ep_intranode.toml)
    "notify": "#b48ead",
    "send_chunk": "#4aa3ff",
    "wait_space": "#ff9f43",
    "publish_tail": "#ffd166",
    "wait_data": "#ff6b6b",
    "copy_out": "#2ec4b6",
    "publish_head": "#f4a261",
    "reduce": "#7bd389",
    "clock_sync": "#9aa5b1",
    # selftest (profiler/phases/selftest.toml)
    "iteration": "#5c6b7a",
    "work": "#3ecf8e",
    "idle": "#e76f51",
    "tick": "#ffd166",
    # host spans and barriers
    "host": "#8d99ae",
    "enqueue": "#8d99ae",
    "barrier": "#c77dff",
}

# fallback palette: distinct on a dark background (Tableau-like, brightened)
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#d4a6c8", "#fabfd2", "#8cd17d")


_HOST_PALETTE = ("#8d99ae", "#6c7a92", "#a3acbd", "#7d8aa3", "#b6bfcc")


def phase_colour(name: str) -> str:
    name = str(name)
    if name.startswith("host "):   # host spans: greys, told apart by name, never a device colour
        return _HOST_PALETTE[zlib.crc32(name.encode()) % len(_HOST_PALETTE)]
    if name in PHASE_COLOURS:
        return PHASE_COLOURS[name]
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


def blend(hex_colour: str, alpha: float, bg: str = PANEL) -> str:
    """The colour drawn at `alpha` over `bg`, as an opaque hex (heatmap colorscales need opaque)."""
    a = max(0.0, min(1.0, float(alpha)))
    c = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(bg[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(b[k] + (c[k] - b[k]) * a):02x}" for k in range(3))


def figure_layout(**overrides) -> dict:
    """Base plotly layout for every figure of the viewer."""
    base = dict(
        template="plotly_dark",
        paper_bgcolor=PANEL,
        plot_bgcolor=PANEL,
        font=dict(family="Inter, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif", size=11, color=TEXT),
        margin=dict(l=70, r=16, t=28, b=36),
        hoverlabel=dict(font=dict(family="JetBrains Mono, Menlo, Consolas, monospace", size=11)),
        legend=dict(orientation="h", yanchor="bottom", y=1.01, xanchor="left", x=0, font=dict(size=10)),
        xaxis=dict(gridcolor=GRID, zerolinecolor=GRID),
        yaxis=dict(gridcolor=GRID, zerolinecolor=GRID),
    )
    base.update(overrides)
    # numbers on axes in full ("1,000,000 µs", never plotly's SI "1M µs", which reads as a unit):
    # every axis of every figure, whatever the page passed
    for k, ax in base.items():
        if (k.startswith("xaxis") or k.startswith("yaxis")) and isinstance(ax, dict):
            ax.setdefault("exponentformat", "none")
            ax.setdefault("separatethousands", True)
    return base
