"""The keras-hub system of the pretraining-quality benchmark: `BertMaskedLM` trained with `fit`.

What a keras-hub user writes: a `BertBackbone` (dropout 0.1) inside `BertMaskedLM`, inputs
masked on the fly by keras-hub's `MaskedLMMaskGenerator` in the `tf.data` pipeline (15 %,
80/10/10, `[CLS]`/`[SEP]`/`[PAD]` never chosen), compiled with AdamW (weight decay 0.01
skipping LayerNorm and biases, clipping at global norm 1.0) on a 10 % linear warmup then
linear decay (BERT's recipe, the other systems' peak rate), and `model.fit`. The run is a
wall-clock budget, as bert-train's `--time_budget` runs: the budget counts `fit`'s loop (the
first step's tracing included), not the start-up before it (recorded as `startup`); each
step's rate is set from the fraction of the budget spent (no calibration), so the schedule
ends with the budget; the run stops at the first step past the budget. It reads the
benchmark's token sequences (train.npz), so every system sees the same tokens.

    python quality_keras_hub.py PARAMS.json RESULT.json

PARAMS and RESULT as for `quality_torch.py` (from random weights only). The snapshot is the
model's weights when the budget is spent, converted after training (outside the clock) into a
Hugging Face directory by bert-train's own writer (`interop.hf.write_hf`), so that the same
scorer and the same fine-tuning command read every system. keras-hub's BERT layers use GELU's tanh
approximation, the converted encoder the exact erf form (the only one of that layout): its
logits differ from keras-hub's by about 1e-3 (tests/bench/test_bench_quality.py).
"""

import json
import os
import sys
import time

SCRIPTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(p: dict):
    import keras
    import keras_hub

    s = p["sizes"]
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=p["vocab_size"], num_layers=s["num_layers"],
        num_heads=s["num_attention_heads"], hidden_dim=s["hidden_size"],
        intermediate_dim=s["inner_dim"], dropout=0.1,
        max_sequence_length=s["max_sequence_length"], num_segments=2)
    model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
    return keras, keras_hub, model


def dataset(p: dict, keras_hub, vocab: list[str]):
    import numpy as np
    import tensorflow as tf

    arrays = np.load(p["train_npz"])
    ids, mask = arrays["input_word_ids"], arrays["input_mask"]
    special = [vocab.index(t) for t in ("[PAD]", "[CLS]", "[SEP]")]
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=p["vocab_size"], mask_selection_rate=0.15,
        mask_selection_length=p["max_predictions"], mask_token_id=vocab.index("[MASK]"),
        unselectable_token_ids=special)

    def make(token_ids, padding_mask, segment_ids):
        masked = masker(token_ids)
        x = {"token_ids": masked["token_ids"], "padding_mask": padding_mask,
             "segment_ids": segment_ids, "mask_positions": masked["mask_positions"]}
        return x, masked["mask_ids"], masked["mask_weights"]

    tf.random.set_seed(p["seed"])
    return (tf.data.Dataset.from_tensor_slices((ids, mask, arrays["input_type_ids"]))
            .shuffle(10_000, seed=p["seed"]).repeat().batch(p["batch_size"], drop_remainder=True)
            .map(make, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))


