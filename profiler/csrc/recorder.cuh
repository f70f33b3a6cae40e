// epscope per-warp recorder: include from any kernel (no torch, no host code).
//
// Lane 0 of each instrumented warp writes 8-byte records into the region of the profile buffer
// that its warp owns (layout: profiler/layout.toml, structs: generated/layout.cuh). No atomics and
// no fences per record: a record is one clock64 read and one 8-byte store (format 3: the low 32
// bits of clock64 beside kind | id | payload; the per-warp %globaltimer anchors at init and finish
// convert cycles to ns, and the decoder completes each record's clock from the one before it).
//
//   Compile-time switch: EPSCOPE_PROFILE=0 (the default) turns every method into nothing: the
//   kernel has no timer reads and no record stores (tests/ check the SASS of both builds).
//   Runtime switch: a null buffer pointer in the instrumented build records nothing. A launch
//   that records nothing runs the compiled-out build instead where the host can choose it (the
//   EP Buffer and the self-tests do), so "off" costs nothing there.
//
// Usage (every method is called by all 32 lanes of the warp, under warp-uniform control flow;
// phases and barriers are the generated enums of the kernel family, whose registry says which
// payloads are 32-bit: `payload_bits = 32` adds a PAYLOAD slot, the others keep 16 bits,
// saturated at 0xFFFF):
//   epscope::WarpRecorder rec;
//   rec.init(prof_buf);                 // null -> off
//   rec.begin(kSendChunk, chunk);  ...  rec.end(kSendChunk);
//   rec.arrive(kBarrierGrid, occurrence); ... rec.depart(kBarrierGrid, occurrence);
//   rec.anchor();                       // an extra clock anchor: long kernels, and on both sides of
//                                       // a gap of 2^32 cycles (2.17 s) or more between records
//   rec.finish();                       // on every exit path, timeouts included
#pragma once
#include <cstdint>
#include <type_traits>

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

// Bytes of a buffer with `num_regions` regions of `capacity` record slots: the host sizes buffers
// with the same expression through the generated Python dtypes.
EPSCOPE_HOST_DEVICE constexpr uint64_t buffer_bytes(uint32_t num_regions, uint32_t capacity) {
  return sizeof(BufferHeader) + uint64_t(num_regions) * (sizeof(RegionHeader) + uint64_t(capacity) * sizeof(Record8));
}

