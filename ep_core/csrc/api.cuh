// Host launchers of ep_core's kernels: raw pointers, sizes and a cudaStream_t, no torch
// (bindings.cpp is the one file that includes torch). One namespace per kernel file.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "ep_core/csrc/buffer_map.h"

namespace ep_core {

namespace layout {
// Blocks the layout kernel launches for `num_tokens` (the profiler sizes its buffer with it).
int grid_size(int num_tokens);
cudaError_t get_dispatch_layout(const int64_t* topk_idx, int num_tokens, int num_topk, int num_experts, int num_ranks,
                                int* num_tokens_per_rank, int* num_tokens_per_expert, bool* is_token_in_rank,
                                void* prof, cudaStream_t stream);
}  // namespace layout

namespace notify {
struct Args {
  const bool* is_token_in_rank;       // [T, R]
  const int* num_tokens_per_expert;   // [E] (this rank's tokens)
  int num_tokens, num_experts, chunk_size, num_chunks, expert_alignment;
  // outputs
  int* send_pos;                      // [T, R]: row of token t in the stream to rank d, -1 if not sent
  int* send_chunk_prefix;             // [R, kMaxChunks + 1]: rows to d before this rank's chunk c
  int* rank_prefix_matrix;            // [R, R]
  int* recv_chunk_prefix;             // [R, kMaxChunks + 1]: rows from s before s's chunk c
  int* recv_num_chunks;               // [R]
  int* recv_info;                     // [1 + E/R]: rows received, per-local-expert counts (aligned)
};
cudaError_t notify(const Args& a, const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof,
                   cudaStream_t stream);
// The rank_start barrier alone (cached dispatch, combine): one block of 32 threads.
cudaError_t barrier(const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof, cudaStream_t stream);
}  // namespace notify

// Hook mode splits an op in two launches: the send (senders only; the bulk data then moves by
// peer copies, hook.cu) and the receive (receivers / reducers only, when the hook is called).
enum HookPart : int { kHookOff = 0, kHookSend = 1, kHookReceive = 2 };

namespace dispatch {
struct Args {
  const void* x;                      // [T, hidden_bytes] contiguous
  const float* x_scales;              // [T, H/128] with strides (column-major accepted), or null
  int64_t scale_token_stride, scale_hidden_stride;
  const int64_t* topk_idx;            // [T, K] or null
  const float* topk_weights;          // [T, K] or null
  const bool* is_token_in_rank;       // [T, R]
  const int* send_pos;                // [T, R]
  const int* send_chunk_prefix;       // [R, kMaxChunks + 1]
  const int* rank_prefix_matrix;      // [R, R]
  const int* recv_chunk_prefix;       // [R, kMaxChunks + 1]
  const int* recv_num_chunks;         // [R]
  int num_tokens, hidden_bytes, num_scales, num_topk, num_experts, chunk_size, num_chunks;
  void* recv_x;
  int recv_rows;                      // rows of recv_x: a row past it is reported, never written
  float* recv_scales;                 // [N, H/128] row-major
  int64_t* recv_topk_idx;
  float* recv_topk_weights;
  int num_sender_blocks;
  int skip_send;                      // test hook: this rank writes nothing to peers
  // 0: the register path; 1..3: the pipelined bulk-copy path with that many staging buffers per
  // warp (tma.cuh). Hook mode runs on the bulk-copy path only.
  int num_tma_buffers = 0;
  int hook = kHookOff;                // HookPart
  RowRegions stage{};                 // kHookSend: where peer rows are packed in this rank's buffer
};
cudaError_t dispatch(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                     const FailCtx& f, void* prof, cudaStream_t stream);
}  // namespace dispatch

namespace combine {
struct Args {
  const void* x;                      // [N, H] bf16: this rank's received rows (dispatch order)
  const float* topk_weights;          // [N, K] or null
  const void* bias0;                  // [T, H] bf16 or null
  const void* bias1;
  const bool* is_token_in_rank;       // [T, R]
  const int* send_pos;                // [T, R]
  const int* send_chunk_prefix;       // [R, kMaxChunks + 1]
  const int* rank_prefix_matrix;      // [R, R]
  const int* recv_chunk_prefix;       // [R, kMaxChunks + 1]
  const int* recv_num_chunks;         // [R]
  int num_tokens, hidden, num_topk, chunk_size, num_chunks;
  void* out;                          // [T, H] bf16
  float* out_weights;                 // [T, K] or null
  int num_sender_blocks;
  int num_tma_buffers = 0;            // as in dispatch::Args
  int hook = kHookOff;                // kHookReceive only: the sends are peer copies (hook.cu)
};
cudaError_t combine(const Args& a, const RowRegions& rows, const PeerPtrs& peers, int num_ranks, int num_blocks,
                    const FailCtx& f, void* prof, cudaStream_t stream);
}  // namespace combine

namespace hook {
// One peer copy of a hook-mode op: bytes from this rank's memory to a peer's mapped buffer.
struct Copy {
  const void* src;
  void* dst;
  size_t bytes;
};
// Everything the copy engines move for one op, per peer: rows (x), FP8 scales, top-k ids and
// weights, each a contiguous block on both sides (plan_* below fill it from the layout).
struct Transfer {
  Copy copies[kMaxRanks][4];
  int num_copies[kMaxRanks];
};
// Dispatch: the rows `rank` packed for each peer (stage regions of its own buffer) go to the rows
// the peer's receive regions hold for `rank`. rpm_host: rank_prefix_matrix on the host [R, R].
Transfer plan_dispatch(const int* rpm_host, int num_ranks, int rank, const PeerPtrs& peers, const RowRegions& rows,
                       const RowRegions& stage, int hidden_bytes, int num_scales, int num_topk_idx,
                       int num_topk_weights);
// Combine: the rows `rank` received from each source s (contiguous in x) go back to s's combine
// region; the top-k weights likewise.
Transfer plan_combine(const int* rpm_host, int num_ranks, int rank, const PeerPtrs& peers, const RowRegions& rows,
                      const void* x, const float* topk_weights, int hidden, int num_topk);
// Issue the copies on `stream` (copy engines; no SM), then one 32-thread block releases
// hook_ready[kind][rank] = epoch on every peer (stream order puts it after the copies).
cudaError_t send(const Transfer& t, HookKind kind, const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof,
                 cudaStream_t stream);
}  // namespace hook

}  // namespace ep_core
