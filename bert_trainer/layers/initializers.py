"""Initializer helpers shared by the layers.

Keras 3 initializers without an explicit seed pick one random seed when they are *created*
and reuse it on every call: one instance shared by two sublayers gives both the same
initial values (Q, K and V kernels would start identical). Every sublayer therefore gets
its own clone.
"""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer` (an instance, a name or a config dict).

    Args:
      initializer: anything `keras.initializers.get` accepts.

    Returns:
      A new `keras.initializers.Initializer`; unseeded initializers get a new seed.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
