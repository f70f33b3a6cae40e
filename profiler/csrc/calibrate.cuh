// Clock calibration kernels (`epscope calibrate`): launchers, host side, no torch. Kernels live in
// calibrate.cu; the fits that turn their samples into a calibration file are
// profiler/record/calibrate.py (measuring) and profiler/decode/calibration.py (the file).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace epscope {
namespace calibrate {

// What read_cost times: back-to-back reads of one timer, each folded into an accumulator.
enum TimerKind : int { kTimerClock64 = 0, kTimerGlobaltimer = 1 };

// (1) Read cost: one warp per block runs n reads of `timer` between two clock64 reads;
// cycles: int64[grid] (cycles of lane 0's loop); sink: uint64[grid] keeps the reads live.
cudaError_t read_cost(int timer, int grid, int n, int64_t* cycles, uint64_t* sink, cudaStream_t stream);

// One anchor sample as the recorder takes it (recorder.cuh clock_pair): clock64 before and after
// a %globaltimer read. 32 bytes, read as int64[4] by the bindings.
struct AnchorSample {
  uint64_t clk_before;
  uint64_t gt;
  uint64_t clk_after;
  uint64_t sm;
};
static_assert(sizeof(AnchorSample) == 32, "AnchorSample is read as int64[4]");

// (2) SM clocks against the globaltimer: `grid` blocks of one warp (one per SM when grid <= the
// SM count: the scheduler spreads single-warp blocks), lane 0 takes `samples` anchors
// `interval_cycles` of clock64 apart (a spin, so the kernel lasts samples * interval cycles);
// out: AnchorSample[grid * samples].
cudaError_t sm_clocks(int grid, int samples, int64_t interval_cycles, AnchorSample* out, cudaStream_t stream);

}  // namespace calibrate
}  // namespace epscope
