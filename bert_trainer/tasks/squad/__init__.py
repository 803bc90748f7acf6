"""The squad task family (`family.SquadFamily`), registered on import.

  family.py       datasets (squad, squad_v2), the SQuAD JSON reader, export and predict answers
  task.py         `QuestionAnsweringTask` and `SquadConfig` (windowing, answer decoding)
  data.py         doc-stride windows for training and evaluation
  postprocess.py  logits → answer text (`postprocess_squad`)
  serving.py      `SquadServing`: in-graph windows and span selection
"""

from bert_trainer.tasks.plugins import register_family
from bert_trainer.tasks.squad.family import SquadFamily

FAMILY = register_family(SquadFamily())
