// Fused CPU kernels for bert-train's training step (see bert_trainer/kernels/__init__.py).
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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "Eigen/Core"
#include "unsupported/Eigen/SpecialFunctions"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bert_trainer {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

constexpr int64_t kChunk = 1024;  // elements per inner block of the elementwise kernels

// fn(begin, end) over [0, total) on the op's intra-op thread pool.
void ParallelFor(OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  using Pool = tsl::thread::ThreadPool;
  pool->ParallelFor(
      total,
      Pool::SchedulingParams(Pool::SchedulingStrategy::kAdaptive, cost_per_unit, std::nullopt),
      fn);
}

// Elementwise work in blocks of kChunk elements: fn(first, count).
void ParallelChunks(OpKernelContext* ctx, int64_t n, int64_t cost_per_element,
                    const std::function<void(int64_t, int64_t)>& fn) {
  ParallelFor(ctx, (n + kChunk - 1) / kChunk, kChunk * cost_per_element,
              [&](int64_t begin, int64_t end) {
                for (int64_t c = begin; c < end; ++c) {
                  const int64_t first = c * kChunk;
                  fn(first, std::min(kChunk, n - first));
                }
              });
}

template <typename T>
inline void Load(const T* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline void Store(const float* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

// ---------------------------------------------------------------------------------------
// Dropout.

inline uint64_t Mix64(uint64_t z) {  // splitmix64's finalizer
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint32_t Fmix32(uint32_t h) {  // murmur3's finalizer
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

// 32 random bits for element `index` of the stream keyed (k0, k1): two keyed rounds of the
// finalizer. `high_key` folds the index's high 32 bits into k1 (HighKey), once per chunk: a
// chunk of kChunk elements never crosses a multiple of 2^32, and the per-element work stays in
// 32-bit lanes, which the compiler vectorizes.
inline uint32_t HighKey(uint64_t first, uint32_t k1) {
  return k1 ^ (static_cast<uint32_t>(first >> 32) * 0x9e3779b9u);
}

inline uint32_t RandomBits(uint32_t low_index, uint32_t k0, uint32_t high_key) {
  return Fmix32(Fmix32(low_index ^ k0) ^ high_key);
}

// keep[i] = scale if element first + i of the stream keyed (k0, k1) is kept, else 0, for
// [first, first + count), count < 2^32 (a chunk or a row); the range may cross a multiple
// of 2^32. The inner loop counts in 32 bits, which the compiler vectorizes.
inline void KeepScales(int64_t first, int64_t count, uint32_t k0, uint32_t k1,
                       uint32_t threshold, float scale, float* keep) {
  while (count > 0) {
    const int64_t to_boundary =
        (int64_t{1} << 32) - static_cast<int64_t>(static_cast<uint32_t>(first));
    const int64_t n = std::min(count, to_boundary);
    const uint32_t low = static_cast<uint32_t>(first), high_key = HighKey(first, k1);
    const uint32_t n32 = static_cast<uint32_t>(n);
    for (uint32_t i = 0; i < n32; ++i) {
      keep[i] = RandomBits(low + i, k0, high_key) >= threshold ? scale : 0.0f;
    }
    first += n;
    count -= n;
    keep += n;
  }
}

// A dropout stream: the rate as a 32-bit threshold (drop when the bits are below it:
// P(drop) = threshold / 2^32), the kept elements' scale, and the seed's two keys.
struct DropoutStream {
  uint32_t threshold = 0;
  float scale = 1.0f;
  uint32_t k0 = 0, k1 = 0;

  // From the op's `rate` attribute; `op` names the op in the error.
  static tensorflow::Status FromRate(OpKernelConstruction* ctx, const char* op,
                                     DropoutStream* stream) {
    float rate;
    TF_RETURN_IF_ERROR(ctx->GetAttr("rate", &rate));
    if (!(rate >= 0.0f && rate < 1.0f)) {
      return InvalidArgument(op, ": rate must be in [0, 1), got ", rate);
    }
    stream->threshold = static_cast<uint32_t>(
        std::min(std::llround(static_cast<double>(rate) * 4294967296.0), 4294967295LL));
    stream->scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(rate)));
    return tensorflow::OkStatus();
  }

  // This stream keyed by a 2-element int64 `seed`.
  tensorflow::Status Seeded(const char* op, const Tensor& seed, DropoutStream* keyed) const {
    if (seed.NumElements() != 2) {
      return InvalidArgument(op, ": seed must have 2 elements, got shape ",
                             seed.shape().DebugString());
    }
    const auto s = seed.flat<int64_t>();
    const uint64_t key =
        Mix64(Mix64(static_cast<uint64_t>(s(0))) ^ static_cast<uint64_t>(s(1)));
    *keyed = *this;
    keyed->k0 = static_cast<uint32_t>(key);
    keyed->k1 = static_cast<uint32_t>(key >> 32);
    return tensorflow::OkStatus();
  }

  bool drops() const { return threshold != 0; }

  // keep[i] = scale or 0 for elements [first, first + count) (see KeepScales).
  void Keep(int64_t first, int64_t count, float* keep) const {
    KeepScales(first, count, k0, k1, threshold, scale, keep);
  }
};

// out[i] = in[i] * (kept ? scale : 0) for elements [first, first + count) of the stream.
// Values, not references, so the compiler knows nothing aliases them and vectorizes.
template <typename T>
void DropoutChunk(const T* in, T* out, int64_t first, int64_t count, DropoutStream stream) {
  float keep[kChunk];
  stream.Keep(first, count, keep);
  for (int64_t i = 0; i < count; ++i) {
    out[first + i] = static_cast<T>(static_cast<float>(in[first + i]) * keep[i]);
  }
}

// An op with a `rate` attribute and a 2-element int64 seed input: its dropout stream.
class DropoutStreamOp : public OpKernel {
 public:
  explicit DropoutStreamOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, DropoutStream::FromRate(ctx, type_string().c_str(), &stream_));
  }

 protected:
  // The stream keyed by the seed at input `seed_input`; false after failing the op.
  bool Keyed(OpKernelContext* ctx, int seed_input, DropoutStream* keyed) const {
    const auto status = stream_.Seeded(type_string().c_str(), ctx->input(seed_input), keyed);
    if (!status.ok()) ctx->CtxFailure(status);
    return status.ok();
  }

 private:
  DropoutStream stream_;
};

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
// Attention probabilities: y = dropout(probs), probs = softmax(scores + bias) over the last
// axis of scores [batch, heads, queries, keys]; bias [batch or 1, queries or 1, keys] is
// broadcast over the heads (a padding mask's 0 / -1e9). The dropout decisions are
// BertFusedDropout's on probs for the same seed and rate: element i of the flattened
// [batch, heads, queries, keys] tensor.

