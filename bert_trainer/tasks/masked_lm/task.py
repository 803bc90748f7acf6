"""BERT pretraining: masked LM plus (optionally) next-sentence prediction.

The data are the TFRecords of `bert-train create_pretraining_data` (masked on the fly,
"dynamic") or static-masked records with google-research/bert's feature names; the pipeline
(`tasks.masked_lm.data`) detects which. The model is `models.BertPretrainer` around any
encoder, built by `encoder_fn` (gin's `build_encoder`, or an init checkpoint's model info).
"""

import dataclasses
from collections.abc import Callable

import keras
import tensorflow as tf
from absl import logging
from keras import ops

from bert_trainer import features as F
from bert_trainer import losses as losses_lib
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.data.input_utils import PipelineOptions
from bert_trainer.data.masking import MaskingVocab
from bert_trainer.data.tokenizer import Tokenizer, load_vocab
from bert_trainer.errors import UserError
from bert_trainer.features import MLM_LOGITS, MLM_ROW_LOGITS, MLM_ROWS, NEXT_SENTENCE_LOGITS
from bert_trainer.interop import resolve
from bert_trainer.models import BertPretrainer, bert_pretrainer
from bert_trainer.tasks.base import Task
from bert_trainer.tasks.masked_lm import data as masked_lm_data

TASK_NAME = "pretraining"


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """What to pretrain on, and how the examples are batched and masked.

    Attributes:
        train_data: TFRecord glob(s) of training examples (comma-separated allowed).
        eval_data: TFRecord glob(s) of held-out examples; None: no evaluation.
        vocab_file: the WordPiece vocab.txt; needed for dynamic masking and copied to the model
            directory. May be None only with `masking="static"`.
        lower_case: whether the vocabulary is uncased (recorded in the model directory).
        seq_length: tokens per example; must equal the records' length.
        max_predictions_per_seq: P, masked positions per example.
        train_batch_size: global training batch (summed over replicas).
        eval_batch_size: global eval batch; None: the training batch.
        masking: "auto" (detect from the records), "dynamic" or "static".
        whole_word_masking: mask whole words (dynamic masking).
        masked_lm_prob: fraction of real tokens masked (dynamic masking).
        use_next_sentence_label: train the next-sentence head; False: masked LM only.
        shuffle_buffer: examples in the training shuffle buffer.
        data_seed: seeds the file order, the shuffle and the dynamic masks.
        mlm_projection_in_compute_dtype: under `mixed_precision` (bfloat16/float16), run the
            masked LM's tied vocabulary projection in that dtype too (the default, as Model
            Garden on TPU and PyTorch's autocast do; benchmarks/README.md measures it);
            False reads the float32 table (logits without the bf16 rounding). No effect in
            float32.
        skip_unweighted_predictions: in training on CPU (outside XLA), compute the masked LM
            only at the predictions of nonzero weight (`bert_pretrainer.Execution`; exact);
            False computes every one of the `max_predictions_per_seq` slots.
        pack_tokens: on CPU (outside XLA), run the encoder on the real tokens only, not the
            padding (`bert_pretrainer.Execution`; the same values, the dropout masks drawn
            over the packed rows); False computes every slot.
    """

    train_data: str | None = None
    eval_data: str | None = None
    vocab_file: str | None = None
    lower_case: bool = True
    seq_length: int = 128
    max_predictions_per_seq: int = 20
    train_batch_size: int = 256
    eval_batch_size: int | None = None
    masking: str = "auto"
    whole_word_masking: bool = False
    masked_lm_prob: float = 0.15
    use_next_sentence_label: bool = True
    shuffle_buffer: int = 10_000
    data_seed: int = 0
    mlm_projection_in_compute_dtype: bool = True
    skip_unweighted_predictions: bool = True
    pack_tokens: bool = True

    def __post_init__(self):
        for field in ("seq_length", "max_predictions_per_seq", "train_batch_size",
                      "shuffle_buffer"):
            if getattr(self, field) < 1:
                raise UserError(f"PretrainingConfig.{field}={getattr(self, field)} must be >= 1")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise UserError(f"PretrainingConfig.eval_batch_size={self.eval_batch_size} must "
                            "be >= 1 (or None: the training batch)")
        if self.masking not in masked_lm_data.MASKING_MODES:
            raise UserError(f"PretrainingConfig.masking={self.masking!r} is unknown; use one of "
                            f"{masked_lm_data.MASKING_MODES}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise UserError(f"PretrainingConfig.masked_lm_prob={self.masked_lm_prob} must be "
                            "in (0, 1)")
        if self.vocab_file is None and self.masking != "static":
            raise UserError("PretrainingConfig.vocab_file is not set; pass --vocab_file=VOCAB "
                            "(dynamic masking needs it; only masking='static' data do without)")


