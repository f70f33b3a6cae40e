// The torch side of ep_core's low-latency kernels: named plan objects built once (the layout's
// offsets, the stable output tensors, knobs, geometry), and a launcher that turns one call into
// one kernel launch. bindings.cpp's module calls register_low_latency(m).
//
// Everything a call can keep is in a plan (ep_core/low_latency.py builds one per shape and output
// set); a call passes its input tensors, the phases to run, a profile slot and the raw stream.
// Streams travel as integers, so this file, like bindings.cpp, needs no c10/cuda headers (a
// CPU-only torch syntax-checks it: tests/ep_core/test_low_latency_build.py). Every type is
// module_local: the compiled-out and the instrumented builds are loaded side by side.
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "ep_core/csrc/low_latency.cuh"

namespace {

namespace ll = ep_core::low_latency;

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "ep_core low-latency: ", what, ": ", cudaGetErrorString(e));
}

// ---- the layout: named offsets from ep_core/low_latency_layout.py ------------------------------
struct NamedField {
  const char* name;
  int64_t ll::Layout::*field;
};
const std::vector<NamedField>& layout_fields() {
  static const std::vector<NamedField> f = {
      {"send_seq", &ll::Layout::send_seq},   {"send_tickets", &ll::Layout::send_tickets},
      {"recv_seq", &ll::Layout::recv_seq},   {"recv_tickets", &ll::Layout::recv_tickets},
      {"send_done", &ll::Layout::send_done}, {"recv_done", &ll::Layout::recv_done},
      {"send_gen", &ll::Layout::send_gen},   {"recv_gen", &ll::Layout::recv_gen},
      {"abort", &ll::Layout::abort},         {"claim", &ll::Layout::claim},
      {"credit", &ll::Layout::credit},       {"data_flag", &ll::Layout::data_flag},
      {"cw_flag", &ll::Layout::cw_flag},     {"half0", &ll::Layout::half0},
      {"half_stride", &ll::Layout::half_stride}, {"hdr", &ll::Layout::hdr},
      {"hdr_stride", &ll::Layout::hdr_stride},   {"meta", &ll::Layout::meta},
      {"meta_stride", &ll::Layout::meta_stride}, {"rows", &ll::Layout::rows},
      {"rows_stride", &ll::Layout::rows_stride}, {"row_bytes", &ll::Layout::row_bytes},
      {"cweights", &ll::Layout::cweights},   {"cw_stride", &ll::Layout::cw_stride},
      {"cpartials", &ll::Layout::cpartials}, {"cp_stride", &ll::Layout::cp_stride},
      {"size", &ll::Layout::size},
  };
  return f;
}

ll::Layout make_layout(const py::dict& d) {
  ll::Layout L{};
  for (const auto& f : layout_fields()) {
    TORCH_CHECK(d.contains(f.name), "ep_core low-latency: layout offset '", f.name, "' missing");
    L.*(f.field) = d[f.name].cast<int64_t>();
  }
  TORCH_CHECK(d.size() == layout_fields().size(), "ep_core low-latency: the layout has ", d.size(),
              " offsets, the kernels know ", layout_fields().size(), " (a name they do not know)");
  return L;
}

py::dict layout_dict(const ll::Layout& L) {
  py::dict d;
  for (const auto& f : layout_fields()) d[f.name] = L.*(f.field);
  return d;
}

// ---- plans -----------------------------------------------------------------------------------
bool cuda_contig(const torch::Tensor& t, torch::ScalarType type) {
  return t.defined() && t.is_cuda() && t.is_contiguous() && t.scalar_type() == type;
}

// What a dispatch writes (the stable output tensors of one output set) and what combine reads.
struct DispatchOutputs {
  torch::Tensor recv_x, recv_scales, recv_count, recv_src_info, recv_layout_range, slot, recv_tokens, sent_mask;
};

struct DispatchPlan {
  ll::Layout layout{};
  DispatchOutputs out;
  c10::optional<torch::Tensor> cumulative_stats;
  int num_ranks = 0, num_experts = 0, max_tokens = 0, hidden = 0, num_topk = 0;
  bool fp8 = true, round_scale = false, ue8m0 = false;
  ll::Knobs knobs{};
  ll::Geometry geometry{};
};

struct CombinePlan {
  ll::Layout layout{};
  DispatchOutputs handle;
  int num_ranks = 0, num_experts = 0, max_tokens = 0, hidden = 0, num_topk = 0;
  ll::Knobs knobs{};
  ll::Geometry geometry{};
};

