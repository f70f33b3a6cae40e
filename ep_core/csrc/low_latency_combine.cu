// Low-latency combine: the expert rank reduces each token over its local experts and sends one
// partial row back; the token's rank sums the partials. Weighted: combined[t] =
// sum_k w[t, k] * y(expert k of t), fp32 accumulation in top-k order, BF16 out.
//
// Send half (op n, buffer half h = n & 1):
//   weights warps (one per destination d, warps g < R): this rank's top-k weights, 0 where the
//     index is -1 (at combine time), into cweights[h][me] of d, then cw_flag[h][me] = n on d.
//   partial tasks ((source s, token t), slice): the token's local experts and rows come from the
//     dispatch's handle (slot); acc = sum_k w[s][t][k] * x[row_k] in fp32 over the slice, sent to
//     s as BF16 (cpartials[h][me][t]).
//   send_done: the last arrival publishes data_flag[h][me] = n on every rank.
// Receive half: reduce tasks (own token t, slice): sum in fp32 the partials of every rank the
//   token went to (the handle's sent_mask), write BF16. recv_done posts the credits.
// The partials cross NVLink as BF16 (one row per token and expert rank instead of one per
// (token, expert)): each partial is rounded once more than a sum of the expert rows would be;
// tests/gpu/test_low_latency.py bounds the difference with DeepEP's own metric.
#include <cuda_bf16.h>

#include "ep_core/csrc/low_latency_device.cuh"

namespace ep_core {
namespace low_latency {
namespace {

// Expert rows a lane loads together before it uses them (knob 4): 8 x 16 B in flight per lane,
// all of a top-8 token's experts.
constexpr int kExpertBatch = 8;
// (index, weight) pairs of this rank's top-k a lane loads together in send_weights
constexpr int kWeightsBatch = 8;

struct Ctx {
  const CombineArgs& a;
  const Layout& L;
  const PeerPtrs& peers;
  const Knobs& k;
  const Fail& f;
  Op op;
  int rows_per_expert;  // R * T_max

  __device__ __forceinline__ char* half_of(int r) const { return peers.base[r] + op.half_off; }
};

// acc += w * v, rounded twice (no fused multiply-add): the same arithmetic as the plain PyTorch
// reference (ep_core/low_latency_reference.py), so the tests compare combine bit for bit.
__device__ __forceinline__ void add_scaled_bf16x8(float (&acc)[8], const int4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(w, p.x));
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(w, p.y));
  }
}
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const int4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    acc[2 * i] = __fadd_rn(acc[2 * i], p.x);
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], p.y);
  }
}

__device__ __forceinline__ int4 to_bf16x8(const float (&acc)[8]) {
  int4 o;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return o;
}

// ---- send half -------------------------------------------------------------------------------
// This rank's weights (0 where the top-k index is -1) into expert rank d.
__device__ bool send_weights(const Ctx& c, int d, SeenFlags& credits, epscope::WarpRecorder& rec) {
  const CombineArgs& a = c.a;
  const int lane = lane_id(), K = a.num_topk;
  if (!wait_credit(credits, d, c.f, c.L, c.op, rec)) return false;
  rec.begin(llph::kWeights, uint32_t(d));
  float* dst = at<float>(c.half_of(d), c.L.cweights + int64_t(c.op.rank) * c.L.cw_stride);
  // kWeightsBatch entries a lane loads (index and weight, independent) before it stores any: the
  // one warp per destination took 5.4 us for 128 x 8 entries at 418ddf3, one load after another
  const int n = a.num_tokens * K;
  for (int i0 = lane; i0 < n; i0 += 32 * kWeightsBatch) {
    int64_t id[kWeightsBatch];
    float wv[kWeightsBatch];
#pragma unroll
    for (int u = 0; u < kWeightsBatch; ++u) {
      const int i = i0 + 32 * u;
      id[u] = i < n ? __ldg(a.topk_idx + i) : -1;
      wv[u] = i < n ? __ldg(a.topk_weights + i) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kWeightsBatch; ++u) {
      const int i = i0 + 32 * u;
      if (i < n) dst[int64_t(i / K) * kMaxTopk + i % K] = id[u] >= 0 ? wv[u] : 0.f;
    }
  }
  __syncwarp();
  if (lane == 0) {
    __threadfence_system();
    st_release_sys(flag_of(c.peers.base[d], c.L.cw_flag, c.op.half, c.op.rank), c.op.epoch);
  }
  __syncwarp();
  rec.instant(llph::kPublishWeights, uint32_t(d));
  rec.end(llph::kWeights, uint32_t(d));
  return true;
}

