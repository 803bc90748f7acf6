"""`make demo`: bert-train end to end on text every Python installation carries; no download.

  python scripts/demo.py --workdir runs/demo [--quick] [--clean]

Each stage is a real command, printed before it runs. `bert-train X ...` runs through the
console script's own entry point, `bert_trainer.cli.main`, in a child process; consecutive
commands share one (scripts/demo_runner.py), which pays TensorFlow's start-up once:
  corpus    the standard library's docstrings as a pretraining corpus (demo/corpus.py)
  task      the fine-tuning task (demo/task.py): which package (asyncio, email,
            importlib, unittest, xml) does a docstring sentence come from; dev = whole held-out
            modules; dev sentences are also removed from the pretraining text
  vocab     bert-train vocab                    (WordPiece, learned from the pretraining text)
  data      bert-train create_pretraining_data  (train shards and a held-out eval shard)
  pretrain  bert-train pretrain --gin_file=configs/demo.gin  (BERT-Tiny, MLM + NSP)
  finetune  bert-train finetune --task=classification        (dev accuracy every 100 steps)
  finetune_scratch  the same fine-tune of the same encoder from random weights (what the
            pretraining bought: the summary and the plot show both)
  evaluate  bert-train evaluate --checkpoint=latest  (the last weights: no selection on dev)
  export    bert-train export                   (text-in SavedModel)
  predict   bert-train predict                  (sentences written for the demo)
then prints a summary (with each stage's wall and CPU seconds), writes WORKDIR/summary.json
and plots WORKDIR/loss_curves.png (scripts/demo_summary.py).

Reruns reuse WORKDIR: data stages whose outputs exist are skipped, and pretraining and
fine-tuning resume from their model directories (when finished, they only evaluate again).
A WORKDIR made with other settings (e.g. --quick) is refused; --clean deletes it first.
Full logs are in WORKDIR/logs/; the terminal shows them without TensorFlow's C++ lines.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

import demo_summary  # scripts/ is sys.path[0] when this file runs as a script
from demo_runner import StageError, Stages, bert_train_args

from bert_trainer.demo import task as demo_task
from bert_trainer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS_FILE = "settings.json"
BERT_TRAIN_ENV = "DEMO_BERT_TRAIN"  # a `bert-train` executable to run commands with (tests)
# The encoder of configs/demo.gin, bound for the from-scratch fine-tune (which must not read
# demo.gin's pretraining schedule); tests/cli/test_demo.py checks both encoders' configs match.
SCRATCH_ENCODER = ("configs/encoders/tiny.gin", ("build_encoder.max_sequence_length = 128",))
# Both fine-tunes run with the encoder's dropout on, whatever the pretraining recipe used.
FINETUNE_BINDINGS = ("FinetuneConfig.encoder_dropout = 0.1",)
# Sentences written for the demo (not from any docstring), with the package a reader expects.
DEMO_SENTENCES = (
    ("The event loop runs the callback after the given delay.", "asyncio"),
    ("Cancel the pending task and wait until it has finished.", "asyncio"),
    ("Return the value of the Subject header of the message.", "email"),
    ("The loader executes the module in a fresh namespace.", "importlib"),
    ("The test fails unless both values are equal.", "unittest"),
    ("Every element node has a tag name, attributes and child nodes.", "xml"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a demo run does; a WORKDIR is only reused with the same settings."""

    corpus_max_bytes: int | None = None  # None: the whole corpus (~1.2 MB)
    vocab_size: int = 6000
    min_token_count: int = 3  # The corpus is small: the learner's default of 10 gives ~2.6k.
    seq_length: int = 64
    dupe_factor: int = 2
    pretrain_steps: int | None = None  # None: configs/demo.gin's
    finetune_epochs: float = 5.0
    finetune_steps: int | None = None  # instead of epochs
    finetune_learning_rate: float = 3e-4
    eval_interval: int = 100  # dev accuracy 4 times in 400 steps, for the curve
    summary_interval: int | None = None  # None: the gin files' (50)
    max_eval_examples: int | None = None


FULL = Settings()
QUICK = Settings(corpus_max_bytes=150_000, vocab_size=1000, min_token_count=2, dupe_factor=1,
                 pretrain_steps=20, finetune_steps=20, eval_interval=20, summary_interval=10,
                 max_eval_examples=64)


def paths(workdir: str) -> dict[str, str]:
    """Every file and directory the demo writes, by name."""
    j = lambda *p: os.path.join(workdir, *p)  # noqa: E731
    return {"corpus": j("corpus.txt"), "task": j("task"),
            "text_train": j("pretrain_text", "train.txt"),
            "text_eval": j("pretrain_text", "eval.txt"),
            "vocab": j("vocab.txt"), "data": j("pretraining_data"), "pretrain": j("pretrain"),
            "finetune": j("finetune"), "finetune_scratch": j("finetune_scratch"),
            "export": j("export"),
            "predict_input": j("predict_input.txt"), "predictions": j("predictions.jsonl"),
            "summary": j("summary.json"), "plot": j("loss_curves.png"), "logs": j("logs")}


