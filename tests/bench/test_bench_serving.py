"""scripts/bench/serving.py: its CoNLL reader and both workers on a tiny export.

The script's own --smoke run fine-tunes MiniLM twice (minutes on 2 cores): here the two
workers time a tiny classifier's export instead; their numbers mean nothing, their shape and
the bare process's imports do.
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO
from export_testing import make_model_dir

sys.path.insert(0, str(REPO / "scripts" / "bench"))

import serving  # noqa: E402

from bert_trainer.export import build_serving_module  # noqa: E402
from bert_trainer.export.exporter import save  # noqa: E402

TEXTS = ["john smith lives in paris", "a good film", "", "the cat sat on the mat . " * 3,
         "nice"]


def test_conll_sentences_join_each_sentences_words(tmp_path):
    path = tmp_path / "eng.testa"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
                    "Peter NNP B-NP B-PER\n", encoding="utf-8")
    assert serving.conll_sentences(path) == ["EU rejects", "Peter"]


@pytest.mark.slow  # an export, and a bare TensorFlow process that loads it
def test_both_workers_time_an_export(tmp_path):
    path, _ = make_model_dir(tmp_path / "cls", "classification", seq_length=16)
    export = save(build_serving_module(str(path)), str(tmp_path / "export"))
    request = {"export": export, "inputs": [{"text": t} for t in TEXTS], "batch_size": 2,
               "latency_inputs": 3}
    ours = serving.worker(request)
    assert ours["in_process"]  # the CPU: the export's model rebuilt, kernels and packing
    assert ours["throughput"]["inputs"] == len(TEXTS)
    assert 0 <= ours["throughput"]["padding_share"] < 0.5
    request_file = tmp_path / "request.json"
    request_file.write_text(json.dumps(request), encoding="utf-8")
    done = subprocess.run([sys.executable, "-I", str(REPO / "scripts" / "bench" /
                                                     "serving_bare_tf.py"), str(request_file)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    bare = json.loads(done.stdout.strip().splitlines()[-1])
    for result in (ours, bare):
        assert result["latency"]["inputs"] == 3
        assert 0 < result["latency"]["p50_ms"] <= result["latency"]["p99_ms"]
        assert result["throughput"]["inputs_per_s"] > 0
