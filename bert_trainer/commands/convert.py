"""`bert-train convert`: Hugging Face / Google BERT checkpoints to bert-train, and back to HF.

  bert-train convert --input=uncased_L-12_H-768_A-12 --output=models/bert_base --verify
  bert-train convert --input=runs/pretrain --output=exported_hf --to=hf

--input is a Hugging Face BERT directory (config.json + model.safetensors), a Google TF1
directory (bert_config.json + bert_model.ckpt.* + vocab.txt) or a bert-train model directory;
the format is detected. --to=bert_train writes a model directory (bert_train.json, vocab.txt,
ckpt-0) that `finetune --init_checkpoint=DIR` reads; --to=hf writes config.json,
model.safetensors, vocab.txt for transformers' BertModel / BertForPreTraining. The masked-LM
and next-sentence heads are carried when the input has them. --verify compares the converted
model with a float64 numpy forward pass of the input weights, layer by layer, prints the
max |difference| and writes OUTPUT/parity_report.json; it exits 1 if a difference > 1e-4.

A Hugging Face GPT-2 directory (config.json with model_type "gpt2" + model.safetensors)
converts to a bert-train causal-LM model directory (a `CausalLM`; --to=bert_train only;
--verify compares it with a float64 numpy GPT-2, the logits relative to their scale). GPT-2's
byte-level BPE tokenizer is not carried: bert-train tokenizes with WordPiece only, so such a
model runs on token ids, not text.
"""

import dataclasses
import fnmatch
import glob
import os

import keras
import tensorflow as tf
from absl import flags

from bert_trainer import outputs
from bert_trainer.checkpoints import layout, model_dir, select
from bert_trainer.commands import require_flags, shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.errors import UserError
from bert_trainer.interop import (
    formats,
    from_pretrained,
    gpt2,
    gpt2_parity,
    hf,
    parity,
    pretrained,
    resolve_checkpoint,
)
from bert_trainer.models import BertPretrainer
from bert_trainer.tasks.causal_lm.task import TASK_NAME

SHARED_FLAGS = shared_flags.declare(
    __name__,
    input=Usage(None, "Checkpoint directory to convert (Hugging Face BERT or GPT-2, Google "
                "TF1 or bert-train; detected)."),
    output=Usage(None, "Directory to write (must be new or empty, see --overwrite)."),
    overwrite=Usage(False, "Replace an --output directory that bert-train convert wrote "
                    "(nothing else)."),
    to=Flag(
        "enum", formats.BERT_TRAIN,
        "Output format: a bert-train model directory or a Hugging Face directory.",
        enum_values=[formats.BERT_TRAIN, formats.HF]),
    verify=Flag("boolean", False, "Write a per-layer parity report (parity_report.json)."),
    allow_pickle=Flag(
        "boolean", False,
        "Read a pickle pytorch_model.bin (needs torch; pickles can run code when loaded)."))
FLAGS = flags.FLAGS

REPORT_FILE = "parity_report.json"


@dataclasses.dataclass
class Conversion:
    """What `convert` did: the files written, the heads carried and the parity report."""

    output_dir: str
    files: list[str]
    heads: list[str]
    report: dict | None


def main(argv):
    del argv
    require_flags("input", "output")
    result = convert(FLAGS.input, FLAGS.output, to=FLAGS.to, verify=FLAGS.verify,
                     allow_pickle=FLAGS.allow_pickle, overwrite=FLAGS.overwrite)
    return 0 if result.report is None or result.report["passed"] else 1


