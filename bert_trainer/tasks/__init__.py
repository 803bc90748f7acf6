"""Training tasks: one interface (`Task`) that the trainer runs.

Fine-tuning tasks come in families, one package each (classification/, regression/, squad/,
tagging/): a `family.Family` object declares a family's datasets, reader, task class, head,
serving module, predict answers and gin recipe; `registry` maps family and task names to
them and imports plugin families.
"""

from bert_trainer.tasks.base import Task

__all__ = ["Task"]
