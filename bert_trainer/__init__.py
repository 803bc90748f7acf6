"""bert-train: BERT pretraining and fine-tuning for TensorFlow 2 / Keras 3."""

__version__ = "0.1.0"
