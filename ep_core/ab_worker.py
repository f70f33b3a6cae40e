"""One rank of an `epscope ab` / `epscope tune` side: runs EP rounds on command, inside a source
tree that may be another commit's.

    python -c "<boot>" ep_core/ab_worker.py --rank R --world W --port P --inputs DIR   (cwd = the side's tree)

The parent (ep_core.rounds.WorkerSet) starts one process per rank with the side's tree first on
sys.path and its own build cache (EPSCOPE_BUILD_DIR), so two builds of one extension never share
a process. This file is the running epscope's; everything it imports comes from the side's tree,
and only through the contracts that hold across commits: ep_core's DeepEP-compatible API
(Buffer, Config, set_num_sms, profile=) and profiler.record.session.Session. The inputs are
tensors the parent wrote once (DIR/rank<R>.pt), so both sides move the same rows.

Protocol: one JSON object per line. The parent writes commands on stdin; the worker answers each
with one line on stdout that starts with REPLY_PREFIX (anything else on stdout is build or
library output, which the parent logs).
  {"cmd": "round", "round": 3, "warmup": 5, "iters": 20, "num_sms": 24 | null,
   "configs": {"dispatch": {Config fields}, "combine": {...}} | null,      (null: the tree's default)
   "profile": null | {"out": DIR, "name": NAME, "description": ..., "workload": {...}, "capacity": 512}}
  -> {"ok": true, "rank": 0, "round": 3, "samples": {metric: [µs per iteration]}, "run_dir": str | null}
  {"cmd": "quit"}
Metrics: `layout`, `dispatch`, `combine`, `op` (GPU time of each call and of the whole op, CUDA
events on the calling stream, which the Buffer orders after its kernels) and `host_layout`,
`host_dispatch`, `host_combine` (perf_counter around each call). The ranks line up before every
iteration (a process-group barrier, not timed), so one rank's host does not inflate the other's
kernel time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

REPLY_PREFIX = "@@epscope-round "
METRICS = ("layout", "dispatch", "combine", "op", "host_layout", "host_dispatch", "host_combine")


def reply(obj: dict) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Side:
    """This rank's Buffer and inputs; `round()` runs one command."""

    def __init__(self, rank: int, world: int, port: int, inputs: str, preload_profile: bool = True):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, world
        torch.cuda.set_device(rank)
        self.device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=self.device)
        self.group = dist.group.WORLD
        data = torch.load(f"{inputs}/rank{rank}.pt", map_location="cpu")
        self.problem = data["problem"]
        self.x = data["x"].to(self.device)
        if data.get("x_scales") is not None:
            self.x = (self.x, data["x_scales"].to(self.device))
        import ep_core

        self.ep_core = ep_core
        self.topk_idx = data["topk_idx"].to(self.device).to(ep_core.topk_idx_t)
        self.topk_weights = data["topk_weights"].to(self.device)
        p = self.problem
        size = ep_core.Buffer.get_buffer_size_hint(p["tokens"], p["hidden"], world, p["topk"])
        self.buffer = ep_core.Buffer(self.group, num_nvl_bytes=size)
        if preload_profile:
            # build the instrumented variant and the recorder's clock extension now, not inside the
            # first profiled round (trees that lack these loaders build them on first use instead)
            try:
                from ep_core import _ext

                _ext.load(profile=True)
                from profiler.record.build import load_record_extension

                load_record_extension(profile=False)
            except ImportError:
                pass
        torch.cuda.synchronize()
        dist.barrier(group=self.group)

    def _configs(self, cmd: dict):
        if cmd.get("num_sms"):
            self.ep_core.Buffer.set_num_sms(int(cmd["num_sms"]))
        c = cmd.get("configs")
        if not c:
            return None, None
        return self.ep_core.Config(**c["dispatch"]), self.ep_core.Config(**c["combine"])

    def _iteration(self, dconf, cconf, profile, times: dict) -> None:
        torch, b = self.torch, self.buffer
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        h = [0] * 4
        ev[0].record()
        h[0] = time.perf_counter_ns()
        per_rank, _, per_expert, in_rank, _ = b.get_dispatch_layout(self.topk_idx, self.problem["experts"],
                                                                    profile=profile)
        h[1] = time.perf_counter_ns()
        ev[1].record()
        recv, _, recv_w, _, handle, _ = b.dispatch(
            self.x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            topk_idx=self.topk_idx, topk_weights=self.topk_weights, config=dconf, profile=profile)
        h[2] = time.perf_counter_ns()
        ev[2].record()
        if isinstance(recv, tuple):  # FP8 rows: combine takes BF16 (the experts' work is out of scope)
            from ep_core.reference import per_token_cast_back

            recv = per_token_cast_back(*recv)
        b.combine(recv, handle, topk_weights=recv_w, config=cconf, profile=profile)
        h3 = time.perf_counter_ns()
        ev[3].record()
        times.setdefault("events", []).append(ev)
        for name, (a, z) in (("host_layout", (h[0], h[1])), ("host_dispatch", (h[1], h[2])),
                             ("host_combine", (h[2], h3))):
            times.setdefault(name, []).append((z - a) / 1e3)

    def round(self, cmd: dict) -> dict:
        torch, dist = self.torch, self.dist
        dconf, cconf = self._configs(cmd)
        for _ in range(int(cmd["warmup"])):
            self._iteration(dconf, cconf, None, {})
        torch.cuda.synchronize()
        times: dict = {}
        prof = cmd.get("profile")
        run_dir = None
        if prof:
            from profiler.record.session import Session

            dist.barrier(group=self.group)
            with Session(prof["out"], name=prof["name"], description=prof["description"], rank=self.rank,
                         world_size=self.world, group=self.group, capacity=int(prof.get("capacity", 512)),
                         workload=prof["workload"], config=cmd.get("configs") or {}) as s:
                with self.buffer.profile(s):
                    for it in range(int(cmd["iters"])):
                        dist.barrier(group=self.group)
                        self.buffer.profile_iteration = it
                        self._iteration(dconf, cconf, True, times)
                    self.buffer.synchronize()
            run_dir = f"{prof['out']}/{prof['name']}"
        else:
            for _ in range(int(cmd["iters"])):
                dist.barrier(group=self.group)
                self._iteration(dconf, cconf, None, times)
        torch.cuda.synchronize()
        samples = {m: [] for m in METRICS}
        for ev in times.pop("events", []):
            samples["layout"].append(ev[0].elapsed_time(ev[1]) * 1e3)
            samples["dispatch"].append(ev[1].elapsed_time(ev[2]) * 1e3)
            samples["combine"].append(ev[2].elapsed_time(ev[3]) * 1e3)
            samples["op"].append(ev[0].elapsed_time(ev[3]) * 1e3)
        for name, v in times.items():
            samples[name] = v
        return {"ok": True, "rank": self.rank, "round": cmd["round"], "samples": samples, "run_dir": run_dir}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one rank of an epscope ab / tune side (started by ep_core.rounds)")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--no-profile", action="store_true", help="no profiled rounds: skip building the profiler")
    a = ap.parse_args(argv)
    try:
        side = Side(a.rank, a.world, a.port, a.inputs, preload_profile=not a.no_profile)
        import torch

        reply({"ok": True, "ready": True, "rank": a.rank, "gpu": torch.cuda.get_device_name(),
               "ep_core": side.ep_core.__file__})
    except Exception as e:  # noqa: BLE001 (the parent reports it with this side's tree named)
        reply({"ok": False, "rank": a.rank, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        try:
            reply(side.round(cmd))
        except Exception as e:  # noqa: BLE001
            reply({"ok": False, "rank": a.rank, "round": cmd.get("round"), "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()})
            return 1
    try:
        side.dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (exiting anyway)
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
