"""Streams and events of ep_core's calls, as DeepEP names them: `EventOverlap`, the caller's raw
stream, the top-k index dtype, the GPU's name (the tuned table's key). Torch only; nothing here
knows a Buffer, so the normal and the low-latency paths share it without importing each other.
"""
from __future__ import annotations

import torch

topk_idx_t = torch.int64  # DeepEP's top-k index dtype; callers convert with .to(topk_idx_t)


class EventOverlap:
    """A CUDA event recorded on the comm stream, plus the tensors that must live until it fires."""

    def __init__(self, event: torch.cuda.Event | None = None, extra_tensors: tuple | None = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.current_stream_wait()
        return False


# The caller's current CUDA stream as a raw handle: torch's own C entry point (what Triton and
# Inductor use) costs a fraction of a µs, torch.cuda.current_stream() a few µs. Tests on the CPU
# replace this function.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_raw_stream(device_index: int) -> int:
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _device_name(device) -> str:
    """The GPU's name for the tuned table; a CPU device (the CPU tests' fake Buffer) is named by type."""
    if device is not None and device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


# What a synchronous call returns as its event (DeepEP returns an EventOverlap without an event).
_NO_EVENT = EventOverlap(None)
