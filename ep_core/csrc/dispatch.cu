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
#include "ep_core/csrc/rows.cuh"
#include "ep_core/csrc/tma.cuh"

namespace ep_core {
namespace dispatch {

constexpr int kWarps = kNumThreads / 32;
// 16-byte loads in flight per lane before the first store: 8 x 16 B x 512 threads = 64 KB per SM
// (v1 had 4: a 1-rank cached dispatch then moved only ~0.95 TB/s on 64 SMs, benchmarks/NOTES.md)
constexpr int kUnroll = 8;

using rows::peer_rows_before;
using rows::prev_rows;

// Own-rank rows go to the output tensor, peer rows to the same region of the peer's buffer.
template <typename T>
__device__ __forceinline__ T* dst_ptr(void* own_out, const PeerPtrs& peers, size_t region, int d, int me) {
  return d == me ? static_cast<T*>(own_out) : reinterpret_cast<T*>(peers.base[d] + region);
}

// One lane's kUnroll vectors of a row, i, i + 32, ..., loaded once and stored to every destination.
// The whole-group case (kTail = false) has no per-vector bound: the hot loop is a fixed pattern of
// loads and stores at constant offsets from one address per destination, whatever else the kernel
// holds (the instrumented build's recorder state changed how the compiler laid out a loop that
// computed addresses and bounds per vector: +8 % stall cycles, benchmarks/NOTES.md issue 9).
template <int kNumRanks, bool kTail>
__device__ __forceinline__ void copy_row_piece(const int4* src, int4* const (&dst)[kNumRanks], int i, int nvec) {
  int4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (!kTail || i + u * 32 < nvec) v[u] = ld_nc(src + i + u * 32);
#pragma unroll
  for (int d = 0; d < kNumRanks; ++d) {
    if (dst[d] == nullptr) continue;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (!kTail || i + u * 32 < nvec) st_na(dst[d] + i + u * 32, v[u]);
  }
}

// One thread's kUnroll vectors i, i + kNumThreads, ... of a chunk a peer wrote into this rank's
// buffer, copied to recv_x (same shape as copy_row_piece: no per-vector bound on a whole group).
template <bool kTail>
__device__ __forceinline__ void copy_out_piece(const int4* src, int4* dst, int64_t i, int64_t n) {
  int4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (!kTail || i + u * kNumThreads < n) v[u] = ld_peer_written(src + i + u * kNumThreads);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (!kTail || i + u * kNumThreads < n) st_na(dst + i + u * kNumThreads, v[u]);
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
      // the token's row in every destination, computed once per token (null: not sent there)
      const int4* src = static_cast<const int4*>(a.x) + int64_t(t) * nvec;
      int4* dst[kNumRanks];
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        dst[d] = row[d] < 0 ? nullptr : dst_ptr<int4>(a.recv_x, peers, rows.x, d, me) + int64_t(row[d]) * nvec;
      int i = lane;
#pragma unroll 1  // kUnroll loads in flight per lane, as designed (not 2 x kUnroll)
      for (; i + 32 * (kUnroll - 1) < nvec; i += 32 * kUnroll) copy_row_piece<kNumRanks, false>(src, dst, i, nvec);
      if (i < nvec) copy_row_piece<kNumRanks, true>(src, dst, i, nvec);
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
      int64_t i = tid;
#pragma unroll 1
      for (; i + int64_t(kNumThreads) * (kUnroll - 1) < n; i += int64_t(kNumThreads) * kUnroll)
        copy_out_piece<false>(src, dst, i, n);
      if (i < n) copy_out_piece<true>(src, dst, i, n);
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

// ---- the pipelined bulk-copy path (Config.num_tma_buffers = N in 1..3) ---------------------------
//
// The same rows go to the same places as above, but every row moves global -> shared -> global by
// the bulk-copy engine (tma.cuh), N staging buffers per warp: the next row loads while the
// previous rows' stores are in flight. Units go to blocks as in the direct path (sender block b:
// chunks b, b + num_sender_blocks, ...; receiver blocks: (source, chunk) units, chunk-major) and a
// unit's items are split over the block's plan.warps pipeline warps (tma.cuh, share_of). A sender
// warp drains its share of a chunk, the pipeline warps meet at a named barrier, and warp 0
// publishes the chunk: its flag is released only after every warp's rows of it are written.
// Receiver warps wait for the unit's flag themselves and copy their share of its contiguous bytes.
// Hook mode (hook.cu): kHookSend launches senders only, peer rows packed into this rank's staging
// region (no publish; the copy engines move them); kHookReceive launches receivers only, which wait
// for the source's hook flag instead of per-chunk counters.

// A token's row in each destination (own: recv_x; peer: its receive region, or this rank's
// staging region in hook mode), -1 where it does not go; `report` names the first bad row.
// Stages hold values, never pointers to the kernel's parameters: a parameter whose address
// escapes is copied to local memory, and the hot loop would then read its fields from there.
template <int kNumRanks>
struct TokenRows {
  const int* send_pos;
  int row_base[kNumRanks];
  int recv_rows, capacity, skip_send, me;

  __device__ __forceinline__ void init(const Args& a, const RowRegions& r, int rank) {
    send_pos = a.send_pos;
    recv_rows = a.recv_rows;
    capacity = a.hook == kHookSend ? a.stage.capacity : r.capacity;
    skip_send = a.skip_send;
    me = rank;
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d)
      row_base[d] = (a.hook == kHookSend && d != rank) ? peer_rows_before(a.rank_prefix_matrix, rank, d, kNumRanks)
                                                       : prev_rows(a.rank_prefix_matrix, rank, d, kNumRanks);
  }
  __device__ __forceinline__ void of(int t, int (&row)[kNumRanks], bool report, const FailCtx& f, int chunk) const {
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) {
      // computed in a scalar and stored once: conditional updates of row[d] under `d == me` let
      // the compiler fold them into one row[me] access, which puts `row` in local memory
      const int pos = send_pos[int64_t(t) * kNumRanks + d];
      int r = pos < 0 ? -1 : row_base[d] + pos;
      const int limit = d == me ? recv_rows : (skip_send ? 0 : capacity);  // skip_send: this rank never sends
      if (r >= limit) {
        if (report && !(d != me && skip_send)) report_error(f, d == me ? 3 : 2, ph::kSendChunk, 0, chunk, d);
        r = -1;
      }
      row[d] = r;
    }
  }
};

// Base of each destination's region for one kind of data (rows, scales, top-k ids, weights):
// the own output for this rank, else the peer's region (or, in hook mode, this rank's staging).
template <int kNumRanks>
struct Dests {
  char* base[kNumRanks];

