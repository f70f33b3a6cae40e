// Clock calibration kernels; declarations and arguments in calibrate.cuh. No torch here.
#include "profiler/csrc/calibrate.cuh"

#include "profiler/csrc/recorder.cuh"

namespace epscope {
namespace calibrate {
namespace {

template <int kTimer>
__global__ void read_cost_kernel(int n, int64_t* cycles, uint64_t* sink) {
  uint64_t acc = 0;
  __syncwarp();
  const int64_t c0 = clock64();
  for (int i = 0; i < n; ++i) acc += kTimer == kTimerClock64 ? uint64_t(clock64()) : globaltimer();
  const int64_t c1 = clock64();
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = c1 - c0;
    sink[blockIdx.x] = acc;
  }
}

__global__ void sm_clocks_kernel(int samples, int64_t interval_cycles, AnchorSample* out) {
  if (threadIdx.x != 0) return;
  AnchorSample* mine = out + int64_t(blockIdx.x) * samples;
  const uint64_t sm = smid();
  int64_t next = clock64();
  for (int i = 0; i < samples; ++i) {
    while (int64_t(clock64()) < next) {
    }
    const uint64_t c0 = clock64();
    const uint64_t g = globaltimer();
    const uint64_t c1 = clock64();
    mine[i] = AnchorSample{c0, g, c1, sm};
    next += interval_cycles;
  }
}

}  // namespace

cudaError_t read_cost(int timer, int grid, int n, int64_t* cycles, uint64_t* sink, cudaStream_t stream) {
  if (grid <= 0 || n < 0) return cudaErrorInvalidValue;
  if (timer == kTimerClock64)
    read_cost_kernel<kTimerClock64><<<grid, 32, 0, stream>>>(n, cycles, sink);
  else if (timer == kTimerGlobaltimer)
    read_cost_kernel<kTimerGlobaltimer><<<grid, 32, 0, stream>>>(n, cycles, sink);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t sm_clocks(int grid, int samples, int64_t interval_cycles, AnchorSample* out, cudaStream_t stream) {
  if (grid <= 0 || samples <= 0 || interval_cycles < 0) return cudaErrorInvalidValue;
  sm_clocks_kernel<<<grid, 32, 0, stream>>>(samples, interval_cycles, out);
  return cudaGetLastError();
}

}  // namespace calibrate
}  // namespace epscope
