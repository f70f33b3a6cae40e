"""Only what pyproject.toml cannot say: the bundled runs (traces/, one directory per run) install
as data beside the package, under <prefix>/share/epscope/traces, so `epscope view` with no
argument serves them from an installed epscope too (profiler.commands.cli.default_trace_root)."""
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def bundled_traces() -> list[tuple[str, list[str]]]:
    by_dir: dict[str, list[str]] = {}
    for f in sorted((ROOT / "traces").rglob("*")):
        if f.is_file():
            rel = f.relative_to(ROOT)
            by_dir.setdefault((Path("share/epscope") / rel.parent).as_posix(), []).append(rel.as_posix())
    return sorted(by_dir.items())


setup(data_files=bundled_traces())