  __device__ __forceinline__ void init(void* own_out, const PeerPtrs& peers, size_t peer_off, char* stage, int me,
                                       bool hook) {
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d)
      base[d] = d == me ? static_cast<char*>(own_out) : (hook ? stage : peers.base[d] + peer_off);
  }
};

// Items of a sender unit: (token, piece) over the chunk's tokens, pieces_per_row per token; a
// warp runs items [first, first + n) of the chunk, numbered 0.. by the pipeline.
template <int kNumRanks>
struct SendStage {
  TokenRows<kNumRanks> tr;
  Dests<kNumRanks> x, scales, idx, weights;
  const char* src;               // x
  const float* x_scales;
  const int64_t* topk_idx;
  const float* topk_weights;
  int64_t scale_token_stride, scale_hidden_stride;
  int hidden_bytes, num_scales, num_topk, experts_per_rank;
  int pieces_per_row, piece_bytes;
  int t0, chunk, first;
  FailCtx f;

  __device__ __forceinline__ int token(int i) const { return t0 + (first + i) / pieces_per_row; }
  __device__ __forceinline__ int offset(int i) const { return ((first + i) % pieces_per_row) * piece_bytes; }
  __device__ __forceinline__ uint32_t len(int i) const { return uint32_t(min(piece_bytes, hidden_bytes - offset(i))); }
  __device__ __forceinline__ uint32_t bytes(int i) const {
    int row[kNumRanks];
    tr.of(token(i), row, false, f, chunk);
    bool any = false;
#pragma unroll
    for (int d = 0; d < kNumRanks; ++d) any |= row[d] >= 0;
    return any ? len(i) : 0u;
  }
  __device__ __forceinline__ void load(int i, char* buf, uint64_t* bar) const {
    tma::load_g2s(buf, src + int64_t(token(i)) * hidden_bytes + offset(i), len(i), bar);
  }
  __device__ __forceinline__ void consume(int i, char* buf) const {
    const int lane = threadIdx.x % 32, t = token(i);
    const bool head = offset(i) == 0;  // the row's first piece also carries its scales and top-k
    int row[kNumRanks];
    tr.of(t, row, head && lane == 0, f, chunk);
    if (lane == 0) {
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d)
        if (row[d] >= 0) tma::store_s2g(x.base[d] + int64_t(row[d]) * hidden_bytes + offset(i), buf, len(i));
    }
    if (!head) return;
    // scales and top-k are small: plain stores by the lanes, published by the chunk's drain
    const int ns = num_scales, K = num_topk;
    if (x_scales != nullptr) {
      for (int j = lane; j < ns; j += 32) {
        const float v = x_scales[int64_t(t) * scale_token_stride + int64_t(j) * scale_hidden_stride];
#pragma unroll
        for (int d = 0; d < kNumRanks; ++d)
          if (row[d] >= 0) reinterpret_cast<float*>(scales.base[d])[int64_t(row[d]) * ns + j] = v;
      }
    }
    if (topk_idx != nullptr && lane < K) {
      const int64_t e = topk_idx[int64_t(t) * K + lane];
      const float w = topk_weights != nullptr ? topk_weights[int64_t(t) * K + lane] : 0.f;
#pragma unroll
      for (int d = 0; d < kNumRanks; ++d) {
        if (row[d] < 0) continue;
        const int64_t lo = int64_t(d) * experts_per_rank;
        const int64_t local = (e >= lo && e < lo + experts_per_rank) ? e - lo : -1;
        reinterpret_cast<int64_t*>(idx.base[d])[int64_t(row[d]) * K + lane] = local;
        if (topk_weights != nullptr)
          reinterpret_cast<float*>(weights.base[d])[int64_t(row[d]) * K + lane] = local >= 0 ? w : 0.f;
      }
    }
  }
};

