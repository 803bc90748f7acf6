"""Runs exported SavedModels in a process that cannot import bert_trainer.

    python -I tests/serving_check.py REQUESTS.json RESULTS.json

REQUESTS.json: a list of {"key", "export", "signature", "inputs": {name: nested list}}; string
inputs are lists of str, id inputs nested lists of int (int32), floats (sampling settings)
float32. RESULTS.json: {"key": {output: nested list}} plus "signatures": {export dir:
[signature names]} and "modules": the top-level packages imported. Any import of bert_trainer
raises ImportError (a meta path blocker), and the script asserts at the end that it never got
into `sys.modules`: the exports stand on tensorflow + tensorflow-text alone. Run with `-I` so
the repository is not on sys.path.
"""

import importlib.abc
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _BlockBertTrainer(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] == "bert_trainer":
            raise ImportError(f"serving_check: {fullname} must not be imported")
        return None


sys.meta_path.insert(0, _BlockBertTrainer())

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401 (registers the tokenizer ops)


def _tensor(value):
    array = np.asarray(value)
    if array.dtype.kind in "US":
        return tf.constant(array.astype(object).tolist(), tf.string)
    if array.dtype.kind == "f":  # a sampling setting (temperature, top_p)
        return tf.constant(array, tf.float32)
    return tf.constant(array, tf.int32)


def _plain(tensor):
    array = tensor.numpy()
    if array.dtype == object:
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array).tolist()
    return array.tolist()  # float32 values are exact as Python floats; json keeps +-inf.


def main(requests_path: str, results_path: str) -> None:
    with open(requests_path, encoding="utf-8") as f:
        requests = json.load(f)
    loaded, results = {}, {"signatures": {}}
    for request in requests:
        path = request["export"]
        if path not in loaded:
            loaded[path] = tf.saved_model.load(path)
            results["signatures"][path] = sorted(loaded[path].signatures)
        fn = loaded[path].signatures[request["signature"]]
        outputs = fn(**{k: _tensor(v) for k, v in request["inputs"].items()})
        results[request["key"]] = {k: _plain(v) for k, v in outputs.items()}
    assert "bert_trainer" not in sys.modules, "bert_trainer was imported"
    results["modules"] = sorted({m.split(".")[0] for m in sys.modules})
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
