// epscope per-warp recorder: include from any kernel (no torch, no host code).
//
// Lane 0 of each instrumented warp writes 16-byte records into the region of the profile
// buffer that its warp owns (layout: profiler/layout.toml, structs: generated/layout.cuh).
// No atomics and no fences per record: a record is one clock64 read and one 16-byte store
// (format 2: the per-warp %globaltimer anchors at init and finish convert cycles to ns).
//
//   Compile-time switch: EPSCOPE_PROFILE=0 (the default) turns every method into nothing: the
//   kernel has no timer reads and no record stores (tests/ check the SASS of both builds).
//   Runtime switch: a null buffer pointer in the instrumented build records nothing.
//
// Usage (every method is called by all 32 lanes of the warp, under warp-uniform control flow):
//   epscope::WarpRecorder rec;
//   rec.init(prof_buf);                 // null -> off
//   rec.begin(kSendChunk, chunk);  ...  rec.end(kSendChunk);
//   rec.arrive(kBarrierGrid, occurrence); ... rec.depart(kBarrierGrid, occurrence);
//   rec.anchor();                       // optional: an extra clock anchor (long kernels)
//   rec.finish();                       // on every exit path, timeouts included
#pragma once
#include <cstdint>

#include "generated/layout.cuh"

#ifndef EPSCOPE_PROFILE
#define EPSCOPE_PROFILE 0
#endif

