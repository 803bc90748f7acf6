// Helpers shared by bert-train's fused CPU kernels (see bert_trainer/kernels/__init__.py).
//
// TensorFlow's pip wheel compiles its elementwise kernels for a baseline x86 CPU, and without
// XLA every elementwise op of the step is its own pass over memory. Each op here does one
// pass with the vector units the build machine has (-march=native), split over the op's
// intra-op thread pool:
//
//   BertFusedDropout      y = x * keep / (1 - rate); the mask is a counter-based hash of
//                         (seed, element index), so the gradient is the same op on dy with
//                         the same seed and no mask is stored.
//   BertLayerNorm(+Grad)  LayerNorm over the last axis, with the closed-form gradient.
//   BertGelu(+Grad)       exact (erf) GELU.
//   BertSplitHeads / BertMergeHeads (+Packed)
//                         [batch, seq, n * heads * dim] <-> n x [batch, heads, seq, dim]:
//                         the attention projections' reshape, transpose and split (or
//                         concat) as one copy; each is the other's gradient. The Packed pair
//                         reads (writes) only the real tokens' rows [tokens, n * heads * dim]
//                         and zeroes the padding's slots.
//   BertApplyAdamW        one AdamW update of a variable in one pass: the gradient's clip
//                         scale, Keras' decoupled weight decay and TensorFlow's Adam
//                         update (ResourceApplyAdam's formula), instead of three passes.
//   BertAttentionSoftmax(+Grad)
//                         dropout(softmax(scores + mask bias)) over the last axis, the
//                         attention probabilities: one pass per row instead of an add, a
//                         softmax and a dropout forward and five ops backward; the dropout
//                         decisions are BertFusedDropout's for the same seed.
//   BertPackRows / BertUnpackRows
//                         [slots, width] <-> [tokens, width]: the rows of the real tokens of
//                         a padded batch, packed (a gather) and unpacked (a scatter with
//                         zeros at the other slots); each is the other's gradient.
//   BertSparseSoftmaxXent(+Grad)
//                         -log softmax(logits)[label] per row, whether the label scored
//                         highest, and each row's max and log(sum(exp(logit - max))); the
//                         gradient recomputes the softmax from those instead of storing it.
//
// Reductions accumulate in float32; half-precision inputs are computed in float32.
//
// The same bits whatever the thread count and wherever a buffer lies: work is split into
// pieces that follow the shapes alone (rows, fixed row blocks, chunks of kChunk), never the
// pool's size; every sum runs in an order that follows the element index alone (FixedSum,
// never Eigen's reductions, whose vector packets start where the buffer's address is aligned,
// with a scalar head and tail whose length follows the heap address); exp and erf run on
// aligned buffers padded to kLanes (Padded), so every element takes Eigen's vector path, not
// the scalar one for a head or tail; and the build turns off floating-point contraction
// (-ffp-contract=off), so a * b + c rounds the same in scalar and vector code.
//
// One file per op family, each with its ops' registrations: elementwise.cc (dropout, GELU),
// attention.cc (attention probabilities, the heads' layout), layer_norm.cc, packing.cc,
// cross_entropy.cc, adamw.cc; dropout.h holds the dropout stream two families share.

#ifndef BERT_TRAINER_KERNELS_COMMON_H_
#define BERT_TRAINER_KERNELS_COMMON_H_

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
// GCC 12's AVX-512 intrinsics start from a deliberately undefined `__Y`
// (`_mm512_undefined_ps`), which -Wmaybe-uninitialized reports wherever Eigen's vectorized
// exp/erf inline into a kernel (GCC bug 105593, fixed in GCC 13). Included first under this
// pragma, the header's own lines stay quiet; the kernels' lines keep the warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "Eigen/Core"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "unsupported/Eigen/SpecialFunctions"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bert_trainer {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

constexpr int64_t kChunk = 1024;  // elements per inner block of the elementwise kernels

// An InvalidArgument status whose message is the arguments, concatenated.
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// fn(begin, end) over [0, total) on the op's intra-op thread pool.
inline void ParallelFor(OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                        const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(total, tsl::thread::ThreadPool::SchedulingParams::Adaptive(cost_per_unit),
                    fn);
}

// Elementwise work in blocks of kChunk elements: fn(first, count).
inline void ParallelChunks(OpKernelContext* ctx, int64_t n, int64_t cost_per_element,
                           const std::function<void(int64_t, int64_t)>& fn) {
  ParallelFor(ctx, (n + kChunk - 1) / kChunk, kChunk * cost_per_element,
              [&](int64_t begin, int64_t end) {
                for (int64_t c = begin; c < end; ++c) {
                  const int64_t first = c * kChunk;
                  fn(first, std::min(kChunk, n - first));
                }
              });
}

// The fixed-order reductions: element i goes to partial sum i % kLanes, and the partial sums
// are added pairwise at the end. The lane loop vectorizes as written (each lane is a chain of
// its own, so nothing needs reassociating), for any vector width that divides kLanes.
constexpr int64_t kLanes = 16;

// n rounded up to a multiple of kLanes: the length of a padded buffer (see above).
inline int64_t Padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// A padded buffer declared `alignas(64)` (or an Eigen::ArrayXf's data), which Eigen is told is
// aligned: its vector packets start at element 0, and a padded length leaves no scalar tail.
using AlignedArray = Eigen::Map<Eigen::ArrayXf, Eigen::AlignedMax>;

// term(0) + ... + term(n - 1) in the fixed order above.
template <typename Term>
inline float FixedSum(int64_t n, Term term) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lane[j] += term(i + j);
  }
  for (int64_t j = 0; i + j < n; ++j) lane[j] += term(i + j);
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

inline float FixedSum(const float* x, int64_t n) {
  return FixedSum(n, [x](int64_t i) { return x[i]; });
}

// The largest of x[0, n) (-inf for none), in the same fixed order: a maximum is exact, but
// which of -0 and +0 it keeps follows the order.
inline float FixedMax(const float* x, int64_t n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], x[i + j]);
  }
  for (int64_t j = 0; i + j < n; ++j) lane[j] = std::max(lane[j], x[i + j]);
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lane[j] = std::max(lane[j], lane[j + width]);
  }
  return lane[0];
}

template <typename T>
inline void Load(const T* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline void Store(const float* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

// Registers `kernel<T>` as the CPU kernel of `op` for each float type the ops take.
#define BERT_REGISTER_FLOAT_KERNEL(op, kernel)                                             \
  REGISTER_KERNEL_BUILDER(Name(op).Device(DEVICE_CPU).TypeConstraint<float>("T"),          \
                          kernel<float>);                                                  \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name(op).Device(DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"),             \
      kernel<::tensorflow::bfloat16>);                                                     \
  REGISTER_KERNEL_BUILDER(Name(op).Device(DEVICE_CPU).TypeConstraint<Eigen::half>("T"),    \
                          kernel<Eigen::half>)

}  // namespace bert_trainer

#endif  // BERT_TRAINER_KERNELS_COMMON_H_
