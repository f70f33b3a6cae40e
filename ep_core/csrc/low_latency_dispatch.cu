// Low-latency dispatch: each token crosses NVLink once per destination rank, and the receiver
// fans it out to its local experts.
//
// Send half (every rank, op n, buffer half h = n & 1):
//   router warps (one per destination d, warps g < R): for every token, the experts it has on d
//     and, per expert, the token's position among this rank's tokens of that expert in token
//     order (shared-memory masks per 32 tokens); written as the routing records meta[h][me][t][k]
//     = (pos << 16) | local expert, plus the header {num_tokens, count per local expert}, into d.
//   (an expert id outside [0, E) counts as -1, "no expert", everywhere)
//   sender tasks (token, slice of its 128-element groups): load the BF16 slice, cast to FP8 with
//     one scale per group (or keep BF16), store it once into each destination's staging row
//     rows[h][me][t] (the own rank included, a local store); slice 0 records the token's
//     destination mask for combine.
//   send_done: the last arrival publishes data_flag[h][me] = n on every rank.
// Receive half (the same launch, or the recv hook):
//   expert warps (warps g < E/R): recv_count and layout_range of one local expert from the
//     sources' headers (sources in rotation order from this rank, so its own rows come first and
//     never wait for a peer's counts).
//   fan-out tasks ((source, token), slice): row of the token in each of its experts = the counts
//     of the sources before it + its position (so the task waits for the data flags of those
//     sources too: their headers hold the counts); copy the slice (and its scales, column-major)
//     into every one of them; slice 0 writes src_info and the handle's row ids for combine.
//   recv_done: the last arrival posts credit[h][me] = n on every rank.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "ep_core/csrc/low_latency_device.cuh"

namespace ep_core {
namespace low_latency {
namespace {

// 16-byte loads in flight per lane: a 7168-wide BF16 row is 56 groups; a slice of the default
// floor (4 groups) is 2 passes, a whole row (the per-block split) 28.
constexpr int kUnroll = 4;

struct Ctx {
  const DispatchArgs& a;
  const Layout& L;
  const PeerPtrs& peers;
  const Knobs& k;
  const Fail& f;
  Op op;
  int num_local, groups, rows_per_expert;  // E / R, H / 128, R * T_max

