"""ep_core's kernel files compiled once per test session with plain nvcc, as CI compiles them (no
torch), in both profile builds: each compile keeps its PTX and ptxas' resource report (-Xptxas -v,
which changes nothing in the code). tests/ep_core/test_kernels_compile.py reads the PTX,
tests/ep_core/test_low_latency_build.py the report; before they shared these compiles the
low-latency kernels' compiled-out build was compiled twice per run (issue 34: CI time)."""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ep_core._ext import KERNEL_SOURCES
from profiler.record.build import nvcc_path
from tests.needs import needs_nvcc

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class KernelBuild:
    src: Path
    profile: int
    ptx: str        # the PTX nvcc kept
    ptxas: str      # ptxas' report: per entry function, registers, spill stores and loads


def compile_one(src: Path, profile: int, keep_dir: Path) -> KernelBuild:
    cmd = [nvcc_path(), "-arch=sm_90", "-std=c++17", "-O3", f"-I{REPO}", f"-DEPSCOPE_PROFILE={profile}",
           "-Xptxas", "-v", "--keep", f"--keep-dir={keep_dir}", "-c", str(src), "-o", str(keep_dir / "out.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"nvcc failed on {src.name} (EPSCOPE_PROFILE={profile}):\n{res.stdout}{res.stderr}"
    ptx = sorted(keep_dir.glob("*.ptx"))
    return KernelBuild(src, profile, ptx[0].read_text() if ptx else "", res.stderr)


def compile_all(root: Path) -> dict[tuple[str, int], KernelBuild]:
    """Every kernel file in both builds, keyed by (file name, profile); two nvcc processes at a
    time (two cores on the CI machine). Without nvcc: fails (or skips where EPSCOPE_TESTS_WITHOUT
    names it: tests/needs.py)."""
    needs_nvcc()
    jobs = [(src, p) for src in KERNEL_SOURCES for p in (0, 1)]
    for src, p in jobs:
        (root / f"{src.stem}-{p}").mkdir(parents=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(lambda j: compile_one(j[0], j[1], root / f"{j[0].stem}-{j[1]}"), jobs))
    return {(b.src.name, b.profile): b for b in built}
