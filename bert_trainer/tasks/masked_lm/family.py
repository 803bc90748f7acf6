"""The masked_lm family: BERT's pretraining (masked LM, optionally next sentence).

`bert-train pretrain` trains it through its objective (`MaskedLMObjective`, the default
`pretraining_objective.name`): `PretrainingConfig` read from gin, the encoder from
`build_encoder` (or an init checkpoint), the task `task.PretrainingTask`, the input pipeline
`data.pretraining_dataset`, its data written by `corpus.create_pretraining_data` (for
`bert-train create_pretraining_data`). Its model directories record the task family
"pretraining" (as they always have); they hold a pretrained encoder, which `bert-train export`
writes as the bare encoder (`encode` signature) and `bert-train finetune --init_checkpoint`
starts from. It has no fine-tuning tasks.
"""

import sys

from bert_trainer.errors import UserError
from bert_trainer.interop import formats
from bert_trainer.tasks.family import Family
from bert_trainer.tasks.objective import Objective

# The encoder classes of other objectives' models (a causal LM is not a BERT encoder).
_OTHER_MODELS = ("CausalLM",)


class MaskedLMObjective(Objective):
    """Masked LM + next sentence on a `BertPretrainer` (see the module docstring)."""

    name = "masked_lm"
    config_name = "PretrainingConfig"
    builder_name = "build_encoder"
    model = "a BERT encoder"
    corpus_flags = ("max_seq_length", "short_seq_prob", "dupe_factor", "static_masking",
                    "max_predictions_per_seq", "masked_lm_prob", "whole_word_masking")

    def holds_its_model(self, encoder_class):
        return encoder_class not in _OTHER_MODELS

    def check_init_checkpoint(self, checkpoint):
        if checkpoint.format == formats.GPT2:
            raise UserError(f"--init_checkpoint={checkpoint.path} is a GPT-2 (causal LM) "
                            "checkpoint; it warm-starts pretraining_objective.name = "
                            "'causal_lm', not masked LM")
        if checkpoint.format == formats.BERT_TRAIN:
            super().check_init_checkpoint(checkpoint)

    def task(self, config, model_fn, checkpoint):
        from bert_trainer.tasks.masked_lm.task import PretrainingTask  # noqa: PLC0415

        return PretrainingTask(config, model_fn, checkpoint=checkpoint)

    def corpus_config(self, seed, **flags):
        from bert_trainer.tasks.masked_lm import corpus  # noqa: PLC0415 (TensorFlow)

        return corpus.PretrainingDataConfig(seed=seed, **flags)

    def write_corpus(self, config, inputs, vocab_file, output, options, progress=sys.stderr):
        from bert_trainer.tasks.masked_lm import corpus  # noqa: PLC0415 (TensorFlow)

        return corpus.create_pretraining_data(inputs, vocab_file, output, config, options, progress)

    def corpus_report(self, summary):
        return (f"wrote {summary['examples']:,} examples from {summary['documents']:,} "
                f"documents to {len(summary['shards'])} shard(s) in {summary['seconds']:.1f}s")


class MaskedLMFamily(Family):
    """BERT pretraining (see the module docstring)."""

    name = "masked_lm"
    objective = MaskedLMObjective()
    exports_encoder = True
