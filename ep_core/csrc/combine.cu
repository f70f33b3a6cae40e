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

#include <algorithm>

#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"
#include "ep_core/csrc/rows.cuh"
#include "ep_core/csrc/tma.cuh"

namespace ep_core {
namespace combine {

constexpr int kWarps = kNumThreads / 32;
constexpr int kCopyUnroll = 8;     // 64 KB of loads in flight per SM (see dispatch.cu)
// 16-byte vectors per lane per source in flight; v[kNumRanks][unroll] int4 must stay in registers
template <int kNumRanks>
__host__ __device__ constexpr int reduce_unroll() { return kNumRanks <= 2 ? 4 : (kNumRanks <= 4 ? 2 : 1); }

using rows::prev_rows;
using rows::rows_between;
template <int kNumRanks>
__device__ __forceinline__ int comb_off(const int* rpm, int s, int d) {
  return rows::peer_rows_before(rpm, s, d, kNumRanks);
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

// One lane's kU vectors j, j + 32, ... of a token: loaded from every rank the token went to (its
// own rank's rows from the local input, the peers' from this rank's buffer), summed in fp32 with
// the optional biases, stored as bf16. The whole-group case (kTail = false) has no per-vector
// bound and one address per source, so the hot loop's shape does not depend on what else the
// kernel holds (the instrumented build's recorder state changed how the compiler laid out the
// old loop, which computed addresses and bounds per vector: +11 % stall cycles, benchmarks/NOTES.md).
template <int kNumRanks, int kU, bool kTail>
__device__ __forceinline__ void reduce_piece(const int4* const (&src)[kNumRanks], int me, const int4* b0,
                                             const int4* b1, int4* out, int j, int nvec) {
  int4 v[kNumRanks][kU];
#pragma unroll
  for (int d = 0; d < kNumRanks; ++d) {
    if (src[d] == nullptr) continue;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int jj = j + u * 32;
      if (kTail && jj >= nvec) continue;
      v[d][u] = d == me ? ld_nc(src[d] + jj) : ld_peer_written(src[d] + jj);
    }
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int jj = j + u * 32;
    if (kTail && jj >= nvec) continue;
    float acc[8] = {};
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d)
      if (src[d] != nullptr) add_bf16x8(acc, v[d][u]);
    if (b0 != nullptr) add_bf16x8(acc, ld_nc(b0 + jj));
    if (b1 != nullptr) add_bf16x8(acc, ld_nc(b1 + jj));
    int4 o;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    st_na(out + jj, o);
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
      // the token's rows, computed once per token (null: it did not go to that rank)
      const int4* src[kNumRanks];
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        src[d] = row[d] < 0 ? nullptr : (d == me ? own_x : region_x) + int64_t(row[d]) * nvec;
      const int4* b0 = a.bias0 != nullptr ? static_cast<const int4*>(a.bias0) + int64_t(t) * nvec : nullptr;
      const int4* b1 = a.bias1 != nullptr ? static_cast<const int4*>(a.bias1) + int64_t(t) * nvec : nullptr;
      int4* out = static_cast<int4*>(a.out) + int64_t(t) * nvec;
      constexpr int kU = reduce_unroll<kNumRanks>();
      int j = lane;
#pragma unroll 1  // kU vectors per source in flight, as designed
      for (; j + 32 * (kU - 1) < nvec; j += 32 * kU) reduce_piece<kNumRanks, kU, false>(src, me, b0, b1, out, j, nvec);
      if (j < nvec) reduce_piece<kNumRanks, kU, true>(src, me, b0, b1, out, j, nvec);
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

// ---- the pipelined bulk-copy path (Config.num_tma_buffers = N in 1..3) ---------------------------
//
// Units go to blocks as in the direct path and a unit's items are split over the block's pipeline
// warps (tma.cuh, share_of). Senders: (source, chunk) units; the unit's rows are contiguous in x
// and in the source's combine region, so each warp's share travels as a bulk copy through its
// staging buffers; the warps drain, meet at a named barrier, and warp 0 publishes the unit.
// Reducers: chunks of this rank's tokens; one item is one piece of a token's row, and its staging buffer holds that piece from every rank the token went to
// (sub-slot d = rank d's row: this rank's from x, peers' from the combine region). The lanes sum
// the staged pieces in fp32 (plus bias, read directly), write bf16 over sub-slot 0, and lane 0
// bulk-stores it to `out` while the next item loads. Hook mode (kHookReceive) launches reducers
// only; they wait for each peer's hook flag (its peer copies of the whole op landed).

template <int kNumRanks>
__device__ __forceinline__ void reduce_bases(const int* rpm, int me, int (&base)[kNumRanks]) {
#pragma unroll
  for (int d = 0; d < kNumRanks; ++d) base[d] = d == me ? prev_rows(rpm, me, me, kNumRanks) : comb_off<kNumRanks>(rpm, me, d);
}

// Values only (see dispatch.cu's TokenRows: a kernel parameter whose address escapes is copied
// to local memory).
template <int kNumRanks>
struct ReduceStage {
  const int* send_pos;
  const char* x;                 // this rank's received rows (its own contribution)
  const char* region_x;          // this rank's combine region (rows peers sent back)
  const float* topk_weights;     // [N, K] of x's rows
  const float* region_w;         // top-k weights peers sent back, same rows as region_x
  const int4* bias0;
  const int4* bias1;
  char* out;
  float* out_weights;
  int base[kNumRanks];           // first row of each rank's contribution
  int me, base_me, t0, first, row_bytes, num_topk, pieces_per_row, piece_bytes, slot_stride;

  // item i of the pipeline is item first + i of the chunk
  __device__ __forceinline__ int token(int i) const { return t0 + (first + i) / pieces_per_row; }
  __device__ __forceinline__ int offset(int i) const { return ((first + i) % pieces_per_row) * piece_bytes; }
  __device__ __forceinline__ uint32_t len(int i) const { return uint32_t(min(piece_bytes, row_bytes - offset(i))); }
  __device__ __forceinline__ void rows_of(int t, int (&r)[kNumRanks]) const {
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) {
      const int pos = send_pos[int64_t(t) * kNumRanks + d];
      r[d] = pos < 0 ? -1 : base[d] + pos;
    }
  }
  __device__ __forceinline__ uint32_t bytes(int i) const {
    int r[kNumRanks];
    rows_of(token(i), r);
    uint32_t n = 0;
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) n += r[d] >= 0 ? len(i) : 0u;
    return n;
  }
  __device__ __forceinline__ void load(int i, char* buf, uint64_t* bar) const {
    int r[kNumRanks];
    rows_of(token(i), r);
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) {
      if (r[d] < 0) continue;
      const char* src = (d == me ? x : region_x) + int64_t(r[d]) * row_bytes + offset(i);
      tma::load_g2s(buf + d * slot_stride, src, len(i), bar);
    }
  }
  __device__ __forceinline__ void consume(int i, char* buf) const {
    const int lane = threadIdx.x % 32, t = token(i), off = offset(i);
    const int nv = int(len(i)) / 16;
    int r[kNumRanks];
    rows_of(t, r);
    const int64_t gvec = (int64_t(t) * row_bytes + off) / 16;  // this piece's first vector in a [T, H] tensor
    int4* piece_out = reinterpret_cast<int4*>(buf);             // written over sub-slot 0, lane by lane
    for (int j = lane; j < nv; j += 32) {
      float acc[8] = {};
      // the register path's order: ranks 0..R-1, then the biases
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        if (r[d] >= 0) add_bf16x8(acc, reinterpret_cast<const int4*>(buf + d * slot_stride)[j]);
      if (bias0 != nullptr) add_bf16x8(acc, ld_nc(bias0 + gvec + j));
      if (bias1 != nullptr) add_bf16x8(acc, ld_nc(bias1 + gvec + j));
      int4 o;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
      piece_out[j] = o;
    }
    tma::fence_async_shared();  // each lane's shared-memory writes before the bulk store reads them
    __syncwarp();
    if (lane == 0) tma::store_s2g(out + int64_t(t) * row_bytes + off, buf, len(i));
    if (off == 0 && out_weights != nullptr && lane < num_topk) {
      const int K = num_topk;
      // the own weight through a scalar: `d == me ? x[r[d]] : ...` folds into one r[me] access,
      // which moves r to local memory; the sum keeps the register path's rank order
      const int pos_me = send_pos[int64_t(t) * kNumRanks + me];
      const float own_w = pos_me >= 0 ? topk_weights[int64_t(base_me + pos_me) * K + lane] : 0.f;
      float w = 0.f;
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        if (r[d] >= 0) w += d == me ? own_w : region_w[int64_t(r[d]) * K + lane];
      out_weights[int64_t(t) * K + lane] = w;
    }
  }
};

