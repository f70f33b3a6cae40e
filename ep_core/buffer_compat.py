"""The rest of DeepEP V1's `Buffer` API (deep_ep/buffer.py at 567632d), so that a DeepEP program
runs with only its import changed: nothing it passes is a TypeError. Each keyword and method is
honoured, a documented no-op, or a clear NotImplementedError where it cannot apply (internode).

Constructor keywords (ep_core/buffer.py `Buffer.__init__`):
  group, num_nvl_bytes, explicitly_destroy   honoured (num_nvl_bytes sizes ep_core's buffer,
                                             which holds one whole op: Buffer.get_buffer_size_hint)
  num_rdma_bytes, low_latency_mode           honoured in low-latency mode (the low-latency buffer,
                                             NVLink-mapped); num_rdma_bytes > 0 without it is
                                             internode: NotImplementedError
  allow_nvlink_for_low_latency_mode          True honoured; False needs RDMA: NotImplementedError
  comm                                       honoured: an mpi4py communicator in place of `group`
                                             (ep_core.peer.Collective: all-gather and barrier)
  num_qps_per_rank                           no-op: RDMA queue pairs; ep_core moves data over NVLink
  allow_mnnvl                                no-op: multi-node NVLink detection; ep_core is one node
  use_fabric                                 no-op: ep_core maps every buffer with CUDA IPC
  enable_shrink                              accepted; the mask methods below need it (DeepEP's
                                             rule). ep_core never masks a rank: a rank that stops
                                             answering raises EPTimeoutError naming it instead
ep_core's keyword-only additions: timeout_s (every device wait is bounded) and a test hook.

Attributes as DeepEP sets them: rank, group_size, group (the communicator when no group),
num_nvl_bytes, num_rdma_bytes, low_latency_mode, explicitly_destroy, enable_shrink. DeepEP's
`runtime` (its C++ object) has no counterpart.
"""
from __future__ import annotations

import ctypes

import torch


def _raw_bytes(ptr: int, num_bytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over `num_bytes` at device address `ptr`, sharing the memory (no copy).
    torch has no from_blob in Python: CUDA memory comes in through __cuda_array_interface__; host
    memory (the CPU tests' fake Buffer) through a ctypes array."""
    if device.type == "cuda":
        class _Blob:
            __cuda_array_interface__ = {"shape": (num_bytes,), "typestr": "|u1", "data": (ptr, False),
                                        "version": 3, "strides": None}

        return torch.as_tensor(_Blob(), dtype=torch.uint8, device=device)
    return torch.frombuffer((ctypes.c_uint8 * num_bytes).from_address(ptr), dtype=torch.uint8)


class BufferCompat:
    """DeepEP's methods that the other parts of ep_core.Buffer do not hold."""

    def get_comm_stream(self) -> torch.cuda.Stream:
        """The stream the Buffer's non-direct calls run on (ep_core/buffer.py, "Streams")."""
        return self.comm_stream

    def get_local_buffer_tensor(self, dtype: torch.dtype, size: torch.Size | None = None, offset: int = 0,
                                use_rdma_buffer: bool = False) -> torch.Tensor:
        """This rank's raw buffer as a `dtype` tensor from byte `offset` on (DeepEP counts the offset
        in bytes), cut to `size` elements when given: the normal-path buffer (num_nvl_bytes; its
        first bytes hold the signals and layout slots), or with use_rdma_buffer=True the
        low-latency buffer (num_rdma_bytes). The tensor shares the memory and does not own it:
        it is invalid after destroy(), as in DeepEP."""
        if use_rdma_buffer:
            ll = getattr(self, "_ll", None)
            if ll is None:
                raise NotImplementedError("ep_core: use_rdma_buffer=True is the low-latency buffer here "
                                          "(Buffer(..., low_latency_mode=True)); internode RDMA buffers are not "
                                          "implemented")
            ptr, num_bytes = ll.peers.local, ll.num_bytes
        else:
            ptr, num_bytes = self.peers.local, self.num_nvl_bytes
        elem = torch.empty((0,), dtype=dtype, device="meta").element_size()
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= num_bytes or offset % elem:
            raise ValueError(f"ep_core: offset must be a byte offset in 0..{num_bytes} and a multiple of "
                             f"{elem} ({dtype}), got {offset!r}")
        n = (num_bytes - offset) // elem
        tensor = _raw_bytes(ptr + offset, n * elem, self.device).view(dtype)
        if size is None:
            return tensor
        size = torch.Size(size)
        if size.numel() > n:
            raise ValueError(f"ep_core: size {tuple(size)} ({size.numel()} elements) exceeds the buffer's {n} "
                             f"{dtype} elements after offset {offset}")
        return tensor[: size.numel()].view(size)

    # -- shrink mode (DeepEP: masking failed ranks in the low-latency kernels) ----------------------
    def _check_shrink(self, what: str) -> None:
        self._low_latency()  # a low_latency_mode Buffer, or a RuntimeError saying so
        if not self.enable_shrink:
            raise RuntimeError(f"ep_core: {what} needs Buffer(..., enable_shrink=True) (as in DeepEP)")

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Unmasking is honoured (no rank is ever masked here); masking is not implemented."""
        self._check_shrink("low_latency_update_mask_buffer")
        if isinstance(rank_to_mask, bool) or not isinstance(rank_to_mask, int) or \
                not 0 <= rank_to_mask < self.group_size:
            raise ValueError(f"ep_core: rank_to_mask must be in 0..{self.group_size - 1}, got {rank_to_mask!r}")
        if mask:
            raise NotImplementedError("ep_core: masking a rank is not implemented: the low-latency kernels send to "
                                      "and wait for every rank; a rank that stops answering raises EPTimeoutError "
                                      "naming it")

    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor) -> None:
        """Writes every rank's mask status (1 = masked) into `mask_status`, an int32 [num_ranks]
        tensor, on the current stream: all 0, since ep_core never masks a rank."""
        self._check_shrink("low_latency_query_mask_buffer")
        if not isinstance(mask_status, torch.Tensor) or mask_status.dtype != torch.int32 or \
                mask_status.numel() != self.group_size:
            raise ValueError(f"ep_core: mask_status must be an int32 tensor of {self.group_size} elements, got "
                             f"{getattr(mask_status, 'dtype', type(mask_status).__name__)} "
                             f"{tuple(getattr(mask_status, 'shape', ()))}")
        mask_status.zero_()

    def low_latency_clean_mask_buffer(self) -> None:
        """Unmasks every rank: nothing to do, no rank is ever masked here."""
        self._check_shrink("low_latency_clean_mask_buffer")

    # -- internode (DeepEP's signatures; not implemented) -------------------------------------------
    def internode_dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                           is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                           expert_alignment: int = 1, num_worst_tokens: int = 0, config=None, previous_event=None,
                           async_finish: bool = False, allocate_on_comm_stream: bool = False):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")

    def internode_combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                          async_finish: bool = False, allocate_on_comm_stream: bool = False):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")
