// Recorder self-test kernels (family "selftest", registry profiler/phases/selftest.toml): exercise
// the per-warp recorder on a real GPU without the EP kernels. Launchers sit beside their kernels;
// declarations and the meaning of every argument are in selftest.cuh. No torch here.
//
// Spins are bounded by clock64 cycles, never by %globaltimer, so that the EPSCOPE_PROFILE=0
// build of this file reads no globaltimer at all (tests/record/test_build.py checks the PTX).
#include "profiler/csrc/selftest.cuh"

#include "profiler/csrc/generated/selftest_phases.cuh"
#include "profiler/csrc/recorder.cuh"

#include <utility>

namespace epscope {
namespace selftest {
inline namespace EPSCOPE_VARIANT_NS {

using namespace epscope::phases::selftest;

namespace {

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A dependent FMA chain: `units` FMAs of ~4 cycles latency each, so the time is set by the count.
// noinline (like wait_count): the workload's hot loops are then the same machine code in both
// builds, so the on/off comparison measures the records, not two register allocations of the loop.
// The empty volatile asm makes the call a side effect: a pure function may be moved across the
// records around it, and was (issue 33: the format-2 build stored `work`'s END before the call,
// so the dense workload's work spans were empty and its overhead figure measured that order).
__device__ __noinline__ float busy_work(float v, int units) {
  for (int i = 0; i < units; ++i) v = fmaf(v, 1.0000001f, 0.5f);
  asm volatile("" : "+f"(v));
  return v;
}

// Lane 0 waits until *counter >= target or timeout; the other lanes wait at __syncwarp.
// Returns false on timeout.
__device__ __noinline__ bool wait_count(const unsigned* counter, unsigned target, int64_t timeout_cycles) {
  bool ok = true;
  if (lane_id() == 0) {
    const int64_t c0 = clock64();
    while (ld_acquire_gpu(counter) < target) {
      if (clock64() - c0 > timeout_cycles) {
        ok = false;
        break;
      }
    }
  }
  return __shfl_sync(0xffffffffu, ok, 0);
}

// ---------------------------------------------------------------------------------------------
// (1) timer resolution
__global__ void timer_probe_kernel(void* buf, int samples, TimerStats* stats, int64_t timeout_cycles, int* error) {
  WarpRecorder rec;
  rec.init(buf);
#if EPSCOPE_PROFILE
  const uint32_t w = linear_block() * (blockDim.x / 32) + warp_in_block();
  const int64_t c0 = clock64();
  // Pass 1, no records: the raw increments of %globaltimer as a tight loop sees them.
  int64_t min_step = INT64_MAX, max_step = 0, sum = 0, steps = 0;
  uint64_t last = globaltimer();
  for (int i = 0; i < samples; ++i) {
    uint64_t t;
    do {
      t = globaltimer();
    } while (t == last && clock64() - c0 < timeout_cycles);
    if (t == last) break;
    const int64_t step = static_cast<int64_t>(t - last);
    min_step = min(min_step, step);
    max_step = max(max_step, step);
    sum += step;
    ++steps;
    last = t;
  }
  // Pass 2: a `tick` record after each change, so the trace shows the same steps.
  bool ok = steps == samples;
  for (int i = 0; i < samples && ok; ++i) {
    uint64_t t;
    do {
      t = globaltimer();
    } while (t == last && clock64() - c0 < timeout_cycles);
    ok = t != last;
    if (ok) rec.instant(kTick, static_cast<uint32_t>(i));
    last = t;
  }
  if (lane_id() == 0) {
    if (!ok) atomicExch(error, kErrTimerTimeout);
    stats[w] = TimerStats{steps ? min_step : 0, max_step, sum, steps};
  }
#else
  (void)samples, (void)stats, (void)timeout_cycles, (void)error;
#endif
  rec.finish();
}

// ---------------------------------------------------------------------------------------------
// (2) per-record cost
__global__ void record_cost_kernel(void* buf, int n, int64_t* cycles, uint32_t* sink) {
  WarpRecorder rec;
  rec.init(buf);
  const uint32_t w = linear_block() * (blockDim.x / 32) + warp_in_block();
  uint32_t x = threadIdx.x;
  __syncwarp();
  const int64_t c0 = clock64();
  for (int i = 0; i < n; ++i) {
    rec.instant(kTick, static_cast<uint32_t>(i));
    x = x * 1664525u + 1013904223u;  // Numerical Recipes LCG: one dependent IMAD per iteration
  }
  const int64_t c1 = clock64();
  rec.finish();
  sink[w * 32 + lane_id()] = x;
  if (lane_id() == 0) cycles[w] = c1 - c0;
}

// ---------------------------------------------------------------------------------------------
// (2b) what a record's parts cost: the record_cost loop with one record design per variant
// (selftest.cuh, RecordPart), written as raw asm beside the WarpRecorder so that one run measures
// the designs side by side (format 1's, format 2's, and their parts). Lane 0 of each warp owns
// `cap` slots plus one sink slot of `buf`; lanes 1..31 are predicated off (lane predicate) or,
// in kPartAllLanes, write lane 0's record to lane 0's slot.
#if EPSCOPE_PROFILE
template <int kPart>
__device__ __forceinline__ void part_record(uint64_t base, uint64_t rbase, uint32_t next, uint32_t end, uint32_t on,
                                            uint32_t hires, uint32_t idkind, uint32_t payload, uint32_t& x) {
  if constexpr (kPart == kPartV1) {  // format 1's WarpRecorder::put
    const uint64_t dst = base + uint64_t(next) * 16;
    asm volatile(
        "{\n\t.reg .pred p, h;\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\t"
        "setp.lt.u32 p, %1, %2;\n\tsetp.ne.u32 h, %5, 0;\n\t"
        "mov.u64 t, %%globaltimer;\n\t@h mov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t"
        "@p st.global.v4.u32 [%0], {lo, hi, %3, %4};\n\t}"
        :: "l"(dst), "r"(next), "r"(on ? end : 0u), "r"(idkind), "r"(payload), "r"(hires));
  } else if constexpr (kPart == kPartBoundClock) {
    const uint64_t dst = base + uint64_t(next) * 16;
    asm volatile(
        "{\n\t.reg .pred p;\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\tsetp.lt.u32 p, %1, %2;\n\t"
        "mov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t@p st.global.v4.u32 [%0], {lo, hi, %3, %4};\n\t}"
        :: "l"(dst), "r"(next), "r"(on ? end : 0u), "r"(idkind), "r"(payload));
  } else if constexpr (kPart == kPartV2 || kPart == kPartAllLanes) {
    if (kPart == kPartAllLanes || on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("{\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\tmov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t"
                   "st.global.v4.u32 [%0], {lo, hi, %1, %2};\n\t}"
                   :: "l"(dst), "r"(idkind), "r"(payload));
    }
  } else if constexpr (kPart == kPartV2Streaming) {
    if (on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("{\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\tmov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t"
                   "st.global.cs.v4.u32 [%0], {lo, hi, %1, %2};\n\t}"
                   :: "l"(dst), "r"(idkind), "r"(payload));
    }
  } else if constexpr (kPart == kPartV2NoAllocate) {
    if (on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("{\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\tmov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t"
                   "st.global.L1::no_allocate.v4.u32 [%0], {lo, hi, %1, %2};\n\t}"
                   :: "l"(dst), "r"(idkind), "r"(payload));
    }
  } else if constexpr (kPart == kPartStore8Only) {
    if (on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(dst), "r"(x), "r"(payload));
    }
  } else if constexpr (kPart == kPartStoreOnly) {
    if (on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "r"(x), "r"(next), "r"(idkind),
                   "r"(payload));
    }
  } else if constexpr (kPart == kPartV3 || kPart == kPartV3Wide) {  // format 3's WarpRecorder::put
    if (on) {
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 8;
      // idkind is format 2's (id | kind << 16): the same record's format-3 kind | id bits
      const uint32_t head = ((idkind >> 16) << kMetaKindShift) | ((idkind & 0xfffu) << kMetaIdShift);
      const uint32_t meta = head | min(payload, kMetaPayloadMax);
      asm volatile("{\n\t.reg .b64 t;\n\t.reg .b32 lo, hi;\n\tmov.u64 t, %%clock64;\n\tmov.b64 {lo, hi}, t;\n\t"
                   "st.global.v2.u32 [%0], {lo, %1};\n\t}"
                   :: "l"(dst), "r"(meta));
      if (kPart == kPartV3Wide) {  // + the PAYLOAD slot of a 32-bit payload
        const uint64_t side = rbase + uint64_t(min(next + 1, end)) * 8;
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(side), "r"(payload),
                     "r"((uint32_t(kKindPayload) << kMetaKindShift) | (idkind & 0xfffu) << kMetaIdShift));
      }
    }
  } else if constexpr (kPart == kPartAnchor) {
    if (on) {
      const ClockPair a = clock_pair();
      const uint64_t dst = rbase + uint64_t(min(next, end)) * 16;
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "r"(uint32_t(a.gt)),
                   "r"(uint32_t(a.gt >> 32)), "r"(idkind | uint32_t(a.clk >> 32)), "r"(uint32_t(a.clk)) : "memory");
    }
  }
}

