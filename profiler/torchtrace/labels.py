"""The label of an instrumented launch in a PyTorch profiler trace: the one place that writes and
reads it. ep_core opens a `record_function` range named `launch_label(run, rank, launch)` around
each launcher call that takes profiled launches (ep_core/buffer_profile.py `labelled`); the
kernels that call launches are the run's launches `launch`, `launch + 1`, ... in launch order
(the session hands out launch indices in the order the launcher launches). `epscope merge` reads
the label back to join the trace's kernels to the run's launches one for one.

    epscope|<run name>|r<rank>|l<first launch>
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "epscope|"
_LABEL = re.compile(r"epscope\|(?P<run>[^|]*)\|r(?P<rank>\d{1,5})\|l(?P<launch>\d{1,10})")


@dataclass(frozen=True)
class Label:
    """A parsed launch label: the run's name, the rank and the first launch index of the range."""
    run: str
    rank: int
    launch: int


def launch_label(run: str, rank: int, launch: int) -> str:
    if "|" in run:
        raise ValueError(f"run name {run!r}: '|' separates the label's fields")
    return f"{PREFIX}{run}|r{int(rank)}|l{int(launch)}"


def parse_label(name: str) -> Label | None:
    """The label's fields, or None when `name` is not an epscope launch label."""
    if not name.startswith(PREFIX):
        return None
    m = _LABEL.fullmatch(name)
    if m is None:
        return None
    return Label(m["run"], int(m["rank"]), int(m["launch"]))
