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
    on_ = false;
    cap_ = 0;
    n_ = 0;
    if (buf == nullptr) return;
    auto* hdr = static_cast<const BufferHeader*>(buf);
    const uint32_t wpb = hdr->warps_per_block;
    const uint32_t region = block * wpb + warp;
    // A host that sized the buffer for another grid records nothing rather than corrupting
    // memory; the decoder reports those regions as UNUSED.
    if (warp >= wpb || region >= hdr->num_regions) return;
    const uint32_t cap = hdr->region_capacity;
    hires_ = (hdr->flags & kFlagHires) != 0 ? 1u : 0u;
    const uint64_t stride = sizeof(RegionHeader) + uint64_t(cap) * sizeof(Record);
    auto* rh = reinterpret_cast<RegionHeader*>(static_cast<char*>(buf) + sizeof(BufferHeader) + region * stride);
    recs_ = __cvta_generic_to_global(rh + 1);
    on_ = true;
    if (lane_id() == 0) {
      // Only lane 0 stores: the other lanes keep cap_ = 0, so their records are "dropped" by the
      // same predicate that bounds lane 0's region, with no branch in put().
      cap_ = cap;
      region_ = rh;
      rh->sm = smid();
      rh->block = block;
      rh->warp = static_cast<uint16_t>(warp);
      rh->clk_start = clock64();
      rh->gt_start = globaltimer();
      rh->state = kRegionStarted;
    }
  }

  __device__ __forceinline__ bool enabled() const { return on_; }

  __device__ __forceinline__ void begin(uint16_t phase, uint32_t payload = 0) { put(kKindBegin, phase, payload); }
  __device__ __forceinline__ void end(uint16_t phase, uint32_t payload = 0) { put(kKindEnd, phase, payload); }
  __device__ __forceinline__ void instant(uint16_t phase, uint32_t payload = 0) { put(kKindInstant, phase, payload); }
  __device__ __forceinline__ void arrive(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierArrive, barrier, occurrence); }
  __device__ __forceinline__ void depart(uint16_t barrier, uint32_t occurrence) { put(kKindBarrierDepart, barrier, occurrence); }

  // Close the region: how many records were attempted (the decoder derives drops from it) and
  // the end clock pair for high-resolution conversion.
  __device__ __forceinline__ void finish() {
    if (region_ != nullptr) {
      region_->clk_end = clock64();
      region_->gt_end = globaltimer();
      region_->attempted = n_;
      region_->state = kRegionFinished;
    }
    region_ = nullptr;
    on_ = false;
    cap_ = 0;
  }

 private:
  // One record = one timer read and one predicated 16-byte store, straight-line code. The timer
  // is chosen by the region's mode (hires_ is loop-invariant), and ptxas turns the two reads into
  // a predicated pair of which exactly one executes (cuobjdump: `@P0 CS2R SR_CLOCKLO` /
  // `@!P0 CS2R SR_GLOBALTIMERLO`, then `@!P2 STG.E.128`). The store's predicate p = (n_ < cap_)
  // is false on lanes 1..31, when the region is full and when the recorder is off (cap_ = 0).
  // History (benchmarks/NOTES.md): a first version with C++ branches cost 83 cycles a record
  // (recorder-h200-2026-11-29-v1-branchy.md); the next one predicated both reads inside one asm
  // block, which ptxas compiled to two unconditional reads plus SELs, 37-42 cycles; a store
  // deferred to the next record site cost 78-85.
  __device__ __forceinline__ void put(uint8_t kind, uint16_t id, uint32_t payload) {
    const uint64_t dst = recs_ + uint64_t(n_) * sizeof(Record);
    const uint32_t idkind = uint32_t(id) | (uint32_t(kind) << 16);  // Record bytes 8..11: id, kind, reserved
    uint64_t t;
    if (hires_) asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    else asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile(
        "{\n\t"
        ".reg .pred p;\n\t"
        ".reg .b32 lo, hi;\n\t"
        "setp.lt.u32 p, %1, %2;\n\t"
        "mov.b64 {lo, hi}, %3;\n\t"
        "@p st.global.v4.u32 [%0], {lo, hi, %4, %5};\n\t"
        "}"
        :
        : "l"(dst), "r"(n_), "r"(cap_), "l"(t), "r"(idkind), "r"(payload));
    ++n_;  // counts drops too: nothing is dropped silently
  }

  uint64_t recs_ = 0;               // global address of this warp's first record
  RegionHeader* region_ = nullptr;  // lane 0 of an active warp only
  uint32_t n_ = 0;
  uint32_t cap_ = 0;                // records lane 0 may store; 0 on other lanes and when off
  uint32_t hires_ = 0;
  bool on_ = false;
};

#else  // EPSCOPE_PROFILE == 0: off means off.

class WarpRecorder {
 public:
  __device__ __forceinline__ void init(void*) {}
  __device__ __forceinline__ void init(void*, uint32_t, uint32_t) {}
  __device__ __forceinline__ bool enabled() const { return false; }
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
