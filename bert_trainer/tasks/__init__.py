"""Training tasks: one interface (`Task`) that the trainer runs."""

from bert_trainer.tasks.base import Task

__all__ = ["Task"]