template <int kNumRanks, int kBuffers>
__device__ void send_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                         const tma::Plan& plan, tma::WarpPipe<kBuffers>& pipe, epscope::WarpRecorder& rec) {
  if (kNumRanks == 1) return;
  constexpr int kPeers = kNumRanks > 1 ? kNumRanks - 1 : 1;
  const int me = f.rank, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_bytes = a.hidden * 2, K = a.num_topk;
  int max_chunks = 0;
  for (int s = 0; s < kNumRanks; ++s)
    if (s != me) max_chunks = max(max_chunks, a.recv_num_chunks[s]);
  const int units = max_chunks * kPeers, stride = plan.warps * 32, tid = warp * 32 + lane;
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
      if (warp == 0 && lane == 0) report_error(f, 2, ph::kSendChunk, 0, c, s);
      continue;
    }
    rec.begin(ph::kSendChunk, c);
    char* peer = peers.base[s];
    // this warp's share of the unit's bytes, in 16-byte vectors (rows are whole vectors)
    const tma::Share sh = tma::share_of(int64_t(cnt) * row_bytes / tma::kBulkAlign, warp, plan.warps);
    const int64_t at = sh.lo * tma::kBulkAlign;
    tma::CopyStage st{static_cast<const char*>(a.x) + int64_t(src_row) * row_bytes + at,
                      peer + rows.x + int64_t(dst_row) * row_bytes + at, (sh.hi - sh.lo) * tma::kBulkAlign,
                      plan.piece_bytes};
    const bool ok = pipe.run(st, st.items(), rec, ph::kStageWait);
    if (ok) {
      if (a.topk_weights != nullptr) {
        const float* src = a.topk_weights + int64_t(src_row) * K;
        float* dst = reinterpret_cast<float*>(peer + rows.topk_weights) + int64_t(dst_row) * K;
        for (int i = tid; i < cnt * K; i += stride) dst[i] = src[i];
      }
      pipe.drain();  // this warp's share is written (and the lanes' weights, by the warp sync)
      rec.end(ph::kSendChunk, c);
    } else if (lane == 0) {
      report_error(f, 4, ph::kSendChunk, 0, c, s);  // no END: the trace keeps the span open where it gave up
    }
    // every pipeline warp's share of the unit precedes the release below; a warp that gave up
    // keeps the unit unpublished (the source times out naming this rank) and stops the block
    if (tma::pipe_warps_sync_or(plan.warps, !ok)) return;
    if (warp != 0) continue;
    if (lane == 0) st_release_sys(&signals(peer)->combine_ready[me][c], f.epoch);
    rec.instant(ph::kPublishTail, s);
  }
}

