// Cross-GPU and host<->GPU clock pairing for epscope (host-side declarations; no torch).
//
// GPU<->GPU (NTP style, through peer memory): rank 0 runs `ping`, rank k runs `pong`, at the same
// time, one thread each, on a ClockSlots area that each rank owns in its device memory and that
// is mapped on the other (CUDA IPC or symmetric memory; the caller passes `my_slots`, its own
// area, and `peer_slots`, the other rank's area as mapped here).
//
//   rank 0 (ping)                                     rank k (pong)
//   t0 = globaltimer; peer.ping_seq = s
//                                                     my.ping_seq == s; t1 = globaltimer
//                                                     peer.reply[i] = t1
//   my.reply[i] != 0; t3 = globaltimer
//
// Every message is one 64-bit word whose value is its own "ready" flag (a fresh sequence number,
// a nonzero timestamp), so no message needs a fence: each hop is one relaxed system-scope store
// seen by a volatile poll. A first version that sent (t0, seq) and (t1, t2, seq) ordered with
// st.release.sys paid a fence, i.e. an extra NVLink round trip, per hop (3.2 us round trips,
// 1.6 us uncertainty on 2xH200; benchmarks/results/recorder-h200-2026-11-29-v1-branchy.md).
// t0, t3 are rank 0's clock; t1 = t2 rank k's: offset_k = ((t1 - t0) + (t1 - t3)) / 2, and the
// round trip (t3 - t0) bounds its error (profiler/decode/align.py fits offset and drift).
// Sequence numbers are seq_base + i + 1, so a ping area zeroed once serves any number of syncs:
// the caller passes a seq_base that grows by n per sync (both ranks compute it the same way).
// rank 0 zeroes its reply[0..n) (and fences) before its first ping of each sync.
//
// Host<->GPU: `host_pair` spins on a flag in host-mapped pinned memory; the host notes
// perf_counter_ns before it writes flag i and after it sees the GPU's stamp, and the GPU stamps
// %globaltimer between the two. Layout of the pinned int64 array, zeroed by the host:
// [0] host->GPU sequence, [1] unused, [2 + i] globaltimer of pair i (nonzero: the host's flag).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace epscope {
namespace clock_sync {

constexpr int kMaxSamples = 64;  // samples per sync window (reply slots)

struct alignas(64) ClockSlots {
  uint64_t ping_seq;              // written by rank 0 into rank k's area
  uint64_t reserved[7];
  uint64_t reply[kMaxSamples];    // written by rank k into rank 0's area: t1 of sample i
};
static_assert(sizeof(ClockSlots) == 64 + 8 * kMaxSamples, "ClockSlots layout");

constexpr int kErrNone = 0;
constexpr int kErrPingTimeout = 1;  // rank 0 saw no reply within timeout_ns
constexpr int kErrPongTimeout = 2;  // rank k saw no ping within timeout_ns
constexpr int kErrHostTimeout = 3;  // the host did not raise the flag within timeout_ns
// n > kMaxSamples: the launchers return cudaErrorInvalidValue.

// out: int64[n][4] = (t0, t1, t2, t3); rows not reached on timeout stay as the caller filled them.
cudaError_t ping(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream);
// out: int64[n][4] = (0, t1, t1, 0): rank k's view, for checks.
cudaError_t pong(ClockSlots* my_slots, ClockSlots* peer_slots, int n, uint64_t seq_base, int64_t* out,
                 int64_t timeout_ns, int* error, cudaStream_t stream);
// host_area: device pointer of pinned host int64[2 + n] (cudaHostGetDevicePointer).
cudaError_t host_pair(int64_t* host_area, int n, int64_t timeout_ns, int* error, cudaStream_t stream);

}  // namespace clock_sync
}  // namespace epscope
