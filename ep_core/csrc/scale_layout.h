// How a dispatch reads its FP8 scales: the one place that turns a scales tensor's presence,
// sizes and strides into what the kernel indexes with (x_scales[t * token_stride + i * hidden_stride]).
// Plain C++ (no torch, no CUDA): bindings.cpp calls it, and tests/ep_core/test_scale_layout.py
// compiles it with g++ on the CPU.
//
// Two rules, both from the zero-token bug of issue 9 (an FP8 dispatch on a rank whose own input
// had zero tokens delivered wrong scales to that rank):
//  * FP8 or not is decided by whether scales were passed, never by their data pointer. An empty
//    tensor has no storage (data_ptr() == nullptr), and the old binding took a null pointer for
//    "no scales": it then set num_scales = 0, so that rank's receiver blocks copied no scales out
//    of its buffer and recv_scales kept whatever the allocator had left there.
//  * A stride of a dimension of size 0 or 1 is never used to address an element, and torch leaves
//    it arbitrary (for T = 0, `s.T.contiguous().T` is reported contiguous with strides
//    (num_scales, 1), for T = 1 it has strides (1, 1)); such strides, and both strides of a
//    tensor without elements, are replaced by the row-major ones, so the kernel never sees a
//    stride that no element justifies.
#pragma once
#include <cstdint>
#include <string>

namespace ep_core {

struct ScaleLayout {
  bool present = false;        // an FP8 dispatch: scales travel with every row
  int num_scales = 0;          // columns of the scales tensor (hidden / 128)
  int64_t token_stride = 0;    // elements between the scales of consecutive tokens
  int64_t hidden_stride = 0;   // elements between consecutive scales of one token
};

// `error` is left empty when the scales fit an FP8 dispatch of num_tokens x hidden; otherwise it
// says what is wrong and the returned layout must not be used.
inline ScaleLayout scale_layout(bool present, int64_t rows, int64_t cols, int64_t stride0, int64_t stride1,
                                int64_t num_tokens, int64_t expected_cols, std::string* error) {
  ScaleLayout s;
  if (!present) return s;
  if (rows != num_tokens || cols != expected_cols) {
    *error = "FP8 scales must be float32 [" + std::to_string(num_tokens) + ", " + std::to_string(expected_cols) +
             "] (row- or column-major), got [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    return s;
  }
  if (stride0 < 0 || stride1 < 0) {
    *error = "FP8 scales must not have negative strides";
    return s;
  }
  s.present = true;
  s.num_scales = static_cast<int>(cols);
  s.token_stride = rows > 1 ? stride0 : cols;
  s.hidden_stride = rows > 0 && cols > 1 ? stride1 : 1;
  return s;
}

}  // namespace ep_core
