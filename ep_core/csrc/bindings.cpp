// The one torch file of ep_core: tensors -> raw pointers for the kernel launchers (api.cuh),
// buffer allocation and CUDA IPC mapping, the host-mapped error record. Every launch takes its
// stream as an integer (torch.cuda.Stream.cuda_stream), so this file needs no c10/cuda headers
// and a CPU-only torch can syntax-check it (tests/ep_core/test_kernels_compile.py).
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <cstring>
#include <string>
#include <vector>

#include "ep_core/csrc/api.cuh"

namespace {

using ep_core::PeerPtrs;
using ep_core::RowRegions;

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "ep_core: ", what, ": ", cudaGetErrorString(e));
}

template <typename T>
T* ptr_or_null(const c10::optional<torch::Tensor>& t) {
  return t.has_value() && t->defined() ? reinterpret_cast<T*>(t->data_ptr()) : nullptr;
}

void* prof_ptr(const c10::optional<torch::Tensor>& prof) {
  if (!prof.has_value() || !prof->defined()) return nullptr;
  TORCH_CHECK(prof->is_cuda() && prof->is_contiguous(), "ep_core: profile buffer must be a contiguous CUDA tensor");
  return prof->data_ptr();
}

PeerPtrs make_peers(const std::vector<int64_t>& peers) {
  TORCH_CHECK(!peers.empty() && peers.size() <= size_t(ep_core::kMaxRanks), "ep_core: 1..", ep_core::kMaxRanks,
              " ranks, got ", peers.size());
  PeerPtrs p{};
  for (size_t i = 0; i < peers.size(); ++i) p.base[i] = reinterpret_cast<char*>(peers[i]);
  return p;
}

ep_core::FailCtx make_fail(const std::vector<int64_t>& peers, int64_t err_dev, int64_t timeout_ns, int64_t rank,
                           int64_t epoch, int kernel) {
  TORCH_CHECK(rank >= 0 && rank < int64_t(peers.size()), "ep_core: rank ", rank, " outside the ", peers.size(),
              " mapped buffers");
  int* claim = reinterpret_cast<int*>(reinterpret_cast<char*>(peers[rank]) + offsetof(ep_core::Signals, error_claim));
  return ep_core::FailCtx{reinterpret_cast<ep_core::ErrorInfo*>(err_dev), claim, uint64_t(timeout_ns), int(rank),
                          int(epoch), kernel};
}

RowRegions make_rows(const std::vector<int64_t>& r) {
  TORCH_CHECK(r.size() == 5, "ep_core: row regions are (x, scales, topk_idx, topk_weights, capacity)");
  return RowRegions{size_t(r[0]), size_t(r[1]), size_t(r[2]), size_t(r[3]), int(r[4])};
}

cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }

torch::Tensor i32(int64_t n) {
  return torch::empty({n}, torch::dtype(torch::kInt32).device(torch::kCUDA));
}

// ---- buffers ------------------------------------------------------------------------------
int64_t alloc_buffer(int64_t nbytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, size_t(nbytes)), "cudaMalloc buffer");
  // zero once: every signal slot starts below epoch 1
  check_cuda(cudaMemset(p, 0, size_t(nbytes) < ep_core::kDataOffset ? size_t(nbytes) : ep_core::kDataOffset),
             "cudaMemset buffer");
  check_cuda(cudaDeviceSynchronize(), "buffer init");
  return reinterpret_cast<int64_t>(p);
}
void free_buffer(int64_t p) { check_cuda(cudaFree(reinterpret_cast<void*>(p)), "cudaFree buffer"); }

py::bytes ipc_handle(int64_t p) {
  cudaIpcMemHandle_t h;
  check_cuda(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(p)), "cudaIpcGetMemHandle");
  return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
}
int64_t ipc_open(const std::string& handle) {
  TORCH_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), "ep_core: bad IPC handle size ", handle.size());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  check_cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return reinterpret_cast<int64_t>(p);
}
void ipc_close(int64_t p) { check_cuda(cudaIpcCloseMemHandle(reinterpret_cast<void*>(p)), "cudaIpcCloseMemHandle"); }

