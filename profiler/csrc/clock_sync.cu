// Clock pairing kernels: GPU<->GPU ping-pong through peer memory, and host<->GPU flag pairing.
// Protocol and layout: clock_sync.cuh. One thread per kernel; every spin bounded by timeout_ns.
#include "profiler/csrc/clock_sync.cuh"

#include "profiler/csrc/recorder.cuh"  // globaltimer()

namespace epscope {
namespace clock_sync {
namespace {

__device__ __forceinline__ uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
__device__ __forceinline__ void st_volatile(uint64_t* p, uint64_t v) { *reinterpret_cast<volatile uint64_t*>(p) = v; }

// Spin until pred(*p); returns the value, or 0 after timeout_ns of %globaltimer.
template <class Pred>
__device__ __forceinline__ uint64_t wait_for(const uint64_t* p, Pred pred, int64_t timeout_ns) {
  const uint64_t start = globaltimer();
  for (;;) {
    const uint64_t v = ld_volatile(p);
    if (pred(v)) return v;
    if (static_cast<int64_t>(globaltimer() - start) > timeout_ns) return 0;
  }
}

__global__ void ping_kernel(ClockSlots* my, ClockSlots* peer, int n, uint64_t seq_base, int64_t* out, int64_t timeout_ns,
                            int* error) {
  for (int i = 0; i < n; ++i) st_volatile(&my->reply[i], 0);
  __threadfence_system();  // the zeros land before any reply to the pings below can
  for (int i = 0; i < n; ++i) {
    const uint64_t seq = seq_base + i + 1;
    const uint64_t t0 = globaltimer();
    st_volatile(&peer->ping_seq, seq);
    const uint64_t t1 = wait_for(&my->reply[i], [](uint64_t v) { return v != 0; }, timeout_ns);
    const uint64_t t3 = globaltimer();
    if (t1 == 0) {
      *error = kErrPingTimeout;
      return;
    }
    out[4 * i + 0] = static_cast<int64_t>(t0);
    out[4 * i + 1] = static_cast<int64_t>(t1);
    out[4 * i + 2] = static_cast<int64_t>(t1);
    out[4 * i + 3] = static_cast<int64_t>(t3);
  }
}

__global__ void pong_kernel(ClockSlots* my, ClockSlots* peer, int n, uint64_t seq_base, int64_t* out, int64_t timeout_ns,
                            int* error) {
  for (int i = 0; i < n; ++i) {
    const uint64_t seq = seq_base + i + 1;
    if (wait_for(&my->ping_seq, [seq](uint64_t v) { return v == seq; }, timeout_ns) != seq) {
      *error = kErrPongTimeout;
      return;
    }
    const uint64_t t1 = globaltimer();
    st_volatile(&peer->reply[i], t1);
    out[4 * i + 0] = 0;
    out[4 * i + 1] = static_cast<int64_t>(t1);
    out[4 * i + 2] = static_cast<int64_t>(t1);
    out[4 * i + 3] = 0;
  }
}

__global__ void host_pair_kernel(int64_t* area, int n, int64_t timeout_ns, int* error) {
  auto* a = reinterpret_cast<uint64_t*>(area);
  for (int i = 0; i < n; ++i) {
    const uint64_t want = static_cast<uint64_t>(i + 1);
    if (wait_for(&a[0], [want](uint64_t v) { return v == want; }, timeout_ns) != want) {
      *error = kErrHostTimeout;
      return;
    }
    st_volatile(&a[2 + i], globaltimer());
  }
}

}  // namespace

cudaError_t ping(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream) {
  if (n < 0 || n > kMaxSamples) return cudaErrorInvalidValue;
  ping_kernel<<<1, 1, 0, stream>>>(my_slots, peer_slots, n, seq_base, out, timeout_ns, error);
  return cudaGetLastError();
}

cudaError_t pong(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream) {
  if (n < 0 || n > kMaxSamples) return cudaErrorInvalidValue;
  pong_kernel<<<1, 1, 0, stream>>>(my_slots, peer_slots, n, seq_base, out, timeout_ns, error);
  return cudaGetLastError();
}

cudaError_t host_pair(int64_t* host_area, int n, int64_t timeout_ns, int* error, cudaStream_t stream) {
  host_pair_kernel<<<1, 1, 0, stream>>>(host_area, n, timeout_ns, error);
  return cudaGetLastError();
}

}  // namespace clock_sync
}  // namespace epscope