template <int kNumRanks, int kBuffers>
__device__ void reduce_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                           const tma::Plan& plan, tma::WarpPipe<kBuffers>& pipe, epscope::WarpRecorder& rec) {
  const int me = f.rank, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool hook = a.hook == kHookReceive;
  char* own = peers.base[me];
  Signals* sig = signals(own);
  const int* rpm = a.rank_prefix_matrix;
  ReduceStage<kNumRanks> st;
  st.send_pos = a.send_pos;
  st.x = static_cast<const char*>(a.x);
  st.region_x = own + rows.x;
  st.topk_weights = a.topk_weights;
  st.region_w = reinterpret_cast<const float*>(own + rows.topk_weights);
  st.bias0 = static_cast<const int4*>(a.bias0);
  st.bias1 = static_cast<const int4*>(a.bias1);
  st.out = static_cast<char*>(a.out);
  st.out_weights = a.out_weights;
  reduce_bases<kNumRanks>(rpm, me, st.base);
  st.me = me;
  st.base_me = prev_rows(rpm, me, me, kNumRanks);
  st.t0 = 0;
  st.first = 0;
  st.row_bytes = a.hidden * 2;
  st.num_topk = a.num_topk;
  st.pieces_per_row = plan.pieces_per_row;
  st.piece_bytes = plan.piece_bytes;
  st.slot_stride = plan.slot_stride;
  const int num_reducers = int(gridDim.x) - a.num_sender_blocks;
  const int last_peer = kNumRanks > 1 ? (me + kNumRanks - 1) % kNumRanks : me;
  const ph::Phase wait_phase = hook ? ph::kWaitHook : ph::kWaitData;
  // chunk c goes to reducer block c mod num_reducers; every pipeline warp of it waits for the
  // chunk's peers itself and reduces its share of the chunk's items
  for (int c = int(blockIdx.x) - a.num_sender_blocks; c < a.num_chunks; c += num_reducers) {
    // lane d waits for peer d if it holds rows of this chunk (payload: the last peer in rank
    // order, the only one for 2 ranks)
    rec.begin(wait_phase, last_peer);
    bool ok = true;
    if (lane < kNumRanks && lane != me) {
      const int* pre = a.send_chunk_prefix + lane * (kMaxChunks + 1);
      if (pre[c + 1] > pre[c]) {
        if (comb_off<kNumRanks>(rpm, me, lane) + pre[c + 1] > rows.capacity) {
          report_error(f, 2, ph::kReduce, 0, c, lane);
          ok = false;
        } else {
          const int* flag = hook ? &sig->hook_ready[kHookCombine][lane] : &sig->combine_ready[lane][c];
          ok = wait_geq(flag, f.epoch, f, &sig->abort_epoch);
          if (!ok) report_error(f, 1, wait_phase, 0, c, lane);
        }
      }
    }
    ok = __all_sync(0xffffffffu, ok);
    __syncwarp();
    if (!ok) return;  // no END: the trace keeps the wait open where this warp gave up
    if (lane == 0) tma::fence_async_global();  // the bulk loads below read what the acquires made visible
    __syncwarp();
    rec.end(wait_phase, last_peer);
    rec.begin(ph::kReduce, c);
    st.t0 = c * a.chunk_size;
    const int t1 = min(st.t0 + a.chunk_size, a.num_tokens);
    const tma::Share sh = tma::share_of(int64_t(t1 - st.t0) * plan.pieces_per_row, warp, plan.warps);
    st.first = int(sh.lo);
    if (!pipe.run(st, int(sh.hi - sh.lo), rec, ph::kStageWait)) {
      if (lane == 0) report_error(f, 4, ph::kReduce, 0, c, me);
      return;
    }
    rec.end(ph::kReduce, c);
  }
}

