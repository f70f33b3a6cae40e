"""Loading ep_core's CUDA extension: one variant per profile build, JIT on first use, cached.

The default (profile=False) is the compiled-out build: its kernels hold no timer reads and no
record stores. The instrumented build (`-DEPSCOPE_PROFILE=1`) is a second module, loaded the
first time a call is profiled. Both come from profiler/record/build.py's `load_extension`, so
every extension of the project is built the same way (flags, sm_90, cache directory).
"""
from __future__ import annotations

import functools
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
# the torch files (bindings.cpp holds the module; the low-latency calls register into it), then
# the kernel files: each .cu is one kernel family (style rule 5), compiled without torch
BINDING_SOURCES = tuple(CSRC / f for f in ("bindings.cpp", "low_latency_bindings.cpp"))
KERNEL_SOURCES = tuple(CSRC / f for f in ("layout.cu", "notify.cu", "dispatch.cu", "combine.cu", "hook.cu",
                                          "low_latency_dispatch.cu", "low_latency_combine.cu"))
SOURCES = BINDING_SOURCES + KERNEL_SOURCES


@functools.lru_cache(maxsize=None)
def load(profile: bool = False):
    """The extension module; EPUnavailableError naming what is missing where it cannot be built
    (a CPU build of torch, no CUDA toolkit, no ninja)."""
    from profiler.record.build import CudaBuildUnavailable, load_extension

    from .errors import EPUnavailableError
    try:
        return load_extension("ep_core", SOURCES, profile=profile)
    except CudaBuildUnavailable as e:
        raise EPUnavailableError(f"ep_core: {e}") from None
