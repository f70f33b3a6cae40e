// Hopper bulk copies (cp.async.bulk, "TMA" without a tensor map) and the per-warp staging
// pipeline that dispatch.cu and combine.cu build their pipelined paths on. No torch (style 4).
//
// A pipeline warp owns kBuffers shared-memory staging buffers, each with one mbarrier. Lane 0
// loads item i (a row, or a piece of one) global -> shared into buffer i % kBuffers with one
// bulk copy that completes on that buffer's mbarrier, then issues the item's stores shared ->
// global (to the own output, a peer's buffer over NVLink, or both) as one bulk group. While those
// stores are in flight the next item is already loading into the next buffer. Seed 001 (DeepEP's
// triple-buffered NVLink dispatch) hard-coded "3 buffers, wait<1>" in one file and sized shared
// memory from another constant in another; here the buffer count is the one template parameter,
// the lookahead and the store-wait depth derive from it next to the invariant that makes buffer
// reuse safe, and the host sizes shared memory with the same `plan()` the kernel lays it out with.
#pragma once
#include <cstdint>
#include <mutex>

#include <cuda_runtime.h>

#include "profiler/csrc/recorder.cuh"

namespace ep_core {
namespace tma {

// cp.async.bulk: global and shared addresses and the size must be multiples of 16 B (PTX ISA,
// "Data Movement and Conversion Instructions: cp.async.bulk").
constexpr int kBulkAlign = 16;
// Staging buffers start on 128 B (a full L2 sector group; also keeps every mbarrier 8 B aligned).
constexpr int kSlotAlign = 128;
constexpr int kMinBuffers = 1;
constexpr int kMaxBuffers = 3;

// ---- the pipeline depth: everything derives from the buffer count ------------------------------
//
// Item i is consumed (its stores issued and committed as bulk group i) from buffer i % N. The
// load of item i + L (L = lookahead) goes into buffer (i + L) % N, whose last reader was the store
// group of item i + L - N. When that load is issued, groups 0 .. i-1 are committed, and
// `cp.async.bulk.wait_group.read D` leaves only the D youngest, i-D .. i-1, possibly still
// reading shared memory. Reuse is safe iff i + L - N < i - D, i.e. L + D < N. The tightest choice
// keeps the most stores in flight: D = N - 1 - L. With one buffer there is nothing to prefetch
// into (L = 0, D = 0: load, store, drain); with two or three the next item loads while the
// previous D items' stores drain (N = 3: L = 1, D = 1, seed 001's wait<1>).
template <int kBuffers>
struct Depth {
  static_assert(kBuffers >= kMinBuffers && kBuffers <= kMaxBuffers, "1..3 staging buffers per warp");
  static constexpr int kLookahead = kBuffers > 1 ? 1 : 0;      // items loading ahead of the one being stored
  static constexpr int kStoreWait = kBuffers - 1 - kLookahead;  // store groups left in flight at a refill
  static_assert(kLookahead + kStoreWait < kBuffers,
                "a staging buffer may be refilled only after its last store group finished reading it");
  static_assert(kStoreWait >= 0 && kLookahead >= 0, "depths are counts");
};

// ---- shared-memory plan: one function for the host (sizing) and the kernel (layout) -----------
//
// One warp's staging:  [buffer 0: sub 0 | sub 1 | ...][buffer 1: ...]...[mbarrier 0, 1, ...]
// A copy stages one piece per item (sub_slots = 1); combine's reducer stages the same piece of
// every rank's row (sub_slots = ranks). Rows are split into pieces until every warp of the block
// has its staging: a launched warp without staging never works, and the idle page rightly calls
// it starved (418ddf3 planned whole rows: 5 of 16 warps at N = 3, 8 of 16 in combine's reducers
// at N = 1; ep-ab-tma-buffers). Pieces are whole bulk copies still (>= 2 KB at hidden 7168).
struct Plan {
  int buffers;         // N: staging buffers per warp (the kernel's template parameter)
  int sub_slots;       // rows staged together in one buffer
  int row_bytes;       // bytes of one row (multiple of kBulkAlign)
  int piece_bytes;     // bytes of one staged piece (multiple of kBulkAlign, <= row_bytes)
  int pieces_per_row;  // ceil(row_bytes / piece_bytes)
  int slot_stride;     // bytes between sub-slots (piece_bytes rounded up to kSlotAlign)
  int warp_stride;     // bytes of one warp's staging, barriers included
  int warps;           // pipeline warps per block (0: the row cannot be staged at all)
  int smem_bytes;      // dynamic shared memory of one block
};

__host__ __device__ constexpr int round_up(int v, int a) { return (v + a - 1) / a * a; }
__host__ __device__ inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__host__ __device__ constexpr int warp_stride_of(int buffers, int sub_slots, int slot_stride) {
  return buffers * sub_slots * slot_stride + round_up(buffers * int(sizeof(uint64_t)), kSlotAlign);
}

// budget: dynamic shared memory a block may use (the device's opt-in limit minus the kernel's
// static shared memory); max_warps: warps of the block, all of them planned when 16-byte pieces
// allow it.
__host__ __device__ constexpr Plan plan(int buffers, int sub_slots, int row_bytes, int budget, int max_warps) {
  Plan p{buffers, sub_slots, row_bytes, 0, 0, 0, 0, 0, 0};
  if (buffers < kMinBuffers || buffers > kMaxBuffers || sub_slots < 1 || row_bytes <= 0 ||
      row_bytes % kBulkAlign != 0 || max_warps < 1)
    return p;
  for (int pieces = 1;; ++pieces) {
    const int piece = round_up((row_bytes + pieces - 1) / pieces, kBulkAlign);
    const int stride = warp_stride_of(buffers, sub_slots, round_up(piece, kSlotAlign));
    int warps = budget / stride;
    if (warps > max_warps) warps = max_warps;
    if (warps >= max_warps || piece == kBulkAlign) {
      if (warps < 1) return p;  // not even one warp of 16-byte pieces fits
      p.piece_bytes = piece;
      p.pieces_per_row = (row_bytes + piece - 1) / piece;
      p.slot_stride = round_up(piece, kSlotAlign);
      p.warp_stride = stride;
      p.warps = warps;
      p.smem_bytes = warps * stride;
      return p;
    }
  }
}

// Worked example, checked at compile time: a BF16 row of hidden 7168 (14336 B), 227 KB of shared
// memory (232448 B, the H100/H200 opt-in limit, 14528 B a warp), 16 warps: N = 1 stages whole
// rows, N = 2 halves, N = 3 quarters; combine's reducer on 2 ranks (two rows per buffer): halves
// at N = 1, quarters at N = 2, sevenths (2 KB) at N = 3; 8 ranks of hidden 8192 still stage.
static_assert(plan(1, 1, 14336, 232448, 16).warps == 16 && plan(1, 1, 14336, 232448, 16).pieces_per_row == 1, "");
static_assert(plan(2, 1, 14336, 232448, 16).warps == 16 && plan(2, 1, 14336, 232448, 16).pieces_per_row == 2, "");
static_assert(plan(3, 1, 14336, 232448, 16).warps == 16 && plan(3, 1, 14336, 232448, 16).pieces_per_row == 4, "");
static_assert(plan(1, 2, 14336, 232448, 16).warps == 16 && plan(1, 2, 14336, 232448, 16).pieces_per_row == 2, "");
static_assert(plan(2, 2, 14336, 232448, 16).warps == 16 && plan(2, 2, 14336, 232448, 16).pieces_per_row == 4, "");
static_assert(plan(3, 2, 14336, 232448, 16).warps == 16 && plan(3, 2, 14336, 232448, 16).pieces_per_row == 7, "");
static_assert(plan(3, 8, 16384, 232448, 16).warps == 16, "8 ranks of hidden 8192 still stage");

// ---- host: the budget a kernel may stage in, and the launch plan --------------------------------
//
// The dynamic shared memory a block of `kernel` may use on the current device: the device's
// opt-in limit minus the kernel's static shared memory. Queried once per (kernel, device): a
// launch then costs a table lookup, not two driver calls.
inline cudaError_t smem_budget(const void* kernel, int* budget) {
  struct Entry {
    const void* kernel;
    int device;
    int budget;
  };
  static Entry cache[64];
  static int used = 0;
  static std::mutex mu;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < used; ++i)
    if (cache[i].kernel == kernel && cache[i].device == dev) {
      *budget = cache[i].budget;
      return cudaSuccess;
    }
  int optin = 0;
  e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  cudaFuncAttributes attr{};
  e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return e;
  *budget = optin - int(attr.sharedSizeBytes);
  // raise the kernel's limit to the whole budget once: every plan of this kernel fits under it
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *budget);
  if (e != cudaSuccess) return e;
  if (used < 64) cache[used++] = Entry{kernel, dev, *budget};
  return cudaSuccess;
}

