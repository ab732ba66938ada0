#include "batch_norm_kernels.h"

#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__)
#include <immintrin.h>
#define HPCAI500_AVX512 1  // the vector loops, 16 channels at a time
#else
#define HPCAI500_AVX512 0  // the scalar loops, as the compiler vectorises them
#endif

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
void ToFloat(const S* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Load(x[i]);
}

// The loops as plain C++ (the compiler vectorises them as it can): the exported loops, or
// where the vector loops below are built, their tails (namespace scalar).
#if HPCAI500_AVX512
namespace scalar {
#endif

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
void BatchNormAddApply(const S* __restrict x, const S* side, S* y,  // y may be over side
                       int64_t first, int64_t last, int64_t channels,
                       const float* __restrict mean, const float* __restrict a,
                       const float* __restrict offset) {
  for (int64_t r = first; r < last; ++r) {
    const S* __restrict row = x + r * channels;
    const S* add = side + r * channels;
    S* out = y + r * channels;
    for (int64_t c = 0; c < channels; ++c)
      Store(Relu((Load(row[c]) - mean[c]) * a[c] + offset[c] + Load(add[c])), out + c);
  }
}

template <typename S>
void BatchNormAddGradSums(const S* dy, const S* dy_again,  // g may be written over either
                          const S* __restrict y, const S* __restrict x, S* g,
                          int64_t first, int64_t last, int64_t channels,
                          const float* __restrict mean, float* __restrict sum,
                          float* __restrict products) {
  const S zero{};  // +0 in either storage
  for (int64_t r = first; r < last; ++r) {
    const S* dyr = dy + r * channels;
    const S* __restrict yr = y + r * channels;
    const S* __restrict xr = x + r * channels;
    S* gr = g + r * channels;
    if (dy_again != nullptr) {
      const S* again = dy_again + r * channels;
      for (int64_t c = 0; c < channels; ++c) Store(Load(dyr[c]) + Load(again[c]), gr + c);
    }
    for (int64_t c = 0; c < channels; ++c) {
      S bits = Load(yr[c]) > 0.0f ? (dy_again != nullptr ? gr[c] : dyr[c]) : zero;
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
void BatchNormGradApply(const S* dy, const S* x, S* dx,  // dx may be written over dy or x
                        int64_t first, int64_t last, int64_t channels,
                        const float* __restrict mean, const float* __restrict a,
                        const float* __restrict offset, const float* __restrict slope,
                        const float* __restrict constant, bool relu) {
  for (int64_t r = first; r < last; ++r) {
    const S* xr = x + r * channels;
    const S* dyr = dy + r * channels;
    S* out = dx + r * channels;
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

#if HPCAI500_AVX512
}  // namespace scalar

// The same loops 16 channels at a time with AVX-512, four rows at a time where sums are kept
// (each partial sum loaded and stored once per four rows), bfloat16 rounded by the CPU's own
// conversion (VCVTNEPS2BF16: to nearest even, a NaN stays a NaN, but values below bfloat16's
// smallest normal become 0, as oneDNN's bfloat16 kernels round them).
namespace simd {

constexpr __mmask16 kAll = 0xFFFF;  // all 16 lanes
inline __mmask16 Lanes(int64_t c, int64_t channels) {
  int64_t left = channels - c;
  return left >= 16 ? kAll : __mmask16((1u << left) - 1);
}
// Whole vectors are loaded and stored without a mask, only a row's last partial vector with
// one: on AMD Zen 5, masked forms throughout made the train step's batch norms take 2.5x as
// long in bfloat16 and 1.35x in float32 (docs/performance.md).
inline __m512 Load(const float* p, __mmask16 m) {
  return m == kAll ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
inline void Store(__m512 v, float* p, __mmask16 m) {
  if (m == kAll) _mm512_storeu_ps(p, v); else _mm512_mask_storeu_ps(p, m, v);
}
inline __m256i LoadBits(const uint16_t* p, __mmask16 m) {
  return m == kAll ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                   : _mm256_maskz_loadu_epi16(m, p);
}
inline void StoreBits(__m256i bits, uint16_t* p, __mmask16 m) {
  if (m == kAll) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  else _mm256_mask_storeu_epi16(p, m, bits);
}
inline __m512 Load(const uint16_t* p, __mmask16 m) {
  __m512i wide = _mm512_cvtepu16_epi32(LoadBits(p, m));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline void Store(__m512 v, uint16_t* p, __mmask16 m) {
  StoreBits(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)), p, m);
}
// to = from where `where`, +0 elsewhere (lanes m), the bits copied.
inline void CopyWhere(const float* from, float* to, __mmask16 where, __mmask16 m) {
  Store(_mm512_maskz_mov_ps(where, Load(from, m)), to, m);
}
inline void CopyWhere(const uint16_t* from, uint16_t* to, __mmask16 where, __mmask16 m) {
  StoreBits(_mm256_maskz_mov_epi16(where, LoadBits(from, m)), to, m);
}
inline __m512 Relu(__m512 y) {  // a NaN stays a NaN
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ),
                            _mm512_setzero_ps());
}
inline __mmask16 Positive(__m512 v) {
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
}

}  // namespace simd
using namespace simd;  // NOLINT: the loops below read as the scalar ones

template <typename S>
void BatchNormSums(const S* x, int64_t first, int64_t last, int64_t channels,
                   const float* shift, float* sum, float* squares) {
  int64_t r = first;
  for (; r + 4 <= last; r += 4) {
    const S* row = x + r * channels;
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 centre = Load(shift + c, m), s = Load(sum + c, m), q = Load(squares + c, m);
      for (int k = 0; k < 4; ++k) {
        __m512 v = _mm512_sub_ps(Load(row + k * channels + c, m), centre);
        s = _mm512_add_ps(s, v);
        q = _mm512_fmadd_ps(v, v, q);
      }
      Store(s, sum + c, m);
      Store(q, squares + c, m);
    }
  }
  if (r < last) scalar::BatchNormSums(x, r, last, channels, shift, sum, squares);
}

template <typename S>
void BatchNormApply(const S* x, S* y, int64_t first, int64_t last, int64_t channels,
                    const float* mean, const float* a, const float* offset, bool relu) {
  for (int64_t r = first; r < last; ++r) {
    const S* row = x + r * channels;
    S* out = y + r * channels;
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 v = _mm512_sub_ps(Load(row + c, m), Load(mean + c, m));
      v = _mm512_fmadd_ps(v, Load(a + c, m), Load(offset + c, m));
      Store(relu ? Relu(v) : v, out + c, m);
    }
  }
}

template <typename S>
void BatchNormAddApply(const S* x, const S* side, S* y, int64_t first, int64_t last,
                       int64_t channels, const float* mean, const float* a,
                       const float* offset) {
  for (int64_t r = first; r < last; ++r) {
    int64_t at = r * channels;
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 v = _mm512_sub_ps(Load(x + at + c, m), Load(mean + c, m));
      v = _mm512_fmadd_ps(v, Load(a + c, m), Load(offset + c, m));
      Store(Relu(_mm512_add_ps(v, Load(side + at + c, m))), y + at + c, m);
    }
  }
}

