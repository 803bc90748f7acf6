"""Translation: a `Seq2SeqTransformer` around the task's encoder (or the course's GRU
translators, `TranslateConfig.architecture`), trained with teacher forcing.

Loss: cross-entropy with label smoothing (`TranslateConfig.label_smoothing`, 0.1 in the
recipe, as in the Transformer paper) over the target tokens. The trainer averages per-example
losses over the global batch, so an example's loss is the mean over its own target tokens
(the [SEP] included, the padding not): every pair weighs the same whatever its length, as
tagging's sentences do. Metrics: the loss and "token_accuracy" (the next token predicted
right, over the target tokens).

Evaluation also decodes every source in graph (`generation.seq2seq.translate`: beam search
with `eval_beam_size`, greedy with 1) and scores the translations, detokenized, against the
reference target texts with corpus BLEU (sacreBLEU, `metrics.bleu`); the best checkpoint is
kept by "bleu". With a lower-casing vocabulary the references are lower-cased and their
accents stripped as the tokenizer does, so BLEU scores what the vocabulary can write.

A warm start (`--init_checkpoint`) is BERT2BERT's (`interop.bert2bert`): the encoder and the
decoder's self-attention, feed-forward and embeddings from the checkpoint, cross-attention
fresh. The encoder's size (`configs/encoders`) applies to both halves.

Architectures (`ARCHITECTURES`): "transformer" (the default, around a BERT encoder), "gru" and
"gru_attention" (`models.GruTranslator` around a `GruEncoder`, `build_encoder.kind = "gru"`:
configs/translate/gru.gin and gru_attention.gin), which train from scratch.
"""

import dataclasses
import unicodedata

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer import features as F
from bert_trainer.encoders import GruEncoder
from bert_trainer.errors import UserError, require_positive_ints
from bert_trainer.interop.bert2bert import warm_start_seq2seq
from bert_trainer.metrics.bleu import corpus_bleu
from bert_trainer.models import GruTranslator, Seq2SeqTransformer
from bert_trainer.models import seq2seq_transformer as s2s
from bert_trainer.models.generation.seq2seq import translate
from bert_trainer.ops import label_is_top, smoothed_cross_entropy
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask
from bert_trainer.tasks.translate import data as translate_data

POSITION_ENCODINGS = ("learned", "sinusoidal")
GRU_ARCHITECTURES = {"gru": False, "gru_attention": True}  # name: with Bahdanau attention
ARCHITECTURES = ("transformer", *GRU_ARCHITECTURES)


@dataclasses.dataclass(frozen=True)
class TranslateConfig:
    """The model, loss and decoding options of translation (gin: `TranslateConfig.*`).

    Attributes:
      max_target_length: decoder length: a target keeps `max_target_length - 1` pieces (at
        most the encoder's max_sequence_length: both halves share the position range).
      label_smoothing: mass spread uniformly over the vocabulary in the loss.
      beam_size: beams of served translations (1: greedy).
      length_penalty: beam search's ((5 + length) / 6) ** alpha (GNMT's alpha).
      max_decode_length: longest translation in pieces; None: `max_target_length`.
      eval_beam_size: beams while evaluating (BLEU); None: `beam_size`.
      num_decoder_layers: decoder layers; None: the encoder's.
      position_encoding: the decoder's positions, "learned" or "sinusoidal".
      share_encoder_decoder: BERTShare: the decoder shares the encoder's layer weights.
      architecture: "transformer" (a `Seq2SeqTransformer` around a BERT encoder), "gru" or
        "gru_attention" (the course's `GruTranslator`, around `build_encoder.kind = "gru"`).
        The decoder options above are the Transformer's.
    """

    max_target_length: int = 64
    label_smoothing: float = 0.1
    beam_size: int = 4
    length_penalty: float = 0.6
    max_decode_length: int | None = None
    eval_beam_size: int | None = None
    num_decoder_layers: int | None = None
    position_encoding: str = "learned"
    share_encoder_decoder: bool = False
    architecture: str = "transformer"

    def __post_init__(self):
        require_positive_ints(self, ("max_target_length", "beam_size"),
                              prefix="TranslateConfig.")
        for name in ("max_decode_length", "eval_beam_size", "num_decoder_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(f"TranslateConfig.{name}={value} must be a positive integer "
                                "(or None)")
        if self.max_target_length < 2:
            raise UserError(f"TranslateConfig.max_target_length={self.max_target_length} must "
                            "be >= 2 (a target piece and [SEP])")
        if not 0 <= self.label_smoothing < 1:
            raise UserError(f"TranslateConfig.label_smoothing={self.label_smoothing} must be in "
                            "[0, 1)")
        if self.position_encoding not in POSITION_ENCODINGS:
            raise UserError(f"TranslateConfig.position_encoding={self.position_encoding!r}: "
                            f"choose one of {', '.join(POSITION_ENCODINGS)}")
        if self.architecture not in ARCHITECTURES:
            raise UserError(f"TranslateConfig.architecture={self.architecture!r}: choose one of "
                            f"{', '.join(ARCHITECTURES)}")
        if self.decode_length > self.max_target_length:
            raise UserError(f"TranslateConfig.max_decode_length={self.max_decode_length} "
                            f"exceeds max_target_length={self.max_target_length} (the "
                            "decoder's positions); lower it or raise max_target_length")

    @property
    def decode_length(self) -> int:
        """Pieces decoded at most."""
        return self.max_decode_length or self.max_target_length

    @property
    def eval_beams(self) -> int:
        return self.eval_beam_size or self.beam_size


