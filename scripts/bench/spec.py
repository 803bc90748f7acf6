"""What one benchmark measurement trains: model sizes, shapes, the FLOPs formula and the data.

Everything here is plain Python + numpy (no TensorFlow), so the orchestrating process can plan
runs and compute FLOPs without paying for a TensorFlow import.

FLOPs formula (a multiply-add counts as 2 FLOPs; b batch, s sequence, L layers, h hidden,
f inner, P masked predictions, V vocabulary):

    encoder dense   = L * b * s * (2 * 4 * h * h + 2 * 2 * h * f)   # Q, K, V, output; FFN in+out
    attention       = L * 2 * (2 * b * s * s * h)                    # Q.K^T scores and probs.V
    pooler + NSP    = 2 * b * h * h + 2 * b * h * 2
    masked LM       = 2 * b * P * h * h + 2 * b * P * h * V          # transform; tied output on
                                                                     # the P gathered positions only
    forward         = sum of the above
    training step   = 3 * forward                                    # backward ~ 2x forward

Embedding lookups, softmax, LayerNorm, GELU and the AdamW update are elementwise (O(params) or
O(b*s*h)) and left out, as is usual for model FLOPs utilization (MFU): they are < 1 % here.
Padding tokens are counted: the dense model computes on them (bert-train's pretrainer packs
the real tokens on CPU without XLA: `computed_tokens`, `forward_flops(tokens=...)`).
"""

import dataclasses

import numpy as np

from bert_trainer import features

VOCAB_SIZE = 30522
TYPE_VOCAB_SIZE = 2
MAX_SEQUENCE_LENGTH = 512
FLOPS_FORMULA = (
    "train = 3 * forward; forward = L*b*s*(8*h*h + 4*h*f) + 4*L*b*s*s*h "
    "+ 2*b*h*h + 4*b*h + 2*b*P*h*h + 2*b*P*h*V (multiply-add = 2 FLOPs; "
    "MLM on the P gathered positions only; elementwise ops left out)")