template <typename S>
void BatchNormAddGradSums(const S* dy, const S* dy_again, const S* y, const S* x, S* g,
                          int64_t first, int64_t last, int64_t channels, const float* mean,
                          float* sum, float* products) {
  int64_t r = first;
  for (; r + 4 <= last; r += 4) {
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 centre = Load(mean + c, m), s = Load(sum + c, m), p = Load(products + c, m);
      for (int k = 0; k < 4; ++k) {
        int64_t at = (r + k) * channels + c;
        __mmask16 passes = Positive(Load(y + at, m));
        __m512 gv;
        if (dy_again != nullptr) {  // the sum as S holds it: stored, then read back
          Store(_mm512_maskz_add_ps(passes, Load(dy + at, m), Load(dy_again + at, m)), g + at, m);
          gv = Load(g + at, m);
        } else {  // dy read before g, which may be written over it
          gv = _mm512_maskz_mov_ps(passes, Load(dy + at, m));
          CopyWhere(dy + at, g + at, passes, m);
        }
        s = _mm512_add_ps(s, gv);
        p = _mm512_fmadd_ps(gv, _mm512_sub_ps(Load(x + at, m), centre), p);
      }
      Store(s, sum + c, m);
      Store(p, products + c, m);
    }
  }
  if (r < last)
    scalar::BatchNormAddGradSums(dy, dy_again, y, x, g, r, last, channels, mean, sum, products);
}

