"""A pretraining objective: what `bert-train pretrain` trains when the gin config names it.

`pretraining_objective.name` picks one ("masked_lm" by default; configs/causal_lm/*.gin bind
"causal_lm"). Each belongs to the task family that owns its data, task and serving
(`Family.objective`: tasks/masked_lm/, tasks/causal_lm/; `plugins.objective` finds it). It
names the gin configurables of its data config and its model builder (registered in
`bert_trainer.configurables`), builds its task, and refuses a warm start from another
objective's model; `bert-train pretrain` asks it, and never branches on its name.

It also writes its pretraining data: `bert-train create_pretraining_data --objective=NAME`
asks it for its corpus writer's config (`corpus_config`, from the flags it reads:
`corpus_flags`), runs the writer (`write_corpus`: its family's `corpus.py`, on the generic
machinery of `bert_trainer/data/`) and prints its one-line report (`corpus_report`).
"""

import sys

from bert_trainer.errors import UserError


class Objective:
    """One pretraining objective (see the module docstring).

    Attributes:
      name: its `pretraining_objective.name`.
      config_name: the gin name of its data and loss config, e.g. "PretrainingConfig".
      builder_name: the gin name of its model builder, e.g. "build_encoder".
      model: what its model is, for messages, e.g. "a BERT encoder".
      corpus_flags: the `create_pretraining_data` flags that only its corpus writer reads
        (given with another objective, they are refused), e.g. ("block_size",).
    """

    name: str = ""
    config_name: str = ""
    builder_name: str = ""
    model: str = ""
    corpus_flags: tuple[str, ...] = ()

    def holds_its_model(self, encoder_class: str) -> bool:
        """Whether a bert-train model directory whose encoder is `encoder_class` holds a
        model of this objective (one it can warm-start from)."""
        raise NotImplementedError

    def check_init_checkpoint(self, checkpoint) -> None:
        """Refuses an init checkpoint (a `ResolvedCheckpoint`) of another objective's model.

        Raises:
          UserError: naming the checkpoint, what it holds and what picks the objective.
        """
        held = getattr(checkpoint, "encoder_class", None)
        if held is None or self.holds_its_model(held):
            return
        raise UserError(f"--init_checkpoint={checkpoint.path} holds a {held}; the {self.name} "
                        f"objective warm-starts from {self.model} (pretraining_objective.name "
                        "in the gin config picks the objective, e.g. configs/causal_lm/*.gin)")

    def task(self, config, model_fn, checkpoint):
        """Its `Task`, on `config` (from gin's `config_name`), building its model with
        `model_fn`, warm-started from the resolved `checkpoint` (or None)."""
        raise NotImplementedError

    def corpus_config(self, seed: int, **flags):
        """Its corpus writer's typed config, from `seed` and the values of `corpus_flags`
        (keyword arguments of those names)."""
        raise NotImplementedError

    def write_corpus(self, config, inputs, vocab_file: str, output: str, options,
                     progress=sys.stderr) -> dict:
        """Writes its pretraining TFRecords and their summary JSON from text.

        Args:
          config: from `corpus_config`.
          inputs: text files (a comma list and/or globs), or a `tfds_sources.TfdsText`.
          vocab_file: the WordPiece vocab.txt.
          output: the shard pattern with one `*`.
          options: a `corpus_options.CorpusOptions` (how the text is read and the shards
            written, as every corpus writer takes it).
          progress: stream for progress lines, or None.

        Returns:
          The summary (also written as JSON next to the shards).
        """
        raise NotImplementedError

    def corpus_report(self, summary: dict) -> str:
        """What `create_pretraining_data` prints of `write_corpus`'s summary (it adds the
        throughput)."""
        raise NotImplementedError