template <int kNumRanks, int kBuffers>
__device__ void send_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                         const tma::Plan& plan, tma::WarpPipe<kBuffers>& pipe, epscope::WarpRecorder& rec) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, me = f.rank;
  const bool hook = a.hook == kHookSend;
  const ph::Phase phase = hook ? ph::kPack : ph::kSendChunk;
  char* own = peers.base[me];
  SendStage<kNumRanks> st;
  st.tr.init(a, rows, me);
  st.x.init(a.recv_x, peers, rows.x, own + a.stage.x, me, hook);
  st.scales.init(a.recv_scales, peers, rows.scales, own + a.stage.scales, me, hook);
  st.idx.init(a.recv_topk_idx, peers, rows.topk_idx, own + a.stage.topk_idx, me, hook);
  st.weights.init(a.recv_topk_weights, peers, rows.topk_weights, own + a.stage.topk_weights, me, hook);
  st.src = static_cast<const char*>(a.x);
  st.x_scales = a.x_scales;
  st.topk_idx = a.topk_idx;
  st.topk_weights = a.topk_weights;
  st.scale_token_stride = a.scale_token_stride;
  st.scale_hidden_stride = a.scale_hidden_stride;
  st.hidden_bytes = a.hidden_bytes;
  st.num_scales = a.num_scales;
  st.num_topk = a.num_topk;
  st.experts_per_rank = a.num_experts / kNumRanks;
  st.pieces_per_row = plan.pieces_per_row;
  st.piece_bytes = plan.piece_bytes;
  st.f = f;
  const bool publish = !(hook || a.skip_send);  // uniform over the grid: the barrier below is too
  for (int c = blockIdx.x; c < a.num_chunks; c += a.num_sender_blocks) {
    st.t0 = c * a.chunk_size;
    st.chunk = c;
    const int t1 = min(st.t0 + a.chunk_size, a.num_tokens);
    const tma::Share sh = tma::share_of(int64_t(t1 - st.t0) * plan.pieces_per_row, warp, plan.warps);
    st.first = int(sh.lo);
    rec.begin(phase, c);
    const bool ok = pipe.run(st, int(sh.hi - sh.lo), rec, ph::kStageWait);
    if (ok) {
      pipe.drain();  // this warp's rows of the chunk are written (and the lanes' scale / top-k stores)
      rec.end(phase, c);
    } else if (lane == 0) {
      report_error(f, 4, phase, 0, c, me);  // no END: the trace keeps the span open where it gave up
    }
    if (!publish) {
      if (!ok) return;
      continue;
    }
    // every pipeline warp's share of chunk c precedes the release below; a warp that gave up
    // keeps the chunk unpublished (the peers time out naming this rank) and stops the block
    if (tma::pipe_warps_sync_or(plan.warps, !ok)) return;
    if (warp != 0) continue;
    for (int d = 0; d < kNumRanks; ++d) {
      const int* pre = a.send_chunk_prefix + d * (kMaxChunks + 1);
      if (d == me || pre[c + 1] == pre[c]) continue;
      if (lane == 0) st_release_sys(&signals(peers.base[d])->dispatch_ready[me][c], f.epoch);
      rec.instant(ph::kPublishTail, d);
    }
  }
}

