// notify: the count exchange before a dispatch, and the bare start barrier.
//
// One block per rank. After the rank_start barrier (nobody writes into a peer before every rank
// finished the previous op), the block counts its rows per destination and per token chunk,
// gives every token its row in each destination's stream (send_pos), writes its counts into its
// slot of every peer's buffer, passes the rank_layout barrier, then reads the slots of all
// sources: rank_prefix_matrix, per-source chunk prefixes and the per-local-expert counts.
// With those, dispatch writes each row straight to its final position (dispatch.cu).
#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"

namespace ep_core {
namespace notify {

constexpr int kWarps = kNotifyThreads / 32;

template <int kNumRanks>
__global__ void __launch_bounds__(kNotifyThreads, 1) notify_kernel(Args a, PeerPtrs peers, FailCtx f, void* prof) {
  // Per destination: chunk counts, then (in place) the exclusive prefix; [num_chunks] = total.
  __shared__ int s_prefix[kNumRanks][kMaxChunks + 1];
  f = open_op(f);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  epscope::WarpRecorder rec;
  rec.init(prof);

  if (!rank_barrier<kNumRanks>(peers, kSlotStart, ph::kBarrierRankStart, f, rec)) {
    rec.finish();
    return;
  }
  rec.begin(ph::kNotify, a.num_tokens);
  const int C = a.chunk_size, T = a.num_tokens, NC = a.num_chunks;

  // Pass 1: rows per (destination, chunk), one warp per chunk, ballots over 32 tokens.
  for (int c = warp; c < NC; c += kWarps) {
    int cnt[kNumRanks] = {};
    const int end = min((c + 1) * C, T);
    for (int base = c * C; base < end; base += 32) {
      const int t = base + lane;
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        cnt[d] += __popc(__ballot_sync(0xffffffffu, t < end && a.is_token_in_rank[int64_t(t) * kNumRanks + d]));
    }
    if (lane == 0)
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d) s_prefix[d][c] = cnt[d];
  }
  __syncthreads();
  if (tid < kNumRanks) {  // a thread per destination: exclusive scan over chunks
    int run = 0;
    for (int c = 0; c < NC; ++c) {
      const int v = s_prefix[tid][c];
      s_prefix[tid][c] = run;
      run += v;
    }
    s_prefix[tid][NC] = run;
  }
  __syncthreads();

  // Pass 2: each token's row in each destination's stream.
  for (int c = warp; c < NC; c += kWarps) {
    int run[kNumRanks];
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) run[d] = s_prefix[d][c];
    const int end = min((c + 1) * C, T);
    for (int base = c * C; base < end; base += 32) {
      const int t = base + lane;
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d) {
        const bool in = t < end && a.is_token_in_rank[int64_t(t) * kNumRanks + d];
        const uint32_t b = __ballot_sync(0xffffffffu, in);
        if (t < end) a.send_pos[int64_t(t) * kNumRanks + d] = in ? run[d] + __popc(b & ((1u << lane) - 1u)) : -1;
        run[d] += __popc(b);
      }
    }
  }

  // Own copy of the send prefixes (combine's reducer needs them) and this rank's slot in every
  // peer: its row counts to every rank, the peer's expert counts, its chunk prefix to that peer.
  const int experts_per_rank = a.num_experts / kNumRanks;
  for (int d = 0; d < kNumRanks; ++d) {
    LayoutSlot* slot = layout_slot(peers.base[d], f.rank);
    for (int c = tid; c <= NC; c += blockDim.x) {
      a.send_chunk_prefix[d * (kMaxChunks + 1) + c] = s_prefix[d][c];
      slot->chunk_prefix[c] = s_prefix[d][c];
    }
    for (int i = tid; i < experts_per_rank; i += blockDim.x)
      slot->expert_counts[i] = a.num_tokens_per_expert[d * experts_per_rank + i];
    if (tid < kNumRanks) slot->counts[tid] = s_prefix[tid][NC];
    if (tid == 0) slot->num_chunks = NC;
  }
  rec.end(ph::kNotify, a.num_tokens);

  if (!rank_barrier<kNumRanks>(peers, kSlotLayout, ph::kBarrierRankLayout, f, rec)) {
    rec.finish();
    return;
  }

  // Read what every source wrote here. Volatile loads: peers wrote these over NVLink.
  rec.begin(ph::kNotify, a.num_tokens);
  char* own = peers.base[f.rank];
  if (tid < kNumRanks * kNumRanks) {  // rank_prefix_matrix[i][j] = rows j receives from ranks 0..i
    const int i = tid / kNumRanks, j = tid % kNumRanks;
    int sum = 0;
    for (int s = 0; s <= i; ++s) {
      // counts of source s are in every buffer's slot s; read them from our own buffer
      sum += ld_volatile(&layout_slot(own, s)->counts[j]);
    }
    a.rank_prefix_matrix[tid] = sum;
  }
  for (int s = 0; s < kNumRanks; ++s) {
    const LayoutSlot* slot = layout_slot(own, s);
    const int nc = ld_volatile(&slot->num_chunks);
    if (tid == 0) a.recv_num_chunks[s] = nc;
    for (int c = tid; c <= nc; c += blockDim.x)
      a.recv_chunk_prefix[s * (kMaxChunks + 1) + c] = ld_volatile(&slot->chunk_prefix[c]);
  }
  for (int i = tid; i < experts_per_rank; i += blockDim.x) {
    int sum = 0;
    for (int s = 0; s < kNumRanks; ++s) sum += ld_volatile(&layout_slot(own, s)->expert_counts[i]);
    const int al = a.expert_alignment;
    a.recv_info[1 + i] = (sum + al - 1) / al * al;
  }
  if (tid == 0) {
    int total = 0;
    for (int s = 0; s < kNumRanks; ++s) total += ld_volatile(&layout_slot(own, s)->counts[f.rank]);
    a.recv_info[0] = total;
  }
  rec.end(ph::kNotify, a.num_tokens);
  rec.finish();
}

template <int kNumRanks>
__global__ void __launch_bounds__(32, 1) barrier_kernel(PeerPtrs peers, FailCtx f, void* prof) {
  f = open_op(f);
  epscope::WarpRecorder rec;
  rec.init(prof);
  rank_barrier<kNumRanks>(peers, kSlotStart, ph::kBarrierRankStart, f, rec);
  rec.finish();
}

cudaError_t notify(const Args& a, const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof,
                   cudaStream_t stream) {
  if (a.num_chunks > kMaxChunks || a.num_experts > kMaxExperts) return cudaErrorInvalidValue;
  EP_SWITCH_RANKS(num_ranks, notify_kernel<kR><<<1, kNotifyThreads, 0, stream>>>(a, peers, f, prof));
  return cudaGetLastError();
}

cudaError_t barrier(const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof, cudaStream_t stream) {
  EP_SWITCH_RANKS(num_ranks, barrier_kernel<kR><<<1, 32, 0, stream>>>(peers, f, prof));
  return cudaGetLastError();
}

}  // namespace notify
}  // namespace ep_core
