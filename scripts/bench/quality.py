#!/usr/bin/env python3
"""Pretraining quality per minute: what N minutes of pretraining buy, system against system.

Each system pretrains the same encoder size from scratch on the same token sequences (the
public-domain corpus of ../shared/data/corpus plus IMDB's training reviews, one WordPiece
vocabulary learned by `bert-train vocab`), one run per wall-clock budget (default 5, 10 and
20 minutes) whose learning-rate schedule ends with that budget; every system's budget is its
training loop's wall time, the start-up before it excluded and recorded (quality_systems.py).
`--sizes` sweeps encoder sizes (configs/encoders/<size>.gin: tiny, mini, small) at each
budget. Each snapshot is scored by masked-LM accuracy on held-out reviews, by SST-2 dev
accuracy after one fixed fine-tuning recipe on all of SST-2's training sentences, and after a
low-resource one on its first `--low_resource_examples` (2,000) sentences (`bert-train
finetune --seeds`, mean ± sample std each). Systems:

  none            the same encoder from random weights (fine-tuned only)
  bert            `bert-train pretrain --gin_file=configs/mini.gin` (BERT's recipe, masked LM
                  only since next-sentence prediction was found to cost SST-2 points)
  bert+nsp        mini.gin with next-sentence prediction (BERT's recipe as it was)
  cram            `bert-train pretrain --gin_file=configs/cram.gin` (the budget recipe)
  cram-post_norm, cram+nsp, cram+dropout, cram-one_cycle, cram-adam
                  cram.gin with one switch reverted (the ablation)
  pytorch         transformers' BertForMaskedLM with run_mlm's recipe (quality_torch.py, in
                  --torch_python / $BERT_TRAIN_TORCH_PYTHON)
  keras-hub       keras-hub's BertMaskedLM with fit (quality_keras_hub.py)

Systems run one after the other, each alone on the machine (the harness waits). Results:
--output (one record per size, system and budget: size, steps, startup_seconds,
mlm_accuracy, sst2_accuracy and sst2_2k_accuracy {mean, std, seeds}), --plot (PNG), --table
(the Markdown block in benchmarks/README.md). The work directory keeps each stage's results,
so a rerun resumes where the last one stopped.

  scripts/bench/quality.py                                   # about 4 hours on 2 cores
  scripts/bench/quality.py --budgets=1,2,4 --seeds=1 --systems=none,bert,cram
  scripts/bench/quality.py --sizes=tiny,mini,small --systems=none,cram,pytorch
"""

import argparse
import dataclasses
import os
import pathlib
import platform
import re
import subprocess
import sys

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if not p or pathlib.Path(p).resolve() != SCRIPTS_DIR / "bench"]
if str(SCRIPTS_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPTS_DIR))

from bench import (  # noqa: E402
    harness_flags,
    quality_data,
    quality_report,
    quality_score,
    quality_systems,
    report,
)

REPO = SCRIPTS_DIR.parent
SHARED = REPO.parent / "shared" / "data"
TORCH_PYTHON_ENV = "BERT_TRAIN_TORCH_PYTHON"
DEFAULT_TORCH_PYTHON = "/work/hfenv/bin/python"
SYSTEMS = ("none", *quality_systems.RECIPES, *quality_systems.WORKERS)
DEFAULT_SYSTEMS = "none,bert,cram,pytorch,keras-hub"
ENCODERS = REPO / "configs" / "encoders"
SIZE_KEYS = ("hidden_size", "num_layers", "num_attention_heads", "inner_dim")
CUSTOM = "custom"  # the size of --hidden_size, --num_layers, --num_attention_heads, --inner_dim
SMOKE = dict(seeds=1, sizes=CUSTOM, hidden_size=32, num_layers=1, num_attention_heads=2,
             inner_dim=64, vocab_size=1000, max_reviews=100, eval_reviews=50,
             max_eval_examples=128, finetune_steps=10, finetune_train_examples=512,
             low_resource_examples=200, low_resource_steps=10, systems="none,cram",
             budgets="0.2", corpus="inaugural/180*.txt")