template <int kNumRanks, int kBuffers>
__device__ void receive_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, const FailCtx& f,
                            const tma::Plan& plan, tma::WarpPipe<kBuffers>& pipe, epscope::WarpRecorder& rec) {
  if (kNumRanks == 1) return;
  constexpr int kPeers = kNumRanks > 1 ? kNumRanks - 1 : 1;
  const int me = f.rank, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool hook = a.hook == kHookReceive;
  char* own = peers.base[me];
  Signals* sig = signals(own);
  int max_chunks = 0;
  for (int s = 0; s < kNumRanks; ++s)
    if (s != me) max_chunks = max(max_chunks, a.recv_num_chunks[s]);
  const int hb = a.hidden_bytes, ns = a.num_scales, K = a.num_topk;
  const int num_receivers = int(gridDim.x) - a.num_sender_blocks;
  const int units = max_chunks * kPeers;
  // chunk-major order: early chunks of every source first, as the senders produce them; every
  // pipeline warp of the block waits for the unit's flag itself and copies its share
  const int stride = plan.warps * 32, tid = warp * 32 + lane;
  for (int u = int(blockIdx.x) - a.num_sender_blocks; u < units; u += num_receivers) {
    const int c = u / kPeers, si = u % kPeers;
    const int s = si < me ? si : si + 1;
    if (c >= a.recv_num_chunks[s]) continue;
    const int* pre = a.recv_chunk_prefix + s * (kMaxChunks + 1);
    const int cnt = pre[c + 1] - pre[c];
    if (cnt == 0) continue;
    const int row0 = prev_rows(a.rank_prefix_matrix, s, me, kNumRanks) + pre[c];
    const ph::Phase wait_phase = hook ? ph::kWaitHook : ph::kWaitData;
    rec.begin(wait_phase, s);
    int ok = 1;
    if (lane == 0) {
      ok = row0 + cnt <= rows.capacity && row0 + cnt <= a.recv_rows;
      if (!ok) report_error(f, row0 + cnt <= rows.capacity ? 3 : 2, ph::kCopyOut, 0, c, s);
      if (ok) {
        const int* flag = hook ? &sig->hook_ready[kHookDispatch][s] : &sig->dispatch_ready[s][c];
        ok = wait_geq(flag, f.epoch, f, &sig->abort_epoch);
        if (!ok) report_error(f, 1, wait_phase, 0, c, s);
      }
      if (ok) tma::fence_async_global();  // the bulk loads below read what the acquire made visible
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    __syncwarp();
    if (!ok) return;  // no END: the trace keeps the wait open where this warp gave up
    rec.end(wait_phase, s);
    rec.begin(ph::kCopyOut, c);
    // this warp's share of the unit's bytes, in 16-byte vectors (rows are whole vectors)
    const tma::Share sh = tma::share_of(int64_t(cnt) * hb / tma::kBulkAlign, warp, plan.warps);
    const int64_t at = int64_t(row0) * hb + sh.lo * tma::kBulkAlign;
    tma::CopyStage st{own + rows.x + at, static_cast<char*>(a.recv_x) + at, (sh.hi - sh.lo) * tma::kBulkAlign,
                      plan.piece_bytes};
    if (!pipe.run(st, st.items(), rec, ph::kStageWait)) {
      if (lane == 0) report_error(f, 4, ph::kCopyOut, 0, c, s);
      return;
    }
    if (a.recv_scales != nullptr) {
      const float* src = reinterpret_cast<const float*>(own + rows.scales) + int64_t(row0) * ns;
      float* dst = a.recv_scales + int64_t(row0) * ns;
      for (int i = tid; i < cnt * ns; i += stride) dst[i] = src[i];
    }
    if (a.recv_topk_idx != nullptr) {
      const int64_t* src = reinterpret_cast<const int64_t*>(own + rows.topk_idx) + int64_t(row0) * K;
      int64_t* dst = a.recv_topk_idx + int64_t(row0) * K;
      for (int i = tid; i < cnt * K; i += stride) dst[i] = src[i];
    }
    if (a.recv_topk_weights != nullptr) {
      const float* src = reinterpret_cast<const float*>(own + rows.topk_weights) + int64_t(row0) * K;
      float* dst = a.recv_topk_weights + int64_t(row0) * K;
      for (int i = tid; i < cnt * K; i += stride) dst[i] = src[i];
    }
    rec.end(ph::kCopyOut, c);
  }
}

template <int kNumRanks, int kBuffers>
__global__ void __launch_bounds__(kNumThreads, 1) dispatch_tma_kernel(Args a, RowRegions rows, PeerPtrs peers,
                                                                      FailCtx f, void* prof, tma::Plan plan) {
  f = current_op(f);  // the epoch the op's barrier / notify opened (common.cuh)
  extern __shared__ __align__(tma::kSlotAlign) char smem[];
  epscope::WarpRecorder rec;
  rec.init(prof);
  const int warp = threadIdx.x / 32;
  if (!tma::plan_fits<kBuffers>(plan)) {
    if (threadIdx.x == 0) report_error(f, 5, ph::kSendChunk, 0, blockIdx.x, f.rank);
  } else if (warp < plan.warps) {
    tma::WarpPipe<kBuffers> pipe;
    pipe.init(smem + warp * plan.warp_stride, plan, f.timeout_ns);
    if (int(blockIdx.x) < a.num_sender_blocks)
      send_tma<kNumRanks, kBuffers>(a, rows, peers, f, plan, pipe, rec);
    else
      receive_tma<kNumRanks, kBuffers>(a, rows, peers, f, plan, pipe, rec);
    pipe.drain();  // no bulk store may outlive the block's shared memory
  }
  rec.finish();
}

template <int kBuffers>
cudaError_t launch_tma(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                       const FailCtx& f, void* prof, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  EP_SWITCH_RANKS(num_ranks, {
    const auto kernel = dispatch_tma_kernel<kR, kBuffers>;
    tma::Plan plan{};
    err = tma::prepare(reinterpret_cast<const void*>(kernel), kBuffers, 1, a.hidden_bytes, kWarps, &plan);
    if (err == cudaSuccess) kernel<<<num_blocks, kNumThreads, plan.smem_bytes, stream>>>(a, rows, peers, f, prof, plan);
  });
  return err != cudaSuccess ? err : cudaGetLastError();
}

// The bulk-copy path's preconditions: 16-byte aligned bases (rows are whole multiples of 16 B,
// buffer regions 128-B aligned by construction) and a role split that fits the hook part.
bool tma_args_ok(const Args& a, const PeerPtrs& peers, int num_ranks, int num_blocks) {
  if (a.num_tma_buffers < tma::kMinBuffers || a.num_tma_buffers > tma::kMaxBuffers) return false;
  if (!tma::aligned16(a.x) || !tma::aligned16(a.recv_x)) return false;
  for (int r = 0; r < num_ranks; ++r)
    if (!tma::aligned16(peers.base[r])) return false;
  switch (a.hook) {
    case kHookOff: return a.num_sender_blocks >= 1 && (num_ranks == 1 ? a.num_sender_blocks <= num_blocks
                                                                     : a.num_sender_blocks < num_blocks);
    case kHookSend: return a.num_sender_blocks == num_blocks && (a.stage.capacity > 0 || num_ranks == 1) &&
                           a.stage.x % tma::kSlotAlign == 0;  // one rank packs nothing: no staging needed
    case kHookReceive: return a.num_sender_blocks == 0;
    default: return false;
  }
}

cudaError_t dispatch(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                     const FailCtx& f, void* prof, cudaStream_t stream) {
  if (a.hidden_bytes % 16 != 0 || a.num_chunks > kMaxChunks || a.num_topk > kMaxTopk) return cudaErrorInvalidValue;
  if (a.num_tma_buffers != 0 || a.hook != kHookOff) {
    if (!tma_args_ok(a, peers, num_ranks, num_blocks)) return cudaErrorInvalidValue;
    switch (a.num_tma_buffers) {
      case 1: return launch_tma<1>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      case 2: return launch_tma<2>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      case 3: return launch_tma<3>(a, rows, peers, num_ranks, num_blocks, f, prof, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  if (a.num_sender_blocks < 1 || a.num_sender_blocks > num_blocks || (num_ranks > 1 && a.num_sender_blocks == num_blocks))
    return cudaErrorInvalidValue;
  EP_SWITCH_RANKS(num_ranks, dispatch_kernel<kR><<<num_blocks, kNumThreads, 0, stream>>>(a, rows, peers, f, prof));
  return cudaGetLastError();
}

}  // namespace dispatch
}  // namespace ep_core