def prepare_workdir(workdir: str, settings: Settings, clean: bool) -> None:
    """Creates WORKDIR, or checks that an existing one was made with the same settings."""
    stamp = os.path.join(workdir, SETTINGS_FILE)
    if clean and os.path.isdir(workdir):
        if os.listdir(workdir) and not os.path.isfile(stamp):
            raise UserError(f"--clean: {workdir} is not a demo directory (no {SETTINGS_FILE}); "
                            "delete it yourself or choose another --workdir")
        shutil.rmtree(workdir)
    wanted = dataclasses.asdict(settings)
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            if json.load(f) != wanted:
                raise UserError(f"{workdir} was made with other demo settings ({stamp}); "
                                "pass --clean to start over, or choose another --workdir")
    elif os.path.isdir(workdir) and os.listdir(workdir):
        raise UserError(f"--workdir={workdir} exists and is not a demo directory; choose "
                        "another --workdir")
    os.makedirs(workdir, exist_ok=True)
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(wanted, f, indent=2)


def build_data(stages: Stages, p: dict, s: Settings) -> demo_task.DemoTask:
    """Stages corpus, task, vocab and data: the text and the examples everything trains on."""
    if os.path.isfile(p["corpus"]):
        stages.reuse("corpus", p["corpus"])
    else:
        limit = [f"--max_bytes={s.corpus_max_bytes}"] if s.corpus_max_bytes else []
        args = [f"--output={p['corpus']}.tmp", *limit]
        stages.run("corpus", [sys.executable, os.path.join(REPO, "scripts/make_demo_corpus.py"),
                              *args], ["python", "scripts/make_demo_corpus.py", *args])
        os.replace(p["corpus"] + ".tmp", p["corpus"])  # A cut-short run leaves no corpus.
    task = _task_stage(stages, p)
    batch = []
    # learn_vocab writes vocab.txt only once it has learned it: a cut-short run leaves none.
    if os.path.isfile(p["vocab"]):
        stages.reuse("vocab", p["vocab"])
    else:
        batch.append(("vocab", bert_train_args(
            "vocab", input=p["text_train"], output=p["vocab"], vocab_size=s.vocab_size,
            min_token_count=s.min_token_count)))
    for split, dupe in (("train", s.dupe_factor), ("eval", 1)):
        # create_pretraining_data writes the summary last: it marks a complete split.
        if os.path.isfile(os.path.join(p["data"], f"{split}-summary.json")):
            stages.reuse(f"data_{split}", os.path.join(p["data"], f"{split}-*.tfrecord"))
            continue
        batch.append((f"data_{split}", bert_train_args(
            "create_pretraining_data", input=p[f"text_{split}"], vocab=p["vocab"],
            output=os.path.join(p["data"], f"{split}-*.tfrecord"), max_seq_length=s.seq_length,
            dupe_factor=dupe, num_shards=2 if split == "train" else 1, seed=1, overwrite=True)))
    run_bert_train(stages, batch)
    return task


def _task_stage(stages: Stages, p: dict) -> demo_task.DemoTask:
    """The fine-tuning task's TSVs, and the pretraining text without its dev sentences."""
    if all(map(os.path.isfile, (p["text_train"], p["text_eval"],
                                os.path.join(p["task"], demo_task.STATS_FILE)))):
        stages.reuse("task", p["task"])
        task = demo_task.DemoTask.load(p["task"])
    else:
        task = stages.in_process(
            "task", f"demo_task.build_demo_task: docstring sentences of "
            f"{', '.join(demo_task.PACKAGES)} -> {p['task']}/{{train,dev}}.tsv; the dev "
            f"sentences leave the pretraining text -> {p['text_train']}, {p['text_eval']}",
            lambda: _make_task(p))
    _print_task(task)
    return task


def _make_task(p: dict) -> demo_task.DemoTask:
    task = demo_task.build_demo_task(p["task"])
    stats = demo_task.write_pretraining_corpus(
        p["corpus"], p["text_train"], p["text_eval"],
        exclude=demo_task.read_tsv_sentences(task.dev_file))
    print(f"   pretraining text: {stats['train_documents']} train / {stats['eval_documents']} "
          f"eval documents, {stats['excluded']} dev sentence lines removed", flush=True)
    return task


def _print_task(task: demo_task.DemoTask) -> None:
    print(f"   train {sum(task.train_counts.values())} sentences {task.train_counts}\n"
          f"   dev   {sum(task.dev_counts.values())} sentences {task.dev_counts} from "
          f"{sum(map(len, task.dev_modules.values()))} held-out modules\n"
          f"   majority baseline: always '{task.majority_label}' = "
          f"{task.majority_accuracy:.1%} dev accuracy", flush=True)


