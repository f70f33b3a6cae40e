// The buffer map every rank agrees on, and the plain structs kernels and host share.
// Host and device code include it (bindings.cpp is compiled by the host compiler): no device
// code here.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ep_core {

// Limits the buffer map is sized for; the Python side checks every call against them and names
// the limit in its error (ep_core/buffer.py mirrors these through bindings.cpp's `limits()`).
constexpr int kMaxRanks = 8;
constexpr int kMaxExperts = 512;
constexpr int kMaxTopk = 16;
constexpr int kMaxChunks = 1024;   // token chunks per source rank and op
constexpr int kMaxHidden = 8192;
constexpr int kScaleBlock = 128;  // FP8 scales: one float32 per 128 columns (ep-api.md)
constexpr int kNumThreads = 512;   // dispatch / combine blocks: 16 warps
constexpr int kNotifyThreads = 1024;

// Cross-rank barriers of one op (ids index Signals::barrier).
enum BarrierSlot : int { kSlotStart = 0, kSlotLayout = 1, kNumBarrierSlots = 2 };

// Hook mode (hook.cu): a source's copy-engine transfer of one op has landed; one flag per kind.
enum HookKind : int { kHookDispatch = 0, kHookCombine = 1, kNumHookKinds = 2 };

// Which kernel raised an error (ErrorInfo::kernel); Python maps them back to names.
enum KernelId : int { kKernelLayout = 1, kKernelNotify = 2, kKernelDispatch = 3, kKernelCombine = 4, kKernelBarrier = 5,
                     kKernelHook = 6 };

// Start of every rank's buffer. Every slot holds the epoch (op sequence number, identical on all
// ranks) of the last op that signalled it, so nothing is ever reset: a wait is "slot >= epoch",
// and the start barrier of op N+1 orders any reuse after op N on every rank.
struct alignas(128) Signals {
  int barrier[kNumBarrierSlots][kMaxRanks];     // [slot][source rank]
  int dispatch_ready[kMaxRanks][kMaxChunks];    // [source rank][source chunk]: rows written
  int combine_ready[kMaxRanks][kMaxChunks];     // [sending rank][this rank's chunk]: rows written
  int abort_epoch;                              // an op that timed out on this rank: later waits of it give up
  int error_claim;                              // first failing warp claims the error record (device atomics only)
  // Epoch of the last op this rank opened. The op-opening kernel (notify or the bare barrier)
  // increments it on the device, so a CUDA graph that replays an op gets a fresh epoch each time
  // (a host-passed epoch would be frozen into the graph's kernel arguments).
  int op_epoch;
  int hook_ready[kNumHookKinds][kMaxRanks];     // [dispatch/combine][source rank]: its peer copies landed here
  int pad[29 - kNumHookKinds * kMaxRanks];
  uint64_t clock_sync[2 * 64];                  // ping-pong area for profiler clock alignment
};

// What a source rank tells every destination in notify (one slot per source in each buffer).
struct alignas(16) LayoutSlot {
  int counts[kMaxRanks];                        // rows the source sends to each rank
  int expert_counts[kMaxExperts];               // the destination's local experts, from this source
  int num_chunks;
  int pad[3];
  int chunk_prefix[kMaxChunks + 4];             // rows to this destination before each source chunk
};

constexpr size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t kSignalsBytes = align_up(sizeof(Signals), 4096);
constexpr size_t kLayoutBytes = align_up(sizeof(LayoutSlot) * kMaxRanks, 4096);
constexpr size_t kDataOffset = kSignalsBytes + kLayoutBytes;  // rows start here
static_assert(kDataOffset % 4096 == 0, "data region must stay 16-byte (and page) aligned");
// ep_core/config.py's DATA_OFFSET sizes buffers without the extension (a CPU machine can ask for a
// size hint): a change of Signals or LayoutSlot must change both (tests/ep_core/test_buffer_logic.py).
static_assert(kDataOffset == 122880, "kDataOffset changed: update DATA_OFFSET in ep_core/config.py");

// Base addresses of the same buffer on every rank (own one included), passed by value.
struct PeerPtrs {
  char* base[kMaxRanks];
};

// Host-mapped error record (cudaHostAllocMapped): the first failing warp of a rank fills it.
struct ErrorInfo {
  int flag;      // 0 ok, 1 timeout, 2 buffer capacity, 3 recv_x rows (num_worst_tokens too small),
                 // 4 a staged bulk copy (tma.cuh) did not land within the bound, 5 a launch plan
                 // that does not match the kernel (shared memory / buffer count)
  int rank;
  int kernel;    // KernelId
  int phase;     // registry phase or barrier id (is_barrier says which)
  int is_barrier;
  int channel;   // chunk / block the warp worked on
  int peer;      // rank waited on
  int epoch;
};

// Everything a kernel needs to fail cleanly.
struct FailCtx {
  ErrorInfo* err;        // host-mapped
  int* claim;            // Signals::error_claim of this rank (device memory: atomics stay on the GPU)
  uint64_t timeout_ns;   // bound of every spin-wait
  int rank;
  int epoch;             // the op's epoch; filled on the device from op_epoch when that is set
  int kernel;
  int* op_epoch;         // Signals::op_epoch of this rank, or null: then `epoch` is taken as given
};

// Where the rows of an op live inside the data region of every rank's buffer (same offsets on
// every rank: all ranks size the regions from the same arguments).
struct RowRegions {
  size_t x, scales, topk_idx, topk_weights;  // byte offsets from the buffer base
  int capacity;                               // rows
};

}  // namespace ep_core