DispatchOutputs make_outputs(torch::Tensor recv_x, c10::optional<torch::Tensor> recv_scales, torch::Tensor recv_count,
                             torch::Tensor recv_src_info, torch::Tensor recv_layout_range, torch::Tensor slot,
                             torch::Tensor recv_tokens, torch::Tensor sent_mask) {
  TORCH_CHECK(recv_x.defined() && recv_x.is_cuda() && recv_x.is_contiguous() && recv_x.dim() == 3,
              "ep_core low-latency: recv_x must be a contiguous CUDA [E/R, R*T_max, H] tensor");
  const int64_t El = recv_x.size(0), RT = recv_x.size(1);
  TORCH_CHECK(cuda_contig(recv_count, torch::kInt32) && recv_count.numel() == El,
              "ep_core low-latency: recv_count must be int32 [E/R]");
  TORCH_CHECK(cuda_contig(recv_src_info, torch::kInt32) && recv_src_info.numel() == El * RT,
              "ep_core low-latency: recv_src_info must be int32 [E/R, R*T_max]");
  TORCH_CHECK(cuda_contig(recv_layout_range, torch::kInt64) && recv_layout_range.dim() == 2 &&
                  recv_layout_range.size(0) == El,
              "ep_core low-latency: recv_layout_range must be int64 [E/R, R]");
  const int64_t R = recv_layout_range.size(1);
  TORCH_CHECK(R >= 1 && RT % R == 0, "ep_core low-latency: recv_x rows must be R * T_max");
  TORCH_CHECK(cuda_contig(slot, torch::kInt32) && slot.dim() == 3 && slot.size(0) == R && slot.size(1) == RT / R,
              "ep_core low-latency: slot must be int32 [R, T_max, K]");
  TORCH_CHECK(cuda_contig(recv_tokens, torch::kInt32) && recv_tokens.numel() == R,
              "ep_core low-latency: recv_tokens must be int32 [R]");
  TORCH_CHECK(cuda_contig(sent_mask, torch::kInt32) && sent_mask.numel() == RT / R,
              "ep_core low-latency: sent_mask must be int32 [T_max]");
  torch::Tensor scales;
  if (recv_scales.has_value() && recv_scales->defined()) {
    scales = *recv_scales;
    // the kernels write [E/R][groups][R*T_max] (the tensor callers see is its transposed view)
    TORCH_CHECK(scales.is_cuda() && scales.is_contiguous() && scales.dim() == 3 && scales.size(0) == El &&
                    scales.size(2) == RT &&
                    (scales.scalar_type() == torch::kFloat32 || scales.scalar_type() == torch::kInt32),
                "ep_core low-latency: recv scales storage must be a contiguous [E/R, groups, R*T_max] float32 "
                "(or int32 UE8M0) tensor");
  }
  return DispatchOutputs{recv_x, scales, recv_count, recv_src_info, recv_layout_range, slot, recv_tokens, sent_mask};
}

ll::Knobs make_knobs(bool flat_split, bool count_working, int min_slice_groups, bool loads_first) {
  TORCH_CHECK(min_slice_groups >= 1, "ep_core low-latency: min_slice_groups must be >= 1");
  return ll::Knobs{flat_split ? 1 : 0, count_working ? 1 : 0, min_slice_groups, loads_first ? 1 : 0};
}

ll::Geometry make_geometry(int num_blocks, int warps_per_block) {
  TORCH_CHECK(num_blocks >= 1 && num_blocks <= ll::kMaxBlocks, "ep_core low-latency: num_blocks must be in 1..",
              ll::kMaxBlocks);
  TORCH_CHECK(warps_per_block >= 1 && warps_per_block <= ll::kMaxWarpsPerBlock,
              "ep_core low-latency: warps_per_block must be in 1..", ll::kMaxWarpsPerBlock);
  return ll::Geometry{num_blocks, warps_per_block};
}

// ---- the launcher ----------------------------------------------------------------------------
class Launcher {
 public:
  Launcher(const std::vector<int64_t>& peers, int64_t rank, int64_t error_device, int64_t timeout_ns)
      : num_ranks_(int(peers.size())), rank_(int(rank)) {
    TORCH_CHECK(num_ranks_ >= 1 && num_ranks_ <= ep_core::kMaxRanks, "ep_core low-latency: 1..",
                ep_core::kMaxRanks, " ranks, got ", num_ranks_);
    TORCH_CHECK(rank_ >= 0 && rank_ < num_ranks_, "ep_core low-latency: rank ", rank_, " outside ", num_ranks_);
    for (int i = 0; i < num_ranks_; ++i) peers_.base[i] = reinterpret_cast<char*>(peers[i]);
    fail_ = ll::Fail{reinterpret_cast<ep_core::ErrorInfo*>(error_device), uint64_t(timeout_ns), rank_, 0};
  }

