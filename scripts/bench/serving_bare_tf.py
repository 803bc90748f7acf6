"""The serving benchmark's bare TensorFlow worker: an export timed where TF Serving would run it.

    python -I scripts/bench/serving_bare_tf.py REQUEST.json

REQUEST.json: {"export", "inputs": [{name: text}], "batch_size", "latency_inputs"}. The export
is loaded with tensorflow and tensorflow-text only (an import of bert_trainer raises, as in
tests/serving_check.py) and its serving_default signature is called on the inputs in their
order, `batch_size` at a time (a server batches requests as they arrive, not by length), then
one at a time for the latency. Prints one JSON line: {"throughput": {...}, "latency": {...}}
(`serving_timing.py`). Run with -I so that neither the repository nor the user's site is on
sys.path; this directory is added for `serving_timing` alone.
"""

import importlib.abc
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _BlockBertTrainer(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] == "bert_trainer":
            raise ImportError(f"serving_bare_tf: {fullname} must not be imported")
        return None


sys.meta_path.insert(0, _BlockBertTrainer())

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import serving_timing  # noqa: E402 (numpy and time only)
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401 (registers the tokenizer ops)


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    fn = tf.saved_model.load(request["export"]).signatures["serving_default"]

    def call(items):
        names = items[0].keys()
        return fn(**{name: tf.constant([item[name] for item in items]) for name in names})

    inputs = request["inputs"]
    result = {"throughput": serving_timing.throughput(call, inputs, request["batch_size"]),
              "latency": serving_timing.latency(call, inputs[:request["latency_inputs"]])}
    assert "bert_trainer" not in sys.modules, "bert_trainer was imported"
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