// The plan `kernel` is launched with: the same plan() the kernel lays its shared memory out by
// (it receives the Plan by value and checks it against its template parameter).
inline cudaError_t prepare(const void* kernel, int buffers, int sub_slots, int row_bytes, int max_warps, Plan* out) {
  int budget = 0;
  const cudaError_t e = smem_budget(kernel, &budget);
  if (e != cudaSuccess) return e;
  *out = plan(buffers, sub_slots, row_bytes, budget, max_warps);
  return out->warps >= 1 ? cudaSuccess : cudaErrorInvalidValue;
}

#ifdef __CUDACC__

// ---- PTX wrappers -------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the bulk-copy engine) before use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Bounded like every wait of ep_core: a copy that never lands (a bug, never a peer) gives up.
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, uint32_t parity, uint64_t timeout_ns) {
  if (mbar_try_wait(bar, parity)) return true;
  const uint64_t start = epscope::globaltimer();
  while (!mbar_try_wait(bar, parity))
    if (epscope::globaltimer() - start > timeout_ns) return false;
  return true;
}

// global -> shared, completing `bytes` of transaction count on `bar`.
__device__ __forceinline__ void load_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(smem_dst)),
               "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// shared -> global (own memory or a peer's, mapped over NVLink), in the current bulk group.
