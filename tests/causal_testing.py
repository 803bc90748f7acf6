"""A tiny causal model directory, as `bert-train pretrain` with the causal objective writes it.

`make_causal_model_dir` writes bert_train.json (encoder_class CausalLM, task {"name":
"causal_lm", "family": "causal_lm", "block_size"}), vocab.txt and a trainer-style ckpt-N
(`tf.train.Checkpoint(model=model_trackable(model), step=...)`) for a 2-layer CausalLM whose
weights are drawn with a large scale, so greedy continuations differ clearly between prompts.
"""

import numpy as np
import tensorflow as tf
from export_testing import VOCAB, write_vocab

from bert_trainer.checkpoints import model_dir
from bert_trainer.checkpoints.layout import model_trackable
from bert_trainer.models.causal_lm import CausalLM

MODEL = dict(hidden_size=32, num_layers=2, num_attention_heads=2, inner_dim=64,
             max_sequence_length=32, output_dropout=0.0, attention_dropout=0.0)
PROMPTS = ["the cat sat on the", "john lives in paris", "", "a very good film"]


def build_causal_lm(seed: int = 0, scale: float = 0.2) -> CausalLM:
    model = CausalLM(vocab_size=len(VOCAB), **MODEL)
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if "gamma" in v.path or "beta" in v.path:
            continue  # LayerNorms keep their identity start
        v.assign(rng.normal(scale=scale, size=v.shape).astype(np.float32))
    return model


def make_causal_model_dir(path, seed: int = 0, step: int = 5, model: CausalLM | None = None):
    """Writes a causal model directory at `path` (of `model`, else `build_causal_lm(seed)`);
    returns (path as str, model)."""
    path.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else build_causal_lm(seed)
    vocab = write_vocab(path.parent / f"{path.name}_vocab.txt")
    model_dir.write_model_info(str(path), model, vocab_file=vocab, lower_case=True,
                               task={"name": "causal_lm", "family": "causal_lm",
                                     "block_size": 16})
    root = tf.train.Checkpoint(model=model_trackable(model), step=tf.Variable(step, tf.int64))
    manager = tf.train.CheckpointManager(root, str(path), max_to_keep=1,
                                         checkpoint_name=model_dir.CHECKPOINT_NAME)
    manager.save(checkpoint_number=step)
    return str(path), model
