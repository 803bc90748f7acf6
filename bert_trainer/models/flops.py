"""Model FLOPs of a training step of a BERT-style model, the count behind throughput and MFU.

A multiply-add is 2 FLOPs; training = forward + backward = 3 x forward; s tokens per sequence,
P masked predictions, L layers, h hidden, f inner, e embedding width, V vocab:

    per token:     L * 2 * (4*h*h + 2*h*f)     Q, K, V, attention output; FFN in and out
                   + 2*e*h                     embedding projection (only when e != h)
    per sequence:  L * 2 * (2*s*s*h)           scores Q.K^T and probs.V over all heads
                   + 2*h*h                     pooler
                   + 2 * head kernel params    classifier heads (once per sequence)
    per prediction: 2*h*e + 2*e*V              MLM transform and (tied) output projection,
                                               on the P gathered positions only (on the
                                               weighted ones where BertPretrainer skips the
                                               others: `computed_predictions`)

When the last layer computes only q of the s rows as queries (BertPretrainer's sparse last
layer: q = 1 + P, [CLS] and the masked positions), its Q projection, attention output, FFN and
attention scores are counted on those q rows; its K and V projections still on all s.

So training costs 6 * N_matmul * tokens + 12 * L * h * s per token, the usual MFU count
(PaLM, appendix B). Padding tokens are counted where the model computes on them; where it
packs the real tokens (`computed_tokens` per sequence), the dense layers and the last layer's
K and V are counted on those, attention still on the padded s x s (its layout).
Embedding lookups, softmax, LayerNorm, GELU and the optimizer update are elementwise and left out.
Token-level heads (tagging, spans: h x labels per token) are counted once per sequence; the
difference is < 0.1 % of the encoder.

The models apply this to themselves (`EncoderModel.flops_per_example`, `training_flops`): they
know their sizes and which of the computations above they skip.
"""

from keras import ops

# The encoder config entries the count needs (RFC names).
ENCODER_SIZES = ("num_layers", "hidden_size", "inner_dim", "vocab_size")


def training_flops_per_example(*, num_layers, hidden_size, inner_dim, seq_length,
                               embedding_width=None, vocab_size=0, num_predictions=0,
                               head_params=0, last_layer_rows=None, computed_predictions=None,
                               computed_tokens=None):
    """Model FLOPs of one training step (forward + backward) per sequence.

    Plain arithmetic: the size arguments may be Python numbers or scalar tensors (a model
    passes the batch's sequence length and prediction count as float tensors).

    Args:
        num_layers, hidden_size, inner_dim: the encoder's sizes (RFC names).
        seq_length: tokens per sequence, padding included.
        embedding_width: width of the word embeddings; None: `hidden_size` (no projection).
        vocab_size: vocabulary of the MLM output projection (unused without predictions).
        num_predictions: masked positions per sequence fed to the MLM head (0: no MLM).
        head_params: kernel parameters of the other heads, applied once per sequence.
        last_layer_rows: query rows the last layer computes (None: all `seq_length`).
        computed_predictions: predictions per sequence the MLM head computes, when it skips
            some of the `num_predictions` (BertPretrainer in training: the weighted ones,
            a batch's mean); None: all of them.
        computed_tokens: tokens per sequence the layers compute when the model packs the
            real ones (a batch's mean); None: all `seq_length`.

    Returns:
        FLOPs per sequence (same type as the arguments).
    """
    h, f, s = hidden_size, inner_dim, seq_length
    t = s if computed_tokens is None else computed_tokens
    e = embedding_width or h
    per_sequence = t * num_layers * 2 * (4 * h * h + 2 * h * f)
    if e != h:
        per_sequence += s * 2 * e * h  # the embedding projection runs before packing
    per_sequence += num_layers * 2 * (2 * s * s * h) + 2 * h * h + 2 * head_params
    if last_layer_rows is not None:  # the skipped rows: all but the K and V projections
        per_sequence -= ((t - last_layer_rows) * 2 * (2 * h * h + 2 * h * f)
                         + 2 * (2 * (s - last_layer_rows) * s * h))
    per_prediction = 2 * h * e + 2 * e * vocab_size
    if computed_predictions is None:
        computed_predictions = num_predictions
    return 3 * (per_sequence + computed_predictions * per_prediction)


def mean_per_sequence(count, batch):
    """A batch's count (a scalar tensor; None passes through) as a float32 mean per sequence.

    Args:
        count: e.g. the tokens or the masked-LM rows a model computed for the whole batch.
        batch: float32 scalar, the sequences in the batch.
    """
    return None if count is None else ops.cast(count, "float32") / batch
