"""`epscope calibrate`: measure this GPU's clocks and the recorder's cost, and write the
calibration file (profiler.decode.calibration) that alignment and run manifests use.

    epscope calibrate [--out PATH] [--kernel-ms 10]

Measures, on the current GPU (and with two GPUs of one host, the link between GPU 0 and GPU 1:
a flag's round trip and SM against copy-engine copies per direction, profiler/record/calibrate_link.py;
skipped with the reason on one GPU or with --no-link):
  * the %globaltimer step: warps spin until the timer changes (the self-test's timer probe);
  * the cost of one clock64 read and one %globaltimer read: n back-to-back reads on one warp
    between two clock64 reads, the n = 0 loop subtracted;
  * the cost of one record of each design (the recorder bench's design table: record_parts) and
    of the record as built (record_cost with recording on, minus the compiled-out loop), on the
    recording warp of a 1x1 and a 132x4 grid;
  * per SM, clock64 against the globaltimer over a `kernel_ms` kernel (an anchor every
    kernel_ms / 100): rate, offset, and how far the decoder's two-anchor conversion is from each
    intermediate anchor (profiler.decode.calibration.fit_sm_clocks).
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np

from ..decode.calibration import Calibration, default_path, fit_sm_clocks
from .build import load_record_extension
from .selftest import TIMEOUT_CYCLES

# record_parts designs (profiler/csrc/selftest.cuh, RecordPart): what each record design costs
DESIGNS = {1: "format 1: bound predicate, globaltimer + clock64 + SEL", 2: "bound predicate, clock64",
           3: "format 2, streaming store (st.global.cs)", 4: "format 2 (16-byte record)",
           5: "all lanes, one slot, no predicate, clock64", 6: "format 2, st.global.L1::no_allocate",
           7: "lane-0 clamped 16-byte store only", 8: "format-2 anchor record (clock64, globaltimer, clock64, store)",
           9: "lane-0 clamped 8-byte store only", 10: "format 3 (8-byte record, saturated 16-bit payload)",
           11: "format 3 with a 32-bit payload (record + PAYLOAD slot)"}
GRIDS = ((1, 1), (132, 4))
NOMINAL_GHZ = 1.98  # only sizes the SM-clock kernel's spin (measured-facts.md: H200 max SM clock)


def _median_launch(fn, launches: int = 7) -> float:
    import torch

    meds = []
    for _ in range(launches):
        out = fn()
        torch.cuda.synchronize()
        meds.append(float(np.median(out.cpu().numpy())))
    return float(np.median(meds))


def selftest_buffer(grid: int, warps: int, capacity: int):
    """A zeroed, stamped selftest-family profile buffer on the current GPU."""
    import torch

    from ..generated import selftest_phases as P
    from .session import buffer_bytes, make_header

    buf = torch.zeros(buffer_bytes(grid * warps, capacity), dtype=torch.uint8, device="cuda")
    hdr = make_header(registry_hash=P.REGISTRY_HASH, num_regions=grid * warps, capacity=capacity, rank=0,
                      launch_id=0, warps_per_block=warps, hires=True)
    buf[: hdr.size].copy_(torch.from_numpy(hdr.copy()))
    return buf


def timer_step(prof) -> dict:
    import torch

    grid, warps, samples = 132, 4, 512
    stats, err = prof.timer_probe(None, grid, warps, samples, TIMEOUT_CYCLES)
    torch.cuda.synchronize()
    if int(err.item()):
        raise RuntimeError("timer probe: %globaltimer did not advance")
    st = stats.cpu().numpy()
    return {"step_ns": float(st[:, 0].min()), "mean_step_ns": float(st[:, 2].sum() / st[:, 3].sum())}


def read_cycles(prof, n: int = 4096) -> dict:
    out = {}
    for timer, name in ((0, "clock64"), (1, "globaltimer")):
        base = _median_launch(lambda: prof.timer_read_cost(timer, 1, 0))
        out[name] = (_median_launch(lambda: prof.timer_read_cost(timer, 1, n)) - base) / n
    return out


def record_cycles(prof, noprof, n: int = 4096) -> dict:
    """grid -> {design: cycles per record on the recording warp (median over warps, then launches)}."""
    out = {}
    for grid, warps in GRIDS:
        row = {}
        base = _median_launch(lambda: prof.record_parts(0, grid, warps, n, n, False))
        for part, what in DESIGNS.items():
            row[what] = round((_median_launch(lambda: prof.record_parts(part, grid, warps, n, n, False)) - base) / n, 2)
        buf = selftest_buffer(grid, warps, n)
        out_loop = _median_launch(lambda: noprof.record_cost(None, grid, warps, n))
        row["as built: format 3 (record_cost, recording on)"] = round(
            (_median_launch(lambda: prof.record_cost(buf, grid, warps, n)) - out_loop) / n, 2)
        row["as built: format 3 (record_cost, recording off at run time)"] = round(
            (_median_launch(lambda: prof.record_cost(None, grid, warps, n)) - out_loop) / n, 2)
        out[f"{grid}x{warps}"] = row
    return out


def sm_clock_samples(prof, kernel_ms: float, samples: int = 101) -> np.ndarray:
    import torch

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    interval = int(kernel_ms * 1e6 * NOMINAL_GHZ / (samples - 1))
    out = prof.sm_clock_samples(sms, samples, interval)
    torch.cuda.synchronize()
    return out.cpu().numpy()


def measure(kernel_ms: float = 10.0, designs: bool = True, samples_out: Path | None = None) -> Calibration:
    import torch

    from .session import git_info

    prof = load_record_extension(profile=True)
    noprof = load_record_extension(profile=False)
    step = timer_step(prof)
    reads = read_cycles(prof)
    samples = sm_clock_samples(prof, kernel_ms)
    if samples_out is not None:   # the raw anchors, for a second look on any machine
        np.save(samples_out, samples)
    fit = fit_sm_clocks(samples)
    return Calibration(gpu=torch.cuda.get_device_name(), created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       git_commit=str(git_info().get("commit", "unknown")), globaltimer_step_ns=step["step_ns"],
                       globaltimer_mean_step_ns=step["mean_step_ns"], clock64_read_cycles=reads["clock64"],
                       globaltimer_read_cycles=reads["globaltimer"],
                       record_cycles=record_cycles(prof, noprof) if designs else {}, **fit)


def describe(cal: Calibration) -> str:
    L = [f"GPU {cal.gpu}, {cal.created}, commit {cal.git_commit}",
         f"%globaltimer step {cal.globaltimer_step_ns:.0f} ns (mean {cal.globaltimer_mean_step_ns:.1f})",
         f"read cost: clock64 {cal.clock64_read_cycles:.1f} cycles, %globaltimer {cal.globaltimer_read_cycles:.1f}",
         f"anchor skew {cal.anchor_skew_cycles:.1f} cycles = {cal.anchor_skew_ns:.1f} ns; anchor error "
         f"{cal.anchor_error_ns:.1f} ns",
         f"SM clock {cal.sm_ghz:.4f} GHz over {len(cal.sms)} SMs, rate spread {cal.sm_drift_ppm:.2f} ppm; "
         f"two-anchor conversion off by <= {cal.alignment_ns:.1f} ns over a {cal.kernel_ms:.2f} ms kernel "
         f"(<= {cal.anchored_alignment_ns:.1f} ns with an anchor every {cal.anchor_every_ms:.2f} ms)",
         "slowest SMs: " + ", ".join(f"{s.sm}: {s.ghz:.5f} GHz, {s.max_residual_ns:.0f} ns"
                                     for s in sorted(cal.sms, key=lambda s: s.ghz)[:4]),
         f"clock64 offsets across SMs: {min(s.offset_cycles for s in cal.sms)} .. {max(s.offset_cycles for s in cal.sms)}"
         if cal.sms else "no SM samples"]
    if cal.link:
        from .calibrate_link import describe_link

        L += describe_link(cal.link)
    for grid, row in cal.record_cycles.items():
        L.append(f"cycles per record, {grid}:")
        L += [f"  {v:8.2f}  {k}" for k, v in row.items()]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="epscope calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help=f"calibration file (default {default_path()})")
    ap.add_argument("--kernel-ms", type=float, default=10.0, help="length of the SM-clock kernel (default 10 ms)")
    ap.add_argument("--no-designs", action="store_true", help="skip the record-design table (faster)")
    ap.add_argument("--samples", type=Path, default=None, help="also save the raw SM anchor samples (.npy)")
    ap.add_argument("--no-link", action="store_true", help="skip the two-GPU link figures")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("epscope calibrate: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    cal = measure(args.kernel_ms, designs=not args.no_designs, samples_out=args.samples)
    if not args.no_link:
        from dataclasses import replace

        from .calibrate_link import measure_link

        link, why = measure_link()
        if link is None:
            print(f"epscope calibrate: two-GPU link figures skipped: {why}")
        else:
            cal = replace(cal, link=link)
    path = cal.save(args.out or default_path())
    print(describe(cal))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