template <int kPart>
__global__ void record_parts_kernel(void* buf, uint32_t cap, int n, uint32_t hires, int64_t* cycles, uint32_t* sink) {
  const uint32_t w = linear_block() * (blockDim.x / 32) + warp_in_block();
  // slot indices from the buffer's start, the region's first folded in (as WarpRecorder keeps them)
  const uint64_t base = __cvta_generic_to_global(buf);
  uint64_t rbase;  // the same address in a register the compiler cannot re-read from the parameter bank
  asm("mov.b64 %0, %1;" : "=l"(rbase) : "l"(base));
  const uint32_t first = w * (cap + 1), sink_slot = first + cap;
  const uint32_t on = lane_id() == 0;
  uint32_t next = first;
  const uint32_t end = sink_slot;
  uint32_t x = threadIdx.x;
  __syncwarp();
  const int64_t c0 = clock64();
  for (int i = 0; i < n; ++i) {
    if constexpr (kPart != kPartNone) part_record<kPart>(base, rbase, next, end, on, hires, 0x30000u | kTick, uint32_t(i), x);
    ++next;
    x = x * 1664525u + 1013904223u;  // the record_cost loop's LCG
  }
  const int64_t c1 = clock64();
  sink[w * 32 + lane_id()] = x + next;
  if (lane_id() == 0) cycles[w] = c1 - c0;
}

