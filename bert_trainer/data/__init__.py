"""Text to batches: tokenizer, vocabulary, pretraining data and every task's input pipeline.

Modules are imported where used (`from bert_trainer.data.tokenizer import Tokenizer`) so that
importing the package stays cheap and free of TensorFlow.
"""