  __device__ __forceinline__ char* half_of(int r) const { return peers.base[r] + op.half_off; }
  // where token t of this rank lands in rank d's staging
  __device__ __forceinline__ char* staging_at(int d, int t) const {
    return half_of(d) + L.rows + int64_t(op.rank) * L.rows_stride + int64_t(t) * L.row_bytes;
  }
};

// ---- send half -------------------------------------------------------------------------------
// The routing records and header of this rank's tokens for destination d. kK: top-k entries a
// lane keeps in registers (8 or 16: the smallest that holds num_topk).
template <int kK>
__device__ bool route(const Ctx& c, int d, SeenFlags& credits, int* s_run, uint32_t* s_mask,
                      epscope::WarpRecorder& rec) {
  const DispatchArgs& a = c.a;
  const int lane = lane_id(), K = a.num_topk, lo = d * c.num_local;
  if (!wait_credit(credits, d, c.f, c.L, c.op, rec)) return false;
  rec.begin(llph::kRoute, uint32_t(d));
  for (int i = lane; i < c.num_local; i += 32) {
    s_run[i] = 0;
    s_mask[i] = 0u;
  }
  __syncwarp();
  char* dst = c.half_of(d);
  int4* meta = reinterpret_cast<int4*>(at<int>(dst, c.L.meta + int64_t(c.op.rank) * c.L.meta_stride));
  // loads first: the next round's expert ids are in flight while this round is counted (at
  // 418ddf3 the router took 7.2 us for 128 tokens, 4 rounds each waiting for its own loads)
  int64_t next[kK];
  if (c.k.loads_first) {
#pragma unroll
    for (int j = 0; j < kK; ++j) next[j] = (lane < a.num_tokens && j < K) ? __ldg(a.topk_idx + int64_t(lane) * K + j) : -1;
  }
  for (int t0 = 0; t0 < a.num_tokens; t0 += 32) {
    const int t = t0 + lane;
    const bool valid = t < a.num_tokens;
    const int64_t* ids = a.topk_idx + int64_t(t) * K;
    int loc[kK];
    if (c.k.loads_first) {
      int64_t e[kK];
      const int tn = t + 32;
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        e[j] = next[j];
        next[j] = (tn < a.num_tokens && j < K) ? __ldg(a.topk_idx + int64_t(tn) * K + j) : -1;
      }
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        loc[j] = (e[j] >= lo && e[j] < lo + c.num_local) ? int(e[j] - lo) : -1;
        if (loc[j] >= 0) atomicOr(&s_mask[loc[j]], 1u << lane);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        const int64_t e = (valid && j < K) ? ld_in_order(ids + j) : -1;
        loc[j] = (e >= lo && e < lo + c.num_local) ? int(e - lo) : -1;
        if (loc[j] >= 0) atomicOr(&s_mask[loc[j]], 1u << lane);
      }
    }
    __syncwarp();
    int r[kK];
#pragma unroll
    for (int j = 0; j < kK; ++j)
      r[j] = loc[j] >= 0 ? ((s_run[loc[j]] + __popc(s_mask[loc[j]] & lanemask_lt())) << 16) | loc[j] : -1;
    if (valid) {
#pragma unroll
      for (int q = 0; q < kK / 4; ++q)
        meta[int64_t(t) * (kMaxTopk / 4) + q] = make_int4(r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]);
    }
    __syncwarp();
    // the highest lane holding an expert advances its count (a duplicate id in one token
    // finds the mask already cleared: one row per (token, expert))
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (loc[j] >= 0) {
        const uint32_t m = s_mask[loc[j]];
        if ((m >> lane) == 1u) {
          s_run[loc[j]] += __popc(m);
          s_mask[loc[j]] = 0u;
        }
      }
    }
    __syncwarp();
  }
  int* hdr = at<int>(dst, c.L.hdr + int64_t(c.op.rank) * c.L.hdr_stride);
  if (lane == 0) hdr[0] = a.num_tokens;
  for (int i = lane; i < c.num_local; i += 32) hdr[4 + i] = s_run[i];
  rec.end(llph::kRoute, uint32_t(d));
  return true;
}

__device__ __forceinline__ void bf16x8_to_float(const int4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// The FP8 bytes of 8 values and the group's scale_inv (every lane of a 16-lane half holds 8
// values of one group; the amax is reduced over the half).
__device__ __forceinline__ int2 cast_fp8x8(const int4& v, bool round_scale, float& scale_inv) {
  float f[8];
  bf16x8_to_float(v, f);
  float amax = kFP8Margin;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, m));
  float scale;
  fp8_scales(amax, round_scale, scale, scale_inv);
  uint16_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    q[i] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * i] * scale, f[2 * i + 1] * scale), __NV_SATFINITE, __NV_E4M3);
  return make_int2(int(uint32_t(q[0]) | (uint32_t(q[1]) << 16)), int(uint32_t(q[2]) | (uint32_t(q[3]) << 16)));
}

