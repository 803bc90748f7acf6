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


def test_ratios_compare_bert_train_with_each_system_measured_in_the_run():
    def row(per_s, p50):
        return {"throughput": {"inputs_per_s": per_s}, "latency": {"p50_ms": p50}}

    results = {"sst2/bert_train": row(300.0, 4.0), "sst2/pytorch": row(100.0, 10.0),
               "sst2/onnxruntime": {"skipped": "not measured: no onnxruntime"},
               "sst2/bare_tf": row(150.0, 8.0), "conll/bert_train": row(50.0, 5.0)}
    assert serving.ratios(results) == {
        "sst2/bert_train_vs_bare_tf": {"throughput": 2.0, "p50_latency": 2.0},
        "sst2/bert_train_vs_pytorch": {"throughput": 3.0, "p50_latency": 2.5}}


def test_the_torch_worker_says_what_is_missing_instead_of_failing(tmp_path):
    # This interpreter has no torch (the suite's venv): the row is skipped, saying why.
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"runtime": "onnxruntime", "inputs": [{"text": "a"}]}),
                       encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "serving_torch.py"),
                           str(request)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"skipped": "not measured: No module named 'torch'"}
    assert serving.run_system("pytorch", {"task": "sst2"}, tmp_path,
                              str(tmp_path / "no-python")) == {
        "skipped": f"not measured: no PyTorch interpreter ({tmp_path / 'no-python'})"}
