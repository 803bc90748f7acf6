"""The tagging task family (`family.TaggingFamily`), registered on import.

  family.py   datasets (conll2003), the CoNLL reader, export and predict answers
  task.py     `TaggingTask`: `BertTokenClassifier`, per-piece cross-entropy, entity F1
  data.py     IOB2 tags and the tokenizing input pipeline
  serving.py  `TaggerServing`: word-level entities with character spans
"""

from bert_trainer.tasks.plugins import register_family
from bert_trainer.tasks.tagging.family import TaggingFamily

FAMILY = register_family(TaggingFamily())
