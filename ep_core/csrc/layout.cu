// get_dispatch_layout: per-rank and per-expert token counts and is_token_in_rank from top-k ids.
// Expert e lives on rank e / (E / R); -1 means "no expert"; a token counts once per rank.
#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/common.cuh"

namespace ep_core {
namespace layout {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 128;

int grid_size(int num_tokens) {
  const int b = (num_tokens + kThreads - 1) / kThreads;
  return b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b);
}

template <int kNumRanks>
__global__ void __launch_bounds__(kThreads) layout_kernel(const int64_t* topk_idx, int num_tokens, int num_topk,
                                                          int num_experts, int* per_rank, int* per_expert,
                                                          bool* in_rank, void* prof) {
  __shared__ int s_expert[kMaxExperts];
  __shared__ int s_rank[kNumRanks];
  epscope::WarpRecorder rec;
  rec.init(prof);
  rec.begin(ph::kLayout, blockIdx.x);
  for (int i = threadIdx.x; i < num_experts; i += blockDim.x) s_expert[i] = 0;
  if (threadIdx.x < kNumRanks) s_rank[threadIdx.x] = 0;
  __syncthreads();
  const int experts_per_rank = num_experts / kNumRanks;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < num_tokens; t += gridDim.x * blockDim.x) {
    uint32_t mask = 0;
    for (int k = 0; k < num_topk; ++k) {
      const int64_t e = topk_idx[int64_t(t) * num_topk + k];
      if (e < 0 || e >= num_experts) continue;  // -1: no expert (out-of-range ids are refused on the host)
      atomicAdd(&s_expert[e], 1);
      mask |= 1u << (int(e) / experts_per_rank);
    }
#pragma unroll
    for (int r = 0; r < kNumRanks; ++r) {
      const bool in = (mask >> r) & 1u;
      in_rank[int64_t(t) * kNumRanks + r] = in;
      if (in) atomicAdd(&s_rank[r], 1);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < num_experts; i += blockDim.x)
    if (s_expert[i] != 0) atomicAdd(&per_expert[i], s_expert[i]);
  if (threadIdx.x < kNumRanks && s_rank[threadIdx.x] != 0) atomicAdd(&per_rank[threadIdx.x], s_rank[threadIdx.x]);
  rec.end(ph::kLayout, blockIdx.x);
  rec.finish();
}

// per_rank and per_expert must be zeroed by the caller (bindings.cpp allocates them zeroed).
cudaError_t get_dispatch_layout(const int64_t* topk_idx, int num_tokens, int num_topk, int num_experts, int num_ranks,
                                int* per_rank, int* per_expert, bool* in_rank, void* prof, cudaStream_t stream) {
  if (num_experts > kMaxExperts || num_topk > kMaxTopk) return cudaErrorInvalidValue;
  const int grid = grid_size(num_tokens);
  EP_SWITCH_RANKS(num_ranks, layout_kernel<kR><<<grid, kThreads, 0, stream>>>(
                                 topk_idx, num_tokens, num_topk, num_experts, per_rank, per_expert, in_rank, prof));
  return cudaGetLastError();
}

}  // namespace layout
}  // namespace ep_core
