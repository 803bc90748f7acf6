"""`make demo`: bert-train end to end on text every Python installation carries; no download.

  python scripts/demo.py --workdir runs/demo [--quick] [--clean]

Each stage is a real command in a subprocess, printed before it runs (`bert-train X` is what
runs, as `python -m bert_trainer.cli X`, the console script's own entry point):
  corpus    the standard library's docstrings as a pretraining corpus (data/demo_corpus.py)
  task      the fine-tuning task (data/demo_task.py): which package (asyncio, email,
            importlib, unittest, xml) does a docstring sentence come from; dev = whole held-out
            modules; dev sentences are also removed from the pretraining text
  vocab     bert-train vocab                    (WordPiece, learned from the pretraining text)
  data      bert-train create_pretraining_data  (train shards and a held-out eval shard)
  pretrain  bert-train pretrain --gin_file=configs/demo.gin  (BERT-Tiny, MLM + NSP)
  finetune  bert-train finetune --task=classification        (dev accuracy every 50 steps)
  evaluate  bert-train evaluate --checkpoint=latest  (the last weights: no selection on dev)
  export    bert-train export                   (text-in SavedModel)
  predict   bert-train predict                  (sentences written for the demo)
then prints a summary, writes WORKDIR/summary.json and plots WORKDIR/loss_curves.png.

Reruns reuse WORKDIR: data stages whose outputs exist are skipped, and pretraining and
fine-tuning resume from their model directories (when finished, they only evaluate again).
A WORKDIR made with other settings (e.g. --quick) is refused; --clean deletes it first.
Full logs are in WORKDIR/logs/; the terminal shows them without TensorFlow's C++ lines.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from bert_trainer import plotting
from bert_trainer.data import demo_task
from bert_trainer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS_FILE = "settings.json"
# TensorFlow's C++ log lines (glog format: "E0000 00:00:17952.. 123 file.cc:52] ...").
_NATIVE_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]")
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
    eval_interval: int = 50
    summary_interval: int | None = None  # None: the gin files' (50)
    max_eval_examples: int | None = None


FULL = Settings()
QUICK = Settings(corpus_max_bytes=150_000, vocab_size=1000, min_token_count=2, dupe_factor=1,
                 pretrain_steps=20, finetune_steps=20, eval_interval=10, summary_interval=10,
                 max_eval_examples=64)


class StageError(RuntimeError):
    """A stage's command failed; the message names the stage and its log."""


class Stages:
    """Runs stages, prints each command first, tees output to WORKDIR/logs, times them."""

    def __init__(self, workdir: str):
        self.log_dir = paths(workdir)["logs"]
        os.makedirs(self.log_dir, exist_ok=True)
        self.timings = []  # (stage, seconds, "ran" | "reused")

    def reuse(self, name: str, what: str) -> None:
        print(f"\n== {name}: reusing {what}", flush=True)
        self.timings.append((name, 0.0, "reused"))

    def run(self, name: str, argv: list[str], shown: list[str]) -> None:
        """Runs `argv`, printing `shown` (the same command as a user would type it)."""
        print(f"\n== {name}\n$ {shlex.join(shown)}", flush=True)
        start = time.perf_counter()
        log_path = os.path.join(self.log_dir, f"{name}.log")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        with open(log_path, "w", encoding="utf-8") as log, subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                errors="replace") as child:
            for line in child.stdout:
                log.write(line)
                if not _NATIVE_LOG.match(line) and "Sharding callback" not in line:
                    print("   " + line.rstrip(), flush=True)
        if child.returncode:
            raise StageError(f"stage {name} failed with exit code {child.returncode}: "
                             f"{shlex.join(shown)}; full log: {log_path}")
        self.timings.append((name, time.perf_counter() - start, "ran"))

    def bert_train(self, name: str, command: str, **flags) -> None:
        args = [f"--{k}={v}" for k, v in flags.items() if v is not None and v is not False]
        args = [a.removesuffix("=True") for a in args]
        self.run(name, [sys.executable, "-m", "bert_trainer.cli", command, *args],
                 ["bert-train", command, *args])

    def in_process(self, name: str, description: str, fn):
        print(f"\n== {name}\n# {description}", flush=True)
        start = time.perf_counter()
        result = fn()
        self.timings.append((name, time.perf_counter() - start, "ran"))
        return result


