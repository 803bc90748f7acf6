"""Causal language modelling (GPT-style): next-token pretraining, generation and its export.

  family.py    `CausalLMFamily`: its pretraining objective (`CausalLMObjective`, what
               `pretrain` asks), the model rebuilt for export and generate, the answers
  task.py      `CausalLMTask`: next-token loss, perplexity, next-token accuracy (pretrain)
  corpus.py    its corpus writer: documents packed into block TFRecords
               (`create_pretraining_data --objective=causal_lm`, through the objective)
  data.py      the input pipeline: block TFRecords, shuffled and batched
  serving.py   `CausalLMServing`: prompt strings in, generated strings, ids and scores out

`bert-train generate` (prompts from flags, a file or stdin to JSON lines) runs that serving
module from `bert_trainer/export/generate.py`, beside `predict`.
"""

from bert_trainer.tasks.causal_lm.family import CausalLMFamily
from bert_trainer.tasks.plugins import register_family

FAMILY = register_family(CausalLMFamily())
