#!/usr/bin/env python3
"""Pretraining quality per minute: what N minutes of pretraining buy, system against system.

Each system pretrains the same encoder size from scratch on the same token sequences (the
public-domain corpus of ../shared/data/corpus plus IMDB's training reviews, one WordPiece
vocabulary learned by `bert-train vocab`) for each wall-clock budget (default 5, 10 and 20
minutes): bert-train one `--time_budget` run per budget (its schedule ends with the budget),
pytorch and keras-hub one run planned for the largest budget with a snapshot at every budget
(counted from the process launch; see quality_systems.py). Each snapshot is
scored by masked-LM accuracy on held-out reviews and by SST-2 dev accuracy after one fixed
fine-tuning recipe (`bert-train finetune --seeds`, mean ± sample std). Systems:

  none            the same encoder from random weights (fine-tuned only)
  bert            `bert-train pretrain --gin_file=configs/mini.gin` (BERT's recipe)
  cram            `bert-train pretrain --gin_file=configs/cram.gin` (the budget recipe)
  cram-post_norm, cram+nsp, cram+dropout, cram-one_cycle, cram-adam
                  cram.gin with one switch reverted (the ablation)
  pytorch         transformers' BertForMaskedLM with run_mlm's recipe (quality_torch.py, in
                  --torch_python / $BERT_TRAIN_TORCH_PYTHON)
  keras-hub       keras-hub's BertMaskedLM with fit (quality_keras_hub.py)

Systems run one after the other, each alone on the machine (the harness waits). Results:
--output (one record per system and budget: steps, mlm_accuracy, sst2_accuracy {mean, std,
seeds}), --plot (PNG), --table (the Markdown block in benchmarks/README.md). The work
directory keeps each stage's results, so a rerun resumes where the last one stopped.

  scripts/bench/quality.py                                   # about 3 hours on 2 cores
  scripts/bench/quality.py --budgets=1,2,4 --seeds=1 --systems=none,bert,cram
"""

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if not p or pathlib.Path(p).resolve() != SCRIPTS_DIR / "bench"]
if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))

from bench import quality_data, quality_report, quality_score, quality_systems  # noqa: E402

REPO = SCRIPTS_DIR.parent
SHARED = REPO.parent / "shared" / "data"
TORCH_PYTHON_ENV = "BERT_TRAIN_TORCH_PYTHON"
DEFAULT_TORCH_PYTHON = "/work/hfenv/bin/python"
SYSTEMS = ("none", *quality_systems.RECIPES, *quality_systems.WORKERS)
DEFAULT_SYSTEMS = "none,bert,cram,pytorch,keras-hub"
SMOKE = dict(seeds=1, hidden_size=32, num_layers=1, num_attention_heads=2,
             inner_dim=64, vocab_size=1000, max_reviews=100, eval_reviews=50,
             max_eval_examples=128, finetune_steps=10, finetune_train_examples=512,
             planned_steps=20, systems="none,cram", budgets="0.2",
             corpus="inaugural/180*.txt")