// One slice [g0, g1) of token t: cast and store it into every destination rank of the token.
template <bool kFp8, int kK>
__device__ bool send_token(const Ctx& c, const Task& tk, SeenFlags& credits, epscope::WarpRecorder& rec) {
  const DispatchArgs& a = c.a;
  const int t = tk.item, lane = lane_id(), K = a.num_topk;
  const int half = lane >> 4, chunk = lane & 15;  // a 128-element BF16 group is 16 lanes x 16 B
  const int passes = (tk.g1 - tk.g0 + 1) / 2;
  const int4* xrow = static_cast<const int4*>(a.x) + int64_t(t) * (a.hidden / 8);
  const int64_t* ids = a.topk_idx + int64_t(t) * K;
  rec.begin(llph::kSendToken, uint32_t(t));
  uint32_t mask = 0;
  int4 v[kUnroll];
  bool loaded = false;
  if (c.k.loads_first) {
    // the token's expert ids and its first passes in flight together, before any is used
    int64_t e[kK];
#pragma unroll
    for (int j = 0; j < kK; ++j) e[j] = j < K ? __ldg(ids + j) : -1;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = tk.g0 + 2 * u + half;
      v[u] = (u < passes && g < tk.g1) ? ld_nc(xrow + g * 16 + chunk) : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kK; ++j)
      if (e[j] >= 0 && e[j] < a.num_experts) mask |= 1u << int(e[j] / c.num_local);
    loaded = true;
  } else {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (j >= K) break;
      const int64_t e = ld_in_order(ids + j);
      if (e >= 0 && e < a.num_experts) mask |= 1u << int(e / c.num_local);
    }
  }
  for (uint32_t m = mask; m; m &= m - 1)
    if (!wait_credit(credits, __ffs(m) - 1, c.f, c.L, c.op, rec)) return false;
  if (tk.g0 == 0 && lane == 0) a.sent_mask[t] = int(mask);
  for (int p0 = 0; p0 < passes; p0 += kUnroll) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int g = tk.g0 + 2 * (p0 + u) + half;
        v[u] = (p0 + u < passes && g < tk.g1) ? ld_nc(xrow + g * 16 + chunk) : make_int4(0, 0, 0, 0);
      }
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = tk.g0 + 2 * (p0 + u) + half;
      const bool active = p0 + u < passes && g < tk.g1;
      if (kFp8) {
        float scale_inv;
        const int2 q = cast_fp8x8(v[u], a.round_scale != 0, scale_inv);  // every lane: the amax shuffle
        if (active) {
          for (uint32_t m = mask; m; m &= m - 1) {
            char* row = c.staging_at(__ffs(m) - 1, t);
            *reinterpret_cast<int2*>(row + int64_t(g) * kGroup + chunk * 8) = q;
            if (chunk == 0) *reinterpret_cast<float*>(row + a.hidden + int64_t(g) * 4) = scale_inv;
          }
        }
      } else if (active) {
        for (uint32_t m = mask; m; m &= m - 1)
          st_na(reinterpret_cast<int4*>(c.staging_at(__ffs(m) - 1, t) + int64_t(g) * kGroup * 2) + chunk, v[u]);
      }
    }
  }
  rec.end(llph::kSendToken, uint32_t(t));
  return true;
}

// ---- receive half ----------------------------------------------------------------------------
__device__ bool expert_meta(const Ctx& c, int e, SeenFlags& seen, epscope::WarpRecorder& rec) {
  const DispatchArgs& a = c.a;
  const int R = c.op.num_ranks, me = c.op.rank, lane = lane_id();
  char* base = c.op.own + c.op.half_off;
  for (int si = 0; si < R; ++si) {
    const int s = (me + si) % R;
    if (!wait_flag_once(seen, s, flag_of(c.op.own, c.L.data_flag, c.op.half, s), c.op.epoch, llph::kWaitData, c.f,
                        c.L, c.op, rec))
      return false;
  }
  rec.begin(llph::kExpertMeta, uint32_t(e));
  // lane si holds source (me + si) % R: its count, then an exclusive scan in rotation order
  const int s = (me + lane) % R;
  const int* hdr = lane < R ? at<int>(base, c.L.hdr + int64_t(s) * c.L.hdr_stride) : nullptr;
  const int cnt = lane < R ? ld_cg(hdr + 4 + e) : 0;
  int incl = cnt;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += v;
  }
  const int total = __shfl_sync(kFullMask, incl, 31);
  if (lane < R) a.recv_layout_range[int64_t(e) * R + s] = (int64_t(incl - cnt) << 32) | int64_t(uint32_t(cnt));
  if (lane == 0) {
    a.recv_count[e] = total;
    if (a.cumulative_stats != nullptr) atomicAdd(a.cumulative_stats + e, total);
  }
  if (e == 0 && lane < R) a.recv_tokens[s] = ld_cg(hdr);
  rec.end(llph::kExpertMeta, uint32_t(e));
  return true;
}

