"""Serving modules: a model, its in-graph tokenizer and post-processing as `tf.function`s.

A `ServingModule` is a `tf.Module` (model, tokenizer, vocabulary asset) with one
`tf.function` per signature (`function(name)`, `signatures()`); the same functions serve
in-process, so `bert-train predict --model_dir` and a loaded export run one code path.
Each task family subclasses `TaskServing` in its own package
(`bert_trainer/tasks/<family>/serving.py`) and reuses its training pipeline's code to
tokenize and pack, so a served text is encoded exactly as in fine-tuning. A text longer than
`seq_length` is windowed as the fine-tuning evaluation windows it (`data/windows.py`) and its
windows' outputs are combined in graph, unless the model was trained with
FinetuneConfig.long_texts = "truncate".

The tokenizer is tensorflow-text's `FastBertTokenizer` built from the model directory's
`vocab.txt`; the same file is stored as the asset `assets/vocab.txt`, so an export carries
the vocabulary its graph was built from.
"""

import functools

import tensorflow as tf

from bert_trainer import features, ops
from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.features import LOGITS

# Signature names.
SERVING_DEFAULT = "serving_default"  # raw text in, answers out
SERVING_IDS = "serving_ids"          # encoder inputs in, the task model's raw outputs out
ENCODE = "encode"                    # encoder inputs in, encoder outputs out

# Text signature inputs and outputs several families share.
TEXT, TEXT_B = "text", "text_b"
SCORE = "score"
# What the text signatures padded (every family returns both, int32 [b]): the real token
# slots ([CLS], pieces, [SEP]) of each input's model rows, and their [PAD] slots. A batch is
# padded to its longest row only (`ServingModule.pad_to_longest`).
INPUT_TOKENS, PADDING_TOKENS = "input_tokens", "padding_tokens"


def padding_counts(mask, example=None, count=None) -> dict:
    """INPUT_TOKENS and PADDING_TOKENS int32 [b] of the model rows an input ran as.

    Args:
      mask: int [rows, width], 1 at the real tokens of each row the model computed.
      example: int [rows] the input of each row (windows); None: row i is input i.
      count: int scalar, the number of inputs b (with `example`).

    Returns:
      {INPUT_TOKENS, PADDING_TOKENS}: int32 [b].
    """
    mask = tf.cast(mask, tf.int32)
    real = tf.reduce_sum(mask, axis=1)  # (rows,)
    padding = tf.shape(mask)[1] - real
    if example is not None:
        real = tf.math.unsorted_segment_sum(real, example, count)
        padding = tf.math.unsorted_segment_sum(padding, example, count)
    return {INPUT_TOKENS: real, PADDING_TOKENS: padding}


def byte_to_char(text: tf.Tensor, byte_offsets: tf.RaggedTensor) -> tf.RaggedTensor:
    """Converts UTF-8 byte offsets into code point (Python `str`) offsets.

    Args:
      text: string [batch].
      byte_offsets: int64 RaggedTensor [batch, (n)] of offsets on character boundaries of the
        matching text (a token's start, or its exclusive end).

    Returns:
      int64 RaggedTensor [batch, (n)]: the number of characters before each offset.
    """
    _, char_starts = tf.strings.unicode_decode_with_offsets(text, "UTF-8")  # (batch, (chars))
    # The characters starting before an offset are the characters before it; padding with
    # int64 max keeps padding out of the count. The extra columns keep both inner sizes
    # non-zero, which searchsorted needs (an empty batch, or texts without characters).
    never = tf.int64.max
    starts = tf.pad(char_starts.to_tensor(default_value=never), [[0, 0], [0, 1]],
                    constant_values=never)  # (batch, max_chars + 1)
    offsets = tf.pad(byte_offsets.to_tensor(default_value=0), [[0, 0], [0, 1]])  # (b, n + 1)
    chars = tf.searchsorted(starts, offsets, side="left", out_type=tf.int64)
    return tf.RaggedTensor.from_tensor(chars, lengths=byte_offsets.row_lengths())


def _tensorflow_ops_only(fn):
    """`fn`, traced with TensorFlow's own ops and no data-dependent shapes
    (`ops.portable()`): a SavedModel must load and serve without bert-train's fused CPU
    kernels, on any device."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with ops.portable():
            return fn(*args, **kwargs)

    return traced


def _fastest_ops(fn):
    """`fn`, traced with the fused kernels and token packing where this process has them
    (as `BERT_TRAIN_FUSED_KERNELS` says, "auto" by default): for a module that serves
    in-process, never saved."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with ops.fused_kernels():
            return fn(*args, **kwargs)

    return traced


class _Functions:
    """A plain holder of a module's tf.functions (see `ServingModule.__init__`)."""

    def __init__(self):
        self.cache = {}


def text_input_spec(name: str) -> tf.TensorSpec:
    return tf.TensorSpec([None], tf.string, name=name)


def _ids_spec():
    return [tf.TensorSpec([None, None], tf.int32, name=name) for name in features.ENCODER_INPUTS]