def architecture_mismatch(architecture: str, encoder_name: str) -> str | None:
    """Why `architecture` cannot be built around an encoder of class `encoder_name` (None if
    it can): the GRU translators need a `GruEncoder`, the Transformer a BERT encoder."""
    gru = encoder_name == GruEncoder.__name__
    if architecture in GRU_ARCHITECTURES and not gru:
        return (f"TranslateConfig.architecture={architecture!r} is the course's GRU translator, "
                f"built from scratch around a GruEncoder, not a {encoder_name}: use "
                f"configs/translate/{architecture}.gin (build_encoder.kind = 'gru') without "
                "--init_checkpoint")
    if architecture not in GRU_ARCHITECTURES and gru:
        return (f"a GruEncoder (build_encoder.kind = 'gru') translates with "
                f"TranslateConfig.architecture 'gru' or 'gru_attention', not {architecture!r}")
    return None


def build_model(encoder: keras.Model, config: TranslateConfig) -> keras.Model:
    """The model of `config.architecture` around `encoder`: a `Seq2SeqTransformer` (shared,
    tied embeddings) or a `GruTranslator`.

    Raises:
      UserError: `max_target_length` exceeds the encoder's positions, or the encoder does
        not suit the architecture.
    """
    limit = encoder.max_sequence_length
    if config.max_target_length > limit:
        raise UserError(f"TranslateConfig.max_target_length={config.max_target_length} exceeds "
                        f"the model's max_sequence_length={limit} (the decoder has the "
                        f"encoder's positions); use max_target_length <= {limit}")
    mismatch = architecture_mismatch(config.architecture, type(encoder).__name__)
    if mismatch:
        raise UserError(mismatch)
    try:
        if config.architecture in GRU_ARCHITECTURES:
            model = GruTranslator(encoder, attention=GRU_ARCHITECTURES[config.architecture],
                                  max_target_length=config.max_target_length,
                                  name="gru_translator")
        else:
            model = Seq2SeqTransformer(
                encoder, num_decoder_layers=config.num_decoder_layers, share_embeddings=True,
                position_encoding=config.position_encoding,
                max_target_length=config.max_target_length,
                share_encoder_decoder=config.share_encoder_decoder, name="seq2seq_transformer")
    except ValueError as e:  # options that do not fit the encoder (e.g. BERTShare's layers)
        raise UserError(f"TranslateConfig: {e}") from None
    if not model.built:  # Every variable must exist for the optimizer and the checkpoint.
        ids = np.ones((1, 2), np.int32)
        model({F.INPUT_WORD_IDS: ids, F.INPUT_MASK: ids, F.INPUT_TYPE_IDS: 0 * ids,
               F.DECODER_INPUT_IDS: ids}, training=False)
    return model


def _token_rows(features, outputs):
    """`(labels [n], logits [n, vocab] float32, example row [n] int32, batch size)` of the
    real target tokens, from either form of the model's outputs."""
    batch = tf.shape(features[F.TARGET_IDS])[0]
    if s2s.TARGET_LOGITS in outputs:
        return (outputs[s2s.TARGET_LABELS], outputs[s2s.TARGET_LOGITS],
                outputs[s2s.TARGET_ROWS], batch)
    targets = features[F.TARGET_IDS]
    where = tf.where(tf.not_equal(targets, 0))
    logits = tf.gather_nd(tf.cast(outputs[F.LOGITS], tf.float32), where)
    return (tf.cast(tf.gather_nd(targets, where), tf.int32), logits,
            tf.cast(where[:, 0], tf.int32), batch)


def text_like_vocabulary(text: str, lower_case: bool) -> str:
    """A reference text as a lower-casing tokenizer writes it (lower-cased, no accents)."""
    if not lower_case:
        return text
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn")


