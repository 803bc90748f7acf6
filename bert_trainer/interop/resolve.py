"""A checkpoint resolved once: its format, the encoder it fits, its vocabulary and its loader.

`resolve_checkpoint(path)` is the one place that tells the checkpoint formats apart; each
answers the `ResolvedCheckpoint` protocol (`build_encoder`, `load`, `restore_model`,
`read_reference`) with a class of its own:

    bert_train     BertTrainCheckpoint: a bert-train model directory (bert_train.json), or a
                   checkpoint prefix in one
    hf, tf1        ReferenceCheckpoint: a Hugging Face BERT directory (config.json +
                   model.safetensors) or a Google one (bert_config.json + bert_model.ckpt.*)
    gpt2           GPT2Checkpoint: a Hugging Face GPT-2 directory (the same files, model_type
                   "gpt2"): a `CausalLM`, no WordPiece vocabulary (`interop.gpt2`)
    tf_checkpoint  TFCheckpoint: any other TensorFlow checkpoint (a prefix, or a directory of
                   checkpoints): no encoder config, no vocabulary; its variables are matched
                   by name (`bert_trainer.checkpoints.layout`)

A command resolves its `--init_checkpoint` once and passes the result along: the encoder spec
reads its config and vocabulary, and the warm start calls its `load` (or `restore_model`).
Resolving reads only the small files (config, vocabulary, model info); the weights are read
by `load`, once per warm start, and not held afterwards (a resumed run never reads them).
"""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_trainer.checkpoints import layout, select
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, gpt2, hf, pretrained, tf1

TF_CHECKPOINT = "tf_checkpoint"

