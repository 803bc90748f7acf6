// BertSparseSoftmaxXent(+Grad): -log softmax(logits)[label] per row of float32 logits, whether
// the label scored highest, and each row's max and log(sum(exp(logit - max))); the gradient
// recomputes the softmax from those instead of storing it.

#include "common.h"

namespace bert_trainer {
namespace {

// ---------------------------------------------------------------------------------------
// Sparse softmax cross-entropy over the last axis of [rows, classes] float32 logits.

template <typename Label>
bool LabelsInRange(OpKernelContext* ctx, const Tensor& labels, int64_t classes) {
  const auto l = labels.flat<Label>();
  for (int64_t r = 0; r < l.size(); ++r) {
    if (l(r) < 0 || l(r) >= classes) {
      ctx->CtxFailure(InvalidArgument("BertSparseSoftmaxXent: label ", l(r), " at row ", r,
                                      " is outside the valid range [0, ", classes, ")"));
      return false;
    }
  }
  return true;
}

template <typename Label>
class SparseSoftmaxXentOp : public OpKernel {
 public:
  explicit SparseSoftmaxXentOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    OP_REQUIRES(ctx, logits.dims() == 2 && labels.dims() == 1 &&
                         labels.dim_size(0) == logits.dim_size(0),
                InvalidArgument("BertSparseSoftmaxXent: logits must be [rows, classes] and "
                                "labels [rows], got ", logits.shape().DebugString(), " and ",
                                labels.shape().DebugString()));
    const int64_t rows = logits.dim_size(0), classes = logits.dim_size(1);
    OP_REQUIRES(ctx, classes > 0, InvalidArgument("BertSparseSoftmaxXent: no classes"));
    if (!LabelsInRange<Label>(ctx, labels, classes)) return;
    Tensor *loss = nullptr, *top = nullptr, *row_max = nullptr, *log_sum = nullptr;
    const TensorShape row_shape({rows});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, row_shape, &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, row_shape, &top));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, row_shape, &row_max));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, row_shape, &log_sum));
    const float* ls = logits.flat<float>().data();
    const Label* ys = labels.flat<Label>().data();
    float* losses = loss->flat<float>().data();
    float* tops = top->flat<float>().data();
    float* maxes = row_max->flat<float>().data();
    float* log_sums = log_sum->flat<float>().data();
    ParallelFor(ctx, rows, classes * 12, [&](int64_t begin, int64_t end) {
      // Padded and aligned (common.h): exp runs on Eigen's vector path for every element.
      Eigen::ArrayXf shifted = Eigen::ArrayXf::Zero(Padded(classes));
      for (int64_t r = begin; r < end; ++r) {
        const float* row = ls + r * classes;
        const float max = FixedMax(row, classes);
        for (int64_t j = 0; j < classes; ++j) shifted[j] = row[j] - max;
        shifted = shifted.exp();
        const float log_sum_shifted = std::log(FixedSum(shifted.data(), classes));
        const float label_logit = row[static_cast<int64_t>(ys[r])];
        // (max - label) + log_sum: exact when the label holds the max.
        losses[r] = (max - label_logit) + log_sum_shifted;
        tops[r] = label_logit >= max ? 1.0f : 0.0f;
        maxes[r] = max;
        log_sums[r] = log_sum_shifted;
      }
    });
  }
};

template <typename Label>
class SparseSoftmaxXentGradOp : public OpKernel {
 public:
  explicit SparseSoftmaxXentGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& row_max = ctx->input(2);
    const Tensor& log_sum = ctx->input(3);
    const Tensor& upstream = ctx->input(4);
    OP_REQUIRES(ctx, logits.dims() == 2, InvalidArgument("BertSparseSoftmaxXentGrad: logits "
                                                         "must be [rows, classes]"));
    const int64_t rows = logits.dim_size(0), classes = logits.dim_size(1);
    OP_REQUIRES(ctx, labels.NumElements() == rows && row_max.NumElements() == rows &&
                         log_sum.NumElements() == rows && upstream.NumElements() == rows,
                InvalidArgument("BertSparseSoftmaxXentGrad: labels, row_max, log_sum and "
                                "upstream must have ", rows, " elements"));
    if (!LabelsInRange<Label>(ctx, labels, classes)) return;
    Tensor* dlogits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, logits.shape(), &dlogits));
    const float* ls = logits.flat<float>().data();
    const Label* ys = labels.flat<Label>().data();
    const float* maxes = row_max.flat<float>().data();
    const float* log_sums = log_sum.flat<float>().data();
    const float* ups = upstream.flat<float>().data();
    float* out = dlogits->flat<float>().data();
    ParallelFor(ctx, rows, classes * 10, [&](int64_t begin, int64_t end) {
      // Computed in a padded, aligned buffer and copied out (common.h): an output row's own
      // address would decide which of its elements take Eigen's scalar exp.
      Eigen::ArrayXf d = Eigen::ArrayXf::Zero(Padded(classes));
      for (int64_t r = begin; r < end; ++r) {
        const float* row = ls + r * classes;
        for (int64_t j = 0; j < classes; ++j) d[j] = (row[j] - maxes[r]) - log_sums[r];
        d = d.exp() * ups[r];
        d[static_cast<int64_t>(ys[r])] -= ups[r];
        std::copy(d.data(), d.data() + classes, out + r * classes);
      }
    });
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

REGISTER_OP("BertSparseSoftmaxXent")
    .Input("logits: float")
    .Input("labels: Tlabels")
    .Output("loss: float")
    .Output("label_is_top: float")
    .Output("row_max: float")
    .Output("log_sum: float")
    .Attr("Tlabels: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle logits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
      ShapeHandle rows = c->Vector(c->Dim(logits, 0));
      for (int i = 0; i < 4; ++i) c->set_output(i, rows);
      return absl::OkStatus();
    });

REGISTER_OP("BertSparseSoftmaxXentGrad")
    .Input("logits: float")
    .Input("labels: Tlabels")
    .Input("row_max: float")
    .Input("log_sum: float")
    .Input("upstream: float")
    .Output("dlogits: float")
    .Attr("Tlabels: {int32, int64}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

#define REGISTER_LABEL_KERNELS(L)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("BertSparseSoftmaxXent").Device(DEVICE_CPU).TypeConstraint<L>("Tlabels"),       \
      SparseSoftmaxXentOp<L>);                                                             \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("BertSparseSoftmaxXentGrad").Device(DEVICE_CPU).TypeConstraint<L>("Tlabels"),   \
      SparseSoftmaxXentGradOp<L>);

REGISTER_LABEL_KERNELS(int32_t)
REGISTER_LABEL_KERNELS(int64_t)

}  // namespace
}  // namespace bert_trainer
