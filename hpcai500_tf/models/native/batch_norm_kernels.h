// The loops of batch_norm_ops.cc's kernels over rows [first, last) of a rows x channels
// tensor, float32 arithmetic; S is float (float32 data) or uint16_t (bfloat16's bits).
// Every channel's affine map is y = (x - mean) a + offset, centred first so that a mean far
// from 0 does not cancel. Compiled apart from TensorFlow's headers, for the CPU that builds
// them (hpcai500_tf/models/native.py).
#pragma once
#include <cstdint>

namespace hpcai500 {

// Whether these loops were built as AVX-512 vector code (else scalar, as the compiler
// vectorises it).
bool VectorLoops();

// out = x as float32, n values.
template <typename S>
void ToFloat(const S* x, int64_t n, float* out);

// sum += x - shift, squares += (x - shift)^2, per channel.
template <typename S>
void BatchNormSums(const S* x, int64_t first, int64_t last, int64_t channels,
                   const float* shift, float* sum, float* squares);

// y = (x - mean) a + offset, then max(y, 0) where relu (a NaN stays a NaN).
template <typename S>
void BatchNormApply(const S* x, S* y, int64_t first, int64_t last, int64_t channels,
                    const float* mean, const float* a, const float* offset, bool relu);

// y = max((x - mean) a + offset + side, 0) (a NaN stays a NaN).
template <typename S>
void BatchNormAddApply(const S* x, const S* side, S* y, int64_t first, int64_t last,
                       int64_t channels, const float* mean, const float* a,
                       const float* offset);

// g = dy (dy + dy_again, rounded to S, where dy_again is not null) where y > 0, else 0,
// written to `g`; sum += g, products += g (x - mean).
template <typename S>
void BatchNormAddGradSums(const S* dy, const S* dy_again, const S* y, const S* x, S* g,
                          int64_t first, int64_t last, int64_t channels, const float* mean,
                          float* sum, float* products);

// g = dy, or 0 where relu and (x - mean) a + offset is not positive;
// sum += g, products += g (x - mean).
template <typename S>
void BatchNormGradSums(const S* dy, const S* x, int64_t first, int64_t last, int64_t channels,
                       const float* mean, const float* a, const float* offset, bool relu,
                       float* sum, float* products);

// dx = a g + slope (x - mean) + constant, g as above.
template <typename S>
void BatchNormGradApply(const S* dy, const S* x, S* dx, int64_t first, int64_t last,
                        int64_t channels, const float* mean, const float* a,
                        const float* offset, const float* slope, const float* constant,
                        bool relu);

}  // namespace hpcai500
