// TensorFlow ops for batch normalisation of NHWC tensors in training, with the ReLU after it
// folded in: HpcaiBatchNorm (y, the batch's mean and 1/std, the moving statistics updated as
// FusedBatchNormV3 updates them) and HpcaiBatchNormGrad (dx, dscale, doffset). Two passes over
// the data each way (sums, then the output), float32 arithmetic on bfloat16 or float32 data,
// run on TensorFlow's intra-op threads. The ReLU's mask is recomputed from x in the gradient.
// Built and loaded by hpcai500_tf/models/native.py; the loops are batch_norm_kernels.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "batch_norm_kernels.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hpcai500 {
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::bfloat16;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// y as x (at least a batch and a channel dimension), then four per-channel vectors.
absl::Status ForwardShapes(InferenceContext* c) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &x));
  c->set_output(0, x);
  auto channels = c->Dim(x, -1);
  for (int i = 1; i < 5; ++i) c->set_output(i, c->Vector(channels));
  return absl::OkStatus();
}

REGISTER_OP("HpcaiBatchNorm")
    .Input("x: T")
    .Input("scale: float")
    .Input("offset: float")
    .Input("moving_mean: float")
    .Input("moving_variance: float")
    .Output("y: T")
    .Output("batch_mean: float")
    .Output("batch_inv_std: float")
    .Output("new_moving_mean: float")
    .Output("new_moving_variance: float")
    .Attr("T: {bfloat16, float}")
    .Attr("epsilon: float")
    .Attr("exponential_avg_factor: float")
    .Attr("relu: bool")
    .SetShapeFn(ForwardShapes);

REGISTER_OP("HpcaiBatchNormAdd")
    .Input("x: T")
    .Input("side: T")
    .Input("scale: float")
    .Input("offset: float")
    .Input("moving_mean: float")
    .Input("moving_variance: float")
    .Output("y: T")
    .Output("batch_mean: float")
    .Output("batch_inv_std: float")
    .Output("new_moving_mean: float")
    .Output("new_moving_variance: float")
    .Output("y_again: again * T")  // again 1: y once more, for a second consumer; 0: none
                                    // (more is refused by the kernel)
    .Attr("T: {bfloat16, float}")
    .Attr("epsilon: float")
    .Attr("exponential_avg_factor: float")
    .Attr("again: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ForwardShapes(c));
      if (c->num_outputs() > 5) c->set_output(5, c->output(0));
      return absl::OkStatus();
    });

// dy: the gradients of y and, where it was used, of y_again (N = 2), added up here.
REGISTER_OP("HpcaiBatchNormAddGrad")
    .Input("dy: N * T")
    .Input("y: T")
    .Input("x: T")
    .Input("scale: float")
    .Input("batch_mean: float")
    .Input("batch_inv_std: float")
    .Output("dx: T")
    .Output("dside: T")
    .Output("dscale: float")
    .Output("doffset: float")
    .Attr("T: {bfloat16, float}")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, channels;
      const int after = c->num_inputs() - 4;  // x, then scale
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(after), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(after + 1), 1, &channels));
      for (int i = 0; i < 2; ++i) c->set_output(i, x);
      for (int i = 2; i < 4; ++i) c->set_output(i, channels);
      return absl::OkStatus();
    });

REGISTER_OP("HpcaiBatchNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("scale: float")
    .Input("offset: float")
    .Input("batch_mean: float")
    .Input("batch_inv_std: float")
    .Output("dx: T")
    .Output("dscale: float")
    .Output("doffset: float")
    .Attr("T: {bfloat16, float}")
    .Attr("relu: bool")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, channels;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(1), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &channels));
      c->set_output(0, x);
      c->set_output(1, channels);
      c->set_output(2, channels);
      return absl::OkStatus();
    });

// What the loops see of T: float, or bfloat16's 16 bits.
template <typename T>
struct Bits {
  using type = float;
};
template <>
struct Bits<bfloat16> {
  using type = uint16_t;
};
template <typename T>
const typename Bits<T>::type* Data(const Tensor& t) {
  return reinterpret_cast<const typename Bits<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename Bits<T>::type* Data(Tensor* t) {
  return reinterpret_cast<typename Bits<T>::type*>(t->flat<T>().data());
}

// The rows of a rows x channels tensor in blocks of about 64k values: enough for the
// threads, few partial sums to add up.
struct Blocks {
  int64_t rows, count, size;
  Blocks(int64_t rows, int64_t channels) : rows(rows) {
    size = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, channels));
    count = std::max<int64_t>(1, (rows + size - 1) / size);
  }
  int64_t first(int64_t b) const { return b * size; }
  int64_t last(int64_t b) const { return std::min(rows, (b + 1) * size); }
};

