"""One JIT build helper for the whole project (ep_core's kernels and the recorder's alike).

    ext = load_extension("epscope_record", [csrc / "record_bindings.cpp", ...], profile=True)

wraps `torch.utils.cpp_extension.load` so that every extension is built the same way:

* a per-variant module name, `<name>_prof` / `<name>_noprof`, with `-DEPSCOPE_PROFILE=1|0`, so
  both builds can be loaded in one process (the benchmarks compare them side by side);
* the repository root on the include path (`#include "profiler/csrc/recorder.cuh"`);
* `-O3`, C++17 for the CUDA files (the kernel files are torch-free and CI compiles them with the
  same standard through `nvcc_compile_check`); the bindings' C++ standard is left to torch, whose
  own headers dictate it (torch 2.13 builds with C++20);
* sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise; MAX_JOBS defaults to the core count;
* a build cache under ~/.cache/epscope/<variant> (EPSCOPE_BUILD_DIR overrides the root).

The compiled-out variant (profile=False) is what the project builds by default. torch is
imported lazily: `build_options` and `nvcc_compile_check` work on a machine without CUDA.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..store.cachedir import cache_root

REPO_ROOT = Path(__file__).resolve().parents[2]
CSRC = REPO_ROOT / "profiler" / "csrc"
DEFAULT_ARCH_LIST = "9.0"  # H200 / H100 (sm_90)


class NvccNotFound(RuntimeError):
    """No nvcc on PATH or in CUDA_HOME: CUDA compile checks cannot run here."""


class NvccError(RuntimeError):
    """nvcc rejected a source file; the message carries its output."""


class CudaBuildUnavailable(RuntimeError):
    """A JIT CUDA extension cannot be built here; the message names what is missing."""


GPU_TORCH = "on a GPU machine: pip install torch -e '.[gpu]', torch's CUDA build, several GB"


def cuda_build_problem() -> str | None:
    """What stops `load_extension` on this machine, in words, or None. Checked before torch's
    own build, whose errors on a CPU machine (`OSError: CUDA_HOME environment variable is not set`
    for a CPU build of torch, whatever toolkit is installed) do not say what to do."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return f"torch is not installed; {GPU_TORCH}"
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build, which cannot build CUDA extensions; {GPU_TORCH}"
    if cpp_extension.CUDA_HOME is None:
        return ("no CUDA toolkit found (torch looked at $CUDA_HOME, nvcc on PATH and /usr/local/cuda): install one, "
                "or set CUDA_HOME to its root" + (f", e.g. CUDA_HOME={Path(nvcc_path()).resolve().parents[1]}"
                                                  if _has_nvcc() else ""))
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja, or pip install -e '.[gpu]')"
    return None


def _has_nvcc() -> bool:
    try:
        nvcc_path()
    except NvccNotFound:
        return False
    return True


@dataclass(frozen=True)
class BuildOptions:
    name: str
    sources: tuple[str, ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    extra_include_paths: tuple[str, ...]
    build_directory: str


def variant_name(name: str, profile: bool) -> str:
    return f"{name}_{'prof' if profile else 'noprof'}"


def build_root() -> Path:
    root = os.environ.get("EPSCOPE_BUILD_DIR")
    return Path(root) if root else cache_root()


def build_options(name: str, sources, *, profile: bool, extra_cflags=()) -> BuildOptions:
    """The arguments `load_extension` hands to torch (pure; tested on CPU)."""
    if not name.isidentifier():
        raise ValueError(f"extension name must be an identifier, got {name!r}")
    srcs = tuple(str(Path(s).resolve()) for s in sources)
    missing = [s for s in srcs if not Path(s).is_file()]
    if missing:
        raise FileNotFoundError(f"extension {name}: missing sources {missing}")
    variant = variant_name(name, profile)
    define = f"-DEPSCOPE_PROFILE={1 if profile else 0}"
    extra = tuple(extra_cflags)
    return BuildOptions(
        name=variant,
        sources=srcs,
        extra_cflags=("-O3", define, *extra),
        extra_cuda_cflags=("-O3", "-std=c++17", define, *extra),
        extra_include_paths=(str(REPO_ROOT),),
        build_directory=str(build_root() / variant),
    )


def _set_build_env() -> None:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCH_LIST)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))


@functools.lru_cache(maxsize=None)
def _load_cached(opts: BuildOptions, verbose: bool):
    from torch.utils.cpp_extension import load

    Path(opts.build_directory).mkdir(parents=True, exist_ok=True)
    return load(
        name=opts.name,
        sources=list(opts.sources),
        extra_cflags=list(opts.extra_cflags),
        extra_cuda_cflags=list(opts.extra_cuda_cflags),
        extra_include_paths=list(opts.extra_include_paths),
        build_directory=opts.build_directory,
        verbose=verbose,
    )


def load_extension(name: str, sources, *, profile: bool, extra_cflags=(), verbose: bool = False):
    """Build (or reuse from the cache) and import one variant of a JIT extension; raises
    CudaBuildUnavailable naming what is missing where it cannot be built."""
    problem = cuda_build_problem()
    if problem is not None:
        raise CudaBuildUnavailable(f"cannot build the CUDA extension {name}: {problem}")
    _set_build_env()
    return _load_cached(build_options(name, sources, profile=profile, extra_cflags=extra_cflags), verbose)


RECORD_SOURCES = (CSRC / "record_bindings.cpp", CSRC / "selftest.cu", CSRC / "clock_sync.cu", CSRC / "calibrate.cu")


def load_record_extension(*, profile: bool, verbose: bool = False):
    """The recorder's own extension: self-test kernels, clock pairing and calibration, IPC signal areas."""
    return load_extension("epscope_record", RECORD_SOURCES, profile=profile, verbose=verbose)


# -- plain nvcc, for CPU-side compile checks -----------------------------------------------------
def cuda_homes() -> list[Path]:
    """Where a CUDA toolkit may live, in the order looked at: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda,
    then /usr/local/cuda-X.Y, newest first (a toolkit installed without the /usr/local/cuda link)."""
    def version(p: str) -> tuple:
        return tuple(int(x) if x.isdigit() else -1 for x in p.rsplit("cuda-", 1)[1].split("."))
    env = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")]
    versioned = sorted(glob.glob("/usr/local/cuda-*"), key=version, reverse=True)
    return [Path(h) for h in (*env, "/usr/local/cuda", *versioned) if h]


def nvcc_path() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    cand = next((h / "bin" / "nvcc" for h in cuda_homes() if (h / "bin" / "nvcc").is_file()), None)
    if cand is not None:
        return str(cand)
    raise NvccNotFound("nvcc not found on PATH, under CUDA_HOME / CUDA_PATH or in /usr/local/cuda*/bin")


def nvcc_compile_check(path, defines: dict | None = None, *, ptx: bool = False, arch: str = "sm_90",
                       timeout_s: float = 600) -> str:
    """Compile one .cu with plain nvcc (no torch), as CI does. Returns the PTX text when `ptx`,
    else "" ; raises NvccNotFound (callers skip) or NvccError with nvcc's output."""
    nvcc = nvcc_path()
    flags = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    with tempfile.TemporaryDirectory(prefix="epscope-nvcc-") as tmp:
        out = Path(tmp) / ("out.ptx" if ptx else "out.o")
        cmd = [nvcc, f"-arch={arch}", "-std=c++17", "-O3", f"-I{REPO_ROOT}", *flags,
               "-ptx" if ptx else "-c", str(Path(path).resolve()), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise NvccError(f"nvcc failed on {path} ({' '.join(flags)}):\n{res.stdout}{res.stderr}")
        return out.read_text() if ptx else ""