def paths(workdir: str) -> dict[str, str]:
    """Every file and directory the demo writes, by name."""
    j = lambda *p: os.path.join(workdir, *p)  # noqa: E731
    return {"corpus": j("corpus.txt"), "task": j("task"),
            "text_train": j("pretrain_text", "train.txt"),
            "text_eval": j("pretrain_text", "eval.txt"),
            "vocab": j("vocab.txt"), "data": j("pretraining_data"), "pretrain": j("pretrain"),
            "finetune": j("finetune"), "export": j("export"),
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
    if os.path.isfile(p["vocab"]):
        stages.reuse("vocab", p["vocab"])
    else:
        stages.bert_train("vocab", "vocab", input=p["text_train"], output=p["vocab"] + ".tmp",
                          vocab_size=s.vocab_size, min_token_count=s.min_token_count)
        os.replace(p["vocab"] + ".tmp", p["vocab"])
    for split, dupe in (("train", s.dupe_factor), ("eval", 1)):
        # create_pretraining_data writes the summary last: it marks a complete split.
        if os.path.isfile(os.path.join(p["data"], f"{split}-summary.json")):
            stages.reuse(f"data_{split}", os.path.join(p["data"], f"{split}-*.tfrecord"))
            continue
        stages.bert_train(f"data_{split}", "create_pretraining_data", input=p[f"text_{split}"],
                          vocab=p["vocab"], output=os.path.join(p["data"], f"{split}-*.tfrecord"),
                          max_seq_length=s.seq_length, dupe_factor=dupe,
                          num_shards=2 if split == "train" else 1, seed=1, overwrite=True)
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
    """Stages pretrain, finetune, evaluate, export and predict."""
    with open(p["vocab"], encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    steps = [f"TrainerConfig.train_steps = {s.pretrain_steps}"] if s.pretrain_steps else []
    loop = ([f"TrainerConfig.{name} = {s.summary_interval}"
             for name in ("summary_interval", "steps_per_loop")] if s.summary_interval else [])
    stages.run("pretrain", *_with_gin_params(
        ["pretrain", "--gin_file=configs/demo.gin", f"--model_dir={p['pretrain']}",
         f"--train_data={p['data']}/train-*.tfrecord",
         f"--eval_data={p['data']}/eval-*.tfrecord", f"--vocab_file={p['vocab']}"],
        [f"build_encoder.vocab_size = {vocab_size}", *steps, *loop]))
    length = ([f"--train_steps={s.finetune_steps}"] if s.finetune_steps
              else [f"--num_epochs={s.finetune_epochs}"])
    stages.run("finetune", *_with_gin_params(
        ["finetune", "--task=classification", f"--train_file={task.train_file}",
         f"--eval_file={task.dev_file}", f"--init_checkpoint={p['pretrain']}",
         f"--model_dir={p['finetune']}", f"--seq_length={s.seq_length}",
         f"--learning_rate={s.finetune_learning_rate}", *length,
         *([f"--max_eval_examples={s.max_eval_examples}"] if s.max_eval_examples else [])],
        [f"TrainerConfig.eval_interval = {s.eval_interval}", *loop]))
    stages.bert_train("evaluate", "evaluate", model_dir=p["finetune"], eval_file=task.dev_file,
                      checkpoint="latest", max_eval_examples=s.max_eval_examples)
    stages.bert_train("export", "export", model_dir=p["finetune"], output=p["export"],
                      checkpoint="latest", overwrite=True)
    with open(p["predict_input"], "w", encoding="utf-8") as f:
        f.writelines(sentence + "\n" for sentence, _ in DEMO_SENTENCES)
    stages.bert_train("predict", "predict", saved_model=p["export"], input=p["predict_input"],
                      output=p["predictions"])


def _with_gin_params(args: list[str], bindings: list[str]) -> tuple[list, list]:
    """(argv, shown) of a bert-train command with --gin_param bindings."""
    args = args + [f"--gin_param={b}" for b in bindings]
    return [sys.executable, "-m", "bert_trainer.cli", *args], ["bert-train", *args]


# ------------------------------------------------------------------------------- summary


def _first_last(scalars: dict, tag: str) -> dict | None:
    """The first and last logged values of a training loss.

    Each is the mean over the steps since the previous summary: `first` over steps
    1..first_step, `last` over last_window_start..last_step.
    """
    if tag not in scalars:
        return None
    steps, values = scalars[tag]
    return {"first_step": steps[0], "first": values[0], "last_step": steps[-1],
            "last_window_start": steps[-2] + 1 if len(steps) > 1 else 1, "last": values[-1]}


def _scalars(model_dir: str, split: str) -> dict:
    try:
        return plotting.read_scalars(os.path.join(model_dir, split))
    except UserError:  # No events (a run that logged nothing yet): nothing to report.
        return {}


def summarize(p: dict, task: demo_task.DemoTask, timings: list, wall: float) -> dict:
    """Everything the summary shows, as JSON-ready data (written to summary.json)."""
    pretrain, finetune = {}, {}
    for out, model_dir, tags in ((pretrain, p["pretrain"], ("loss", "mlm_loss", "nsp_loss")),
                                 (finetune, p["finetune"], ("loss",))):
        train, evals = _scalars(model_dir, "train"), _scalars(model_dir, "eval")
        out["steps"] = max((s[0][-1] for s in train.values()), default=0)
        out["train"] = {tag: _first_last(train, tag) for tag in tags}
        out["eval"] = {tag: values[-1] for tag, (_, values) in sorted(evals.items())}
    with open(os.path.join(p["finetune"], "eval_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    with open(p["predictions"], encoding="utf-8") as f:
        answers = [json.loads(line) for line in f if line.strip()]
    predictions = [{"text": a["text"], "label": a["label"], "expected": expected,
                    "probability": max(a["probabilities"])}
                   for a, (_, expected) in zip(answers, DEMO_SENTENCES, strict=True)]
    return {
        "task": {"question": "which standard-library package does a docstring sentence "
                             "come from", "labels": list(task.label_names),
                 "train_examples": sum(task.train_counts.values()),
                 "dev_examples": sum(task.dev_counts.values()),
                 "dev_modules": task.dev_modules},
        "pretrain": pretrain, "finetune": finetune,
        "dev": {"accuracy": results["metrics"].get("accuracy"),
                "num_examples": results["metrics"].get("num_examples"),
                "checkpoint": results.get("checkpoint"), "step": results.get("step"),
                "majority_baseline": task.majority_accuracy,
                "majority_label": task.majority_label},
        "predictions": predictions,
        "stages": [{"stage": n, "seconds": round(t, 1), "status": st} for n, t, st in timings],
        "wall_seconds": round(wall, 1),
        "paths": dict(p),
        "tensorboard": f"tensorboard --logdir {os.path.dirname(p['summary']) or '.'}",
    }


def plot(p: dict, summary: dict) -> str | None:
    """Draws the loss curves PNG; None (with a warning) when matplotlib is missing."""
    pre_train, pre_eval = _scalars(p["pretrain"], "train"), _scalars(p["pretrain"], "eval")
    ft_train, ft_eval = _scalars(p["finetune"], "train"), _scalars(p["finetune"], "eval")
    curve = lambda label, runs, tag, style="-": plotting.Curve(  # noqa: E731
        label, *runs.get(tag, ((), ())), style=style)
    panels = [
        plotting.Panel("Pretraining: BERT-Tiny on stdlib docstrings", (
            curve("train MLM loss", pre_train, "mlm_loss"),
            curve("held-out MLM loss", pre_eval, "mlm_loss", "o--"),
            curve("train NSP loss", pre_train, "nsp_loss"),
            curve("held-out NSP loss", pre_eval, "nsp_loss", "o--"))),
        plotting.Panel("Fine-tuning: which package?", (
            curve("train loss", ft_train, "loss"),
            curve("dev loss", ft_eval, "loss", "o--"))),
        plotting.Panel("Fine-tuning: dev accuracy (held-out modules)", (
            curve("dev accuracy", ft_eval, "accuracy", "o-"),),
            ylabel="accuracy", ylim=(0.0, 1.0), references=(
                (f"majority baseline ({summary['dev']['majority_baseline']:.1%})",
                 summary["dev"]["majority_baseline"]),)),
    ]
    try:
        return plotting.plot_panels(panels, p["plot"], title="bert-train demo")
    except UserError as e:
        print(f"demo: warning: no loss-curve PNG: {e}", file=sys.stderr)
        return None


def print_summary(summary: dict) -> None:
    pre, ft, dev = summary["pretrain"], summary["finetune"], summary["dev"]
    lines = ["", "=" * 78, "bert-train demo: summary", "=" * 78]
    for name, run in (("pretrain", pre), ("finetune", ft)):
        lines.append(f"{name:<9} {run['steps']} steps; mean train losses, first -> last window:")
        lines += [f"{'':<11}{tag:<9} {v['first']:.3f} (steps 1-{v['first_step']}) -> "
                  f"{v['last']:.3f} (steps {v['last_window_start']}-{v['last_step']})"
                  for tag, v in run["train"].items() if v]
    held = ", ".join(f"{k} {v:.3f}" for k, v in pre["eval"].items()
                     if k in ("mlm_loss", "mlm_accuracy", "nsp_accuracy"))
    lines.append(f"{'':<9} held-out pretraining text: {held}")
    lines.append(f"dev       accuracy {dev['accuracy']:.1%} on {dev['num_examples']:.0f} "
                 f"sentences of held-out modules (step {dev['step']}, last checkpoint) vs "
                 f"majority baseline {dev['majority_baseline']:.1%} ('{dev['majority_label']}')")
    lines.append("predict   (sentences written for the demo; expected = a reader's guess)")
    for row in summary["predictions"]:
        mark = "ok" if row["label"] == row["expected"] else "  "
        lines.append(f"  {mark} {row['label']:<9} {row['probability']:.2f}  "
                     f"(expected {row['expected']:<9}) {row['text']}")
    lines.append("stages    " + ", ".join(
        f"{s['stage']} {s['seconds']:.0f}s" if s["status"] == "ran" else f"{s['stage']} reused"
        for s in summary["stages"]) + f"; total {summary['wall_seconds']:.0f}s")
    lines.append("outputs")
    for key in ("pretrain", "finetune", "export", "predictions", "plot", "summary", "logs"):
        lines.append(f"  {key:<12} {summary['paths'][key] or '(none: see the warning above)'}")
    lines.append(f"TensorBoard  {summary['tensorboard']}")
    print("\n".join(lines), flush=True)


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
        stages = Stages(args.workdir)
        task = build_data(stages, p, settings)
        train_and_serve(stages, p, settings, task)
        summary = summarize(p, task, stages.timings, time.perf_counter() - start)
    except (UserError, StageError) as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 1
    summary["paths"]["plot"] = plot(p, summary)
    with open(p["summary"], "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