template <typename T>
class AttentionSoftmaxOp : public DropoutStreamOp {
 public:
  using DropoutStreamOp::DropoutStreamOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& scores = ctx->input(0);
    const Tensor& bias = ctx->input(1);
    OP_REQUIRES(ctx, scores.dims() == 4 && bias.dims() == 3,
                InvalidArgument("BertAttentionSoftmax: scores must be [batch, heads, queries, "
                                "keys] and bias [batch, queries, keys], got ",
                                scores.shape().DebugString(), " and ",
                                bias.shape().DebugString()));
    const int64_t batch = scores.dim_size(0), heads = scores.dim_size(1);
    const int64_t queries = scores.dim_size(2), keys = scores.dim_size(3);
    const int64_t bias_batch = bias.dim_size(0), bias_queries = bias.dim_size(1);
    OP_REQUIRES(ctx, (bias_batch == 1 || bias_batch == batch) &&
                         (bias_queries == 1 || bias_queries == queries) &&
                         bias.dim_size(2) == keys,
                InvalidArgument("BertAttentionSoftmax: bias ", bias.shape().DebugString(),
                                " does not broadcast to scores ",
                                scores.shape().DebugString()));
    DropoutStream stream;
    if (!Keyed(ctx, 2, &stream)) return;
    Tensor* probs = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, scores.shape(), &probs));
    Tensor* y = probs;
    if (stream.drops()) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, scores.shape(), &y));
    } else {
      ctx->set_output(0, *probs);
    }
    if (keys == 0) return;
    const T* ss = scores.flat<T>().data();
    const T* bs = bias.flat<T>().data();
    T* ps = probs->flat<T>().data();
    T* ys = y->flat<T>().data();
    const bool drops = stream.drops();
    ParallelFor(ctx, batch * heads * queries, keys * 30, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer(static_cast<size_t>(keys) * (drops ? 2 : 1));
      float* row = buffer.data();
      float* keep = drops ? row + keys : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / (heads * queries), q = r % queries;
        const T* s = ss + r * keys;
        const T* m = bs + ((bias_batch == 1 ? 0 : b) * bias_queries +
                           (bias_queries == 1 ? 0 : q)) * keys;
        for (int64_t j = 0; j < keys; ++j) {
          row[j] = static_cast<float>(s[j]) + static_cast<float>(m[j]);
        }
        Array a(row, keys);
        a = (a - a.maxCoeff()).exp();
        const float inverse_sum = 1.0f / a.sum();
        T* p = ps + r * keys;
        for (int64_t j = 0; j < keys; ++j) {
          row[j] *= inverse_sum;
          p[j] = static_cast<T>(row[j]);
        }
        if (drops) {
          stream.Keep(r * keys, keys, keep);
          T* out = ys + r * keys;
          for (int64_t j = 0; j < keys; ++j) out[j] = static_cast<T>(row[j] * keep[j]);
        }
      }
    });
  }
};