__device__ __forceinline__ void store_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem_dst), "r"(smem_u32(smem_src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// At most kGroups bulk groups may still be reading shared memory.
template <int kGroups>
__device__ __forceinline__ void wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kGroups) : "memory");
}
// At most kGroups bulk groups may still be incomplete (their global writes not yet performed).
template <int kGroups>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kGroups) : "memory");
}
// Orders the async proxy's global accesses with the generic proxy's (a release store after bulk
// stores; bulk loads after an acquire of data a peer wrote).
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// Generic-proxy writes to shared memory that a bulk store reads next.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }


__device__ __forceinline__ uint32_t dynamic_smem_size() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}
// The launch plan matches the kernel: its buffer count is the template parameter and the block
// got the shared memory the plan lays out.
template <int kBuffers>
__device__ __forceinline__ bool plan_fits(const Plan& p) {
  return p.buffers == kBuffers && p.warps >= 1 && p.warps * 32 <= int(blockDim.x) &&
         p.piece_bytes % kBulkAlign == 0 && p.slot_stride % kSlotAlign == 0 &&
         uint32_t(p.warps) * uint32_t(p.warp_stride) <= dynamic_smem_size();
}

// ---- splitting a block's unit of work over its pipeline warps -----------------------------------
//
// Units (a chunk, a (source, chunk) pair) go to blocks round-robin, so they finish in unit order
// and the receiving side starts on the first ones while later ones are in flight; each unit's
// items are split contiguously over the block's pipeline warps. The first version gave each warp
// whole units: with fewer units than warps (e.g. 118 chunks for 15 sender blocks x 16 warps at
// N = 1, 24 SMs) a third of the grid never got one, and every unit of a round finished together
// (recording ep-ab-tma-buffers-a0, benchmarks/NOTES.md issue 11).
struct Share {
  int64_t lo, hi;  // [lo, hi) of the unit's n items
};
__host__ __device__ constexpr Share share_of(int64_t n, int warp, int warps) {
  return Share{n * warp / warps, n * (warp + 1) / warps};
}
static_assert(share_of(35, 0, 16).hi == 2 && share_of(35, 15, 16).lo == 32 && share_of(35, 15, 16).hi == 35, "");
static_assert(share_of(3, 0, 16).hi == 0, "a warp may get nothing of a unit smaller than the block");

// Named barrier 1 over the block's first `warps` warps (the pipeline warps; the others have
// returned), OR-reducing `pred`. Like __syncthreads it orders each participant's earlier memory
// accesses before every participant's later ones: a unit's writers drain, meet here, and one
// thread then publishes the unit (the direct path's "__syncthreads, then release").
__device__ __forceinline__ bool pipe_warps_sync_or(int warps, bool pred) {
  uint32_t out;
  asm volatile(
      "{\n\t.reg .pred pi, po;\n\t"
      "setp.ne.u32 pi, %2, 0;\n\t"
      "bar.red.or.pred po, 1, %1, pi;\n\t"
      "selp.u32 %0, 1, 0, po;\n\t}"
      : "=r"(out)
      : "r"(warps * 32), "r"(pred ? 1u : 0u)
      : "memory");
  return out != 0;
}

// A contiguous copy, global -> global through the staging buffers, in pieces of at most
// `piece` bytes (dispatch's copy-out, combine's send). Offsets and sizes stay multiples of 16 B
// because `total` and `piece` are.
struct CopyStage {
  const char* src;
  char* dst;
  int64_t total;
  int piece;

  __device__ __forceinline__ int items() const { return int((total + piece - 1) / piece); }
  __device__ __forceinline__ uint32_t bytes(int i) const {
    const int64_t left = total - int64_t(i) * piece;
    return uint32_t(left < piece ? left : piece);
  }
  __device__ __forceinline__ void load(int i, char* buf, uint64_t* bar) const {
    load_g2s(buf, src + int64_t(i) * piece, bytes(i), bar);
  }
  __device__ __forceinline__ void consume(int i, char* buf) const {
    if ((threadIdx.x & 31u) == 0) store_s2g(dst + int64_t(i) * piece, buf, bytes(i));
  }
};