// fn(first, last, b) for every block b, on TensorFlow's intra-op threads.
template <typename Fn>
void ForBlocks(OpKernelContext* ctx, const Blocks& blocks, int64_t channels, Fn fn) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  workers->ParallelFor(blocks.count, blocks.size * channels * 8, [&](int64_t from, int64_t to) {
    for (int64_t b = from; b < to; ++b) fn(blocks.first(b), blocks.last(b), b);
  });
}

// Two per-channel sums over all rows, each block's added in double.
template <typename Fn>
void ChannelSums(OpKernelContext* ctx, const Blocks& blocks, int64_t channels, Fn block_sums,
                 std::vector<double>* first, std::vector<double>* second) {
  std::vector<float> partial(blocks.count * 2 * channels, 0.0f);
  ForBlocks(ctx, blocks, channels, [&](int64_t from, int64_t to, int64_t b) {
    float* sums = partial.data() + b * 2 * channels;
    block_sums(from, to, sums, sums + channels);
  });
  first->assign(channels, 0.0);
  second->assign(channels, 0.0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    const float* sums = partial.data() + b * 2 * channels;
    for (int64_t c = 0; c < channels; ++c) {
      (*first)[c] += sums[c];
      (*second)[c] += sums[channels + c];
    }
  }
}

int64_t Channels(const Tensor& x) { return x.dims() == 0 ? 0 : x.dim_size(x.dims() - 1); }

bool OneValuePerChannel(OpKernelContext* ctx, int first, int last, int64_t channels) {
  for (int i = first; i < last; ++i) {
    const Tensor& t = ctx->input(i);
    if (t.dims() != 1 || t.NumElements() != channels) {
      ctx->SetStatus(absl::InvalidArgumentError(
          "scale, offset and the statistics need one value per channel"));
      return false;
    }
  }
  return true;
}

