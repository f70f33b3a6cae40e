// Clock pairing kernels: GPU<->GPU ping-pong through peer memory, and host<->GPU flag pairing.
// Protocol and layout: clock_sync.cuh. One thread per kernel; every spin bounded by timeout_ns.
#include "profiler/csrc/clock_sync.cuh"

#include "profiler/csrc/recorder.cuh"  // globaltimer()

namespace epscope {
namespace clock_sync {
namespace {

// System scope: the other side is another GPU (over NVLink) or the host (over PCIe).
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }
__device__ __forceinline__ void st_volatile(uint64_t* p, uint64_t v) { *reinterpret_cast<volatile uint64_t*>(p) = v; }

// Spin until *p == want; false after timeout_ns of %globaltimer.
__device__ __forceinline__ bool wait_eq(const uint64_t* p, uint64_t want, int64_t timeout_ns) {
  const uint64_t start = globaltimer();
  while (ld_acquire_sys(p) != want) {
    if (static_cast<int64_t>(globaltimer() - start) > timeout_ns) return false;
  }
  return true;
}

__global__ void ping_kernel(ClockSlots* my, ClockSlots* peer, int n, uint64_t seq_base, int64_t* out, int64_t timeout_ns,
                            int* error) {
  for (int i = 0; i < n; ++i) {
    const uint64_t seq = seq_base + i + 1;
    const uint64_t t0 = globaltimer();
    st_volatile(&peer->t0, t0);
    st_release_sys(&peer->ping_seq, seq);  // orders the t0 store before the sequence number
    if (!wait_eq(&my->pong_seq, seq, timeout_ns)) {
      *error = kErrPingTimeout;
      return;
    }
    const uint64_t t3 = globaltimer();
    out[4 * i + 0] = static_cast<int64_t>(t0);
    out[4 * i + 1] = static_cast<int64_t>(ld_volatile(&my->t1));
    out[4 * i + 2] = static_cast<int64_t>(ld_volatile(&my->t2));
    out[4 * i + 3] = static_cast<int64_t>(t3);
  }
}

__global__ void pong_kernel(ClockSlots* my, ClockSlots* peer, int n, uint64_t seq_base, int64_t* out, int64_t timeout_ns,
                            int* error) {
  for (int i = 0; i < n; ++i) {
    const uint64_t seq = seq_base + i + 1;
    if (!wait_eq(&my->ping_seq, seq, timeout_ns)) {
      *error = kErrPongTimeout;
      return;
    }
    const uint64_t t1 = globaltimer();
    const uint64_t t0 = ld_volatile(&my->t0);
    st_volatile(&peer->t1, t1);
    const uint64_t t2 = globaltimer();
    st_volatile(&peer->t2, t2);
    st_release_sys(&peer->pong_seq, seq);
    out[4 * i + 0] = static_cast<int64_t>(t0);
    out[4 * i + 1] = static_cast<int64_t>(t1);
    out[4 * i + 2] = static_cast<int64_t>(t2);
    out[4 * i + 3] = 0;
  }
}

__global__ void host_pair_kernel(int64_t* area, int n, int64_t timeout_ns, int* error) {
  auto* a = reinterpret_cast<uint64_t*>(area);
  for (int i = 0; i < n; ++i) {
    if (!wait_eq(&a[0], static_cast<uint64_t>(i + 1), timeout_ns)) {
      *error = kErrHostTimeout;
      return;
    }
    st_volatile(&a[2 + i], globaltimer());
    st_release_sys(&a[1], static_cast<uint64_t>(i + 1));
  }
}

}  // namespace

cudaError_t ping(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream) {
  ping_kernel<<<1, 1, 0, stream>>>(my_slots, peer_slots, n, seq_base, out, timeout_ns, error);
  return cudaGetLastError();
}

cudaError_t pong(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream) {
  pong_kernel<<<1, 1, 0, stream>>>(my_slots, peer_slots, n, seq_base, out, timeout_ns, error);
  return cudaGetLastError();
}

cudaError_t host_pair(int64_t* host_area, int n, int64_t timeout_ns, int* error, cudaStream_t stream) {
  host_pair_kernel<<<1, 1, 0, stream>>>(host_area, n, timeout_ns, error);
  return cudaGetLastError();
}

}  // namespace clock_sync
}  // namespace epscope