namespace epscope {

// The two builds define different WarpRecorder classes; an inline namespace per build keeps their
// mangled names apart, so a prof and a noprof object can live in one process (both variants of a
// JIT extension are loaded side by side by the benchmarks) without an ODR clash.
#if EPSCOPE_PROFILE
#define EPSCOPE_VARIANT_NS prof
#else
#define EPSCOPE_VARIANT_NS noprof
#endif

// Host C++ (a bindings file) may include this header for buffer_bytes and the variant namespace;
// the device-side recorder below is compiled only by nvcc.
#ifdef __CUDACC__
#define EPSCOPE_HOST_DEVICE __host__ __device__
#else
#define EPSCOPE_HOST_DEVICE
#endif

// Bytes of a buffer with `num_regions` regions of `capacity` records: the host sizes buffers
// with the same expression through the generated Python dtypes.
EPSCOPE_HOST_DEVICE constexpr uint64_t buffer_bytes(uint32_t num_regions, uint32_t capacity) {
  return sizeof(BufferHeader) + uint64_t(num_regions) * (sizeof(RegionHeader) + uint64_t(capacity) * sizeof(Record));
}

#ifdef __CUDACC__

// %globaltimer: one clock for the whole GPU, 32 ns steps on H200 (measured-facts.md).
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

__device__ __forceinline__ uint32_t lane_id() {
  uint32_t l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

// Linear block index and warp-in-block of the calling thread (1-D blocks of whole warps).
__device__ __forceinline__ uint32_t linear_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ uint32_t warp_in_block() { return threadIdx.x / 32; }

// One (clock64, %globaltimer) anchor: clock64 read before and after the globaltimer read and
// averaged, so the pair's skew is half a clock64 read, not a whole globaltimer read (~40 cycles
// on H200, benchmarks/NOTES.md issue 22).
struct ClockPair {
  uint64_t clk;
  uint64_t gt;
};
__device__ __forceinline__ ClockPair clock_pair() {
  const uint64_t c0 = clock64();
  const uint64_t g = globaltimer();
  const uint64_t c1 = clock64();
  return ClockPair{c0 + ((c1 - c0) >> 1), g};
}

inline namespace EPSCOPE_VARIANT_NS {

#if EPSCOPE_PROFILE

class WarpRecorder {
 public:
  // Locate this warp's region (1-D blocks: warp = threadIdx.x / 32) and stamp its header.
  __device__ __forceinline__ void init(void* buf) { init(buf, linear_block(), warp_in_block()); }

  // Same, for kernels that number their warps themselves (e.g. a persistent kernel whose warp
  // plays several roles): region = block * warps_per_block + warp.
  __device__ __forceinline__ void init(void* buf, uint32_t block, uint32_t warp) {
    base_ = nullptr;
    next_ = 0;
    last_ = 0;
    if (buf == nullptr) return;
    auto* hdr = static_cast<const BufferHeader*>(buf);
    const uint32_t wpb = hdr->warps_per_block;
    const uint32_t region = block * wpb + warp;
    const uint32_t cap = hdr->region_capacity;
    // A host that sized the buffer for another grid records nothing rather than corrupting
    // memory; the decoder reports those regions as UNUSED. Only lane 0 records (last_ = 0 on lanes
    // 1..31: one predicate for the kernel's whole life, see put()).
    if (warp >= wpb || region >= hdr->num_regions || cap == 0 || cap > 0xffffffffu - kHeaderSlots ||
        lane_id() != 0)
      return;
    // base_ is this warp's region, not the buffer: a value the compiler cannot re-read from the
    // kernel's parameter bank, so a record adds its slot to a register instead of waiting on a
    // constant load (an LDC per record, which the first format-2 build paid: NOTES.md issue 22).
    base_ = static_cast<char*>(buf) + sizeof(BufferHeader) + uint64_t(region) * (sizeof(RegionHeader) + uint64_t(cap) * sizeof(Record));
    next_ = kHeaderSlots;
    last_ = kHeaderSlots + cap - 1;  // > 0: the recorder is on
    RegionHeader* rh = region_header();
    rh->sm = smid();
    rh->block = block;
    rh->warp = static_cast<uint16_t>(warp);
    const ClockPair a = clock_pair();
    rh->clk_start = a.clk;
    rh->gt_start = a.gt;
    rh->state = kRegionStarted;
  }

  __device__ __forceinline__ void begin(uint16_t phase, uint32_t payload = 0) { put(kKindBegin, phase, payload); }
  __device__ __forceinline__ void end(uint16_t phase, uint32_t payload = 0) { put(kKindEnd, phase, payload); }
  __device__ __forceinline__ void instant(uint16_t phase, uint32_t payload = 0) { put(kKindInstant, phase, payload); }
  __device__ __forceinline__ void arrive(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierArrive, barrier, occurrence); }
  __device__ __forceinline__ void depart(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierDepart, barrier, occurrence); }

  // An extra (globaltimer, clock64) anchor in the record stream, at a point the kernel chooses
  // (e.g. once per outer iteration of a long persistent kernel): the decoder converts piecewise
  // between anchors and reports an SM clock change between two of them (ClockChange). Costs a
  // globaltimer read (~40 cycles) and one record slot; init and finish anchor every warp anyway.
  __device__ __forceinline__ void anchor() {
    if (last_ != 0) {
      const ClockPair a = clock_pair();
      const uint64_t dst = __cvta_generic_to_global(base_) + uint64_t(min(next_, last_)) * sizeof(Record);
      const uint32_t idkind = uint32_t((a.clk >> 32) & 0xffffu) | (uint32_t(kKindAnchor) << 16);
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(uint32_t(a.gt)),
                   "r"(uint32_t(a.gt >> 32)), "r"(idkind), "r"(uint32_t(a.clk)) : "memory");
    }
    ++next_;
  }

  // Close the region: how many records were attempted (the decoder derives drops from it) and
  // the end anchor.
  __device__ __forceinline__ void finish() {
    if (last_ != 0) {
      RegionHeader* rh = region_header();
      const ClockPair a = clock_pair();
      rh->clk_end = a.clk;
      rh->gt_end = a.gt;
      rh->attempted = next_ - kHeaderSlots;
      rh->state = kRegionFinished;
    }
    last_ = 0;
  }

