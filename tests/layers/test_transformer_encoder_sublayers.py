"""TransformerEncoder's sublayers have fixed names, whatever the process created before."""

import keras
import numpy as np

from bert_trainer.layers import TransformerEncoder

DATA = np.zeros((2, 5, 8), "float32")  # (batch, seq, hidden)


def _dropouts(layer) -> dict[str, float]:
    return {d.name: d.rate for d in (layer.attention_output_dropout, layer.inner_dropout_layer,
                                     layer.output_dropout_layer)}


def test_dropout_sublayers_are_named_after_their_rate_argument():
    keras.layers.Dropout(0.5)  # an unnamed Dropout would take the next "dropout_N" name
    layers = [TransformerEncoder(num_attention_heads=2, inner_dim=12, output_dropout=0.1,
                                 inner_dropout=0.2, name=f"layer_{i}") for i in range(2)]
    for layer in layers:
        layer(DATA)
        assert _dropouts(layer) == {"attention_output_dropout": 0.1, "inner_dropout": 0.2,
                                    "output_dropout": 0.1}
    # Every sublayer name is unique within the layer (Keras paths and summaries use them).
    first = layers[0]
    names = [first.attention_layer.name, first.attention_layer_norm.name,
             first.intermediate_dense.name, first.output_dense.name, first.output_layer_norm.name,
             *_dropouts(first)]
    assert len(set(names)) == len(names) == 8
