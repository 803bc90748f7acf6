"""`bert-train generate` and the export of a causal LM, against `generation.causal.generate`.

In-process: the serving module (tokenize, generate, detokenize) equals calling `generate()`
on the tokenized prompts; the command's JSON lines equal the module's answers; sampling with a
seed repeats; `bert-train export`, and generate from the export (slow). In a subprocess (slow):
the SavedModel run by `tests/serving_check.py` in a process that cannot import bert_trainer,
giving the same text.
"""

import io
import json
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf
from causal_testing import PROMPTS, make_causal_model_dir
from robust_testing import TESTS, subprocess_env

from bert_trainer.data.tokenizer import Tokenizer
from bert_trainer.errors import UserError
from bert_trainer.export import exporter
from bert_trainer.export import generate as run
from bert_trainer.models.generation.causal import generate
from bert_trainer.tasks.causal_lm import serving


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    path, model = make_causal_model_dir(tmp_path_factory.mktemp("causal") / "run")
    return {"dir": path, "model": model, "vocab": f"{path}/vocab.txt"}


@pytest.fixture(scope="module")
def module(causal_dir):
    return exporter.build_serving_module(causal_dir["dir"])


def reference(model, vocab, prompts, max_new_tokens, **settings):
    """generate() on `[SEP] + pieces` of each prompt, and the detokenized continuation.

    Run by the graph executor (`jit_compile=False`): each call's own XLA compile would cost
    seconds. The command compiles its loop with XLA, so the CLI's tests still compare the two
    (tests/models/test_causal_generation.py checks that they agree on their own)."""
    tokenizer = Tokenizer(vocab, lower_case=True)
    rows = [[tokenizer.sep_id] + tokenizer.tokenize([p]).to_list()[0] for p in prompts]
    ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    out = generate(model, tf.constant(ids), tf.constant([len(r) for r in rows], tf.int32),
                   max_new_tokens=max_new_tokens, end_id=tokenizer.sep_id,
                   jit_compile=False, **settings)
    texts = [t.decode() for t in tokenizer.detokenize(out["generated_ids"]).numpy()]
    return out, texts


def test_the_family_rebuilds_the_model_and_its_serving_module(module, causal_dir):
    assert isinstance(module, serving.CausalLMServing) and module.family == "causal_lm"
    assert module.seq_length == 32 and module.max_new_tokens == 16  # half the positions
    for restored, saved in zip(module.model.weights, causal_dir["model"].weights, strict=True):
        np.testing.assert_array_equal(restored.numpy(), saved.numpy())
    assert set(module.signatures()) == {"serving_default", "generate", "prompt_length"}


def test_greedy_serving_equals_generate_on_the_tokenized_prompts(module, causal_dir):
    out = module.function("serving_default")(prompt=tf.constant(PROMPTS))
    expected, texts = reference(causal_dir["model"], causal_dir["vocab"], PROMPTS, 16)
    np.testing.assert_array_equal(out["generated_ids"].numpy(),
                                  expected["generated_ids"].numpy())
    np.testing.assert_allclose(out["score"].numpy(), expected["scores"].numpy(), rtol=1e-5,
                               atol=1e-4)
    assert [t.decode() for t in out["generated_text"].numpy()] == texts
    assert len(set(texts)) > 1 and all(texts)  # prompts lead somewhere, and differently


def test_sampling_repeats_with_its_seed_and_changes_with_another(module):
    fn = module.function("generate")
    args = dict(prompt=tf.constant(PROMPTS), max_new_tokens=tf.constant(0),
                temperature=tf.constant(1.0),
                top_k=tf.constant(0), top_p=tf.constant(1.0))
    first = fn(**args, seed=tf.constant(3))["generated_ids"].numpy()
    again = fn(**args, seed=tf.constant(3))["generated_ids"].numpy()
    other = fn(**args, seed=tf.constant(4))["generated_ids"].numpy()
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()
    greedy = fn(**{**args, "temperature": tf.constant(0.0)}, seed=tf.constant(3))
    top1 = fn(**{**args, "top_k": tf.constant(1)}, seed=tf.constant(9))  # top-1: greedy too
    np.testing.assert_array_equal(greedy["generated_ids"].numpy(),
                                  top1["generated_ids"].numpy())