// dscores = probs * (g - sum(g * probs)) per row, g = dy * keep (the forward's dropout).
template <typename T>
class AttentionSoftmaxGradOp : public DropoutStreamOp {
 public:
  using DropoutStreamOp::DropoutStreamOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& probs = ctx->input(1);
    OP_REQUIRES(ctx, dy.shape() == probs.shape() && probs.dims() >= 1,
                InvalidArgument("BertAttentionSoftmaxGrad: dy and probs must have one shape"));
    DropoutStream stream;
    if (!Keyed(ctx, 2, &stream)) return;
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, dy.shape(), &dx));
    const int64_t keys = probs.dim_size(probs.dims() - 1);
    if (keys == 0) return;
    const T* dys = dy.flat<T>().data();
    const T* ps = probs.flat<T>().data();
    T* out = dx->flat<T>().data();
    const bool drops = stream.drops();
    ParallelFor(ctx, probs.NumElements() / keys, keys * 12, [&](int64_t begin, int64_t end) {
      Eigen::ArrayXf g(keys), p(keys), keep(drops ? keys : 0);
      for (int64_t r = begin; r < end; ++r) {
        Load(dys + r * keys, keys, g.data());
        Load(ps + r * keys, keys, p.data());
        if (drops) {
          stream.Keep(r * keys, keys, keep.data());
          g *= keep;
        }
        g = p * (g - (g * p).sum());
        Store(g.data(), keys, out + r * keys);
      }
    });
  }
};

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
        const ConstArray xr(xs + r * width, width);
        const float m = xr.mean();
        const float inv = 1.0f / std::sqrt((xr - m).square().mean() + epsilon);
        Array(ys + r * width, width) = (xr - m) * inv * g + b;
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
    std::vector<float> partial(static_cast<size_t>(blocks * 2 * width), 0.0f);
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
          const float a = gdy.mean();
          const float c = (gdy * xhat).mean();
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
      float buffer[kChunk];
      Load(in + first, count, buffer);
      Array v(buffer, count);
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
      float xb[kChunk], gb[kChunk];
      Load(xs + first, count, xb);
      Load(dys + first, count, gb);
      const Array v(xb, count);
      Array g(gb, count);
      // d/dx x * Phi(x) = Phi(x) + x * phi(x)
      g *= 0.5f * (1.0f + (v * kSqrtHalf).erf()) + v * ((-0.5f * v.square()).exp() * kInvSqrt2Pi);
      Store(gb, count, out + first);
    });
  }
};

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
      for (int64_t r = begin; r < end; ++r) {
        const ConstArray row(ls + r * classes, classes);
        const float max = row.maxCoeff();
        const float log_sum_shifted = std::log((row - max).exp().sum());
        const float label_logit = row(static_cast<int64_t>(ys[r]));
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
      for (int64_t r = begin; r < end; ++r) {
        Array d(out + r * classes, classes);
        d = ((ConstArray(ls + r * classes, classes) - maxes[r]) - log_sums[r]).exp() * ups[r];
        d(static_cast<int64_t>(ys[r])) -= ups[r];
      }
    });
  }
};