template <int kNumRanks, int kBuffers>
__global__ void __launch_bounds__(kNumThreads, 1) combine_tma_kernel(Args a, RowRegions rows, PeerPtrs peers,
                                                                     FailCtx f, void* prof, tma::Plan send_plan,
                                                                     tma::Plan reduce_plan) {
  f = current_op(f);  // the epoch the op's barrier / notify opened (common.cuh)
  extern __shared__ __align__(tma::kSlotAlign) char smem[];
  epscope::WarpRecorder rec;
  rec.init(prof);
  const int warp = threadIdx.x / 32;
  const bool sender = int(blockIdx.x) < a.num_sender_blocks;
  const tma::Plan plan = sender ? send_plan : reduce_plan;  // a copy: a reference to either parameter would move both to local memory
  if (!tma::plan_fits<kBuffers>(plan)) {
    if (threadIdx.x == 0) report_error(f, 5, ph::kReduce, 0, blockIdx.x, f.rank);
  } else if (warp < plan.warps) {
    tma::WarpPipe<kBuffers> pipe;
    pipe.init(smem + warp * plan.warp_stride, plan, f.timeout_ns);
    if (sender)
      send_tma<kNumRanks, kBuffers>(a, rows, peers, f, plan, pipe, rec);
    else
      reduce_tma<kNumRanks, kBuffers>(a, rows, peers, f, plan, pipe, rec);
    pipe.drain();  // no bulk store may outlive the block's shared memory
  }
  rec.finish();
}