def system_name(system: str) -> str:
    """The record's name: `none`, `pytorch`, `keras-hub` or `bert-train <recipe>`."""
    return f"bert-train {system}" if system in quality_systems.RECIPES else system


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="5,10,20", help="Snapshot times, minutes.")
    p.add_argument("--seeds", type=int, default=3, help="Fine-tuning seeds per snapshot (1..N).")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"Any of {', '.join(SYSTEMS)}.")
    p.add_argument("--hidden_size", type=int, default=256)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_attention_heads", type=int, default=4)
    p.add_argument("--inner_dim", type=int, default=1024)
    p.add_argument("--seq_length", type=int, default=64)
    p.add_argument("--max_predictions", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=16, help="Pretraining batch.")
    p.add_argument("--learning_rate", type=float, default=5e-4,
                   help="Peak pretraining rate of pytorch and keras-hub (mini.gin's).")
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--corpus", default="*/*.txt",
                   help="Glob of pretraining text files under ../shared/data/corpus.")
    p.add_argument("--eval_reviews", type=int, default=1000, help="IMDB reviews held out.")
    p.add_argument("--max_reviews", type=int, default=None, help="IMDB training reviews used.")
    p.add_argument("--max_eval_examples", type=int, default=4096,
                   help="Held-out sequences scored for masked-LM accuracy.")
    p.add_argument("--finetune_steps", type=int, default=400)
    p.add_argument("--finetune_learning_rate", type=float, default=2e-4)
    p.add_argument("--finetune_batch_size", type=int, default=32)
    p.add_argument("--finetune_train_examples", type=int, default=None,
                   help="Fine-tune on the first N SST-2 training sentences (default: all).")
    p.add_argument("--calibrate_steps", type=int, default=30,
                   help="Steps of the pytorch and keras-hub calibration runs (their step "
                        "rate; bert-train runs on --time_budget).")
    p.add_argument("--planned_steps", type=int, default=None,
                   help="Skip the pytorch and keras-hub calibration: their schedules end at "
                        "this step.")
    p.add_argument("--workdir", default="runs/bench_quality")
    p.add_argument("--output", default="benchmarks/results_quality.json")
    p.add_argument("--plot", default=None, help="PNG to write (default: --output's, .png).")
    p.add_argument("--table", default=None, help="Markdown file whose quality table to replace.")
    p.add_argument("--note", default="", help="Recorded with the results (e.g. machine load).")
    p.add_argument("--torch_python", default=None,
                   help=f"Python with torch + transformers (default ${TORCH_PYTHON_ENV}, "
                        f"else {DEFAULT_TORCH_PYTHON}).")
    p.add_argument("--smoke", action="store_true", help="Seconds-long budgets and tiny sizes.")
    return p


def parse_args(argv) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.smoke:
        given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    args.torch_python = (args.torch_python or os.environ.get(TORCH_PYTHON_ENV)
                         or DEFAULT_TORCH_PYTHON)
    return args


def check(args) -> str | None:
    """A one-line problem with the flags or inputs, or None."""
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        return f"--systems: {unknown[0]!r} is unknown; choose from {', '.join(SYSTEMS)}"
    try:
        budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        return f"--budgets={args.budgets!r}: give minutes, e.g. 5,10,20"
    if not budgets or min(budgets) <= 0:
        return f"--budgets={args.budgets!r}: every budget must be > 0 minutes"
    if args.seeds < 1:
        return f"--seeds={args.seeds} must be >= 1"
    if args.calibrate_steps < 20 and not args.planned_steps:
        return (f"--calibrate_steps={args.calibrate_steps} must be >= 20 (two loops of 10: the "
                "first one's rate includes tracing)")
    for path in (SHARED / "corpus", SHARED / "imdb" / "train.tsv", SHARED / "sst2" / "train.tsv",
                 SHARED / "sst2" / "dev.tsv"):
        if not path.exists():
            return f"{path} is missing: the benchmark reads ../shared/data (see its README.md)"
    if "pytorch" in systems:
        done = None
        if os.path.isfile(args.torch_python) and os.access(args.torch_python, os.X_OK):
            done = subprocess.run(
                [args.torch_python, "-c", "import torch, transformers, accelerate"],
                capture_output=True, text=True)
        if done is None or done.returncode:
            return (f"--torch_python={args.torch_python} cannot import torch, transformers and "
                    "accelerate; "
                    f"make one (python3.11 -m venv /work/hfenv && /work/hfenv/bin/pip install "
                    f"torch==2.13.0 transformers accelerate) or drop pytorch from --systems")
    return None


def _cached(path: str, make):
    """`make()`'s JSON result, kept at `path` so that a rerun reuses it."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    value = make()
    quality_report.write_json(path, value)
    return value


def sst2_files(args, workdir: str) -> tuple[str, str]:
    train = str(SHARED / "sst2" / "train.tsv")
    if args.finetune_train_examples:
        cut = os.path.join(workdir, "data", "sst2_train.tsv")
        with open(train, encoding="utf-8") as f:
            lines = f.readlines()[:args.finetune_train_examples + 1]
        with open(cut, "w", encoding="utf-8") as f:
            f.writelines(lines)
        train = cut
    return train, str(SHARED / "sst2" / "dev.tsv")


def run(args, log=print) -> dict:
    workdir = os.path.abspath(args.workdir)
    budgets_s = tuple(60.0 * float(b) for b in args.budgets.split(","))
    sizes = dict(hidden_size=args.hidden_size, num_layers=args.num_layers,
                 num_attention_heads=args.num_attention_heads, inner_dim=args.inner_dim,
                 max_sequence_length=512 if args.seq_length <= 512 else args.seq_length)
    data = quality_data.prepare(
        workdir, corpus_glob=str(SHARED / "corpus" / args.corpus),
        imdb_file=str(SHARED / "imdb" / "train.tsv"), vocab_size=args.vocab_size,
        seq_length=args.seq_length, max_predictions=args.max_predictions,
        eval_reviews=args.eval_reviews, max_reviews=args.max_reviews,
        max_eval_examples=args.max_eval_examples, log=log)
    setup = quality_systems.Setup(
        sizes=sizes, seq_length=args.seq_length, max_predictions=args.max_predictions,
        batch_size=args.batch_size, learning_rate=args.learning_rate, budgets_s=budgets_s,
        calibrate_steps=args.calibrate_steps, planned_steps=args.planned_steps)
    train_file, dev_file = sst2_files(args, workdir)
    recipe = quality_score.FinetuneRecipe(
        train_file, dev_file, args.finetune_steps, args.finetune_learning_rate,
        args.finetune_batch_size, args.seq_length, tuple(range(1, args.seeds + 1)))
    scratch = [*quality_systems.size_bindings(setup),
               f"build_encoder.vocab_size = {data.vocab_size}"]
    load = [os.getloadavg()]
    runs = []
    for system in args.systems.split(","):
        out = os.path.join(workdir, system)
        os.makedirs(out, exist_ok=True)
        log(f"== {system_name(system)}")
        if system == "none":
            snapshots = [{"seconds": 0.0, "step": 0, "elapsed": 0.0, "dir": None}]
        else:
            pretrained = _cached(os.path.join(out, "pretrain.json"), lambda s=system, o=out: (
                quality_systems.bert_train_pretrain(s, data, setup, o, log)
                if s in quality_systems.RECIPES else quality_systems.worker_pretrain(
                    s, data, setup, o, args.torch_python if s == "pytorch" else sys.executable,
                    log)))
            snapshots = pretrained["snapshots"]
        for snap in snapshots:
            runs.append(score(system, snap, data, recipe, scratch, sizes, out, log))
        load.append(os.getloadavg())
    return {"benchmark": "pretraining quality per minute", "note": args.note,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_1m_per_system": [round(x[0], 2) for x in load]},
            "settings": {"budgets_minutes": [b / 60 for b in budgets_s], "sizes": sizes,
                         "seq_length": args.seq_length, "max_predictions": args.max_predictions,
                         "batch_size": args.batch_size, "vocab_size": data.vocab_size,
                         "finetune": {**dataclasses.asdict(recipe), "encoder_dropout": 0.1},
                         "seeds": list(recipe.seeds),
                         "mlm_eval_examples": args.max_eval_examples},
            "runs": runs}


def score(system, snap, data, recipe, scratch, sizes, out, log) -> dict:
    """One record: the snapshot's masked-LM and SST-2 accuracies (cached in `out`)."""
    minutes = snap["seconds"] / 60
    record = {"system": system_name(system), "minutes": minutes, "steps": snap["step"],
              "elapsed_minutes": None if snap["elapsed"] is None else snap["elapsed"] / 60,
              "mlm_accuracy": None, "sst2_accuracy": None}
    if system != "none" and snap["dir"] is None:
        log(f"{system}: no snapshot by {minutes:g} min")
        return record
    tag = f"{minutes:g}min"

    def evaluate():
        mlm = quality_score.mlm_accuracy(snap["dir"], data.eval_npz, sizes=sizes,
                                         vocab_size=data.vocab_size)
        sst2 = quality_score.sst2_accuracy(
            snap["dir"], recipe, os.path.join(out, f"sst2-{tag}"),
            vocab_file=data.vocab_file, scratch_bindings=scratch,
            log_file=os.path.join(out, f"sst2-{tag}.log"))
        return {"mlm_accuracy": mlm, "sst2_accuracy": sst2}

    record.update(_cached(os.path.join(out, f"score-{tag}.json"), evaluate))
    sst2 = record["sst2_accuracy"]
    log(f"{record['system']} @ {minutes:g} min, step {record['steps']}: masked LM "
        f"{100 * record['mlm_accuracy']:.1f} %, SST-2 {100 * sst2['mean']:.1f} %")
    return record


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    started = time.time()
    record = run(args)
    record["wall_minutes"] = round((time.time() - started) / 60, 1)
    quality_report.write_json(args.output, record)
    plot = args.plot or os.path.splitext(args.output)[0] + ".png"
    quality_report.plot(record, plot)
    if args.table:
        quality_report.replace_table(args.table, record, f"Results: `{args.output}` "
                                     f"({args.note or 'see its note'}); plot: `{plot}`.")
    print(f"wrote {args.output} and {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
