"""The classification task family (`family.ClassificationFamily`), registered on import.

  family.py   datasets (IMDB, GLUE), the local-file reader, export and predict answers
  task.py     `SentenceClassificationTask`: `BertClassifier`, cross-entropy, host metrics
  data.py     the tokenizing input pipeline (also serving's text packing)
  serving.py  `ClassifierServing`: text in, class probabilities and names out
"""

from bert_trainer.tasks.classification.family import ClassificationFamily
from bert_trainer.tasks.plugins import register_family

FAMILY = register_family(ClassificationFamily())
