"""The JIT build helper's options, and the CUDA files compiled with plain nvcc as CI does (no
torch, no GPU): the compiled-out self-test has no %globaltimer read and no record store."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from profiler.record import build
from tests.needs import needs_nvcc

CSRC = build.CSRC


def test_build_options_per_variant(monkeypatch, tmp_path):
    monkeypatch.setenv("EPSCOPE_BUILD_DIR", str(tmp_path))
    on = build.build_options("epscope_record", build.RECORD_SOURCES, profile=True, extra_cflags=("-DX=1",))
    off = build.build_options("epscope_record", build.RECORD_SOURCES, profile=False)
    assert (on.name, off.name) == ("epscope_record_prof", "epscope_record_noprof")
    assert "-DEPSCOPE_PROFILE=1" in on.extra_cflags and "-DEPSCOPE_PROFILE=1" in on.extra_cuda_cflags
    assert "-DEPSCOPE_PROFILE=0" in off.extra_cflags and "-DEPSCOPE_PROFILE=0" in off.extra_cuda_cflags
    assert "-DX=1" in on.extra_cflags and "-DX=1" in on.extra_cuda_cflags
    assert "-O3" in on.extra_cflags and "-O3" in on.extra_cuda_cflags
    # C++17 for the torch-free kernel files; the bindings get torch's own standard
    assert "-std=c++17" in on.extra_cuda_cflags and not any(f.startswith("-std") for f in on.extra_cflags)
    assert on.extra_include_paths == (str(build.REPO_ROOT),)
    assert Path(on.build_directory) == tmp_path / "epscope_record_prof"
    assert on.build_directory != off.build_directory
    assert all(Path(s).is_absolute() for s in on.sources)


def test_build_options_reject_bad_input():
    with pytest.raises(ValueError, match="identifier"):
        build.build_options("bad-name", build.RECORD_SOURCES, profile=False)
    with pytest.raises(FileNotFoundError, match="nope.cu"):
        build.build_options("x", [CSRC / "nope.cu"], profile=False)


def test_build_env_defaults(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    build._set_build_env()
    import os

    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0" and int(os.environ["MAX_JOBS"]) >= 1
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    build._set_build_env()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"


def _ptx(path, profile):
    needs_nvcc()
    return build.nvcc_compile_check(path, {"EPSCOPE_PROFILE": profile}, ptx=True)


def _entries(ptx: str) -> dict[str, str]:
    """PTX text per kernel entry, keyed by the kernel's short name."""
    parts = re.split(r"\.entry\s+", ptx)[1:]
    out = {}
    for p in parts:
        m = re.match(r"\S*?(timer_probe|record_cost|imbalance|grid_barrier|anchored_ticks)_kernel", p)
        if m:
            out[m.group(1)] = p
    return out


@pytest.fixture(scope="module")
def selftest_ptx():
    return {p: _ptx(CSRC / "selftest.cu", p) for p in (0, 1)}


def test_compiled_out_selftest_has_no_timer_reads_and_no_record_stores(selftest_ptx):
    off, on = _entries(selftest_ptx[0]), _entries(selftest_ptx[1])
    assert set(off) == set(on) == {"timer_probe", "record_cost", "imbalance", "grid_barrier", "anchored_ticks"}
    for k in on:
        # formats 2-3: records read clock64; %globaltimer is read by each warp's init and finish anchors
        assert "%globaltimer" in on[k], f"{k}: instrumented build reads the timer"
        assert "%globaltimer" not in off[k], f"{k}: compiled-out build still reads %globaltimer"
        assert "st.global.v2.u32" not in off[k], f"{k}: compiled-out build still stores records"
        assert "st.global.v4" not in on[k], f"{k}: a 16-byte store left in the format-3 recorder"
    for k in ("record_cost", "imbalance", "grid_barrier", "timer_probe", "anchored_ticks"):
        assert "st.global.v2.u32" in on[k], f"{k}: a record is one 8-byte store"


def test_clock_sync_messages_are_single_volatile_words():
    """Each hop of the ping-pong is one 64-bit volatile store polled by volatile loads; the one
    system fence orders rank 0's zeroing of its reply slots before its first ping."""
    ptx = _ptx(CSRC / "clock_sync.cu", 0)
    assert "st.volatile.global.u64" in ptx and "ld.volatile.global.u64" in ptx and "%globaltimer" in ptx
    assert "st.release" not in ptx and "ld.acquire" not in ptx
    assert ptx.count("membar.sys") + ptx.count("fence.sc.sys") == 1