def convert(input_path: str, output_dir: str, *, to: str = formats.BERT_TRAIN,
            verify: bool = False, allow_pickle: bool = False, overwrite: bool = False,
            log=print) -> Conversion:
    """Converts the checkpoint directory `input_path` into `output_dir` (format `to`).

    Returns:
      A `Conversion`; its `report` is the parity report when `verify` is set.

    Raises:
      UserError: bad input files; an `output_dir` that is not empty (without `overwrite`),
        holds anything convert did not write, or lies in a model directory; a full disk or a
        refused write (an earlier output is then left as it was).
    """
    if to not in (formats.BERT_TRAIN, formats.HF):
        raise UserError(f"--to={to} is unknown; use {formats.BERT_TRAIN} or {formats.HF}")
    output_dir = _check_output(input_path, output_dir, overwrite)
    if formats.detect_format(input_path, allow_pickle=allow_pickle) == formats.GPT2:
        return _convert_gpt2(input_path, output_dir, to=to, verify=verify,
                             allow_pickle=allow_pickle, log=log)
    source = read_source(input_path, allow_pickle=allow_pickle)
    heads = [g for g in (formats.MASKED_LM, formats.NEXT_SENTENCE) if source.has(g)]
    c = source.config
    log(f"read {source.weights_file}: BERT with {c.num_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads} heads, vocab {c.vocab_size}; heads carried: "
        f"{', '.join(heads) or 'none'}")
    if to == formats.BERT_TRAIN and not source.has(formats.POOLER):
        log("note: the input has no pooler; the converted pooler is freshly initialized")
    report = None
    size = sum(a.nbytes for a in source.weights.values())
    # Written aside and renamed into place whole: a failure leaves an earlier output as it was.
    with outputs.new_directory(output_dir, CONVERTED, writing=f"the converted {to} model",
                               needed_bytes=size) as staging:
        if to == formats.HF:
            written = hf.write_hf(staging, source)
        else:
            written = write_bert_train(staging, source)
        if verify:
            # Re-read what was written, so the report checks the files, not an in-memory model.
            converted = from_pretrained(staging).encoder
            report = parity.verify(source, converted, source=input_path)
            parity.write_report(os.path.join(staging, REPORT_FILE), report)
    files = [os.path.join(output_dir, os.path.relpath(f, staging)) for f in written]
    log(f"wrote {to} model to {output_dir}: {', '.join(sorted(map(os.path.basename, files)))}")
    if report is not None:
        log(parity.format_report(report))
    return Conversion(output_dir, files, heads, report)


def read_source(path: str, *, allow_pickle: bool = False) -> formats.BertCheckpoint:
    """Any supported checkpoint directory as a `BertCheckpoint` in the reference layout."""
    checkpoint = resolve_checkpoint(path, allow_pickle=allow_pickle)
    if checkpoint.format in (formats.HF, formats.TF1):  # read in the reference layout
        return checkpoint.read_reference()
    encoder = checkpoint.build_encoder()
    config = pretrained.bert_config(encoder)
    masked_lm, next_sentence = build_heads(encoder, config)
    loaded = set(checkpoint.load(encoder=encoder, masked_lm=masked_lm,
                                 next_sentence=next_sentence)["loaded"])
    # A head counts as present when its own variables (not the shared table) were restored.
    weights = pretrained.reference_weights(
        encoder, masked_lm=masked_lm if masked_lm.bias.path in loaded else None,
        next_sentence=next_sentence if next_sentence.dense.kernel.path in loaded else None)
    return formats.BertCheckpoint(
        config=config, weights=weights, vocab_file=checkpoint.vocab_file,
        lower_case=checkpoint.lower_case,
        weights_file=select.select_checkpoint(None, path, flag="--input"),
        config_file=os.path.join(path, formats.MODEL_INFO_FILE))


def write_bert_train(output_dir: str, source: formats.BertCheckpoint) -> list[str]:
    """Writes `source` as a bert-train model directory; returns the files written."""
    encoder = pretrained.encoder_from_config(source.config)
    masked_lm, next_sentence = build_heads(encoder, source.config)
    if not source.has(formats.MASKED_LM):
        masked_lm = None
    if not source.has(formats.NEXT_SENTENCE):
        next_sentence = None
    pretrained.load_reference_weights(encoder, source.weights, masked_lm=masked_lm,
                                      next_sentence=next_sentence)
    prefix = model_dir.write_pretrained(
        output_dir, encoder=encoder, masked_lm=masked_lm, next_sentence=next_sentence,
        vocab_file=source.vocab_file, lower_case=source.lower_case)
    names = [formats.MODEL_INFO_FILE, "checkpoint"] + [formats.VOCAB_FILE] * bool(source.vocab_file)
    return [os.path.join(output_dir, n) for n in names] + glob.glob(prefix + ".*")


