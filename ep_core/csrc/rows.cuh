// Where rows sit, from rank_prefix_matrix (rpm[i][j] = rows rank j receives from ranks 0..i):
// the one copy of this arithmetic for the kernels (dispatch.cu, combine.cu) and the host code that
// issues hook-mode peer copies (hook.cu), so both sides agree on every offset. No torch.
#pragma once

#ifdef __CUDACC__
#define EP_HD __host__ __device__ __forceinline__
#else
#define EP_HD inline
#endif

namespace ep_core {
namespace rows {

// First row, in dst's receive region (== recv_x), of the rows that src sends to dst.
EP_HD int prev_rows(const int* rpm, int src, int dst, int num_ranks) {
  return src > 0 ? rpm[(src - 1) * num_ranks + dst] : 0;
}
// Rows src sends to dst.
EP_HD int rows_between(const int* rpm, int src, int dst, int num_ranks) {
  return rpm[src * num_ranks + dst] - prev_rows(rpm, src, dst, num_ranks);
}
// Rows `src` sends to the peers ranked before d (src's own rows excluded). Two regions are laid
// out by it: s's combine region holds the rows each peer d sends back to s at
// peer_rows_before(s, d); a hook-mode sender stages the rows for peer d at peer_rows_before(me, d).
EP_HD int peer_rows_before(const int* rpm, int src, int d, int num_ranks) {
  int off = 0;
  for (int j = 0; j < d; ++j)
    if (j != src) off += rows_between(rpm, src, j, num_ranks);
  return off;
}

}  // namespace rows
}  // namespace ep_core

#undef EP_HD
