// combine: the reverse of dispatch, summed in fp32.
//
// Senders (blocks [0, num_sender_blocks)) push, for every source rank s and every chunk c of s's
// tokens, the contiguous rows this rank received from s in dispatch back into s's buffer, at
// comb_off(s, this rank) + the row's index in the s -> this-rank stream, then release
// combine_ready[this rank][c] on s. Reducers (the other blocks) take this rank's token chunks,
// wait for every peer that holds rows of the chunk (bounded), and sum in fp32, per token, its
// rows from every rank it went to (its own rank's contribution read straight from the local
// input), plus the optional bias, writing bf16; the top-k weights are summed likewise.
#include <cuda_bf16.h>

#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"

namespace ep_core {
namespace combine {

constexpr int kWarps = kNumThreads / 32;
constexpr int kCopyUnroll = 8;     // 64 KB of loads in flight per SM (see dispatch.cu)
// 16-byte vectors per lane per source in flight; v[kNumRanks][unroll] int4 must stay in registers
template <int kNumRanks>
__host__ __device__ constexpr int reduce_unroll() { return kNumRanks <= 2 ? 4 : (kNumRanks <= 4 ? 2 : 1); }

__device__ __forceinline__ int prev_rows(const int* rpm, int src, int dst, int num_ranks) {
  return src > 0 ? rpm[(src - 1) * num_ranks + dst] : 0;
}
__device__ __forceinline__ int rows_between(const int* rpm, int src, int dst, int num_ranks) {
  return rpm[src * num_ranks + dst] - prev_rows(rpm, src, dst, num_ranks);
}
// First row, in s's combine region, of the rows rank d sends back to s: peers in rank order,
// s's own rows never travel.
template <int kNumRanks>
__device__ __forceinline__ int comb_off(const int* rpm, int s, int d) {
  int off = 0;
  for (int j = 0; j < d; ++j)
    if (j != s) off += rows_between(rpm, s, j, kNumRanks);
  return off;
}

__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const int4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

template <int kNumRanks>
__device__ void send(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                     epscope::WarpRecorder& rec) {
  if (kNumRanks == 1) return;
  constexpr int kPeers = kNumRanks > 1 ? kNumRanks - 1 : 1;
  const int me = f.rank, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int nvec = a.hidden * 2 / 16, K = a.num_topk;
  int max_chunks = 0;
  for (int s = 0; s < kNumRanks; ++s)
    if (s != me) max_chunks = max(max_chunks, a.recv_num_chunks[s]);
  const int units = max_chunks * kPeers;
  for (int u = blockIdx.x; u < units; u += a.num_sender_blocks) {
    const int c = u / kPeers, si = u % kPeers;
    const int s = si < me ? si : si + 1;
    if (c >= a.recv_num_chunks[s]) continue;
    const int* pre = a.recv_chunk_prefix + s * (kMaxChunks + 1);
    const int cnt = pre[c + 1] - pre[c];
    if (cnt == 0) continue;
    const int src_row = prev_rows(a.rank_prefix_matrix, s, me, kNumRanks) + pre[c];
    const int dst_row = comb_off<kNumRanks>(a.rank_prefix_matrix, s, me) + pre[c];
    if (dst_row + cnt > rows.capacity) {
      if (tid == 0) report_error(f, 2, ph::kSendChunk, 0, c, s);
      continue;
    }
    rec.begin(ph::kSendChunk, c);
    char* peer = peers.base[s];
    {
      const int4* src = static_cast<const int4*>(a.x) + int64_t(src_row) * nvec;
      int4* dst = reinterpret_cast<int4*>(peer + rows.x) + int64_t(dst_row) * nvec;
      const int64_t n = int64_t(cnt) * nvec;
      for (int64_t i = tid; i < n; i += int64_t(kNumThreads) * kCopyUnroll) {
        int4 v[kCopyUnroll];
#pragma unroll
        for (int k = 0; k < kCopyUnroll; ++k)
          if (i + k * kNumThreads < n) v[k] = ld_nc(src + i + k * kNumThreads);
#pragma unroll
        for (int k = 0; k < kCopyUnroll; ++k)
          if (i + k * kNumThreads < n) st_na(dst + i + k * kNumThreads, v[k]);
      }
    }
    if (a.topk_weights != nullptr) {
      const float* src = a.topk_weights + int64_t(src_row) * K;
      float* dst = reinterpret_cast<float*>(peer + rows.topk_weights) + int64_t(dst_row) * K;
      for (int i = tid; i < cnt * K; i += kNumThreads) dst[i] = src[i];
    }
    rec.end(ph::kSendChunk, c);
    __syncthreads();  // the whole chunk precedes the release
    if (warp == 0) {
      if (lane == 0) st_release_sys(&signals(peer)->combine_ready[me][c], f.epoch);
      rec.instant(ph::kPublishTail, s);
    }
  }
}

template <int kNumRanks>
__device__ void reduce(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                       epscope::WarpRecorder& rec) {
  const int me = f.rank, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rb = blockIdx.x - a.num_sender_blocks, nrb = gridDim.x - a.num_sender_blocks;
  const int nvec = a.hidden * 2 / 16, K = a.num_topk;
  char* own = peers.base[me];
  Signals* sig = signals(own);
  const int* rpm = a.rank_prefix_matrix;
  int base[kNumRanks];  // first row of each rank's contribution: local input for me, region for peers
#pragma unroll
  for (int d = 0; d < kNumRanks; ++d) base[d] = d == me ? prev_rows(rpm, me, me, kNumRanks) : comb_off<kNumRanks>(rpm, me, d);
  const int4* own_x = static_cast<const int4*>(a.x);
  const int4* region_x = reinterpret_cast<const int4*>(own + rows.x);
  const float* region_w = reinterpret_cast<const float*>(own + rows.topk_weights);

  for (int c = rb; c < a.num_chunks; c += nrb) {
    // wait for every peer holding rows of this chunk, one thread per peer (all in warp 0, whose
    // span covers the wait; payload = the last peer in rank order, the only one for 2 ranks)
    const int last_peer = kNumRanks > 1 ? (me + kNumRanks - 1) % kNumRanks : me;
    rec.begin(ph::kWaitData, last_peer);
    bool ok = true;
    if (tid < kNumRanks && tid != me) {
      const int* pre = a.send_chunk_prefix + tid * (kMaxChunks + 1);
      if (pre[c + 1] > pre[c]) {
        if (comb_off<kNumRanks>(rpm, me, tid) + pre[c + 1] > rows.capacity) {
          report_error(f, 2, ph::kReduce, 0, c, tid);
          ok = false;
        } else {
          ok = wait_geq(&sig->combine_ready[tid][c], f.epoch, f, &sig->abort_epoch);
          if (!ok) report_error(f, 1, ph::kWaitData, 0, c, tid);
        }
      }
    }
    ok = __syncthreads_and(ok);
    if (!ok) break;  // no END: the trace keeps the wait open where this warp gave up
    rec.end(ph::kWaitData, last_peer);
    rec.begin(ph::kReduce, c);
    const int end = min((c + 1) * a.chunk_size, a.num_tokens);
    for (int t = c * a.chunk_size + warp; t < end; t += kWarps) {
      int row[kNumRanks];
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d) {
        const int pos = a.send_pos[int64_t(t) * kNumRanks + d];
        row[d] = pos < 0 ? -1 : base[d] + pos;
      }
      constexpr int kReduceUnroll = reduce_unroll<kNumRanks>();
      for (int j = lane; j < nvec; j += 32 * kReduceUnroll) {
        int4 v[kNumRanks][kReduceUnroll];
#pragma unroll
        for (int d = 0; d < kNumRanks; ++d) {
          if (row[d] < 0) continue;
#pragma unroll
          for (int u = 0; u < kReduceUnroll; ++u) {
            const int jj = j + u * 32;
            if (jj >= nvec) continue;
            v[d][u] = d == me ? ld_nc(own_x + int64_t(row[d]) * nvec + jj)
                              : ld_peer_written(region_x + int64_t(row[d]) * nvec + jj);
          }
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          const int jj = j + u * 32;
          if (jj >= nvec) continue;
          float acc[8] = {};
#pragma unroll
          for (int d = 0; d < kNumRanks; ++d)
            if (row[d] >= 0) add_bf16x8(acc, v[d][u]);
          if (a.bias0 != nullptr) add_bf16x8(acc, ld_nc(static_cast<const int4*>(a.bias0) + int64_t(t) * nvec + jj));
          if (a.bias1 != nullptr) add_bf16x8(acc, ld_nc(static_cast<const int4*>(a.bias1) + int64_t(t) * nvec + jj));
          int4 o;
          __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
          for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
          st_na(static_cast<int4*>(a.out) + int64_t(t) * nvec + jj, o);
        }
      }
      if (a.out_weights != nullptr && lane < K) {
        float w = 0.f;
#pragma unroll
        for (int d = 0; d < kNumRanks; ++d) {
          if (row[d] < 0) continue;
          w += d == me ? a.topk_weights[int64_t(row[d]) * K + lane] : region_w[int64_t(row[d]) * K + lane];
        }
        a.out_weights[int64_t(t) * K + lane] = w;
      }
    }
    rec.end(ph::kReduce, c);
  }
}

template <int kNumRanks>
__global__ void __launch_bounds__(kNumThreads, 1) combine_kernel(Args a, RowRegions rows, PeerPtrs peers, FailCtx f,
                                                                 void* prof) {
  f = current_op(f);  // the epoch the op's barrier / notify opened (common.cuh)
  epscope::WarpRecorder rec;
  rec.init(prof);
  if (int(blockIdx.x) < a.num_sender_blocks)
    send<kNumRanks>(a, rows, peers, f, rec);
  else
    reduce<kNumRanks>(a, rows, peers, f, rec);
  rec.finish();
}

cudaError_t combine(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                    const FailCtx& f, void* prof, cudaStream_t stream) {
  if (a.hidden % 8 != 0 || a.num_chunks > kMaxChunks || a.num_topk > kMaxTopk || a.num_sender_blocks < 1 ||
      a.num_sender_blocks >= num_blocks)
    return cudaErrorInvalidValue;
  EP_SWITCH_RANKS(num_ranks, combine_kernel<kR><<<num_blocks, kNumThreads, 0, stream>>>(a, rows, peers, f, prof));
  return cudaGetLastError();
}

}  // namespace combine
}  // namespace ep_core
