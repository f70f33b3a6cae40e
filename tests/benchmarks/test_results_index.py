"""benchmarks/results/README.md names every file of the folder (as the current figure of its kind
or as an older one), so a reader can tell which figure is current."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _expand(name: str) -> list[str]:
    """`a{1,2}.{json,log}` -> a1.json, a1.log, a2.json, a2.log."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _stem(name: str) -> str:
    name = name.rstrip("/")
    for ext in (".*", ".md", ".json", ".log", ".txt"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def test_every_result_file_is_named_in_the_index():
    text = (RESULTS / "README.md").read_text()
    named = {_stem(n) for code in re.findall(r"`([^`]+)`", text) for n in _expand(code)}
    missing = sorted(p.name for p in RESULTS.iterdir() if p.name != "README.md" and _stem(p.name) not in named)
    assert not missing, f"benchmarks/results/README.md does not name: {missing}"


def test_brace_expansion():
    assert _expand("r{1,3}_x.{json,log}") == ["r1_x.json", "r1_x.log", "r3_x.json", "r3_x.log"]
