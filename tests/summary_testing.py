"""Reads what a run wrote for TensorBoard, for tests that check the logged numbers."""

import os

import tensorflow as tf


def read_scalars(directory) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the event files in `directory`."""
    scalars = {}
    for name in tf.io.gfile.listdir(directory):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    scalars.setdefault(value.tag, {})[event.step] = float(
                        tf.make_ndarray(value.tensor))
    return scalars