# Arguments that change no weight shape, so they may differ from the checkpoint's.
OVERRIDABLE = ("output_dropout", "attention_dropout", "output_range", "dtype", "name")
# The sizes a warm start's encoder must share with a Hugging Face / Google checkpoint.
_ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "inner_dim",
                 "max_sequence_length", "type_vocab_size", "inner_activation")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResolvedCheckpoint:
    """What `resolve_checkpoint` found at a path: one subclass per format, one protocol.

    Attributes:
      path: the path as given (named in messages).
      format: one of `formats.FORMATS` or TF_CHECKPOINT.
      directory: the directory that holds it.
      registered_name: the encoder's Keras registered name (None: no encoder config).
      encoder_config: the encoder's `get_config()`-style arguments (None: no encoder config).
      vocab_file: absolute path of its WordPiece vocabulary, or None.
      lower_case: whether that vocabulary expects lower-cased text.
    """

    path: str
    format: str
    directory: str
    registered_name: str | None = None
    encoder_config: dict | None = None
    vocab_file: str | None = None
    lower_case: bool = True
    # Whether the checkpoint says which model to build (a pretraining warm start then takes
    # its architecture instead of the gin-configured one).
    fixes_architecture = False

    @property
    def encoder_class(self) -> str | None:
        return self.registered_name.rpartition(">")[2] if self.registered_name else None

    def build_encoder(self, **overrides) -> keras.Model:
        """A freshly initialized encoder of this checkpoint's architecture (no weights loaded).

        Args:
          **overrides: constructor arguments that change no weight shape (OVERRIDABLE).
        """
        _check_overrides(overrides, self.path)
        return self._build(overrides)

    def _build(self, overrides: dict) -> keras.Model:
        raise UserError(f"{self.path} holds no encoder config (no {formats.MODEL_INFO_FILE}); "
                        "pass a bert-train model directory")

    def load(self, *, encoder: keras.Model, masked_lm=None, next_sentence=None) -> dict:
        """Warm-starts a built encoder (and heads) from this checkpoint.

        Returns:
          {"loaded": variable paths restored, "initialized": variable paths left as they were}.

        Raises:
          UserError: the checkpoint does not fit (another architecture, no encoder weights).
        """
        raise NotImplementedError

    def restore_model(self, model: keras.Model) -> None:
        """Restores every weight of a whole model (a warm start of the same task's model).

        Raises:
          UserError: a checkpoint of an encoder only, or a weight the checkpoint lacks or
            whose shape differs.
        """
        raise NotImplementedError

    def read_reference(self) -> formats.BertCheckpoint:
        """Reads (and validates) a Hugging Face / Google checkpoint's weights, every call.

        Raises:
          UserError: a checkpoint of another format (it has no reference layout to read), or
            weights, config and vocabulary that do not fit each other.
        """
        raise UserError(f"{self.path} is a {self.format} checkpoint, not a Hugging Face or "
                        "Google one; load it with bert_trainer.interop.from_pretrained")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TFCheckpoint(ResolvedCheckpoint):
    """A TensorFlow checkpoint in the bert-train layout, read by variable name.

    Attributes:
      prefix: the checkpoint prefix when one was given (None: the latest usable one of
        `directory`, looked up when loading).
    """

    prefix: str | None = None

    def _prefix(self) -> str:
        return self.prefix or select.select_checkpoint(None, self.directory,
                                                       flag="--init_checkpoint")

    def load(self, *, encoder: keras.Model, masked_lm=None, next_sentence=None) -> dict:
        report = model_dir_lib.restore_pretrained(
            self._prefix(), encoder=encoder, masked_lm=masked_lm, next_sentence=next_sentence)
        _require_finite((encoder, masked_lm, next_sentence), self.path)
        return report

    def restore_model(self, model: keras.Model) -> None:
        prefix = self._prefix()
        layout.restore_model(model, prefix)
        _require_finite((model,), prefix)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertTrainCheckpoint(TFCheckpoint):
    """A bert-train model directory (or a prefix in one); `info` is its bert_train.json."""

    info: model_dir_lib.ModelInfo = dataclasses.field(repr=False)
    fixes_architecture = True

    def _build(self, overrides: dict) -> keras.Model:
        config = {**self.info.encoder_config, **overrides}
        return model_dir_lib.build_encoder(dataclasses.replace(self.info, encoder_config=config))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceCheckpoint(ResolvedCheckpoint):
    """A Hugging Face or Google TF1 BERT directory, read in the reference (Google) layout.

    Attributes:
      bert_config: its architecture.
      allow_pickle: a Hugging Face pytorch_model.bin may be read (needs torch).
    """

    bert_config: formats.BertConfig
    allow_pickle: bool = False
    fixes_architecture = True  # its config.json / bert_config.json

    def _build(self, overrides: dict) -> keras.Model:
        return pretrained.encoder_from_config(self.bert_config, **overrides)

    def load(self, *, encoder: keras.Model, masked_lm=None, next_sentence=None) -> dict:
        return _assign(self.read_reference(), encoder=encoder, masked_lm=masked_lm,
                       next_sentence=next_sentence)

    def restore_model(self, model: keras.Model) -> None:
        raise UserError(f"{self.path} is a {self.format} checkpoint of an encoder, not of "
                        "this model; warm-start a fine-tuning or pretraining task from it")

    def read_reference(self) -> formats.BertCheckpoint:
        if self.format == formats.HF:
            return hf.read_hf(self.directory, allow_pickle=self.allow_pickle)
        return tf1.read_tf1(self.directory)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT2Checkpoint(ResolvedCheckpoint):
    """A Hugging Face GPT-2 directory: a whole `CausalLM`, no WordPiece vocabulary.

    Attributes:
      gpt2_config: its architecture.
      allow_pickle: a pytorch_model.bin may be read (needs torch).
    """

    gpt2_config: gpt2.GPT2Config
    allow_pickle: bool = False
    fixes_architecture = True

    def _build(self, overrides: dict) -> keras.Model:
        return gpt2.build_model(self.gpt2_config, **overrides)

    def load(self, *, encoder: keras.Model, masked_lm=None, next_sentence=None) -> dict:
        if masked_lm is not None or next_sentence is not None:
            raise UserError(f"{self.path} is a GPT-2 (causal LM) checkpoint; it warm-starts "
                            "the causal_lm objective, not masked-LM pretraining")
        return self._read_into(encoder)

    def restore_model(self, model: keras.Model) -> None:
        self._read_into(model)  # a whole CausalLM: every weight is loaded

    def _read_into(self, model: keras.Model) -> dict:
        """Loads the weights into a CausalLM (read every call, not held)."""
        ckpt = gpt2.read_gpt2(self.directory, allow_pickle=self.allow_pickle)
        report = gpt2.load_weights(model, ckpt)
        logging.info("GPT-2 weights from %s: %d variables loaded (skipped %s)",
                     ckpt.weights_file, len(report["loaded"]),
                     ", ".join(ckpt.skipped) or "nothing")
        return report

    def read_reference(self) -> formats.BertCheckpoint:
        raise UserError(f"{self.path} is a GPT-2 checkpoint, not a BERT one; load it with "
                        "bert_trainer.interop.gpt2.from_gpt2")


