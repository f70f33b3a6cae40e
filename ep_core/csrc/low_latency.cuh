// Host launchers of ep_core's low-latency kernels and the plain structs they take: raw pointers,
// sizes, byte offsets and a cudaStream_t, no torch (low_latency_bindings.cpp is the torch file).
//
// The buffer map is computed once, in Python (ep_core/low_latency_layout.py, LowLatencyLayout: the one
// source of truth for offsets and sizes, tested on the CPU), and reaches the kernels as `Layout`,
// a struct of named byte offsets that the bindings fill by name. The launchers check what the
// kernels rely on (alignment, limits) and return cudaErrorInvalidValue otherwise.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "ep_core/csrc/buffer_map.h"

namespace ep_core {
namespace low_latency {

constexpr int kGroup = 128;                 // elements per FP8 scale group: the unit of every slice
constexpr int kThreads = 512;               // threads per block at most (launch bounds)
constexpr int kMaxWarpsPerBlock = kThreads / 32;
constexpr int kMaxBlocks = 256;
// Tokens per rank a buffer can be laid out for: a token's position in its expert is a 16-bit field
// of the routing record (pos << 16 | local expert), and recv rows per expert are R * T_max.
constexpr int kMaxTokens = 1024;
constexpr int kMaxLocalExperts = kMaxExperts;  // E / R <= 512 (the router's shared counters)

// Which kernel failed (ErrorInfo::kernel); ep_core/low_latency.py names them. Distinct from the
// normal kernels' KernelId (buffer_map.h) so one error vocabulary covers both.
enum KernelId : int {
  kKernelDispatch = 16,      // send and receive in one launch
  kKernelDispatchSend = 17,  // return_recv_hook: the send half
  kKernelDispatchRecv = 18,  // the hook
  kKernelCombine = 19,
  kKernelCombineSend = 20,
  kKernelCombineRecv = 21,
};

// ErrorInfo::flag values of these kernels (1 = timeout is shared with the normal kernels).
enum ErrorCode : int { kErrTimeout = 1, kErrProtocol = 4 };

// Which halves of an op a launch runs (a hook launch runs only the receive half).
enum Phases : int { kSendPhase = 1, kRecvPhase = 2 };

// Byte offsets from the buffer base, the same on every rank (LowLatencyLayout.offsets()).
struct Layout {
  // control block (fixed offsets, zeroed by clean): int32 words and [2][kMaxRanks] int32 arrays
  int64_t send_seq, send_tickets, recv_seq, recv_tickets;  // op epochs of the two halves of an op
  int64_t send_done, recv_done, send_gen, recv_gen;         // completion barriers
  int64_t abort, claim;                                     // first failure of an op / error record claim
  int64_t credit;     // [half][reader]: last op whose reads of that half the reader finished (in the writer's buffer)
  int64_t data_flag;  // [half][writer]: last op whose rows (dispatch) or partials (combine) the writer published
  int64_t cw_flag;    // [half][source]: last op whose combine weights the source published
  // the two buffer halves (op n uses half n & 1)
  int64_t half0, half_stride;
  // inside a half; per-source strides
  int64_t hdr, hdr_stride;            // [R] {int num_tokens; int pad[3]; int counts[E/R]}
  int64_t meta, meta_stride;          // [R][T_max][kMaxTopk] int32: (pos << 16) | local expert, or -1
  int64_t rows, rows_stride, row_bytes;  // [R][T_max] staged token rows (FP8 data + scales, or BF16)
  int64_t cweights, cw_stride;        // [R][T_max][kMaxTopk] float: combine weights from each source
  int64_t cpartials, cp_stride;       // [R][T_max][H] bf16: combine partial rows from each expert rank
  int64_t size;                       // bytes of the whole map
};

// Seed 002's techniques as switches; the old behaviour of each stays selectable
// (ep_core/low_latency.py LowLatencyConfig validates and documents them).
struct Knobs {
  int flat_split;        // 1: (item, slice) tasks flat over every warp of the grid; 0: contiguous items per block, one warp per item
  int count_working;     // 1: barriers count only warps/blocks with work, arrive and leave; 0: every warp arrives and waits
  int min_slice_groups;  // floor of a slice in 128-element groups (1: no floor, the finest split)
  int loads_first;       // 1: independent loads (top-k ids, rows, slots) issued before their use; 0: in a loop, each before its use
};

struct Geometry {
  int num_blocks;
  int warps_per_block;
};

// What a kernel needs to fail cleanly (the normal kernels' FailCtx, with the epoch on the device).
struct Fail {
  ErrorInfo* err;        // host-mapped
  uint64_t timeout_ns;   // bound of every spin-wait
  int rank;
  int kernel;            // KernelId of the launch
};

struct DispatchArgs {
  const void* x;                 // [T, H] bf16, contiguous
  const int64_t* topk_idx;       // [T, K]
  int num_tokens, hidden, num_topk, num_experts, max_tokens;  // T, H, K, E, T_max
  int fp8, round_scale, ue8m0;
  // outputs (stable tensors of ep_core/low_latency.py)
  void* recv_x;                  // [E/R, R * T_max, H] fp8 or bf16
  void* recv_scales;             // fp8: float [E/R][H/128][R*T_max] or, ue8m0, int32 [E/R][H/512][R*T_max]; else null
  int* recv_count;               // [E/R]
  int* recv_src_info;            // [E/R, R * T_max]: token index at its source
  int64_t* recv_layout_range;    // [E/R, R]: (begin << 32) | count of the rows from each source
  int* cumulative_stats;         // [E/R] or null: += recv_count
  // the handle (what combine reads)
  int* slot;                     // [R, T_max, K]: row id (e * R * T_max + row) of token t of source s, or -1
  int* recv_tokens;              // [R]: tokens of each source
  int* sent_mask;                // [T_max]: bit d set when this rank's token t went to rank d
};

struct CombineArgs {
  const void* x;                 // [E/R, R * T_max, H] bf16: the experts' outputs, rows as dispatched
  const int64_t* topk_idx;       // [T, K] (a -1 entry contributes nothing)
  const float* topk_weights;     // [T, K]
  int num_tokens, hidden, num_topk, num_experts, max_tokens;
  const int* slot;               // the dispatch's handle
  const int* recv_tokens;
  const int* sent_mask;
  void* out;                     // [T, H] bf16
};

// What the kernels rely on in a layout: every region 16-byte aligned and large enough for
// `num_ranks` sources of `max_tokens` tokens of `hidden` elements (LowLatencyLayout builds it so;
// this catches a layout from another shape).
inline bool layout_ok(const Layout& L, int num_ranks, int max_tokens, int hidden, int num_local) {
  const int64_t offs[] = {L.send_seq, L.send_tickets, L.recv_seq, L.recv_tickets, L.send_done, L.recv_done,
                          L.send_gen, L.recv_gen, L.abort, L.claim, L.credit, L.data_flag, L.cw_flag,
                          L.half0, L.half_stride, L.hdr, L.hdr_stride, L.meta, L.meta_stride, L.rows,
                          L.rows_stride, L.row_bytes, L.cweights, L.cw_stride, L.cpartials, L.cp_stride};
  for (int64_t o : offs)
    if (o < 0 || o % 16 != 0) return false;
  const int64_t T = max_tokens;
  return L.hdr_stride >= 16 + 4 * int64_t(num_local) && L.meta_stride >= T * kMaxTopk * 4 &&
         L.row_bytes >= 2 * int64_t(hidden) && L.rows_stride >= T * L.row_bytes &&
         L.cw_stride >= T * kMaxTopk * 4 && L.cp_stride >= T * 2 * int64_t(hidden) &&
         L.hdr + num_ranks * L.hdr_stride <= L.half_stride && L.meta + num_ranks * L.meta_stride <= L.half_stride &&
         L.rows + num_ranks * L.rows_stride <= L.half_stride && L.cweights + num_ranks * L.cw_stride <= L.half_stride &&
         L.cpartials + num_ranks * L.cp_stride <= L.half_stride && L.half0 + 2 * L.half_stride <= L.size;
}

// What the kernels rely on in a launch: the split's duty warps (routers, weights, expert
// bookkeeping) one per block at most for the routers, whole warps, a known phase set.
inline bool launch_ok(const Knobs& k, const Geometry& g, int num_ranks, int phases) {
  return g.num_blocks >= num_ranks && g.num_blocks <= kMaxBlocks && g.warps_per_block >= 1 &&
         g.warps_per_block <= kMaxWarpsPerBlock && k.min_slice_groups >= 1 && phases >= 1 &&
         phases <= (kSendPhase | kRecvPhase);
}

cudaError_t dispatch(const DispatchArgs& a, const Layout& L, const PeerPtrs& peers, int num_ranks, const Knobs& k,
                     const Geometry& g, int phases, const Fail& f, void* prof, cudaStream_t stream);
cudaError_t combine(const CombineArgs& a, const Layout& L, const PeerPtrs& peers, int num_ranks, const Knobs& k,
                    const Geometry& g, int phases, const Fail& f, void* prof, cudaStream_t stream);

}  // namespace low_latency
}  // namespace ep_core
