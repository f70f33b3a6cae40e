"""What a CPU benchmark result file names: the CPU and the commit (shared by the bench scripts)."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def commit(dirty_paths: tuple[str, ...] = ()) -> str:
    """Short commit of the checkout, '+dirty' when `dirty_paths` (or, if empty, nothing is
    checked) have uncommitted changes; EPSCOPE_COMMIT names it on machines whose copy of the tree
    has no .git."""
    if os.environ.get("EPSCOPE_COMMIT"):
        return os.environ["EPSCOPE_COMMIT"]
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
        if not c:
            return "unknown"
        if dirty_paths:
            dirty = subprocess.run(["git", "status", "--porcelain", "--", *dirty_paths], cwd=ROOT,
                                   capture_output=True, text=True).stdout.strip()
            c += "+dirty" if dirty else ""
        return c
    except OSError:
        return "unknown"
