// The one torch binding file of the recorder: self-test kernels, clock pairing, and the CUDA IPC
// helpers of the 2-process clock-sync test. Kernels take raw pointers (selftest.cuh,
// clock_sync.cuh); this file turns tensors into pointers, checks them, and raises on CUDA errors.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "profiler/csrc/calibrate.cuh"
#include "profiler/csrc/clock_sync.cuh"
#include "profiler/csrc/recorder.cuh"
#include "profiler/csrc/selftest.cuh"

namespace {

namespace st = epscope::selftest;
namespace cs = epscope::clock_sync;
namespace cal = epscope::calibrate;

void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e));
}

// A profile buffer: a CUDA uint8 tensor big enough for grid*warps regions, or None (runtime off).
void* buffer_ptr(const c10::optional<torch::Tensor>& buf, int64_t grid, int64_t warps) {
  if (!buf.has_value()) return nullptr;
  const auto& b = *buf;
  TORCH_CHECK(b.is_cuda() && b.scalar_type() == torch::kUInt8 && b.is_contiguous(),
              "profile buffer must be a contiguous CUDA uint8 tensor");
  TORCH_CHECK(b.numel() >= static_cast<int64_t>(sizeof(epscope::BufferHeader)), "profile buffer smaller than its header");
  // The header is host-filled, so its region count is checked against the grid by the device
  // (WarpRecorder::init records nothing outside it); here only the minimum size is enforced.
  TORCH_CHECK(grid > 0 && warps > 0 && warps <= 32, "grid and warps must be positive, warps <= 32");
  return b.data_ptr();
}

torch::Tensor cuda_zeros(int64_t n, torch::ScalarType t) {
  return torch::zeros({n}, torch::TensorOptions().dtype(t).device(torch::kCUDA, c10::cuda::current_device()));
}

void check_cuda_tensor(const torch::Tensor& t, torch::ScalarType type, int64_t min_numel, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == type && t.is_contiguous() && t.numel() >= min_numel, name,
              ": expected a contiguous CUDA tensor of ", c10::toString(type), " with at least ", min_numel,
              " elements");
}

// ------------------------------------------------------------------------------------------------
// self-test kernels

std::tuple<torch::Tensor, torch::Tensor> timer_probe(c10::optional<torch::Tensor> buf, int64_t grid, int64_t warps,
                                                     int64_t samples, int64_t timeout_cycles) {
  void* p = buffer_ptr(buf, grid, warps);
  auto stats = cuda_zeros(grid * warps * 4, torch::kInt64);
  auto error = cuda_zeros(1, torch::kInt32);
  check_cuda(st::timer_probe(p, grid, warps, samples, reinterpret_cast<st::TimerStats*>(stats.data_ptr<int64_t>()),
                             timeout_cycles, error.data_ptr<int>(), c10::cuda::getCurrentCUDAStream()),
             "timer_probe launch");
  return {stats.view({grid * warps, 4}), error};
}

torch::Tensor record_cost(c10::optional<torch::Tensor> buf, int64_t grid, int64_t warps, int64_t n) {
  void* p = buffer_ptr(buf, grid, warps);
  auto cycles = cuda_zeros(grid * warps, torch::kInt64);
  auto sink = cuda_zeros(grid * warps * 32, torch::kInt32);
  check_cuda(st::record_cost(p, grid, warps, n, cycles.data_ptr<int64_t>(),
                             reinterpret_cast<uint32_t*>(sink.data_ptr<int>()), c10::cuda::getCurrentCUDAStream()),
             "record_cost launch");
  return cycles;
}

// cycles per warp of the record_parts loop (selftest.cuh); the buffer is made here (cap + 1 slots per warp)
torch::Tensor record_parts(int64_t part, int64_t grid, int64_t warps, int64_t n, int64_t cap, bool hires) {
  TORCH_CHECK(grid > 0 && warps > 0 && warps <= 32 && n >= 0 && cap > 0 && cap < (1 << 24),
              "record_parts: grid, warps (<= 32), n >= 0 and cap in (0, 2^24) expected");
  auto buf = cuda_zeros(grid * warps * (cap + 1) * 16, torch::kUInt8);
  auto cycles = cuda_zeros(grid * warps, torch::kInt64);
  auto sink = cuda_zeros(grid * warps * 32, torch::kInt32);
  check_cuda(st::record_parts(int(part), buf.data_ptr(), uint32_t(cap), int(grid), int(warps), int(n), hires ? 1u : 0u,
                              cycles.data_ptr<int64_t>(), reinterpret_cast<uint32_t*>(sink.data_ptr<int>()),
                              c10::cuda::getCurrentCUDAStream()),
             "record_parts launch");
  return cycles;
}

void anchored_ticks(c10::optional<torch::Tensor> buf, int64_t grid, int64_t warps, int64_t n, int64_t every,
                    int64_t spin_cycles) {
  void* p = buffer_ptr(buf, grid, warps);
  check_cuda(st::anchored_ticks(p, grid, warps, n, every, spin_cycles, c10::cuda::getCurrentCUDAStream()),
             "anchored_ticks launch");
}

