// dispatch: every token row goes, in one NVLink pass, straight to its final row.
//
// notify gave each token its row in every destination's stream (send_pos) and every rank the
// full rank_prefix_matrix, so the receive region of a destination's buffer has exactly recv_x's
// layout (rows by source rank, then source token order). Blocks [0, num_sender_blocks) are
// senders: a block takes a chunk of this rank's tokens, each warp loads a token row once (16-byte
// vectors, kUnroll in flight per lane) and stores it to every destination it goes to: own-rank
// rows straight into recv_x, peer rows into the peer's buffer. Top-k ids are converted to the
// destination's local ids (or -1, weight 0) by the sender. When a chunk is written, one release
// store per destination publishes it (dispatch_ready[source][chunk] = epoch).
// The other blocks are receivers: per (source, chunk), wait for the counter (bounded), then copy
// the chunk's contiguous rows buffer -> recv_x while later chunks are still in flight.
#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"

namespace ep_core {
namespace dispatch {

constexpr int kWarps = kNumThreads / 32;
// 16-byte loads in flight per lane before the first store: 8 x 16 B x 512 threads = 64 KB per SM
// (v1 had 4: a 1-rank cached dispatch then moved only ~0.95 TB/s on 64 SMs, benchmarks/NOTES.md)
constexpr int kUnroll = 8;

__device__ __forceinline__ int prev_rows(const int* rpm, int src, int dst, int num_ranks) {
  return src > 0 ? rpm[(src - 1) * num_ranks + dst] : 0;
}

// Own-rank rows go to the output tensor, peer rows to the same region of the peer's buffer.
template <typename T>
__device__ __forceinline__ T* dst_ptr(void* own_out, const PeerPtrs& peers, size_t region, int d, int me) {
  return d == me ? static_cast<T*>(own_out) : reinterpret_cast<T*>(peers.base[d] + region);
}

template <int kNumRanks>
__device__ void send(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                     epscope::WarpRecorder& rec) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nvec = a.hidden_bytes / 16, ns = a.num_scales, K = a.num_topk;
  const int experts_per_rank = a.num_experts / kNumRanks;
  const int me = f.rank;
  int row_base[kNumRanks];
#pragma unroll
  for (int d = 0; d < kNumRanks; ++d) row_base[d] = prev_rows(a.rank_prefix_matrix, me, d, kNumRanks);

  for (int c = blockIdx.x; c < a.num_chunks; c += a.num_sender_blocks) {
    rec.begin(ph::kSendChunk, c);
    const int end = min((c + 1) * a.chunk_size, a.num_tokens);
    for (int t = c * a.chunk_size + warp; t < end; t += kWarps) {
      int row[kNumRanks];
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d) {
        const int pos = a.send_pos[int64_t(t) * kNumRanks + d];
        row[d] = pos < 0 ? -1 : row_base[d] + pos;
        if (d == me && row[d] >= a.recv_rows) {
          if (lane == 0) report_error(f, 3, ph::kSendChunk, 0, c, me);
          row[d] = -1;
        }
        if (d != me && row[d] >= 0) {
          if (a.skip_send) row[d] = -1;  // test hook: this rank never sends
          else if (row[d] >= rows.capacity) {
            if (lane == 0) report_error(f, 2, ph::kSendChunk, 0, c, d);
            row[d] = -1;
          }
        }
      }
      const int4* src = static_cast<const int4*>(a.x) + int64_t(t) * nvec;
      for (int i = lane; i < nvec; i += 32 * kUnroll) {
        int4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (i + u * 32 < nvec) v[u] = ld_nc(src + i + u * 32);
#pragma unroll
        for (int d = 0; d < kNumRanks; ++d) {
          if (row[d] < 0) continue;
          int4* dst = dst_ptr<int4>(a.recv_x, peers, rows.x, d, me) + int64_t(row[d]) * nvec + i;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u)
            if (i + u * 32 < nvec) st_na(dst + u * 32, v[u]);
        }
      }
      if (a.x_scales != nullptr) {
        for (int i = lane; i < ns; i += 32) {
          const float s = a.x_scales[int64_t(t) * a.scale_token_stride + int64_t(i) * a.scale_hidden_stride];
#pragma unroll
          for (int d = 0; d < kNumRanks; ++d)
            if (row[d] >= 0) dst_ptr<float>(a.recv_scales, peers, rows.scales, d, me)[int64_t(row[d]) * ns + i] = s;
        }
      }
      if (a.topk_idx != nullptr && lane < K) {
        const int64_t e = a.topk_idx[int64_t(t) * K + lane];
        const float w = a.topk_weights != nullptr ? a.topk_weights[int64_t(t) * K + lane] : 0.f;
#pragma unroll
        for (int d = 0; d < kNumRanks; ++d) {
          if (row[d] < 0) continue;
          const int64_t lo = int64_t(d) * experts_per_rank;
          const int64_t local = (e >= lo && e < lo + experts_per_rank) ? e - lo : -1;
          dst_ptr<int64_t>(a.recv_topk_idx, peers, rows.topk_idx, d, me)[int64_t(row[d]) * K + lane] = local;
          if (a.topk_weights != nullptr)
            dst_ptr<float>(a.recv_topk_weights, peers, rows.topk_weights, d, me)[int64_t(row[d]) * K + lane] =
                local >= 0 ? w : 0.f;
        }
      }
    }
    rec.end(ph::kSendChunk, c);
    __syncthreads();  // every warp's rows of chunk c precede the release below
    if (warp == 0 && !a.skip_send) {
      for (int d = 0; d < kNumRanks; ++d) {
        const int* pre = a.send_chunk_prefix + d * (kMaxChunks + 1);
        if (d == me || pre[c + 1] == pre[c]) continue;
        if (lane == 0) st_release_sys(&signals(peers.base[d])->dispatch_ready[me][c], f.epoch);
        rec.instant(ph::kPublishTail, d);
      }
    }
  }
}