template <int kBuffers>
cudaError_t launch_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                       const FailCtx& f, void* prof, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  EP_SWITCH_RANKS(num_ranks, {
    const auto kernel = combine_tma_kernel<kR, kBuffers>;
    tma::Plan send_plan{}, reduce_plan{};
    err = tma::prepare(reinterpret_cast<const void*>(kernel), kBuffers, 1, a.hidden * 2, kWarps, &send_plan);
    if (err == cudaSuccess)
      err = tma::prepare(reinterpret_cast<const void*>(kernel), kBuffers, kR, a.hidden * 2, kWarps, &reduce_plan);
    const int smem = std::max(a.num_sender_blocks > 0 ? send_plan.smem_bytes : 0, reduce_plan.smem_bytes);
    if (err == cudaSuccess)
      kernel<<<num_blocks, kNumThreads, smem, stream>>>(a, rows, peers, f, prof, send_plan, reduce_plan);
  });
  return err != cudaSuccess ? err : cudaGetLastError();
}

// One rank sends nothing back: its combine may run reducers only (ep_core/buffer_plans.py).
constexpr int min_senders(int num_ranks) { return num_ranks == 1 ? 0 : 1; }

bool tma_args_ok(const Args& a, const PeerPtrs& peers, int num_ranks, int num_blocks) {
  if (a.num_tma_buffers < tma::kMinBuffers || a.num_tma_buffers > tma::kMaxBuffers) return false;
  if (!tma::aligned16(a.x) || !tma::aligned16(a.out)) return false;
  for (int r = 0; r < num_ranks; ++r)
    if (!tma::aligned16(peers.base[r])) return false;
  switch (a.hook) {
    case kHookOff: return a.num_sender_blocks >= min_senders(num_ranks) && a.num_sender_blocks < num_blocks;
    case kHookReceive: return a.num_sender_blocks == 0;
    default: return false;  // a combine's send half is peer copies only (hook.cu)
  }
}

cudaError_t combine(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                    const FailCtx& f, void* prof, cudaStream_t stream) {
  if (a.hidden % 8 != 0 || a.num_chunks > kMaxChunks || a.num_topk > kMaxTopk) return cudaErrorInvalidValue;
  if (a.num_tma_buffers != 0 || a.hook != kHookOff) {
    if (!tma_args_ok(a, peers, num_ranks, num_blocks)) return cudaErrorInvalidValue;
    switch (a.num_tma_buffers) {
      case 1: return launch_tma<1>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      case 2: return launch_tma<2>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      case 3: return launch_tma<3>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  if (a.num_sender_blocks < min_senders(num_ranks) || a.num_sender_blocks >= num_blocks) return cudaErrorInvalidValue;
  EP_SWITCH_RANKS(num_ranks, combine_kernel<kR><<<num_blocks, kNumThreads, 0, stream>>>(a, rows, peers, f, prof));
  return cudaGetLastError();
}

}  // namespace combine
}  // namespace ep_core