// done/out/error are preallocated by the caller so a timed loop launches only the kernel.
void imbalance(c10::optional<torch::Tensor> buf, int64_t grid, int64_t warps, int64_t rounds, int64_t busy_blocks,
               int64_t busy_warps, int64_t units, torch::Tensor done, torch::Tensor out, torch::Tensor error,
               int64_t timeout_cycles) {
  void* p = buffer_ptr(buf, grid, warps);
  check_cuda_tensor(done, torch::kInt32, 1, "done");
  check_cuda_tensor(out, torch::kFloat32, grid * warps * 32, "out");
  check_cuda_tensor(error, torch::kInt32, 1, "error");
  check_cuda(st::imbalance(p, grid, warps, rounds, busy_blocks, busy_warps, units,
                           reinterpret_cast<unsigned*>(done.data_ptr<int>()), out.data_ptr<float>(), timeout_cycles,
                           error.data_ptr<int>(), c10::cuda::getCurrentCUDAStream()),
             "imbalance launch");
}

void grid_barrier(c10::optional<torch::Tensor> buf, int64_t grid, int64_t warps, int64_t rounds, int64_t units,
                  int64_t late_block, int64_t late_warp, int64_t late_units, torch::Tensor arrived, torch::Tensor out,
                  torch::Tensor error, int64_t timeout_cycles) {
  void* p = buffer_ptr(buf, grid, warps);
  check_cuda_tensor(arrived, torch::kInt32, 1, "arrived");
  check_cuda_tensor(out, torch::kFloat32, grid * warps * 32, "out");
  check_cuda_tensor(error, torch::kInt32, 1, "error");
  check_cuda(st::grid_barrier(p, grid, warps, rounds, units, late_block, late_warp, late_units,
                              reinterpret_cast<unsigned*>(arrived.data_ptr<int>()), out.data_ptr<float>(),
                              timeout_cycles, error.data_ptr<int>(), c10::cuda::getCurrentCUDAStream()),
             "grid_barrier launch");
}

// ------------------------------------------------------------------------------------------------
// calibration (calibrate.cuh)

// cycles of lane 0's loop of n back-to-back reads of `timer` (0 clock64, 1 globaltimer), per block
torch::Tensor timer_read_cost(int64_t timer, int64_t grid, int64_t n) {
  TORCH_CHECK(grid > 0 && n >= 0, "timer_read_cost: grid > 0 and n >= 0 expected");
  auto cycles = cuda_zeros(grid, torch::kInt64);
  auto sink = cuda_zeros(grid, torch::kInt64);
  check_cuda(cal::read_cost(int(timer), int(grid), int(n), cycles.data_ptr<int64_t>(),
                            reinterpret_cast<uint64_t*>(sink.data_ptr<int64_t>()), c10::cuda::getCurrentCUDAStream()),
             "timer_read_cost launch");
  return cycles;
}

// int64[grid, samples, 4]: (clock64 before, globaltimer, clock64 after, smid) per anchor sample
torch::Tensor sm_clock_samples(int64_t grid, int64_t samples, int64_t interval_cycles) {
  TORCH_CHECK(grid > 0 && samples > 0 && interval_cycles >= 0, "sm_clock_samples: grid, samples > 0 expected");
  auto out = cuda_zeros(grid * samples * 4, torch::kInt64);
  check_cuda(cal::sm_clocks(int(grid), int(samples), interval_cycles,
                            reinterpret_cast<cal::AnchorSample*>(out.data_ptr<int64_t>()),
                            c10::cuda::getCurrentCUDAStream()),
             "sm_clock_samples launch");
  return out.view({grid, samples, 4});
}

// ------------------------------------------------------------------------------------------------
// clock pairing: pointers are integers (ep_core passes its own mapped buffers)

std::tuple<torch::Tensor, torch::Tensor> clock_ping(int64_t my_slots, int64_t peer_slots, int64_t n, int64_t seq_base,
                                                    int64_t timeout_ns) {
  auto out = torch::full({n, 4}, -1, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA, c10::cuda::current_device()));
  auto error = cuda_zeros(1, torch::kInt32);
  check_cuda(cs::ping(reinterpret_cast<cs::ClockSlots*>(my_slots), reinterpret_cast<cs::ClockSlots*>(peer_slots), n,
                      static_cast<uint64_t>(seq_base), out.data_ptr<int64_t>(), timeout_ns, error.data_ptr<int>(),
                      c10::cuda::getCurrentCUDAStream()),
             "clock ping launch");
  return {out, error};
}

std::tuple<torch::Tensor, torch::Tensor> clock_pong(int64_t my_slots, int64_t peer_slots, int64_t n, int64_t seq_base,
                                                    int64_t timeout_ns) {
  auto out = torch::full({n, 4}, -1, torch::TensorOptions().dtype(torch::kInt64).device(torch::kCUDA, c10::cuda::current_device()));
  auto error = cuda_zeros(1, torch::kInt32);
  check_cuda(cs::pong(reinterpret_cast<cs::ClockSlots*>(my_slots), reinterpret_cast<cs::ClockSlots*>(peer_slots), n,
                      static_cast<uint64_t>(seq_base), out.data_ptr<int64_t>(), timeout_ns, error.data_ptr<int>(),
                      c10::cuda::getCurrentCUDAStream()),
             "clock pong launch");
  return {out, error};
}

