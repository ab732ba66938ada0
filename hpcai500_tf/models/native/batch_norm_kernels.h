// The loops of batch_norm_ops.cc's kernels over rows [first, last) of a rows x channels
// tensor, float32 arithmetic; S is float (float32 data) or uint16_t (bfloat16's bits).
// Compiled apart from TensorFlow's headers, for the CPU that builds them
// (hpcai500_tf/models/native.py).
#pragma once
#include <cstdint>

namespace hpcai500 {

// out = x as float32, n values.
template <typename S>
void ToFloat(const S* x, int64_t n, float* out);

// sum += x - shift, squares += (x - shift)^2, per channel.
template <typename S>
void BatchNormSums(const S* x, int64_t first, int64_t last, int64_t channels,
                   const float* shift, float* sum, float* squares);

// y = x a + b, then max(y, 0) where relu (a NaN stays a NaN).
template <typename S>
void BatchNormApply(const S* x, S* y, int64_t first, int64_t last, int64_t channels,
                    const float* a, const float* b, bool relu);

// y = max(x a + b + side, 0) (a NaN stays a NaN).
template <typename S>
void BatchNormAddApply(const S* x, const S* side, S* y, int64_t first, int64_t last,
                       int64_t channels, const float* a, const float* b);

// g = dy where y > 0, else 0, written to `g`; sum += g, products += g (x - mean).
template <typename S>
void BatchNormAddGradSums(const S* dy, const S* y, const S* x, S* g, int64_t first,
                          int64_t last, int64_t channels, const float* mean, float* sum,
                          float* products);

// g = dy, or 0 where relu and x a + b is not positive; sum += g, products += g (x - mean).
template <typename S>
void BatchNormGradSums(const S* dy, const S* x, int64_t first, int64_t last, int64_t channels,
                       const float* a, const float* b, const float* mean, bool relu,
                       float* sum, float* products);

// dx = k1 g + k2 x + k3, g as above.
template <typename S>
void BatchNormGradApply(const S* dy, const S* x, S* dx, int64_t first, int64_t last,
                        int64_t channels, const float* a, const float* b, const float* k1,
                        const float* k2, const float* k3, bool relu);

}  // namespace hpcai500
