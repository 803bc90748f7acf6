// Token packing: BertPackRows / BertUnpackRows, [slots, width] <-> [tokens, width], the rows
// of a padded batch's real tokens packed (a gather) and unpacked (a scatter with zeros at the
// other slots); each is the other's gradient.

#include "common.h"

namespace bert_trainer {
namespace {

// ---------------------------------------------------------------------------------------
// Token packing: rows [tokens] int32, strictly increasing slots of a [slots, width] tensor.

bool RowsAreSlots(OpKernelContext* ctx, const char* op, const Tensor& rows, int64_t slots) {
  const auto r = rows.flat<int32_t>();
  for (int64_t t = 0; t < r.size(); ++t) {
    if (r(t) < 0 || r(t) >= slots || (t > 0 && r(t) <= r(t - 1))) {
      ctx->CtxFailure(InvalidArgument(op, ": rows must be increasing slots in [0, ", slots,
                                      "), got ", r(t), " at ", t));
      return false;
    }
  }
  return true;
}

template <typename T>
class PackRowsOp : public OpKernel {
 public:
  explicit PackRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    OP_REQUIRES(ctx, x.dims() == 2 && rows.dims() == 1,
                InvalidArgument("BertPackRows: x must be [slots, width] and rows [tokens], "
                                "got ", x.shape().DebugString(), " and ",
                                rows.shape().DebugString()));
    if (!RowsAreSlots(ctx, "BertPackRows", rows, x.dim_size(0))) return;
    const int64_t tokens = rows.dim_size(0), width = x.dim_size(1);
    Tensor* y = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({tokens, width}), &y));
    const T* in = x.flat<T>().data();
    T* out = y->flat<T>().data();
    const int32_t* r = rows.flat<int32_t>().data();
    ParallelFor(ctx, tokens, width * 2, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        std::copy(in + r[t] * width, in + (r[t] + 1) * width, out + t * width);
      }
    });
  }
};

template <typename T>
class UnpackRowsOp : public OpKernel {
 public:
  explicit UnpackRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& y = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& slots_tensor = ctx->input(2);
    OP_REQUIRES(ctx, y.dims() == 2 && rows.dims() == 1 && rows.dim_size(0) == y.dim_size(0) &&
                         slots_tensor.NumElements() == 1,
                InvalidArgument("BertUnpackRows: y must be [tokens, width], rows [tokens] and "
                                "slots a scalar, got ", y.shape().DebugString(), ", ",
                                rows.shape().DebugString(), " and ",
                                slots_tensor.shape().DebugString()));
    const int64_t slots = slots_tensor.flat<int32_t>()(0);
    OP_REQUIRES(ctx, slots >= 0,
                InvalidArgument("BertUnpackRows: slots must be >= 0, got ", slots));
    if (!RowsAreSlots(ctx, "BertUnpackRows", rows, slots)) return;
    const int64_t tokens = rows.dim_size(0), width = y.dim_size(1);
    Tensor* x = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({slots, width}), &x));
    const T* in = y.flat<T>().data();
    T* out = x->flat<T>().data();
    const int32_t* r = rows.flat<int32_t>().data();
    // Token t writes its row and zeroes the slots between the previous token's and its own;
    // the last one also zeroes the slots after it.
    ParallelFor(ctx, tokens, width * 2, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t gap = t == 0 ? 0 : r[t - 1] + 1;
        std::fill(out + gap * width, out + r[t] * width, T(0));
        std::copy(in + t * width, in + (t + 1) * width, out + r[t] * width);
        if (t == tokens - 1) std::fill(out + (r[t] + 1) * width, out + slots * width, T(0));
      }
    });
    if (tokens == 0) std::fill(out, out + slots * width, T(0));
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

REGISTER_OP("BertPackRows")
    .Input("x: T")
    .Input("rows: int32")
    .Output("y: T")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), c->Dim(x, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("BertUnpackRows")
    .Input("y: T")
    .Input("rows: int32")
    .Input("slots: int32")
    .Output("x: T")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle y;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &y));
      DimensionHandle slots;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &slots));
      c->set_output(0, c->Matrix(slots, c->Dim(y, 1)));
      return absl::OkStatus();
    });

BERT_REGISTER_FLOAT_KERNEL("BertPackRows", PackRowsOp);
REGISTER_KERNEL_BUILDER(
    Name("BertUnpackRows").Device(DEVICE_CPU).TypeConstraint<float>("T").HostMemory("slots"),
    UnpackRowsOp<float>);
REGISTER_KERNEL_BUILDER(Name("BertUnpackRows")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<::tensorflow::bfloat16>("T")
                            .HostMemory("slots"),
                        UnpackRowsOp<::tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(
    Name("BertUnpackRows").Device(DEVICE_CPU).TypeConstraint<Eigen::half>("T").HostMemory("slots"),
    UnpackRowsOp<Eigen::half>);

}  // namespace
}  // namespace bert_trainer