// Launch the host-pairing kernel on the current stream; the caller then drives the flag from
// Python. area: pinned CPU int64 tensor of 2 + n elements, zeroed.
torch::Tensor host_pair_launch(torch::Tensor area, int64_t n, int64_t timeout_ns) {
  TORCH_CHECK(area.device().is_cpu() && area.is_pinned() && area.scalar_type() == torch::kInt64 &&
                  area.is_contiguous() && area.numel() >= 2 + n,
              "host pairing area must be a pinned CPU int64 tensor of 2 + n elements");
  void* dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&dev, area.data_ptr(), 0), "cudaHostGetDevicePointer");
  auto error = cuda_zeros(1, torch::kInt32);
  check_cuda(cs::host_pair(static_cast<int64_t*>(dev), n, timeout_ns, error.data_ptr<int>(),
                           c10::cuda::getCurrentCUDAStream()),
             "host pairing launch");
  return error;
}

// ------------------------------------------------------------------------------------------------
// CUDA IPC signal areas (test mode of the 2-rank clock sync; ep_core maps its own buffers)

int64_t signal_alloc(int64_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc signal area");
  check_cuda(cudaMemset(p, 0, bytes), "cudaMemset signal area");
  check_cuda(cudaDeviceSynchronize(), "signal area zeroing");
  return reinterpret_cast<int64_t>(p);
}

void signal_free(int64_t ptr) { check_cuda(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree signal area"); }

py::bytes ipc_handle(int64_t ptr) {
  cudaIpcMemHandle_t h;
  check_cuda(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(ptr)), "cudaIpcGetMemHandle");
  return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
}

int64_t ipc_open(const std::string& handle) {
  TORCH_CHECK(handle.size() == sizeof(cudaIpcMemHandle_t), "IPC handle must be ", sizeof(cudaIpcMemHandle_t), " bytes");
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  check_cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return reinterpret_cast<int64_t>(p);
}

void ipc_close(int64_t ptr) { check_cuda(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)), "cudaIpcCloseMemHandle"); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "epscope recorder: self-test kernels, clock pairing, IPC signal areas";
  m.def("profile_enabled", [] { return st::compiled_with_profile() != 0; }, "built with EPSCOPE_PROFILE=1");
  m.attr("CLOCK_SLOTS_BYTES") = static_cast<int64_t>(sizeof(cs::ClockSlots));
  m.def("buffer_bytes", [](int64_t regions, int64_t capacity) {
    return static_cast<int64_t>(epscope::buffer_bytes(regions, capacity));
  });
  m.def("timer_probe", &timer_probe, py::arg("buf"), py::arg("grid"), py::arg("warps"), py::arg("samples"),
        py::arg("timeout_cycles"));
  m.def("record_cost", &record_cost, py::arg("buf"), py::arg("grid"), py::arg("warps"), py::arg("n"));
  m.def("record_parts", &record_parts, py::arg("part"), py::arg("grid"), py::arg("warps"), py::arg("n"),
        py::arg("cap"), py::arg("hires"));
  m.def("anchored_ticks", &anchored_ticks, py::arg("buf"), py::arg("grid"), py::arg("warps"), py::arg("n"),
        py::arg("every"), py::arg("spin_cycles"));
  m.def("imbalance", &imbalance, py::arg("buf"), py::arg("grid"), py::arg("warps"), py::arg("rounds"),
        py::arg("busy_blocks"), py::arg("busy_warps"), py::arg("units"), py::arg("done"), py::arg("out"),
        py::arg("error"), py::arg("timeout_cycles"));
  m.def("grid_barrier", &grid_barrier, py::arg("buf"), py::arg("grid"), py::arg("warps"), py::arg("rounds"),
        py::arg("units"), py::arg("late_block"), py::arg("late_warp"), py::arg("late_units"), py::arg("arrived"),
        py::arg("out"), py::arg("error"), py::arg("timeout_cycles"));
  m.def("timer_read_cost", &timer_read_cost, py::arg("timer"), py::arg("grid"), py::arg("n"));
  m.def("sm_clock_samples", &sm_clock_samples, py::arg("grid"), py::arg("samples"), py::arg("interval_cycles"));
  m.def("clock_ping", &clock_ping, py::arg("my_slots"), py::arg("peer_slots"), py::arg("n"), py::arg("seq_base"),
        py::arg("timeout_ns"));
  m.def("clock_pong", &clock_pong, py::arg("my_slots"), py::arg("peer_slots"), py::arg("n"), py::arg("seq_base"),
        py::arg("timeout_ns"));
  m.def("host_pair_launch", &host_pair_launch, py::arg("area"), py::arg("n"), py::arg("timeout_ns"));
  m.def("signal_alloc", &signal_alloc);
  m.def("signal_free", &signal_free);
  m.def("ipc_handle", &ipc_handle);
  m.def("ipc_open", &ipc_open);
  m.def("ipc_close", &ipc_close);
}