def head_lines(source: str, heads, loaded, encoder) -> list[str]:
    """One line per pretraining head: loaded from `source`, or fresh (in part or whole).

    Args:
        source: the init checkpoint, as named.
        heads: (name, head layer, what it is called in a Hugging Face file) triples.
        loaded: the variable paths the warm start loaded.
        encoder: the encoder, whose weights a head may share (the masked-LM decoder is the
            word embeddings, tied): not counted as the head's.
    """
    loaded, lines = set(loaded), []
    shared = {id(v) for v in encoder.weights}
    for name, head, called in heads:
        paths = [v.path for v in head.weights if id(v) not in shared]
        missing = [p for p in paths if p not in loaded]
        if not missing:
            lines.append(f"The {name} head is {source}'s (continued pretraining)")
        elif len(missing) == len(paths):
            lines.append(f"{source} has no {name} head ({called} in Hugging Face files): it "
                         "starts fresh")
        else:
            lines.append(f"{source} has part of the {name} head; {', '.join(missing)} start "
                         "fresh")
    return lines


class PretrainingTask(Task):
    """Masked LM + next sentence on a `BertPretrainer`.

    Losses, per example (the trainer averages them over the global batch):
        mlm_loss = sum_p w_p * xent_p / max(sum_p w_p, 1)   over the P masked positions
        nsp_loss = xent of the next-sentence label            (when use_next_sentence_label)
        loss     = mlm_loss + nsp_loss                         (mlm_loss alone without NSP)
    Metrics: mlm_accuracy (weighted by masked_lm_weights), nsp_accuracy.

    Args:
        config: data and masking settings.
        encoder_fn: builds a fresh encoder (called once, in `build_model`).
        checkpoint: the init checkpoint, already resolved by the caller (`initialize` reuses
            it instead of reading the path again); None: `initialize` resolves its argument.
    """

    name = TASK_NAME
    train_split = "train"
    eval_split = "eval"

    def __init__(self, config: PretrainingConfig, encoder_fn: Callable[[], keras.Model], *,
                 checkpoint: "resolve.ResolvedCheckpoint | None" = None):
        self.config = config
        self.encoder_fn = encoder_fn
        self.checkpoint = checkpoint  # the init checkpoint the command resolved, if any
        self.loss_names = (("loss", "mlm_loss", "nsp_loss") if config.use_next_sentence_label
                           else ("loss", "mlm_loss"))
        self._masking_vocab = None
        self._model = None  # kept for write_model_info

    # -------------------------------------------------------------------------- model

    def build_model(self) -> BertPretrainer:
        """Builds the encoder and the pretraining heads (MLM logits come out float32), and
        sets how the pretrainer computes from the config's speed switches."""
        c = self.config
        encoder = self.encoder_fn()
        self._check_encoder(encoder)
        num_labels = 2 if c.use_next_sentence_label else 0
        self._model = BertPretrainer(encoder, num_next_sentence_labels=num_labels,
                                     name="bert_pretrainer")
        self._model.execution = bert_pretrainer.Execution(
            skip_unweighted_predictions=c.skip_unweighted_predictions,
            pack_tokens=c.pack_tokens,
            mlm_projection_in_compute_dtype=c.mlm_projection_in_compute_dtype)
        return self._model

    def flops_counter(self, model: BertPretrainer):
        """Asks the pretrainer: it counts what it computed (`BertPretrainer.training_flops`)."""
        if not model.counts_flops:
            return None
        return lambda features, outputs: model.training_flops(self.model_inputs(features),
                                                              outputs)

    def _check_encoder(self, encoder) -> None:
        c = self.config
        if c.seq_length > encoder.max_sequence_length:
            raise UserError(f"PretrainingConfig.seq_length={c.seq_length} exceeds the encoder's "
                            f"max_sequence_length={encoder.max_sequence_length}; shorten the "
                            "data or enlarge build_encoder.max_sequence_length")
        if c.vocab_file is not None:
            size = len(load_vocab(c.vocab_file))
            if size != encoder.vocab_size:
                raise UserError(f"vocab {c.vocab_file} has {size} tokens but the encoder's "
                                f"vocab_size is {encoder.vocab_size}; set "
                                f"build_encoder.vocab_size = {size}")

    def model_inputs(self, features: dict) -> dict:
        """Encoder inputs plus the masked positions the MLM head gathers, and their weights
        (in training the pretrainer computes only the weighted ones)."""
        names = (*F.ENCODER_INPUTS, F.MASKED_LM_POSITIONS, F.MASKED_LM_WEIGHTS)
        return {name: features[name] for name in names if name in features}

    # -------------------------------------------------------------------------- input

    def global_batch_size(self, is_training: bool) -> int:
        c = self.config
        return c.train_batch_size if is_training else (c.eval_batch_size or c.train_batch_size)

    def build_inputs(self, split, input_context, *, is_training):
        """Batches from `train_data` or `eval_data` (see `Task.build_inputs`).

        Files are sharded over the input pipelines; each yields per-replica batches. The order
        is deterministic for `data_seed`, which exact resumption relies on.
        """
        c = self.config
        patterns = {self.train_split: c.train_data, self.eval_split: c.eval_data}
        if split not in patterns:
            raise UserError(f"pretraining has splits {sorted(patterns)}, not {split!r}")
        if not patterns[split]:
            flag = "--train_data" if split == self.train_split else "--eval_data"
            raise UserError(f"PretrainingConfig.{split}_data is not set; pass {flag}=GLOB "
                            "(files written by 'bert-train create_pretraining_data')")
        batch_size = self.global_batch_size(is_training)
        if input_context is not None:
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        return masked_lm_data.pretraining_dataset(
            patterns[split], seq_length=c.seq_length,
            max_predictions_per_seq=c.max_predictions_per_seq, vocab=self._vocab(),
            masking=c.masking, whole_word=c.whole_word_masking, masked_lm_prob=c.masked_lm_prob,
            use_next_sentence_label=c.use_next_sentence_label, options=PipelineOptions(
                batch_size=batch_size, is_training=is_training, input_context=input_context,
                shuffle_buffer=c.shuffle_buffer, seed=c.data_seed, deterministic=True))

    def _vocab(self) -> MaskingVocab | None:
        if self._masking_vocab is None and self.config.vocab_file is not None:
            tokenizer = Tokenizer(self.config.vocab_file, lower_case=self.config.lower_case)
            self._masking_vocab = MaskingVocab.from_tokenizer(tokenizer)
        return self._masking_vocab

    # -------------------------------------------------------------------- losses, metrics

    def build_losses(self, features, outputs):
        """Per-example losses, float32 [per_replica_batch] each (see the class docstring)."""
        weights = ops.cast(features[F.MASKED_LM_WEIGHTS], "float32")  # (batch, P)
        mlm = masked_lm_rows(features, outputs)
        xent = losses_lib.sparse_softmax_cross_entropy(mlm.labels, mlm.logits)  # (rows,)
        weighted_sum = ops.sum(mlm.to_slots(mlm.weights * xent, weights), axis=-1)  # (batch,)
        # Normalised per example, not by the whole batch's sum of weights as in
        # google-research/bert: a batch-wide denominator couples the replicas, while the
        # trainer's contract is a per-example loss averaged over the global batch. With ~15 %
        # of tokens masked the two differ little. max(., 1) keeps an example with no masked
        # position (a very short sequence) at 0 instead of 0 / 0.
        mlm_loss = weighted_sum / ops.maximum(ops.sum(weights, axis=-1), 1.0)
        losses = {"mlm_loss": mlm_loss, "loss": mlm_loss}
        if self.config.use_next_sentence_label:
            nsp_loss = keras.losses.sparse_categorical_crossentropy(
                features[F.NEXT_SENTENCE_LABELS],
                ops.cast(outputs[NEXT_SENTENCE_LOGITS], "float32"), from_logits=True)  # (batch,)
            losses.update(nsp_loss=nsp_loss, loss=mlm_loss + nsp_loss)
        return losses

    def build_metrics(self, training):
        del training  # the same metrics for training and evaluation
        # The weighted mean of "the label scored highest" (losses.label_is_top: no argmax).
        metrics = [keras.metrics.Mean(name="mlm_accuracy")]
        if self.config.use_next_sentence_label:
            metrics.append(keras.metrics.SparseCategoricalAccuracy(name="nsp_accuracy"))
        return metrics

    def update_metrics(self, metrics, features, outputs):
        mlm = masked_lm_rows(features, outputs)
        metrics[0].update_state(losses_lib.label_is_top(mlm.labels, mlm.logits),
                                sample_weight=mlm.weights)
        if self.config.use_next_sentence_label:
            metrics[1].update_state(features[F.NEXT_SENTENCE_LABELS],
                                    outputs[NEXT_SENTENCE_LOGITS])

    # ----------------------------------------------------------------- warm start, export

    def initialize(self, model: BertPretrainer, init_checkpoint) -> None:
        """Warm starts the encoder and whichever pretraining heads the checkpoint holds.

        Args:
          model: the model from `build_model`.
          init_checkpoint: an `interop.resolve.ResolvedCheckpoint` or a path to resolve.
        """
        checkpoint = init_checkpoint
        if self.checkpoint is not None and init_checkpoint == self.checkpoint.path:
            checkpoint = self.checkpoint  # resolved once, by the command
        checkpoint = resolve.as_resolved(checkpoint)
        report = checkpoint.load(encoder=model.encoder, masked_lm=model.masked_lm,
                                 next_sentence=model.next_sentence)
        logging.info("Warm start from %s: loaded %d variables, left %d initialized%s",
                     checkpoint.path, len(report["loaded"]), len(report["initialized"]),
                     f" ({', '.join(report['initialized'])})" if report["initialized"] else "")
        heads = [("masked-LM", model.masked_lm, "cls.predictions.*")]
        if model.next_sentence is not None:
            heads.append(("next-sentence", model.next_sentence, "cls.seq_relationship.*"))
        for line in head_lines(checkpoint.path, heads, report["loaded"], model.encoder):
            (logging.warning if line.endswith("fresh") else logging.info)(line)

    def _task_info(self) -> dict:
        c = self.config
        return {"name": self.name, "family": TASK_NAME, "seq_length": c.seq_length,
                "max_predictions_per_seq": c.max_predictions_per_seq,
                "use_next_sentence_label": c.use_next_sentence_label}

    def check_resume(self, model_dir: str) -> None:
        """Refuses a model_dir trained as another task, sequence length, number of
        predictions, encoder or vocabulary.

        A second phase at another sequence length is a new run that warm-starts from this one
        (--init_checkpoint=MODEL_DIR in a new --model_dir): a resume continues the same run.
        """
        if self._model is None:
            raise RuntimeError("check_resume called before build_model")
        encoder = self._model.encoder
        model_dir_lib.check_resume(
            model_dir, encoder_class=type(encoder).__name__, encoder_config=encoder.get_config(),
            vocab_file=self.config.vocab_file, lower_case=self.config.lower_case,
            task=self._task_info(),
            task_keys=("name", "family", "seq_length", "max_predictions_per_seq"))

    def write_model_info(self, model_dir: str) -> None:
        """Writes bert_train.json (encoder config, task) and copies the vocabulary."""
        if self._model is None:
            raise RuntimeError("write_model_info called before build_model")
        c = self.config
        model_dir_lib.write_model_info(model_dir, self._model.encoder, vocab_file=c.vocab_file,
                                       lower_case=c.lower_case, task=self._task_info())