// Forward: HpcaiBatchNorm (kAdd false: inputs x, scale, offset, moving mean and variance)
// and HpcaiBatchNormAdd (kAdd true: x, side, then the same; the ReLU of bn(x) + side).
template <typename T, bool kAdd>
class BatchNormOp : public OpKernel {
 public:
  explicit BatchNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("exponential_avg_factor", &factor_));
    if (kAdd) {
      relu_ = true;
      int again;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("again", &again));
      OP_REQUIRES(ctx, again <= 1, absl::InvalidArgumentError("again is 0 or 1"));
    } else {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("relu", &relu_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr int kScale = kAdd ? 2 : 1;  // index of scale; offset and statistics follow
    const Tensor& x_in = ctx->input(0);
    OP_REQUIRES(ctx, x_in.dims() >= 2,
                absl::InvalidArgumentError("x needs a batch and a channel dimension"));
    OP_REQUIRES(ctx, !kAdd || ctx->input(1).shape() == x_in.shape(),
                absl::InvalidArgumentError("side needs the shape of x"));
    const int64_t channels = Channels(x_in);
    if (!OneValuePerChannel(ctx, kScale, kScale + 4, channels)) return;
    Tensor* y_out;  // with the add, written over side where nothing else holds it (into
                    // lines just read: no read for ownership); x is kept for the gradient
    if (kAdd) {
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({1}, 0, x_in.shape(), &y_out));
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x_in.shape(), &y_out));
    }
    if (kAdd && ctx->num_outputs() > 5) ctx->set_output(5, *y_out);  // y_again: same buffer
    float* out[4];
    for (int i = 0; i < 4; ++i) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i + 1, TensorShape({channels}), &t));
      out[i] = t->flat<float>().data();
    }
    const int64_t rows = channels == 0 ? 0 : x_in.NumElements() / channels;
    OP_REQUIRES(ctx, rows > 0 || channels == 0,
                absl::InvalidArgumentError("batch normalisation over an empty batch"));
    if (channels == 0) return;
    const auto* x = Data<T>(x_in);
    const float* scale = ctx->input(kScale).flat<float>().data();
    const float* offset = ctx->input(kScale + 1).flat<float>().data();
    const float* moving_mean = ctx->input(kScale + 2).flat<float>().data();
    const float* moving_variance = ctx->input(kScale + 3).flat<float>().data();
    Blocks blocks(rows, channels);

    // Sums about the first row, so that a mean far from 0 does not cancel the variance.
    std::vector<float> shift(channels);
    ToFloat(x, channels, shift.data());
    std::vector<double> sum, squares;
    ChannelSums(
        ctx, blocks, channels,
        [&](int64_t from, int64_t to, float* s, float* q) {
          BatchNormSums(x, from, to, channels, shift.data(), s, q);
        },
        &sum, &squares);
    std::vector<float> a(channels);
    float *mean = out[0], *inv_std = out[1];
    for (int64_t c = 0; c < channels; ++c) {
      double centred = sum[c] / rows;
      double variance = squares[c] / rows - centred * centred;
      if (variance < 0) variance = 0;  // rounding; a NaN stays a NaN
      mean[c] = static_cast<float>(shift[c] + centred);
      inv_std[c] = static_cast<float>(1.0 / std::sqrt(variance + epsilon_));
      // The moving variance takes the unbiased batch variance, as FusedBatchNormV3's does.
      double unbiased = rows > 1 ? variance * rows / (rows - 1) : variance;
      out[2][c] = static_cast<float>((1.0 - factor_) * moving_mean[c] + factor_ * mean[c]);
      out[3][c] = static_cast<float>((1.0 - factor_) * moving_variance[c] + factor_ * unbiased);
      a[c] = scale[c] * inv_std[c];
    }
    auto* y = Data<T>(y_out);
    const auto* side = kAdd ? Data<T>(ctx->input(1)) : nullptr;
    const bool relu = relu_;
    ForBlocks(ctx, blocks, channels, [&](int64_t from, int64_t to, int64_t) {
      if (kAdd) {
        BatchNormAddApply(x, side, y, from, to, channels, mean, a.data(), offset);
      } else {
        BatchNormApply(x, y, from, to, channels, mean, a.data(), offset, relu);
      }
    });
  }

 private:
  float epsilon_, factor_;
  bool relu_;
};

// dscale and doffset from the two sums, and dx's per-channel coefficients:
// dx = a (g - sum / n - (x - mean) inv_std dscale / n) = a g + slope (x - mean) + constant.
void GradientCoefficients(const std::vector<double>& sum, const std::vector<double>& products,
                          const std::vector<float>& a, const float* inv_std, int64_t rows,
                          float* dscale, float* doffset, std::vector<float>* slope,
                          std::vector<float>* constant) {
  for (size_t c = 0; c < sum.size(); ++c) {
    doffset[c] = static_cast<float>(sum[c]);
    double dscale_c = products[c] * inv_std[c];
    dscale[c] = static_cast<float>(dscale_c);
    (*slope)[c] = static_cast<float>(-static_cast<double>(a[c]) * inv_std[c] * dscale_c / rows);
    (*constant)[c] = static_cast<float>(-a[c] * sum[c] / rows);
  }
}