def test_recorder_header_compiles_in_host_code(tmp_path):
    """record_bindings.cpp includes recorder.cuh in host C++: buffer_bytes must be usable there."""
    src = tmp_path / "host.cu"
    src.write_text('#include "profiler/csrc/recorder.cuh"\n'
                   "static_assert(epscope::buffer_bytes(2, 3) == 64 + 2 * (64 + 3 * 8), \"buffer_bytes\");\n"
                   "int main() { return 0; }\n")
    needs_nvcc()
    build.nvcc_compile_check(src, {"EPSCOPE_PROFILE": 1})


def test_nvcc_error_is_reported(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { this is not cuda; }\n")
    needs_nvcc()
    with pytest.raises(build.NvccError, match="bad.cu"):
        build.nvcc_compile_check(bad)


def test_record_design_variants_exist_only_in_the_instrumented_build(selftest_ptx):
    """record_parts (selftest.cu, (2b)): the designs the recorder bench measures side by side
    (RecordPart). The compiled-out build has none of them (it reads no timer); format 1's and the
    bound-predicate design store under a per-record predicate; format 2's reads clock64 only and
    stores with no predicate of its own (its lane predicate is fixed at init)."""
    def parts(ptx):
        out = {}
        for p in re.split(r"\.entry\s+", ptx)[1:]:
            m = re.match(r"\S*?record_parts_kernelILi(\d+)E", p)
            if m:
                out[int(m.group(1))] = p
        return out

    off, on = parts(selftest_ptx[0]), parts(selftest_ptx[1])
    assert off == {} and sorted(on) == list(range(12))
    for k in (1, 2):
        assert re.search(r"@p st\.global\.v4\.u32", on[k])
    assert "@h mov.u64 t, %clock64" in on[1] and "%globaltimer" in on[1]  # format 1's runtime hires choice
    for k in (2, 3, 4, 5, 6, 7, 9):
        assert "%globaltimer" not in on[k], f"design {k} reads only clock64"
    for k in (4, 5):
        assert re.search(r"^\s*st\.global\.v4\.u32", on[k], re.M) and "@p st.global" not in on[k]
    assert "st.global.cs.v4" in on[3] and "st.global.L1::no_allocate.v4" in on[6] and "st.global.v2.u32" in on[9]
    assert "%globaltimer" in on[8] and "%globaltimer" not in on[0]
    # format 3: one 8-byte store of clock64 bits 31..0 + meta (10), and its PAYLOAD slot's second store (11)
    for k in (10, 11):
        assert "%globaltimer" not in on[k] and "st.global.v4" not in on[k] and "@p st.global" not in on[k]
    n10, n11 = on[10].count("st.global.v2.u32"), on[11].count("st.global.v2.u32")   # per unrolled record site
    assert n10 >= 1 and n11 == 2 * n10


def test_nvcc_is_found_under_a_versioned_toolkit_without_the_link(monkeypatch, tmp_path):
    """CI's toolkit lives in /usr/local/cuda-X.Y/bin; without PATH, CUDA_HOME or the /usr/local/cuda
    link, nvcc_path looks there, newest version first."""
    found = {str(tmp_path / "cuda-12.8" / "bin" / "nvcc"), str(tmp_path / "cuda-9.2" / "bin" / "nvcc")}
    for f in found:
        Path(f).parent.mkdir(parents=True)
        Path(f).write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build.glob, "glob", lambda pattern: [str(tmp_path / d) for d in ("cuda-9.2", "cuda-13.0", "cuda-12.8")])
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: not str(p).startswith("/usr/local/cuda/") and real_is_file(p))
    assert [h.name for h in build.cuda_homes()] == ["cuda", "cuda-13.0", "cuda-12.8", "cuda-9.2"]
    assert build.nvcc_path() == str(tmp_path / "cuda-12.8" / "bin" / "nvcc")   # 13.0 has no nvcc here
    monkeypatch.setattr(build.glob, "glob", lambda pattern: [])
    with pytest.raises(build.NvccNotFound, match="/usr/local/cuda"):
        build.nvcc_path()
