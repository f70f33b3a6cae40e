// The one torch file of ep_core: buffer allocation and CUDA IPC mapping, the host-mapped error
// record, and the Launcher that turns one dispatch / combine call into its stream ordering,
// output allocations and kernel launches (api.cuh) in a single call from Python.
//
// Host cost (issue 9): what does not change between calls is built once into named objects
// (RowRegions, HandleTensors, DispatchPlan, CombinePlan, the Launcher with its peers, error
// context, streams and events); a call passes only what changes (its tensors, the compute
// stream, the mode, the profile buffers). Every type is module_local: the compiled-out and the
// instrumented builds of this file are loaded side by side in one process, each with its own.
//
// Streams travel as integers (torch.cuda.Stream.cuda_stream) and torch's own stream objects are
// built from (stream_id, device_index, device_type) with c10/core only, so this file needs no
// c10/cuda headers and a CPU-only torch can syntax-check it (tests/ep_core/test_kernels_compile.py).
//
// Nothing here synchronises or allocates outside torch's caching allocator on the dispatch and
// combine paths: they can be captured in a CUDA graph (the op's epoch lives on the device,
// common.cuh open_op). The non-cached dispatch's read_back is the one synchronising call.
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <cstring>
#include <string>
#include <vector>

#include "ep_core/csrc/api.cuh"
#include "ep_core/csrc/rows.cuh"
#include "ep_core/csrc/scale_layout.h"

namespace {

using ep_core::PeerPtrs;
using ep_core::RowRegions;

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "ep_core: ", what, ": ", cudaGetErrorString(e));
}

cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }

template <typename T>
T* ptr_or_null(const c10::optional<torch::Tensor>& t) {
  return t.has_value() && t->defined() ? reinterpret_cast<T*>(t->data_ptr()) : nullptr;
}
bool given(const c10::optional<torch::Tensor>& t) { return t.has_value() && t->defined(); }
void* as_ptr(int64_t p) { return reinterpret_cast<void*>(p); }

// ---- buffers ------------------------------------------------------------------------------
int64_t alloc_buffer(int64_t nbytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, size_t(nbytes)), "cudaMalloc buffer");
  // zero once: every signal slot (and op_epoch) starts below epoch 1
  check_cuda(cudaMemset(p, 0, size_t(nbytes) < ep_core::kDataOffset ? size_t(nbytes) : ep_core::kDataOffset),
             "cudaMemset buffer");
  check_cuda(cudaDeviceSynchronize(), "buffer init");
  return reinterpret_cast<int64_t>(p);
}
void free_buffer(int64_t p) { check_cuda(cudaFree(as_ptr(p)), "cudaFree buffer"); }

