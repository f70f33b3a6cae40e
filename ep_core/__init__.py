"""ep_core: intranode expert-parallel dispatch/combine kernels with DeepEP's API, instrumented
with epscope's per-warp recorder.

    import ep_core
    buffer = ep_core.Buffer(group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(T, H, R))

The heavy names (Buffer, EventOverlap, topk_idx_t: they need torch and the CUDA extension) load
on first access, so `ep_core.config`, `ep_core.reference` and friends import without them.
"""
from __future__ import annotations

_LAZY = {"Buffer", "EventOverlap", "DispatchHandle", "topk_idx_t", "EPTimeoutError", "EPCapacityError", "ErrorReport"}

__all__ = sorted(_LAZY | {"Config"})


def __getattr__(name):
    if name in _LAZY:
        from . import buffer

        return getattr(buffer, name)
    if name == "Config":
        from .config import Config

        return Config
    raise AttributeError(f"module 'ep_core' has no attribute {name!r}")
