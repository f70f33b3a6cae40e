"""ep_core's typed errors and how a Buffer reads its device error record (the host-mapped
ErrorInfo the kernels fill: ep_core/csrc/). No torch: the names import anywhere.

A kernel that fails (a bounded wait expired, rows that do not fit) fills the record once and
returns; the host turns it into `EPTimeoutError` / `EPCapacityError` at the next point it looks
(ep_core/buffer.py's module docstring lists them), saving the partial profile first.
"""
from __future__ import annotations

from dataclasses import dataclass


_KERNELS = {1: "layout", 2: "notify", 3: "dispatch", 4: "combine", 5: "barrier", 6: "hook_signal"}


class EPTimeoutError(TimeoutError):
    """A bounded device wait expired; the message names rank, kernel, phase, chunk and peer."""


class EPCapacityError(ValueError):
    """A call needs more buffer (or exceeds a limit) than this Buffer was created for."""


class EPUnavailableError(RuntimeError):
    """What ep_core's kernels need is missing on this machine (torch, its CUDA build, the CUDA
    toolkit, ninja, a GPU); the message names it and how to get it. The size hints need none of
    them (ep_core.config.buffer_size_hint)."""


def _registry():
    from ep_core.generated import ep_intranode_phases as P

    return P


def _phase_name(phase: int, is_barrier: bool) -> str:
    try:
        P = _registry()
        names = P.BARRIERS if is_barrier else P.PHASES
        return names.get(phase, f"id {phase}")
    except (ImportError, AttributeError):
        return f"{'barrier' if is_barrier else 'phase'} id {phase}"


@dataclass(frozen=True)
class ErrorReport:
    """The first device failure of a rank's Buffer (the host-mapped ErrorInfo), named fields.
    `kind`: 'timeout' (a bounded wait expired), 'overflow' (more rows than recv_x holds) or
    'capacity' (the op does not fit the buffer); `phase` is a phase name, or a barrier name when
    `is_barrier`; `peer` is the rank waited on (or written to)."""

    kind: str
    rank: int
    kernel: str
    phase: str
    is_barrier: bool
    chunk: int
    peer: int
    epoch: int


_ERROR_KINDS = {1: "timeout", 2: "capacity", 3: "overflow", 4: "staged_copy", 5: "launch_plan"}



def save_partial_profile(session, msg: str) -> str:
    """Save the profile recorded so far as a timed-out run (once), so a kernel that gave up leaves
    its trace; returns `msg`, with why there is no trace when saving failed (the kernel error
    matters more than the save's)."""
    if session is not None and not getattr(session, "_saved", False):
        try:
            session.note("KernelTimeout", msg)
            session.save(status="timeout", error=msg)
        except Exception as e:
            msg += f" (saving the partial profile failed: {type(e).__name__}: {e})"
    return msg

class BufferErrors:
    """How ep_core.Buffer turns its host-mapped error record into a message and a typed error."""

    def error_report(self) -> ErrorReport | None:
        """This rank's first device failure so far (a host-mapped read, no sync), or None."""
        e = self._err.report()
        if e.flag <= 0:
            return None
        return ErrorReport(_ERROR_KINDS.get(e.flag, f"flag {e.flag}"), e.rank,
                           _KERNELS.get(e.kernel, f"kernel {e.kernel}"), _phase_name(e.phase, bool(e.is_barrier)),
                           bool(e.is_barrier), e.channel, e.peer, e.epoch)

    def _device_error(self) -> str | None:
        e = self._err.report()
        if e.flag <= 0:
            return None
        kname = _KERNELS.get(e.kernel, f"kernel {e.kernel}")
        what = _phase_name(e.phase, bool(e.is_barrier))
        if e.flag == 1:
            where = (f"barrier {what} waiting for rank {e.peer}" if e.is_barrier
                     else f"phase {what}, chunk {e.channel}, waiting for rank {e.peer}")
            return (f"ep_core {kname} timed out on rank {e.rank} after {self.timeout_s:g} s: {where} "
                    f"(op {e.epoch}); rank {e.peer} never signalled (it hung, died, or skipped this op)")
        if e.flag in (4, 5):  # the bulk-copy path (Config.path="tma", ep_core/csrc/tma.cuh)
            why = ("a staged bulk copy did not land in shared memory within the bound" if e.flag == 4 else
                   "the launch plan does not match the kernel (buffer count or shared memory)")
            return f"ep_core {kname} on rank {e.rank}: {why} (phase {what}, unit {e.channel}); an ep_core bug, please report"
        if e.flag == 3:
            return (f"ep_core {kname} on rank {e.rank}: more rows arrive than recv_x holds (phase {what}, chunk "
                    f"{e.channel}, from rank {e.peer}): num_worst_tokens is smaller than the rows this rank receives")
        return (f"ep_core {kname} on rank {e.rank}: the rows of this op do not fit the buffer "
                f"(phase {what}, chunk {e.channel}, peer {e.peer}); create the Buffer with a larger num_nvl_bytes "
                f"(Buffer.get_buffer_size_hint)")

    def _raise_device_error(self, session=None) -> None:
        msg = self._device_error()
        if msg is None:
            return
        self._broken = msg
        msg = save_partial_profile(session if session is not None else self._session, msg)
        raise (EPTimeoutError if self._err.flag() == 1 else EPCapacityError)(msg)