  void dispatch(const DispatchPlan& p, const torch::Tensor& x, const torch::Tensor& topk_idx, int phases, int64_t prof,
                int64_t stream) {
    TORCH_CHECK_VALUE(p.num_ranks == num_ranks_, "ep_core low-latency: plan for ", p.num_ranks, " ranks");
    TORCH_CHECK_VALUE(cuda_contig(x, torch::kBFloat16) && x.dim() == 2 && x.size(1) == p.hidden &&
                          x.size(0) <= p.max_tokens,
                      "ep_core low-latency: x must be a contiguous CUDA bf16 [<= ", p.max_tokens, ", ", p.hidden,
                      "] tensor");
    TORCH_CHECK_VALUE(cuda_contig(topk_idx, torch::kInt64) && topk_idx.dim() == 2 && topk_idx.size(0) == x.size(0) &&
                          topk_idx.size(1) == p.num_topk,
                      "ep_core low-latency: topk_idx must be a contiguous CUDA int64 [", x.size(0), ", ", p.num_topk,
                      "] tensor");
    ll::DispatchArgs a{};
    a.x = x.data_ptr();
    a.topk_idx = topk_idx.data_ptr<int64_t>();
    a.num_tokens = int(x.size(0));
    a.hidden = p.hidden;
    a.num_topk = p.num_topk;
    a.num_experts = p.num_experts;
    a.max_tokens = p.max_tokens;
    a.fp8 = p.fp8;
    a.round_scale = p.round_scale;
    a.ue8m0 = p.ue8m0;
    const DispatchOutputs& o = p.out;
    a.recv_x = o.recv_x.data_ptr();
    a.recv_scales = o.recv_scales.defined() ? o.recv_scales.data_ptr() : nullptr;
    a.recv_count = o.recv_count.data_ptr<int>();
    a.recv_src_info = o.recv_src_info.data_ptr<int>();
    a.recv_layout_range = o.recv_layout_range.data_ptr<int64_t>();
    a.cumulative_stats = p.cumulative_stats.has_value() ? p.cumulative_stats->data_ptr<int>() : nullptr;
    a.slot = o.slot.data_ptr<int>();
    a.recv_tokens = o.recv_tokens.data_ptr<int>();
    a.sent_mask = o.sent_mask.data_ptr<int>();
    ll::Fail f = fail_;
    f.kernel = phases == ll::kRecvPhase ? ll::kKernelDispatchRecv
                                        : (phases == ll::kSendPhase ? ll::kKernelDispatchSend : ll::kKernelDispatch);
    check_cuda(ll::dispatch(a, p.layout, peers_, num_ranks_, p.knobs, p.geometry, phases, f,
                            reinterpret_cast<void*>(prof), reinterpret_cast<cudaStream_t>(stream)),
               "dispatch launch");
  }

  void combine(const CombinePlan& p, const torch::Tensor& x, const torch::Tensor& topk_idx,
               const torch::Tensor& topk_weights, const torch::Tensor& out, int phases, int64_t prof, int64_t stream) {
    TORCH_CHECK_VALUE(p.num_ranks == num_ranks_, "ep_core low-latency: plan for ", p.num_ranks, " ranks");
    const int64_t El = p.num_experts / p.num_ranks, RT = int64_t(p.num_ranks) * p.max_tokens;
    TORCH_CHECK_VALUE(cuda_contig(x, torch::kBFloat16) && x.dim() == 3 && x.size(0) == El && x.size(1) == RT &&
                          x.size(2) == p.hidden,
                      "ep_core low-latency: combine x must be a contiguous CUDA bf16 [", El, ", ", RT, ", ", p.hidden,
                      "] tensor");
    TORCH_CHECK_VALUE(cuda_contig(topk_idx, torch::kInt64) && topk_idx.dim() == 2 && topk_idx.size(1) == p.num_topk &&
                          topk_idx.size(0) <= p.max_tokens,
                      "ep_core low-latency: topk_idx must be a contiguous CUDA int64 [T, ", p.num_topk, "] tensor");
    TORCH_CHECK_VALUE(cuda_contig(topk_weights, torch::kFloat32) && topk_weights.sizes() == topk_idx.sizes(),
                      "ep_core low-latency: topk_weights must be a contiguous CUDA float32 tensor shaped like topk_idx");
    TORCH_CHECK_VALUE(cuda_contig(out, torch::kBFloat16) && out.dim() == 2 && out.size(0) == topk_idx.size(0) &&
                          out.size(1) == p.hidden,
                      "ep_core low-latency: out must be a contiguous CUDA bf16 [", topk_idx.size(0), ", ", p.hidden,
                      "] tensor");
    ll::CombineArgs a{};
    a.x = x.data_ptr();
    a.topk_idx = topk_idx.data_ptr<int64_t>();
    a.topk_weights = topk_weights.data_ptr<float>();
    a.num_tokens = int(topk_idx.size(0));
    a.hidden = p.hidden;
    a.num_topk = p.num_topk;
    a.num_experts = p.num_experts;
    a.max_tokens = p.max_tokens;
    a.slot = p.handle.slot.data_ptr<int>();
    a.recv_tokens = p.handle.recv_tokens.data_ptr<int>();
    a.sent_mask = p.handle.sent_mask.data_ptr<int>();
    a.out = out.data_ptr();
    ll::Fail f = fail_;
    f.kernel = phases == ll::kRecvPhase ? ll::kKernelCombineRecv
                                        : (phases == ll::kSendPhase ? ll::kKernelCombineSend : ll::kKernelCombine);
    check_cuda(ll::combine(a, p.layout, peers_, num_ranks_, p.knobs, p.geometry, phases, f,
                           reinterpret_cast<void*>(prof), reinterpret_cast<cudaStream_t>(stream)),
               "combine launch");
  }