def resolve_checkpoint(path: str, *, flag: str | None = None, allow_pickle: bool = False,
                       any_tf_checkpoint: bool = False) -> ResolvedCheckpoint:
    """Detects the format of `path` and reads what it says about the encoder, once.

    Args:
      path: a bert-train model directory or a checkpoint prefix in one, a Hugging Face or a
        Google BERT directory (or, with `any_tf_checkpoint`, any TensorFlow checkpoint).
      flag: the flag named in error messages, e.g. "--init_checkpoint" (None: the path alone).
      allow_pickle: accept a Hugging Face pytorch_model.bin (needs torch).
      any_tf_checkpoint: also accept a TensorFlow checkpoint without model info (the
        trainer's warm start of a whole model); its errors then speak of prefixes.

    Returns:
      A `ResolvedCheckpoint`.

    Raises:
      UserError: nothing at `path`, an unknown layout, or files that do not fit each other.
    """
    if tf.io.gfile.exists(path + ".index"):  # A prefix: its directory says what it is.
        directory = os.path.dirname(path) or "."
        if os.path.isfile(os.path.join(directory, formats.MODEL_INFO_FILE)):
            return _bert_train(path, directory, prefix=path)
        if os.path.isfile(os.path.join(directory, formats.TF1_CONFIG)):
            flag = flag or "--init_checkpoint"
            raise UserError(f"{flag}={path}: a Google BERT checkpoint is read from its "
                            f"directory; pass {flag}={directory}")
        if any_tf_checkpoint:
            return TFCheckpoint(path=path, format=TF_CHECKPOINT, directory=directory,
                                prefix=path)
        formats.detect_format(directory)  # Raises: an unknown layout, named.
    if any_tf_checkpoint and not _known_layout(path):
        prefix = select.select_checkpoint(None, path, flag=flag or "--init_checkpoint")
        return TFCheckpoint(path=path, format=TF_CHECKPOINT, directory=os.path.dirname(prefix),
                            prefix=prefix)
    if flag is not None and not os.path.exists(path):
        raise UserError(f"{flag}={path} does not exist; pass a bert-train model directory (or "
                        "a Hugging Face / Google BERT directory)")
    if flag is not None and not os.path.isdir(path):
        raise UserError(f"{flag}={path} is a file; pass its model directory")
    kind = formats.detect_format(path, allow_pickle=allow_pickle)
    if kind == formats.BERT_TRAIN:
        return _bert_train(path, path)
    if kind == formats.GPT2:  # No WordPiece vocabulary: GPT-2 tokenizes with a byte-level BPE.
        config = gpt2.GPT2Config.from_json(os.path.join(path, formats.HF_CONFIG))
        if _has_safetensors(path):  # the config against the weights' header, nothing read
            gpt2.check_source(hf.tensor_source(path, False), config,
                              os.path.join(path, formats.HF_CONFIG))
        return GPT2Checkpoint(
            path=path, format=kind, directory=path,
            registered_name=keras.saving.get_registered_name(gpt2.CausalLM),
            encoder_config=config.model_arguments(), allow_pickle=allow_pickle,
            gpt2_config=config)
    if kind == formats.HF:
        config = formats.BertConfig.from_json(os.path.join(path, formats.HF_CONFIG))
        if _has_safetensors(path):  # the config against the weights' header, nothing read
            hf.check_weights(hf.tensor_source(path, False), None, config,
                             os.path.join(path, formats.HF_CONFIG), path)
        vocab_file, lower_case = formats.find_vocab(path, required=False), hf.lower_case(path)
    else:  # Google's: its checkpoint prefix and vocabulary must be there.
        config = formats.BertConfig.from_json(os.path.join(path, formats.TF1_CONFIG))
        formats.tf1_prefix(path)
        vocab_file, lower_case = formats.find_vocab(path, required=True), tf1.lower_case(path)
    return ReferenceCheckpoint(
        path=path, format=kind, directory=path, registered_name=keras.saving.get_registered_name(
            pretrained.BertEncoder), encoder_config=pretrained.encoder_arguments(config),
        vocab_file=vocab_file, lower_case=lower_case, bert_config=config,
        allow_pickle=allow_pickle)


def _has_safetensors(path: str) -> bool:
    """Whether a Hugging Face directory's weights have headers (safetensors, not a pickle,
    which is read whole only when the weights are loaded)."""
    return any(os.path.isfile(os.path.join(path, name))
               for name in (formats.HF_WEIGHTS, formats.HF_INDEX))


def as_resolved(checkpoint: "str | ResolvedCheckpoint") -> ResolvedCheckpoint:
    """`checkpoint` itself, or the path resolved as a warm start's (any TF checkpoint too)."""
    if isinstance(checkpoint, ResolvedCheckpoint):
        return checkpoint
    return resolve_checkpoint(checkpoint, flag="--init_checkpoint", any_tf_checkpoint=True)


def _assign(ckpt: formats.BertCheckpoint, *, encoder: keras.Model, masked_lm=None,
            next_sentence=None) -> dict:
    """Assigns reference-layout weights to an encoder (and heads) of the same architecture."""
    ours = pretrained.bert_config(encoder)
    for field in _ARCHITECTURE:
        if getattr(ours, field) != getattr(ckpt.config, field):
            raise UserError(f"{ckpt.config_file} has {field}={getattr(ckpt.config, field)} but "
                            f"the encoder has {field}={getattr(ours, field)}; build the encoder "
                            "with from_pretrained or match its config")
    loaded = set(pretrained.load_reference_weights(
        encoder, ckpt.weights, masked_lm=masked_lm, next_sentence=next_sentence))
    parts = [p for p in (encoder, masked_lm, next_sentence) if p is not None]
    paths = list(dict.fromkeys(v.path for p in parts for v in p.weights))
    return {"loaded": [p for p in paths if p in loaded],
            "initialized": [p for p in paths if p not in loaded]}