// One slice of the partial row of (source s, token t) over this rank's experts of the token.
// kK: top-k entries a lane keeps in registers (8 or 16: the smallest that holds num_topk).
template <int kK>
__device__ bool partial(const Ctx& c, const Task& tk, SeenFlags& weights_seen, SeenFlags& credits,
                        epscope::WarpRecorder& rec) {
  const CombineArgs& a = c.a;
  const int R = c.op.num_ranks, me = c.op.rank, lane = lane_id(), K = a.num_topk;
  const int si = tk.item / a.max_tokens, t = tk.item % a.max_tokens;
  const int s = (me + si) % R;
  if (t >= a.recv_tokens[s]) return true;
  const int* slots = a.slot + (int64_t(s) * a.max_tokens + t) * K;
  int rid[kK];  // the token's row in each local expert (x's flattened rows), -1 for other ranks'
  bool any = false;
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    rid[j] = j < K ? slots[j] : -1;
    any |= rid[j] >= 0;
  }
  if (!any) return true;
  if (!wait_flag_once(weights_seen, s, flag_of(c.op.own, c.L.cw_flag, c.op.half, s), c.op.epoch, llph::kWaitWeights,
                      c.f, c.L, c.op, rec))
    return false;
  if (!wait_credit(credits, s, c.f, c.L, c.op, rec)) return false;
  rec.begin(llph::kPartial, uint32_t(t));
  const float* wsrc = at<float>(c.op.own + c.op.half_off, c.L.cweights + int64_t(s) * c.L.cw_stride) +
                      int64_t(t) * kMaxTopk;
  float wk[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) wk[j] = rid[j] >= 0 ? ld_cg(wsrc + j) : 0.f;

  const int4* x = static_cast<const int4*>(a.x);
  const int64_t row_vecs = a.hidden / 8;          // int4 per BF16 row
  const int half = lane >> 4, chunk = lane & 15;  // a 128-element group is 16 lanes x 16 B, 2 a pass
  const int passes = (tk.g1 - tk.g0 + 1) / 2;
  int4* dst = reinterpret_cast<int4*>(c.half_of(s) + c.L.cpartials + int64_t(me) * c.L.cp_stride +
                                      int64_t(t) * 2 * a.hidden);
  for (int p = 0; p < passes; ++p) {
    const int g = tk.g0 + 2 * p + half;
    const bool active = g < tk.g1;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (c.k.loads_first) {
      // the rows of a batch of experts all in flight before the first multiply-add
#pragma unroll
      for (int j0 = 0; j0 < kK; j0 += kExpertBatch) {
        int4 v[kExpertBatch];
#pragma unroll
        for (int q = 0; q < kExpertBatch; ++q)
          v[q] = (active && rid[j0 + q] >= 0) ? ld_nc(x + int64_t(rid[j0 + q]) * row_vecs + g * 16 + chunk)
                                              : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int q = 0; q < kExpertBatch; ++q)
          if (rid[j0 + q] >= 0) add_scaled_bf16x8(acc, v[q], wk[j0 + q]);
      }
    } else if (active) {
      // each expert row loaded right before its multiply-add
#pragma unroll
      for (int j = 0; j < kK; ++j)
        if (rid[j] >= 0) add_scaled_bf16x8(acc, ld_in_order(x + int64_t(rid[j]) * row_vecs + g * 16 + chunk), wk[j]);
    }
    if (active) st_na(dst + g * 16 + chunk, to_bf16x8(acc));
  }
  rec.end(llph::kPartial, uint32_t(t));
  return true;
}

// ---- receive half ----------------------------------------------------------------------------
// One slice of this rank's token t: the sum of its partials from every rank it went to.
__device__ bool reduce(const Ctx& c, const Task& tk, SeenFlags& seen, epscope::WarpRecorder& rec) {
  const CombineArgs& a = c.a;
  const int R = c.op.num_ranks, lane = lane_id(), t = tk.item;
  const uint32_t mask = uint32_t(a.sent_mask[t]);
  for (uint32_t m = mask; m; m &= m - 1) {
    const int d = __ffs(m) - 1;
    if (!wait_flag_once(seen, d, flag_of(c.op.own, c.L.data_flag, c.op.half, d), c.op.epoch, llph::kWaitData, c.f,
                        c.L, c.op, rec))
      return false;
  }
  rec.begin(llph::kReduce, uint32_t(t));
  char* base = c.op.own + c.op.half_off;
  const int half = lane >> 4, chunk = lane & 15;
  const int passes = (tk.g1 - tk.g0 + 1) / 2;
  int4* out = static_cast<int4*>(a.out) + int64_t(t) * (a.hidden / 8);
  for (int p = 0; p < passes; ++p) {
    const int g = tk.g0 + 2 * p + half;
    if (g >= tk.g1) continue;
    int4 v[kMaxRanks];
    // every rank's partial in flight before the sum (a reduction needs them all anyway)
#pragma unroll
    for (int d = 0; d < kMaxRanks; ++d)
      v[d] = (d < R && ((mask >> d) & 1u))
                 ? ld_cg(reinterpret_cast<const int4*>(base + c.L.cpartials + int64_t(d) * c.L.cp_stride +
                                                       int64_t(t) * 2 * a.hidden) + g * 16 + chunk)
                 : make_int4(0, 0, 0, 0);
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int d = 0; d < kMaxRanks; ++d)
      if (d < R && ((mask >> d) & 1u)) add_bf16x8(acc, v[d]);
    st_na(out + g * 16 + chunk, to_bf16x8(acc));
  }
  rec.end(llph::kReduce, uint32_t(t));
  return true;
}