# Special ids of BERT uncased vocabularies (the minilm vocab.txt): [PAD] [UNK] [CLS] [SEP] [MASK].
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103
FIRST_WORD_ID = 999  # Ids below are [unusedN] and special tokens; real pieces start here.


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A BERT encoder size (the names of configs/encoders/*.gin).

    Attributes:
      name: short name, e.g. "mini".
      num_layers, hidden_size, num_attention_heads, inner_dim: the RFC's names.
      vocab_size: word-piece vocabulary size.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    inner_dim: int
    vocab_size: int = VOCAB_SIZE


SIZES = {
    "nano": ModelSize("nano", 1, 32, 2, 64, vocab_size=1000),  # --smoke only.
    "tiny": ModelSize("tiny", 2, 128, 2, 512),
    "mini": ModelSize("mini", 4, 256, 4, 1024),
    "small": ModelSize("small", 4, 512, 8, 2048),
    "base": ModelSize("base", 12, 768, 12, 3072),  # BERT-base: the `base` section.
}


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One pretraining step to time.

    Attributes:
      size: the encoder size.
      batch_size: sequences per step.
      seq_length: tokens per sequence (padded).
      max_predictions: masked positions per sequence fed to the MLM head.
      jit_compile: compile the step with XLA.
      mixed_precision: None (float32) or "bfloat16" (Keras "mixed_bfloat16": bf16 compute,
        float32 weights); FLOPs are counted the same.
    """

    size: ModelSize
    batch_size: int = 32
    seq_length: int = 128
    max_predictions: int = 20
    jit_compile: bool = False
    mixed_precision: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "StepSpec":
        data = dict(data)
        data["size"] = ModelSize(**data["size"])
        return cls(**data)


NUM_DATA_BATCHES = 4  # distinct batches every implementation cycles through (make_batches)


def forward_flops(spec: StepSpec, last_layer_rows: int | None = None,
                  mlm_rows: float | None = None, tokens: float | None = None) -> int:
    """Model FLOPs of one forward pass of the pretrainer (see the module docstring).

    Args:
      spec: the step.
      last_layer_rows: query rows the last layer computes (None: all `seq_length`).
        bert-train's pretrainer computes 1 + P ([CLS] and the masked positions): the
        skipped rows lose their Q projection, attention, attention output and FFN; the K and
        V projections still run on every row.
      mlm_rows: rows per step the masked LM computes (None: all `batch * P`); bert-train's
        pretrainer computes only the weighted predictions, rounded up
        (`computed_mlm_rows`).
      tokens: tokens per step the layers compute (None: all `batch * seq`); bert-train's
        pretrainer packs the real ones (`computed_tokens`): the dense layers and the last
        layer's K and V run on those, attention on the padded layout.

    Returns:
      FLOPs as an int.
    """
    m, b, s, p = spec.size, spec.batch_size, spec.seq_length, spec.max_predictions
    h, f, layers, v = m.hidden_size, m.inner_dim, m.num_layers, m.vocab_size
    t = b * s if tokens is None else tokens
    encoder_dense = layers * t * (2 * 4 * h * h + 2 * 2 * h * f)
    attention = layers * 2 * (2 * b * s * s * h)
    pooler_nsp = 2 * b * h * h + 2 * b * h * 2
    predictions = b * p if mlm_rows is None else mlm_rows
    masked_lm = 2 * predictions * h * h + 2 * predictions * h * v
    skipped = 0
    if last_layer_rows is not None:
        rows = s - last_layer_rows
        skipped = ((t - b * last_layer_rows) * (2 * 2 * h * h + 2 * 2 * h * f)
                   + 2 * (2 * b * rows * s * h))
    return int(round(encoder_dense + attention + pooler_nsp + masked_lm - skipped))


def train_flops(spec: StepSpec, last_layer_rows: int | None = None,
                mlm_rows: float | None = None, tokens: float | None = None) -> int:
    """Model FLOPs of one training step: forward + backward (2x forward)."""
    return 3 * forward_flops(spec, last_layer_rows, mlm_rows, tokens)


def computed_tokens(spec: StepSpec, num_batches: int = NUM_DATA_BATCHES) -> float:
    """Mean tokens per step bert-train's pretrainer computes when it packs them: the real
    tokens of `make_batches(spec, num_batches)` (its masked positions and [CLS] are among
    them)."""
    return float(np.mean([np.count_nonzero(b[features.INPUT_MASK])
                          for b in make_batches(spec, num_batches)]))


def computed_mlm_rows(spec: StepSpec, num_batches: int = NUM_DATA_BATCHES) -> float:
    """Mean rows per step bert-train's masked LM computes on `make_batches(spec, num_batches)`:
    each batch's weighted predictions, rounded up as `bert_pretrainer.computed_prediction_rows`.
    """
    # Here, not at the top: the model module brings Keras and TensorFlow, which the
    # harness's parent process does not otherwise load.
    from bert_trainer.models.bert_pretrainer import computed_prediction_rows  # noqa: PLC0415

    batches = make_batches(spec, num_batches)
    total = spec.batch_size * spec.max_predictions
    return float(np.mean([
        computed_prediction_rows(int(np.count_nonzero(b[features.MASKED_LM_WEIGHTS])), total)
        for b in batches]))


def num_params(size: ModelSize, type_vocab_size: int = TYPE_VOCAB_SIZE,
               max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> int:
    """Parameters of BERT encoder + MLM head (tied output, own bias) + NSP dense.

    Both implementations must build exactly this many; the harness checks it.
    """
    h, f, v = size.hidden_size, size.inner_dim, size.vocab_size
    embeddings = (v + type_vocab_size + max_sequence_length) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    pooler = h * h + h
    masked_lm = h * h + h + 2 * h + v
    nsp = 2 * h + 2
    return embeddings + size.num_layers * layer + pooler + masked_lm + nsp


def make_batches(spec: StepSpec, num_batches: int, seed: int = 0) -> list[dict]:
    """Deterministic synthetic pretraining batches shaped like create_pretraining_data output.

    90 % of sequences are full length and 10 % are shorter (google-research/bert's
    short_seq_prob=0.1), so the padding fraction is realistic. Both implementations train on
    exactly these arrays; dense compute does not depend on the token values.

    Args:
      spec: shapes and vocabulary.
      num_batches: how many distinct batches.
      seed: numpy seed.

    Returns:
      list of dicts keyed by bert_trainer.features names: input_word_ids, input_mask,
      input_type_ids [b, s] int32; masked_lm_positions, masked_lm_ids [b, P] int32;
      masked_lm_weights [b, P] float32; next_sentence_labels [b] int32.
    """
    rng = np.random.default_rng(seed)
    b, s, p, v = spec.batch_size, spec.seq_length, spec.max_predictions, spec.size.vocab_size
    first_word = min(FIRST_WORD_ID, v // 2)
    batches = []
    for _ in range(num_batches):
        full = rng.random(b) < 0.9
        lengths = np.where(full, s, rng.integers(min(8, s), s + 1, size=b))
        ids = rng.integers(first_word, v, size=(b, s), dtype=np.int32)
        mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
        split = np.maximum(lengths // 2, 2)
        type_ids = ((np.arange(s)[None, :] >= split[:, None]) & (mask == 1)).astype(np.int32)
        ids[:, 0] = CLS_ID if v > CLS_ID else 1
        ids[np.arange(b), lengths - 1] = SEP_ID if v > SEP_ID else 2
        ids[mask == 0] = PAD_ID
        positions = np.zeros((b, p), np.int32)
        weights = np.zeros((b, p), np.float32)
        for i, n in enumerate(lengths):
            k = min(p, max(1, int(round(0.15 * (n - 2)))))
            positions[i, :k] = np.sort(rng.choice(np.arange(1, n - 1), size=k, replace=False))
            weights[i, :k] = 1.0
        batches.append({
            features.INPUT_WORD_IDS: ids,
            features.INPUT_MASK: mask,
            features.INPUT_TYPE_IDS: type_ids,
            features.MASKED_LM_POSITIONS: positions,
            features.MASKED_LM_IDS: np.take_along_axis(ids, positions, axis=1),
            features.MASKED_LM_WEIGHTS: weights,
            features.NEXT_SENTENCE_LABELS: rng.integers(0, 2, size=b, dtype=np.int32),
        })
    return batches