template <int kNumRanks>
__device__ void receive(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                        epscope::WarpRecorder& rec) {
  if (kNumRanks == 1) return;
  __shared__ int s_ok;
  const int me = f.rank, tid = threadIdx.x;
  const int rb = blockIdx.x - a.num_sender_blocks, nrb = gridDim.x - a.num_sender_blocks;
  char* own = peers.base[me];
  Signals* sig = signals(own);
  int max_chunks = 0;
  for (int s = 0; s < kNumRanks; ++s)
    if (s != me) max_chunks = max(max_chunks, a.recv_num_chunks[s]);
  const int nvec = a.hidden_bytes / 16, ns = a.num_scales, K = a.num_topk;
  constexpr int kPeers = kNumRanks > 1 ? kNumRanks - 1 : 1;
  const int units = max_chunks * kPeers;
  // chunk-major order: early chunks of every source first, as the senders produce them
  for (int u = rb; u < units; u += nrb) {
    const int c = u / kPeers, si = u % kPeers;
    const int s = si < me ? si : si + 1;
    if (c >= a.recv_num_chunks[s]) continue;
    const int* pre = a.recv_chunk_prefix + s * (kMaxChunks + 1);
    const int cnt = pre[c + 1] - pre[c];
    if (cnt == 0) continue;
    const int row0 = prev_rows(a.rank_prefix_matrix, s, me, kNumRanks) + pre[c];
    rec.begin(ph::kWaitData, s);
    if (tid == 0) {
      bool ok = row0 + cnt <= rows.capacity && row0 + cnt <= a.recv_rows;
      if (!ok) report_error(f, row0 + cnt <= rows.capacity ? 3 : 2, ph::kCopyOut, 0, c, s);
      if (ok) {
        ok = wait_geq(&sig->dispatch_ready[s][c], f.epoch, f, &sig->abort_epoch);
        if (!ok) report_error(f, 1, ph::kWaitData, 0, c, s);
      }
      s_ok = ok;
    }
    __syncthreads();
    const bool ok = s_ok;
    if (!ok) break;  // no END: the trace keeps the wait open where this warp gave up
    rec.end(ph::kWaitData, s);
    rec.begin(ph::kCopyOut, c);
    {
      const int4* src = reinterpret_cast<const int4*>(own + rows.x) + int64_t(row0) * nvec;
      int4* dst = static_cast<int4*>(a.recv_x) + int64_t(row0) * nvec;
      const int64_t n = int64_t(cnt) * nvec;
      for (int64_t i = tid; i < n; i += int64_t(kNumThreads) * kUnroll) {
        int4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (i + u * kNumThreads < n) v[u] = ld_peer_written(src + i + u * kNumThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (i + u * kNumThreads < n) st_na(dst + i + u * kNumThreads, v[u]);
      }
    }
    if (a.recv_scales != nullptr) {
      const float* src = reinterpret_cast<const float*>(own + rows.scales) + int64_t(row0) * ns;
      float* dst = a.recv_scales + int64_t(row0) * ns;
      for (int i = tid; i < cnt * ns; i += kNumThreads) dst[i] = src[i];
    }
    if (a.recv_topk_idx != nullptr) {
      const int64_t* src = reinterpret_cast<const int64_t*>(own + rows.topk_idx) + int64_t(row0) * K;
      int64_t* dst = a.recv_topk_idx + int64_t(row0) * K;
      for (int i = tid; i < cnt * K; i += kNumThreads) dst[i] = src[i];
    }
    if (a.recv_topk_weights != nullptr) {
      const float* src = reinterpret_cast<const float*>(own + rows.topk_weights) + int64_t(row0) * K;
      float* dst = a.recv_topk_weights + int64_t(row0) * K;
      for (int i = tid; i < cnt * K; i += kNumThreads) dst[i] = src[i];
    }
    rec.end(ph::kCopyOut, c);
    __syncthreads();  // s_ok is rewritten by the next wait
  }
}

template <int kNumRanks>
__global__ void __launch_bounds__(kNumThreads, 1) dispatch_kernel(Args a, RowRegions rows, PeerPtrs peers, FailCtx f,
                                                                  void* prof) {
  f = current_op(f);  // the epoch the op's barrier / notify opened (common.cuh)
  epscope::WarpRecorder rec;
  rec.init(prof);
  if (int(blockIdx.x) < a.num_sender_blocks)
    send<kNumRanks>(a, rows, peers, f, rec);
  else
    receive<kNumRanks>(a, rows, peers, f, rec);
  rec.finish();
}

cudaError_t dispatch(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                     const FailCtx& f, void* prof, cudaStream_t stream) {
  if (a.hidden_bytes % 16 != 0 || a.num_chunks > kMaxChunks || a.num_topk > kMaxTopk || a.num_sender_blocks < 1 ||
      a.num_sender_blocks > num_blocks || (num_ranks > 1 && a.num_sender_blocks == num_blocks))
    return cudaErrorInvalidValue;
  EP_SWITCH_RANKS(num_ranks, dispatch_kernel<kR><<<num_blocks, kNumThreads, 0, stream>>>(a, rows, peers, f, prof));
  return cudaGetLastError();
}

}  // namespace dispatch
}  // namespace ep_core