def _convert_gpt2(input_path: str, output_dir: str, *, to: str, verify: bool,
                  allow_pickle: bool, log) -> Conversion:
    """A GPT-2 directory as a bert-train causal-LM model directory (`convert` checked the
    output path); with `verify`, its parity report (`interop.gpt2_parity`)."""
    if to != formats.BERT_TRAIN:
        raise UserError(f"--to={to}: a GPT-2 checkpoint converts to {formats.BERT_TRAIN} only "
                        "(a causal-LM model directory)")
    loaded = gpt2.from_gpt2(input_path, allow_pickle=allow_pickle)
    c, ckpt = loaded.checkpoint.config, loaded.checkpoint
    log(f"read {ckpt.weights_file}: GPT-2 with {c.num_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads} heads, vocab {c.vocab_size}, {c.max_sequence_length} "
        f"positions; {len(loaded.loaded)} variables loaded"
        + (f", skipped {', '.join(ckpt.skipped)}" if ckpt.skipped else ""))
    size = sum(a.nbytes for a in ckpt.weights.values())
    with outputs.new_directory(output_dir, CONVERTED, writing=f"the converted {to} model",
                               needed_bytes=size) as staging:
        written = write_causal_lm(staging, loaded.model)
        report = None
        if verify:
            # Re-read what was written, so the report checks the files, not the loaded model.
            info = model_dir.read_model_info(staging)
            converted = model_dir.build_encoder(info)
            layout.restore_model(converted, select.select_checkpoint(staging))
            report = gpt2_parity.verify(ckpt, converted, source=input_path)
            parity.write_report(os.path.join(staging, REPORT_FILE), report)
    files = [os.path.join(output_dir, os.path.relpath(f, staging)) for f in written]
    log(f"wrote {to} model to {output_dir}: {', '.join(sorted(map(os.path.basename, files)))}")
    log(f"note: no vocabulary written; {gpt2.text_refusal(input_path)}")
    if report is not None:
        log(parity.format_report(report))
    return Conversion(output_dir, files, [], report)


def write_causal_lm(output_dir: str, model: keras.Model) -> list[str]:
    """Writes a `CausalLM` as a bert-train causal-LM model directory without a vocabulary.

    The checkpoint names every weight as the trainer's checkpoints do
    (`layout.model_trackable`), so the directory warm-starts `pretrain --init_checkpoint`
    and restores like a trained causal LM.

    Returns:
      The files written.
    """
    # The task entry a causal pretraining writes, plus where the weights came from.
    task = {"name": TASK_NAME, "family": TASK_NAME,
            "block_size": int(model.max_sequence_length), "source": formats.GPT2}
    model_dir.write_model_info(output_dir, model, vocab_file=None, task=task)
    root = tf.train.Checkpoint(model=layout.model_trackable(model))
    manager = tf.train.CheckpointManager(root, output_dir, max_to_keep=1,
                                         checkpoint_name=model_dir.CHECKPOINT_NAME)
    prefix = manager.save(checkpoint_number=0)
    names = [formats.MODEL_INFO_FILE, "checkpoint"]
    return [os.path.join(output_dir, n) for n in names] + glob.glob(prefix + ".*")


def build_heads(encoder, config: formats.BertConfig) -> tuple:
    """BERT's pretraining heads on `encoder`: (masked_lm, next_sentence), built.

    They are taken from a `BertPretrainer`, so the converted checkpoint restores into the
    pretraining model exactly; the MLM transform uses the encoder's activation (hidden_act).
    """
    model = BertPretrainer(
        encoder, mlm_activation=config.inner_activation,
        initializer=keras.initializers.TruncatedNormal(stddev=config.initializer_range))
    return model.masked_lm, model.next_sentence


def _is_conversion(path: str) -> bool:
    """Whether `path` holds exactly what converting to bert-train writes (made before markers)."""
    entries = os.listdir(path)
    return formats.MODEL_INFO_FILE in entries and all(
        any(fnmatch.fnmatchcase(e, p) for p in _BERT_TRAIN_FILES) for e in entries)


# What a conversion to bert-train writes (a training run writes more: ckpt-N, summaries, ...).
_BERT_TRAIN_FILES = (formats.MODEL_INFO_FILE, formats.VOCAB_FILE, "checkpoint", "ckpt-0.index",
                     "ckpt-0.data-*", REPORT_FILE)
CONVERTED = outputs.Kind("convert", "a directory written by bert-train convert", directory=True,
                         recognizes=_is_conversion)


def _check_output(input_path: str, output_dir: str, overwrite: bool) -> str:
    """The absolute output path; UserError if writing there could lose anything."""
    outputs.check_apart(output_dir, input_path, "--input")
    return outputs.check_output(output_dir, CONVERTED, overwrite=overwrite)
