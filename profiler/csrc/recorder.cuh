// epscope per-warp recorder: include from any kernel (no torch, no host code).
//
// Lane 0 of each instrumented warp writes 16-byte records into the region of the profile
// buffer that its warp owns (layout: profiler/layout.toml, structs: generated/layout.cuh).
// No atomics and no fences per record: a record is one timer read and one 16-byte store.
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

inline namespace EPSCOPE_VARIANT_NS {

#if EPSCOPE_PROFILE

class WarpRecorder {
 public:
  // Locate this warp's region (1-D blocks: warp = threadIdx.x / 32) and stamp its header.
  __device__ __forceinline__ void init(void* buf) { init(buf, linear_block(), warp_in_block()); }

  // Same, for kernels that number their warps themselves (e.g. a persistent kernel whose warp
  // plays several roles): region = block * warps_per_block + warp.
  __device__ __forceinline__ void init(void* buf, uint32_t block, uint32_t warp) {
    buf_ = static_cast<char*>(buf);
    next_ = 0;
    end_ = 0;
    hires_ = 0;
    if (buf == nullptr) return;
    auto* hdr = static_cast<const BufferHeader*>(buf);
    const uint32_t wpb = hdr->warps_per_block;
    const uint32_t region = block * wpb + warp;
    // A host that sized the buffer for another grid records nothing rather than corrupting
    // memory; the decoder reports those regions as UNUSED. Only lane 0 records: the other lanes
    // keep end_ = 0, so their records fail the same bound as a full region, with no branch in put().
    if (warp >= wpb || region >= hdr->num_regions || lane_id() != 0) return;
    const uint32_t cap = hdr->region_capacity;
    const uint64_t region_slot = kHeaderSlots + uint64_t(region) * (kHeaderSlots + cap);
    // slot indices are 32-bit: a buffer past 64 GiB (never sized so by the host) records nothing
    if (region_slot + kHeaderSlots + cap > 0xffffffffull) return;
    next_ = uint32_t(region_slot) + kHeaderSlots;
    end_ = next_ + cap;
    hires_ = (hdr->flags & kFlagHires) != 0 ? 1u : 0u;
    RegionHeader* rh = region_header();
    rh->sm = smid();
    rh->block = block;
    rh->warp = static_cast<uint16_t>(warp);
    rh->clk_start = clock64();
    rh->gt_start = globaltimer();
    rh->state = kRegionStarted;
  }

  __device__ __forceinline__ void begin(uint16_t phase, uint32_t payload = 0) { put(kKindBegin, phase, payload); }
  __device__ __forceinline__ void end(uint16_t phase, uint32_t payload = 0) { put(kKindEnd, phase, payload); }
  __device__ __forceinline__ void instant(uint16_t phase, uint32_t payload = 0) { put(kKindInstant, phase, payload); }
  __device__ __forceinline__ void arrive(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierArrive, barrier, occurrence); }
  __device__ __forceinline__ void depart(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierDepart, barrier, occurrence); }

  // Close the region: how many records were attempted (the decoder derives drops from it) and
  // the end clock pair for high-resolution conversion.
  __device__ __forceinline__ void finish() {
    if (end_ != 0) {
      RegionHeader* rh = region_header();
      rh->clk_end = clock64();
      rh->gt_end = globaltimer();
      rh->attempted = next_ - first_slot();
      rh->state = kRegionFinished;
    }
    next_ = 0;
    end_ = 0;
  }

 private:
  static constexpr uint32_t kHeaderSlots = sizeof(RegionHeader) / sizeof(Record);  // also sizeof(BufferHeader) / 16
  static_assert(sizeof(BufferHeader) == sizeof(RegionHeader), "slot arithmetic: both headers are kHeaderSlots records");

  __device__ __forceinline__ uint32_t first_slot() const {
    return end_ - static_cast<const BufferHeader*>(static_cast<void*>(buf_))->region_capacity;
  }
  __device__ __forceinline__ RegionHeader* region_header() const {
    return reinterpret_cast<RegionHeader*>(buf_ + uint64_t(first_slot() - kHeaderSlots) * sizeof(Record));
  }

  // One record: a bound check, the timer, one predicated 16-byte store, in one asm block so that
  // the compare issues before the timer read. ptxas schedules nothing across a timer read, so a
  // compare placed after it (where the compiler sinks a C++ one) puts its 13-cycle predicate
  // latency after the read, in front of the store. The bound (next_ < end_) is false on lanes
  // 1..31, when the region is full and when the recorder is off. In hires mode the clock64 read
  // replaces the globaltimer one (ptxas: CS2R, CS2R, SEL; both reads cost an issue slot, no
  // branch). History (benchmarks/NOTES.md): C++ branches 83 cycles a record; two predicated
  // reads in one block, compare after them, 37-42; a deferred store 78-85; one predicated read
  // pair plus a C++ compare (843a8f8) 39-43 (ptxas: 31 stall cycles per record).
  __device__ __forceinline__ void put(uint8_t kind, uint16_t id, uint32_t payload) {
    const uint64_t dst = __cvta_generic_to_global(buf_) + uint64_t(next_) * sizeof(Record);
    const uint32_t idkind = uint32_t(id) | (uint32_t(kind) << 16);  // Record bytes 8..11: id, kind, reserved
    asm volatile(
        "{\n\t"
        ".reg .pred p, h;\n\t"
        ".reg .b64 t;\n\t"
        ".reg .b32 lo, hi;\n\t"
        "setp.lt.u32 p, %1, %2;\n\t"
        "setp.ne.u32 h, %5, 0;\n\t"
        "mov.u64 t, %%globaltimer;\n\t"
        "@h mov.u64 t, %%clock64;\n\t"
        "mov.b64 {lo, hi}, t;\n\t"
        "@p st.global.v4.u32 [%0], {lo, hi, %3, %4};\n\t"
        "}"
        :
        : "l"(dst), "r"(next_), "r"(end_), "r"(idkind), "r"(payload), "r"(hires_));
    ++next_;  // counts drops too: nothing is dropped silently
  }

  // The whole state: two slot indices and the mode, 3 registers. buf_ is the kernel's own
  // parameter, which the compiler re-reads from the constant bank rather than holding it: the
  // state stays live across a kernel's hot loops, where every register it holds is one the copy
  // loop cannot use (the first instrumented build kept 8, benchmarks/NOTES.md issue 9).
  char* buf_ = nullptr;
  uint32_t next_ = 0;   // slot (16-byte unit from buf_) of this warp's next record; counts drops too
  uint32_t end_ = 0;    // first slot past this warp's region; 0 on lanes 1..31 and when off
  uint32_t hires_ = 0;  // 1: records hold clock64 cycles (BufferHeader flag HIRES)
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
  __device__ __forceinline__ void finish() {}
};

#endif  // EPSCOPE_PROFILE

}  // inline namespace EPSCOPE_VARIANT_NS

#endif  // __CUDACC__

static_assert(sizeof(Record) == 16, "one record is one 16-byte store");

}  // namespace epscope