// ---------------------------------------------------------------------------------------
// Attention heads: [batch, seq, n * heads * dim] <-> n x [batch, heads, seq, dim].

// Copies each `dim`-long run between the packed layout (`packed`) and the per-head outputs
// (`split`); to_split chooses the direction. Parallel over (batch, seq) rows. With `index`
// ([batch * seq]), `packed` holds only some slots: slot r's row is index[r], and a slot
// whose index is negative is zero in `split` (and skipped when merging).
template <typename T>
void CopyHeads(OpKernelContext* ctx, int64_t batch, int64_t seq, int64_t n, int64_t heads,
               int64_t dim, T* packed, const std::vector<T*>& split, bool to_split,
               const int32_t* index = nullptr) {
  const int64_t width = n * heads * dim;
  ParallelFor(ctx, batch * seq, width * 2, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / seq, s = row % seq;
      const int64_t packed_index = index == nullptr ? row : index[row];
      T* packed_row = packed + packed_index * width;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          T* head = split[i] + ((b * heads + h) * seq + s) * dim;
          T* run = packed_row + (i * heads + h) * dim;
          if (packed_index < 0) {
            if (to_split) std::fill(head, head + dim, T(0));
          } else if (to_split) {
            std::copy(run, run + dim, head);
          } else {
            std::copy(head, head + dim, run);
          }
        }
      }
    }
  });
}

// The packed rows of an index [batch, seq] (see CopyHeads): its nonnegative entries must be
// 0, 1, 2, ... in order. Returns their count, or -1 after failing the op.
int64_t PackedRows(OpKernelContext* ctx, const char* op, const Tensor& index) {
  const auto ix = index.flat<int32_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < ix.size(); ++r) {
    if (ix(r) < 0) continue;
    if (ix(r) != count) {
      ctx->CtxFailure(InvalidArgument(op, ": index must number the kept slots 0, 1, 2, ... "
                                          "in order (-1 elsewhere), got ", ix(r), " at ", r));
      return -1;
    }
    ++count;
  }
  return count;
}

template <typename T>
class SplitHeadsOp : public OpKernel {
 public:
  explicit SplitHeadsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_heads", &heads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const bool packed = ctx->num_inputs() == 2;  // BertSplitHeadsPacked: x [tokens, width]
    const int64_t width = x.dims() > 0 ? x.dim_size(x.dims() - 1) : 0;
    OP_REQUIRES(ctx, x.dims() == (packed ? 2 : 3) && width % (n_ * heads_) == 0,
                InvalidArgument(name(), ": x must be [", packed ? "tokens" : "batch, seq",
                                ", ", n_, " * ", heads_, " * dim], got ",
                                x.shape().DebugString()));
    int64_t batch = x.dim_size(0), seq = packed ? 0 : x.dim_size(1);
    const int32_t* index = nullptr;
    if (packed) {
      const Tensor& ix = ctx->input(1);
      OP_REQUIRES(ctx, ix.dims() == 2,
                  InvalidArgument(name(), ": index must be [batch, seq], got ",
                                  ix.shape().DebugString()));
      const int64_t rows = PackedRows(ctx, "BertSplitHeadsPacked", ix);
      if (rows < 0) return;
      OP_REQUIRES(ctx, rows == x.dim_size(0),
                  InvalidArgument(name(), ": index keeps ", rows, " slots but x has ",
                                  x.dim_size(0), " rows"));
      batch = ix.dim_size(0);
      seq = ix.dim_size(1);
      index = ix.flat<int32_t>().data();
    }
    const int64_t dim = width / (n_ * heads_);
    std::vector<T*> outputs(n_);
    for (int i = 0; i < n_; ++i) {
      Tensor* y = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({batch, heads_, seq, dim}), &y));
      outputs[i] = y->flat<T>().data();
    }
    CopyHeads<T>(ctx, batch, seq, n_, heads_, dim, const_cast<T*>(x.flat<T>().data()), outputs,
                 /*to_split=*/true, index);
  }

 private:
  int heads_, n_;
};