// One slice of a received token (item = rotation index of its source * T_max + token) into the
// rows of each of its local experts.
template <bool kFp8, int kK>
__device__ bool fanout(const Ctx& c, const Task& tk, SeenFlags& seen, epscope::WarpRecorder& rec) {
  const DispatchArgs& a = c.a;
  const int R = c.op.num_ranks, me = c.op.rank, lane = lane_id(), K = a.num_topk;
  const int si = tk.item / a.max_tokens, t = tk.item % a.max_tokens;
  const int s = (me + si) % R;
  // The token's rows start after the rows of the sources before s in rotation order, so their
  // headers are read too: wait for every one of those sources, not only s (their routers write
  // the counts during this op; the half still holds op n - 2's counts until then).
  for (int sj = 0; sj <= si; ++sj) {
    const int r = (me + sj) % R;
    if (!wait_flag_once(seen, r, flag_of(c.op.own, c.L.data_flag, c.op.half, r), c.op.epoch, llph::kWaitData, c.f,
                        c.L, c.op, rec))
      return false;
  }
  char* base = c.op.own + c.op.half_off;
  const int* hdr = at<int>(base, c.L.hdr + int64_t(s) * c.L.hdr_stride);
  const int4* meta = reinterpret_cast<const int4*>(at<int>(base, c.L.meta + int64_t(s) * c.L.meta_stride)) +
                     int64_t(t) * (kMaxTopk / 4);
  const char* row = base + c.L.rows + int64_t(s) * c.L.rows_stride + int64_t(t) * c.L.row_bytes;
  // FP8: a 128-byte group is 8 lanes x 16 B (4 groups a pass); BF16: 256 B, 16 lanes (2 a pass)
  constexpr int kLanesPerGroup = kFp8 ? 8 : 16;
  constexpr int kGroupBytes = kFp8 ? kGroup : 2 * kGroup;
  const int gq = lane / kLanesPerGroup, c16 = lane % kLanesPerGroup;
  const int groups_per_pass = 32 / kLanesPerGroup;
  const int ng = tk.g1 - tk.g0, passes = (ng + groups_per_pass - 1) / groups_per_pass;

  int num_tokens;
  int m[kK];
  int4 v[kUnroll];
  bool loaded = false;
  if (c.k.loads_first) {
    // the source's token count, the routing record and the first passes in flight together
    num_tokens = ld_cg(hdr);
#pragma unroll
    for (int q = 0; q < kK / 4; ++q) {
      const int4 r4 = ld_cg(meta + q);
      m[4 * q] = r4.x;
      m[4 * q + 1] = r4.y;
      m[4 * q + 2] = r4.z;
      m[4 * q + 3] = r4.w;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = tk.g0 + groups_per_pass * u + gq;
      v[u] = (u < passes && g < tk.g1)
                 ? ld_cg(reinterpret_cast<const int4*>(row + int64_t(g) * kGroupBytes) + c16)
                 : make_int4(0, 0, 0, 0);
    }
    loaded = true;
  } else {
    num_tokens = ld_cg(hdr);
  }
  if (t >= num_tokens) return true;
  if (!c.k.loads_first) {
#pragma unroll
    for (int j = 0; j < kK; ++j) m[j] = j < K ? ld_in_order(reinterpret_cast<const int*>(meta) + j) : -1;
  }
  rec.begin(llph::kFanout, uint32_t(t));
  // the token's row in each expert: counts of the sources before s (rotation order) + position
  int rowid[kK];
#pragma unroll
  for (int j = 0; j < kK; ++j) {
    rowid[j] = -1;
    if (j < K && m[j] >= 0) {
      const int e = m[j] & 0xffff, pos = m[j] >> 16;
      int before = 0;
      for (int sj = 0; sj < si; ++sj)
        before += ld_cg(at<int>(base, c.L.hdr + int64_t((me + sj) % R) * c.L.hdr_stride) + 4 + e);
      rowid[j] = e * c.rows_per_expert + before + pos;
    }
  }
  const int64_t row_bytes_out = int64_t(a.hidden) * (kFp8 ? 1 : 2);
  char* recv_x = static_cast<char*>(a.recv_x);
  for (int p0 = 0; p0 < passes; p0 += kUnroll) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int g = tk.g0 + groups_per_pass * (p0 + u) + gq;
        v[u] = (p0 + u < passes && g < tk.g1)
                   ? ld_cg(reinterpret_cast<const int4*>(row + int64_t(g) * kGroupBytes) + c16)
                   : make_int4(0, 0, 0, 0);
      }
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = tk.g0 + groups_per_pass * (p0 + u) + gq;
      if (p0 + u >= passes || g >= tk.g1) continue;
