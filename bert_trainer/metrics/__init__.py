"""Host-side evaluation metrics (numpy, plain Python and sacreBLEU; no TensorFlow).

- `bleu`: corpus BLEU computed by sacreBLEU with its WMT defaults (`corpus_bleu`).
- `classification`: accuracy, F1, Matthews correlation, Pearson, Spearman, and `compute`.
- `squad`: the official SQuAD v1.1/v2.0 exact match and F1 (`squad_evaluate`).
- `tagging`: conlleval/seqeval entity-level F1 (`entity_f1`) and entity extraction.

The modules are imported by name (`from bert_trainer.metrics import squad`) because each
defines its own `f1`.
"""

from bert_trainer.metrics import bleu, classification, squad, tagging

__all__ = ["bleu", "classification", "squad", "tagging"]
