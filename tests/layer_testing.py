"""Shared checks for every layer, head and encoder (in the style of keras-hub's TestCase).

`assert_layer_contract` builds the layer from its kwargs, calls it, and checks:
  1. output shapes (any nest of tensors);
  2. the number of trainable weights;
  3. a JSON `get_config` -> `from_config` round trip that reproduces the same config;
  4. `.keras` save and load of a functional model around the layer, with equal outputs;
  5. one training step: every trainable weight gets a gradient and the loss goes down.
"""

import json

import keras
import numpy as np
import tensorflow as tf
from keras import ops, tree
from numerics import assert_close


def _symbolic(value):
    """A `keras.Input` matching an example array (batch dimension kept free)."""
    return keras.Input(shape=value.shape[1:], dtype=keras.backend.standardize_dtype(value.dtype))


def _is_array(value):
    return isinstance(value, np.ndarray) or ops.is_tensor(value)


def _shapes(outputs):
    """Flat list of output shapes (dicts in sorted key order, as `tree.flatten` does)."""
    return [tuple(t.shape) for t in tree.flatten(outputs)]


def _flat_shapes(expected):
    """Flattens a nest of shape tuples the way `tree.flatten` flattens the outputs."""
    if isinstance(expected, tuple) and all(isinstance(d, (int, type(None))) for d in expected):
        return [expected]
    if isinstance(expected, dict):
        return [s for key in sorted(expected) for s in _flat_shapes(expected[key])]
    return [s for item in expected for s in _flat_shapes(item)]


def check_config_round_trip(layer, inputs, call_kwargs):
    """get_config survives JSON and rebuilds a layer with the same config and output shapes."""
    config = layer.get_config()
    revived = layer.__class__.from_config(json.loads(json.dumps(config)))
    assert json.dumps(revived.get_config(), sort_keys=True) == json.dumps(config, sort_keys=True)
    assert _shapes(revived(inputs, **call_kwargs)) == _shapes(layer(inputs, **call_kwargs))


def check_saved_model_equal(layer, inputs, call_kwargs, path, atol):
    """A functional model around `layer`, saved as .keras and loaded, gives equal outputs."""
    symbolic_inputs = tree.map_structure(_symbolic, inputs)
    symbolic_kwargs = {k: _symbolic(v) if _is_array(v) else v for k, v in call_kwargs.items()}
    outputs = layer(symbolic_inputs, **symbolic_kwargs)
    flat_symbolic = tree.flatten(symbolic_inputs) + [
        v for v in symbolic_kwargs.values() if isinstance(v, keras.KerasTensor)]
    flat_values = tree.flatten(inputs) + [v for v in call_kwargs.values() if _is_array(v)]
    model = keras.Model(flat_symbolic, outputs)
    model.save(path)
    loaded = keras.saving.load_model(path)
    expected, actual = tree.flatten(model(flat_values)), tree.flatten(loaded(flat_values))
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual, strict=True):
        assert_close(got, want, atol=atol)


def _projected_loss(outputs, seed=0):
    """sum(outputs * fixed random tensor): a loss whose gradient reaches every weight
    (a plain sum of squares would be constant after a LayerNorm)."""
    rng = np.random.default_rng(seed)
    total = 0.0
    for tensor in tree.flatten(outputs):
        if "float" not in keras.backend.standardize_dtype(tensor.dtype):
            continue
        # float64: outputs may hold huge constants (masked logits) that would swamp a
        # float32 sum's last bits, where the change made by one small step lives.
        direction = rng.standard_normal(tuple(tensor.shape))
        total += ops.sum(ops.cast(tensor, "float64") * direction)
    return total


def check_training_step(layer, inputs, call_kwargs, learning_rate=1e-3):
    """Every trainable weight gets a gradient, and one SGD step lowers the loss.

    Run in inference mode so that dropout cannot make the two losses incomparable
    (dropout itself is tested per layer).
    """
    variables = layer.trainable_variables
    with tf.GradientTape() as tape:
        loss_before = _projected_loss(layer(inputs, training=False, **call_kwargs))
    grads = tape.gradient(loss_before, variables)
    missing = [v.path for v, g in zip(variables, grads, strict=True) if g is None]
    assert not missing, f"no gradient for {missing}"
    keras.optimizers.SGD(learning_rate).apply(grads, variables)
    loss_after = _projected_loss(layer(inputs, training=False, **call_kwargs))
    assert float(loss_after) < float(loss_before)


def assert_layer_contract(layer_cls, init_kwargs, inputs, *, expected_output_shape,
                   expected_num_trainable_weights, tmp_path, call_kwargs=None,
                   run_training_step=True, atol=1e-6):
    """Runs the five checks above and returns `(layer, outputs)` for further assertions.

    Args:
      layer_cls: the layer (or functional model) class.
      init_kwargs: its constructor arguments.
      inputs: the first call argument: an array or a nest (list/dict) of arrays.
      expected_output_shape: the output shape(s), same nest as the outputs.
      expected_num_trainable_weights: `len(layer.trainable_weights)`.
      tmp_path: pytest's tmp_path (the .keras file goes there).
      call_kwargs: extra call arguments; arrays among them become model inputs.
      run_training_step: False for layers without trainable weights.
      atol: tolerance of the save/load equality.
    """
    call_kwargs = dict(call_kwargs or {})
    layer = layer_cls(**init_kwargs)
    outputs = layer(inputs, **call_kwargs)
    assert _shapes(outputs) == _flat_shapes(expected_output_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights, [
        w.path for w in layer.trainable_weights]
    check_config_round_trip(layer, inputs, call_kwargs)
    check_saved_model_equal(layer, inputs, call_kwargs, str(tmp_path / "layer.keras"), atol)
    if run_training_step:
        check_training_step(layer, inputs, call_kwargs)
    return layer, outputs