def main(params_file: str, result_file: str) -> int:
    with open(params_file) as f:
        p = json.load(f)
    launched = p.get("launched", time.time())
    import numpy as np

    keras, keras_hub, model = build(p)
    keras.utils.set_random_seed(p["seed"])
    with open(p["vocab_file"], encoding="utf-8") as f:
        vocab = [line.rstrip("\n") for line in f]
    budget, warmup = float(p["budget_s"]), float(p.get("warmup_fraction", 0.1))
    optimizer = keras.optimizers.AdamW(learning_rate=0.0, weight_decay=0.01, epsilon=1e-6,
                                       global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
    clock = {}

    class Budget(keras.callbacks.Callback):
        """The clock starts with `fit`'s loop (the first step's tracing counted, as in
        bert-train's budget); each step's rate is set from the fraction of the budget spent;
        the run stops at the first step that ends past the budget."""

        def on_train_begin(self, logs=None):
            clock["start"] = time.time()

        def on_train_batch_begin(self, batch, logs=None):
            fraction = min(1.0, (time.time() - clock["start"]) / budget)
            optimizer.learning_rate = p["learning_rate"] * rate_factor(fraction, warmup)

        def on_train_batch_end(self, batch, logs=None):
            if time.time() - clock["start"] >= budget:
                clock["end"] = time.time()
                self.model.stop_training = True

    model.fit(dataset(p, keras_hub, vocab), steps_per_epoch=10**9, epochs=1, verbose=0,
              callbacks=[Budget()])
    end = clock.get("end", time.time())
    out = os.path.join(p["out_dir"], f"snapshot-{budget:g}s")
    weights = {w.path: w.numpy() for w in model.weights}
    step = int(optimizer.iterations.numpy())
    write_hf(weights, p, out, np)  # after the clock: conversion is not training
    result = {"seconds": budget, "step": step, "dir": out, "elapsed": time.time() - launched,
              "startup": clock["start"] - launched, "loop_seconds": end - clock["start"]}
    with open(result_file, "w") as f:
        json.dump(result, f)
    return 0


def rate_factor(fraction: float, warmup_fraction: float) -> float:
    """BERT's schedule on the fraction of the budget spent: linear warmup, then linear decay
    to 0 at the end of the budget."""
    if warmup_fraction > 0 and fraction < warmup_fraction:
        return fraction / warmup_fraction
    return max(0.0, (1.0 - fraction) / (1.0 - warmup_fraction))


def reference_weights(weights: dict, num_layers: int, np) -> dict:
    """keras-hub BertBackbone + MaskedLMHead weights under google-research/bert's names."""
    ref = {"bert/embeddings/word_embeddings": weights["token_embedding/embeddings"],
           "bert/embeddings/position_embeddings": weights["position_embedding/embeddings"],
           "bert/embeddings/token_type_embeddings": weights["segment_embedding/embeddings"],
           "bert/embeddings/LayerNorm/gamma": weights["embeddings_layer_norm/gamma"],
           "bert/embeddings/LayerNorm/beta": weights["embeddings_layer_norm/beta"],
           "bert/pooler/dense/kernel": weights["pooled_dense/kernel"],
           "bert/pooler/dense/bias": weights["pooled_dense/bias"],
           "cls/predictions/transform/dense/kernel":
               weights["mlm_head/intermediate_dense/kernel"],
           "cls/predictions/transform/dense/bias":
               weights["mlm_head/intermediate_dense/bias"],
           "cls/predictions/transform/LayerNorm/gamma":
               weights["mlm_head/intermediate_layer_norm/gamma"],
           "cls/predictions/transform/LayerNorm/beta":
               weights["mlm_head/intermediate_layer_norm/beta"],
           "cls/predictions/output_bias": weights["mlm_head/output_bias"]}
    for i in range(num_layers):
        src, dst = f"transformer_layer_{i}/", f"bert/encoder/layer_{i}/"
        attention = src + "self_attention_layer/"
        for name in ("query", "key", "value"):
            kernel = weights[attention + f"{name}/kernel"]  # (hidden, heads, head_dim)
            ref[dst + f"attention/self/{name}/kernel"] = kernel.reshape(kernel.shape[0], -1)
            ref[dst + f"attention/self/{name}/bias"] = weights[attention + f"{name}/bias"].ravel()
        out = weights[attention + "attention_output/kernel"]  # (heads, head_dim, hidden)
        ref[dst + "attention/output/dense/kernel"] = out.reshape(-1, out.shape[-1])
        ref[dst + "attention/output/dense/bias"] = weights[attention + "attention_output/bias"]
        pairs = {"attention/output/LayerNorm": "self_attention_layer_norm",
                 "output/LayerNorm": "feedforward_layer_norm"}
        for ref_name, hub_name in pairs.items():
            ref[dst + ref_name + "/gamma"] = weights[src + hub_name + "/gamma"]
            ref[dst + ref_name + "/beta"] = weights[src + hub_name + "/beta"]
        for ref_name, hub_name in (("intermediate/dense", "feedforward_intermediate_dense"),
                                   ("output/dense", "feedforward_output_dense")):
            ref[dst + ref_name + "/kernel"] = weights[src + hub_name + "/kernel"]
            ref[dst + ref_name + "/bias"] = weights[src + hub_name + "/bias"]
    return {k: np.asarray(v, np.float32) for k, v in ref.items()}


def write_hf(weights: dict, p: dict, out: str, np) -> None:
    if SCRIPTS_DIR not in sys.path:
        sys.path.insert(0, os.path.dirname(SCRIPTS_DIR))
    from bert_trainer.interop import formats, hf

    s = p["sizes"]
    config = formats.BertConfig(
        vocab_size=p["vocab_size"], hidden_size=s["hidden_size"], num_layers=s["num_layers"],
        num_attention_heads=s["num_attention_heads"], inner_dim=s["inner_dim"],
        max_sequence_length=s["max_sequence_length"])
    ckpt = formats.BertCheckpoint(config, reference_weights(weights, s["num_layers"], np),
                                  p["vocab_file"], True, "keras-hub", "keras-hub")
    formats.validate(ckpt)
    hf.write_hf(out, ckpt)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
