// Device helpers shared by the low-latency dispatch and combine kernels: the op's epoch taken on
// the device, bounded waits, the work split (seed 002's knobs 1 and 3), the completion barriers
// (knob 2) and the error record. No torch here (style rule 4).
//
// Protocol of one op (epoch n, buffer half h = n & 1), for every pair (writer w, reader r):
//   w waits credit[h][r] (in w's buffer) >= n - 2   r finished reading half h of op n - 2
//   w writes its rows / routing / partials into r's half h
//   w's send_done barrier, its last arrival: data_flag[h][w] := n in every r's buffer (release)
//   r waits data_flag[h][w] >= n, reads, and after its recv_done barrier posts credit[h][r] := n
//   in every w's buffer. Flags hold epochs and are never reset: a wait is "reached(flag, n)",
//   wrap-safe. The two halves let op n + 1 proceed while a peer still reads op n (a recv hook).
#pragma once
#include <cstdint>

#include "ep_core/csrc/common.cuh"
#include "ep_core/csrc/low_latency.cuh"

#include "ep_core/csrc/generated/ep_low_latency_phases.cuh"

namespace ep_core {
namespace low_latency {

namespace llph = epscope::phases::ep_low_latency;

constexpr uint32_t kFullMask = 0xffffffffu;

// "v has reached target" on 32-bit epochs that wrap (serial-number arithmetic: flags of a half
// are at most a few ops apart).
__device__ __forceinline__ bool reached(int v, int target) { return int(unsigned(v) - unsigned(target)) >= 0; }

template <typename T>
__device__ __forceinline__ T* at(char* base, int64_t off) {
  return reinterpret_cast<T*>(base + off);
}

__device__ __forceinline__ int lane_id() { return int(threadIdx.x % 32); }
__device__ __forceinline__ int warp_in_block() { return int(threadIdx.x / 32); }
__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// ---- memory operations ---------------------------------------------------------------------
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_volatile(int* p, int v) {
  asm volatile("st.volatile.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Data a peer wrote into this rank's buffer during the kernel (read after an acquire): cached in
// L2 only, so no stale L1 line can answer.
__device__ __forceinline__ int4 ld_cg(const int4* p) {
  int4 v;
  asm volatile("ld.global.cg.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ int ld_cg(const int* p) {
  int v;
  asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
// A load the compiler may not move across other memory operations: how the "in order" variant
// of knob 4 keeps each load right before its use (the dependent loop seed 002 describes; left to
// itself, the compiler could overlap some of them).
__device__ __forceinline__ int64_t ld_in_order(const int64_t* p) {
  int64_t v;
  asm volatile("ld.global.nc.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int4 ld_in_order(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)
               : "memory");
  return v;
}
// (routing records a peer wrote during the kernel: L2 only, like ld_cg)
__device__ __forceinline__ int ld_in_order(const int* p) {
  int v;
  asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ---- one op: where this launch is ------------------------------------------------------------
struct Op {
  char* own;          // this rank's buffer
  int rank, num_ranks;
  int epoch, half;
  int64_t half_off;   // byte offset of half h
};

// The op's epoch, taken on the device (a CUDA graph replays kernel arguments, so a host-given
// epoch would be frozen). Every block's thread 0 reads `seq` and takes a ticket; the last block
// to take one stores seq + 1 and resets the tickets, after every block has read seq (its ticket
// add has release semantics), so no block sees the new value. One atomic per block.
__device__ __forceinline__ int take_epoch(char* own, int64_t seq_off, int64_t tickets_off) {
  int* seq = at<int>(own, seq_off);
  int* tickets = at<int>(own, tickets_off);
  const int n = ld_volatile(seq) + 1;
  const int t = atom_add_acq_rel_gpu(tickets, 1);
  if (t == int(gridDim.x) - 1) {
    st_volatile(seq, n);
    st_volatile(tickets, 0);
  }
  return n;
}

// ---- errors and bounded waits ----------------------------------------------------------------
// The first failure of the buffer fills the host-mapped record; later ones keep the first cause.
__device__ __forceinline__ void report(const Fail& f, const Layout& L, const Op& op, int code, int phase, int is_barrier,
                                       int channel, int peer) {
  if (atomicCAS(at<int>(op.own, L.claim), 0, 1) == 0) {
    volatile ErrorInfo* e = f.err;
    e->rank = f.rank;
    e->kernel = f.kernel;
    e->phase = phase;
    e->is_barrier = is_barrier;
    e->channel = channel;
    e->peer = peer;
    e->epoch = op.epoch;
    __threadfence_system();
    e->flag = code;
    __threadfence_system();
  }
}

// One thread spins until *p reaches target (acquire, system scope: peers write it over NVLink),
// bounded by %globaltimer. Gives up at once when another warp of this rank already aborted the
// op (abort == epoch), so a missing peer costs one timeout, not one per warp.
__device__ __forceinline__ bool spin_reached(const int* p, int target, const Fail& f, const Layout& L, const Op& op) {
  if (reached(ld_acquire_sys(p), target)) return true;
  int* abort = at<int>(op.own, L.abort);
  const uint64_t start = epscope::globaltimer();
  uint32_t spins = 0;
  while (true) {
    if (reached(ld_acquire_sys(p), target)) return true;
    if ((++spins & 63u) == 0) {
      if (ld_volatile(abort) == op.epoch) return false;
      if (epscope::globaltimer() - start > f.timeout_ns) {
        atomicExch(abort, op.epoch);
        return false;
      }
    }
  }
}

// A warp waits for a flag (lane 0 spins; __syncwarp orders the other lanes' later loads after
// the acquire). Recorded as `phase` with payload `peer`; a timeout is reported and the span left
// open (the trace shows where the warp gave up).
__device__ __forceinline__ bool warp_wait(const int* p, int target, llph::Phase phase, int peer, const Fail& f,
                                          const Layout& L, const Op& op, epscope::WarpRecorder& rec) {
  rec.begin(phase, uint32_t(peer));
  int ok = 1;
  if (lane_id() == 0) {
    ok = spin_reached(p, target, f, L, op) ? 1 : 0;
    if (!ok) report(f, L, op, kErrTimeout, phase, 0, -1, peer);
  }
  ok = __shfl_sync(kFullMask, ok, 0);
  __syncwarp();
  if (ok) rec.end(phase, uint32_t(peer));
  return ok != 0;
}

// A warp's flags already seen this op, one bit per rank: each flag is waited for once per warp.
struct SeenFlags {
  uint32_t bits = 0;
  __device__ __forceinline__ bool has(int r) const { return (bits >> r) & 1u; }
  __device__ __forceinline__ void add(int r) { bits |= 1u << r; }
};

// Wait for `r`'s flag `flags[half][r]` to reach `target`, once per warp and op.
__device__ __forceinline__ bool wait_flag_once(SeenFlags& seen, int r, const int* flag, int target, llph::Phase phase,
                                               const Fail& f, const Layout& L, const Op& op,
                                               epscope::WarpRecorder& rec) {
  if (seen.has(r)) return true;
  if (!warp_wait(flag, target, phase, r, f, L, op, rec)) return false;
  seen.add(r);
  return true;
}

__device__ __forceinline__ int* flag_of(char* base, int64_t array_off, int half, int r) {
  return at<int>(base, array_off) + half * kMaxRanks + r;
}

// The writer's check before its first store into reader r's half h of op n.
__device__ __forceinline__ bool wait_credit(SeenFlags& seen, int r, const Fail& f, const Layout& L, const Op& op,
                                            epscope::WarpRecorder& rec) {
  return wait_flag_once(seen, r, flag_of(op.own, L.credit, op.half, r), op.epoch - 2, llph::kWaitCredit, f, L, op,
                        rec);
}

// ---- the work split (knobs 1 and 3) ----------------------------------------------------------
// `items` (tokens) of `groups` 128-element groups each, plus `duties` warps with one special job
// each (router, expert bookkeeping), spread over the grid's warps. Global warp index
// g = warp * num_blocks + block, so consecutive tasks land on different SMs.
//   flat: task i = (item i / S, slice i % S) goes to warp (duties + i) mod W; S = min(ceil(W /
//         items), groups / min_slice_groups), at least 1 (knob 3: min_slice_groups = 1 is the
//         finest split). The tasks start after the duty warps: a router (7 us at 128 tokens at
//         418ddf3) no longer delays a send task of its own, which held the send_done barrier.
//   per block (the old split): block b owns items [b * ipb, (b + 1) * ipb), ipb = ceil(items / B);
//         its warps take whole items in turn.
// Duty d is done by warp g = d in both. The warps with work (flat: g < min(W, duties + tasks))
// are a prefix of each block's warps and the blocks with work a prefix of the grid, so the
// barriers can count them without a pass.
struct Split {
  int items, groups, slices, duties;
  int num_blocks, wpb;
  bool flat;
  int ipb;

  __device__ __forceinline__ int warps() const { return num_blocks * wpb; }
  __device__ __forceinline__ int tasks() const { return flat ? items * slices : items; }
  __device__ __forceinline__ int slice_begin(int j) const { return j * groups / slices; }

  __device__ __forceinline__ int items_in_block(int b) const {
    const int lo = b * ipb;
    return max(0, min(items, lo + ipb) - lo);
  }
  // warps of block b with a task or a duty (a prefix of the block)
  // flat: warps g < flat_workers() have a duty or a task (duty warps first, then the tasks)
  __device__ __forceinline__ int flat_workers() const { return min(warps(), duties + tasks()); }
  __device__ __forceinline__ int block_workers(int b) const {
    if (flat) {
      const int n = flat_workers();
      return b < n ? min(wpb, (n - b + num_blocks - 1) / num_blocks) : 0;
    }
    const int duty = b < duties ? min(wpb, (duties - b + num_blocks - 1) / num_blocks) : 0;
    return max(duty, min(wpb, items_in_block(b)));
  }
  // blocks with a task or a duty (a prefix of the grid)
  __device__ __forceinline__ int working_blocks() const {
    if (flat) return min(num_blocks, flat_workers());
    const int task = items > 0 ? min(num_blocks, (items + ipb - 1) / ipb) : 0;
    return max(min(num_blocks, duties), task);
  }
};

__device__ __forceinline__ Split make_split(int items, int groups, int duties, const Knobs& k, int num_blocks,
                                            int wpb) {
  Split s{};
  s.items = items;
  s.groups = groups;
  // Warp 0 of block 0 always counts as a worker: a phase with nothing to do on this rank (a
  // combine receive of zero tokens) still arrives once, so its last arrival posts the credits.
  s.duties = max(duties, 1);
  s.num_blocks = num_blocks;
  s.wpb = wpb;
  s.flat = k.flat_split != 0;
  s.slices = 1;
  if (s.flat && items > 0) {
    const int want = (num_blocks * wpb + items - 1) / items;
    const int cap = max(1, groups / max(1, k.min_slice_groups));
    s.slices = max(1, min(want, cap));
  }
  s.ipb = max(1, (items + num_blocks - 1) / max(1, num_blocks));
  return s;
}

// One task of a warp: item and its group range [g0, g1).
struct Task {
  int item, g0, g1;
};

// The tasks of warp (block b, warp w): call first(), then next() while valid.
struct TaskIter {
  const Split& s;
  int cur, end, step;
  __device__ __forceinline__ TaskIter(const Split& sp, int b, int w) : s(sp) {
    if (sp.flat) {
      const int W = sp.warps();
      cur = (w * sp.num_blocks + b + W - sp.duties % W) % W;  // task i on warp (duties + i) mod W
      end = sp.tasks();
      step = W;
    } else {
      cur = b * sp.ipb + w;
      end = b * sp.ipb + sp.items_in_block(b);
      step = sp.wpb;
    }
  }
  __device__ __forceinline__ bool valid() const { return cur < end; }
  __device__ __forceinline__ Task task() const {
    if (!s.flat) return Task{cur, 0, s.groups};
    const int j = cur % s.slices;
    return Task{cur / s.slices, s.slice_begin(j), s.slice_begin(j + 1)};
  }
  __device__ __forceinline__ void next() { cur += step; }
};

// ---- completion barriers (knob 2) --------------------------------------------------------------
// named barrier `id` over the first `nwarps` warps of the block, OR-reducing `pred`
template <int kId>
__device__ __forceinline__ bool block_bar_or(int nwarps, bool pred) {
  static_assert(kId >= 1 && kId < 16, "named barrier ids 1..15 (0 is __syncthreads)");
  uint32_t out;
  asm volatile(
      "{\n\t.reg .pred pi, po;\n\t"
      "setp.ne.u32 pi, %2, 0;\n\t"
      "bar.red.or.pred po, %3, %1, pi;\n\t"
      "selp.u32 %0, 1, 0, po;\n\t}"
      : "=r"(out)
      : "r"(nwarps * 32), "r"(pred ? 1u : 0u), "n"(kId)
      : "memory");
  return out != 0;
}

// The end of a phase: every writer of this rank has finished, then the last arrival's warp runs
// `on_last` (all 32 lanes: publish the data flags, or post the credits). `failed` (this warp gave
// up on a wait) keeps the op from being published: the peers then time out naming this rank, and
// never read half-written rows.
//   count_working: only warps with work arrive (named barrier kId over the block's workers; each
//     phase of a launch has its own id, so a warp that skipped one phase cannot join the other's
//     barrier), one atomic per block with workers, nobody waits for the grid: arrive and leave.
//   all: every warp of every block arrives and waits until the whole grid has (a grid barrier,
//     the way a generic barrier counts), then leaves.
// Recorded as arrive / depart of `barrier_id` with the epoch as occurrence.
template <int kId, typename OnLast>
__device__ __forceinline__ void completion_barrier(const Split& s, const Knobs& k, bool failed, int64_t done_off,
                                                   int64_t gen_off, llph::Barrier barrier_id, const Fail& f,
                                                   const Layout& L, const Op& op, epscope::WarpRecorder& rec,
                                                   OnLast on_last) {
  const int b = int(blockIdx.x), w = warp_in_block();
  int* done = at<int>(op.own, done_off);
  if (k.count_working) {
    const int workers = s.block_workers(b);
    if (w >= workers) return;  // no work, no arrival
    rec.arrive(barrier_id, uint32_t(op.epoch));
    const bool any_failed = block_bar_or<kId>(workers, failed);
    if (w == 0 && !any_failed) {  // warp 0 works whenever the block does (workers are a prefix)
      int last = 0;
      if (lane_id() == 0) {
        __threadfence_system();  // the block's stores (ordered before by the named barrier) reach the peers first
        last = atom_add_acq_rel_gpu(done, 1) == s.working_blocks() - 1;
        if (last) st_volatile(done, 0);
      }
      if (__shfl_sync(kFullMask, last, 0)) {
        __syncwarp();  // memory order: lane 0's acquire (the other blocks' arrivals) before every lane's release
        on_last();
      }
    }
    __syncwarp();
    rec.depart(barrier_id, uint32_t(op.epoch));
    return;
  }
  __shared__ int s_ok;
  rec.arrive(barrier_id, uint32_t(op.epoch));
  const bool any_failed = __syncthreads_or(failed);
  if (w == 0) {
    int ok = 0;
    if (!any_failed) {
      int* gen = at<int>(op.own, gen_off);
      int last = 0;
      if (lane_id() == 0) {
        __threadfence_system();
        last = atom_add_acq_rel_gpu(done, 1) == int(gridDim.x) - 1;
        if (last) st_volatile(done, 0);
      }
      last = __shfl_sync(kFullMask, last, 0);
      if (last) {
        __syncwarp();  // as above: lane 0's acquire before the other lanes' releases
        on_last();
        __syncwarp();
        if (lane_id() == 0) st_release_gpu(gen, op.epoch);
        ok = 1;
      } else if (lane_id() == 0) {
        ok = spin_reached(gen, op.epoch, f, L, op) ? 1 : 0;
        if (!ok) report(f, L, op, kErrTimeout, barrier_id, 1, b, op.rank);
      }
    }
    if (lane_id() == 0) s_ok = ok;
  }
  __syncthreads();
  if (s_ok) rec.depart(barrier_id, uint32_t(op.epoch));  // a timed-out barrier has no departure
}

// ---- per-128 FP8 cast (DeepEP's convention, ep_core/low_latency_reference.py mirrors it) ------
constexpr float kFP8Margin = 1e-4f;          // amax floor: an all-zero group stays finite
constexpr float kFP8Max = 448.0f;            // largest finite float8_e4m3fn
constexpr float kFP8MaxInv = 1.0f / 448.0f;

__device__ __forceinline__ float pow2_of(int e) { return __int_as_float((e + 127) << 23); }
// ceil(log2(x)) of a positive normal float, from its bits
__device__ __forceinline__ int log2_ceil(float x) {
  const uint32_t bits = __float_as_uint(x);
  return int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
}
// scale multiplies x into FP8 range; scale_inv is what the receiver multiplies back
__device__ __forceinline__ void fp8_scales(float amax, bool round_scale, float& scale, float& scale_inv) {
  if (round_scale) {
    const int e = log2_ceil(amax * kFP8MaxInv);
    scale = pow2_of(-e);
    scale_inv = pow2_of(e);
  } else {
    scale_inv = amax * kFP8MaxInv;
    scale = kFP8Max / amax;
  }
}

}  // namespace low_latency
}  // namespace ep_core
