// Elementwise kernels: BertFusedDropout (y = x * keep / (1 - rate), the mask a hash of
// (seed, index): the gradient is the same op on dy) and BertGelu(+Grad), the exact GELU.

#include "dropout.h"

namespace bert_trainer {
namespace {

template <typename T>
class FusedDropoutOp : public DropoutStreamOp {
 public:
  using DropoutStreamOp::DropoutStreamOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    DropoutStream stream;
    if (!Keyed(ctx, 1, &stream)) return;
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    const T* in = x.flat<T>().data();
    T* out = y->flat<T>().data();
    ParallelChunks(ctx, x.NumElements(), 4, [=](int64_t first, int64_t count) {
      DropoutChunk(in, out, first, count, stream);
    });
  }
};

// ---------------------------------------------------------------------------------------
// Exact GELU: x * Phi(x), Phi the standard normal CDF.

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

template <typename T>
class GeluOp : public OpKernel {
 public:
  explicit GeluOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &y));
    const T* in = x.flat<T>().data();
    T* out = y->flat<T>().data();
    ParallelChunks(ctx, x.NumElements(), 20, [&](int64_t first, int64_t count) {
      // Padded and aligned (common.h): erf runs on Eigen's vector path for every element.
      alignas(64) float buffer[kChunk];
      Load(in + first, count, buffer);
      std::fill(buffer + count, buffer + Padded(count), 0.0f);
      AlignedArray v(buffer, Padded(count));
      v = v * (0.5f * (1.0f + (v * kSqrtHalf).erf()));
      Store(buffer, count, out + first);
    });
  }
};

template <typename T>
class GeluGradOp : public OpKernel {
 public:
  explicit GeluGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    OP_REQUIRES(ctx, dy.shape() == x.shape(),
                InvalidArgument("BertGeluGrad: dy and x must have one shape"));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, x.shape(), &dx));
    const T* dys = dy.flat<T>().data();
    const T* xs = x.flat<T>().data();
    T* out = dx->flat<T>().data();
    ParallelChunks(ctx, x.NumElements(), 30, [&](int64_t first, int64_t count) {
      alignas(64) float xb[kChunk];
      alignas(64) float gb[kChunk];
      Load(xs + first, count, xb);
      Load(dys + first, count, gb);
      std::fill(xb + count, xb + Padded(count), 0.0f);
      std::fill(gb + count, gb + Padded(count), 0.0f);
      const AlignedArray v(xb, Padded(count));
      AlignedArray g(gb, Padded(count));
      // d/dx x * Phi(x) = Phi(x) + x * phi(x)
      g *= 0.5f * (1.0f + (v * kSqrtHalf).erf()) + v * ((-0.5f * v.square()).exp() * kInvSqrt2Pi);
      Store(gb, count, out + first);
    });
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

REGISTER_OP("BertFusedDropout")
    .Input("x: T")
    .Input("seed: int64")
    .Output("y: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertGelu")
    .Input("x: T")
    .Output("y: T")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertGeluGrad")
    .Input("dy: T")
    .Input("x: T")
    .Output("dx: T")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

BERT_REGISTER_FLOAT_KERNEL("BertFusedDropout", FusedDropoutOp);
BERT_REGISTER_FLOAT_KERNEL("BertGelu", GeluOp);
BERT_REGISTER_FLOAT_KERNEL("BertGeluGrad", GeluGradOp);

}  // namespace
}  // namespace bert_trainer
