"""Run a function on R ranks, one process per rank, under torch.distributed (no torchrun).

`run_ranks(fn, world_size, *args)` spawns R processes (torch.multiprocessing, start method
spawn), gives each a process group on a free local port (NCCL with one GPU per rank, or gloo on
the CPU for tests of the harness itself), calls `fn(ctx, *args)` and returns the list of the
ranks' return values. Failures come back whole: the first child exception is raised in the
parent with the child's traceback (RankFailed), and a run that outlives `timeout_s` is killed
and raises RankTimeout naming the ranks still running.

No NVLink multicast anywhere (measured-facts.md: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set on the lent machines; we
set them again for the children so a run elsewhere behaves the same).
"""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankFailed(RuntimeError):
    """A rank raised; the message carries its traceback."""

    def __init__(self, rank: int, child_traceback: str):
        self.rank = rank
        self.child_traceback = child_traceback
        super().__init__(f"rank {rank} failed:\n{child_traceback}")


class RankTimeout(TimeoutError):
    """The ranks did not finish within the timeout (they were killed)."""

    def __init__(self, timeout_s: float, running: list[int]):
        self.running = running
        super().__init__(f"ranks {running} still running after {timeout_s:.0f} s; killed "
                         f"(a hang in a collective or a kernel?)")


@dataclass
class RankContext:
    """What `fn` gets: its rank, the world size, the process group and its torch device."""

    rank: int
    world_size: int
    group: Any
    device: Any
    backend: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank: int, world_size: int, backend: str, port: int, result_dir: str, fn: Callable, args: tuple,
           env: dict):
    import torch
    import torch.distributed as dist

    os.environ.update(env)
    # what torchrun would set, for code that reads it (the group itself is made from init_method)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)})
    out = os.path.join(result_dir, f"rank{rank}.pkl")
    initialised = False
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, **kwargs)
        initialised = True
        payload = ("ok", fn(RankContext(rank, world_size, dist.group.WORLD, device, backend), *args))
    except BaseException as e:  # noqa: BLE001 (every failure goes back to the parent)
        payload = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    # The result is on disk before the group goes away: a failing rank's peers then fail in
    # their collectives, and the parent must see the cause first (earliest file wins).
    with open(out + ".tmp", "wb") as f:
        try:
            pickle.dump(payload, f)
        except Exception as e:  # an unpicklable return value is the caller's bug: say so
            f.seek(0)
            f.truncate()
            payload = ("error", f"rank {rank} returned an unpicklable value: {e}")
            pickle.dump(payload, f)
    os.replace(out + ".tmp", out)
    if payload[0] == "error":
        # no final barrier or destroy: peers may be gone; a nonzero exit tells the parent at once
        os._exit(1)
    if initialised:
        dist.destroy_process_group()


def run_ranks(fn: Callable, world_size: int, *args, backend: str = "nccl", timeout_s: float = 600.0,
              env: dict | None = None, grace_s: float = 5.0) -> list:
    """Run `fn(ctx, *args)` on `world_size` ranks; return the ranks' return values in rank order.

    `fn` must be importable by name (a module-level function) because children are spawned.
    `env` adds environment variables in the children (e.g. a test hook). After a rank fails, the
    others get `grace_s` to finish before they are stopped (they may wait on the failed one)."""
    import torch
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend == "nccl":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world_size:
            raise RuntimeError(f"{world_size} ranks need {world_size} CUDA GPUs, this machine has {have}")
    child_env = dict(NO_MULTICAST_ENV)
    child_env.update(env or {})
    result_dir = tempfile.mkdtemp(prefix="epscope-ranks-")
    try:
        ctx = mp.start_processes(_child, args=(world_size, backend, free_port(), result_dir, fn, args, child_env),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        first_error = None
        seen: set[int] = set()
        while True:
            for r in range(world_size):
                path = os.path.join(result_dir, f"rank{r}.pkl")
                if first_error is None and r not in seen and os.path.exists(path):
                    seen.add(r)
                    with open(path, "rb") as f:
                        status, value = pickle.load(f)
                    if status == "error":
                        first_error = RankFailed(r, value)
            alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
            if not alive:
                break
            if first_error is not None:
                # the other ranks may wait forever on the failed one: give them a moment, then stop them
                _stop(ctx.processes, grace_s=grace_s)
                break
            if time.monotonic() > deadline:
                _stop(ctx.processes, grace_s=2.0)
                raise RankTimeout(timeout_s, alive)
            time.sleep(0.05)
        if first_error is not None:
            raise _root_cause(result_dir, world_size, first_error)
        results = []
        for r in range(world_size):
            path = os.path.join(result_dir, f"rank{r}.pkl")
            if not os.path.exists(path):
                code = ctx.processes[r].exitcode
                raise RankFailed(r, f"process exited with code {code} without a result (killed or crashed)")
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                raise RankFailed(r, value)
            results.append(value)
        return results
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)


def _root_cause(result_dir: str, world_size: int, fallback: RankFailed) -> RankFailed:
    """The earliest-written error: when one rank raises, its peers then fail in their collectives
    (connection closed); the first failure is the cause, the others are consequences."""
    errors = []
    for r in range(world_size):
        path = os.path.join(result_dir, f"rank{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                errors.append((os.stat(path).st_mtime_ns, r, value))
    if not errors:
        return fallback
    errors.sort()
    _, rank, tb = errors[0]
    if len(errors) > 1:
        tb += "\n(then also failed: " + ", ".join(f"rank {r}" for _, r, _ in errors[1:]) + ")"
    return RankFailed(rank, tb)


def _stop(processes, grace_s: float) -> None:
    end = time.monotonic() + grace_s
    for p in processes:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