template <typename S>
void BatchNormGradSums(const S* dy, const S* x, int64_t first, int64_t last, int64_t channels,
                       const float* mean, const float* a, const float* offset, bool relu,
                       float* sum, float* products) {
  int64_t r = first;
  for (; r + 4 <= last; r += 4) {
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 centre = Load(mean + c, m), scale = Load(a + c, m), shift = Load(offset + c, m);
      __m512 s = Load(sum + c, m), p = Load(products + c, m);
      for (int k = 0; k < 4; ++k) {
        int64_t at = (r + k) * channels + c;
        __m512 centred = _mm512_sub_ps(Load(x + at, m), centre);
        __mmask16 passes = relu ? Positive(_mm512_fmadd_ps(centred, scale, shift)) : m;
        __m512 gv = _mm512_maskz_mov_ps(passes, Load(dy + at, m));
        s = _mm512_add_ps(s, gv);
        p = _mm512_fmadd_ps(gv, centred, p);
      }
      Store(s, sum + c, m);
      Store(p, products + c, m);
    }
  }
  if (r < last)
    scalar::BatchNormGradSums(dy, x, r, last, channels, mean, a, offset, relu, sum, products);
}

template <typename S>
void BatchNormGradApply(const S* dy, const S* x, S* dx, int64_t first, int64_t last,
                        int64_t channels, const float* mean, const float* a,
                        const float* offset, const float* slope, const float* constant,
                        bool relu) {
  for (int64_t r = first; r < last; ++r) {
    int64_t at = r * channels;
    for (int64_t c = 0; c < channels; c += 16) {
      __mmask16 m = Lanes(c, channels);
      __m512 scale = Load(a + c, m);
      __m512 centred = _mm512_sub_ps(Load(x + at + c, m), Load(mean + c, m));
      __mmask16 passes = relu ? Positive(_mm512_fmadd_ps(centred, scale, Load(offset + c, m))) : m;
      __m512 gv = _mm512_maskz_mov_ps(passes, Load(dy + at + c, m));
      __m512 out = _mm512_fmadd_ps(Load(slope + c, m), centred, Load(constant + c, m));
      Store(_mm512_fmadd_ps(scale, gv, out), dx + at + c, m);
    }
  }
}

#endif

bool VectorLoops() { return HPCAI500_AVX512 != 0; }

#define INSTANTIATE(S)                                                                       \
  template void ToFloat<S>(const S*, int64_t, float*);                                      \
  template void BatchNormSums<S>(const S*, int64_t, int64_t, int64_t, const float*, float*, \
                                 float*);                                                  \
  template void BatchNormApply<S>(const S*, S*, int64_t, int64_t, int64_t, const float*,    \
                                  const float*, const float*, bool);                       \
  template void BatchNormAddApply<S>(const S*, const S*, S*, int64_t, int64_t, int64_t,     \
                                     const float*, const float*, const float*);            \
  template void BatchNormAddGradSums<S>(const S*, const S*, const S*, const S*, S*, int64_t, \
                                        int64_t, int64_t, const float*, float*, float*);   \
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