 private:
  int num_ranks_, rank_;
  ep_core::PeerPtrs peers_{};
  ll::Fail fail_{};
};

// Zero the control block of this rank's low-latency buffer (clean_low_latency_buffer).
void clean(int64_t base, int64_t nbytes, int64_t stream) {
  check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(base), 0, size_t(nbytes), reinterpret_cast<cudaStream_t>(stream)),
             "clean memset");
}

}  // namespace

void register_low_latency(py::module_& m) {
  m.def("ll_limits", [] {
    py::dict d;
    d["group"] = ll::kGroup;
    d["threads"] = ll::kThreads;
    d["max_warps_per_block"] = ll::kMaxWarpsPerBlock;
    d["max_blocks"] = ll::kMaxBlocks;
    d["max_tokens"] = ll::kMaxTokens;
    d["max_local_experts"] = ll::kMaxLocalExperts;
    d["max_topk"] = ep_core::kMaxTopk;
    d["max_ranks"] = ep_core::kMaxRanks;
    d["max_hidden"] = ep_core::kMaxHidden;
    py::dict kernels;
    kernels["ll_dispatch"] = int(ll::kKernelDispatch);
    kernels["ll_dispatch_send"] = int(ll::kKernelDispatchSend);
    kernels["ll_dispatch_recv"] = int(ll::kKernelDispatchRecv);
    kernels["ll_combine"] = int(ll::kKernelCombine);
    kernels["ll_combine_send"] = int(ll::kKernelCombineSend);
    kernels["ll_combine_recv"] = int(ll::kKernelCombineRecv);
    d["kernels"] = kernels;
    d["error_protocol"] = int(ll::kErrProtocol);
    d["send_phase"] = int(ll::kSendPhase);
    d["recv_phase"] = int(ll::kRecvPhase);
    return d;
  });
  m.def("ll_clean", &clean, py::arg("base"), py::arg("nbytes"), py::arg("stream"));

  py::class_<ll::Layout>(m, "LLLayout", py::module_local())
      .def(py::init(&make_layout), py::arg("offsets"))
      .def("offsets", &layout_dict)
      .def_readonly("size", &ll::Layout::size);
  py::class_<ll::Knobs>(m, "LLKnobs", py::module_local())
      .def(py::init(&make_knobs), py::arg("flat_split"), py::arg("count_working"), py::arg("min_slice_groups"),
           py::arg("loads_first"));
  py::class_<ll::Geometry>(m, "LLGeometry", py::module_local())
      .def(py::init(&make_geometry), py::arg("num_blocks"), py::arg("warps_per_block"));
  py::class_<DispatchOutputs>(m, "LLDispatchOutputs", py::module_local())
      .def(py::init(&make_outputs), py::arg("recv_x"), py::arg("recv_scales"), py::arg("recv_count"),
           py::arg("recv_src_info"), py::arg("recv_layout_range"), py::arg("slot"), py::arg("recv_tokens"),
           py::arg("sent_mask"));
  py::class_<DispatchPlan>(m, "LLDispatchPlan", py::module_local())
      .def(py::init([](const ll::Layout& layout, const DispatchOutputs& out, c10::optional<torch::Tensor> stats,
                       int num_ranks, int num_experts, int max_tokens, int hidden, int num_topk, bool fp8,
                       bool round_scale, bool ue8m0, const ll::Knobs& knobs, const ll::Geometry& geometry) {
             const int64_t El = out.recv_x.size(0);
             TORCH_CHECK(num_ranks >= 1 && num_experts % num_ranks == 0 && num_experts / num_ranks == El,
                         "ep_core low-latency: recv_x has ", El, " experts, the plan ", num_experts, " / ", num_ranks);
             TORCH_CHECK(out.recv_x.size(1) == int64_t(num_ranks) * max_tokens && out.recv_x.size(2) == hidden,
                         "ep_core low-latency: recv_x shape does not match the plan");
             TORCH_CHECK(out.recv_x.scalar_type() == (fp8 ? torch::kFloat8_e4m3fn : torch::kBFloat16),
                         "ep_core low-latency: recv_x dtype does not match use_fp8");
             TORCH_CHECK(out.recv_scales.defined() == fp8, "ep_core low-latency: FP8 needs scales, BF16 none");
             TORCH_CHECK(out.slot.size(2) == num_topk, "ep_core low-latency: slot has ", out.slot.size(2),
                         " top-k columns, the plan ", num_topk);
             if (fp8)
               TORCH_CHECK(out.recv_scales.scalar_type() == (ue8m0 ? torch::kInt32 : torch::kFloat32) &&
                               out.recv_scales.size(1) == (ue8m0 ? hidden / 512 : hidden / ll::kGroup),
                           "ep_core low-latency: scales storage does not match use_ue8m0");
             if (stats.has_value())
               TORCH_CHECK(cuda_contig(*stats, torch::kInt32) && stats->numel() == El,
                           "ep_core low-latency: cumulative_local_expert_recv_stats must be int32 [", El, "]");
             DispatchPlan p;
             p.layout = layout;
             p.out = out;
             p.cumulative_stats = stats;
             p.num_ranks = num_ranks;
             p.num_experts = num_experts;
             p.max_tokens = max_tokens;
             p.hidden = hidden;
             p.num_topk = num_topk;
             p.fp8 = fp8;
             p.round_scale = round_scale;
             p.ue8m0 = ue8m0;
             p.knobs = knobs;
             p.geometry = geometry;
             return p;
           }),
           py::arg("layout"), py::arg("outputs"), py::arg("cumulative_stats"), py::arg("num_ranks"),
           py::arg("num_experts"), py::arg("max_tokens"), py::arg("hidden"), py::arg("num_topk"), py::arg("fp8"),
           py::arg("round_scale"), py::arg("ue8m0"), py::arg("knobs"), py::arg("geometry"));
  py::class_<CombinePlan>(m, "LLCombinePlan", py::module_local())
      .def(py::init([](const ll::Layout& layout, const DispatchOutputs& handle, int num_ranks, int num_experts,
                       int max_tokens, int hidden, int num_topk, const ll::Knobs& knobs, const ll::Geometry& geometry) {
             TORCH_CHECK(num_ranks >= 1 && num_experts % num_ranks == 0 && handle.slot.size(2) == num_topk &&
                             handle.slot.size(1) == max_tokens && handle.recv_tokens.numel() == num_ranks,
                         "ep_core low-latency: the handle does not match the combine plan");
             CombinePlan p;
             p.layout = layout;
             p.handle = handle;
             p.num_ranks = num_ranks;
             p.num_experts = num_experts;
             p.max_tokens = max_tokens;
             p.hidden = hidden;
             p.num_topk = num_topk;
             p.knobs = knobs;
             p.geometry = geometry;
             return p;
           }),
           py::arg("layout"), py::arg("handle"), py::arg("num_ranks"), py::arg("num_experts"), py::arg("max_tokens"),
           py::arg("hidden"), py::arg("num_topk"), py::arg("knobs"), py::arg("geometry"));
  py::class_<Launcher>(m, "LLLauncher", py::module_local())
      .def(py::init<const std::vector<int64_t>&, int64_t, int64_t, int64_t>(), py::arg("peers"), py::arg("rank"),
           py::arg("error_device"), py::arg("timeout_ns"))
      .def("dispatch", &Launcher::dispatch, py::arg("plan"), py::arg("x"), py::arg("topk_idx"), py::arg("phases"),
           py::arg("prof"), py::arg("stream"))
      .def("combine", &Launcher::combine, py::arg("plan"), py::arg("x"), py::arg("topk_idx"), py::arg("topk_weights"),
           py::arg("out"), py::arg("phases"), py::arg("prof"), py::arg("stream"));
}