def _check_overrides(overrides: dict, path: str) -> None:
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise UserError(f"from_pretrained: {unknown} would change the architecture read from "
                        f"{path}; only {list(OVERRIDABLE)} may be overridden")


def _require_finite(models, source: str) -> None:
    """Refuses restored weights that hold NaN/Inf (a corrupt or diverged checkpoint), naming
    the first such variable, as the readers of other formats do (`formats.float_weight`)."""
    for model in models:
        for variable in model.weights if model is not None else ():
            values = keras.ops.convert_to_numpy(variable)
            if np.issubdtype(values.dtype, np.floating):
                formats.float_weight(variable.path, values, source)


def _bert_train(path: str, directory: str, prefix: str | None = None) -> BertTrainCheckpoint:
    info = model_dir_lib.read_model_info(directory)
    return BertTrainCheckpoint(
        path=path, format=formats.BERT_TRAIN, directory=directory, prefix=prefix,
        registered_name=info.registered_name or f"bert_trainer>{info.encoder_class}",
        encoder_config=dict(info.encoder_config), vocab_file=info.vocab_file,
        lower_case=info.lower_case, info=info)


def _known_layout(path: str) -> bool:
    """Whether `path` is a directory of one of the named formats (not a bare TF checkpoint)."""
    if not os.path.isdir(path):
        return False
    files = set(os.listdir(path))
    return bool(files & {formats.MODEL_INFO_FILE, formats.HF_CONFIG, formats.TF1_CONFIG})


# ------------------------------------------------------------------ an encoder in one call


@dataclasses.dataclass
class PretrainedEncoder:
    """What `from_pretrained` returns.

    Attributes:
      encoder: the `BertEncoder`, weights loaded.
      vocab_file: absolute path of its WordPiece vocabulary, or None if the source had none.
      lower_case: whether that vocabulary expects lower-cased, accent-stripped text.
      format: the detected source format, one of `formats.FORMATS`.
      checkpoint: the source weights in the reference layout (Hugging Face / Google sources;
        None for a bert-train directory), e.g. for `interop.parity`.
      initialized: encoder variables the source lacked (e.g. a pooler-less HF checkpoint).
    """

    encoder: keras.Model
    vocab_file: str | None
    lower_case: bool
    format: str
    checkpoint: formats.BertCheckpoint | None = None
    initialized: list[str] = dataclasses.field(default_factory=list)


def from_pretrained(path: str, *, allow_pickle: bool = False, **overrides) -> PretrainedEncoder:
    """Builds the encoder of a checkpoint directory and loads its weights.

    Args:
      path: a bert-train model directory, a Hugging Face BERT directory (config.json +
        model.safetensors [+ vocab.txt]) or a Google TF1 directory (bert_config.json +
        bert_model.ckpt.* + vocab.txt); the format is detected.
      allow_pickle: accept a Hugging Face pytorch_model.bin (needs torch).
      **overrides: encoder arguments that change no weight shape (see OVERRIDABLE),
        e.g. `output_dropout=0.0` or `dtype="mixed_bfloat16"`.

    Returns:
      A `PretrainedEncoder`.

    Raises:
      UserError: unknown layout, missing files, mismatched config / weights / vocabulary.
    """
    _check_overrides(overrides, path)  # before anything is read
    checkpoint = resolve_checkpoint(path, allow_pickle=allow_pickle)
    encoder = checkpoint.build_encoder(**overrides)
    if not isinstance(checkpoint, ReferenceCheckpoint):
        reference, report = None, checkpoint.load(encoder=encoder)
    else:  # Read once: it is both loaded and returned.
        reference = checkpoint.read_reference()
        report = _assign(reference, encoder=encoder)
    return PretrainedEncoder(encoder, checkpoint.vocab_file, checkpoint.lower_case,
                             checkpoint.format, reference, report["initialized"])


def load_pretrained_weights(path: str, *, encoder: keras.Model, masked_lm=None,
                            next_sentence=None, allow_pickle: bool = False) -> dict:
    """`resolve_checkpoint(path).load(...)`: warm-starts a built encoder (and heads).

    A Hugging Face / Google directory must describe the same architecture as `encoder`
    (UserError naming the first differing size).

    Returns:
      {"loaded": variable paths restored, "initialized": variable paths left as they were}.
    """
    return resolve_checkpoint(path, allow_pickle=allow_pickle).load(
        encoder=encoder, masked_lm=masked_lm, next_sentence=next_sentence)
