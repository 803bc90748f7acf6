"""Minimal stand-ins for the sequence-to-sequence parts this family builds on.

Used only where the real ones (`bert_trainer.models.Seq2SeqTransformer`,
`models.seq2seq_generation.translate`, `metrics.bleu.corpus_bleu`,
`interop.bert2bert.warm_start_seq2seq`) are not importable: they keep the family runnable and
testable on its own. Each follows the agreed interface, simply: the decoder recomputes the
whole prefix at every step (no cache), decoding is greedy, BLEU is sacreBLEU's definition on a
simplified tokenizer, the warm start loads the encoder only.
"""

import collections
import dataclasses
import math
import re

import keras
import tensorflow as tf
from keras import ops

from bert_trainer import features as F


@keras.saving.register_keras_serializable(package="translate_standin")
class StandInSeq2Seq(keras.Model):
    """An encoder and a post-norm Transformer decoder with tied, shared embeddings.

    Args:
      encoder: a `BertEncoder`.
      num_decoder_layers: decoder layers (None: the encoder's).
      max_target_length: decoder positions (None: the encoder's max_sequence_length).
    """

    def __init__(self, encoder, *, num_decoder_layers=None, max_target_length=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k in ("name", "dtype", "trainable")}
        super().__init__(**kwargs)
        self.encoder = encoder
        hidden, heads = encoder.hidden_size, encoder.num_attention_heads
        self._max_target_length = int(max_target_length or encoder.max_sequence_length)
        self.num_decoder_layers = int(num_decoder_layers or encoder.num_layers)
        self.target_positions = keras.layers.Embedding(self._max_target_length, hidden,
                                                       name="target_positions")
        self.blocks = []
        for i in range(self.num_decoder_layers):
            self.blocks.append({
                "self": keras.layers.MultiHeadAttention(heads, hidden // heads, name=f"self_{i}"),
                "cross": keras.layers.MultiHeadAttention(heads, hidden // heads,
                                                         name=f"cross_{i}"),
                "ff1": keras.layers.Dense(encoder.inner_dim, activation="gelu", name=f"ff1_{i}"),
                "ff2": keras.layers.Dense(hidden, name=f"ff2_{i}"),
                "n1": keras.layers.LayerNormalization(name=f"n1_{i}"),
                "n2": keras.layers.LayerNormalization(name=f"n2_{i}"),
                "n3": keras.layers.LayerNormalization(name=f"n3_{i}")})
        # Built here, as the package's models are (a first call would record float input
        # specs that a SavedModel then traces).
        self.built = True
        ids = tf.ones((1, 2), tf.int32)
        self.call({F.INPUT_WORD_IDS: ids, F.INPUT_MASK: ids, F.INPUT_TYPE_IDS: 0 * ids,
                   F.DECODER_INPUT_IDS: ids})

    @property
    def vocab_size(self) -> int:
        return self.encoder.vocab_size

    @property
    def max_target_length(self) -> int:
        return self._max_target_length

    def encode(self, inputs, training=None):
        outputs = self.encoder({k: inputs[k] for k in F.ENCODER_INPUTS}, training=training)
        return outputs[F.SEQUENCE_OUTPUT], inputs[F.INPUT_MASK]

    def _decode(self, ids, encoder_output, encoder_mask, training=None):
        table = self.encoder.get_embedding_table()
        length = ops.shape(ids)[1]
        x = ops.take(table, ids, axis=0) + self.target_positions(ops.arange(length))[None]
        causal = ops.tril(ops.ones((length, length), "bool"))[None]
        cross = ops.cast(encoder_mask, "bool")[:, None, :]
        for b in self.blocks:
            x = b["n1"](x + b["self"](x, x, attention_mask=causal, training=training))
            x = b["n2"](x + b["cross"](x, encoder_output, attention_mask=cross,
                                       training=training))
            x = b["n3"](x + b["ff2"](b["ff1"](x)))
        return ops.cast(ops.matmul(x, ops.transpose(table)), "float32")

    def call(self, inputs, training=None):
        encoder_output, encoder_mask = self.encode(inputs, training=training)
        return {F.LOGITS: self._decode(inputs[F.DECODER_INPUT_IDS], encoder_output,
                                       encoder_mask, training=training)}

    def init_cache(self, batch_size, max_length):
        return {"ids": tf.zeros([batch_size, max_length], tf.int32)}

    def decode_step(self, token_ids, index, cache, encoder_output, encoder_mask):
        ids = tf.tensor_scatter_nd_update(
            tf.transpose(cache["ids"]), [[index]], [tf.cast(token_ids, tf.int32)])
        ids = tf.transpose(ids)
        logits = self._decode(ids, encoder_output, encoder_mask, training=False)
        return tf.gather(logits, index, axis=1), {"ids": ids}


def translate(model, encoder_inputs, *, beam_size=4, length_penalty=0.6, max_decode_length,
              start_id, end_id):
    """Greedy decoding (the stand-in ignores `beam_size` and `length_penalty`).

    Returns:
      {DECODED_IDS: int32 [b, max_decode_length] (0 after the end), DECODED_SCORES: float32
      [b] (sum of the log-probabilities / length)}.
    """
    del beam_size, length_penalty
    encoder_output, encoder_mask = model.encode(encoder_inputs, training=False)
    batch = tf.shape(encoder_output)[0]
    length = int(max_decode_length)
    cache = model.init_cache(batch, min(length, model.max_target_length))

    def step(i, token, cache, out, score, done, count):
        logits, cache = model.decode_step(token, i, cache, encoder_output, encoder_mask)
        log_probs = tf.nn.log_softmax(logits)
        nxt = tf.argmax(logits, axis=-1, output_type=tf.int32)
        live = tf.logical_not(done)
        score += tf.where(live, tf.reduce_max(log_probs, -1), 0.0)
        count += tf.cast(live, tf.float32)
        out = out.write(i, tf.where(live, nxt, 0))
        return i + 1, nxt, cache, out, score, done | tf.equal(nxt, end_id), count

    steps = min(length, model.max_target_length)
    init = (tf.constant(0), tf.fill([batch], tf.constant(start_id, tf.int32)), cache,
            tf.TensorArray(tf.int32, size=steps), tf.zeros([batch]), tf.zeros([batch], tf.bool),
            tf.zeros([batch]))
    _, _, _, out, score, _, count = tf.while_loop(
        lambda i, *rest: tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(rest[4]))),
        step, init)
    ids = tf.transpose(out.stack())
    ids = tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])
    return {F.DECODED_IDS: tf.ensure_shape(ids, [None, length]),
            F.DECODED_SCORES: score / tf.maximum(count, 1.0)}