py::bytes ipc_handle(int64_t p) {
  cudaIpcMemHandle_t h;
  check_cuda(cudaIpcGetMemHandle(&h, as_ptr(p)), "cudaIpcGetMemHandle");
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
void ipc_close(int64_t p) { check_cuda(cudaIpcCloseMemHandle(as_ptr(p)), "cudaIpcCloseMemHandle"); }

// ---- the error record ---------------------------------------------------------------------
// A copy of the host-mapped ErrorInfo, field by field (buffer_map.h says what each one means).
struct ErrorReport {
  ep_core::ErrorInfo info;
};

// The host-mapped ErrorInfo a rank's kernels fill on their first failure. flag() is one volatile
// host read (no CUDA call): the Buffer looks at it at the start and end of every call.
class ErrorRecord {
 public:
  ErrorRecord() {
    void* h = nullptr;
    check_cuda(cudaHostAlloc(&h, sizeof(ep_core::ErrorInfo), cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc error record");
    std::memset(h, 0, sizeof(ep_core::ErrorInfo));
    void* d = nullptr;
    check_cuda(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");
    host_ = static_cast<ep_core::ErrorInfo*>(h);
    device_ = reinterpret_cast<int64_t>(d);
  }
  ErrorRecord(const ErrorRecord&) = delete;
  ErrorRecord& operator=(const ErrorRecord&) = delete;
  ~ErrorRecord() {
    if (host_ != nullptr) cudaFreeHost(host_);  // no check: may run after the CUDA context is gone
  }
  int flag() const { return host_ == nullptr ? 0 : reinterpret_cast<const volatile ep_core::ErrorInfo*>(host_)->flag; }
  ErrorReport report() const {
    ErrorReport r{};
    if (host_ != nullptr) {
      const volatile ep_core::ErrorInfo* e = host_;
      r.info = ep_core::ErrorInfo{e->flag, e->rank, e->kernel, e->phase, e->is_barrier, e->channel, e->peer, e->epoch};
    }
    return r;
  }
  int64_t device() const { return host_ == nullptr ? 0 : device_; }
  void close() {
    if (host_ != nullptr) check_cuda(cudaFreeHost(host_), "cudaFreeHost error record");
    host_ = nullptr;
  }

 private:
  ep_core::ErrorInfo* host_ = nullptr;
  int64_t device_ = 0;
};

// ---- named values of a call ---------------------------------------------------------------
// What notify produces and every later kernel of the same routing reads (DispatchHandle's tensors).
struct HandleTensors {
  torch::Tensor is_token_in_rank, send_pos, send_chunk_prefix, rank_prefix_matrix, recv_chunk_prefix, recv_num_chunks;
  int num_tokens = 0, chunk_size = 1, num_chunks = 0;
};

HandleTensors make_handle(torch::Tensor is_token_in_rank, torch::Tensor send_pos, torch::Tensor send_chunk_prefix,
                          torch::Tensor rank_prefix_matrix, torch::Tensor recv_chunk_prefix,
                          torch::Tensor recv_num_chunks, int64_t num_tokens, int64_t chunk_size, int64_t num_chunks) {
  const int64_t R = rank_prefix_matrix.size(0), P = ep_core::kMaxChunks + 1;
  auto ok = [](const torch::Tensor& t, torch::ScalarType type) {
    return t.is_cuda() && t.is_contiguous() && t.scalar_type() == type;
  };
  TORCH_CHECK(ok(is_token_in_rank, torch::kBool) && is_token_in_rank.dim() == 2 &&
                  is_token_in_rank.size(0) == num_tokens && is_token_in_rank.size(1) == R,
              "ep_core: handle is_token_in_rank must be a contiguous CUDA bool [T, R] tensor");
  TORCH_CHECK(ok(send_pos, torch::kInt32) && send_pos.sizes() == is_token_in_rank.sizes(),
              "ep_core: handle send_pos must be a contiguous CUDA int32 [T, R] tensor");
  TORCH_CHECK(ok(rank_prefix_matrix, torch::kInt32) && rank_prefix_matrix.dim() == 2 && rank_prefix_matrix.size(1) == R,
              "ep_core: handle rank_prefix_matrix must be a contiguous CUDA int32 [R, R] tensor");
  for (const torch::Tensor* t : {&send_chunk_prefix, &recv_chunk_prefix})
    TORCH_CHECK(ok(*t, torch::kInt32) && t->numel() == R * P, "ep_core: handle chunk prefixes must be int32 [R, ",
                P, "]");
  TORCH_CHECK(ok(recv_num_chunks, torch::kInt32) && recv_num_chunks.numel() == R,
              "ep_core: handle recv_num_chunks must be int32 [R]");
  TORCH_CHECK(chunk_size >= 1 && num_chunks >= 0 && num_chunks <= ep_core::kMaxChunks,
              "ep_core: handle chunking out of range");
  return HandleTensors{is_token_in_rank, send_pos, send_chunk_prefix, rank_prefix_matrix, recv_chunk_prefix,
                       recv_num_chunks, int(num_tokens), int(chunk_size), int(num_chunks)};
}

// notify's outputs: the handle's tensors and the read-back vector [rows received, per-local-expert counts].
struct Notified {
  HandleTensors handle;
  torch::Tensor recv_info;
};

// get_dispatch_layout's outputs (DeepEP's tuple, minus the RDMA count and the event).
struct DispatchLayout {
  torch::Tensor num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank;
};

// Hook mode (return_recv_hook, hook.cu): the send half issues peer copies planned on the host from
// the handle's rank_prefix_matrix, read back once (rank_prefix, [R * R], the same on every rank).
struct HookPlan {
  bool on = false;
  std::vector<int> rank_prefix;
  RowRegions stage{};          // dispatch: where this rank packs its peers' rows (after the receive regions)
};

// Everything of a dispatch that is fixed by (handle, dtype, top-k presence, config,
// num_worst_tokens, hook mode): built once per such key (ep_core/buffer.py keeps them on the handle).
struct DispatchPlan {
  HandleTensors handle;
  RowRegions rows{};
  int hidden = 0;
  bool fp8 = false;
  int num_topk = 0;            // top-k columns of topk_idx, 0 for a cached dispatch
  bool with_weights = false;
  int num_experts = 0;
  int recv_rows = 0;           // rows of recv_x
  int fill_from = 0;           // padding rows [fill_from, recv_rows) of num_worst_tokens get topk -1 / weight 0
  int num_blocks = 0, num_sender_blocks = 0;
  bool open_op = true;         // launch the start barrier first (a cached dispatch); notify opened it otherwise
  int num_tma_buffers = 0;     // 0: the register path; 1..3: the bulk-copy path's staging buffers per warp
  HookPlan hook;               // return_recv_hook: the send packs into `hook.stage` and the copy engines move it
};

struct CombinePlan {
  HandleTensors handle;
  RowRegions rows{};
  int hidden = 0;
  int num_topk = 0;            // columns of topk_weights, 0 without
  int min_rows = 0;            // x holds at least the rows the dispatch received
  int num_blocks = 0, num_sender_blocks = 0;
  int num_tma_buffers = 0;     // as in DispatchPlan
  HookPlan hook;               // return_recv_hook: the send is peer copies of x's rows (no kernel but the signal)
};

// A hook plan, checked where it is built: every copy the send half will issue lands inside the
// receiving rank's region, and every rank's packed rows fit its staging region (both from the same
// rank_prefix on every rank, so all ranks accept or refuse the same plan).
HookPlan make_hook_plan(bool on, std::vector<int> rank_prefix, const c10::optional<RowRegions>& stage,
                        const HandleTensors& h, const RowRegions& rows, int num_tma_buffers, bool dispatch) {
  HookPlan hp;
  if (!on) {
    TORCH_CHECK(rank_prefix.empty() && !stage.has_value(), "ep_core: rank_prefix / stage are hook-mode fields");
    return hp;
  }
  const int R = int(h.rank_prefix_matrix.size(0));
  TORCH_CHECK(num_tma_buffers >= 1 && num_tma_buffers <= 3,
              "ep_core: hook mode runs on the bulk-copy kernels: num_tma_buffers must be 1..3");
  TORCH_CHECK(int64_t(rank_prefix.size()) == int64_t(R) * R, "ep_core: hook rank_prefix must hold R * R = ", R * R,
              " entries, got ", rank_prefix.size());
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < R; ++j)
      TORCH_CHECK(ep_core::rows::rows_between(rank_prefix.data(), i, j, R) >= 0,
                  "ep_core: hook rank_prefix must be a prefix sum over source ranks");
  for (int r = 0; r < R; ++r) {
    int sent = 0;  // rows r sends its peers in dispatch: what r packs, and what comes back to r in combine
    for (int d = 0; d < R; ++d)
      if (d != r) sent += ep_core::rows::rows_between(rank_prefix.data(), r, d, R);
    const int received = rank_prefix[(R - 1) * R + r];
    if (dispatch) {
      TORCH_CHECK(stage.has_value(), "ep_core: a hook-mode dispatch plan needs its stage regions");
      TORCH_CHECK(received <= rows.capacity, "ep_core: hook dispatch: rank ", r, " receives ", received,
                  " rows, its receive region holds ", rows.capacity, " (Buffer.get_hook_buffer_size_hint)");
      TORCH_CHECK(sent <= stage->capacity, "ep_core: hook dispatch: rank ", r, " packs ", sent,
                  " rows for its peers, the staging region holds ", stage->capacity,
                  " (Buffer.get_hook_buffer_size_hint)");
    } else {
      TORCH_CHECK(sent <= rows.capacity, "ep_core: hook combine: ", sent, " rows come back to rank ", r,
                  ", its combine region holds ", rows.capacity, " (Buffer.get_buffer_size_hint)");
    }
  }
  if (dispatch)  // the pack kernel's bulk stores (tma.cuh kSlotAlign)
    TORCH_CHECK(stage->x % 128 == 0, "ep_core: the hook stage region must be 128-byte aligned");
  hp.on = true;
  hp.rank_prefix = std::move(rank_prefix);
  if (dispatch) hp.stage = *stage;
  return hp;
}

struct Received {
  torch::Tensor x;
  c10::optional<torch::Tensor> scales, topk_idx, topk_weights;
};

struct Combined {
  torch::Tensor x;
  c10::optional<torch::Tensor> topk_weights;
};

// How one call orders itself against the caller's stream (buffer.py's module docstring).
struct StreamMode {
  int64_t compute;    // the caller's current stream (raw cudaStream_t)
  bool fork;          // the comm stream waits for `compute` first (else the caller passed previous_event)
  bool join;          // `compute` waits for the comm stream at the end (async_finish=False)
  bool async_finish;  // the call's tensors are recorded on the comm stream (the caller gets an event)
  bool alloc_on_comm; // outputs are allocated on the comm stream (allocate_on_comm_stream=True)

  // fork + join and nothing that needs the comm stream: running on the caller's stream orders the
  // op exactly as fork, comm-stream kernels, join would, without two event record / wait pairs
  // (4 of a call's 6-7 CUDA API calls, issue 9).
  bool direct() const { return fork && join && !async_finish && !alloc_on_comm; }
};

// ---- the launcher ---------------------------------------------------------------------------
class Launcher {
 public:
  Launcher(const std::vector<int64_t>& peers, int64_t rank, int64_t error_device, int64_t timeout_ns,
           bool skip_send, int64_t comm_stream, int64_t comm_stream_id, int64_t device_index, int64_t device_type)
      : num_ranks_(int(peers.size())),
        rank_(int(rank)),
        skip_send_(skip_send),
        comm_(as_stream(comm_stream)),
        comm_torch_(c10::Stream::unpack3(comm_stream_id, c10::DeviceIndex(device_index),
                                         static_cast<c10::DeviceType>(device_type))) {
    TORCH_CHECK(num_ranks_ >= 1 && num_ranks_ <= ep_core::kMaxRanks, "ep_core: 1..", ep_core::kMaxRanks,
                " ranks, got ", num_ranks_);
    TORCH_CHECK(rank_ >= 0 && rank_ < num_ranks_, "ep_core: rank ", rank_, " outside the ", num_ranks_,
                " mapped buffers");
    peers_ = PeerPtrs{};
    for (int i = 0; i < num_ranks_; ++i) peers_.base[i] = reinterpret_cast<char*>(peers[i]);
    char* own = peers_.base[rank_];
    fail_ = ep_core::FailCtx{reinterpret_cast<ep_core::ErrorInfo*>(error_device),
                             reinterpret_cast<int*>(own + offsetof(ep_core::Signals, error_claim)),
                             uint64_t(timeout_ns), rank_, 0, 0,
                             reinterpret_cast<int*>(own + offsetof(ep_core::Signals, op_epoch))};
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&hook_sent_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&hook_received_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming), "cudaEventCreate");
    last_ = comm_;
  }
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  ~Launcher() {
    cudaEventDestroy(fork_);  // no check: may run after the CUDA context is gone
    cudaEventDestroy(join_);
    cudaEventDestroy(hook_sent_);
    cudaEventDestroy(hook_received_);
    cudaEventDestroy(order_);
  }

  DispatchLayout layout(const torch::Tensor& topk_idx, int64_t num_experts, const StreamMode& m, int64_t prof) {
    TORCH_CHECK(topk_idx.is_cuda() && topk_idx.dim() == 2 && topk_idx.scalar_type() == torch::kInt64,
                "ep_core: topk_idx must be a CUDA int64 [T, K] tensor");
    const torch::Tensor idx = topk_idx.contiguous();
    const int64_t T = idx.size(0), K = idx.size(1);
    const cudaStream_t s = begin(m);
    DispatchLayout out;
    {
      c10::optional<c10::StreamGuard> guard;
      if (m.alloc_on_comm) guard.emplace(comm_torch_);
      auto opts = idx.options().dtype(torch::kInt32);
      out.num_tokens_per_rank = torch::empty({num_ranks_}, opts);
      out.num_tokens_per_expert = torch::empty({num_experts}, opts);
      out.is_token_in_rank = torch::empty({T, int64_t(num_ranks_)}, idx.options().dtype(torch::kBool));
    }
    // zeroed on the comm stream: torch::zeros would fill on the current stream, unordered with it
    check_cuda(cudaMemsetAsync(out.num_tokens_per_rank.data_ptr(), 0, out.num_tokens_per_rank.nbytes(), s), "memset");
    check_cuda(cudaMemsetAsync(out.num_tokens_per_expert.data_ptr(), 0, out.num_tokens_per_expert.nbytes(), s),
               "memset");
    if (T > 0)
      check_cuda(ep_core::layout::get_dispatch_layout(idx.data_ptr<int64_t>(), int(T), int(K), int(num_experts),
                                                      num_ranks_, out.num_tokens_per_rank.data_ptr<int>(),
                                                      out.num_tokens_per_expert.data_ptr<int>(),
                                                      out.is_token_in_rank.data_ptr<bool>(), as_ptr(prof), s),
                 "layout launch");
    end(m, s, {&idx, &out.num_tokens_per_rank, &out.num_tokens_per_expert, &out.is_token_in_rank});
    return out;
  }

  // The count exchange of a non-cached dispatch (opens the op). Its outputs are allocated on the
  // comm stream: they outlive the call as the handle and are read by later ops on that stream.
  Notified notify(const torch::Tensor& is_token_in_rank, const torch::Tensor& num_tokens_per_expert,
                  int64_t num_experts, int64_t chunk_size, int64_t num_chunks, int64_t expert_alignment,
                  const StreamMode& m, int64_t prof) {
    const int64_t R = num_ranks_, T = is_token_in_rank.size(0);
    TORCH_CHECK(is_token_in_rank.is_cuda() && is_token_in_rank.is_contiguous() &&
                    is_token_in_rank.scalar_type() == torch::kBool && is_token_in_rank.dim() == 2 &&
                    is_token_in_rank.size(1) == R,
                "ep_core: is_token_in_rank must be a contiguous bool [T, num_ranks] tensor");
    TORCH_CHECK(num_tokens_per_expert.is_cuda() && num_tokens_per_expert.is_contiguous() &&
                    num_tokens_per_expert.scalar_type() == torch::kInt32 && num_tokens_per_expert.numel() == num_experts,
                "ep_core: num_tokens_per_expert must be a contiguous int32 [num_experts] tensor");
    begin(m, /*allow_direct=*/false);  // read_back waits for the comm stream
    const int64_t P = ep_core::kMaxChunks + 1;
    Notified out;
    {
      c10::StreamGuard guard(comm_torch_);
      auto i32 = is_token_in_rank.options().dtype(torch::kInt32);
      out.handle = HandleTensors{is_token_in_rank,       torch::empty({T, R}, i32), torch::empty({R, P}, i32),
                                 torch::empty({R, R}, i32), torch::empty({R, P}, i32), torch::empty({R}, i32),
                                 int(T),                  int(chunk_size),          int(num_chunks)};
      out.recv_info = torch::empty({1 + num_experts / R}, i32);
    }
    ep_core::notify::Args a{};
    a.is_token_in_rank = is_token_in_rank.data_ptr<bool>();
    a.num_tokens_per_expert = num_tokens_per_expert.data_ptr<int>();
    a.num_tokens = int(T);
    a.num_experts = int(num_experts);
    a.chunk_size = int(chunk_size);
    a.num_chunks = int(num_chunks);
    a.expert_alignment = int(expert_alignment);
    a.send_pos = out.handle.send_pos.data_ptr<int>();
    a.send_chunk_prefix = out.handle.send_chunk_prefix.data_ptr<int>();
    a.rank_prefix_matrix = out.handle.rank_prefix_matrix.data_ptr<int>();
    a.recv_chunk_prefix = out.handle.recv_chunk_prefix.data_ptr<int>();
    a.recv_num_chunks = out.handle.recv_num_chunks.data_ptr<int>();
    a.recv_info = out.recv_info.data_ptr<int>();
    check_cuda(ep_core::notify::notify(a, peers_, num_ranks_, fail(ep_core::kKernelNotify), as_ptr(prof), comm_),
               "notify launch");
    return out;
  }

  // The one host sync of a non-cached dispatch: recv_info then rank_prefix_matrix into pinned
  // host memory at `host` (int32, recv_info.numel() + R*R elements).
  void read_back(const Notified& n, int64_t host) {
    int* h = static_cast<int*>(as_ptr(host));
    check_cuda(cudaMemcpyAsync(h, n.recv_info.data_ptr(), n.recv_info.nbytes(), cudaMemcpyDeviceToHost, comm_),
               "read-back copy");
    check_cuda(cudaMemcpyAsync(h + n.recv_info.numel(), n.handle.rank_prefix_matrix.data_ptr(),
                               n.handle.rank_prefix_matrix.nbytes(), cudaMemcpyDeviceToHost, comm_),
               "read-back copy");
    py::gil_scoped_release nogil;
    check_cuda(cudaStreamSynchronize(comm_), "read-back sync");
  }

  // A hook-mode plan launches the send half only (pack, peer copies, signal; `prof_signal` profiles
  // the signal kernel); dispatch_receive is the rest.
  Received dispatch(const DispatchPlan& p, const torch::Tensor& x, const c10::optional<torch::Tensor>& x_scales,
                    const c10::optional<torch::Tensor>& topk_idx, const c10::optional<torch::Tensor>& topk_weights,
                    const StreamMode& m, int64_t prof_open, int64_t prof_kernel, int64_t prof_signal) {
    // every check before the first launch: a call that raises leaves no half-done op behind
    const HandleTensors& h = p.handle;
    const auto dtype = p.fp8 ? torch::kFloat8_e4m3fn : torch::kBFloat16;
    TORCH_CHECK_VALUE(x.is_cuda() && x.dim() == 2 && x.size(0) == h.num_tokens && x.size(1) == p.hidden &&
                          x.scalar_type() == dtype && x.is_contiguous(),
                      "ep_core: dispatch x must be a contiguous CUDA ", dtype, " [", h.num_tokens, ", ", p.hidden,
                      "] tensor for this handle");
    TORCH_CHECK_VALUE(given(x_scales) == p.fp8, "ep_core: FP8 dispatch takes (x, scales), BF16 a tensor");
    ep_core::ScaleLayout sl;
    if (p.fp8) {
      TORCH_CHECK_VALUE(x_scales->is_cuda() && x_scales->scalar_type() == torch::kFloat32 && x_scales->dim() == 2,
                        "ep_core: FP8 scales must be a float32 CUDA [T, hidden / 128] tensor");
      std::string err;
      sl = ep_core::scale_layout(true, x_scales->size(0), x_scales->size(1), x_scales->stride(0), x_scales->stride(1),
                                 h.num_tokens, p.hidden / ep_core::kScaleBlock, &err);
      TORCH_CHECK_VALUE(err.empty(), "ep_core: ", err);
    }
    TORCH_CHECK_VALUE(given(topk_idx) == (p.num_topk > 0) && given(topk_weights) == p.with_weights,
                      "ep_core: top-k arguments differ from this dispatch plan");
    torch::Tensor idx, w;
    if (p.num_topk > 0) {
      idx = topk_idx->contiguous();
      TORCH_CHECK_VALUE(idx.is_cuda() && idx.scalar_type() == torch::kInt64 && idx.dim() == 2 &&
                            idx.size(0) == h.num_tokens && idx.size(1) == p.num_topk,
                        "ep_core: topk_idx must be int64 [", h.num_tokens, ", ", p.num_topk, "]");
      if (p.with_weights) {
        w = topk_weights->contiguous();
        TORCH_CHECK_VALUE(w.is_cuda() && w.scalar_type() == torch::kFloat32 && w.sizes() == idx.sizes(),
                          "ep_core: topk_weights must be float32 like topk_idx");
      }
    }

    const cudaStream_t s = begin(m, /*allow_direct=*/!p.hook.on);  // a hook's send half is on the comm stream
    if (p.open_op)
      check_cuda(ep_core::notify::barrier(peers_, num_ranks_, fail(ep_core::kKernelBarrier), as_ptr(prof_open), s),
                 "barrier launch");
    Received out;
    {
      c10::optional<c10::StreamGuard> guard;
      if (m.alloc_on_comm) guard.emplace(comm_torch_);
      const int64_t N = p.recv_rows;
      out.x = torch::empty({N, int64_t(p.hidden)}, x.options());
      if (p.fp8) out.scales = torch::empty({N, int64_t(sl.num_scales)}, x.options().dtype(torch::kFloat32));
      if (p.num_topk > 0) {
        out.topk_idx = torch::empty({N, int64_t(p.num_topk)}, x.options().dtype(torch::kInt64));
        if (p.with_weights) out.topk_weights = torch::empty({N, int64_t(p.num_topk)}, x.options().dtype(torch::kFloat32));
      }
    }
    // padding rows of num_worst_tokens keep topk -1 / weight 0 (ep-api.md); on the comm stream,
    // so they are ordered before the kernel. All-ones bytes are -1 as int64.
    if (p.num_topk > 0 && p.recv_rows > p.fill_from) {
      const size_t off = size_t(p.fill_from) * p.num_topk, n = size_t(p.recv_rows - p.fill_from) * p.num_topk;
      check_cuda(cudaMemsetAsync(out.topk_idx->data_ptr<int64_t>() + off, 0xff, n * sizeof(int64_t), s), "memset");
      if (p.with_weights)
        check_cuda(cudaMemsetAsync(out.topk_weights->data_ptr<float>() + off, 0, n * sizeof(float), s), "memset");
    }
    ep_core::dispatch::Args a{};
    a.x = x.data_ptr();
    a.x_scales = p.fp8 ? static_cast<const float*>(x_scales->data_ptr()) : nullptr;
    a.scale_token_stride = sl.token_stride;
    a.scale_hidden_stride = sl.hidden_stride;
    a.num_scales = sl.num_scales;
    a.topk_idx = p.num_topk > 0 ? idx.data_ptr<int64_t>() : nullptr;
    a.topk_weights = p.with_weights ? w.data_ptr<float>() : nullptr;
    a.num_topk = p.num_topk;
    fill_handle(a, h);
    a.num_tokens = h.num_tokens;
    a.hidden_bytes = int(p.hidden * x.element_size());
    a.num_experts = p.num_experts;
    a.chunk_size = h.chunk_size;
    a.num_chunks = h.num_chunks;
    a.recv_x = out.x.data_ptr();
    a.recv_rows = p.recv_rows;
    a.recv_scales = ptr_or_null<float>(out.scales);
    a.recv_topk_idx = ptr_or_null<int64_t>(out.topk_idx);
    a.recv_topk_weights = ptr_or_null<float>(out.topk_weights);
    a.num_sender_blocks = p.num_sender_blocks;
    a.skip_send = skip_send_ ? 1 : 0;
    a.num_tma_buffers = p.num_tma_buffers;
    if (p.hook.on) {
      a.hook = ep_core::kHookSend;
      a.stage = p.hook.stage;
    }
    check_cuda(ep_core::dispatch::dispatch(a, p.rows, peers_, num_ranks_, p.num_blocks, fail(ep_core::kKernelDispatch),
                                           as_ptr(prof_kernel), s),
               "dispatch launch");
    if (p.hook.on)
      send_hook(ep_core::hook::plan_dispatch(p.hook.rank_prefix.data(), num_ranks_, rank_, peers_, p.rows, p.hook.stage,
                                             a.hidden_bytes, sl.num_scales, p.num_topk, p.with_weights ? p.num_topk : 0),
                ep_core::kHookDispatch, prof_signal);
    std::vector<const torch::Tensor*> used{&x, &out.x};
    if (p.fp8) used.push_back(&*x_scales);
    if (p.num_topk > 0) used.push_back(&idx);
    if (p.with_weights) used.push_back(&w);
    for (const auto* t : {&out.scales, &out.topk_idx, &out.topk_weights})
      if (given(*t)) used.push_back(&**t);
    end(m, s, used);
    return out;
  }

  // hook() of a hook-mode dispatch: the receive-only kernel (copy-out of the rows the peers' copy
  // engines delivered) on the caller's stream `compute`, into the outputs the send half returned.
  void dispatch_receive(const DispatchPlan& p, const Received& out, int64_t compute, int64_t prof) {
    TORCH_CHECK_VALUE(p.hook.on, "ep_core: dispatch_receive needs a hook-mode dispatch plan");
    TORCH_CHECK_VALUE(out.x.dim() == 2 && out.x.size(0) == p.recv_rows && out.x.size(1) == p.hidden &&
                          given(out.scales) == p.fp8 && given(out.topk_idx) == (p.num_topk > 0) &&
                          given(out.topk_weights) == p.with_weights,
                      "ep_core: dispatch_receive takes the outputs of this plan's send half");
    const HandleTensors& h = p.handle;
    ep_core::dispatch::Args a{};
    fill_handle(a, h);
    a.num_tokens = h.num_tokens;
    a.hidden_bytes = int(p.hidden * out.x.element_size());
    a.num_scales = p.fp8 ? p.hidden / ep_core::kScaleBlock : 0;
    a.num_topk = p.num_topk;
    a.num_experts = p.num_experts;
    a.chunk_size = h.chunk_size;
    a.num_chunks = h.num_chunks;
    a.recv_x = out.x.data_ptr();
    a.recv_rows = p.recv_rows;
    a.recv_scales = ptr_or_null<float>(out.scales);
    a.recv_topk_idx = ptr_or_null<int64_t>(out.topk_idx);
    a.recv_topk_weights = ptr_or_null<float>(out.topk_weights);
    a.num_sender_blocks = 0;
    a.num_tma_buffers = p.num_tma_buffers;
    a.hook = ep_core::kHookReceive;
    const cudaStream_t s = receive_begin(compute);
    check_cuda(ep_core::dispatch::dispatch(a, p.rows, peers_, num_ranks_, p.num_blocks, fail(ep_core::kKernelDispatch),
                                           as_ptr(prof), s),
               "dispatch receive launch");
    receive_end(s);
  }

  // A hook-mode plan sends only: the start barrier, then peer copies of x's rows (and weights) into
  // each source's combine region, then the signal; combine_receive reduces into the outputs.
  Combined combine(const CombinePlan& p, const torch::Tensor& x, const c10::optional<torch::Tensor>& topk_weights,
                   const c10::optional<torch::Tensor>& bias0, const c10::optional<torch::Tensor>& bias1,
                   const StreamMode& m, int64_t prof_open, int64_t prof_kernel, int64_t prof_signal) {
    const HandleTensors& h = p.handle;
    TORCH_CHECK_VALUE(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.size(1) == p.hidden &&
                          x.size(0) >= p.min_rows,
                      "ep_core: combine x must be a CUDA bf16 [>= ", p.min_rows, ", ", p.hidden, "] tensor");
    const torch::Tensor xc = x.contiguous();
    torch::Tensor w;
    TORCH_CHECK_VALUE(given(topk_weights) == (p.num_topk > 0), "ep_core: topk_weights differ from this combine plan");
    if (p.num_topk > 0) {
      w = topk_weights->contiguous();
      TORCH_CHECK_VALUE(w.is_cuda() && w.scalar_type() == torch::kFloat32 && w.dim() == 2 && w.size(0) == x.size(0) &&
                            w.size(1) == p.num_topk,
                        "ep_core: combine topk_weights must be float32 [", x.size(0), ", ", p.num_topk, "]");
    }
    torch::Tensor b[2];
    const c10::optional<torch::Tensor>* bias[2] = {&bias0, &bias1};
    for (int i = 0; i < 2; ++i) {
      if (!given(*bias[i])) continue;
      b[i] = (*bias[i])->contiguous();
      TORCH_CHECK_VALUE(b[i].is_cuda() && b[i].scalar_type() == torch::kBFloat16 && b[i].dim() == 2 &&
                            b[i].size(0) == h.num_tokens && b[i].size(1) == p.hidden,
                        "ep_core: bias must be bf16 [", h.num_tokens, ", ", p.hidden, "]");
    }

    const cudaStream_t s = begin(m, /*allow_direct=*/!p.hook.on);  // a hook's send half is on the comm stream
    check_cuda(ep_core::notify::barrier(peers_, num_ranks_, fail(ep_core::kKernelBarrier), as_ptr(prof_open), s),
               "barrier launch");
    Combined out;
    {
      c10::optional<c10::StreamGuard> guard;
      if (m.alloc_on_comm) guard.emplace(comm_torch_);
      out.x = torch::empty({int64_t(h.num_tokens), int64_t(p.hidden)}, xc.options());
      if (p.num_topk > 0)
        out.topk_weights = torch::empty({int64_t(h.num_tokens), int64_t(p.num_topk)}, xc.options().dtype(torch::kFloat32));
    }
    if (p.hook.on) {
      send_hook(ep_core::hook::plan_combine(p.hook.rank_prefix.data(), num_ranks_, rank_, peers_, p.rows, xc.data_ptr(),
                                            p.num_topk > 0 ? w.data_ptr<float>() : nullptr, p.hidden, p.num_topk),
                ep_core::kHookCombine, prof_signal);
    } else {
      const ep_core::combine::Args a = combine_args(p, xc, w, b, out, p.num_sender_blocks, ep_core::kHookOff);
      check_cuda(ep_core::combine::combine(a, p.rows, peers_, num_ranks_, p.num_blocks, fail(ep_core::kKernelCombine),
                                           as_ptr(prof_kernel), s),
                 "combine launch");
    }
    std::vector<const torch::Tensor*> used{&xc, &out.x};
    if (w.defined()) used.push_back(&w);
    for (const auto& t : b)
      if (t.defined()) used.push_back(&t);
    if (given(out.topk_weights)) used.push_back(&*out.topk_weights);
    end(m, s, used);
    return out;
  }

  // hook() of a hook-mode combine: the reducers only, on the caller's stream `compute`, over the
  // same x / top-k weights / biases the send half was given, into its outputs.
  void combine_receive(const CombinePlan& p, const torch::Tensor& x, const c10::optional<torch::Tensor>& topk_weights,
                       const c10::optional<torch::Tensor>& bias0, const c10::optional<torch::Tensor>& bias1,
                       const Combined& out, int64_t compute, int64_t prof) {
    TORCH_CHECK_VALUE(p.hook.on, "ep_core: combine_receive needs a hook-mode combine plan");
    const HandleTensors& h = p.handle;
    TORCH_CHECK_VALUE(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.size(1) == p.hidden &&
                          x.size(0) >= p.min_rows && given(topk_weights) == (p.num_topk > 0) &&
                          out.x.size(0) == h.num_tokens && given(out.topk_weights) == (p.num_topk > 0),
                      "ep_core: combine_receive takes the arguments and outputs of this plan's send half");
    const torch::Tensor xc = x.contiguous();
    const torch::Tensor w = p.num_topk > 0 ? topk_weights->contiguous() : torch::Tensor();
    torch::Tensor b[2];
    if (given(bias0)) b[0] = bias0->contiguous();
    if (given(bias1)) b[1] = bias1->contiguous();
    const ep_core::combine::Args a = combine_args(p, xc, w, b, out, 0, ep_core::kHookReceive);
    const cudaStream_t s = receive_begin(compute);
    check_cuda(ep_core::combine::combine(a, p.rows, peers_, num_ranks_, p.num_blocks, fail(ep_core::kKernelCombine),
                                         as_ptr(prof), s),
               "combine receive launch");
    receive_end(s);
  }

 private:
  ep_core::combine::Args combine_args(const CombinePlan& p, const torch::Tensor& xc, const torch::Tensor& w,
                                      const torch::Tensor (&b)[2], const Combined& out, int num_sender_blocks,
                                      int hook) const {
    const HandleTensors& h = p.handle;
    ep_core::combine::Args a{};
    a.x = xc.data_ptr();
    a.topk_weights = w.defined() ? w.data_ptr<float>() : nullptr;
    a.bias0 = b[0].defined() ? b[0].data_ptr() : nullptr;
    a.bias1 = b[1].defined() ? b[1].data_ptr() : nullptr;
    fill_handle(a, h);
    a.num_tokens = h.num_tokens;
    a.hidden = p.hidden;
    a.num_topk = p.num_topk;
    a.chunk_size = h.chunk_size;
    a.num_chunks = h.num_chunks;
    a.out = out.x.data_ptr();
    a.out_weights = ptr_or_null<float>(out.topk_weights);
    a.num_sender_blocks = num_sender_blocks;
    a.num_tma_buffers = p.num_tma_buffers;
    a.hook = hook;
    return a;
  }

  // The send half's copy-engine transfer, then the flag kernel (hook.cu); `hook_sent_` marks the
  // end of both on the comm stream. The skip-send test hook sends nothing: the peers time out.
  void send_hook(const ep_core::hook::Transfer& t, ep_core::HookKind kind, int64_t prof) {
    if (!skip_send_)
      check_cuda(ep_core::hook::send(t, kind, peers_, num_ranks_, fail(ep_core::kKernelHook), as_ptr(prof), comm_),
                 "hook send");
    check_cuda(cudaEventRecord(hook_sent_, comm_), "cudaEventRecord");
  }
  // The receive half runs on the caller's stream after the send half (a stream wait: no SM spins
  // while the copies are in flight; the op's epoch is set and this rank's copies have left x and
  // the staging region), and the next op's kernels on the comm stream run after it.
  cudaStream_t receive_begin(int64_t compute) {
    const cudaStream_t s = as_stream(compute);
    check_cuda(cudaStreamWaitEvent(s, hook_sent_, 0), "cudaStreamWaitEvent");
    return s;
  }
  void receive_end(cudaStream_t s) {
    check_cuda(cudaEventRecord(hook_received_, s), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(comm_, hook_received_, 0), "cudaStreamWaitEvent");
    last_ = s;  // the op ended here (begin orders the next op after it)
  }

  ep_core::FailCtx fail(int kernel) const {
    ep_core::FailCtx f = fail_;
    f.kernel = kernel;
    return f;
  }

  template <typename A>
  static void fill_handle(A& a, const HandleTensors& h) {
    a.is_token_in_rank = h.is_token_in_rank.data_ptr<bool>();
    a.send_pos = h.send_pos.data_ptr<int>();
    a.send_chunk_prefix = h.send_chunk_prefix.data_ptr<int>();
    a.rank_prefix_matrix = h.rank_prefix_matrix.data_ptr<int>();
    a.recv_chunk_prefix = h.recv_chunk_prefix.data_ptr<int>();
    a.recv_num_chunks = h.recv_num_chunks.data_ptr<int>();
  }

  // Where a call's kernels run, ordered after the previous op and the caller's work. A direct
  // mode runs on the caller's stream; any other on the comm stream, which first waits for the
  // caller (fork; one reused event: a wait captures the event's state when it is enqueued, so
  // re-recording it later is safe, also inside a graph capture). Ops of one Buffer share its
  // buffer and signals, so each must follow the previous one: on the same stream that is stream
  // order; when the stream changes (a direct call after an async one, or the caller moved to
  // another stream) the new stream waits for the old one, except inside a graph capture, where
  // nothing runs while capturing and a replay is ordered by its caller. That wait is on the old
  // stream's state at this call, so a previous_event call right after a direct one also waits for
  // caller work queued between the two (more order than needed, never less; steady use of one
  // mode never switches streams).
  cudaStream_t begin(const StreamMode& m, bool allow_direct = true) {
    cudaStream_t s = allow_direct && m.direct() ? as_stream(m.compute) : comm_;
    const bool fork = s == comm_ && m.fork;
    if (s != last_ && !(fork && last_ == as_stream(m.compute))) follow(last_, s);  // the fork orders it too
    if (fork) {
      check_cuda(cudaEventRecord(fork_, as_stream(m.compute)), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(comm_, fork_, 0), "cudaStreamWaitEvent");
    }
    last_ = s;
    return s;
  }

  void follow(cudaStream_t prev, cudaStream_t next) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(next, &st), "cudaStreamIsCapturing");
    if (st != cudaStreamCaptureStatusNone) return;
    check_cuda(cudaEventRecord(order_, prev), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(next, order_, 0), "cudaStreamWaitEvent");
  }

  void end(const StreamMode& m, cudaStream_t s, const std::vector<const torch::Tensor*>& used) {
    if (s != comm_) return;  // direct: the caller's stream already holds the op
    if (m.async_finish)
      for (const auto* t : used)
        if (t->defined() && t->numel() > 0) t->record_stream(comm_torch_);
    if (m.join) {
      check_cuda(cudaEventRecord(join_, comm_), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(as_stream(m.compute), join_, 0), "cudaStreamWaitEvent");
    }
  }
  void end(const StreamMode& m, cudaStream_t s, std::initializer_list<const torch::Tensor*> used) {
    end(m, s, std::vector<const torch::Tensor*>(used));
  }

  int num_ranks_, rank_;
  bool skip_send_;
  cudaStream_t comm_;
  c10::Stream comm_torch_;
  PeerPtrs peers_{};
  ep_core::FailCtx fail_{};
  cudaEvent_t fork_ = nullptr, join_ = nullptr, order_ = nullptr;
  cudaStream_t last_ = nullptr;  // the stream the previous op ended on (begin, receive_end)
  // hook mode: the end of the pending op's send half (comm stream) and of its receive half (the
  // caller's stream). One of each: the Buffer allows one pending hook (ep_core/buffer.py).
  cudaEvent_t hook_sent_ = nullptr, hook_received_ = nullptr;
};

}  // namespace