def system_name(system: str) -> str:
    """The record's name: `none`, `pytorch`, `keras-hub` or `bert-train <recipe>`."""
    return f"bert-train {system}" if system in quality_systems.RECIPES else system


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="5,10,20", help="Snapshot times, minutes.")
    p.add_argument("--seeds", type=int, default=3, help="Fine-tuning seeds per snapshot (1..N).")
    p.add_argument("--sizes", default="mini",
                   help="Encoder sizes to sweep at each budget: configs/encoders/<size>.gin "
                        f"names (tiny, mini, small, ...), or {CUSTOM!r} (--hidden_size ...).")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"Any of {', '.join(SYSTEMS)}.")
    p.add_argument("--hidden_size", type=int, default=256, help=f"With --sizes={CUSTOM}.")
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
    p.add_argument("--low_resource_examples", type=int, default=2000,
                   help="The low-resource fine-tune: SST-2's first N training sentences.")
    p.add_argument("--low_resource_steps", type=int, default=250,
                   help="Steps of the low-resource fine-tune (250 of batch 32: 4 epochs).")
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
    harness_flags.apply_smoke(args, argv, SMOKE)
    args.torch_python = harness_flags.torch_python(args.torch_python, TORCH_PYTHON_ENV,
                                                   DEFAULT_TORCH_PYTHON)
    return args


def check(args) -> str | None:
    """A one-line problem with the flags or inputs, or None."""
    problem = harness_flags.check_runs(args, SYSTEMS)
    if problem:
        return problem
    systems = args.systems.split(",")
    known = sorted(p.stem for p in ENCODERS.glob("*.gin"))
    for size in args.sizes.split(","):
        if size != CUSTOM and size not in known:
            return (f"--sizes: {size!r} is not in configs/encoders/; choose from "
                    f"{', '.join(known)} or {CUSTOM}")
        if size != CUSTOM and not all(k in encoder_size(size) for k in SIZE_KEYS):
            return f"--sizes: configs/encoders/{size}.gin does not bind every one of {SIZE_KEYS}"
    if args.low_resource_examples < 1 or args.low_resource_steps < 1:
        return "--low_resource_examples and --low_resource_steps must be >= 1"
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


def encoder_size(name: str) -> dict:
    """The `build_encoder.<size key> = N` bindings of configs/encoders/<name>.gin."""
    text = (ENCODERS / f"{name}.gin").read_text(encoding="utf-8")
    return {k: int(v) for k, v in re.findall(r"^build_encoder\.(\w+)\s*=\s*(\d+)\s*$", text,
                                              re.MULTILINE) if k in SIZE_KEYS}


def encoder_sizes(args) -> dict[str, dict]:
    """{size name: the encoder's dimensions} for every size of --sizes."""
    out = {}
    for name in args.sizes.split(","):
        dims = (encoder_size(name) if name != CUSTOM else
                {k: getattr(args, k) for k in SIZE_KEYS})
        out[name] = {**dims, "max_sequence_length": max(512, args.seq_length)}
    return out


