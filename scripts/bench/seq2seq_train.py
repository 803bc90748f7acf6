"""Worker side of the seq2seq benchmark: one model per process, trained by one custom loop.

Every model - the GRU baselines, keras-hub's Transformer, bert-train's Seq2SeqTransformer -
trains with the same loop: a `tf.function` step (GradientTape, label-smoothed cross-entropy
over the real target tokens, global-norm clipping, Adam) fed the same length-bucketed batches
(`seq2seq_data`). Only the model and its recipe's learning rate and smoothing differ (and
bert-train's model, given the target ids, projects only the real target tokens on the
vocabulary: its library's training path, `loss_of`).

Worker entry points (see bench/worker.py): `build_step` (run(n) = n training steps, for the
timed A/B comparison) and `build_budget` (run(n) = train n seconds; run(0) = decode the dev
set and score it with corpus BLEU).
"""

import time

import keras
import numpy as np
import tensorflow as tf

from bench import seq2seq_data as data_lib
from bench import seq2seq_models as models
from bert_trainer import features
from bert_trainer import ops as bt_ops
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.models import seq2seq_transformer as s2s

CLIP_NORM = 1.0
KINDS = ("gru", "bahdanau", "keras_hub", "bert_train", "bert2bert", "bert2bert_scratch")


def smoothed_cross_entropy(targets, logits, smoothing: float) -> tf.Tensor:
    """Mean over real target tokens of label-smoothed cross-entropy (0 = padding, no loss).

    The smoothed distribution puts `1 - smoothing` on the label and `smoothing` spread evenly
    over the vocabulary (Szegedy et al.; the Transformer paper's 0.1).
    """
    log_probs = tf.nn.log_softmax(logits)
    nll = -tf.gather(log_probs, targets, batch_dims=2)
    loss = (1.0 - smoothing) * nll - smoothing * tf.reduce_mean(log_probs, axis=-1)
    weights = tf.cast(tf.not_equal(targets, 0), tf.float32)
    return tf.reduce_sum(loss * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def loss_of(model: keras.Model, batch: dict, smoothing: float, training) -> tf.Tensor:
    """`smoothed_cross_entropy` of `model` on `batch`. bert-train's model is given the target
    ids, so it projects only the real target tokens on the vocabulary (its library path)."""
    if not hasattr(model, "decoder_layers"):
        logits = models.logits_of(model, batch, training=training)
        return smoothed_cross_entropy(batch[features.TARGET_IDS], logits, smoothing)
    out = model(batch, training=training)
    xent = bt_ops.smoothed_cross_entropy(out[s2s.TARGET_LABELS], out[s2s.TARGET_LOGITS],
                                         smoothing)
    return tf.reduce_sum(xent) / tf.maximum(tf.cast(tf.size(xent), tf.float32), 1.0)


class InverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak`, then peak * sqrt(warmup / step) (the Transformer's schedule)."""

    def __init__(self, peak: float, warmup: int):
        self.peak, self.warmup = peak, max(int(warmup), 1)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = float(self.warmup)
        return self.peak * tf.minimum(step / warmup, tf.sqrt(warmup / step))

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup}


def recipe(kind: str, warmup_steps: int, learning_rate: float | None = None) -> dict:
    """Optimizer and loss of each model: the course's Adam 1e-3 without smoothing for the RNNs;
    the Transformer recipe (Adam 0.9/0.98, warm-up to `learning_rate` then inverse square root,
    smoothing 0.1; the peak defaults to 7e-4)."""
    if kind in ("gru", "bahdanau"):
        return {"optimizer": keras.optimizers.Adam(1e-3), "smoothing": 0.0}
    peak = learning_rate or 7e-4
    schedule = InverseSqrt(peak, warmup_steps)
    return {"optimizer": keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
            "smoothing": 0.1}


def build_model(kind: str, vocab_size: int, size: str, max_length: int, dropout: float,
                minilm_dir: str | None = None) -> tuple[keras.Model, dict]:
    """(model, info) of a benchmark kind (see KINDS)."""
    info = {}
    if kind in ("gru", "bahdanau"):
        model = models.gru_translator(vocab_size, max_length, attention=kind == "bahdanau")
    elif kind == "keras_hub":
        model = models.keras_hub_transformer(vocab_size, models.Size.parse(size), max_length,
                                             dropout)
    elif kind == "bert_train":
        model = models.bert_train_transformer(vocab_size, models.Size.parse(size), max_length,
                                              dropout)
    elif kind in ("bert2bert", "bert2bert_scratch"):
        model, loaded = models.bert2bert(minilm_dir, max_length, kind == "bert2bert")
        info.update(loaded_variables=len(loaded["loaded"]),
                    initialized_variables=len(loaded["initialized"]))
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    return model, info


def _signature(batch_size: int) -> dict:
    names = (*features.ENCODER_INPUTS, features.DECODER_INPUT_IDS, features.TARGET_IDS)
    return {k: tf.TensorSpec([batch_size, None], tf.int32) for k in names}


def _trainer(kind: str, model: keras.Model, batch_size: int, warmup_steps: int,
             learning_rate: float | None):
    """The compiled train step of `model`; returns (train_step, optimizer)."""
    spec = recipe(kind, warmup_steps, learning_rate)
    optimizer, smoothing = spec["optimizer"], spec["smoothing"]

    # The encoder's pooler gets no gradient from a seq2seq loss: it is left out, not warned of.
    probe = {k: tf.zeros([batch_size, 8], tf.int32) for k in _signature(batch_size)}
    trained = model.trainable_variables
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(models.logits_of(model, probe, training=False))
    variables = [v for v, g in zip(trained, tape.gradient(total, trained), strict=True)
                 if g is not None]

    @tf.function(input_signature=[_signature(batch_size)])
    def train_step(batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model, batch, smoothing, training=True)
        grads = tape.gradient(loss, variables)
        grads, _ = tf.clip_by_global_norm(grads, CLIP_NORM)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    return train_step, optimizer


def _setup(kind, data_file, vocab_size, size, max_length, dropout, batch_size, warmup_steps,
           minilm_dir, seed, learning_rate=None):
    keras.utils.set_random_seed(seed)
    encoded = data_lib.load(data_file)
    model, info = build_model(kind, vocab_size, size, max_length, dropout, minilm_dir)
    stream = data_lib.batches_forever(encoded, batch_size, seed)
    first = next(stream)
    models.logits_of(model, first, training=False)  # Builds the variables.
    info["params"] = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    train_step, optimizer = _trainer(kind, model, batch_size, warmup_steps, learning_rate)
    return model, info, stream, train_step, optimizer


def build_step(kind: str, data_file: str, vocab_size: int, size: str, max_length: int,
               dropout: float, batch_size: int, warmup_steps: int = 4000,
               minilm_dir: str | None = None, seed: int = 0, num_batches: int = 8,
               learning_rate: float | None = None):
    """Worker entry: run(n) trains n steps on `num_batches` fixed batches cycled.

    Both sides of the A/B comparison cycle the same batches (the first `num_batches` of the
    bucketed order), so they do the same work.
    """
    model, info, stream, train_step, _ = _setup(
        kind, data_file, vocab_size, size, max_length, dropout, batch_size, warmup_steps,
        minilm_dir, seed, learning_rate)
    batches = [next(stream) for _ in range(num_batches)]
    info["tokens_per_batch"] = float(np.mean(
        [np.count_nonzero(b[features.TARGET_IDS]) for b in batches]))
    position = [0]

    def run(n: int) -> dict:
        loss = None
        for _ in range(n):
            loss = train_step(batches[position[0] % len(batches)])
            position[0] += 1
        return {"loss": float(loss)}  # float() waits for the last step.

    return info, run


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacreBLEU's corpus BLEU (bert-train's metric where present, else the package)."""
    try:
        from bert_trainer.metrics.bleu import corpus_bleu as bleu  # noqa: PLC0415
    except ImportError:
        import sacrebleu  # noqa: PLC0415

        return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    return float(bleu(hypotheses, references).score)


def _decoders(kind, model, tokenizer, max_length, beam_size, length_penalty):
    """{name: batch -> ids [b, L]} of the decoding settings this kind is scored with."""
    start, end = tokenizer.cls_id, tokenizer.sep_id
    from bert_trainer.models.generation.seq2seq import translate  # noqa: PLC0415

    out = {}
    settings = (("greedy", 1),) if kind in ("gru", "bahdanau") else (  # the course: greedy
        ("greedy", 1), (f"beam{beam_size}", beam_size))
    for name, beam in settings:
        def decode(batch, beam=beam):
            inputs = {k: batch[k] for k in features.ENCODER_INPUTS}
            return translate(model, inputs, beam_size=beam, length_penalty=length_penalty,
                             max_decode_length=max_length, start_id=start,
                             end_id=end)[features.DECODED_IDS]
        out[name] = tf.function(decode, reduce_retracing=True)
    return out


def evaluate(kind, model, dev: data_lib.Encoded, tokenizer: Tokenizer, *, batch_size: int,
             max_length: int, beam_size: int, length_penalty: float) -> dict:
    """Decodes every dev source, detokenizes and scores: {setting: {"bleu", "seconds", ...}}."""
    results = {}
    n = len(dev.sources)
    for name, decode in _decoders(kind, model, tokenizer, max_length, beam_size,
                                  length_penalty).items():
        start, hypotheses = time.perf_counter(), []
        for i in range(0, n, batch_size):
            indices = list(range(i, min(i + batch_size, n)))
            indices += [indices[-1]] * (batch_size - len(indices))  # One shape: one trace.
            batch = data_lib.batch(dev, indices)
            batch = {k: v for k, v in batch.items() if k in features.ENCODER_INPUTS}
            ids = decode(batch)
            texts = tokenizer.detokenize(ids).numpy()
            hypotheses += [t.decode("utf-8") for t in texts[:min(batch_size, n - i)]]
        results[name] = {"bleu": corpus_bleu(hypotheses, dev.references),
                         "seconds": time.perf_counter() - start,
                         "examples": hypotheses[:3]}
    return results


def build_budget(kind: str, data_file: str, dev_file: str, vocab_file: str, lower_case: bool,
                 vocab_size: int, size: str, max_length: int, dropout: float, batch_size: int,
                 warmup_steps: int, beam_size: int, length_penalty: float,
                 minilm_dir: str | None = None, seed: int = 0,
                 learning_rate: float | None = None):
    """Worker entry: run(n > 0) trains for n seconds (whole steps, at least one), or exactly
    -n steps when n < 0; run(0) decodes the dev set and returns its BLEU per setting.

    The build ends with one untimed training step (tracing), counted in "steps"."""
    model, info, stream, train_step, _ = _setup(
        kind, data_file, vocab_size, size, max_length, dropout, batch_size, warmup_steps,
        minilm_dir, seed, learning_rate)
    dev = data_lib.load(dev_file)
    tokenizer = Tokenizer(vocab_file, lower_case=lower_case)
    # One untimed step first: it traces the step function, whose cost differs by model and is
    # not training. It counts as a step.
    float(train_step(next(stream)))
    totals = {"steps": 1, "train_seconds": 0.0}
    credit = [1]  # The build's step, taken off the first turn of a fixed step count.

    def run(n: int) -> dict:
        if n == 0:
            return {"decoded": evaluate(kind, model, dev, tokenizer, batch_size=batch_size,
                                        max_length=max_length, beam_size=beam_size,
                                        length_penalty=length_penalty), **totals}
        start, steps, loss = time.perf_counter(), 0, None
        target = -n - credit.pop() if n < 0 and credit else -n
        while (steps < target) if n < 0 else (steps == 0 or time.perf_counter() - start < n):
            loss = float(train_step(next(stream)))  # float(): the clock sees finished steps.
            steps += 1
        totals["steps"] += steps
        totals["train_seconds"] += time.perf_counter() - start
        return {"loss": loss, "steps": steps, **totals}

    return info, run
