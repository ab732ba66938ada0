#include "batch_norm_kernels.h"

#include <cstring>

namespace hpcai500 {
namespace {

inline float Load(float v) { return v; }
inline float Load(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// bfloat16 rounds to nearest even; a NaN stays a NaN (quiet).
inline void Store(float f, float* out) { *out = f; }
inline void Store(float f, uint16_t* out) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  *out = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}
inline float Relu(float y) { return y < 0.0f ? 0.0f : y; }

}  // namespace

template <typename S>
void ToFloat(const S* __restrict x, int64_t n, float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Load(x[i]);
}

template <typename S>
void BatchNormSums(const S* __restrict x, int64_t first, int64_t last, int64_t channels,
                   const float* __restrict shift, float* __restrict sum,
                   float* __restrict squares) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict row = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      float v = Load(row[c]) - shift[c];
      sum[c] += v;
      squares[c] += v * v;
    }
  }
}

template <typename S>
void BatchNormApply(const S* __restrict x, S* __restrict y, int64_t first, int64_t last,
                    int64_t channels, const float* __restrict mean, const float* __restrict a,
                    const float* __restrict offset, bool relu) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict row = x + r * channels;
    S* __restrict out = y + r * channels;
    if (relu) {
      for (int64_t c = 0; c < channels; ++c)
        Store(Relu((Load(row[c]) - mean[c]) * a[c] + offset[c]), out + c);
    } else {
      for (int64_t c = 0; c < channels; ++c)
        Store((Load(row[c]) - mean[c]) * a[c] + offset[c], out + c);
    }
  }
}

template <typename S>
void BatchNormAddApply(const S* __restrict x, const S* __restrict side, S* __restrict y,
                       int64_t first, int64_t last, int64_t channels,
                       const float* __restrict mean, const float* __restrict a,
                       const float* __restrict offset) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict row = x + r * channels;
    const S* __restrict add = side + r * channels;
    S* __restrict out = y + r * channels;
    for (int64_t c = 0; c < channels; ++c)
      Store(Relu((Load(row[c]) - mean[c]) * a[c] + offset[c] + Load(add[c])), out + c);
  }
}

template <typename S>
void BatchNormAddGradSums(const S* __restrict dy, const S* __restrict y, const S* __restrict x,
                          S* __restrict g, int64_t first, int64_t last, int64_t channels,
                          const float* __restrict mean, float* __restrict sum,
                          float* __restrict products) {
  const S zero{};  // +0 in either storage
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict dyr = dy + r * channels;
    const S* __restrict yr = y + r * channels;
    const S* __restrict xr = x + r * channels;
    S* __restrict gr = g + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      S bits = Load(yr[c]) > 0.0f ? dyr[c] : zero;
      gr[c] = bits;
      float gv = Load(bits);
      sum[c] += gv;
      products[c] += gv * (Load(xr[c]) - mean[c]);
    }
  }
}

template <typename S>
void BatchNormGradSums(const S* __restrict dy, const S* __restrict x, int64_t first,
                       int64_t last, int64_t channels, const float* __restrict mean,
                       const float* __restrict a, const float* __restrict offset, bool relu,
                       float* __restrict sum, float* __restrict products) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict xr = x + r * channels;
    const S* __restrict dyr = dy + r * channels;
    if (relu) {
      for (int64_t c = 0; c < channels; ++c) {
        float centred = Load(xr[c]) - mean[c];
        float g = centred * a[c] + offset[c] > 0.0f ? Load(dyr[c]) : 0.0f;
        sum[c] += g;
        products[c] += g * centred;
      }
    } else {
      for (int64_t c = 0; c < channels; ++c) {
        float g = Load(dyr[c]);
        sum[c] += g;
        products[c] += g * (Load(xr[c]) - mean[c]);
      }
    }
  }
}

template <typename S>
void BatchNormGradApply(const S* __restrict dy, const S* __restrict x, S* __restrict dx,
                        int64_t first, int64_t last, int64_t channels,
                        const float* __restrict mean, const float* __restrict a,
                        const float* __restrict offset, const float* __restrict slope,
                        const float* __restrict constant, bool relu) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict xr = x + r * channels;
    const S* __restrict dyr = dy + r * channels;
    S* __restrict out = dx + r * channels;
    if (relu) {
      for (int64_t c = 0; c < channels; ++c) {
        float centred = Load(xr[c]) - mean[c];
        float g = centred * a[c] + offset[c] > 0.0f ? Load(dyr[c]) : 0.0f;
        Store(a[c] * g + slope[c] * centred + constant[c], out + c);
      }
    } else {
      for (int64_t c = 0; c < channels; ++c)
        Store(a[c] * Load(dyr[c]) + slope[c] * (Load(xr[c]) - mean[c]) + constant[c], out + c);
    }
  }
}

#define INSTANTIATE(S)                                                                       \
  template void ToFloat<S>(const S*, int64_t, float*);                                      \
  template void BatchNormSums<S>(const S*, int64_t, int64_t, int64_t, const float*, float*, \
                                 float*);                                                  \
  template void BatchNormApply<S>(const S*, S*, int64_t, int64_t, int64_t, const float*,    \
                                  const float*, const float*, bool);                       \
  template void BatchNormAddApply<S>(const S*, const S*, S*, int64_t, int64_t, int64_t,     \
                                     const float*, const float*, const float*);            \
  template void BatchNormAddGradSums<S>(const S*, const S*, const S*, S*, int64_t, int64_t, \
                                        int64_t, const float*, float*, float*);            \
  template void BatchNormGradSums<S>(const S*, const S*, int64_t, int64_t, int64_t,         \
                                     const float*, const float*, const float*, bool, float*, \
                                     float*);                                              \
  template void BatchNormGradApply<S>(const S*, const S*, S*, int64_t, int64_t, int64_t,    \
                                      const float*, const float*, const float*,            \
                                      const float*, const float*, bool);
INSTANTIATE(float)
INSTANTIATE(uint16_t)
#undef INSTANTIATE

}  // namespace hpcai500