 private:
  static constexpr uint32_t kHeaderSlots = sizeof(RegionHeader) / sizeof(Record);  // also sizeof(BufferHeader) / 16
  static_assert(sizeof(BufferHeader) == sizeof(RegionHeader), "slot arithmetic: both headers are kHeaderSlots records");

  __device__ __forceinline__ RegionHeader* region_header() const { return reinterpret_cast<RegionHeader*>(base_); }

  // One record (format 2): a clock64 read and one 16-byte store to min(next_, last_), on lane 0 of
  // a warp that owns a region (last_ != 0). last_ is set at init and left alone until finish, so
  // ptxas if-converts the record into instructions predicated on one loop-invariant predicate:
  // no compare per record (format 1's bound predicate next_ < end_ put a 13-cycle ISETP latency
  // in front of every store), and a full region clamps into its last slot (the overflow sink)
  // instead. With recording off at run time (null buffer) or on lanes 1..31 the predicate is
  // false: the instructions issue but read no timer and store nothing. ptxas if-converts such a
  // short block even when it is written as a uniform branch (`@p bra.uni`: seen in the SASS), so
  // "off" costs the record's issue slots, not a branch. History (benchmarks/NOTES.md): C++
  // branches 83 cycles a record; globaltimer + bound predicate 37-42; a deferred store 78-85;
  // overflow sink + globaltimer 28-29; clock64 with the buffer re-read from the parameter bank
  // per record 36-39 (the LDC's latency, on or off).
  __device__ __forceinline__ void put(uint8_t kind, uint16_t id, uint32_t payload) {
    if (last_ != 0) {
      const uint64_t dst = __cvta_generic_to_global(base_) + uint64_t(min(next_, last_)) * sizeof(Record);
      const uint32_t idkind = uint32_t(id) | (uint32_t(kind) << 16);  // Record bytes 8..11: id, kind, reserved
      asm volatile(
          "{\n\t"
          ".reg .b64 t;\n\t"
          ".reg .b32 lo, hi;\n\t"
          "mov.u64 t, %%clock64;\n\t"
          "mov.b64 {lo, hi}, t;\n\t"
          "st.global.v4.u32 [%0], {lo, hi, %1, %2};\n\t"
          "}"
          :
          : "l"(dst), "r"(idkind), "r"(payload));
    }
    ++next_;  // counts drops too: nothing is dropped silently
  }

  // The whole state, 4 registers: this warp's region (2: a register, not the parameter bank, see
  // init), its next slot and its last slot. Format 1 kept 3 (the buffer from the parameter bank);
  // the first instrumented build kept 8, which cost EP copy loops registers (NOTES.md issue 9).
  char* base_ = nullptr;  // this warp's RegionHeader; its records follow it
  uint32_t next_ = 0;  // slot (16-byte unit from base_) of this warp's next record; counts drops too
  uint32_t last_ = 0;  // this warp's last slot, the overflow sink; 0: off (lanes 1..31, no region, finished)
};

#else  // EPSCOPE_PROFILE == 0: off means off.

class WarpRecorder {
 public:
  __device__ __forceinline__ void init(void*) {}
  __device__ __forceinline__ void init(void*, uint32_t, uint32_t) {}
  __device__ __forceinline__ void begin(uint16_t, uint32_t = 0) {}
  __device__ __forceinline__ void end(uint16_t, uint32_t = 0) {}
  __device__ __forceinline__ void instant(uint16_t, uint32_t = 0) {}
  __device__ __forceinline__ void arrive(uint16_t, uint32_t) {}
  __device__ __forceinline__ void depart(uint16_t, uint32_t) {}
  __device__ __forceinline__ void anchor() {}
  __device__ __forceinline__ void finish() {}
};

#endif  // EPSCOPE_PROFILE

}  // inline namespace EPSCOPE_VARIANT_NS

#endif  // __CUDACC__

static_assert(sizeof(Record) == 16, "one record is one 16-byte store");

}  // namespace epscope
