// Conv and pool window geometry, written once for the host side (the shape rules and
// oar.reference through _C._window_output_size).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace oar {

// A (height, width) pair attr: one entry means both, none means fallback.
struct WindowPair {
  int64_t h, w;
};

inline WindowPair window_pair(const std::vector<int64_t>& value, const std::vector<int64_t>& fallback = {}) {
  const std::vector<int64_t>& values = value.empty() ? fallback : value;
  if (values.size() == 1) return {values[0], values[0]};
  if (values.size() != 2) throw std::invalid_argument("a pair has 1 or 2 entries");
  return {values[0], values[1]};
}

inline int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Output extent of a window of kernel (dilated) sliding by stride over size padded on both sides.
inline int64_t window_output_size(int64_t size, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation = 1) {
  return floor_div(size + 2 * padding - dilation * (kernel - 1) - 1, stride) + 1;
}

}  // namespace oar
