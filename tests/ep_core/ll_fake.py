"""A CPU stand-in for the low-latency half of ep_core's extension and for the Buffer around it:
the host logic of ep_core/low_latency.py (argument checks, the hook order, stable outputs, cached
plans) runs against it, and every launch is recorded instead of run."""
from __future__ import annotations

import dataclasses
import types

import torch

from ep_core import low_latency as ll
from ep_core.peer import Collective


class _Named:
    """An object of named fields, like the extension's plan classes."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeErrorRecord:
    def __init__(self):
        self.info = dict(flag=0, rank=0, kernel=0, phase=0, is_barrier=False, channel=0, peer=0, epoch=0)
        self.device = 0x1000

    def flag(self):
        return self.info["flag"]

    def report(self):
        return types.SimpleNamespace(**self.info)

    def close(self):
        pass


@dataclasses.dataclass
class Launch:
    kind: str        # "dispatch" / "combine"
    phases: int
    stream: int
    prof: int
    plan: object
    tensors: tuple


class FakeLauncher:
    def __init__(self, log, **kw):
        self.log, self.kw = log, kw

    def dispatch(self, plan, x, topk_idx, phases, prof, stream):
        self.log.append(Launch("dispatch", phases, stream, prof, plan, (x, topk_idx)))

    def combine(self, plan, x, topk_idx, topk_weights, out, phases, prof, stream):
        self.log.append(Launch("combine", phases, stream, prof, plan, (x, topk_idx, topk_weights, out)))


class FakeExt:
    """The low-latency names of the extension; plans keep their arguments as attributes."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.cleaned = []

    def ll_limits(self):
        return {"group": ll.GROUP, "threads": 512, "max_warps_per_block": ll.MAX_WARPS_PER_BLOCK,
                "max_blocks": ll.MAX_BLOCKS, "max_tokens": ll.MAX_TOKENS, "max_local_experts": ll.MAX_LOCAL_EXPERTS,
                "max_topk": 16, "max_ranks": 8, "max_hidden": 8192, "kernels": {v: k for k, v in ll.KERNELS.items()},
                "error_protocol": ll.ERROR_PROTOCOL, "send_phase": ll.SEND_PHASE, "recv_phase": ll.RECV_PHASE}

    def ll_clean(self, base, nbytes, stream):
        self.cleaned.append((base, nbytes))

    def ErrorRecord(self):
        return FakeErrorRecord()

    def LLLayout(self, offsets):
        return _Named(offsets=dict(offsets))

    def LLKnobs(self, **kw):
        return _Named(**kw)

    def LLGeometry(self, **kw):
        return _Named(**kw)

    def LLDispatchOutputs(self, **kw):
        return _Named(**kw)

    def LLDispatchPlan(self, **kw):
        return _Named(**kw)

    def LLCombinePlan(self, **kw):
        return _Named(**kw)

    def LLLauncher(self, **kw):
        return FakeLauncher(self.launches, **kw)


class FakeBuild:
    def __init__(self, ext):
        self.ext = ext
        self.profile = False


class FakePeers:
    def __init__(self, world):
        self.local = 0x10000
        self.ptrs = [0x10000 * (r + 1) for r in range(world)]

    def close(self):
        self.ptrs = []


class FakeBuffer:
    """What LowLatency reads of its Buffer."""

    def __init__(self, world=2, rank=0):
        self.ext = FakeExt()
        self.group, self.group_size, self.rank = None, world, rank
        self._ranks = Collective()  # one process: its barriers return at once
        self.device = torch.device("cpu")
        self._device_index = 0
        self.timeout_s = 2.0
        self._session = None
        self._build_obj = FakeBuild(self.ext)
        self.comm_stream = None

    def _session_for(self, profile):
        return None

    def _build(self, profiled):
        return self._build_obj

    def _iteration(self, new):
        return 0

    def _raw_stream(self):
        from ep_core import buffer as B   # looked up per call: the tests replace B.current_raw_stream

        return B.current_raw_stream(self._device_index)


def make_low_latency(world=2, rank=0, num_bytes=None, config=None):
    """A LowLatency over the fakes, sized for (T_max=8, H=256, E=8) unless num_bytes is given."""
    buf = FakeBuffer(world, rank)
    ll.LowLatency._check_limits(buf.ext)
    n = num_bytes if num_bytes is not None else ll.size_hint(8, 256, world, 8)
    obj = ll.LowLatency.__new__(ll.LowLatency)
    obj._init_state(buf, n, config, FakePeers(world), num_sms=132)
    buf._ll = obj
    return obj
