"""A tiny English→Spanish translate run through the CLI: finetune → evaluate → export → predict,
and the export served in a fresh process with only tensorflow and tensorflow-text."""

import json
import subprocess
import sys

import pytest
from conftest import word_level_vocab
from robust_testing import subprocess_env
from translate_testing import SPA_ENG, run_cli, take

TINY = ["--gin_file=configs/encoders/tiny.gin", "--gin_param=build_encoder.hidden_size = 32",
        "--gin_param=build_encoder.num_layers = 1", "--gin_param=build_encoder.inner_dim = 64",
        "--gin_param=build_encoder.max_sequence_length = 32",
        "--gin_param=TranslateConfig.max_target_length = 16",
        "--gin_param=TranslateConfig.max_decode_length = 12",
        "--gin_param=TranslateConfig.eval_beam_size = 2"]
SERVE = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401 (the tokenizer ops)
loaded = tf.saved_model.load(sys.argv[1])
texts = [line.rstrip("\\n") for line in open(sys.argv[2], encoding="utf-8") if line.strip()]
out = loaded.signatures["serving_default"](input=tf.constant(texts))
assert not [m for m in sys.modules if m.startswith("bert_trainer")]
print(json.dumps({"translation": [t.decode("utf-8") for t in out["translation"].numpy()],
                  "score": [float(s) for s in out["score"].numpy()]}))
"""


@pytest.mark.slow
def test_translate_finetune_evaluate_export_predict(tmp_path, capsys):
    if not (SPA_ENG / "train.tsv").is_file():
        pytest.skip(f"{SPA_ENG} is absent (it holds the real test data)")
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    take(SPA_ENG / "train.tsv", train, 300)
    dev_pairs = take(SPA_ENG / "dev.tsv", dev, 24)
    vocab = word_level_vocab([train, dev], 1000)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    model_dir, export = tmp_path / "run", tmp_path / "export"

    proc = run_cli(capsys, "finetune", "--task=translate", f"--train_file={train}",
                   f"--eval_file={dev}", f"--vocab_file={vocab_file}", "--lower_case=true",
                   *TINY,  # from scratch: vocab_size is --vocab_file's size
                   "--seq_length=24", "--batch_size=16", "--train_steps=8",
                   f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert results["family"] == "translate" and results["step"] == 8
    metrics = results["metrics"]
    assert set(metrics) == {"loss", "token_accuracy", "cut_pairs", "bleu", "num_examples"}
    assert metrics["num_examples"] == 24 and 0 <= metrics["bleu"] <= 100
    assert 0 < metrics["loss"] < 20 and 0 <= metrics["token_accuracy"] <= 1
    info = json.loads((model_dir / "bert_train.json").read_text())
    assert info["encoder"]["config"]["vocab_size"] == len(vocab)
    task = info["task"]
    assert (task["family"], task["best_metric"], task["seq_length"]) == ("translate", "bleu", 24)
    assert task["translate"]["label_smoothing"] == 0.1  # the recipe's
    assert task["translate"]["beam_size"] == 4 and task["translate"]["max_target_length"] == 16
    assert list((model_dir / "best").glob("ckpt-8.index"))  # kept by BLEU

    proc = run_cli(capsys, "evaluate", f"--model_dir={model_dir}", f"--eval_file={dev}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bleu" in proc.stdout and "token_accuracy" in proc.stdout

    proc = run_cli(capsys, "export", f"--model_dir={model_dir}", f"--output={export}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exported translate model (seq_length 24)" in proc.stdout
    outputs = next(line.split(" -> ")[1].split(", ") for line in proc.stdout.splitlines()
                   if line.strip().startswith("serving_default(input) -> "))
    # The translation and its score, and what every text signature returns: the
    # truncation flag and the real and padding token counts of the rows it ran as.
    assert {"score", "translation", "truncated", "input_tokens",
            "padding_tokens"} <= set(outputs), outputs
    record = json.loads((export / "assets.extra" / "bert_train_family.json").read_text())
    assert record["family"] == "translate"

    sources = [pair.split("\t")[0] for pair in dev_pairs[:5]]
    text_in = tmp_path / "in.txt"
    text_in.write_text(sources[0] + "\n\n" + "\n".join(sources[1:]) + "\n", encoding="utf-8")
    jsonl_in = tmp_path / "in.jsonl"
    jsonl_in.write_text("".join(json.dumps({"input": s, "id": i}) + "\n"
                                for i, s in enumerate(sources)), encoding="utf-8")
    tsv_in = tmp_path / "in.tsv"
    tsv_in.write_text("input\n" + "\n".join(sources) + "\n", encoding="utf-8")
    answers = {}
    for name, args in {"saved": (f"--saved_model={export}", f"--input={text_in}"),
                       "dir": (f"--model_dir={model_dir}", f"--input={text_in}"),
                       "jsonl": (f"--saved_model={export}", f"--input={jsonl_in}"),
                       "tsv": (f"--saved_model={export}", f"--input={tsv_in}")}.items():
        out = tmp_path / f"{name}.jsonl"
        proc = run_cli(capsys, "predict", *args, f"--output={out}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        answers[name] = [json.loads(line) for line in out.read_text().splitlines()]
    saved = answers["saved"]
    assert [a["line"] for a in saved] == [1, 3, 4, 5, 6]
    for got in saved:
        assert set(got) == {"line", "input", "translation", "score"}
        assert isinstance(got["translation"], str) and isinstance(got["score"], float)
    assert [a["input"] for a in saved] == sources
    for other in ("dir", "jsonl", "tsv"):
        assert [a["translation"] for a in answers[other]] == [a["translation"] for a in saved]
        assert [a["score"] for a in answers[other]] == pytest.approx(
            [a["score"] for a in saved], abs=1e-4)

    # The export alone, in a process that imports tensorflow and tensorflow-text only.
    plain_in = tmp_path / "plain.txt"
    plain_in.write_text("\n".join(sources) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", SERVE, str(export), str(plain_in)], cwd=tmp_path,
                          env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=""),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    assert served["translation"] == [a["translation"] for a in saved]
    assert served["score"] == pytest.approx([a["score"] for a in saved], abs=1e-5)
