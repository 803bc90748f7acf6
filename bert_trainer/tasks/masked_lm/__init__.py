"""Masked-LM pretraining (BERT): the default objective of `bert-train pretrain`.

  family.py   `MaskedLMFamily` and its `MaskedLMObjective`: what `pretrain` asks
  task.py     `PretrainingTask`: masked LM (+ next sentence) losses and metrics
  corpus.py   its corpus writer: sentence-pair examples from text (`bert-train
              create_pretraining_data`, through the objective)
  data.py     the input pipeline: TFRecord shards, masked on the fly or statically
"""

from bert_trainer.tasks.masked_lm.family import MaskedLMFamily
from bert_trainer.tasks.plugins import register_family

FAMILY = register_family(MaskedLMFamily())