def test_a_call_may_ask_for_fewer_new_pieces_than_the_bound(module, causal_dir):
    fn = module.function("generate")
    settings = dict(temperature=tf.constant(0.0), top_k=tf.constant(0), top_p=tf.constant(1.0),
                    seed=tf.constant(0))
    full = fn(prompt=tf.constant(PROMPTS), max_new_tokens=tf.constant(0), **settings)
    short = fn(prompt=tf.constant(PROMPTS), max_new_tokens=tf.constant(5), **settings)
    expected, _ = reference(causal_dir["model"], causal_dir["vocab"], PROMPTS, 5)
    np.testing.assert_array_equal(short["generated_ids"].numpy()[:, :5],
                                  expected["generated_ids"].numpy())
    assert (short["generated_ids"].numpy()[:, 5:] == 0).all()
    ids = full["generated_ids"].numpy()
    np.testing.assert_array_equal(short["generated_ids"].numpy()[:, :5], ids[:, :5])
    # 25 pieces are too many for 16 new ones (cut), not for 5: the whole prompt is read.
    long = ["dog " * 10 + "cat " * 15]
    whole = fn(prompt=tf.constant(long), max_new_tokens=tf.constant(5), **settings)
    expected, _ = reference(causal_dir["model"], causal_dir["vocab"], long, 5)
    np.testing.assert_array_equal(whole["generated_ids"].numpy()[:, :5],
                                  expected["generated_ids"].numpy())


def test_prompt_length_counts_sep_and_a_long_prompt_keeps_its_end(module):
    out = module.function("prompt_length")(prompt=tf.constant(["", "the cat", "cat " * 40]))
    assert out["prompt_length"].numpy().tolist() == [1, 3, 41]
    assert int(out["max_prompt_length"]) == 16 and int(out["max_new_tokens"]) == 16
    # Cut to [SEP] + its last 15 pieces, a long prompt continues as those alone do.
    long = module.function("serving_default")(prompt=tf.constant(["dog " * 30 + "cat " * 15]))
    cut = module.function("serving_default")(prompt=tf.constant(["cat " * 15]))
    np.testing.assert_array_equal(long["generated_ids"].numpy(), cut["generated_ids"].numpy())


@pytest.fixture(scope="module")
def generators():
    """The generators `run.load_generator` made in this file, by its arguments."""
    return {}


@pytest.fixture
def load_once(generators, monkeypatch):
    """`bert-train generate` in this process loads each model (and settings) once per file.

    Each load wraps the model afresh and compiles its loop with XLA (seconds per batch shape);
    the commands of these tests read the same model directory, so the later ones reuse the
    first one's generator (its traces and compiled programs) instead. What is tested stays the
    command: its flags, prompts, seeds and output; a generator that kept state between calls
    (its random draws) would now make repeated commands differ, and fail."""
    load = run.load_generator

    def load_generator(**kwargs):
        key = tuple(sorted(kwargs.items()))
        if key not in generators:
            generators[key] = load(**kwargs)
        return generators[key]

    monkeypatch.setattr(run, "load_generator", load_generator)


