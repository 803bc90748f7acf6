"""The causal_lm family: a decoder-only language model's generation and its export.

A causal model directory is written by `bert-train pretrain` with the causal objective: its
bert_train.json names the `CausalLM` as the encoder and the task {"name": "causal_lm",
"family": "causal_lm", ...}. The family has no fine-tuning tasks (no presets, no local
tasks); it rebuilds the model for `bert-train export` and `bert-train generate`
(`head_model`), wraps it in the generation serving module (`serving.CausalLMServing`: prompt
strings in, generated strings out) and writes `predict`'s and `generate`'s answers.

The task entry may hold "max_new_tokens": the export's static bound on generated pieces
(default: `serving.default_max_new_tokens`).
"""

import sys

from bert_trainer.errors import UserError
from bert_trainer.interop import formats
from bert_trainer.tasks.causal_lm import serving
from bert_trainer.tasks.family import Family, decode, finite, mark_truncated
from bert_trainer.tasks.objective import Objective


def check_causal(model, where: str) -> None:
    """Refuses a model that is not a decoder-only LM (it has no `decode_step`)."""
    if not (callable(getattr(model, "decode_step", None))
            and callable(getattr(model, "init_cache", None))):
        raise UserError(f"{where}: the encoder is a {type(model).__name__}, not a causal "
                        "language model (CausalLM); pretrain one with "
                        "--gin_file=configs/causal_lm/mini.gin")


class CausalLMObjective(Objective):
    """Next-token pretraining of a `CausalLM` (`pretraining_objective.name = 'causal_lm'`):
    `CausalLMConfig` read from gin, the model from `build_causal_lm` (or an init checkpoint:
    a bert-train causal model directory, or GPT-2 weights), the task `task.CausalLMTask`; its
    data written by `corpus.create_causal_lm_data` (documents packed into blocks)."""

    name = "causal_lm"
    config_name = "CausalLMConfig"
    builder_name = "build_causal_lm"
    model = "a CausalLM"
    corpus_flags = ("block_size",)

    def holds_its_model(self, encoder_class):
        return encoder_class == "CausalLM"

    def check_init_checkpoint(self, checkpoint):
        if checkpoint.format == formats.BERT_TRAIN:
            super().check_init_checkpoint(checkpoint)

    def task(self, config, model_fn, checkpoint):
        from bert_trainer.tasks.causal_lm.task import CausalLMTask  # noqa: PLC0415

        return CausalLMTask(config, model_fn, checkpoint=checkpoint)

    def corpus_config(self, seed, block_size):
        from bert_trainer.tasks.causal_lm import corpus  # noqa: PLC0415 (TensorFlow)

        return corpus.CausalDataConfig(block_size=block_size, seed=seed)

    def write_corpus(self, config, inputs, vocab_file, output, options, progress=sys.stderr):
        from bert_trainer.tasks.causal_lm import corpus  # noqa: PLC0415 (TensorFlow)

        return corpus.create_causal_lm_data(inputs, vocab_file, output, config, options, progress)

    def corpus_report(self, summary):
        return (f"wrote {summary['examples']:,} blocks of {summary['block_size']} tokens from "
                f"{summary['documents']:,} documents to {len(summary['shards'])} shard(s) in "
                f"{summary['seconds']:.1f}s ({summary['tokens_dropped']} tokens of the final "
                "partial block dropped)")


class CausalLMFamily(Family):
    """Decoder-only language models (see the module docstring)."""

    name = "causal_lm"
    objective = CausalLMObjective()
    input_orders = ((serving.PROMPT,),)
    answer_outputs = (serving.GENERATED_TEXT, serving.GENERATED_IDS, serving.SCORE)

    def head_model(self, encoder, task, where):
        check_causal(encoder, where)
        if not encoder.built:  # restoring needs the variables
            encoder({"input_word_ids": [[0]]}, training=False)
        return encoder

    def serving_module(self, model, task, **common):
        return serving.CausalLMServing(model, max_new_tokens=task.get("max_new_tokens"),
                                       **common)

    def format_answer(self, outputs, i):
        return mark_truncated({"generated": decode(outputs[serving.GENERATED_TEXT][i]),
                               serving.SCORE: finite(outputs[serving.SCORE][i])}, outputs, i)