#pragma unroll
      for (int j = 0; j < kK; ++j)
        if (rowid[j] >= 0)
          st_na(reinterpret_cast<int4*>(recv_x + int64_t(rowid[j]) * row_bytes_out + int64_t(g) * kGroupBytes) + c16,
                v[u]);
    }
  }
  if (kFp8) {
    const float* scales = reinterpret_cast<const float*>(row + a.hidden);
    const int64_t RT = c.rows_per_expert;
    for (int gi = lane; gi < ng; gi += 32) {
      const int g = tk.g0 + gi;
      const float sc = ld_cg(scales + g);
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        if (rowid[j] < 0) continue;
        const int64_t e = rowid[j] / RT, r = rowid[j] % RT;
        if (a.ue8m0) {
          // int32 [E/R][H/512][R*T_max]: byte g % 4 of word (e, g / 4, r) is the exponent of the scale
          uint8_t* sb = static_cast<uint8_t*>(a.recv_scales);
          sb[((e * (c.groups / 4) + g / 4) * RT + r) * 4 + g % 4] = uint8_t(__float_as_uint(sc) >> 23);
        } else {
          static_cast<float*>(a.recv_scales)[(e * c.groups + g) * RT + r] = sc;
        }
      }
    }
  }
  if (tk.g0 == 0) {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      if (lane == j && j < K) {
        a.slot[(int64_t(s) * a.max_tokens + t) * K + j] = rowid[j];
        if (rowid[j] >= 0) a.recv_src_info[rowid[j]] = t;
      }
    }
  }
  rec.end(llph::kFanout, uint32_t(t));
  return true;
}

// ---- the kernel ------------------------------------------------------------------------------
// Opens the op on the device: the epoch of each half of the op this launch runs. A receive half
// must follow its own send half (the host keeps hooks in order; this is the device's check).
__device__ __forceinline__ int open_op(char* own, const Layout& L, int phases) {
  if (phases == (kSendPhase | kRecvPhase)) {
    const int n = take_epoch(own, L.send_seq, L.send_tickets);
    return take_epoch(own, L.recv_seq, L.recv_tickets) == n ? n : 0;
  }
  if (phases == kSendPhase) return take_epoch(own, L.send_seq, L.send_tickets);
  const int n = take_epoch(own, L.recv_seq, L.recv_tickets);
  return reached(ld_volatile(at<int>(own, L.send_seq)), n) ? n : 0;
}

