// The dropout stream shared by BertFusedDropout and BertAttentionSoftmax: each element's keep
// decision is a counter-based hash of (seed, element index), so a gradient recomputes the
// mask from the seed instead of storing it, and two ops with one seed drop the same elements.

#ifndef BERT_TRAINER_KERNELS_DROPOUT_H_
#define BERT_TRAINER_KERNELS_DROPOUT_H_

#include "common.h"

namespace bert_trainer {

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
  static absl::Status FromRate(OpKernelConstruction* ctx, const char* op,
                                     DropoutStream* stream) {
    float rate;
    TF_RETURN_IF_ERROR(ctx->GetAttr("rate", &rate));
    if (!(rate >= 0.0f && rate < 1.0f)) {
      return InvalidArgument(op, ": rate must be in [0, 1), got ", rate);
    }
    stream->threshold = static_cast<uint32_t>(
        std::min(std::llround(static_cast<double>(rate) * 4294967296.0), 4294967295LL));
    stream->scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(rate)));
    return absl::OkStatus();
  }

  // This stream keyed by a 2-element int64 `seed`.
  absl::Status Seeded(const char* op, const Tensor& seed, DropoutStream* keyed) const {
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
    return absl::OkStatus();
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
inline void DropoutChunk(const T* in, T* out, int64_t first, int64_t count, DropoutStream stream) {
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

}  // namespace bert_trainer

#endif  // BERT_TRAINER_KERNELS_DROPOUT_H_
