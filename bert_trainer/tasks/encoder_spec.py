"""The encoder a fine-tuning task starts from: its config, its vocabulary, its checkpoint.

An `EncoderSpec` is read from the resolved `--init_checkpoint` (`interop.resolve`: bert-train,
Hugging Face or Google TF1; the checkpoint is kept, so the warm start does not read it again)
or taken from an encoder built by gin (training from scratch). The task checks it against the
vocabulary and the sequence length before anything is trained.
"""

import dataclasses
import os

import keras

from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.errors import UserError
from bert_trainer.interop import formats, resolve
from bert_trainer.interop.resolve import ResolvedCheckpoint
from bert_trainer.models.causal_lm import CausalLM

# Keys of an encoder config that describe how it runs, not what it is: the trainer's precision
# policy must win over the dtype a checkpoint was written with.
_RUNTIME_KEYS = ("dtype",)


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """How to build a task's encoder, and the vocabulary that tokenizes text for it.

    Attributes:
      registered_name: the encoder's Keras registered name, e.g. "bert_trainer>BertEncoder".
      config: the encoder's `get_config()` without its dtype (see `_RUNTIME_KEYS`).
      vocab_file: the WordPiece vocabulary.
      lower_case: whether the vocabulary expects lower-cased, accent-stripped text.
      source: where the config came from, named in error messages.
      checkpoint: the pretrained checkpoint the config was read from (None: built from gin).
    """

    registered_name: str
    config: dict
    vocab_file: str
    lower_case: bool
    source: str
    checkpoint: ResolvedCheckpoint | None = dataclasses.field(default=None, compare=False,
                                                              repr=False)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_sequence_length(self) -> int:
        return int(self.config["max_sequence_length"])

    def build(self) -> keras.Model:
        """A freshly initialized encoder (weights come from `FinetuningTask.initialize`)."""
        info = model_dir_lib.ModelInfo(
            encoder_class=self.registered_name.rpartition(">")[2],
            encoder_config=dict(self.config), vocab_file=None, lower_case=self.lower_case,
            task=None, registered_name=self.registered_name)
        return model_dir_lib.build_encoder(info)


def _spec(encoder_class: str, registered_name: str | None, config: dict, vocab_file, lower_case,
          source: str) -> EncoderSpec:
    if vocab_file is None:
        raise UserError(f"{source} names no vocabulary; pass --vocab_file")
    config = {k: v for k, v in config.items() if k not in _RUNTIME_KEYS}
    return EncoderSpec(registered_name or f"bert_trainer>{encoder_class}", config,
                       os.path.abspath(vocab_file), bool(lower_case), source)


def spec_from_checkpoint(checkpoint: str | ResolvedCheckpoint, *,
                         vocab_file: str | None = None, lower_case: bool | None = None,
                         flag: str = "--init_checkpoint") -> EncoderSpec:
    """The encoder of a pretrained checkpoint (bert-train, Hugging Face or Google TF1).

    Args:
      checkpoint: a `ResolvedCheckpoint`, or the path to resolve: a model directory (the
        format is detected) or a checkpoint prefix in a bert-train model directory.
      vocab_file: overrides the checkpoint's vocabulary.
      lower_case: overrides the checkpoint's casing.
      flag: the flag named in error messages.

    Returns:
      The `EncoderSpec`; its `checkpoint` is the resolved checkpoint, which `initialize`
      warm-starts from without reading it again.

    Raises:
      UserError: no such directory, an unknown layout, or no vocabulary.
    """
    if isinstance(checkpoint, str):
        checkpoint = resolve.resolve_checkpoint(checkpoint, flag=flag)
    if checkpoint.format == formats.GPT2:
        raise UserError(f"{flag}={checkpoint.path} is a GPT-2 (causal LM) checkpoint, not a "
                        "BERT encoder; it warm-starts a causal_lm pretraining only (and "
                        "bert-train cannot tokenize text for it: GPT-2 uses a byte-level BPE)")
    if checkpoint.encoder_class == CausalLM.__name__:
        raise UserError(f"{flag}={checkpoint.path} holds a causal language model (CausalLM), "
                        "not a BERT encoder; fine-tuning starts from a masked-LM encoder (a "
                        "causal model continues with bert-train pretrain or generates with "
                        "bert-train generate)")
    spec = _spec(checkpoint.encoder_class, checkpoint.registered_name,
                 checkpoint.encoder_config, vocab_file or checkpoint.vocab_file,
                 checkpoint.lower_case if lower_case is None else lower_case,
                 f"{flag}={checkpoint.directory}")
    return dataclasses.replace(spec, checkpoint=checkpoint)


def spec_from_encoder(encoder: keras.Model, *, vocab_file: str | None,
                      lower_case: bool = True, source: str = "the gin encoder config"
                      ) -> EncoderSpec:
    """The spec of an encoder built in code or by gin (training from scratch)."""
    return _spec(type(encoder).__name__, keras.saving.get_registered_name(type(encoder)),
                 encoder.get_config(), vocab_file, lower_case, source)
