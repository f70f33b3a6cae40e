// Shared device helpers of ep_core's intranode kernels: system-scope signals, bounded waits,
// error reporting, the cross-rank barrier. No torch here (style rule 4).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "ep_core/csrc/buffer_map.h"

#include "profiler/csrc/recorder.cuh"
#include "ep_core/csrc/generated/ep_intranode_phases.cuh"

namespace ep_core {

namespace ph = epscope::phases::ep_intranode;

__device__ __forceinline__ Signals* signals(char* base) { return reinterpret_cast<Signals*>(base); }
__device__ __forceinline__ LayoutSlot* layout_slot(char* base, int src) {
  return reinterpret_cast<LayoutSlot*>(base + kSignalsBytes) + src;
}

// ---- memory ordering (PTX ISA memory model, .sys scope because peers write over NVLink) ----
__device__ __forceinline__ int ld_acquire_sys(const int* p) {
  int v;
  asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(int* p, int v) {
  asm volatile("st.release.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_volatile(const int* p) {
  int v;
  asm volatile("ld.volatile.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Input tensors are read-only for a kernel's lifetime: the non-coherent path, no L1 allocation.
__device__ __forceinline__ int4 ld_nc(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Rows a peer wrote during this kernel (after an acquire): coherent load, no L1 allocation.
__device__ __forceinline__ int4 ld_peer_written(const int4* p) {
  int4 v;
  asm volatile("ld.global.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_na(int4* p, const int4& v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// The op's epoch, on the device (FailCtx::op_epoch). open_op is called by every thread of the
// kernel that opens an op (notify, or the bare barrier before a cached dispatch / combine): all
// threads read the last epoch, then thread 0 stores the new one after a block barrier, so no
// thread reads the incremented value. Later kernels of the same op (dispatch, combine) run after
// it in stream order and read it with current_op. Both keep a host-given epoch when op_epoch is
// null. Kernels that open an op must run as a single block (notify and barrier do).
__device__ __forceinline__ FailCtx open_op(FailCtx f) {
  if (f.op_epoch == nullptr) return f;
  f.epoch = ld_volatile(f.op_epoch) + 1;
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile int*>(f.op_epoch) = f.epoch;
  return f;
}
__device__ __forceinline__ FailCtx current_op(FailCtx f) {
  if (f.op_epoch != nullptr) f.epoch = ld_volatile(f.op_epoch);
  return f;
}

// Record the first error of this rank; later failures keep the first cause. The claim is an
// atomic on device memory (atomics on host-mapped memory need hostNativeAtomicSupported, which
// x86 hosts lack); the record itself is written with plain volatile stores, flag last.
__device__ __forceinline__ void report_error(const FailCtx& f, int code, int phase, int is_barrier, int channel,
                                             int peer) {
  if (atomicCAS(f.claim, 0, 1) == 0) {
    volatile ErrorInfo* e = f.err;
    e->rank = f.rank;
    e->kernel = f.kernel;
    e->phase = phase;
    e->is_barrier = is_barrier;
    e->channel = channel;
    e->peer = peer;
    e->epoch = f.epoch;
    __threadfence_system();
    e->flag = code;
    __threadfence_system();
  }
}

// Spin until *p >= target, bounded by %globaltimer. Gives up early when another warp of this
// rank already aborted this op (abort_epoch == epoch), so one missing peer costs one timeout,
// not one per chunk. Returns false on timeout / abort; the caller reports and unwinds.
__device__ __forceinline__ bool wait_geq(const int* p, int target, const FailCtx& f, int* abort_epoch) {
  if (ld_acquire_sys(p) >= target) return true;
  const uint64_t start = epscope::globaltimer();
  uint32_t spins = 0;
  while (true) {
    if (ld_acquire_sys(p) >= target) return true;
    if ((++spins & 63u) == 0) {
      if (ld_volatile(abort_epoch) == f.epoch) return false;
      if (epscope::globaltimer() - start > f.timeout_ns) {
        atomicMax(abort_epoch, f.epoch);
        return false;
      }
    }
  }
}

// Cross-rank barrier of one block: threads 0..R-1 signal peer `tid` and wait for peer `tid`.
// Every warp records arrive/depart with the op's epoch as occurrence (same value on all ranks,
// so the analyses match one occurrence across ranks). Returns false on timeout.
template <int kNumRanks>
__device__ __forceinline__ bool rank_barrier(const PeerPtrs& peers, int slot, ph::Barrier barrier_id,
                                             const FailCtx& f, epscope::WarpRecorder& rec) {
  rec.arrive(barrier_id, static_cast<uint32_t>(f.epoch));
  __syncthreads();  // every thread's earlier peer stores precede the release below
  bool ok = true;
  const int t = threadIdx.x;
  Signals* own = signals(peers.base[f.rank]);
  if (t < kNumRanks) {
    st_release_sys(&signals(peers.base[t])->barrier[slot][f.rank], f.epoch);
    ok = wait_geq(&own->barrier[slot][t], f.epoch, f, &own->abort_epoch);
    if (!ok) report_error(f, 1, barrier_id, 1, slot, t);
  }
  ok = __syncthreads_and(ok);
  if (ok) rec.depart(barrier_id, static_cast<uint32_t>(f.epoch));  // a timed-out barrier has no departure
  return ok;
}

}  // namespace ep_core

// Runtime rank count -> template argument, in one place (style rule 5).
#define EP_SWITCH_RANKS(num_ranks, ...)                                  \
  switch (num_ranks) {                                                   \
    case 1: { constexpr int kR = 1; __VA_ARGS__; break; }                \
    case 2: { constexpr int kR = 2; __VA_ARGS__; break; }                \
    case 3: { constexpr int kR = 3; __VA_ARGS__; break; }                \
    case 4: { constexpr int kR = 4; __VA_ARGS__; break; }                \
    case 5: { constexpr int kR = 5; __VA_ARGS__; break; }                \
    case 6: { constexpr int kR = 6; __VA_ARGS__; break; }                \
    case 7: { constexpr int kR = 7; __VA_ARGS__; break; }                \
    case 8: { constexpr int kR = 8; __VA_ARGS__; break; }                \
    default: return cudaErrorInvalidValue;                               \
  }