class TranslationTask(FinetuningTask):
    """Sequence-to-sequence translation (see the module docstring).

    Args:
      task_data: a "translate" `TaskData`.
      encoder, config, data: see `FinetuningTask`.
      translate: model, loss and decoding options (None: the defaults).
    """

    family = "translate"
    best_metric = "bleu"

    def __init__(self, task_data, encoder: EncoderSpec, *,
                 config: FinetuneConfig | None = None, data: DataConfig | None = None,
                 translate: TranslateConfig | None = None):
        # The architecture first: a mismatched encoder also brings another vocabulary.
        self.translate = translate or TranslateConfig()
        architecture = self.translate.architecture
        mismatch = architecture_mismatch(architecture, encoder.registered_name.rpartition(">")[2])
        if mismatch:
            raise UserError(mismatch)
        if architecture in GRU_ARCHITECTURES and encoder.checkpoint is not None:
            raise UserError(f"TranslateConfig.architecture={architecture!r} trains from scratch: "
                            f"--init_checkpoint warm-starts the Transformer only (BERT2BERT); "
                            "drop it (to continue a GRU run, pass its --model_dir again)")
        super().__init__(task_data, encoder, config=config, data=data)
        limit = encoder.max_sequence_length
        if self.translate.max_target_length > limit:
            raise UserError(f"TranslateConfig.max_target_length="
                            f"{self.translate.max_target_length} exceeds the encoder's "
                            f"max_sequence_length={limit} ({encoder.source}); use "
                            f"max_target_length <= {limit}")
        self._references = None

    def build_head_model(self, encoder):
        return self.head_model(encoder, config=self.translate)

    @classmethod
    def head_model(cls, encoder, *, config: TranslateConfig):
        return build_model(encoder, config)

    def model_inputs(self, features):
        # With the target ids the model projects only the real target tokens on the vocabulary.
        return {name: features[name]
                for name in (*F.ENCODER_INPUTS, F.DECODER_INPUT_IDS, F.TARGET_IDS)}

    def build_inputs(self, split, input_context, *, is_training):
        return translate_data.translate_dataset(
            self.raw_examples(split), self.tokenizer, seq_length=self.config.seq_length,
            max_target_length=self.translate.max_target_length,
            options=self.pipeline_options(is_training, input_context))

    def build_losses(self, features, outputs):
        """Per example: the mean label-smoothed cross-entropy over its target tokens.

        `outputs` are the model's real-token rows (`TARGET_LOGITS`, ...) or full `logits`
        `[batch, t, vocab]` (with the features' `target_ids`, 0 = padding).
        """
        labels, logits, rows, batch = _token_rows(features, outputs)
        xent = smoothed_cross_entropy(labels, logits, self.translate.label_smoothing)
        total = tf.math.unsorted_segment_sum(xent, rows, batch)
        count = tf.math.unsorted_segment_sum(tf.ones_like(xent), rows, batch)
        return {"loss": total / tf.maximum(count, 1.0)}

    def build_metrics(self, training):
        # Pairs cut to seq_length / max_target_length, counted: no silent truncation.
        return [keras.metrics.Mean(name="token_accuracy"), keras.metrics.Sum(name="cut_pairs")]

    def update_metrics(self, metrics, features, outputs):
        labels, logits, _, _ = _token_rows(features, outputs)
        metrics[0].update_state(label_is_top(labels, logits))
        if translate_data.CUT in features:
            metrics[1].update_state(tf.cast(features[translate_data.CUT], tf.float32))

    def eval_step_outputs(self, features, outputs):
        decoded = translate(
            self.model, {name: features[name] for name in F.ENCODER_INPUTS},
            beam_size=self.translate.eval_beams, length_penalty=self.translate.length_penalty,
            max_decode_length=self.translate.decode_length, start_id=self.tokenizer.cls_id,
            # In the trainer's replica function, under any strategy: the graph loop (XLA
            # there is TrainerConfig.jit_compile's choice).
            end_id=self.tokenizer.sep_id, jit_compile=False)
        return {F.DECODED_IDS: decoded[F.DECODED_IDS],
                translate_data.EXAMPLE_INDEX: features[translate_data.EXAMPLE_INDEX]}

    def references(self) -> list[str]:
        """The evaluation split's target texts, in order (read once)."""
        if self._references is None:
            raw = self.raw_examples(self.eval_split)
            self._references = [row[translate_data.TARGET].decode("utf-8")
                                for row in raw.as_numpy_iterator()]
        return self._references

    def aggregate_eval(self, gathered):
        """Corpus BLEU of the decoded translations against the reference texts."""
        if F.DECODED_IDS not in gathered or not np.size(gathered[translate_data.EXAMPLE_INDEX]):
            return {}
        hypotheses = [t.decode("utf-8") for t in
                      self.tokenizer.detokenize(gathered[F.DECODED_IDS]).numpy()]
        references = self.references()
        lower = self.tokenizer.lower_case
        refs = [text_like_vocabulary(references[int(i)], lower)
                for i in gathered[translate_data.EXAMPLE_INDEX]]
        bleu = corpus_bleu(hypotheses, refs)
        logging.info("BLEU %.2f on %d pairs; e.g. %r -> %r", bleu.score, len(refs),
                     refs[0], hypotheses[0])
        return {"bleu": float(bleu.score), "num_examples": float(len(refs))}

    def initialize(self, model, init_checkpoint):
        """BERT2BERT warm start: see `interop.bert2bert.warm_start_seq2seq`."""
        checkpoint = self._resolved(init_checkpoint)
        report = warm_start_seq2seq(model, checkpoint,
                                    share=self.translate.share_encoder_decoder)
        logging.info("Warm start from %s: loaded %d variables; left initialized: %d %s",
                     checkpoint.path, len(report["loaded"]), len(report["initialized"]),
                     report["initialized"])
        self.warm_start_report = {"loaded": list(report["loaded"]),
                                  "initialized": list(report["initialized"])}

    def task_info(self) -> dict:
        return {**super().task_info(), "translate": dataclasses.asdict(self.translate)}