def train_and_serve(stages: Stages, p: dict, s: Settings, task: demo_task.DemoTask) -> None:
    """Stages pretrain, finetune, evaluate (one process), export, and predict.

    export and predict each run in a process of their own, as a user runs them: the predict
    stage then shows that the SavedModel loads in a fresh process.
    """
    with open(p["vocab"], encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    steps = [f"TrainerConfig.train_steps = {s.pretrain_steps}"] if s.pretrain_steps else []
    loop = ([f"TrainerConfig.{name} = {s.summary_interval}"
             for name in ("summary_interval", "steps_per_loop")] if s.summary_interval else [])
    length = ([f"--train_steps={s.finetune_steps}"] if s.finetune_steps
              else [f"--num_epochs={s.finetune_epochs}"])

    def finetune(model_dir, start, bindings=()):
        return _with_gin_params(
            ["finetune", "--task=classification", f"--train_file={task.train_file}",
             f"--eval_file={task.dev_file}", *start, f"--model_dir={model_dir}",
             f"--seq_length={s.seq_length}", f"--learning_rate={s.finetune_learning_rate}",
             *length,
             *([f"--max_eval_examples={s.max_eval_examples}"] if s.max_eval_examples else [])],
            [f"TrainerConfig.eval_interval = {s.eval_interval}", *loop, *FINETUNE_BINDINGS,
             *bindings])

    gin_file, encoder = SCRATCH_ENCODER
    run_bert_train(stages, [
        ("pretrain", _with_gin_params(
            ["pretrain", "--gin_file=configs/demo.gin", f"--model_dir={p['pretrain']}",
             f"--train_data={p['data']}/train-*.tfrecord",
             f"--eval_data={p['data']}/eval-*.tfrecord", f"--vocab_file={p['vocab']}"],
            [f"build_encoder.vocab_size = {vocab_size}", *steps, *loop])),
        ("finetune", finetune(p["finetune"], [f"--init_checkpoint={p['pretrain']}"])),
        ("finetune_scratch", finetune(
            p["finetune_scratch"], [f"--vocab_file={p['vocab']}", f"--gin_file={gin_file}"],
            [f"build_encoder.vocab_size = {vocab_size}", *encoder])),
        ("evaluate", bert_train_args("evaluate", model_dir=p["finetune"],
                                     eval_file=task.dev_file, checkpoint="latest",
                                     max_eval_examples=s.max_eval_examples)),
    ])
    run_bert_train(stages, [("export", bert_train_args(
        "export", model_dir=p["finetune"], output=p["export"], checkpoint="latest",
        overwrite=True))])
    with open(p["predict_input"], "w", encoding="utf-8") as f:
        f.writelines(sentence + "\n" for sentence, _ in DEMO_SENTENCES)
    run_bert_train(stages, [("predict", bert_train_args(
        "predict", saved_model=p["export"], input=p["predict_input"],
        output=p["predictions"], overwrite=True))])


def run_bert_train(stages: Stages, batch: list[tuple[str, list[str]]]) -> None:
    """Runs `bert-train` commands, [(stage, [command, *flags]), ...].

    By default in one child process through `cli.main` (scripts/demo_runner.py), which also
    times each command's CPU seconds. With DEMO_BERT_TRAIN naming a `bert-train` executable,
    each command runs as `DEMO_BERT_TRAIN command flags...` (a process of its own; its CPU
    seconds are that process's): tests/cli/test_demo.py points it at tests/cli_host.py's shim.
    """
    executable = os.environ.get(BERT_TRAIN_ENV)
    if not executable:
        stages.bert_train(batch)
        return
    for name, args in batch:
        stages.run(name, [executable, *args], ["bert-train", *args])


def _with_gin_params(args: list[str], bindings: list[str]) -> list[str]:
    """A bert-train command's arguments with --gin_param bindings appended."""
    return args + [f"--gin_param={b}" for b in bindings]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/demo", help="Where everything is written.")
    parser.add_argument("--quick", action="store_true",
                        help="A smoke run of a minute or two: a slice of the corpus, 20 steps.")
    parser.add_argument("--clean", action="store_true", help="Delete --workdir first.")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    start = time.perf_counter()
    try:
        prepare_workdir(args.workdir, settings, args.clean)
        p = paths(args.workdir)
        stages = Stages(p["logs"])
        task = build_data(stages, p, settings)
        train_and_serve(stages, p, settings, task)
        summary = demo_summary.summarize(p, task, DEMO_SENTENCES, stages.timings,
                                         time.perf_counter() - start)
    except (UserError, StageError) as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 1
    summary["paths"]["plot"] = demo_summary.plot(p, summary)
    with open(p["summary"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    demo_summary.print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