// Host-mapped error record: returns (host pointer, device pointer).
std::tuple<int64_t, int64_t> alloc_error() {
  void* h = nullptr;
  check_cuda(cudaHostAlloc(&h, sizeof(ep_core::ErrorInfo), cudaHostAllocMapped | cudaHostAllocPortable),
             "cudaHostAlloc error record");
  std::memset(h, 0, sizeof(ep_core::ErrorInfo));
  void* d = nullptr;
  check_cuda(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
  return {reinterpret_cast<int64_t>(h), reinterpret_cast<int64_t>(d)};
}
void free_error(int64_t h) { check_cuda(cudaFreeHost(reinterpret_cast<void*>(h)), "cudaFreeHost"); }
std::vector<int64_t> read_error(int64_t h) {
  const volatile ep_core::ErrorInfo* e = reinterpret_cast<const volatile ep_core::ErrorInfo*>(h);
  return {e->flag, e->rank, e->kernel, e->phase, e->is_barrier, e->channel, e->peer, e->epoch};
}

// ---- kernels ------------------------------------------------------------------------------
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> get_dispatch_layout(const torch::Tensor& topk_idx,
                                                                            int64_t num_experts, int64_t num_ranks,
                                                                            const c10::optional<torch::Tensor>& prof, int64_t stream) {
  TORCH_CHECK(topk_idx.is_cuda() && topk_idx.dim() == 2 && topk_idx.scalar_type() == torch::kInt64 &&
                  topk_idx.is_contiguous(),
              "ep_core: topk_idx must be a contiguous CUDA int64 [T, K] tensor");
  const int64_t T = topk_idx.size(0), K = topk_idx.size(1);
  auto opts = torch::dtype(torch::kInt32).device(torch::kCUDA);
  // zeroed on the launch stream: torch::zeros would fill on the current stream, unordered with it
  auto per_rank = torch::empty({num_ranks}, opts);
  auto per_expert = torch::empty({num_experts}, opts);
  check_cuda(cudaMemsetAsync(per_rank.data_ptr(), 0, per_rank.nbytes(), as_stream(stream)), "memset");
  check_cuda(cudaMemsetAsync(per_expert.data_ptr(), 0, per_expert.nbytes(), as_stream(stream)), "memset");
  auto in_rank = torch::empty({T, num_ranks}, torch::dtype(torch::kBool).device(torch::kCUDA));
  if (T > 0)
    check_cuda(ep_core::layout::get_dispatch_layout(topk_idx.data_ptr<int64_t>(), int(T), int(K), int(num_experts),
                                                    int(num_ranks), per_rank.data_ptr<int>(),
                                                    per_expert.data_ptr<int>(), in_rank.data_ptr<bool>(),
                                                    prof_ptr(prof), as_stream(stream)),
               "layout launch");
  return {per_rank, per_expert, in_rank};
}

std::vector<torch::Tensor> notify(const torch::Tensor& is_token_in_rank, const torch::Tensor& num_tokens_per_expert,
                                  int64_t num_experts, int64_t chunk_size, int64_t num_chunks,
                                  int64_t expert_alignment, const std::vector<int64_t>& peers, int64_t rank,
                                  int64_t epoch, int64_t err_dev, int64_t timeout_ns,
                                  const c10::optional<torch::Tensor>& prof, int64_t stream) {
  const int64_t R = int64_t(peers.size()), T = is_token_in_rank.size(0);
  TORCH_CHECK(is_token_in_rank.is_contiguous() && is_token_in_rank.scalar_type() == torch::kBool &&
                  is_token_in_rank.size(1) == R,
              "ep_core: is_token_in_rank must be a contiguous bool [T, num_ranks] tensor");
  TORCH_CHECK(num_tokens_per_expert.is_contiguous() && num_tokens_per_expert.scalar_type() == torch::kInt32 &&
                  num_tokens_per_expert.numel() == num_experts,
              "ep_core: num_tokens_per_expert must be a contiguous int32 [num_experts] tensor");
  const int64_t P = ep_core::kMaxChunks + 1;
  auto send_pos = torch::empty({T, R}, torch::dtype(torch::kInt32).device(torch::kCUDA));
  auto send_chunk_prefix = i32(R * P).view({R, P});
  auto rpm = i32(R * R).view({R, R});
  auto recv_chunk_prefix = i32(R * P).view({R, P});
  auto recv_num_chunks = i32(R);
  auto recv_info = i32(1 + num_experts / R);
  ep_core::notify::Args a{};
  a.is_token_in_rank = is_token_in_rank.data_ptr<bool>();
  a.num_tokens_per_expert = num_tokens_per_expert.data_ptr<int>();
  a.num_tokens = int(T);
  a.num_experts = int(num_experts);
  a.chunk_size = int(chunk_size);
  a.num_chunks = int(num_chunks);
  a.expert_alignment = int(expert_alignment);
  a.send_pos = send_pos.data_ptr<int>();
  a.send_chunk_prefix = send_chunk_prefix.data_ptr<int>();
  a.rank_prefix_matrix = rpm.data_ptr<int>();
  a.recv_chunk_prefix = recv_chunk_prefix.data_ptr<int>();
  a.recv_num_chunks = recv_num_chunks.data_ptr<int>();
  a.recv_info = recv_info.data_ptr<int>();
  check_cuda(ep_core::notify::notify(a, make_peers(peers), int(R),
                                     make_fail(peers, err_dev, timeout_ns, rank, epoch, ep_core::kKernelNotify),
                                     prof_ptr(prof), as_stream(stream)),
             "notify launch");
  return {send_pos, send_chunk_prefix, rpm, recv_chunk_prefix, recv_num_chunks, recv_info};
}

void barrier(const std::vector<int64_t>& peers, int64_t rank, int64_t epoch, int64_t err_dev, int64_t timeout_ns,
             const c10::optional<torch::Tensor>& prof, int64_t stream) {
  check_cuda(ep_core::notify::barrier(make_peers(peers), int(peers.size()),
                                      make_fail(peers, err_dev, timeout_ns, rank, epoch, ep_core::kKernelBarrier),
                                      prof_ptr(prof), as_stream(stream)),
             "barrier launch");
}

// handle: (is_token_in_rank, send_pos, send_chunk_prefix, rank_prefix_matrix, recv_chunk_prefix, recv_num_chunks)
void dispatch(const torch::Tensor& x, const c10::optional<torch::Tensor>& x_scales,
              const c10::optional<torch::Tensor>& topk_idx, const c10::optional<torch::Tensor>& topk_weights,
              const std::vector<torch::Tensor>& handle, int64_t chunk_size, int64_t num_chunks, int64_t num_experts,
              const torch::Tensor& recv_x, const c10::optional<torch::Tensor>& recv_scales,
              const c10::optional<torch::Tensor>& recv_topk_idx, const c10::optional<torch::Tensor>& recv_topk_weights,
              const std::vector<int64_t>& regions, const std::vector<int64_t>& peers, int64_t rank, int64_t epoch,
              int64_t err_dev, int64_t timeout_ns, int64_t num_blocks, int64_t num_sender_blocks, bool skip_send,
              const c10::optional<torch::Tensor>& prof, int64_t stream) {
  TORCH_CHECK(handle.size() == 6, "ep_core: dispatch handle tensors");
  TORCH_CHECK(x.is_contiguous() && recv_x.is_contiguous(), "ep_core: x and recv_x must be contiguous");
  ep_core::dispatch::Args a{};
  a.x = x.data_ptr();
  a.x_scales = ptr_or_null<const float>(x_scales);
  if (a.x_scales != nullptr) {
    a.scale_token_stride = x_scales->stride(0);
    a.scale_hidden_stride = x_scales->stride(1);
    a.num_scales = int(x_scales->size(1));
  }
  a.topk_idx = ptr_or_null<const int64_t>(topk_idx);
  a.topk_weights = ptr_or_null<const float>(topk_weights);
  a.num_topk = topk_idx.has_value() ? int(topk_idx->size(1)) : 0;
  a.is_token_in_rank = handle[0].data_ptr<bool>();
  a.send_pos = handle[1].data_ptr<int>();
  a.send_chunk_prefix = handle[2].data_ptr<int>();
  a.rank_prefix_matrix = handle[3].data_ptr<int>();
  a.recv_chunk_prefix = handle[4].data_ptr<int>();
  a.recv_num_chunks = handle[5].data_ptr<int>();
  a.num_tokens = int(x.size(0));
  a.hidden_bytes = int(x.size(1) * x.element_size());
  a.num_experts = int(num_experts);
  a.chunk_size = int(chunk_size);
  a.num_chunks = int(num_chunks);
  a.recv_x = recv_x.data_ptr();
  a.recv_rows = int(recv_x.size(0));
  a.recv_scales = ptr_or_null<float>(recv_scales);
  a.recv_topk_idx = ptr_or_null<int64_t>(recv_topk_idx);
  a.recv_topk_weights = ptr_or_null<float>(recv_topk_weights);
  a.num_sender_blocks = int(num_sender_blocks);
  a.skip_send = skip_send ? 1 : 0;
  check_cuda(ep_core::dispatch::dispatch(a, make_rows(regions), make_peers(peers), int(peers.size()), int(num_blocks),
                                         make_fail(peers, err_dev, timeout_ns, rank, epoch, ep_core::kKernelDispatch),
                                         prof_ptr(prof), as_stream(stream)),
             "dispatch launch");
}

void combine(const torch::Tensor& x, const c10::optional<torch::Tensor>& topk_weights,
             const c10::optional<torch::Tensor>& bias0, const c10::optional<torch::Tensor>& bias1,
             const std::vector<torch::Tensor>& handle, int64_t chunk_size, int64_t num_chunks,
             const torch::Tensor& out, const c10::optional<torch::Tensor>& out_weights,
             const std::vector<int64_t>& regions, const std::vector<int64_t>& peers, int64_t rank, int64_t epoch,
             int64_t err_dev, int64_t timeout_ns, int64_t num_blocks, int64_t num_sender_blocks,
             const c10::optional<torch::Tensor>& prof, int64_t stream) {
  TORCH_CHECK(handle.size() == 6, "ep_core: combine handle tensors");
  TORCH_CHECK(x.is_contiguous() && out.is_contiguous() && x.scalar_type() == torch::kBFloat16,
              "ep_core: combine x must be a contiguous bf16 tensor");
  ep_core::combine::Args a{};
  a.x = x.data_ptr();
  a.topk_weights = ptr_or_null<const float>(topk_weights);
  a.bias0 = ptr_or_null<const void>(bias0);
  a.bias1 = ptr_or_null<const void>(bias1);
  a.is_token_in_rank = handle[0].data_ptr<bool>();
  a.send_pos = handle[1].data_ptr<int>();
  a.send_chunk_prefix = handle[2].data_ptr<int>();
  a.rank_prefix_matrix = handle[3].data_ptr<int>();
  a.recv_chunk_prefix = handle[4].data_ptr<int>();
  a.recv_num_chunks = handle[5].data_ptr<int>();
  a.num_tokens = int(out.size(0));
  a.hidden = int(out.size(1));
  a.num_topk = topk_weights.has_value() ? int(topk_weights->size(1)) : 0;
  a.chunk_size = int(chunk_size);
  a.num_chunks = int(num_chunks);
  a.out = out.data_ptr();
  a.out_weights = ptr_or_null<float>(out_weights);
  a.num_sender_blocks = int(num_sender_blocks);
  check_cuda(ep_core::combine::combine(a, make_rows(regions), make_peers(peers), int(peers.size()), int(num_blocks),
                                       make_fail(peers, err_dev, timeout_ns, rank, epoch, ep_core::kKernelCombine),
                                       prof_ptr(prof), as_stream(stream)),
             "combine launch");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ep_core intranode dispatch/combine kernels";
  m.def("profile_enabled", [] { return EPSCOPE_PROFILE != 0; });
  m.def("limits", [] {
    py::dict d;
    d["max_ranks"] = ep_core::kMaxRanks;
    d["max_experts"] = ep_core::kMaxExperts;
    d["max_topk"] = ep_core::kMaxTopk;
    d["max_chunks"] = ep_core::kMaxChunks;
    d["max_hidden"] = ep_core::kMaxHidden;
    d["threads"] = ep_core::kNumThreads;
    d["notify_threads"] = ep_core::kNotifyThreads;
    d["data_offset"] = int64_t(ep_core::kDataOffset);
    d["clock_sync_offset"] = int64_t(offsetof(ep_core::Signals, clock_sync));
    d["clock_sync_bytes"] = int64_t(sizeof(ep_core::Signals::clock_sync));
    return d;
  });
  m.def("layout_grid", &ep_core::layout::grid_size);
  m.def("alloc_buffer", &alloc_buffer);
  m.def("free_buffer", &free_buffer);
  m.def("ipc_handle", &ipc_handle);
  m.def("ipc_open", &ipc_open);
  m.def("ipc_close", &ipc_close);
  m.def("alloc_error", &alloc_error);
  m.def("free_error", &free_error);
  m.def("read_error", &read_error);
  m.def("get_dispatch_layout", &get_dispatch_layout);
  m.def("notify", &notify);
  m.def("barrier", &barrier);
  m.def("dispatch", &dispatch);
  m.def("combine", &combine);
}