def cut_tsv(source: str, examples: int | None, dest: str) -> str:
    """`source`'s header and first `examples` rows written to `dest` (None: `source`)."""
    if not examples:
        return source
    with open(source, encoding="utf-8") as f:
        lines = f.readlines()[:examples + 1]
    with open(dest, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return dest


def finetune_recipes(args, workdir: str) -> dict[str, quality_score.FinetuneRecipe]:
    """The full SST-2 fine-tune (`sst2_accuracy`) and the low-resource one (`sst2_2k_accuracy`)."""
    train, dev = str(SHARED / "sst2" / "train.tsv"), str(SHARED / "sst2" / "dev.tsv")
    data = os.path.join(workdir, "data")
    seeds = tuple(range(1, args.seeds + 1))
    full = cut_tsv(train, args.finetune_train_examples, os.path.join(data, "sst2_train.tsv"))
    low = cut_tsv(train, args.low_resource_examples, os.path.join(data, "sst2_train_low.tsv"))
    common = (args.finetune_learning_rate, args.finetune_batch_size, args.seq_length, seeds)
    return {"sst2_accuracy": quality_score.FinetuneRecipe(full, dev, args.finetune_steps,
                                                          *common),
            "sst2_2k_accuracy": quality_score.FinetuneRecipe(low, dev, args.low_resource_steps,
                                                             *common)}


def run(args, log=print) -> dict:
    workdir = os.path.abspath(args.workdir)
    budgets_s = tuple(60.0 * float(b) for b in args.budgets.split(","))
    sizes = encoder_sizes(args)
    data = quality_data.prepare(
        workdir, corpus_glob=str(SHARED / "corpus" / args.corpus),
        imdb_file=str(SHARED / "imdb" / "train.tsv"), vocab_size=args.vocab_size,
        seq_length=args.seq_length, max_predictions=args.max_predictions,
        eval_reviews=args.eval_reviews, max_reviews=args.max_reviews,
        max_eval_examples=args.max_eval_examples, log=log)
    recipes = finetune_recipes(args, workdir)
    load = [os.getloadavg()]
    runs = []
    for size, dims in sizes.items():
        setup = quality_systems.Setup(
            sizes=dims, seq_length=args.seq_length, max_predictions=args.max_predictions,
            batch_size=args.batch_size, learning_rate=args.learning_rate, budgets_s=budgets_s)
        scratch = [*quality_systems.size_bindings(setup),
                   f"build_encoder.vocab_size = {data.vocab_size}"]
        for system in args.systems.split(","):
            out = os.path.join(workdir, size, system)
            os.makedirs(out, exist_ok=True)
            log(f"== {size}: {system_name(system)}")
            if system == "none":
                snapshots = [{"seconds": 0.0, "step": 0, "elapsed": 0.0, "dir": None}]
            else:
                pretrained = quality_report.cached_json(
                    os.path.join(out, "pretrain.json"),
                    lambda s=system, o=out, u=setup: pretrain(s, data, u, o, args, log))
                snapshots = pretrained["snapshots"]
            for snap in snapshots:
                runs.append({"size": size, **score(system, snap, data, recipes, scratch, dims,
                                                   out, log)})
            load.append(os.getloadavg())
    return {"benchmark": "pretraining quality per minute", "note": args.note,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_1m_per_system": [round(x[0], 2) for x in load]},
            "settings": {"budgets_minutes": [b / 60 for b in budgets_s], "sizes": sizes,
                         "seq_length": args.seq_length, "max_predictions": args.max_predictions,
                         "batch_size": args.batch_size, "vocab_size": data.vocab_size,
                         "budget_counts": "each system's training loop; start-up excluded "
                                          "(startup_seconds)",
                         "finetune": {k: {**dataclasses.asdict(r), "encoder_dropout": 0.1}
                                      for k, r in recipes.items()},
                         "seeds": list(recipes["sst2_accuracy"].seeds),
                         "mlm_eval_examples": args.max_eval_examples},
            "runs": runs}


def pretrain(system, data, setup, out, args, log) -> dict:
    """One pretraining run per budget of `system` (a bert-train recipe or a worker)."""
    if system in quality_systems.RECIPES:
        return quality_systems.bert_train_pretrain(system, data, setup, out, log)
    python = args.torch_python if system == "pytorch" else sys.executable
    return quality_systems.worker_pretrain(system, data, setup, out, python, log)


def score(system, snap, data, recipes, scratch, sizes, out, log) -> dict:
    """One record: the snapshot's masked-LM accuracy and its accuracy after each fine-tune of
    `recipes` (cached in `out`)."""
    minutes = snap["seconds"] / 60
    record = {"system": system_name(system), "minutes": minutes, "steps": snap["step"],
              "elapsed_minutes": None if snap["elapsed"] is None else snap["elapsed"] / 60,
              "startup_seconds": snap.get("startup"), "loop_seconds": snap.get("loop_seconds"),
              "mlm_accuracy": None, **dict.fromkeys(recipes)}
    if system != "none" and snap["dir"] is None:
        log(f"{system}: no snapshot by {minutes:g} min")
        return record
    tag = f"{minutes:g}min"

    def evaluate():
        scores = {"mlm_accuracy": quality_score.mlm_accuracy(
            snap["dir"], data.eval_npz, sizes=sizes, vocab_size=data.vocab_size)}
        for key, recipe in recipes.items():
            name = f"{key.removesuffix('_accuracy')}-{tag}"
            scores[key] = quality_score.sst2_accuracy(
                snap["dir"], recipe, os.path.join(out, name), vocab_file=data.vocab_file,
                scratch_bindings=scratch, log_file=os.path.join(out, f"{name}.log"))
        return scores

    record.update(quality_report.cached_json(os.path.join(out, f"score-{tag}.json"), evaluate))
    sst2, low = record["sst2_accuracy"], record["sst2_2k_accuracy"]
    log(f"{record['system']} @ {minutes:g} min, step {record['steps']}: masked LM "
        f"{100 * record['mlm_accuracy']:.1f} %, SST-2 {100 * sst2['mean']:.1f} %, "
        f"low-resource {100 * low['mean']:.1f} %")
    return record


def publish(args, record: dict) -> None:
    """The plot, the README table and the summary line of a written record."""
    plot = args.plot or os.path.splitext(args.output)[0] + ".png"
    quality_report.plot(record, plot)
    if args.table:
        quality_report.replace_table(args.table, record, f"Results: `{args.output}` "
                                     f"({args.note or 'see its note'}); plot: `{plot}`.")
    print(f"wrote {args.output} and {plot}")


def main(argv=None) -> int:
    return report.harness_main(argv, name="quality", parse_args=parse_args, check=check,
                               run=run, publish=publish)


if __name__ == "__main__":
    sys.exit(main())
