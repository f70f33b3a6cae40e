// Recorder self-test kernels: launchers (host side; no torch). Kernels live in selftest.cu.
//
// Every launcher takes raw device pointers and a stream and returns the launch's cudaError_t.
// `buf` is a profile buffer (BufferHeader + regions, warps_per_block = `warps`) or nullptr for
// the runtime-off switch. Spins are bounded by `timeout_cycles` of clock64 (not %globaltimer, so
// that the EPSCOPE_PROFILE=0 build contains no globaltimer read at all: tests/record checks the
// PTX); on timeout a kernel stores a nonzero code into `*error` and leaves its loop.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "profiler/csrc/recorder.cuh"  // EPSCOPE_VARIANT_NS

namespace epscope {
namespace selftest {
inline namespace EPSCOPE_VARIANT_NS {

// Error codes a self-test kernel stores into *error.
constexpr int kErrNone = 0;
constexpr int kErrIdleTimeout = 1;     // an idle warp waited longer than timeout for the workers
constexpr int kErrBarrierTimeout = 2;  // a warp waited longer than timeout at the grid barrier
constexpr int kErrTimerTimeout = 3;    // %globaltimer did not advance within timeout

// Per-warp statistics of the timer probe (int64 each): see timer_probe.
struct TimerStats {
  int64_t min_step_ns;   // smallest nonzero globaltimer increment seen
  int64_t max_step_ns;   // largest increment between two consecutive changes
  int64_t sum_steps_ns;  // sum of increments (mean = sum / steps)
  int64_t steps;         // increments observed
};
static_assert(sizeof(TimerStats) == 32, "TimerStats is read as int64[4] by the bindings");

// 1 if this object was built with EPSCOPE_PROFILE=1.
int compiled_with_profile();

// (1) Timer resolution: each warp waits `samples` times for %globaltimer to change, noting the
// increments (stats: TimerStats[grid * warps], from this record-free pass), then waits for
// `samples` more changes recording a `tick` instant after each. In the EPSCOPE_PROFILE=0 build
// the kernel reads no timer and leaves stats zero.
cudaError_t timer_probe(void* buf, int grid, int warps, int samples, TimerStats* stats, int64_t timeout_cycles,
                        int* error, cudaStream_t stream);

// (2) Per-record cost: each warp runs `n` iterations of (one `tick` record + one LCG step) between
// two clock64 reads; cycles: int64[grid * warps]. Compare with the same loop compiled out.
// sink: uint32[grid * warps * 32] (keeps the LCG live).
cudaError_t record_cost(void* buf, int grid, int warps, int n, int64_t* cycles, uint32_t* sink, cudaStream_t stream);

// (2b) What a record's parts cost, in the record_cost loop (n iterations of one record design +
// one LCG step per warp, clock64 around the loop; cycles: int64[grid * warps]): the design per
// `part` (RecordPart). buf: (grid * warps) * (cap + 1) 16-byte slots, a region of `cap` slots and
// a sink slot per warp; hires as format 1's HIRES flag (kPartV1 only). Instrumented build only
// (the compiled-out one reads no timer): there it returns cudaErrorNotSupported.
enum RecordPart : int {
  kPartNone = 0,          // the loop alone (LCG + counter): the baseline the others subtract
  kPartV1 = 1,            // format 1's put: bound predicate, globaltimer + clock64 + SEL, store
  kPartBoundClock = 2,    // bound predicate (next < end per record), clock64, store
  kPartV2Streaming = 3,   // format 2 with a streaming store (st.global.cs)
  kPartV2 = 4,            // format 2 (16-byte record): lane predicate fixed at init, sink clamp, clock64
  kPartAllLanes = 5,      // no predicate: all 32 lanes store the same record to the same clamped slot, clock64
  kPartV2NoAllocate = 6,  // format 2 with st.global.L1::no_allocate
  kPartStoreOnly = 7,     // one lane-0 clamped 16-byte store, no timer
  kPartAnchor = 8,        // an ANCHOR record: clock64, globaltimer, clock64, one store
  kPartStore8Only = 9,    // one lane-0 clamped 8-byte store, no timer (what the store's width costs)
  kPartV3 = 10,           // format 3 as built: lane predicate, sink clamp, clock64 bits 31..0 + meta, one 8-byte store
  kPartV3Wide = 11,       // format 3 with a 32-bit payload: the record and its PAYLOAD slot (two 8-byte stores)
  kPartCount = 12,
};
cudaError_t record_parts(int part, void* buf, uint32_t cap, int grid, int warps, int n, uint32_t hires,
                         int64_t* cycles, uint32_t* sink, cudaStream_t stream);

// (3) Imbalanced workload: warps [0, busy_warps) of blocks [0, busy_blocks) run `units` dependent
// FMAs per round inside a `work` span; every other warp records an `idle` span while it waits
// for the round's workers (counter `done`, zeroed by the caller). `rounds` `iteration` spans.
// out: float[grid * warps * 32].
cudaError_t imbalance(void* buf, int grid, int warps, int rounds, int busy_blocks, int busy_warps, int units,
                      unsigned* done, float* out, int64_t timeout_cycles, int* error, cudaStream_t stream);

// (4) Grid barrier with a known last arriver: every warp runs `units` FMAs (a `work` span), the
// warp (late_block, late_warp) runs `late_units` more, then all arrive at the grid barrier
// (occurrence = round) and depart when all grid*warps warps have arrived (counter `arrived`,
// zeroed by the caller). Needs the whole grid co-resident: checked with the occupancy API,
// cudaErrorCooperativeLaunchTooLarge when it is not.
cudaError_t grid_barrier(void* buf, int grid, int warps, int rounds, int units, int late_block, int late_warp,
                         int late_units, unsigned* arrived, float* out, int64_t timeout_cycles, int* error,
                         cudaStream_t stream);

// (5) Anchored ticks (formats 2-3): each warp records `n` `tick` instants `spin_cycles` of clock64
// apart and an extra clock anchor (WarpRecorder::anchor) after every `every`-th tick (0: none);
// the kernel lasts n * spin_cycles cycles, so the decoder's piecewise conversion and clock-change
// check run on a real GPU's anchors. Capacity needed: n + 2 * (n / every) slots per warp (format 3: an anchor is two).
cudaError_t anchored_ticks(void* buf, int grid, int warps, int n, int every, int64_t spin_cycles, cudaStream_t stream);

}  // inline namespace EPSCOPE_VARIANT_NS
}  // namespace selftest
}  // namespace epscope
