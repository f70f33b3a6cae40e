"""ep_core: intranode expert-parallel dispatch/combine kernels with DeepEP's API, instrumented
with epscope's per-warp recorder.

    import ep_core
    buffer = ep_core.Buffer(group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(T, H, R))

The heavy names (Buffer, EventOverlap, topk_idx_t: they need torch) load on first access, so
`ep_core.config`, `ep_core.reference` and friends import without them; without torch they raise
EPUnavailableError saying so. The size hints (`Buffer.get_buffer_size_hint`, or torch-free
`ep_core.config.buffer_size_hint`) need no GPU and no CUDA toolkit; a Buffer needs both, and
raises EPUnavailableError naming what is missing.
"""
from __future__ import annotations

_LAZY = {"Buffer", "EventOverlap", "DispatchHandle", "topk_idx_t", "EPTimeoutError", "EPCapacityError", "ErrorReport",
         "EPUnavailableError"}

__all__ = sorted(_LAZY | {"Config"})


def __getattr__(name):
    if name in _LAZY:
        try:
            from . import buffer
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            from .errors import EPUnavailableError
            raise EPUnavailableError(f"ep_core.{name} needs torch, which is not installed here (GPU machines: "
                                     "pip install torch -e '.[gpu]'; the size hints need no torch: "
                                     "ep_core.config.buffer_size_hint)") from None

        return getattr(buffer, name)
    if name == "Config":
        from .config import Config

        return Config
    raise AttributeError(f"module 'ep_core' has no attribute {name!r}")
