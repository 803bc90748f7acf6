// BertApplyAdamW: one AdamW update of a float32 variable in one pass: the gradient's clip
// scale, Keras' decoupled weight decay and TensorFlow's Adam update (ResourceApplyAdam's
// formula), instead of three passes.

#include <atomic>

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace bert_trainer {
namespace {

// ---------------------------------------------------------------------------------------
// AdamW: var, m, v updated in place, one pass over the four arrays.
//
//   g = grad * grad_scale                                   (the global-norm clip)
//   var -= var * weight_decay * lr                          (Keras' AdamW, before the update)
//   m += (g - m) * (1 - beta1);  v += (g^2 - v) * (1 - beta2)
//   var -= m * alpha / (sqrt(v) + epsilon),  alpha = lr sqrt(1 - beta2^t) / (1 - beta1^t)
// (the last two lines are ResourceApplyAdam's).

float Scalar(OpKernelContext* ctx, int input) { return ctx->input(input).scalar<float>()(); }

class ApplyAdamWOp : public OpKernel {
 public:
  explicit ApplyAdamWOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    using ::tensorflow::Var;
    ::tensorflow::core::RefCountPtr<Var> vars[3];
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES_OK(ctx, ::tensorflow::LookupResource(
                              ctx, ::tensorflow::HandleFromInput(ctx, i), &vars[i]));
    }
    for (int i = 4; i < ctx->num_inputs(); ++i) {  // lr ... grad_scale
      OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  InvalidArgument("BertApplyAdamW: input ", i, " must be a scalar, got ",
                                  ctx->input(i).shape().DebugString()));
    }
    // The three mutexes in address order (as TensorFlow's training ops), so that concurrent
    // updates sharing a variable cannot deadlock.
    std::vector<decltype(vars[0]->mu())> mutexes;  // TensorFlow's mutex, by its type
    for (auto& v : vars) {
      if (std::find(mutexes.begin(), mutexes.end(), v->mu()) == mutexes.end()) {
        mutexes.push_back(v->mu());
      }
    }
    std::sort(mutexes.begin(), mutexes.end());
    for (auto* mu : mutexes) mu->lock();
    Compute(ctx, vars);
    for (auto it = mutexes.rbegin(); it != mutexes.rend(); ++it) (*it)->unlock();
  }

 private:
  void Compute(OpKernelContext* ctx, ::tensorflow::core::RefCountPtr<::tensorflow::Var>* vars) {
    const Tensor& grad = ctx->input(3);
    // Each array is read from `src` and written to `dst`: in place, or, where the variable's
    // buffer is shared with a read (or the variable is in copy-on-read mode), into a new
    // buffer that then becomes the variable's (TensorFlow's training ops copy first and
    // update after; here the copy is the update pass itself).
    Tensor old[3];
    const float* src[3];
    float* dst[3];
    for (int i = 0; i < 3; ++i) {
      Tensor* t = vars[i]->tensor();
      OP_REQUIRES(ctx, t->IsInitialized() && t->dtype() == ::tensorflow::DT_FLOAT &&
                           t->shape() == grad.shape(),
                  InvalidArgument("BertApplyAdamW: var, m and v must be initialized float32 "
                                  "of the gradient's shape ", grad.shape().DebugString()));
      const bool shared = vars[i]->copy_on_read_mode.load() || !t->RefCountIsOne();
      old[i] = *t;  // keeps the source buffer alive
      src[i] = old[i].flat<float>().data();
      if (shared) {
        Tensor copy;
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(t->dtype(), t->shape(), &copy));
        *t = copy;
      }
      dst[i] = t->flat<float>().data();
    }
    const float lr = Scalar(ctx, 4), beta1_power = Scalar(ctx, 5), beta2_power = Scalar(ctx, 6);
    const float beta1 = Scalar(ctx, 7), beta2 = Scalar(ctx, 8), epsilon = Scalar(ctx, 9);
    const float weight_decay = Scalar(ctx, 10), grad_scale = Scalar(ctx, 11);
    const float alpha = lr * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    const float* gs = grad.flat<float>().data();
    const bool decay = weight_decay != 0.0f;
    ParallelChunks(ctx, grad.NumElements(), 12, [=](int64_t first, int64_t count) {
      // Eigen arrays over the chunk (in L1 after the first read): vectorized sqrt and divide.
      float gb[kChunk];
      Array g(gb, count);
      g = ConstArray(gs + first, count) * grad_scale;
      const ConstArray p0(src[0] + first, count), m0(src[1] + first, count),
          v0(src[2] + first, count);
      Array p(dst[0] + first, count), m(dst[1] + first, count), v(dst[2] + first, count);
      if (decay) {
        p = p0 - p0 * weight_decay * lr;
      } else if (dst[0] != src[0]) {
        p = p0;
      }
      m = m0 + (g - m0) * one_minus_beta1;
      v = v0 + (g.square() - v0) * one_minus_beta2;
      // IEEE sqrt, in a loop the compiler vectorizes (-fno-math-errno), not Eigen's: on
      // AVX-512 that is an rsqrt estimate plus a Newton step, a last bit off in about one
      // element in 2,000, so an element's bits would follow whether the vector loop or the
      // scalar tail took it, and the CPU's vector width. g is not needed any more.
      const float* vs = dst[2] + first;
      for (int64_t i = 0; i < count; ++i) gb[i] = std::sqrt(vs[i]) + epsilon;
      p -= (m * alpha) / g;
    });
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

REGISTER_OP("BertApplyAdamW")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grad: float")
    .Input("lr: float")
    .Input("beta1_power: float")
    .Input("beta2_power: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("weight_decay: float")
    .Input("grad_scale: float")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("BertApplyAdamW").Device(DEVICE_CPU), ApplyAdamWOp);

}  // namespace
}  // namespace bert_trainer