@dataclasses.dataclass
class BleuResult:
    score: float
    precisions: list
    brevity_penalty: float
    sys_len: int
    ref_len: int


def _tokenize_13a(line: str) -> list[str]:
    line = re.sub(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])", r" \1 ", line)
    line = re.sub(r"([^0-9])([\.,])", r"\1 \2 ", line)
    line = re.sub(r"([\.,])([^0-9])", r" \1 \2", line)
    line = re.sub(r"([0-9])(-)", r"\1 \2 ", line)
    return line.split()


def corpus_bleu(hypotheses, references) -> BleuResult:
    """Corpus BLEU (0..100): 4-gram precisions, exponential smoothing, brevity penalty."""
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    matches, totals, sys_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for hyp, ref_list in zip(hypotheses, refs, strict=True):
        h = _tokenize_13a(hyp)
        rs = [_tokenize_13a(r) for r in ref_list]
        sys_len += len(h)
        ref_len += min((len(r) for r in rs), key=lambda n: (abs(n - len(h)), n))
        for n in range(1, 5):
            grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            best = collections.Counter()
            for r in rs:
                best |= collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, best[g]) for g, c in grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    precisions, k = [], 1
    for m, t in zip(matches, totals, strict=True):
        if t == 0:
            precisions.append(0.0)
        elif m == 0:
            k *= 2
            precisions.append(100.0 / (k * t))
        else:
            precisions.append(100.0 * m / t)
    bp = 1.0 if sys_len >= ref_len or sys_len == 0 else math.exp(1 - ref_len / sys_len)
    score = 0.0 if min(precisions) <= 0 else bp * math.exp(
        sum(math.log(p) for p in precisions) / 4)
    return BleuResult(score, precisions, bp, sys_len, ref_len)


def warm_start_seq2seq(model, checkpoint, *, share=False):
    """Loads the encoder only; the decoder starts fresh."""
    del share
    report = checkpoint.load(encoder=model.encoder)
    encoder_ids = {id(v) for v in model.encoder.weights}
    fresh = [v.path for v in model.weights if id(v) not in encoder_ids]
    return {"loaded": report["loaded"], "initialized": report["initialized"] + fresh}
