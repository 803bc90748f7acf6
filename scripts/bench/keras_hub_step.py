"""The keras-hub baseline: BertBackbone + MaskedLMHead + NSP dense in a TF custom train step.

This is how a keras-hub user writes BERT pretraining in TensorFlow without `model.fit`: one
`tf.function` per step fed from a `tf.data` iterator, gradients from a `GradientTape`, clipped by
global norm and applied by AdamW. It trains the same shapes, optimizer and data as bert-train's
step (see `spec.py`); `jit_compile=True` is the XLA variant.
"""

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from bench import spec as spec_lib
from bert_trainer import features

LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
MODEL_INPUTS = features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS,)
NUM_DATA_BATCHES = spec_lib.NUM_DATA_BATCHES


def build_model(size: spec_lib.ModelSize, dtype: str = "float32") -> keras.Model:
    """The pretrainer: dict of features in, {"mlm_logits", "nsp_logits"} out.

    Args:
      size: encoder size; dropout 0.1, GELU, max_sequence_length 512 as BERT.
      dtype: Keras dtype policy of every layer ("float32" or "mixed_bfloat16").

    Returns:
      A functional keras.Model with the parameter count of `spec.num_params(size)`.
    """
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=size.vocab_size, num_layers=size.num_layers,
        num_heads=size.num_attention_heads, hidden_dim=size.hidden_size,
        intermediate_dim=size.inner_dim, dropout=0.1,
        max_sequence_length=spec_lib.MAX_SEQUENCE_LENGTH, num_segments=spec_lib.TYPE_VOCAB_SIZE,
        dtype=dtype)
    mlm_head = keras_hub.layers.MaskedLMHead(
        token_embedding=backbone.token_embedding, intermediate_activation="gelu",
        layer_norm_epsilon=1e-12, dtype=dtype, name="mlm_head")
    nsp_head = keras.layers.Dense(2, dtype=dtype, name="nsp_head")
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in MODEL_INPUTS}
    encoded = backbone({
        "token_ids": inputs[features.INPUT_WORD_IDS],
        "padding_mask": inputs[features.INPUT_MASK],
        "segment_ids": inputs[features.INPUT_TYPE_IDS],
    })
    outputs = {  # Losses in float32 whatever the compute dtype.
        "mlm_logits": keras.ops.cast(mlm_head(
            encoded["sequence_output"], mask_positions=inputs[features.MASKED_LM_POSITIONS]),
            "float32"),
        "nsp_logits": keras.ops.cast(nsp_head(encoded["pooled_output"]), "float32"),
    }
    return keras.Model(inputs, outputs, name="keras_hub_bert_pretrainer")


def pretraining_loss(batch: dict, outputs: dict) -> tf.Tensor:
    """Weighted masked-LM cross-entropy (mean over real predictions) + NSP cross-entropy.

    Args:
      batch: features; masked_lm_ids/weights [b, P], next_sentence_labels [b].
      outputs: mlm_logits [b, P, V], nsp_logits [b, 2].

    Returns:
      scalar float32 loss.
    """
    mlm = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=batch[features.MASKED_LM_IDS], logits=outputs["mlm_logits"])  # (b, P)
    weights = batch[features.MASKED_LM_WEIGHTS]
    mlm_loss = tf.reduce_sum(mlm * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
    nsp_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=batch[features.NEXT_SENTENCE_LABELS], logits=outputs["nsp_logits"]))
    return mlm_loss + nsp_loss


def make_optimizer() -> keras.optimizers.Optimizer:
    """AdamW as BERT uses it: no weight decay on biases and LayerNorm parameters."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, beta_1=0.9, beta_2=0.999,
        epsilon=1e-6)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def dataset(step: spec_lib.StepSpec) -> tf.data.Dataset:
    """The benchmark batches (`spec.make_batches`) cycled forever."""
    batches = spec_lib.make_batches(step, NUM_DATA_BATCHES)
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    return tf.data.Dataset.from_tensor_slices(stacked).repeat().prefetch(2)


def build(step: spec_lib.StepSpec):
    """Builds model, optimizer and the compiled step.

    Args:
      step: shapes, size, `jit_compile` and `mixed_precision` (None or "bfloat16").

    Returns:
      (info, run): info is a dict (params); run(n) trains n steps, blocks until they are done
      and returns {"loss": last loss}.
    """
    keras.utils.set_random_seed(0)
    model = build_model(step.size, "mixed_bfloat16" if step.mixed_precision else "float32")
    optimizer = make_optimizer()
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function(jit_compile=step.jit_compile)
    def train_step(batch):
        with tf.GradientTape() as tape:
            # Only the model's inputs: a functional model given extra keys matches by position.
            outputs = model({k: batch[k] for k in MODEL_INPUTS}, training=True)
            loss = pretraining_loss(batch, outputs)
        grads = tape.gradient(loss, variables)
        grads, _ = tf.clip_by_global_norm(grads, CLIP_NORM)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    iterator = iter(dataset(step))

    def run(num_steps: int) -> dict:
        loss = None
        for _ in range(num_steps):
            loss = train_step(next(iterator))
        return {"loss": float(loss)}  # float() waits for the last step to finish.

    return {"params": int(model.count_params())}, run


def build_from_params(step: dict):
    """Worker entry point: `build` from a JSON `StepSpec`."""
    return build(spec_lib.StepSpec.from_json(step))
