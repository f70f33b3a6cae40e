"""Tests that need a tool CI's machine has: nvcc and the CUDA headers, g++, Chromium, playwright,
python3's venv module, torch and the packages of the base install and the dev extra.

A missing tool FAILS the test, wherever it runs: CI's machine has every one of them (.ci/run
installs what the image lacks; nvcc lives under /usr/local/cuda*/bin), and a skip there would let
a broken CI pass silently (issue 34). A machine that lacks some on purpose says so in the
environment:

    EPSCOPE_TESTS_WITHOUT=nvcc,chromium    comma-separated names from TOOLS ("all": every one)

and those tests then skip, their reason naming the variable. GPU tests are another matter: they
skip on a machine without a GPU (tests/conftest.py), which CI's machine is.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

WITHOUT = "EPSCOPE_TESTS_WITHOUT"
# the names EPSCOPE_TESTS_WITHOUT takes, and what each stands for
TOOLS = {
    "nvcc": "the CUDA toolkit: nvcc and its headers (cuda_runtime.h)",
    "g++": "the host C++ compiler",
    "chromium": "Debian's chromium at /usr/bin/chromium (the browser tests)",
    "playwright": "the playwright package (the dev extra)",
    "venv": "python3's venv module (Debian: python3-venv)",
    "torch": "torch (CPU build is enough)",
    "perfetto": "the perfetto package (a base dependency)",
    "numba": "numba (the fast and dev extras: the compiled decode loop)",
}
NVCC_INSTALL = "a CUDA toolkit: nvcc on PATH, under CUDA_HOME or /usr/local/cuda*/bin"


def lacking_on_purpose() -> set[str]:
    """The tools EPSCOPE_TESTS_WITHOUT names; a name it does not know fails (a typo would
    otherwise turn into failures that the variable was meant to explain)."""
    names = {n.strip() for n in os.environ.get(WITHOUT, "").split(",") if n.strip()}
    unknown = names - set(TOOLS) - {"all"}
    if unknown:
        pytest.fail(f"{WITHOUT} names {sorted(unknown)}, which are not tools of tests/needs.py "
                    f"(known: {', '.join(TOOLS)}, all)")
    return set(TOOLS) if "all" in names else names


def needs(available: bool, what: str, install: str, *, tool: str, module_level: bool = False) -> None:
    """Fail unless `available`, or skip when EPSCOPE_TESTS_WITHOUT says this machine lacks `tool`."""
    assert tool in TOOLS, f"tests/needs.py does not know the tool {tool!r}"
    if available:
        return
    if tool in lacking_on_purpose():
        pytest.skip(f"{what} is not available here, and {WITHOUT} says this machine lacks {tool} on purpose",
                    allow_module_level=module_level)
    pytest.fail(f"{what} is missing ({install}). CI's machine has it; on a machine that lacks it on purpose, "
                f"set {WITHOUT}={tool} to skip these tests", pytrace=False)


def needs_module(name: str, install: str, *, tool: str | None = None, module_level: bool = False):
    """The imported module `name`, as pytest.importorskip, but failing as `needs` does."""
    try:
        return importlib.import_module(name)
    except ImportError:
        needs(False, f"the Python package {name!r}", install, tool=tool or name, module_level=module_level)


def needs_nvcc() -> str:
    """nvcc's path (profiler.record.build.nvcc_path: PATH, CUDA_HOME, /usr/local/cuda*)."""
    from profiler.record.build import NvccNotFound, nvcc_path
    try:
        return nvcc_path()
    except NvccNotFound:
        needs(False, "nvcc", NVCC_INSTALL, tool="nvcc")


def needs_cuda_headers() -> Path:
    """The CUDA toolkit's include directory (the one holding cuda_runtime.h): nvcc's own (through
    links), else the first of profiler.record.build.cuda_homes() that has one."""
    from profiler.record.build import cuda_homes
    nvcc = Path(needs_nvcc()).resolve()
    inc = next((h / "include" for h in (nvcc.parents[1], *cuda_homes()) if (h / "include" / "cuda_runtime.h").is_file()),
               None)
    needs(inc is not None, "the CUDA headers (cuda_runtime.h)", NVCC_INSTALL, tool="nvcc")
    return inc
