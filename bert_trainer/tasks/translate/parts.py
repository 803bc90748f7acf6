"""The sequence-to-sequence parts the family builds on, in one place.

The model (`models.Seq2SeqTransformer`), in-graph decoding (`models.seq2seq_generation`),
corpus BLEU (`metrics.bleu`) and the BERT2BERT warm start (`interop.bert2bert`); where one of
them is not importable, its minimal stand-in from `standins.py` (see there).
"""

try:
    from bert_trainer.models import Seq2SeqTransformer
except ImportError:
    from bert_trainer.tasks.translate.standins import StandInSeq2Seq as Seq2SeqTransformer
try:
    from bert_trainer.models.seq2seq_generation import translate
except ImportError:
    from bert_trainer.tasks.translate.standins import translate
try:
    from bert_trainer.metrics.bleu import corpus_bleu
except ImportError:
    from bert_trainer.tasks.translate.standins import corpus_bleu
try:
    from bert_trainer.interop.bert2bert import warm_start_seq2seq
except ImportError:
    from bert_trainer.tasks.translate.standins import warm_start_seq2seq

__all__ = ["Seq2SeqTransformer", "corpus_bleu", "translate", "warm_start_seq2seq"]
