"""The translate task family (`family.TranslateFamily`), registered on import.

  family.py    pair files (TSV/CSV/JSONL, Tatoeba), TFDS presets, export and predict answers
  data.py      the tokenizing pair pipeline (encoder inputs, decoder inputs and targets)
  task.py      `TranslationTask`: `Seq2SeqTransformer`, label-smoothed loss, BLEU
  serving.py   `TranslateServing`: source text in, translation and score out
"""

from bert_trainer.tasks.plugins import register_family
from bert_trainer.tasks.translate.family import TranslateFamily

FAMILY = register_family(TranslateFamily())
