// Runs every loop of hpcai500_tf/models/native/batch_norm_kernels.cc once, float32 and
// bfloat16, on the same made-up data, and prints each result as float32 values, one per
// line: tests/test_native_kernels.py builds it twice (the CPU's own vector loops, and the
// scalar ones) and compares the two outputs.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "batch_norm_kernels.h"

using hpcai500::BatchNormAddApply;
using hpcai500::BatchNormAddGradSums;
using hpcai500::BatchNormApply;
using hpcai500::BatchNormGradApply;
using hpcai500::BatchNormGradSums;
using hpcai500::BatchNormSums;

namespace {

uint32_t state = 12345;
float Next() {  // uniform in [-2, 2)
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(state >> 8) / 4194304.0f - 2.0f;
}
float AsFloat(float v) { return v; }
float AsFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void From(float v, float* out) { *out = v; }
void From(float v, uint16_t* out) {  // truncation: exact inputs for both builds
  uint32_t u;
  std::memcpy(&u, &v, 4);
  *out = static_cast<uint16_t>(u >> 16);
}
template <typename T>
void Print(const char* name, const std::vector<T>& values) {
  std::printf("%s", name);
  for (const T& v : values) std::printf(" %.9g", AsFloat(v));
  std::printf("\n");
}

template <typename S>
void RunAll(const char* kind, int64_t rows, int64_t channels) {
  int64_t n = rows * channels;
  std::vector<S> x(n), side(n), dy(n), y(n), g(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    From(Next(), &x[i]);
    From(Next(), &side[i]);
    From(Next(), &dy[i]);
  }
  std::vector<float> mean(channels), a(channels), offset(channels), slope(channels),
      constant(channels), sum(channels), other(channels);
  for (int64_t c = 0; c < channels; ++c) {
    mean[c] = Next() / 4;
    a[c] = 1 + Next() / 4;
    offset[c] = Next() / 4;
    slope[c] = Next() / 8;
    constant[c] = Next() / 8;
  }
  std::printf("# %s %lld x %lld\n", kind, static_cast<long long>(rows),
              static_cast<long long>(channels));
  auto zero = [&] { sum.assign(channels, 0.0f), other.assign(channels, 0.0f); };
  zero();
  BatchNormSums(x.data(), 0, rows, channels, mean.data(), sum.data(), other.data());
  Print("sums", sum), Print("squares", other);
  for (bool relu : {false, true}) {
    BatchNormApply(x.data(), y.data(), 0, rows, channels, mean.data(), a.data(), offset.data(),
                   relu);
    Print(relu ? "apply_relu" : "apply", y);
    zero();
    BatchNormGradSums(dy.data(), x.data(), 0, rows, channels, mean.data(), a.data(),
                      offset.data(), relu, sum.data(), other.data());
    Print(relu ? "grad_sums_relu" : "grad_sums", sum);
    Print(relu ? "grad_products_relu" : "grad_products", other);
    BatchNormGradApply(dy.data(), x.data(), dx.data(), 0, rows, channels, mean.data(),
                       a.data(), offset.data(), slope.data(), constant.data(), relu);
    Print(relu ? "grad_apply_relu" : "grad_apply", dx);
  }
  BatchNormAddApply(x.data(), side.data(), y.data(), 0, rows, channels, mean.data(), a.data(),
                    offset.data());
  Print("add_apply", y);
  const S* no_second = nullptr;
  for (const S* again : {no_second, static_cast<const S*>(side.data())}) {  // one dy, then two
    zero();
    BatchNormAddGradSums(dy.data(), again, y.data(), x.data(), g.data(), 0, rows, channels,
                         mean.data(), sum.data(), other.data());
    const char* names[2][3] = {{"add_grad_passed", "add_grad_sums", "add_grad_products"},
                               {"add_grad2_passed", "add_grad2_sums", "add_grad2_products"}};
    const auto& name = names[again != nullptr];
    Print(name[0], g), Print(name[1], sum), Print(name[2], other);
  }
}

}  // namespace

int main() {
  std::printf("# loops %s\n", hpcai500::VectorLoops() ? "vector" : "scalar");
  for (int64_t channels : {21, 64}) {  // a partial vector of channels, and whole ones
    RunAll<float>("float32", 37, channels);  // 37 rows: groups of four and a remainder
    RunAll<uint16_t>("bfloat16", 37, channels);
  }
  return 0;
}
