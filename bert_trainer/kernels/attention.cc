// Attention: BertAttentionSoftmax(+Grad), the probabilities dropout(softmax(scores + bias))
// in one pass per row, and the heads' layout, BertSplitHeads / BertMergeHeads (+Packed):
// [batch, seq, n * heads * dim] <-> n x [batch, heads, seq, dim] as one copy, each the
// other's gradient; the Packed pair reads (writes) only the real tokens' rows.

#include "dropout.h"

namespace bert_trainer {
namespace {

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
      // Padded and aligned (common.h): exp runs on Eigen's vector path for every element.
      const int64_t padded = Padded(keys);
      Eigen::ArrayXf buffer = Eigen::ArrayXf::Zero(padded + (drops ? keys : 0));
      float* row = buffer.data();
      float* keep = drops ? row + padded : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / (heads * queries), q = r % queries;
        const T* s = ss + r * keys;
        const T* m = bs + ((bias_batch == 1 ? 0 : b) * bias_queries +
                           (bias_queries == 1 ? 0 : q)) * keys;
        for (int64_t j = 0; j < keys; ++j) {
          row[j] = static_cast<float>(s[j]) + static_cast<float>(m[j]);
        }
        AlignedArray a(row, padded);
        a = (a - FixedMax(row, keys)).exp();
        const float inverse_sum = 1.0f / FixedSum(row, keys);
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
        const float gp = FixedSum(keys, [&](int64_t j) { return g[j] * p[j]; });
        g = p * (g - gp);
        Store(g.data(), keys, out + r * keys);
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
// Registration.

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
      return absl::OkStatus();
    });

REGISTER_OP("BertAttentionSoftmaxGrad")
    .Input("dy: T")
    .Input("probs: T")
    .Input("seed: int64")
    .Output("dscores: T")
    .Attr("rate: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape);

// n x [batch, heads, seq, dim] from x [batch, seq, n * heads * dim] or, packed, from x
// [tokens, n * heads * dim] and index [batch, seq].
absl::Status SplitHeadsShape(InferenceContext* c, bool packed) {
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
  return absl::OkStatus();
}

// [batch, seq, n * heads * dim] from n x [batch, heads, seq, dim] or, packed (the last input
// is the index), [tokens, n * heads * dim].
absl::Status MergeHeadsShape(InferenceContext* c, bool packed) {
  ShapeHandle y;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &y));
  DimensionHandle width;
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(y, 1), c->Dim(y, 3), &width));
  TF_RETURN_IF_ERROR(c->Multiply(width, c->num_inputs() - (packed ? 1 : 0), &width));
  c->set_output(0, packed ? c->Matrix(c->UnknownDim(), width)
                          : c->MakeShape({c->Dim(y, 0), c->Dim(y, 2), width}));
  return absl::OkStatus();
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

BERT_REGISTER_FLOAT_KERNEL("BertAttentionSoftmax", AttentionSoftmaxOp);
BERT_REGISTER_FLOAT_KERNEL("BertAttentionSoftmaxGrad", AttentionSoftmaxGradOp);
BERT_REGISTER_FLOAT_KERNEL("BertSplitHeads", SplitHeadsOp);
BERT_REGISTER_FLOAT_KERNEL("BertSplitHeadsPacked", SplitHeadsOp);
BERT_REGISTER_FLOAT_KERNEL("BertMergeHeads", MergeHeadsOp);
BERT_REGISTER_FLOAT_KERNEL("BertMergeHeadsPacked", MergeHeadsOp);

}  // namespace
}  // namespace bert_trainer