@dataclasses.dataclass(frozen=True)
class MaskedLMRows:
    """The masked-LM predictions a pretrainer computed, as rows: the one form its loss and
    accuracy read, whether it computed every `[batch, P]` slot (`mlm_logits`) or only the
    weighted ones (`mlm_row_logits`, `mlm_rows`).

    Attributes:
        labels: int `[rows]` target ids.
        logits: float32 `[rows, vocab]`.
        weights: float32 `[rows]`.
        slots: int32 `[rows]`, each row's flat slot (`batch index * P + k`); None when the
            rows are every slot in order.
    """

    labels: tf.Tensor
    logits: tf.Tensor
    weights: tf.Tensor
    slots: tf.Tensor | None

    def to_slots(self, values, like):
        """`values` `[rows]` laid out as `like` `[batch, P]`; slots without a row get 0 (a
        prediction not computed is an unweighted one: it adds nothing)."""
        if self.slots is not None:
            values = tf.scatter_nd(self.slots[:, None], values, [tf.size(like)])
        return tf.reshape(values, tf.shape(like))


def masked_lm_rows(features, outputs) -> MaskedLMRows:
    """The `MaskedLMRows` of a batch's `features` and the pretrainer's `outputs`."""
    if MLM_ROW_LOGITS not in outputs:  # every slot: the rows are the flattened [batch, P]
        logits = outputs[MLM_LOGITS]
        return MaskedLMRows(tf.reshape(features[F.MASKED_LM_IDS], [-1]),
                            tf.reshape(logits, [-1, tf.shape(logits)[-1]]),
                            tf.reshape(tf.cast(features[F.MASKED_LM_WEIGHTS], tf.float32), [-1]),
                            None)
    rows = outputs[MLM_ROWS]

    def take(feature):
        return tf.gather(tf.reshape(features[feature], [-1]), rows)

    return MaskedLMRows(take(F.MASKED_LM_IDS), outputs[MLM_ROW_LOGITS],
                        tf.cast(take(F.MASKED_LM_WEIGHTS), tf.float32), rows)