template <typename T>
class MergeHeadsOp : public OpKernel {
 public:
  explicit MergeHeadsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_heads", &heads_));
  }

  void Compute(OpKernelContext* ctx) override {
    // BertMergeHeadsPacked's last input is the index: only its kept slots are merged.
    const bool packed = type_string() == "BertMergeHeadsPacked";
    const int n = ctx->num_inputs() - (packed ? 1 : 0);
    const Tensor& first = ctx->input(0);
    OP_REQUIRES(ctx, first.dims() == 4 && first.dim_size(1) == heads_,
                InvalidArgument(name(), ": inputs must be [batch, ", heads_,
                                ", seq, dim], got ", first.shape().DebugString()));
    std::vector<T*> inputs(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == first.shape(),
                  InvalidArgument(name(), ": inputs must have one shape"));
      inputs[i] = const_cast<T*>(ctx->input(i).flat<T>().data());
    }
    const int64_t batch = first.dim_size(0), heads = first.dim_size(1);
    const int64_t seq = first.dim_size(2), dim = first.dim_size(3);
    Tensor* x = nullptr;
    const int32_t* index = nullptr;
    if (packed) {
      const Tensor& ix = ctx->input(n);
      OP_REQUIRES(ctx, ix.dims() == 2 && ix.dim_size(0) == batch && ix.dim_size(1) == seq,
                  InvalidArgument(name(), ": index must be [", batch, ", ", seq, "], got ",
                                  ix.shape().DebugString()));
      const int64_t rows = PackedRows(ctx, "BertMergeHeadsPacked", ix);
      if (rows < 0) return;
      index = ix.flat<int32_t>().data();
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, n * heads * dim}), &x));
    } else {
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(0, TensorShape({batch, seq, n * heads * dim}), &x));
    }
    CopyHeads<T>(ctx, batch, seq, n, heads, dim, x->flat<T>().data(), inputs,
                 /*to_split=*/false, index);
  }

 private:
  int heads_;
};

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
    std::vector<::tensorflow::mutex*> mutexes;
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
      p -= (m * alpha) / (v.sqrt() + epsilon);
    });
  }
};

// ---------------------------------------------------------------------------------------
// Registration.

tensorflow::Status RowsShape(InferenceContext* c, int input, int first_output, int count) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(input), 1, &x));
  ShapeHandle rows;
  TF_RETURN_IF_ERROR(c->Subshape(x, 0, -1, &rows));
  for (int i = 0; i < count; ++i) c->set_output(first_output + i, rows);
  return tensorflow::OkStatus();
}

REGISTER_OP("BertFusedDropout")
    .Input("x: T")
    .Input("seed: int64")
    .Output("y: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

REGISTER_OP("BertAttentionSoftmax")
    .Input("scores: T")
    .Input("bias: T")
    .Input("seed: int64")
    .Output("y: T")
    .Output("probs: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scores, bias;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &scores));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &bias));
      c->set_output(0, scores);
      c->set_output(1, scores);
      return tensorflow::OkStatus();
    });

REGISTER_OP("BertAttentionSoftmaxGrad")
    .Input("dy: T")
    .Input("probs: T")
    .Input("seed: int64")
    .Output("dscores: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

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
      return tensorflow::OkStatus();
    });

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

// n x [batch, heads, seq, dim] from x [batch, seq, n * heads * dim] or, packed, from x
// [tokens, n * heads * dim] and index [batch, seq].
tensorflow::Status SplitHeadsShape(InferenceContext* c, bool packed) {
  ShapeHandle x, grid;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), packed ? 2 : 3, &x));
  grid = x;
  if (packed) TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &grid));
  int n, heads;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("num_heads", &heads));
  DimensionHandle dim;
  TF_RETURN_IF_ERROR(c->Divide(c->Dim(x, packed ? 1 : 2), static_cast<int64_t>(n) * heads,
                               /*evenly_divisible=*/true, &dim));
  ShapeHandle y = c->MakeShape({c->Dim(grid, 0), c->MakeDim(heads), c->Dim(grid, 1), dim});
  for (int i = 0; i < n; ++i) c->set_output(i, y);
  return tensorflow::OkStatus();
}