// A record's kind | id bits of Record8.meta (the payload bits left 0).
template <class Id>
EPSCOPE_HOST_DEVICE constexpr uint32_t record_head(uint8_t kind, Id id) {
  return (uint32_t(kind) << kMetaKindShift) | (uint32_t(id) << kMetaIdShift);
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

// The recorder's methods take the family's generated Phase / Barrier enums: their registry says
// which payloads are 32-bit (payload_wide, found through ADL in the family's namespace).
#define EPSCOPE_REQUIRE_ENUM(Id)                                                                     \
  static_assert(std::is_enum<Id>::value,                                                           \
                "record with the kernel family's generated Phase / Barrier enum (its registry says how " \
                "wide the payload is)")

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
    // An odd capacity would put the next regions' 16-byte headers 8 bytes off (a misaligned
    // 16-byte store faults the kernel): the host rounds it up (pool.region_capacity).
    if (warp >= wpb || region >= hdr->num_regions || cap == 0 || (cap & 1u) != 0 ||
        cap > 0xffffffffu - kHeaderSlots || lane_id() != 0)
      return;
    // base_ is this warp's region, not the buffer: a value the compiler cannot re-read from the
    // kernel's parameter bank, so a record adds its slot to a register instead of waiting on a
    // constant load (an LDC per record, which the first format-2 build paid: NOTES.md issue 22).
    base_ = static_cast<char*>(buf) + sizeof(BufferHeader) + uint64_t(region) * (sizeof(RegionHeader) + uint64_t(cap) * sizeof(Record8));
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

  template <class Id>
  __device__ __forceinline__ void begin(Id phase, uint32_t payload = 0) { put(kKindBegin, phase, payload); }
  template <class Id>
  __device__ __forceinline__ void end(Id phase, uint32_t payload = 0) { put(kKindEnd, phase, payload); }
  template <class Id>
  __device__ __forceinline__ void instant(Id phase, uint32_t payload = 0) { put(kKindInstant, phase, payload); }
  template <class Id>
  __device__ __forceinline__ void arrive(Id barrier, uint32_t occurrence) { put(kKindBarrierArrive, barrier, occurrence); }
  template <class Id>
  __device__ __forceinline__ void depart(Id barrier, uint32_t occurrence) { put(kKindBarrierDepart, barrier, occurrence); }

  // An extra (globaltimer, clock64) anchor in the record stream, at a point the kernel chooses
  // (e.g. once per outer iteration of a long persistent kernel, or after a wait that may pass
  // 2^32 cycles): the decoder converts piecewise between anchors, reports an SM clock change
  // between two of them (ClockChange) and completes the clocks of the records after it from its
  // full one. Costs a globaltimer read (~8 cycles, calibrate) and two slots, ANCHOR (clock64
  // bits 59..0) then ANCHOR_NS (globaltimer bits 59..0); init and finish anchor every warp anyway.
  __device__ __forceinline__ void anchor() {
    if (last_ != 0) {
      const ClockPair a = clock_pair();
      constexpr uint32_t kHigh = (1u << kMetaKindShift) - 1;  // the meta bits under the kind: clock bits 59..32
      store(next_, uint32_t(a.clk), (uint32_t(kKindAnchor) << kMetaKindShift) | (uint32_t(a.clk >> 32) & kHigh));
      store(next_ + 1, uint32_t(a.gt), (uint32_t(kKindAnchorNs) << kMetaKindShift) | (uint32_t(a.gt >> 32) & kHigh));
    }
    next_ += 2;
  }

  // Close the region: how many slots were attempted (the decoder derives drops from it) and the
  // end anchor.
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
  static constexpr uint32_t kHeaderSlots = sizeof(RegionHeader) / sizeof(Record8);  // 8: the header in slots
  static_assert(sizeof(RegionHeader) % sizeof(Record8) == 0, "slot arithmetic: the region header is whole slots");

  __device__ __forceinline__ RegionHeader* region_header() const { return reinterpret_cast<RegionHeader*>(base_); }

  // One 8-byte slot store at min(slot, last_): a full region clamps into its last slot (the
  // overflow sink), so no record compares against the capacity.
  __device__ __forceinline__ void store(uint32_t slot, uint32_t lo, uint32_t hi) const {
    const uint64_t dst = __cvta_generic_to_global(base_) + uint64_t(min(slot, last_)) * sizeof(Record8);
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(dst), "r"(lo), "r"(hi));
  }

  // One record (format 3): a clock64 read and one 8-byte store to min(next_, last_), {clock64 bits
  // 31..0, kind | id | payload}, on lane 0 of a warp that owns a region (last_ != 0); a 32-bit
  // payload of a phase whose registry says so adds a PAYLOAD slot {payload, PAYLOAD | id}. last_
  // is set at init and left alone until finish, so ptxas if-converts the record into instructions
  // predicated on one loop-invariant predicate (no compare per record; format 1's bound
  // predicate put a 13-cycle ISETP latency in front of every store). A narrow payload is
  // saturated (one VIMNMX; none for a constant). With recording off at run time (null buffer) or
  // on lanes 1..31 the predicate is false: the instructions issue but read no timer and store
  // nothing. History (benchmarks/NOTES.md): C++ branches 83 cycles a record; globaltimer + bound
  // predicate 37-42; a deferred store 78-85; format 2 (16-byte store, clock64) 28.65 / 36.4 on
  // 1x1 / 132x4, of which the 16-byte store alone 25.2 / 27.95 and an 8-byte one 19.2 / 20.7.
  template <class Id>
  __device__ __forceinline__ void put(uint8_t kind, Id id, uint32_t payload) {
    EPSCOPE_REQUIRE_ENUM(Id);
    const bool wide = payload_wide(id);  // the family's registry, through ADL: a constant at most sites
    if (last_ != 0) {
      const uint64_t dst = __cvta_generic_to_global(base_) + uint64_t(min(next_, last_)) * sizeof(Record8);
      const uint32_t meta = record_head(kind, id) | min(payload, kMetaPayloadMax);
      asm volatile(
          "{\n\t"
          ".reg .b64 t;\n\t"
          ".reg .b32 lo, hi;\n\t"
          "mov.u64 t, %%clock64;\n\t"
          "mov.b64 {lo, hi}, t;\n\t"
          "st.global.v2.u32 [%0], {lo, %1};\n\t"
          "}"
          :
          : "l"(dst), "r"(meta));
      if (wide) store(next_ + 1, payload, record_head(kKindPayload, id));
    }
    next_ += wide ? 2u : 1u;  // counts drops too: nothing is dropped silently
  }

  // The whole state, 4 registers: this warp's region (2: a register, not the parameter bank, see
  // init), its next slot and its last slot. Format 1 kept 3 (the buffer from the parameter bank);
  // the first instrumented build kept 8, which cost EP copy loops registers (NOTES.md issue 9).
  char* base_ = nullptr;  // this warp's RegionHeader; its slots follow it
  uint32_t next_ = 0;  // slot (8-byte unit from base_) of this warp's next record; counts drops too
  uint32_t last_ = 0;  // this warp's last slot, the overflow sink; 0: off (lanes 1..31, no region, finished)
};

#else  // EPSCOPE_PROFILE == 0: off means off.

class WarpRecorder {
 public:
  __device__ __forceinline__ void init(void*) {}
  __device__ __forceinline__ void init(void*, uint32_t, uint32_t) {}
  template <class Id>
  __device__ __forceinline__ void begin(Id, uint32_t = 0) { EPSCOPE_REQUIRE_ENUM(Id); }
  template <class Id>
  __device__ __forceinline__ void end(Id, uint32_t = 0) { EPSCOPE_REQUIRE_ENUM(Id); }
  template <class Id>
  __device__ __forceinline__ void instant(Id, uint32_t = 0) { EPSCOPE_REQUIRE_ENUM(Id); }
  template <class Id>
  __device__ __forceinline__ void arrive(Id, uint32_t) { EPSCOPE_REQUIRE_ENUM(Id); }
  template <class Id>
  __device__ __forceinline__ void depart(Id, uint32_t) { EPSCOPE_REQUIRE_ENUM(Id); }
  __device__ __forceinline__ void anchor() {}
  __device__ __forceinline__ void finish() {}
};

#endif  // EPSCOPE_PROFILE

}  // inline namespace EPSCOPE_VARIANT_NS

#endif  // __CUDACC__

static_assert(sizeof(Record8) == 8, "one record is one 8-byte store");

}  // namespace epscope
