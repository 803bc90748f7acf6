// BertLayerNorm(+Grad): LayerNorm over the last axis of float32 x, with the closed-form
// gradient; the forward saves each row's mean and 1 / std for it.

#include "common.h"

namespace bert_trainer {
namespace {

// ---------------------------------------------------------------------------------------
// LayerNorm over the last axis.

class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& gamma = ctx->input(1);
    const Tensor& beta = ctx->input(2);
    OP_REQUIRES(ctx, x.dims() >= 1, InvalidArgument("BertLayerNorm: x must have rank >= 1"));
    const int64_t width = x.dim_size(x.dims() - 1);
    OP_REQUIRES(ctx, gamma.dims() == 1 && gamma.dim_size(0) == width && beta.dims() == 1 &&
                         beta.dim_size(0) == width,
                InvalidArgument("BertLayerNorm: gamma and beta must be [", width, "], got ",
                                gamma.shape().DebugString(), " and ",
                                beta.shape().DebugString()));
    TensorShape row_shape = x.shape();
    row_shape.RemoveLastDims(1);
    Tensor *y = nullptr, *mean = nullptr, *rstd = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, row_shape, &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, row_shape, &rstd));
    if (width == 0) {  // nothing to normalize: the moments of no values are NaN
      mean->flat<float>().setConstant(std::numeric_limits<float>::quiet_NaN());
      rstd->flat<float>().setConstant(std::numeric_limits<float>::quiet_NaN());
      return;
    }
    const int64_t rows = x.NumElements() / width;
    const float* xs = x.flat<float>().data();
    float* ys = y->flat<float>().data();
    float* means = mean->flat<float>().data();
    float* rstds = rstd->flat<float>().data();
    const ConstArray g(gamma.flat<float>().data(), width);
    const ConstArray b(beta.flat<float>().data(), width);
    const float epsilon = epsilon_;
    ParallelFor(ctx, rows, width * 6, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* x_row = xs + r * width;
        const float m = FixedSum(x_row, width) / static_cast<float>(width);
        const float variance = FixedSum(width, [x_row, m](int64_t i) {
                                 const float d = x_row[i] - m;
                                 return d * d;
                               }) / static_cast<float>(width);
        const float inv = 1.0f / std::sqrt(variance + epsilon);
        Array(ys + r * width, width) = (ConstArray(x_row, width) - m) * inv * g + b;
        means[r] = m;
        rstds[r] = inv;
      }
    });
  }

 private:
  float epsilon_;
};

class LayerNormGradOp : public OpKernel {
 public:
  explicit LayerNormGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    const Tensor& gamma = ctx->input(2);
    const Tensor& mean = ctx->input(3);
    const Tensor& rstd = ctx->input(4);
    OP_REQUIRES(ctx, dy.shape() == x.shape() && x.dims() >= 1,
                InvalidArgument("BertLayerNormGrad: dy and x must have one shape"));
    const int64_t width = x.dim_size(x.dims() - 1);
    OP_REQUIRES(ctx, gamma.NumElements() == width,
                InvalidArgument("BertLayerNormGrad: gamma must be [", width, "]"));
    int64_t rows = 1;
    for (int d = 0; d + 1 < x.dims(); ++d) rows *= x.dim_size(d);
    OP_REQUIRES(ctx, mean.NumElements() == rows && rstd.NumElements() == rows,
                InvalidArgument("BertLayerNormGrad: mean and rstd must have ", rows,
                                " elements"));
    Tensor *dx = nullptr, *dgamma = nullptr, *dbeta = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, gamma.shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, gamma.shape(), &dbeta));
    Array dg(dgamma->flat<float>().data(), width);
    Array db(dbeta->flat<float>().data(), width);
    dg.setZero();
    db.setZero();
    if (rows == 0 || width == 0) return;
    // Row blocks, each with its own dgamma/dbeta partial sums, added up at the end.
    const int64_t blocks = std::min<int64_t>(rows, 16);
    // Fixed by the shape alone (never by the pool's size), so the sums' order is too.
    Eigen::ArrayXf partial = Eigen::ArrayXf::Zero(blocks * 2 * width);
    const float* dys = dy.flat<float>().data();
    const float* xs = x.flat<float>().data();
    const float* ms = mean.flat<float>().data();
    const float* rs = rstd.flat<float>().data();
    float* dxs = dx->flat<float>().data();
    const ConstArray g(gamma.flat<float>().data(), width);
    const int64_t rows_per_block = (rows + blocks - 1) / blocks;
    ParallelFor(ctx, blocks, rows_per_block * width * 12, [&](int64_t begin, int64_t end) {
      Eigen::ArrayXf xhat(width), gdy(width);
      for (int64_t k = begin; k < end; ++k) {
        Array pg(partial.data() + k * 2 * width, width);
        Array pb(partial.data() + (k * 2 + 1) * width, width);
        const int64_t last = std::min(rows, (k + 1) * rows_per_block);
        for (int64_t r = k * rows_per_block; r < last; ++r) {
          const ConstArray xr(xs + r * width, width);
          const ConstArray dyr(dys + r * width, width);
          const float inv = rs[r];
          xhat = (xr - ms[r]) * inv;
          gdy = dyr * g;
          const float a = FixedSum(gdy.data(), width) / static_cast<float>(width);
          const float c = FixedSum(width, [&](int64_t i) { return gdy[i] * xhat[i]; }) /
                          static_cast<float>(width);
          Array(dxs + r * width, width) = inv * (gdy - a - xhat * c);
          pg += dyr * xhat;
          pb += dyr;
        }
      }
    });
    for (int64_t k = 0; k < blocks; ++k) {
      dg += ConstArray(partial.data() + k * 2 * width, width);
      db += ConstArray(partial.data() + (k * 2 + 1) * width, width);
    }
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

absl::Status RowsShape(InferenceContext* c, int input, int first_output, int count) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(input), 1, &x));
  ShapeHandle rows;
  TF_RETURN_IF_ERROR(c->Subshape(x, 0, -1, &rows));
  for (int i = 0; i < count; ++i) c->set_output(first_output + i, rows);
  return absl::OkStatus();
}

REGISTER_OP("BertLayerNorm")
    .Input("x: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: float")
    .Output("mean: float")
    .Output("rstd: float")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return RowsShape(c, 0, 1, 2);
    });

REGISTER_OP("BertLayerNormGrad")
    .Input("dy: float")
    .Input("x: float")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: float")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(2));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("BertLayerNorm").Device(DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(Name("BertLayerNormGrad").Device(DEVICE_CPU), LayerNormGradOp);

}  // namespace
}  // namespace bert_trainer
