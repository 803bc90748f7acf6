"""Translation on raw text: source strings in, translated strings and their scores out.

The source is tokenized and packed as in fine-tuning (`data.source_features`, cut to
`seq_length`), decoded in graph (`generation.seq2seq.translate`: beam search with the
key/value cache, greedy when `beam_size` is 1) and detokenized (`Tokenizer.detokenize`), so an
export runs with tensorflow and tensorflow-text only.
"""

import tensorflow as tf

from bert_trainer import features
from bert_trainer.models.generation.seq2seq import translate
from bert_trainer.serving import (
    ENCODE,
    SERVING_DEFAULT,
    TaskServing,
    padding_counts,
    text_input_spec,
)
from bert_trainer.tasks.translate.data import source_cut

INPUT, TRANSLATION, SCORE = "input", "translation", "score"
TRUNCATED = "truncated"  # bool [b]: the source was cut to seq_length before translating


class TranslateServing(TaskServing):
    """`serving_default(input [b] string)` -> translation string [b], score float32 [b],
    truncated bool [b] (the source was cut to `seq_length`), input_tokens and padding_tokens
    int32 [b] of the sources (`serving.padding_counts`: padded to the batch's longest).

    Args:
      model: a `Seq2SeqTransformer`.
      beam_size: beams (1: greedy).
      length_penalty: beam search's length penalty alpha.
      max_decode_length: longest translation in pieces.
      **kwargs: `ServingModule` arguments (vocab_file, lower_case, seq_length).

    The score is the best hypothesis' log-probability with the length penalty applied. Besides
    `serving_default`, the export has the encoder's `encode` signature.

    Attributes:
      jit_compile: run the decoding loop compiled with XLA (`translate`'s jit_compile), which
        on a CPU about doubles the tokens/s. False by default: an export stays servable by
        any TensorFlow runtime; `bert-train predict --model_dir` sets it before the first
        trace.
    """

    family = "translate"
    jit_compile = False

    def __init__(self, model, *, beam_size: int = 4, length_penalty: float = 0.6,
                 max_decode_length: int = 64, **kwargs):
        super().__init__(model, **kwargs)
        self.beam_size = int(beam_size)
        self.length_penalty = float(length_penalty)
        self.max_decode_length = int(max_decode_length)

    def _text_spec(self):
        return self._translate, [text_input_spec(INPUT)]

    def _specs(self) -> dict:
        # No serving_ids: the model also reads decoder inputs; `encode` is the encoder's.
        return {SERVING_DEFAULT: self._text_spec(), ENCODE: (self._encode,
                                                             super()._specs()[ENCODE][1])}

    def _translate(self, input):  # noqa: A002 (the signature's input name: predict calls by it)
        pieces = self.tokenizer.tokenize(input)
        inputs = self.pack([pieces])  # as data.source_features, to the batch's longest
        decoded = translate(
            self.model, inputs, beam_size=self.beam_size, length_penalty=self.length_penalty,
            max_decode_length=self.max_decode_length, start_id=self.tokenizer.cls_id,
            end_id=self.tokenizer.sep_id, jit_compile=self.jit_compile)
        return {TRANSLATION: self.tokenizer.detokenize(decoded[features.DECODED_IDS]),
                SCORE: tf.cast(decoded[features.DECODED_SCORES], tf.float32),
                TRUNCATED: source_cut(pieces, self.seq_length),
                **padding_counts(inputs[features.INPUT_MASK])}
