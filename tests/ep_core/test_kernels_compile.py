"""ep_core's kernel files compile with plain nvcc (no torch), in both profile builds, as CI does;
the compiled-out build holds none of the recorder's code; bindings.cpp passes a host-compiler
syntax check against torch's headers (it needs no c10/cuda headers: streams travel as ints)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from ep_core._ext import CSRC, KERNEL_SOURCES
from tests.needs import needs, needs_cuda_headers, needs_module

REPO = Path(__file__).resolve().parents[2]


def test_every_kernel_file_compiles_in_both_builds(kernel_builds):
    ptx = {key: b.ptx for key, b in kernel_builds.items()}   # compiled by the session fixture (conftest.py)
    assert set(ptx) == {(src.name, p) for src in KERNEL_SOURCES for p in (0, 1)}
    # Off means off: WarpRecorder::init reads %smid and nothing else in ep_core does (the bounded
    # waits read %globaltimer in both builds, so that is not the marker); the instrumented build
    # stores 8-byte records (format 3).
    for src in KERNEL_SOURCES:
        off, on = ptx[(src.name, 0)], ptx[(src.name, 1)]
        assert off and on, f"no PTX kept for {src.name}"
        assert "%smid" in on, f"{src.name}: the instrumented build records nothing"
        assert "%smid" not in off, f"{src.name}: the compiled-out build still holds recorder code"
        assert len(re.findall(r"st\.global\.v2\.u32", on)) > len(re.findall(r"st\.global\.v2\.u32", off)), src.name
    # The pipelined paths (tma.cuh) are built into dispatch and combine in both builds: bulk loads
    # completing on an mbarrier, bulk stores in groups, the read-wait at the derived depth of
    # every buffer count (N = 1, 2: depth 0; N = 3: depth 1) and the full drain before a publish.
    for name in ("dispatch.cu", "combine.cu"):
        for p in (0, 1):
            text = ptx[(name, p)]
            for instr in (r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes",
                          r"cp\.async\.bulk\.global\.shared::cta\.bulk_group", r"cp\.async\.bulk\.commit_group",
                          r"cp\.async\.bulk\.wait_group\.read 0;", r"cp\.async\.bulk\.wait_group\.read 1;",
                          r"cp\.async\.bulk\.wait_group 0;", r"mbarrier\.try_wait\.parity", r"fence\.proxy\.async\.global"):
                assert re.search(instr, text), f"{name} (EPSCOPE_PROFILE={p}): no {instr} in the PTX"
            # a unit's pipeline warps meet at named barrier 1 before one thread publishes it
            # (tma.cuh, pipe_warps_sync_or): a publish that skipped it would race the other warps
            assert re.search(r"bar\.red\.or\.pred\s+\w+,\s*1,", text), f"{name} (EPSCOPE_PROFILE={p}): no publish barrier"


def test_kernel_files_do_not_include_torch():
    for src in (*KERNEL_SOURCES, *CSRC.glob("*.cuh"), *CSRC.glob("*.h")):
        text = src.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), f"{src.name} includes torch"


def test_bindings_syntax_checks_with_host_compiler():
    gxx = shutil.which("g++")
    needs(gxx is not None, "g++", "apt-get install g++", tool="g++")
    needs_module("torch", "pip install torch==2.13.0 -e '.[gpu]'")
    cuda_inc = needs_cuda_headers()
    from torch.utils.cpp_extension import include_paths

    cmd = [gxx, "-std=c++17", "-fsyntax-only", f"-I{REPO}", f"-I{cuda_inc}",
           *[f"-I{p}" for p in include_paths()], f"-I{sysconfig.get_paths()['include']}",
           "-DTORCH_EXTENSION_NAME=ep_core_check", "-DEPSCOPE_PROFILE=0", str(CSRC / "bindings.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