template <int... kParts>
cudaError_t launch_part(int part, std::integer_sequence<int, kParts...>, dim3 g, dim3 b, cudaStream_t stream,
                        void* buf, uint32_t cap, int n, uint32_t hires, int64_t* cycles, uint32_t* sink) {
  bool found = false;
  ((part == kParts ? (record_parts_kernel<kParts><<<g, b, 0, stream>>>(buf, cap, n, hires, cycles, sink), found = true)
                   : false), ...);
  return found ? cudaGetLastError() : cudaErrorInvalidValue;
}
#endif

// ---------------------------------------------------------------------------------------------
// (3) imbalanced workload
__global__ void imbalance_kernel(void* buf, int rounds, int busy_blocks, int busy_warps, int units, unsigned* done,
                                 float* out, int64_t timeout_cycles, int* error) {
  WarpRecorder rec;
  rec.init(buf);
  const uint32_t block = linear_block(), warp = warp_in_block();
  const uint32_t warps = blockDim.x / 32;
  const bool busy = block < static_cast<uint32_t>(busy_blocks) && warp < static_cast<uint32_t>(busy_warps);
  const unsigned workers = min(static_cast<unsigned>(busy_blocks), gridDim.x) * min(static_cast<unsigned>(busy_warps), warps);
  float v = static_cast<float>(threadIdx.x);
  for (int r = 0; r < rounds; ++r) {
    rec.begin(kIteration, static_cast<uint32_t>(r));
    if (busy) {
      rec.begin(kWork, static_cast<uint32_t>(units));
      v = busy_work(v, units);
      rec.end(kWork, static_cast<uint32_t>(units));
      __syncwarp();
      if (lane_id() == 0) {
        __threadfence();
        atomicAdd(done, 1u);
      }
    } else {
      rec.begin(kIdle, 0);
      const bool ok = wait_count(done, workers * static_cast<unsigned>(r + 1), timeout_cycles);
      rec.end(kIdle, 0);
      if (!ok) {
        if (lane_id() == 0) atomicExch(error, kErrIdleTimeout);
        rec.end(kIteration, static_cast<uint32_t>(r));
        break;
      }
    }
    rec.end(kIteration, static_cast<uint32_t>(r));
  }
  rec.finish();
  out[(block * warps + warp) * 32 + lane_id()] = v;
}