class ServingModule(tf.Module):
    """A model with its tokenizer; subclasses add the text signature `serving_default`.

    Args:
      model: a task model (it has `encoder`) or an encoder.
      vocab_file: the model's `vocab.txt`; stored as the asset `assets/vocab.txt`.
      lower_case: lower-case and strip accents before WordPiece (as in training).
      seq_length: packed length of the text signatures; at most the encoder's
        `max_sequence_length`.

    Attributes:
      model, encoder, seq_length, lower_case: as given (`encoder` is `model.encoder`).
      vocab_file: `tf.saved_model.Asset` of the vocabulary.
      tokenizer: the `Tokenizer` (`FastBertTokenizer`) built from it.
      pad_to_longest: the text signatures pad a batch to its longest packed row, not to
        `seq_length` (the same answers, fewer FLOPs); False pads to `seq_length`. Set before
        the first trace.
      portable: trace with TensorFlow's own ops and static padding rules (`ops.portable()`),
        what a SavedModel must hold. False (set before the first trace, never for a module
        that is saved) traces with the fused kernels and token packing where this process
        has them: `bert-train predict --model_dir` serves that way.

    `function(name)` is the tf.function of a signature, e.g. `function("encode")`:
    (input_word_ids, input_mask, input_type_ids int32 [b, s]) -> {sequence_output float32
    [b, s, h], pooled_output float32 [b, h]}.
    """

    family = "encoder"
    pad_to_longest = True
    portable = True

    def __init__(self, model, *, vocab_file: str, lower_case: bool, seq_length: int,
                 name: str | None = None):
        super().__init__(name=name)
        self.model = model
        self.encoder = getattr(model, "encoder", model)
        limit = self.encoder.max_sequence_length
        if not 2 < int(seq_length) <= limit:
            raise UserError(f"seq_length={seq_length} must be in [3, {limit}] (the encoder's "
                            "max_sequence_length); pass a smaller --seq_length")
        self.seq_length = int(seq_length)
        self.lower_case = bool(lower_case)
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.tokenizer = Tokenizer(vocab_file, lower_case=lower_case)
        # The tf.functions live in a plain object, not in attributes: SavedModel saves every
        # tf.function attribute besides the signatures and retraces each in its save context,
        # which doubles the export time for functions that only the signatures need.
        self._functions = _Functions()

    def _specs(self) -> dict:
        """{signature name: (Python function, input signature)}."""
        return {ENCODE: (self._encode, _ids_spec())}

    def function(self, name: str):
        """The tf.function of signature `name` (traced once, then cached)."""
        cache = self._functions.cache
        if name not in cache:
            fn, spec = self._specs()[name]
            wrap = _tensorflow_ops_only if self.portable else _fastest_ops
            cache[name] = tf.function(wrap(fn), input_signature=spec)
        return cache[name]

    def pack(self, segments) -> dict:
        """`Tokenizer.pack` of the text signatures: `[CLS] A [SEP] (B [SEP])` at most
        `seq_length` long, padded to the batch's longest row (`pad_to_longest`)."""
        return self.tokenizer.pack(segments, self.seq_length, pad_to_longest=self.pad_to_longest)

    def _encode(self, input_word_ids, input_mask, input_type_ids):
        outputs = self.encoder({features.INPUT_WORD_IDS: input_word_ids,
                                features.INPUT_MASK: input_mask,
                                features.INPUT_TYPE_IDS: input_type_ids}, training=False)
        return {name: tf.cast(outputs[name], tf.float32)
                for name in (features.SEQUENCE_OUTPUT, features.POOLED_OUTPUT)}

    def _task_outputs(self, input_word_ids, input_mask, input_type_ids) -> dict:
        """The task model's raw outputs as float32 (`serving_ids`)."""
        outputs = self.model({features.INPUT_WORD_IDS: input_word_ids,
                              features.INPUT_MASK: input_mask,
                              features.INPUT_TYPE_IDS: input_type_ids}, training=False)
        return {name: tf.cast(value, tf.float32) for name, value in outputs.items()}

    def _run_model(self, inputs: dict) -> dict:
        return self._task_outputs(*(inputs[name] for name in features.ENCODER_INPUTS))

    def signatures(self) -> dict:
        """{signature name: concrete function} to pass to `tf.saved_model.save`."""
        return {name: self.function(name).get_concrete_function() for name in self._specs()}


class EncoderServing(ServingModule):
    """A bare encoder (a pretraining model directory): the `encode` signature only."""


class TaskServing(ServingModule):
    """A task model: `serving_ids` (raw outputs) besides `encode`; subclasses add text.

    Attributes:
      max_windows_per_call: window rows per model call when texts are windowed (set before
        the first call traces the function).
    """

    # A batch of long texts can hold thousands of windows: running them in slices bounds the
    # activations' memory by the slice rather than by the batch.
    max_windows_per_call = 256

    def _run_windows(self, inputs: dict, element_shape) -> tf.Tensor:
        """The LOGITS (float32) of window rows, `max_windows_per_call` rows per model call.

        Args:
          inputs: features.ENCODER_INPUTS int32 [W, seq].
          element_shape: the logits' shape with None rows, e.g. [None, classes].

        Returns:
          float32 [W, ...].
        """
        size = int(self.max_windows_per_call)
        rows = tf.shape(inputs[features.INPUT_WORD_IDS])[0]
        calls = (rows + size - 1) // size

        def run(i, done):
            part = {name: inputs[name][i * size:(i + 1) * size]
                    for name in features.ENCODER_INPUTS}
            return i + 1, done.write(i, self._run_model(part)[LOGITS])

        done = tf.TensorArray(tf.float32, size=calls, infer_shape=False,
                              element_shape=tf.TensorShape(element_shape))
        _, done = tf.while_loop(lambda i, _: i < calls, run, (tf.constant(0), done))
        return done.concat()

    def _text_spec(self) -> tuple:
        """(Python function, input signature) of `serving_default`."""
        raise NotImplementedError

    def _specs(self) -> dict:
        return {SERVING_DEFAULT: self._text_spec(),
                SERVING_IDS: (self._task_outputs, _ids_spec()), **super()._specs()}

    def text_function(self):
        """The raw-text tf.function (`serving_default`), e.g. `text_function()(text=...)`."""
        return self.function(SERVING_DEFAULT)