// Backward: HpcaiBatchNormGrad (kAdd false: dy, x, scale, offset, mean, inverse std; the
// ReLU's mask recomputed from x) and HpcaiBatchNormAddGrad (kAdd true: one or two dy, y, x,
// scale, mean, inverse std; the mask from y, and dside, the dy sum where it passed, as an
// output too). Two dy are the gradients of y and y_again, whose sum TensorFlow would
// otherwise add up in an AddN of its own: a pass less over the data each.
template <typename T, bool kAdd>
class BatchNormGradOp : public OpKernel {
 public:
  explicit BatchNormGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    if (kAdd) {
      relu_ = true;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &upstreams_));
      OP_REQUIRES(ctx, upstreams_ <= 2, absl::InvalidArgumentError("at most two dy"));
    } else {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("relu", &relu_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int more = upstreams_ - 1;  // inputs after dy sit this much further on
    const int kX = (kAdd ? 2 : 1) + more;
    const Tensor& dy_in = ctx->input(0);
    const Tensor& x_in = ctx->input(kX);
    for (int i = 0; i <= more; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == x_in.shape() && x_in.dims() >= 2,
                  absl::InvalidArgumentError("dy and x need one shape, with a channel dimension"));
    }
    OP_REQUIRES(ctx, !kAdd || ctx->input(kX - 1).shape() == x_in.shape(),
                absl::InvalidArgumentError("y needs the shape of x"));
    const int64_t channels = Channels(x_in);
    if (!OneValuePerChannel(ctx, kX + 1, 6 + more, channels)) return;
    // dx and dside over inputs that nothing else holds, each read at the element it writes:
    // written into lines just read, the writes need no read for ownership. dx: over dy or x
    // (x or y with the add, where dside holds the masked dy); dside: over a dy.
    Tensor *dx_out, *dside_out = nullptr, *dscale_out, *doffset_out;
    int next = 0;
    const int dx_over[] = {kAdd ? kX : 0, kAdd ? kX - 1 : kX}, dside_over[] = {0, 1};
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(dx_over, next++, x_in.shape(),
                                                              &dx_out));
    if (kAdd) {
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({dside_over, 1u + more}, next++,
                                                                x_in.shape(), &dside_out));
    }
    OP_REQUIRES_OK(ctx, ctx->allocate_output(next++, TensorShape({channels}), &dscale_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(next++, TensorShape({channels}), &doffset_out));
    const int64_t rows = channels == 0 ? 0 : x_in.NumElements() / channels;
    if (rows == 0) {  // no data: no gradient of scale or offset either
      dscale_out->flat<float>().setZero();
      doffset_out->flat<float>().setZero();
      return;
    }
    const auto* dy = Data<T>(dy_in);
    const auto* x = Data<T>(x_in);
    const float* scale = ctx->input(kX + 1).flat<float>().data();
    const float* offset = kAdd ? nullptr : ctx->input(3).flat<float>().data();
    const float* mean = ctx->input(4 + more).flat<float>().data();
    const float* inv_std = ctx->input(5 + more).flat<float>().data();
    const auto* dy_again = more ? Data<T>(ctx->input(1)) : nullptr;
    std::vector<float> a(channels);
    for (int64_t c = 0; c < channels; ++c) a[c] = scale[c] * inv_std[c];
    Blocks blocks(rows, channels);
    const bool relu = relu_;
    auto* passed = kAdd ? Data<T>(dside_out) : nullptr;  // dy where the ReLU passed it
    std::vector<double> sum, products;
    ChannelSums(
        ctx, blocks, channels,
        [&](int64_t from, int64_t to, float* s, float* p) {
          if (kAdd) {
            BatchNormAddGradSums(dy, dy_again, Data<T>(ctx->input(kX - 1)), x, passed, from, to,
                                 channels, mean, s, p);
          } else {
            BatchNormGradSums(dy, x, from, to, channels, mean, a.data(), offset, relu, s, p);
          }
        },
        &sum, &products);
    std::vector<float> slope(channels), constant(channels);
    GradientCoefficients(sum, products, a, inv_std, rows, dscale_out->flat<float>().data(),
                         doffset_out->flat<float>().data(), &slope, &constant);
    auto* dx = Data<T>(dx_out);
    ForBlocks(ctx, blocks, channels, [&](int64_t from, int64_t to, int64_t) {
      if (kAdd) {  // g as written by the first pass: no mask to apply again
        BatchNormGradApply(static_cast<const typename Bits<T>::type*>(passed), x, dx, from, to,
                           channels, mean, a.data(), offset, slope.data(), constant.data(),
                           false);
      } else {
        BatchNormGradApply(dy, x, dx, from, to, channels, mean, a.data(), offset, slope.data(),
                           constant.data(), relu);
      }
    });
  }

 private:
  bool relu_;
  int upstreams_ = 1;
};

#define REGISTER(NAME, CLASS, T, ADD)                                               \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          CLASS<T, ADD>);
#define REGISTER_ALL(T)                                             \
  REGISTER("HpcaiBatchNorm", BatchNormOp, T, false)                 \
  REGISTER("HpcaiBatchNormAdd", BatchNormOp, T, true)               \
  REGISTER("HpcaiBatchNormGrad", BatchNormGradOp, T, false)         \
  REGISTER("HpcaiBatchNormAddGrad", BatchNormGradOp, T, true)
REGISTER_ALL(float)
REGISTER_ALL(bfloat16)
#undef REGISTER_ALL
#undef REGISTER

}  // namespace hpcai500