// ---------------------------------------------------------------------------------------------
// (4) grid barrier with a known last arriver
__global__ void grid_barrier_kernel(void* buf, int rounds, int units, int late_block, int late_warp, int late_units,
                                    unsigned* arrived, float* out, int64_t timeout_cycles, int* error) {
  WarpRecorder rec;
  rec.init(buf);
  const uint32_t block = linear_block(), warp = warp_in_block();
  const uint32_t warps = blockDim.x / 32;
  const unsigned total = gridDim.x * warps;
  const bool late = block == static_cast<uint32_t>(late_block) && warp == static_cast<uint32_t>(late_warp);
  const int my_units = units + (late ? late_units : 0);
  float v = static_cast<float>(threadIdx.x);
  for (int r = 0; r < rounds; ++r) {
    rec.begin(kWork, static_cast<uint32_t>(my_units));
    v = busy_work(v, my_units);
    rec.end(kWork, static_cast<uint32_t>(my_units));
    rec.arrive(kBarrierGrid, static_cast<uint32_t>(r));
    __syncwarp();
    if (lane_id() == 0) {
      __threadfence();
      atomicAdd(arrived, 1u);
    }
    const bool ok = wait_count(arrived, total * static_cast<unsigned>(r + 1), timeout_cycles);
    rec.depart(kBarrierGrid, static_cast<uint32_t>(r));
    if (!ok) {
      if (lane_id() == 0) atomicExch(error, kErrBarrierTimeout);
      break;
    }
  }
  rec.finish();
  out[(block * warps + warp) * 32 + lane_id()] = v;
}

// ---------------------------------------------------------------------------------------------
// (5) anchored ticks
__global__ void anchored_ticks_kernel(void* buf, int n, int every, int64_t spin_cycles) {
  WarpRecorder rec;
  rec.init(buf);
  int64_t next = clock64();
  for (int i = 0; i < n; ++i) {
    next += spin_cycles;
    while (int64_t(clock64()) < next) {
    }
    rec.instant(kTick, static_cast<uint32_t>(i));
    if (every > 0 && (i + 1) % every == 0) rec.anchor();
  }
  rec.finish();
}

}  // namespace

cudaError_t anchored_ticks(void* buf, int grid, int warps, int n, int every, int64_t spin_cycles, cudaStream_t stream) {
  if (grid <= 0 || warps <= 0 || n < 0 || every < 0 || spin_cycles < 0) return cudaErrorInvalidValue;
  anchored_ticks_kernel<<<grid, warps * 32, 0, stream>>>(buf, n, every, spin_cycles);
  return cudaGetLastError();
}

int compiled_with_profile() { return EPSCOPE_PROFILE; }

cudaError_t timer_probe(void* buf, int grid, int warps, int samples, TimerStats* stats, int64_t timeout_cycles,
                        int* error, cudaStream_t stream) {
  timer_probe_kernel<<<grid, warps * 32, 0, stream>>>(buf, samples, stats, timeout_cycles, error);
  return cudaGetLastError();
}

cudaError_t record_cost(void* buf, int grid, int warps, int n, int64_t* cycles, uint32_t* sink, cudaStream_t stream) {
  record_cost_kernel<<<grid, warps * 32, 0, stream>>>(buf, n, cycles, sink);
  return cudaGetLastError();
}

cudaError_t record_parts(int part, void* buf, uint32_t cap, int grid, int warps, int n, uint32_t hires,
                         int64_t* cycles, uint32_t* sink, cudaStream_t stream) {
#if EPSCOPE_PROFILE
  return launch_part(part, std::make_integer_sequence<int, kPartCount>{}, dim3(grid), dim3(warps * 32), stream, buf,
                     cap, n, hires, cycles, sink);
#else
  (void)part, (void)buf, (void)cap, (void)grid, (void)warps, (void)n, (void)hires, (void)cycles, (void)sink, (void)stream;
  return cudaErrorNotSupported;  // the compiled-out build reads no timer (tests/record/test_build.py)
#endif
}

cudaError_t imbalance(void* buf, int grid, int warps, int rounds, int busy_blocks, int busy_warps, int units,
                      unsigned* done, float* out, int64_t timeout_cycles, int* error, cudaStream_t stream) {
  imbalance_kernel<<<grid, warps * 32, 0, stream>>>(buf, rounds, busy_blocks, busy_warps, units, done, out,
                                                    timeout_cycles, error);
  return cudaGetLastError();
}

cudaError_t grid_barrier(void* buf, int grid, int warps, int rounds, int units, int late_block, int late_warp,
                         int late_units, unsigned* arrived, float* out, int64_t timeout_cycles, int* error,
                         cudaStream_t stream) {
  // A software grid barrier deadlocks (here: times out) unless every block is resident at once.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_barrier_kernel, warps * 32, 0);
  if (e != cudaSuccess) return e;
  if (grid > sms * per_sm) return cudaErrorCooperativeLaunchTooLarge;
  grid_barrier_kernel<<<grid, warps * 32, 0, stream>>>(buf, rounds, units, late_block, late_warp, late_units, arrived,
                                                       out, timeout_cycles, error);
  return cudaGetLastError();
}

}  // inline namespace EPSCOPE_VARIANT_NS
}  // namespace selftest
}  // namespace epscope
