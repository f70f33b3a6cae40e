"""One rank of an `epscope ab` / `epscope tune` side: runs EP rounds on command, inside a source
tree that may be another commit's.

    python -c "<boot>" profiler/workflows/ab_worker.py --rank R --world W --port P --inputs DIR   (cwd = the side's tree)

The parent (profiler.workflows.rounds.WorkerSet) starts one process per rank with the side's tree first on
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

Low-latency side (`epscope tune --ll`): when the inputs file holds {"low_latency": {hidden, topk,
experts, max_tokens, seed, use_fp8}}, the rank builds a low_latency_mode Buffer instead and
answers two more commands (LowLatencySide):
  {"cmd": "ll_round", "round": 3, "warmup": 5, "iters": 40, "tokens": 64,
   "configs": {"ll_dispatch": {LowLatencyConfig fields}, "ll_combine": {...}}}
  -> {"ok": true, ..., "samples": {LL_METRICS: [µs per iteration]}}
  {"cmd": "ll_check", "tokens": 64, "reference": {LowLatencyConfig fields}, "configs": {name: {...}}}
  -> {"ok": true, "differ": {name: what differs from the reference config's results}}
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

REPLY_PREFIX = "@@epscope-round "
METRICS = ("layout", "dispatch", "combine", "op", "host_layout", "host_dispatch", "host_combine")
# a low-latency round's metrics: the kernel names of the tuned table, the pair, the host per call
LL_METRICS = ("ll_dispatch", "ll_combine", "ll_op", "host_ll_dispatch", "host_ll_combine")
# Before each timed op the stream spins this long (torch.cuda._sleep, in SM cycles at the H200's
# 1.98 GHz max clock, measured-facts.md) so the host's enqueue of the op (tens of µs of Python)
# happens while the GPU is busy and not inside the timed span. Equal on every rank. Defined here,
# not imported: this file runs inside another commit's tree, where only ep_core's API and
# profiler.record hold (benchmarks/ep_timing.py takes them from here).
LEAD_US = 300
SM_CLOCK_GHZ = 1.98


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
        self.ll = None
        if "low_latency" in data:
            import ep_core

            self.ep_core = ep_core
            self.ll = LowLatencySide(self, data["low_latency"])
            return
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
        if cmd.get("cmd") in LowLatencySide.COMMANDS:
            if self.ll is None:
                raise ValueError(f"{cmd['cmd']}: this worker was started for the normal kernels")
            return self.ll.run(cmd)
        if self.ll is not None:
            raise ValueError(f"{cmd.get('cmd')}: this worker was started for the low-latency kernels")
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


class LowLatencySide:
    """This rank's low-latency Buffer and inputs per token count (the `epscope tune --ll` rounds).

    Inputs as benchmarks/gpu/ll_bench.py makes them (uniform routing, seeded per rank and made on
    the CPU, so every process builds the same ones); num_max_dispatch_tokens_per_rank = the round's
    token count; combine reads seeded random expert outputs (its time does not depend on values).
    Timing as benchmarks/ep_timing.time_op: the ranks are released together by a one-element
    all-reduce on the stream, the stream then spins LEAD_US so the host enqueues dispatch and
    combine while the GPU is busy; CUDA events around each call then time the device (the
    kernel, including its wait for the peer's data), not the host's enqueue."""

    COMMANDS = ("ll_round", "ll_check")

    def __init__(self, side: Side, spec: dict):
        import ep_core
        from ep_core import low_latency as ll

        self.side, self.ll, self.spec = side, ll, dict(spec)
        torch = side.torch
        size = ep_core.Buffer.get_low_latency_rdma_size_hint(int(spec["max_tokens"]), int(spec["hidden"]), side.world,
                                                             int(spec["experts"]))
        self.buffer = ep_core.Buffer(side.group, num_rdma_bytes=size, low_latency_mode=True)
        self.num_sms = torch.cuda.get_device_properties(side.device).multi_processor_count
        self.go = torch.zeros(1, device=side.device)
        self.inputs: dict = {}
        self.configs: dict = {}
        torch.cuda.synchronize()
        side.dist.barrier(group=side.group)

    def config(self, fields: dict):
        key = tuple(sorted(fields.items()))
        c = self.configs.get(key)
        if c is None:
            c = self.ll.LowLatencyConfig(**fields)
            c.check_geometry(self.side.world, self.num_sms)  # a grid that must stay resident fits this GPU
            self.configs[key] = c
        return c

    def _inputs(self, T: int):
        got = self.inputs.get(T)
        if got is None:
            from ep_core.routing import make_routing

            torch, sp, s = self.side.torch, self.spec, self.side
            seed = int(sp["seed"]) * 1000 + s.rank
            idx, w = make_routing("uniform", T, int(sp["experts"]), int(sp["topk"]), s.world, seed)
            g = torch.Generator().manual_seed(seed)
            x = torch.randn((T, int(sp["hidden"])), generator=g).to(torch.bfloat16)
            gd = torch.Generator(device=s.device).manual_seed(seed + T)
            y = torch.randn((int(sp["experts"]) // s.world, s.world * T, int(sp["hidden"])), generator=gd,
                            device=s.device).to(torch.bfloat16)
            got = self.inputs[T] = (x.to(s.device), idx.to(s.device).to(s.ep_core.topk_idx_t), w.to(s.device), y)
        return got

    def _pair(self, T: int, dconf, cconf):
        x, idx, w, y = self._inputs(T)
        b = self.buffer
        recv, count, handle, _, _ = b.low_latency_dispatch(x, idx, T, int(self.spec["experts"]),
                                                           use_fp8=bool(self.spec["use_fp8"]), config=dconf)
        out, _, _ = b.low_latency_combine(y, idx, w, handle, config=cconf)
        return recv, count, handle, out

    def run(self, cmd: dict) -> dict:
        return self.round(cmd) if cmd["cmd"] == "ll_round" else self.check(cmd)

    def round(self, cmd: dict) -> dict:
        torch, dist, s = self.side.torch, self.side.dist, self.side
        T = int(cmd["tokens"])
        dconf, cconf = (self.config(cmd["configs"][k]) for k in ("ll_dispatch", "ll_combine"))
        x, idx, w, y = self._inputs(T)
        E, fp8, b = int(self.spec["experts"]), bool(self.spec["use_fp8"]), self.buffer
        lead = int(LEAD_US * SM_CLOCK_GHZ * 1e3)
        for _ in range(int(cmd["warmup"])):
            self._pair(T, dconf, cconf)
        torch.cuda.synchronize()
        dist.barrier(group=s.group)
        evs, host = [], {"host_ll_dispatch": [], "host_ll_combine": []}
        for _ in range(int(cmd["iters"])):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            dist.all_reduce(self.go, group=s.group)   # on the stream: both ranks start together
            torch.cuda._sleep(lead)                    # the host enqueues the pair while the GPU spins
            ev[0].record()
            h0 = time.perf_counter_ns()
            handle = b.low_latency_dispatch(x, idx, T, E, use_fp8=fp8, config=dconf)[2]
            h1 = time.perf_counter_ns()
            ev[1].record()
            b.low_latency_combine(y, idx, w, handle, config=cconf)
            h2 = time.perf_counter_ns()
            ev[2].record()
            evs.append(ev)
            host["host_ll_dispatch"].append((h1 - h0) / 1e3)
            host["host_ll_combine"].append((h2 - h1) / 1e3)
        torch.cuda.synchronize()
        self.buffer._ll.synchronize()  # a device error of the round raises here, named
        samples = {"ll_dispatch": [e[0].elapsed_time(e[1]) * 1e3 for e in evs],
                   "ll_combine": [e[1].elapsed_time(e[2]) * 1e3 for e in evs],
                   "ll_op": [e[0].elapsed_time(e[2]) * 1e3 for e in evs], **host}
        return {"ok": True, "rank": s.rank, "round": cmd.get("round"), "samples": samples, "run_dir": None}

    def _results(self, T: int, conf) -> dict:
        """One dispatch + combine's results that every config must give bit for bit (the valid rows
        only: rows past an expert's count are not written)."""
        torch = self.side.torch
        recv, count, handle, out = self._pair(T, conf, conf)
        torch.cuda.synchronize()
        rx, scales = recv if isinstance(recv, tuple) else (recv, None)
        valid = torch.arange(rx.size(1), device=rx.device)[None, :] < count[:, None]
        got = {"recv_count": count.clone(), "recv_x": rx.view(torch.uint8)[valid].clone() if rx.element_size() == 1
               else rx[valid].clone(), "recv_src_info": handle.recv_src_info[valid].clone(),
               "recv_layout_range": handle.recv_layout_range.clone(), "combined": out.clone()}
        if scales is not None:
            got["recv_scales"] = scales[valid].clone()
        return got

    def check(self, cmd: dict) -> dict:
        T = int(cmd["tokens"])
        want = self._results(T, self.config(cmd["reference"]))
        differ = {}
        for name, fields in cmd["configs"].items():
            got = self._results(T, self.config(fields))
            bad = [k for k in want if want[k].shape != got[k].shape or not self.side.torch.equal(want[k], got[k])]
            if bad:
                differ[name] = f"rank {self.side.rank}, {T} tokens: {', '.join(bad)} differ"
        self.buffer._ll.synchronize()
        return {"ok": True, "rank": self.side.rank, "differ": differ}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one rank of an epscope ab / tune side (started by profiler.workflows.rounds)")
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
