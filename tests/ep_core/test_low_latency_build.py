"""The low-latency sources build as the project builds them, without a GPU: the bindings file
passes a host-compiler syntax check against torch's headers (the kernel files' nvcc compile in
both profile builds is tests/ep_core/test_kernels_compile.py, which covers every KERNEL_SOURCES
file), and the compiled-out top-8 kernels neither spill nor grow past the register budget of their
launch bounds (ptxas -v), so the recording build is the only one that may."""
from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from ep_core._ext import BINDING_SOURCES, CSRC, KERNEL_SOURCES, SOURCES
from tests.needs import needs, needs_cuda_headers, needs_module

REPO = Path(__file__).resolve().parents[2]
LL_KERNELS = [CSRC / "low_latency_dispatch.cu", CSRC / "low_latency_combine.cu"]


def test_low_latency_files_are_part_of_the_extension():
    assert CSRC / "low_latency_bindings.cpp" in BINDING_SOURCES
    for f in LL_KERNELS:
        assert f in KERNEL_SOURCES
    assert SOURCES == BINDING_SOURCES + KERNEL_SOURCES
    assert "register_low_latency(m);" in (CSRC / "bindings.cpp").read_text()


def test_low_latency_bindings_syntax_check():
    gxx = shutil.which("g++")
    needs(gxx is not None, "g++", "apt-get install g++", tool="g++")
    needs_module("torch", "pip install torch==2.13.0 -e '.[gpu]'")
    cuda_inc = needs_cuda_headers()
    from torch.utils.cpp_extension import include_paths

    cmd = [gxx, "-std=c++17", "-fsyntax-only", "-w", f"-I{REPO}", f"-I{cuda_inc}",
           *[f"-I{p}" for p in include_paths()], f"-I{sysconfig.get_paths()['include']}",
           "-DTORCH_EXTENSION_NAME=ep_core_check", "-DEPSCOPE_PROFILE=0", str(CSRC / "low_latency_bindings.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.parametrize("src", LL_KERNELS, ids=lambda p: p.stem)
def test_compiled_out_top8_kernels_do_not_spill(src, kernel_builds):
    report = kernel_builds[(src.name, 0)].ptxas   # the session's compile (tests/ep_core/kernel_builds.py)
    # per kernel: "Compiling entry function '<mangled>'" then its properties
    blocks = re.split(r"Compiling entry function '", report)[1:]
    top8 = [b for b in blocks if "Li8E" in b.split("'")[0]]
    assert top8, f"no top-8 instance of {src.name} in ptxas' output"
    for b in top8:
        name = b.split("'")[0]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", b)
        regs = re.search(r"Used (\d+) registers", b)
        assert spill and regs, b[:500]
        assert spill.group(1) == "0" and spill.group(2) == "0", f"{name} spills: {spill.group(0)}"
        assert int(regs.group(1)) <= 128, f"{name} uses {regs.group(1)} registers (512-thread launch bounds: 128)"