__device__ __forceinline__ int open_op(char* own, const Layout& L, int phases) {
  if (phases == (kSendPhase | kRecvPhase)) {
    const int n = take_epoch(own, L.send_seq, L.send_tickets);
    return take_epoch(own, L.recv_seq, L.recv_tickets) == n ? n : 0;
  }
  if (phases == kSendPhase) return take_epoch(own, L.send_seq, L.send_tickets);
  const int n = take_epoch(own, L.recv_seq, L.recv_tickets);
  return reached(ld_volatile(at<int>(own, L.send_seq)), n) ? n : 0;
}

template <int kK>
__global__ void __launch_bounds__(kThreads, 1)
    combine_kernel(CombineArgs a, Layout L, PeerPtrs peers, int num_ranks, Knobs k, int phases, Fail f, void* prof) {
  __shared__ int s_epoch;
  epscope::WarpRecorder rec;
  rec.init(prof);
  char* own = peers.base[f.rank];
  if (threadIdx.x == 0) s_epoch = open_op(own, L, phases);
  __syncthreads();
  const int epoch = s_epoch;
  const Op op{own, f.rank, num_ranks, epoch, epoch & 1, L.half0 + int64_t(epoch & 1) * L.half_stride};
  if (epoch == 0) {  // the send and receive epochs disagree: an op's halves ran out of order
    if (threadIdx.x == 0) report(f, L, op, kErrProtocol, 0, 0, -1, f.rank);
    rec.finish();
    return;
  }
  const int groups = a.hidden / kGroup;
  const Ctx c{a, L, peers, k, f, op, num_ranks * a.max_tokens};
  const int B = int(gridDim.x), wpb = int(blockDim.x) / 32, b = int(blockIdx.x), w = warp_in_block();
  const int g = w * B + b;
  bool failed = false;

  if (phases & kSendPhase) {
    const Split sp = make_split(num_ranks * a.max_tokens, groups, num_ranks, k, B, wpb);
    SeenFlags credits, weights_seen;
    if (g < num_ranks) failed = !send_weights(c, g, credits, rec);
    for (TaskIter it(sp, b, w); !failed && it.valid(); it.next())
      failed = !partial<kK>(c, it.task(), weights_seen, credits, rec);
    completion_barrier<1>(sp, k, failed, L.send_done, L.send_gen, llph::kBarrierSendDone, f, L, op, rec, [&] {
      const int lane = lane_id();
      if (lane < num_ranks) st_release_sys(flag_of(peers.base[lane], L.data_flag, op.half, op.rank), op.epoch);
      __syncwarp();
      for (int r = 0; r < num_ranks; ++r) rec.instant(llph::kPublish, uint32_t(r));
    });
  }
  if (phases & kRecvPhase) {
    const Split sp = make_split(a.num_tokens, groups, 0, k, B, wpb);
    SeenFlags seen;
    for (TaskIter it(sp, b, w); !failed && it.valid(); it.next()) failed = !reduce(c, it.task(), seen, rec);
    completion_barrier<2>(sp, k, failed, L.recv_done, L.recv_gen, llph::kBarrierRecvDone, f, L, op, rec, [&] {
      const int lane = lane_id();
      if (lane < num_ranks) st_release_sys(flag_of(peers.base[lane], L.credit, op.half, op.rank), op.epoch);
      __syncwarp();
      for (int r = 0; r < num_ranks; ++r) rec.instant(llph::kPostCredit, uint32_t(r));
    });
  }
  rec.finish();
}

}  // namespace

cudaError_t combine(const CombineArgs& a, const Layout& L, const PeerPtrs& peers, int num_ranks, const Knobs& k,
                    const Geometry& g, int phases, const Fail& f, void* prof, cudaStream_t stream) {
  if (num_ranks < 1 || num_ranks > kMaxRanks || a.num_experts < num_ranks || a.num_experts % num_ranks != 0 ||
      a.num_experts / num_ranks > kMaxLocalExperts || a.hidden <= 0 || a.hidden % kGroup != 0 ||
      a.hidden > kMaxHidden || a.num_topk < 1 || a.num_topk > kMaxTopk || a.max_tokens < 1 ||
      a.max_tokens > kMaxTokens || a.num_tokens < 0 || a.num_tokens > a.max_tokens || a.x == nullptr ||
      (a.num_tokens > 0 && (a.topk_idx == nullptr || a.topk_weights == nullptr || a.out == nullptr)) ||
      a.slot == nullptr || a.recv_tokens == nullptr || a.sent_mask == nullptr ||
      !layout_ok(L, num_ranks, a.max_tokens, a.hidden, a.num_experts / num_ranks) || !launch_ok(k, g, num_ranks, phases))
    return cudaErrorInvalidValue;
  const dim3 grid(g.num_blocks), block(g.warps_per_block * 32);
  if (a.num_topk <= 8)
    combine_kernel<8><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  else
    combine_kernel<kMaxTopk><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  return cudaGetLastError();
}

}  // namespace low_latency
}  // namespace ep_core
