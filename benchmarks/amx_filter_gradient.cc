// A 1x1 convolution's filter gradient, dW[M][N] = sum over positions p of X[p][m] dY[p][n]
// (bfloat16 in, float32 out), written by hand for AMX, to see whether it beats oneDNN's
// matmul there (docs/performance.md, "A filter gradient written for AMX"). Not used by the
// project: it was measured and not taken. Linux on a CPU with AMX; two OpenMP threads:
//
//   g++ -O2 -march=native -fopenmp benchmarks/amx_filter_gradient.cc -o /tmp/amx_fg
//   OMP_NUM_THREADS=2 /tmp/amx_fg [POSITIONS_PER_CHUNK]    # default 256
//   MODE=1 ... times the tile products alone (operands packed once, not per call);
//   MODE=2 ... the packing alone (no products: the result is then not the gradient).
//
// Per chunk of positions, each thread packs dY into AMX's pair-interleaved (VNNI) B tiles and
// X into A tiles (pairs, then a 16x16 transpose of 32-bit pairs), then accumulates 2x2 blocks
// of 16x16 float32 result tiles in its own buffer; the buffers are summed at the end. It
// first checks itself against a float64 sum over a small problem.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static bool RequestAmx() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }
static void ConfigureTiles() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
}

static inline uint16_t F2B(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static inline float B2F(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; memcpy(&f, &u, 4); return f; }

// Interleave two rows of 16 bf16 into 16 pairs: [a0 b0 a1 b1 ...].
static inline __m512i Pairs(const uint16_t* a, const uint16_t* b) {
  static const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512i both = _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                                    _mm256_loadu_si256((const __m256i*)b), 1);
  return _mm512_permutexvar_epi16(index, both);
}

static inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) { t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]); t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]); }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]); r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]); r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88); t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88); t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88); r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// dW (M x N, fp32, zeroed by caller per thread) += over positions [p0, p1).
// a: [P][lda] bf16 (M channels used), b: [P][ldb] (N channels). M, N multiples of 32.
static void Chunked(const uint16_t* a, const uint16_t* b, int64_t p0, int64_t p1, int M, int N,
                    float* acc, uint16_t* apack, uint16_t* bpack, int kc) {
  const uint16_t zero[16] = {0};
  for (int64_t c0 = p0; c0 < p1; c0 += kc) {
    int64_t c1 = std::min<int64_t>(c0 + kc, p1);
    int steps = int((c1 - c0 + 31) / 32);
    static int mode = getenv("MODE") ? atoi(getenv("MODE")) : 0;  // 1: no pack, 2: no compute
    if (mode != 1)
    for (int g = 0; g < N / 16; ++g)
      for (int s = 0; s < steps; ++s) {
        uint16_t* tile = bpack + (int64_t(g) * steps + s) * 512;
        for (int r = 0; r < 16; ++r) {
          int64_t p = c0 + 32 * s + 2 * r;
          const uint16_t* x0 = p < c1 ? b + p * N + 16 * g : zero;
          const uint16_t* x1 = p + 1 < c1 ? b + (p + 1) * N + 16 * g : zero;
          _mm512_storeu_si512(tile + 32 * r, Pairs(x0, x1));
        }
      }
    if (mode != 1)
    for (int g = 0; g < M / 16; ++g)
      for (int s = 0; s < steps; ++s) {
        __m512i r[16];
        for (int j = 0; j < 16; ++j) {
          int64_t p = c0 + 32 * s + 2 * j;
          const uint16_t* x0 = p < c1 ? a + p * M + 16 * g : zero;
          const uint16_t* x1 = p + 1 < c1 ? a + (p + 1) * M + 16 * g : zero;
          r[j] = Pairs(x0, x1);
        }
        Transpose16(r);
        uint16_t* tile = apack + (int64_t(g) * steps + s) * 512;
        for (int m = 0; m < 16; ++m) _mm512_storeu_si512(tile + 32 * m, r[m]);
      }
    if (mode != 2)
    for (int mi = 0; mi < M / 16; mi += 2)
      for (int ni = 0; ni < N / 16; ni += 2) {
        float* c = acc + int64_t(16 * mi) * N + 16 * ni;
        _tile_loadd(0, c, N * 4);
        _tile_loadd(1, c + 16, N * 4);
        _tile_loadd(2, c + 16 * N, N * 4);
        _tile_loadd(3, c + 16 * N + 16, N * 4);
        const uint16_t* a0 = apack + int64_t(mi) * steps * 512;
        const uint16_t* a1 = a0 + steps * 512;
        const uint16_t* b0 = bpack + int64_t(ni) * steps * 512;
        const uint16_t* b1 = b0 + steps * 512;
        for (int s = 0; s < steps; ++s) {
          _tile_loadd(4, a0 + s * 512, 64);
          _tile_loadd(5, a1 + s * 512, 64);
          _tile_loadd(6, b0 + s * 512, 64);
          _tile_loadd(7, b1 + s * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c, N * 4);
        _tile_stored(1, c + 16, N * 4);
        _tile_stored(2, c + 16 * N, N * 4);
        _tile_stored(3, c + 16 * N + 16, N * 4);
      }
  }
}

static void FilterGradient(const uint16_t* a, const uint16_t* b, int64_t P, int M, int N, float* out, int kc) {
  int threads = omp_get_max_threads();
  std::vector<std::vector<float>> accs(threads, std::vector<float>(int64_t(M) * N));
#pragma omp parallel
  {
    int t = omp_get_thread_num();
    ConfigureTiles();
    std::vector<float>& acc = accs[t];
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::vector<uint16_t> apack(int64_t(M) * kc + 1024), bpack(int64_t(N) * kc + 1024);
    int64_t per = (P + threads - 1) / threads;
    per = (per + 31) / 32 * 32;
    int64_t p0 = std::min(P, t * per), p1 = std::min(P, p0 + per);
    Chunked(a, b, p0, p1, M, N, acc.data(), apack.data(), bpack.data(), kc);
    _tile_release();
  }
  for (int64_t i = 0; i < int64_t(M) * N; ++i) {
    float s = 0; for (int t = 0; t < threads; ++t) s += accs[t][i]; out[i] = s;
  }
}

int main(int argc, char** argv) {
  if (!RequestAmx()) { printf("no AMX permission\n"); return 1; }
  int kc = argc > 1 ? atoi(argv[1]) : 256;
  // correctness, small
  {
    int64_t P = 1000; int M = 64, N = 96;
    std::vector<uint16_t> a(P * M), b(P * N);
    for (auto& v : a) v = F2B(float(rand()) / RAND_MAX - 0.5f);
    for (auto& v : b) v = F2B(float(rand()) / RAND_MAX - 0.5f);
    std::vector<float> out(M * N);
    FilterGradient(a.data(), b.data(), P, M, N, out.data(), 256);
    double worst = 0;
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) {
      double s = 0; for (int64_t p = 0; p < P; ++p) s += double(B2F(a[p * M + m])) * B2F(b[p * N + n]);
      worst = std::max(worst, std::fabs(s - out[m * N + n]));
    }
    printf("max abs error %.3g\n", worst);
  }
  struct Shape { int64_t P; int M, N; } shapes[] = {
    {100352, 64, 256}, {100352, 256, 64}, {100352, 64, 64}, {25088, 128, 512}, {25088, 512, 128},
    {6272, 256, 1024}, {6272, 1024, 256}, {1568, 512, 2048}, {1568, 2048, 512}};
  for (auto sh : shapes) {
    std::vector<uint16_t> a(sh.P * sh.M), b(sh.P * sh.N);
    for (auto& v : a) v = F2B(float(rand()) / RAND_MAX - 0.5f);
    for (auto& v : b) v = F2B(float(rand()) / RAND_MAX - 0.5f);
    std::vector<float> out(sh.M * sh.N);
    double best = 1e9;
    for (int r = 0; r < 9; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      FilterGradient(a.data(), b.data(), sh.P, sh.M, sh.N, out.data(), kc);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, ms);
    }
    double gf = 2.0 * sh.P * sh.M * sh.N / best / 1e6;
    printf("P %6ld M %4d N %4d: %.2f ms  %.0f GFLOP/s\n", (long)sh.P, sh.M, sh.N, best, gf);
  }
}
