"""Mapping one NVLink buffer per rank into every rank of a process group (CUDA IPC).

Every rank cudaMallocs `num_bytes`, exports an IPC handle, gathers all handles through the
group (`Collective.all_gather_object`) and opens the peers' handles. The result is the list
of base addresses of the same buffer on every rank as seen from this process (its own included),
which the kernels take by value (ep_core/csrc/buffer_map.h: PeerPtrs). No NVLink multicast
objects are used anywhere.
"""
from __future__ import annotations


class Collective:
    """The ranks of one Buffer, as DeepEP takes them: a torch.distributed process group, else an
    mpi4py communicator (`Buffer(group=None, comm=...)`), else (ep_core's addition) one rank alone.
    What ep_core needs of them: rank, size, an all-gather of small objects (the IPC handles) and
    a barrier (before a buffer a peer may still write into is cleaned or unmapped)."""

    def __init__(self, group=None, comm=None):
        self.group, self.comm = group, comm
        if group is not None:
            self.rank, self.size = int(group.rank()), int(group.size())
        elif comm is not None:
            self.rank, self.size = int(comm.Get_rank()), int(comm.Get_size())
        else:
            self.rank, self.size = 0, 1

    def all_gather_object(self, obj) -> list:
        if self.size == 1:
            return [obj]
        if self.group is not None:
            import torch.distributed as dist

            every = [None] * self.size
            dist.all_gather_object(every, obj, group=self.group)
            return every
        return list(self.comm.allgather(obj))

    def barrier(self) -> None:
        if self.size == 1:
            return
        if self.group is not None:
            import torch.distributed as dist

            dist.barrier(group=self.group)
        else:
            self.comm.Barrier()


class PeerMapError(RuntimeError):
    """The ranks of a group disagree about the buffer (size, device) or a handle did not open."""


class PeerBuffers:
    """Collective constructor: every rank of `ranks` (a Collective) must build it with the same num_bytes."""

    def __init__(self, ext, ranks: Collective, num_bytes: int):
        self.ext = ext
        self.rank = ranks.rank
        self.world_size = ranks.size
        self.num_bytes = int(num_bytes)
        self.local = int(ext.alloc_buffer(self.num_bytes))
        self._opened: list[int] = []
        self.ptrs = [0] * self.world_size
        self.ptrs[self.rank] = self.local
        if self.world_size == 1:
            return
        mine = (self.num_bytes, ext.ipc_handle(self.local))
        every = ranks.all_gather_object(mine)
        sizes = {r: n for r, (n, _) in enumerate(every)}
        if len(set(sizes.values())) != 1:
            self.close()
            raise PeerMapError(f"every rank must create its Buffer with the same num_nvl_bytes; got {sizes}")
        try:
            for r, (_, handle) in enumerate(every):
                if r != self.rank:
                    self.ptrs[r] = int(ext.ipc_open(handle))
                    self._opened.append(self.ptrs[r])
        except RuntimeError as e:
            self.close()
            raise PeerMapError(f"rank {self.rank}: could not map a peer's buffer: {e}") from e

    def close(self) -> None:
        for p in self._opened:
            self.ext.ipc_close(p)
        self._opened = []
        if self.local:
            self.ext.free_buffer(self.local)
            self.local = 0
        self.ptrs = []