// ---- the per-warp pipeline ----------------------------------------------------------------------
//
// A Stage tells what one item is (all methods are called with the item index within the current
// unit):
//   uint32_t bytes(int i)                       lane 0: bytes item i loads (0: nothing to load)
//   void load(int i, char* buf, uint64_t* bar)  lane 0: issue the G2S copies of item i into buf
//                                               (sub-slot k at buf + k * slot_stride)
//   void consume(int i, char* buf)              all lanes, after the load landed: read buf and/or
//                                               issue (lane 0) the S2G stores of item i
// The pipeline commits one bulk group per item (empty ones included), so group k is item k of the
// warp's running sequence, which continues across units: a unit need not drain unless it must
// publish (`drain()`), and buffer reuse stays covered by the same wait depth.
template <int kBuffers>
class WarpPipe {
 public:
  using D = Depth<kBuffers>;

  // All lanes call; `warp_smem` is this warp's staging (warp_stride bytes).
  __device__ __forceinline__ void init(char* warp_smem, const Plan& p, uint64_t timeout_ns) {
    base_ = warp_smem;
    buf_stride_ = p.sub_slots * p.slot_stride;
    bars_ = reinterpret_cast<uint64_t*>(warp_smem + kBuffers * buf_stride_);
    timeout_ns_ = timeout_ns;
    seq_ = 0;
    if (lane() == 0) {
#pragma unroll
      for (int b = 0; b < kBuffers; ++b) mbar_init(&bars_[b], 1);
      fence_barrier_init();
    }
    __syncwarp();
  }

  // Runs items 0..n-1 of one unit. Returns false if a staged load did not land within the bound
  // (the caller reports and stops); the warp's sequence is then unusable.
  // A stall (item i had not landed when the warp reached it) is recorded as a `stall_phase` span
  // with payload i: the gaps that prefetching exists to close; a landed item records nothing.
  template <class Stage, class Phase>  // Phase: the kernel family's generated enum (the recorder needs its registry)
  __device__ __forceinline__ bool run(Stage& st, int n, epscope::WarpRecorder& rec, Phase stall_phase) {
    for (int k = 0; k < D::kLookahead && k < n; ++k) issue(st, k);
    for (int i = 0; i < n; ++i) {
      if (i + D::kLookahead < n) issue(st, i + D::kLookahead);
      const uint32_t a = seq_ + uint32_t(i);
      uint64_t* bar = &bars_[a % kBuffers];
      const uint32_t parity = (a / kBuffers) & 1u;
      // lane 0 decides, so the recorder calls stay warp-uniform; every lane then waits itself
      // (the barrier's phase completion is what makes the staged bytes visible to a lane)
      const bool landed = __shfl_sync(0xffffffffu, mbar_try_wait(bar, parity) ? 1 : 0, 0) != 0;
      if (!landed) rec.begin(stall_phase, uint32_t(i));
      if (!__all_sync(0xffffffffu, mbar_wait(bar, parity, timeout_ns_))) return false;
      if (!landed) rec.end(stall_phase, uint32_t(i));
      st.consume(i, buffer(a));
      if (lane() == 0) commit_group();
      __syncwarp();
    }
    seq_ += uint32_t(n);
    return true;
  }

  // Every store issued so far has been performed and is ordered before the caller's next generic
  // (release) store. Lane 0 issued them all; the other lanes' plain stores are ordered by the
  // __syncwarp.
  __device__ __forceinline__ void drain() {
    if (lane() == 0) {
      wait_group<0>();
      fence_async_global();
    }
    __syncwarp();
  }

  __device__ __forceinline__ int slot_stride() const { return buf_stride_; }

 private:
  static __device__ __forceinline__ uint32_t lane() { return threadIdx.x & 31u; }
  __device__ __forceinline__ char* buffer(uint32_t a) const { return base_ + (a % kBuffers) * buf_stride_; }

  template <class Stage>
  __device__ __forceinline__ void issue(Stage& st, int k) {
    if (lane() != 0) return;
    const uint32_t a = seq_ + uint32_t(k);
    wait_group_read<D::kStoreWait>();  // the buffer's last store group has finished reading it
    uint64_t* bar = &bars_[a % kBuffers];
    const uint32_t bytes = st.bytes(k);
    mbar_arrive_expect_tx(bar, bytes);  // 0 bytes: the phase completes at this arrival
    if (bytes > 0) st.load(k, buffer(a), bar);
  }

  char* base_ = nullptr;
  uint64_t* bars_ = nullptr;
  int buf_stride_ = 0;
  uint64_t timeout_ns_ = 0;
  uint32_t seq_ = 0;
};

#endif  // __CUDACC__

}  // namespace tma
}  // namespace ep_core
