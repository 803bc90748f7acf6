"""A pretraining objective: what `bert-train pretrain` trains when the gin config names it.

`pretraining_objective.name` picks one ("masked_lm" by default; configs/causal_lm/*.gin bind
"causal_lm"). Each belongs to the task family that owns its data, task and serving
(`Family.objective`: tasks/masked_lm/, tasks/causal_lm/; `registry.objective` finds it). It
names the gin configurables of its data config and its model builder (registered in
`bert_trainer.configurables`), builds its task, and refuses a warm start from another
objective's model; `bert-train pretrain` asks it, and never branches on its name.
"""

from bert_trainer.errors import UserError


class Objective:
    """One pretraining objective (see the module docstring).

    Attributes:
      name: its `pretraining_objective.name`.
      config_name: the gin name of its data and loss config, e.g. "PretrainingConfig".
      builder_name: the gin name of its model builder, e.g. "build_encoder".
      model: what its model is, for messages, e.g. "a BERT encoder".
    """

    name: str = ""
    config_name: str = ""
    builder_name: str = ""
    model: str = ""

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
