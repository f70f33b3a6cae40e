// Hook mode's copy-engine half: the peer copies of one op and the flag that says they landed.
//
// A hook-mode op is split in two (seed 000, DeepEP PR #347, here over NVLink): the send returns
// at once and the receive runs when the caller calls the hook. Between the two, nothing holds an
// SM: the bulk data moves by peer copies (cudaMemcpyAsync between this rank's memory and a peer's
// buffer mapped by CUDA IPC, executed by the copy engines), then one 32-thread block releases
// hook_ready[kind][this rank] = epoch on every peer. The receive kernels (dispatch.cu's copy-out,
// combine.cu's reducers, launched receive-only) wait for that flag, bounded like every wait.
//
// What is copied, per peer, is a contiguous block on both sides, laid out by rows.cuh:
//   dispatch: the rows this rank packed for peer d (its staging region, at peer_rows_before(me, d))
//             -> d's receive region at prev_rows(me, d): exactly where the direct path writes them;
//   combine:  the rows this rank received from s (contiguous in x, at prev_rows(s, me))
//             -> s's combine region at peer_rows_before(s, me): where the direct path writes them.
// So the receive halves are the ordinary kernels with another flag to wait on.
#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"
#include "ep_core/csrc/rows.cuh"

namespace ep_core {
namespace hook {

namespace {

void add(Transfer& t, int peer, const void* src, void* dst, size_t bytes) {
  if (bytes == 0) return;
  t.copies[peer][t.num_copies[peer]++] = Copy{src, dst, bytes};
}

}  // namespace

Transfer plan_dispatch(const int* rpm, int num_ranks, int rank, const PeerPtrs& peers, const RowRegions& rows,
                       const RowRegions& stage, int hidden_bytes, int num_scales, int num_topk_idx,
                       int num_topk_weights) {
  Transfer t{};
  const char* own = peers.base[rank];
  for (int d = 0; d < num_ranks; ++d) {
    if (d == rank) continue;
    const size_t n = size_t(rows::rows_between(rpm, rank, d, num_ranks));
    const size_t s0 = size_t(rows::peer_rows_before(rpm, rank, d, num_ranks));  // row in my staging region
    const size_t r0 = size_t(rows::prev_rows(rpm, rank, d, num_ranks));         // row in d's receive region
    char* peer = peers.base[d];
    add(t, d, own + stage.x + s0 * hidden_bytes, peer + rows.x + r0 * hidden_bytes, n * hidden_bytes);
    const size_t sb = size_t(num_scales) * sizeof(float);
    add(t, d, own + stage.scales + s0 * sb, peer + rows.scales + r0 * sb, n * sb);
    const size_t ib = size_t(num_topk_idx) * sizeof(int64_t);
    add(t, d, own + stage.topk_idx + s0 * ib, peer + rows.topk_idx + r0 * ib, n * ib);
    const size_t wb = size_t(num_topk_weights) * sizeof(float);
    add(t, d, own + stage.topk_weights + s0 * wb, peer + rows.topk_weights + r0 * wb, n * wb);
  }
  return t;
}

Transfer plan_combine(const int* rpm, int num_ranks, int rank, const PeerPtrs& peers, const RowRegions& rows,
                      const void* x, const float* topk_weights, int hidden, int num_topk) {
  Transfer t{};
  const size_t rb = size_t(hidden) * 2;  // bf16 rows
  for (int s = 0; s < num_ranks; ++s) {
    if (s == rank) continue;
    const size_t n = size_t(rows::rows_between(rpm, s, rank, num_ranks));
    const size_t src = size_t(rows::prev_rows(rpm, s, rank, num_ranks));          // row in my x
    const size_t dst = size_t(rows::peer_rows_before(rpm, s, rank, num_ranks));   // row in s's combine region
    char* peer = peers.base[s];
    add(t, s, static_cast<const char*>(x) + src * rb, peer + rows.x + dst * rb, n * rb);
    if (topk_weights != nullptr) {
      const size_t wb = size_t(num_topk) * sizeof(float);
      add(t, s, reinterpret_cast<const char*>(topk_weights) + src * wb, peer + rows.topk_weights + dst * wb, n * wb);
    }
  }
  return t;
}

// One warp: lane d releases this op's flag on peer d. Stream order puts this kernel after the
// op's peer copies, which the copy engines have completed (written into the peers' memory) by
// the time it starts, so a peer that acquires the flag reads the rows.
template <int kNumRanks>
__global__ void __launch_bounds__(32, 1) signal_kernel(PeerPtrs peers, int kind, FailCtx f, void* prof) {
  f = current_op(f);  // the epoch of the op whose send this is (common.cuh)
  epscope::WarpRecorder rec;
  rec.init(prof);
  const int d = threadIdx.x;
  if (d < kNumRanks && d != f.rank) st_release_sys(&signals(peers.base[d])->hook_ready[kind][f.rank], f.epoch);
  for (int p = 0; p < kNumRanks; ++p)
    if (p != f.rank) rec.instant(ph::kPublishHook, p);
  rec.finish();
}

cudaError_t send(const Transfer& t, HookKind kind, const PeerPtrs& peers, int num_ranks, const FailCtx& f, void* prof,
                 cudaStream_t stream) {
  if (kind != kHookDispatch && kind != kHookCombine) return cudaErrorInvalidValue;
  for (int p = 0; p < num_ranks; ++p)
    for (int i = 0; i < t.num_copies[p]; ++i) {
      const Copy& c = t.copies[p][i];
      const cudaError_t e = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) return e;
    }
  EP_SWITCH_RANKS(num_ranks, signal_kernel<kR><<<1, 32, 0, stream>>>(peers, int(kind), f, prof));
  return cudaGetLastError();
}

}  // namespace hook
}  // namespace ep_core
