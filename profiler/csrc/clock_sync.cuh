// Cross-GPU and host<->GPU clock pairing for epscope (host-side declarations; no torch).
//
// GPU<->GPU (NTP style, through peer memory): rank 0 runs `ping`, rank k runs `pong`, at the same
// time, one thread each, on a 64-byte ClockSlots area that each rank owns in its device memory and
// that is mapped on the other (CUDA IPC or symmetric memory; the caller passes `my_slots`, its own
// area, and `peer_slots`, the other rank's area as mapped here).
//
//   rank 0 (ping)                                     rank k (pong)
//   t0 = globaltimer; peer.t0 = t0; release peer.ping_seq = s
//                                                     acquire my.ping_seq == s; t1 = globaltimer
//                                                     peer.t1 = t1; t2 = globaltimer; peer.t2 = t2
//                                                     release peer.pong_seq = s
//   acquire my.pong_seq == s; t3 = globaltimer
//
// t0, t3 are rank 0's clock; t1, t2 rank k's. offset_k = ((t1 - t0) + (t2 - t3)) / 2 and the
// round trip (t3 - t0) - (t2 - t1) bounds its error (profiler/align.py fits offset and drift).
// Sequence numbers are seq_base + i + 1, so an area zeroed once serves any number of syncs: the
// caller passes a seq_base that grows by n per sync (both ranks compute it the same way).
//
// Host<->GPU: `host_pair` spins on a flag in host-mapped pinned memory; the host notes
// perf_counter_ns before it writes flag i and after it sees the GPU's acknowledgement, and the GPU
// stamps %globaltimer between the two. Layout of the pinned int64 array: [0] host->GPU sequence,
// [1] GPU->host acknowledgement, [2 + i] globaltimer of pair i.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace epscope {
namespace clock_sync {

struct alignas(64) ClockSlots {
  uint64_t ping_seq;  // written by rank 0 into rank k's area
  uint64_t t0;        // rank 0's globaltimer at send, written with ping_seq
  uint64_t pong_seq;  // written by rank k into rank 0's area
  uint64_t t1;        // rank k's globaltimer when it saw the ping
  uint64_t t2;        // rank k's globaltimer just before it replied
  uint64_t reserved[3];
};
static_assert(sizeof(ClockSlots) == 64, "one ClockSlots area is 64 bytes");

constexpr int kErrNone = 0;
constexpr int kErrPingTimeout = 1;  // rank 0 saw no reply within timeout_ns
constexpr int kErrPongTimeout = 2;  // rank k saw no ping within timeout_ns
constexpr int kErrHostTimeout = 3;  // the host did not raise the flag within timeout_ns

// out: int64[n][4] = (t0, t1, t2, t3); rows not reached on timeout stay as the caller filled them.
cudaError_t ping(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream);
// out: int64[n][4] = (t0 as read, t1, t2, 0): rank k's view, for checks.
cudaError_t pong(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream);
// host_area: device pointer of pinned host int64[2 + n] (cudaHostGetDevicePointer).
cudaError_t host_pair(int64_t* host_area, int n, int64_t timeout_ns, int* error, cudaStream_t stream);

}  // namespace clock_sync
}  // namespace epscope
