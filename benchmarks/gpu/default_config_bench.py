"""Issue 35: is ep_core's default config slower than the best chunk on one rank, and why?

One rank, DeepEP's test_intranode.py shape (4096 tokens, hidden 7168, top-8 of 256 experts, BF16),
timed the way DeepEP's tests/utils.py `bench` times (a CUDA event pair around each of 50 calls
after 50 warm-up calls and a 256 MB L2 flush; the mean of calls 2..50), in four parts:

  replay       the script's own tuning loop order (chunks 4..32, then the default; combine
               chunks 1..16, then the default), twice: what the script prints
  interleaved  the default against chunks 4 / 22 / 32 (combine 1 / 8 / 16), A B C D A B C D ...
               for several rounds: a systematic difference survives the interleaving, noise does not
  fresh        non-cached dispatch (the chunk acts only there): the default against chunks 4..64
  sms          the default tables at 20..128 SMs, cached dispatch / combine and fresh dispatch

    python benchmarks/gpu/default_config_bench.py --out DIR     (on the GPU machine)
Writes DIR/default_config.json (every sample) and prints a table per part.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

T, H, K, E = 4096, 7168, 8, 256
SCRIPT_SMS = 24


def bench(fn, warmups: int = 50, tests: int = 50) -> float:
    """Mean seconds per call, DeepEP's method: per-call event pairs after warm-up and an L2 flush."""
    torch.cuda.synchronize()
    flush = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")
    for _ in range(warmups):
        fn()
    flush.zero_()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(tests)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.fmean(s.elapsed_time(e) / 1e3 for s, e in ev[1:])


class Setup:
    """The Buffer, inputs, layout and handles of the script's shape on one rank."""

    def __init__(self):
        import ep_core

        self.ep = ep_core
        self.buf = ep_core.Buffer(None, ep_core.Buffer.get_buffer_size_hint(T, H, 1), explicitly_destroy=True)
        g = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn((T, H), generator=g, dtype=torch.float32, device="cuda").to(torch.bfloat16)
        scores = torch.rand((T, E), generator=g, dtype=torch.float32, device="cuda")
        self.idx = torch.topk(scores, K, dim=-1, sorted=False).indices.to(ep_core.topk_idx_t)
        self.w = torch.rand((T, K), generator=g, dtype=torch.float32, device="cuda")
        lay = self.buf.get_dispatch_layout(self.idx, E)
        self.layout = dict(num_tokens_per_rank=lay[0], is_token_in_rank=lay[3], num_tokens_per_expert=lay[2])
        recv, _, _, _, self.handle, _ = self.fresh(self.cfg(8))
        self.recv = recv
        self.bytes = recv.numel() * 2  # the script's NVL bytes (BF16 rows received = rows sent back)

    def cfg(self, chunk: int | None, sms: int = SCRIPT_SMS, kind: str = "dispatch"):
        """Config(sms, chunk, 256) as the script builds it; chunk None: the default table at `sms`."""
        from ep_core import config as C

        if chunk is None:
            return (C.dispatch_config if kind == "dispatch" else C.combine_config)(1, sms)
        return self.ep.Config(sms, chunk, 256)

    def fresh(self, config):
        return self.buf.dispatch(self.x, topk_idx=self.idx, topk_weights=self.w, config=config, **self.layout)

    def op(self, what: str, config):
        if what == "dispatch":
            return lambda: self.buf.dispatch(self.x, handle=self.handle, config=config)
        if what == "combine":
            return lambda: self.buf.combine(self.recv, self.handle, config=config)
        return lambda: self.fresh(config)


def _row(s: Setup, part: str, what: str, label: str, config, rnd: int) -> dict:
    row = {"part": part, "op": what, "config": label, "round": rnd, "num_sms": config.num_sms,
           "chunk": config.num_max_nvl_chunked_send_tokens}
    try:
        t = bench(s.op(what, config))
    except Exception as e:  # noqa: BLE001 (one refused config must not end the run: it is reported)
        return {**row, "error": f"{type(e).__name__}: {e}"}
    return {**row, "us": t * 1e6, "gbps": s.bytes / 1e9 / t}


def replay(s: Setup) -> list[dict]:
    rows = []
    for rnd in range(2):
        for chunk in list(range(4, 33, 2)) + [None]:
            rows.append(_row(s, "replay", "dispatch", str(chunk or "default"), s.cfg(chunk), rnd))
        for chunk in list(range(1, 17)) + [None]:
            rows.append(_row(s, "replay", "combine", str(chunk or "default"),
                             s.cfg(chunk, kind="combine"), rnd))
    return rows


def interleaved(s: Setup, rounds: int = 6) -> list[dict]:
    rows = []
    for rnd in range(rounds):
        for chunk in (None, 4, 22, 32):
            rows.append(_row(s, "interleaved", "dispatch", str(chunk or "default"), s.cfg(chunk), rnd))
        for chunk in (None, 1, 8, 16):
            rows.append(_row(s, "interleaved", "combine", str(chunk or "default"), s.cfg(chunk, kind="combine"), rnd))
    return rows


def fresh(s: Setup, rounds: int = 3) -> list[dict]:
    return [_row(s, "fresh", "fresh", str(chunk or "default"), s.cfg(chunk), rnd)
            for rnd in range(rounds) for chunk in (None, 4, 22, 32, 64)]


def sms(s: Setup, rounds: int = 3) -> list[dict]:
    rows = []
    for rnd in range(rounds):
        for n in (20, 24, 32, 48, 64, 96, 128):
            for what in ("dispatch", "combine", "fresh"):
                rows.append(_row(s, "sms", what, f"sms{n}", s.cfg(None, n, "combine" if what == "combine" else
                                                                  "dispatch"), rnd))
    return rows


def table(rows: list[dict]) -> str:
    """Per (part, op, config): mean, min and max µs over the rounds, and GB/s of the mean."""
    groups: dict = {}
    for r in rows:
        if "error" in r:
            out_err = groups.setdefault(("error",) + (r["part"], r["op"], r["config"]), [])
            out_err.append(r)
            continue
        groups.setdefault((r["part"], r["op"], r["config"]), []).append(r)
    out = ["| part | op | config | rounds | mean µs | min | max | GB/s (mean) |", "|---|---|---|---|---|---|---|---|"]
    for key, rs in groups.items():
        if key[0] == "error":
            out.append(f"| {key[1]} | {key[2]} | {key[3]} | {len(rs)} | {rs[0]['error'][:80]} | | | |")
            continue
        part, op, cfg = key
        us = [r["us"] for r in rs]
        m = statistics.fmean(us)
        gbps = statistics.fmean(r["gbps"] for r in rs)
        out.append(f"| {part} | {op} | {cfg} | {len(rs)} | {m:.1f} | {min(us):.1f} | {max(us):.1f} | {gbps:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="default_config_out")
    ap.add_argument("--parts", default="replay,interleaved,fresh,sms")
    a = ap.parse_args(argv)
    s = Setup()
    parts = {"replay": replay, "interleaved": interleaved, "fresh": fresh, "sms": sms}
    rows = []
    for name in a.parts.split(","):
        got = parts[name](s)
        rows += got
        print(f"## {name}\n{table(got)}\n", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "tokens": T, "hidden": H, "topk": K, "experts": E,
            "ranks": 1, "recv_bytes": s.bytes, "handle_chunk_size": s.handle.chunk_size,
            "handle_num_chunks": s.handle.num_chunks}
    print(f"cached calls' handle: chunk {s.handle.chunk_size} tokens, {s.handle.num_chunks} chunks", flush=True)
    (out / "default_config.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    s.buf.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