def run_cli(args, capsys, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    from bert_trainer import cli  # noqa: PLC0415

    capsys.readouterr()
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    rc = cli.main(["bert-train", "generate", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_cli_greedy_lines_equal_generate(causal_dir, capsys, load_once):
    args = [f"--model_dir={causal_dir['dir']}", *[f"--prompt={p}" for p in PROMPTS],
            "--max_new_tokens=8", "--batch_size=3"]
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    _, texts = reference(causal_dir["model"], causal_dir["vocab"], PROMPTS, 8)
    records = jsonl(out)
    assert [r["prompt"] for r in records] == PROMPTS
    assert [r["generated"] for r in records] == texts
    assert all(set(r) == {"prompt", "generated", "score"} and r["score"] <= 0 for r in records)
    assert "generate: 4 prompts in" in err


def test_cli_reads_a_file_and_stdin_and_samples_reproducibly(causal_dir, capsys, tmp_path,
                                                              monkeypatch, load_once):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(p + "\n" for p in PROMPTS), encoding="utf-8")
    # The greedy test's --max_new_tokens and --batch_size: its generator and compiled batch
    # shapes serve (`load_once`); two batches, each with its own draws.
    sampled = [f"--model_dir={causal_dir['dir']}", "--temperature=0.9", "--top_p=0.95",
               "--top_k=20", "--seed=11", "--max_new_tokens=8", "--batch_size=3"]
    rc, first, err = run_cli([*sampled, f"--input={prompts}"], capsys)
    assert rc == 0 and "(seed 11)" in err, err
    rc, again, _ = run_cli([*sampled, "--input=-"], capsys, stdin=prompts.read_text(),
                           monkeypatch=monkeypatch)
    assert rc == 0 and first == again and len(jsonl(first)) == len(PROMPTS)
    output = tmp_path / "out.jsonl"
    rc, out, err = run_cli([*sampled, f"--input={prompts}", "--seed=12",
                            f"--output={output}"], capsys)
    assert rc == 0 and out == "", err
    assert jsonl(output.read_text()) != jsonl(first)  # another seed, other draws
    rc, _, err = run_cli([*sampled, f"--input={prompts}", f"--output={output}"], capsys)
    assert rc == 2 and "exists; choose another path or pass --overwrite" in err
    rc, _, err = run_cli([*sampled, f"--input={prompts}", f"--output={output}", "--overwrite"],
                         capsys)
    assert rc == 0 and output.read_text() == first


def test_library_refuses_mixed_sources_and_both_prompt_kinds(causal_dir):
    with pytest.raises(UserError, match="exactly one of --model_dir"):
        run.load_generator(model_dir=causal_dir["dir"], saved_model=causal_dir["dir"])
    with pytest.raises(UserError, match="pass --prompt or --input, not both"):
        run.read_prompts(["a"], "-")
    assert run.batch_seed(5, 0) != run.batch_seed(5, 1)


@pytest.mark.slow
def test_export_then_generate_from_the_saved_model_in_a_bare_process(causal_dir, tmp_path,
                                                                      module, capsys,
                                                                      monkeypatch):
    """The commands run through the CLI's entry point in this process (each would import
    TensorFlow again in a subprocess); the bare process is the one the export is served in."""
    from bert_trainer import cli  # noqa: PLC0415

    env = subprocess_env()
    export = tmp_path / "export"
    capsys.readouterr()
    rc = cli.main(["bert-train", "export", f"--model_dir={causal_dir['dir']}",
                   f"--output={export}"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    assert "generate(prompt, max_new_tokens, temperature, top_k, top_p, seed)" in out, out
    settings = {"max_new_tokens": 0, "temperature": 0.8, "top_k": 10, "top_p": 0.9, "seed": 5}
    requests = [{"key": "greedy", "export": str(export), "signature": "serving_default",
                 "inputs": {"prompt": PROMPTS}},
                {"key": "sampled", "export": str(export), "signature": "generate",
                 "inputs": {"prompt": PROMPTS, **settings}}]
    (tmp_path / "requests.json").write_text(json.dumps(requests))
    check = subprocess.run([sys.executable, "-I", str(TESTS / "serving_check.py"),
                            str(tmp_path / "requests.json"), str(tmp_path / "results.json")],
                           capture_output=True, text=True, env=env, timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "bert_trainer" not in results["modules"]
    greedy = module.function("serving_default")(prompt=tf.constant(PROMPTS))
    assert results["greedy"]["generated_text"] == [t.decode() for t in
                                                   greedy["generated_text"].numpy()]
    sampled = module.function("generate")(prompt=tf.constant(PROMPTS), **{
        k: tf.constant(v, tf.int32 if isinstance(v, int) else tf.float32)
        for k, v in settings.items()})
    assert results["sampled"]["generated_ids"] == sampled["generated_ids"].numpy().tolist()
    # The command on the export gives the model_dir's lines.
    lines = {}
    for source in (f"--saved_model={export}", f"--model_dir={causal_dir['dir']}"):
        rc, out, err = run_cli([source], capsys, stdin="".join(p + "\n" for p in PROMPTS),
                               monkeypatch=monkeypatch)
        assert rc == 0, err[-3000:]
        lines[source.split("=")[0]] = jsonl(out)
    assert [r["generated"] for r in lines["--saved_model"]] == [
        r["generated"] for r in lines["--model_dir"]]
    assert [r["prompt"] for r in lines["--saved_model"]] == PROMPTS
    # Fewer new pieces per call than the export's bound; more is refused in one line.
    for flag, expected in (("--max_new_tokens=4", 0), ("--max_new_tokens=17", 2)):
        rc, _, err = run_cli([f"--saved_model={export}", flag, "--prompt=the cat sat on the"],
                             capsys)
        assert rc == expected, err[-3000:]
    assert "--max_new_tokens=17: the export" in err and "pass at most 16" in err


def test_predict_answers_prompts_as_greedy_generate_does(causal_dir, capsys, tmp_path):
    from bert_trainer import cli  # noqa: PLC0415

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(p + "\n" for p in PROMPTS if p), encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["bert-train", "predict", f"--model_dir={causal_dir['dir']}",
                     f"--input={prompts}"]) == 0
    predicted = jsonl(capsys.readouterr().out)
    rc, out, err = run_cli([f"--model_dir={causal_dir['dir']}", f"--input={prompts}"], capsys)
    assert rc == 0, err
    generated = jsonl(out)
    assert [r["prompt"] for r in predicted] == [p for p in PROMPTS if p]
    assert [r["generated"] for r in predicted] == [r["generated"] for r in generated]
    assert [r["line"] for r in predicted] == [1, 2, 3]


DOCUMENTS = ["the cat sat on the mat .\nthe dog sat on the mat .",
             "john lives in paris .\nmary lives in london .",
             "a very good film .\nthe film was fine ."]


@pytest.mark.slow
def test_pretrain_generate_export_generate_from_the_export(tmp_path, capsys):
    """The whole chain through the CLI: causal data, a tiny pretrain, generate, export.

    Each command goes through the CLI's entry point (`cli.main`) in this process from a clean
    gin state: five subprocesses would import TensorFlow five times. The export in a fresh
    process and stdin are the subprocess test's above."""
    from export_testing import write_vocab  # noqa: PLC0415

    from bert_trainer import cli  # noqa: PLC0415
    vocab = write_vocab(tmp_path / "vocab.txt")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(DOCUMENTS * 20) + "\n", encoding="utf-8")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat\njohn lives in\n", encoding="utf-8")
    run_dir, export = tmp_path / "run", tmp_path / "export"
    vocab_size = len(open(vocab, encoding="utf-8").read().split())
    steps = [
        ["create_pretraining_data", "--objective=causal_lm", f"--input={corpus}",
         f"--vocab={vocab}", f"--output={tmp_path}/data/train-*.tfrecord", "--block_size=16",
         "--num_shards=1"],
        ["pretrain", "--gin_file=configs/causal_lm/tiny.gin", f"--model_dir={run_dir}",
         f"--train_data={tmp_path}/data/train-*.tfrecord", f"--vocab_file={vocab}",
         f"--gin_param=build_causal_lm.vocab_size = {vocab_size}",
         "--gin_param=build_causal_lm.hidden_size = 32",
         "--gin_param=build_causal_lm.inner_dim = 64",
         "--gin_param=build_causal_lm.max_sequence_length = 32",
         "--gin_param=CausalLMConfig.block_size = 16",
         "--gin_param=CausalLMConfig.train_batch_size = 8",
         "--gin_param=TrainerConfig.train_steps = 40",
         "--gin_param=TrainerConfig.steps_per_loop = 20"],
        ["generate", f"--model_dir={run_dir}", f"--input={prompts}",
         f"--output={tmp_path}/from_run.jsonl"],
        ["export", f"--model_dir={run_dir}", f"--output={export}"],
        ["generate", f"--saved_model={export}", f"--input={prompts}",
         f"--output={tmp_path}/from_export.jsonl"],
    ]
    for args in steps:
        gin.clear_config()
        capsys.readouterr()
        rc = cli.main(["bert-train", *args])
        assert rc == 0, f"{args[0]}: {capsys.readouterr().err[-3000:]}"
    from_run = jsonl((tmp_path / "from_run.jsonl").read_text())
    from_export = jsonl((tmp_path / "from_export.jsonl").read_text())
    assert [r["prompt"] for r in from_run] == ["the cat sat", "john lives in"]
    assert [r["generated"] for r in from_export] == [r["generated"] for r in from_run]
    for a, b in zip(from_export, from_run, strict=True):
        assert a["score"] == pytest.approx(b["score"], abs=1e-3)
    assert all(r["generated"] and r["score"] < 0 for r in from_run), from_run