template <bool kFp8, int kK>
__global__ void __launch_bounds__(kThreads, 1)
    dispatch_kernel(DispatchArgs a, Layout L, PeerPtrs peers, int num_ranks, Knobs k, int phases, Fail f, void* prof) {
  __shared__ int s_epoch;
  __shared__ int s_run[kMaxLocalExperts];
  __shared__ uint32_t s_mask[kMaxLocalExperts];
  epscope::WarpRecorder rec;
  rec.init(prof);
  char* own = peers.base[f.rank];
  if (threadIdx.x == 0) s_epoch = open_op(own, L, phases);
  __syncthreads();
  const int epoch = s_epoch;
  const Op op{own, f.rank, num_ranks, epoch, epoch & 1, L.half0 + int64_t(epoch & 1) * L.half_stride};
  if (epoch == 0) {  // the send and receive epochs disagree: an op's halves ran out of order
    if (threadIdx.x == 0) report(f, L, op, kErrProtocol, 0, 0, -1, f.rank);
    rec.finish();
    return;
  }
  const int num_local = a.num_experts / num_ranks, groups = a.hidden / kGroup;
  const Ctx c{a, L, peers, k, f, op, num_local, groups, num_ranks * a.max_tokens};
  const int B = int(gridDim.x), wpb = int(blockDim.x) / 32, b = int(blockIdx.x), w = warp_in_block();
  const int g = w * B + b, W = B * wpb;
  bool failed = false;

  if (phases & kSendPhase) {
    const Split sp = make_split(a.num_tokens, groups, num_ranks, k, B, wpb);
    SeenFlags credits;
    if (g < num_ranks) failed = !route<kK>(c, g, credits, s_run, s_mask, rec);
    for (TaskIter it(sp, b, w); !failed && it.valid(); it.next()) failed = !send_token<kFp8, kK>(c, it.task(), credits, rec);
    completion_barrier<1>(sp, k, failed, L.send_done, L.send_gen, llph::kBarrierSendDone, f, L, op, rec, [&] {
      const int lane = lane_id();
      if (lane < num_ranks) st_release_sys(flag_of(peers.base[lane], L.data_flag, op.half, op.rank), op.epoch);
      __syncwarp();
      for (int r = 0; r < num_ranks; ++r) rec.instant(llph::kPublish, uint32_t(r));
    });
  }
  if (phases & kRecvPhase) {
    const Split sp = make_split(num_ranks * a.max_tokens, groups, num_local, k, B, wpb);
    SeenFlags seen;
    for (int e = g; !failed && e < num_local; e += W) failed = !expert_meta(c, e, seen, rec);
    for (TaskIter it(sp, b, w); !failed && it.valid(); it.next()) failed = !fanout<kFp8, kK>(c, it.task(), seen, rec);
    completion_barrier<2>(sp, k, failed, L.recv_done, L.recv_gen, llph::kBarrierRecvDone, f, L, op, rec, [&] {
      const int lane = lane_id();
      if (lane < num_ranks) st_release_sys(flag_of(peers.base[lane], L.credit, op.half, op.rank), op.epoch);
      __syncwarp();
      for (int r = 0; r < num_ranks; ++r) rec.instant(llph::kPostCredit, uint32_t(r));
    });
  }
  rec.finish();
}

}  // namespace

cudaError_t dispatch(const DispatchArgs& a, const Layout& L, const PeerPtrs& peers, int num_ranks, const Knobs& k,
                     const Geometry& g, int phases, const Fail& f, void* prof, cudaStream_t stream) {
  if (num_ranks < 1 || num_ranks > kMaxRanks || a.num_experts < num_ranks || a.num_experts % num_ranks != 0 ||
      a.num_experts / num_ranks > kMaxLocalExperts || a.hidden <= 0 || a.hidden % kGroup != 0 ||
      a.hidden > kMaxHidden || a.num_topk < 1 || a.num_topk > kMaxTopk || a.max_tokens < 1 ||
      a.max_tokens > kMaxTokens || a.num_tokens < 0 || a.num_tokens > a.max_tokens ||
      (a.num_tokens > 0 && (a.x == nullptr || a.topk_idx == nullptr)) || a.recv_x == nullptr ||
      a.recv_count == nullptr || a.recv_src_info == nullptr || a.recv_layout_range == nullptr || a.slot == nullptr ||
      a.recv_tokens == nullptr || a.sent_mask == nullptr || (a.fp8 && a.recv_scales == nullptr) ||
      (a.ue8m0 && (!a.fp8 || !a.round_scale || a.hidden % (4 * kGroup) != 0)) ||
      !layout_ok(L, num_ranks, a.max_tokens, a.hidden, a.num_experts / num_ranks) || !launch_ok(k, g, num_ranks, phases))
    return cudaErrorInvalidValue;
  const dim3 grid(g.num_blocks), block(g.warps_per_block * 32);
  if (a.fp8 && a.num_topk <= 8)
    dispatch_kernel<true, 8><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  else if (a.fp8)
    dispatch_kernel<true, kMaxTopk><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  else if (a.num_topk <= 8)
    dispatch_kernel<false, 8><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  else
    dispatch_kernel<false, kMaxTopk><<<grid, block, 0, stream>>>(a, L, peers, num_ranks, k, phases, f, prof);
  return cudaGetLastError();
}

}  // namespace low_latency
}  // namespace ep_core