// [batch, seq, n * heads * dim] from n x [batch, heads, seq, dim] or, packed (the last input
// is the index), [tokens, n * heads * dim].
tensorflow::Status MergeHeadsShape(InferenceContext* c, bool packed) {
  ShapeHandle y;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &y));
  DimensionHandle width;
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(y, 1), c->Dim(y, 3), &width));
  TF_RETURN_IF_ERROR(c->Multiply(width, c->num_inputs() - (packed ? 1 : 0), &width));
  c->set_output(0, packed ? c->Matrix(c->UnknownDim(), width)
                          : c->MakeShape({c->Dim(y, 0), c->Dim(y, 2), width}));
  return tensorflow::OkStatus();
}

REGISTER_OP("BertSplitHeads")
    .Input("x: T")
    .Output("y: N * T")
    .Attr("N: int >= 1")
    .Attr("num_heads: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) { return SplitHeadsShape(c, /*packed=*/false); });

REGISTER_OP("BertMergeHeads")
    .Input("y: N * T")
    .Output("x: T")
    .Attr("N: int >= 1")
    .Attr("num_heads: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) { return MergeHeadsShape(c, /*packed=*/false); });

REGISTER_OP("BertSplitHeadsPacked")
    .Input("x: T")
    .Input("index: int32")
    .Output("y: N * T")
    .Attr("N: int >= 1")
    .Attr("num_heads: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) { return SplitHeadsShape(c, /*packed=*/true); });

REGISTER_OP("BertMergeHeadsPacked")
    .Input("y: N * T")
    .Input("index: int32")
    .Output("x: T")
    .Attr("N: int >= 1")
    .Attr("num_heads: int >= 1")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](InferenceContext* c) { return MergeHeadsShape(c, /*packed=*/true); });

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
      return tensorflow::OkStatus();
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
      return tensorflow::OkStatus();
    });

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
      return tensorflow::OkStatus();
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

#define REGISTER_FLOAT_KERNELS(T)                                                         \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertFusedDropout").Device(DEVICE_CPU).TypeConstraint<T>("T"),                 \
      FusedDropoutOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertAttentionSoftmax").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
      AttentionSoftmaxOp<T>);                                                             \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertAttentionSoftmaxGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),         \
      AttentionSoftmaxGradOp<T>);                                                         \
  REGISTER_KERNEL_BUILDER(Name("BertGelu").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          GeluOp<T>);                                                     \
  REGISTER_KERNEL_BUILDER(Name("BertGeluGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          GeluGradOp<T>);                                                 \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertPackRows").Device(DEVICE_CPU).TypeConstraint<T>("T"), PackRowsOp<T>);     \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertUnpackRows").Device(DEVICE_CPU).TypeConstraint<T>("T").HostMemory("slots"), \
      UnpackRowsOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertSplitHeads").Device(DEVICE_CPU).TypeConstraint<T>("T"), SplitHeadsOp<T>); \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertSplitHeadsPacked").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
      SplitHeadsOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertMergeHeadsPacked").Device(DEVICE_CPU).TypeConstraint<T>("T"),             \
      MergeHeadsOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("BertMergeHeads").Device(DEVICE_CPU).TypeConstraint<T>("T"), MergeHeadsOp<T>);

REGISTER_FLOAT_KERNELS(float)
REGISTER_FLOAT_KERNELS(::tensorflow::bfloat16)
REGISTER_FLOAT_KERNELS(Eigen::half)

#define REGISTER_LABEL_KERNELS(L)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("BertSparseSoftmaxXent").Device(DEVICE_CPU).TypeConstraint<L>("Tlabels"),       \
      SparseSoftmaxXentOp<L>);                                                             \
  REGISTER_KERNEL_BUILDER(                                                                 \
      Name("BertSparseSoftmaxXentGrad").Device(DEVICE_CPU).TypeConstraint<L>("Tlabels"),   \
      SparseSoftmaxXentGradOp<L>);

REGISTER_LABEL_KERNELS(int32_t)
REGISTER_LABEL_KERNELS(int64_t)

REGISTER_KERNEL_BUILDER(Name("BertLayerNorm").Device(DEVICE_CPU), LayerNormOp);
REGISTER_KERNEL_BUILDER(Name("BertLayerNormGrad").Device(DEVICE_CPU), LayerNormGradOp);
REGISTER_KERNEL_BUILDER(Name("BertApplyAdamW").Device(DEVICE_CPU), ApplyAdamWOp);

}  // namespace
}  // namespace bert_trainer