void register_low_latency(py::module_& m);  // low_latency_bindings.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ep_core intranode dispatch/combine kernels";
  register_low_latency(m);
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

  py::class_<ErrorReport>(m, "ErrorReport", py::module_local())
      .def_property_readonly("flag", [](const ErrorReport& r) { return r.info.flag; })
      .def_property_readonly("rank", [](const ErrorReport& r) { return r.info.rank; })
      .def_property_readonly("kernel", [](const ErrorReport& r) { return r.info.kernel; })
      .def_property_readonly("phase", [](const ErrorReport& r) { return r.info.phase; })
      .def_property_readonly("is_barrier", [](const ErrorReport& r) { return r.info.is_barrier != 0; })
      .def_property_readonly("channel", [](const ErrorReport& r) { return r.info.channel; })
      .def_property_readonly("peer", [](const ErrorReport& r) { return r.info.peer; })
      .def_property_readonly("epoch", [](const ErrorReport& r) { return r.info.epoch; });
  py::class_<ErrorRecord>(m, "ErrorRecord", py::module_local())
      .def(py::init<>())
      .def("flag", &ErrorRecord::flag)
      .def("report", &ErrorRecord::report)
      .def_property_readonly("device", &ErrorRecord::device)
      .def("close", &ErrorRecord::close);

  py::class_<RowRegions>(m, "RowRegions", py::module_local())
      .def(py::init([](int64_t x, int64_t scales, int64_t topk_idx, int64_t topk_weights, int64_t capacity) {
             TORCH_CHECK(x >= 0 && scales >= 0 && topk_idx >= 0 && topk_weights >= 0 && capacity >= 0,
                         "ep_core: row regions must be non-negative");
             for (int64_t off : {x, scales, topk_idx, topk_weights})
               TORCH_CHECK(off % 16 == 0, "ep_core: row region offsets must be 16-byte aligned");
             return RowRegions{size_t(x), size_t(scales), size_t(topk_idx), size_t(topk_weights), int(capacity)};
           }),
           py::arg("x"), py::arg("scales"), py::arg("topk_idx"), py::arg("topk_weights"), py::arg("capacity"))
      .def_property_readonly("x", [](const RowRegions& r) { return int64_t(r.x); })
      .def_property_readonly("scales", [](const RowRegions& r) { return int64_t(r.scales); })
      .def_property_readonly("topk_idx", [](const RowRegions& r) { return int64_t(r.topk_idx); })
      .def_property_readonly("topk_weights", [](const RowRegions& r) { return int64_t(r.topk_weights); })
      .def_property_readonly("capacity", [](const RowRegions& r) { return r.capacity; });

  py::class_<HandleTensors>(m, "HandleTensors", py::module_local())
      .def(py::init(&make_handle), py::arg("is_token_in_rank"), py::arg("send_pos"), py::arg("send_chunk_prefix"),
           py::arg("rank_prefix_matrix"), py::arg("recv_chunk_prefix"), py::arg("recv_num_chunks"),
           py::arg("num_tokens"), py::arg("chunk_size"), py::arg("num_chunks"))
      .def_readonly("is_token_in_rank", &HandleTensors::is_token_in_rank)
      .def_readonly("send_pos", &HandleTensors::send_pos)
      .def_readonly("send_chunk_prefix", &HandleTensors::send_chunk_prefix)
      .def_readonly("rank_prefix_matrix", &HandleTensors::rank_prefix_matrix)
      .def_readonly("recv_chunk_prefix", &HandleTensors::recv_chunk_prefix)
      .def_readonly("recv_num_chunks", &HandleTensors::recv_num_chunks)
      .def_readonly("num_tokens", &HandleTensors::num_tokens)
      .def_readonly("chunk_size", &HandleTensors::chunk_size)
      .def_readonly("num_chunks", &HandleTensors::num_chunks);
  py::class_<Notified>(m, "Notified", py::module_local())
      .def_readonly("handle", &Notified::handle)
      .def_readonly("recv_info", &Notified::recv_info);
  py::class_<DispatchLayout>(m, "DispatchLayout", py::module_local())
      .def_readonly("num_tokens_per_rank", &DispatchLayout::num_tokens_per_rank)
      .def_readonly("num_tokens_per_expert", &DispatchLayout::num_tokens_per_expert)
      .def_readonly("is_token_in_rank", &DispatchLayout::is_token_in_rank);

  py::class_<DispatchPlan>(m, "DispatchPlan", py::module_local())
      .def(py::init([](HandleTensors handle, RowRegions rows, int hidden, bool fp8, int num_topk, bool with_weights,
                       int num_experts, int recv_rows, int fill_from, int num_blocks, int num_sender_blocks,
                       bool open_op, int num_tma_buffers, bool hook, std::vector<int> rank_prefix,
                       c10::optional<RowRegions> stage) {
             TORCH_CHECK(hidden > 0 && hidden % ep_core::kScaleBlock == 0 && hidden <= ep_core::kMaxHidden,
                         "ep_core: hidden out of range");
             TORCH_CHECK(num_topk >= 0 && num_topk <= ep_core::kMaxTopk && (num_topk > 0 || !with_weights),
                         "ep_core: num_topk out of range");
             TORCH_CHECK(recv_rows >= 0 && fill_from >= 0 && num_blocks >= 1 && num_sender_blocks >= 1 &&
                             num_sender_blocks <= num_blocks,
                         "ep_core: dispatch plan sizes out of range");
             TORCH_CHECK(num_experts >= 1 && num_experts <= ep_core::kMaxExperts, "ep_core: num_experts out of range");
             TORCH_CHECK(num_tma_buffers >= 0 && num_tma_buffers <= 3, "ep_core: num_tma_buffers out of range");
             TORCH_CHECK(!hook || num_sender_blocks == num_blocks, "ep_core: a hook-mode send is senders only");
             HookPlan hp = make_hook_plan(hook, std::move(rank_prefix), stage, handle, rows, num_tma_buffers, true);
             return DispatchPlan{handle, rows, hidden, fp8, num_topk, with_weights, num_experts, recv_rows,
                                 fill_from, num_blocks, num_sender_blocks, open_op, num_tma_buffers, std::move(hp)};
           }),
           py::arg("handle"), py::arg("rows"), py::arg("hidden"), py::arg("fp8"), py::arg("num_topk"),
           py::arg("with_weights"), py::arg("num_experts"), py::arg("recv_rows"), py::arg("fill_from"),
           py::arg("num_blocks"), py::arg("num_sender_blocks"), py::arg("open_op"), py::arg("num_tma_buffers") = 0,
           py::arg("hook") = false, py::arg("rank_prefix") = std::vector<int>{}, py::arg("stage") = py::none())
      .def_readonly("recv_rows", &DispatchPlan::recv_rows)
      .def_readonly("num_blocks", &DispatchPlan::num_blocks)
      .def_readonly("num_sender_blocks", &DispatchPlan::num_sender_blocks);
  py::class_<CombinePlan>(m, "CombinePlan", py::module_local())
      .def(py::init([](HandleTensors handle, RowRegions rows, int hidden, int num_topk, int min_rows, int num_blocks,
                       int num_sender_blocks, int num_tma_buffers, bool hook, std::vector<int> rank_prefix) {
             TORCH_CHECK(hidden > 0 && hidden % 8 == 0 && hidden <= ep_core::kMaxHidden, "ep_core: hidden out of range");
             TORCH_CHECK(num_topk >= 0 && num_topk <= ep_core::kMaxTopk, "ep_core: num_topk out of range");
             // 0 sender blocks: one rank, whose combine has nothing to send (the launcher checks it)
             TORCH_CHECK(min_rows >= 0 && num_blocks >= 1 && num_sender_blocks >= 0 && num_sender_blocks < num_blocks,
                         "ep_core: combine plan sizes out of range");
             TORCH_CHECK(num_tma_buffers >= 0 && num_tma_buffers <= 3, "ep_core: num_tma_buffers out of range");
             HookPlan hp = make_hook_plan(hook, std::move(rank_prefix), c10::nullopt, handle, rows, num_tma_buffers,
                                          false);
             return CombinePlan{handle, rows, hidden, num_topk, min_rows, num_blocks, num_sender_blocks,
                                num_tma_buffers, std::move(hp)};
           }),
           py::arg("handle"), py::arg("rows"), py::arg("hidden"), py::arg("num_topk"), py::arg("min_rows"),
           py::arg("num_blocks"), py::arg("num_sender_blocks"), py::arg("num_tma_buffers") = 0,
           py::arg("hook") = false, py::arg("rank_prefix") = std::vector<int>{});

  py::class_<StreamMode>(m, "StreamMode", py::module_local())
      .def(py::init([](int64_t compute, bool fork, bool join, bool async_finish, bool alloc_on_comm) {
             return StreamMode{compute, fork, join, async_finish, alloc_on_comm};
           }),
           py::arg("compute"), py::arg("fork"), py::arg("join"), py::arg("async_finish"), py::arg("alloc_on_comm"))
      .def_readwrite("compute", &StreamMode::compute);
  py::class_<Received>(m, "Received", py::module_local())
      .def_readonly("x", &Received::x)
      .def_readonly("scales", &Received::scales)
      .def_readonly("topk_idx", &Received::topk_idx)
      .def_readonly("topk_weights", &Received::topk_weights);
  py::class_<Combined>(m, "Combined", py::module_local())
      .def_readonly("x", &Combined::x)
      .def_readonly("topk_weights", &Combined::topk_weights);

  py::class_<Launcher>(m, "Launcher", py::module_local())
      .def(py::init<const std::vector<int64_t>&, int64_t, int64_t, int64_t, bool, int64_t, int64_t, int64_t,
                    int64_t>(),
           py::arg("peers"), py::arg("rank"), py::arg("error_device"), py::arg("timeout_ns"), py::arg("skip_send"),
           py::arg("comm_stream"), py::arg("comm_stream_id"), py::arg("device_index"), py::arg("device_type"))
      .def("layout", &Launcher::layout, py::arg("topk_idx"), py::arg("num_experts"), py::arg("mode"), py::arg("prof"))
      .def("notify", &Launcher::notify, py::arg("is_token_in_rank"), py::arg("num_tokens_per_expert"),
           py::arg("num_experts"), py::arg("chunk_size"), py::arg("num_chunks"), py::arg("expert_alignment"),
           py::arg("mode"), py::arg("prof"))
      .def("read_back", &Launcher::read_back, py::arg("notified"), py::arg("host"))
      .def("dispatch", &Launcher::dispatch, py::arg("plan"), py::arg("x"), py::arg("x_scales"), py::arg("topk_idx"),
           py::arg("topk_weights"), py::arg("mode"), py::arg("prof_open"), py::arg("prof_kernel"),
           py::arg("prof_signal") = 0)
      .def("dispatch_receive", &Launcher::dispatch_receive, py::arg("plan"), py::arg("out"), py::arg("compute"),
           py::arg("prof"))
      .def("combine", &Launcher::combine, py::arg("plan"), py::arg("x"), py::arg("topk_weights"), py::arg("bias0"),
           py::arg("bias1"), py::arg("mode"), py::arg("prof_open"), py::arg("prof_kernel"), py::arg("prof_signal") = 0)
      .def("combine_receive", &Launcher::combine_receive, py::arg("plan"), py::arg("x"), py::arg("topk_weights"),
           py::arg("bias0"), py::arg("bias1"), py::arg("out"), py::arg("compute"), py::arg("prof"));
}
